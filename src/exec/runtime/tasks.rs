//! The split of a fused loop's elements over rayon's pool.

use rayon::prelude::*;

use super::{CHUNK, MIN_TASK, TASK};

/// Runs `f(state, lo, hi)` over `[0, len)` in ranges of at most [`TASK`]
/// elements (whole chunks), spread over rayon's pool (inline when there is
/// one task), each thread with its own `init()` state.
pub(super) fn run_tasks<S, E: Send>(
    len: usize,
    init: impl Fn() -> S + Sync + Send,
    f: impl Fn(&mut S, usize, usize) -> Result<(), E> + Sync + Send,
) -> Result<(), E> {
    let size = task_size(len, rayon::current_num_threads());
    let tasks = len.div_ceil(size).max(1);
    if tasks == 1 {
        return f(&mut init(), 0, len);
    }
    (0..tasks)
        .into_par_iter()
        .try_for_each_init(init, |state, t| {
            let lo = t * size;
            f(state, lo, (lo + size).min(len))
        })
}

/// Elements per task of a `len`-element loop over `threads` threads: at
/// most [`TASK`], and small enough that every thread gets a share once the
/// loop has [`MIN_TASK`] elements per thread (a 1e5-element step would
/// otherwise be one 65536-element task and one of 34464).
pub(super) fn task_size(len: usize, threads: usize) -> usize {
    let tasks = len.div_ceil(TASK).max(threads.min(len / MIN_TASK)).max(1);
    len.div_ceil(tasks)
        .next_multiple_of(CHUNK)
        .clamp(CHUNK, TASK)
}

#[cfg(test)]
mod task_tests {
    use super::*;

    #[test]
    fn tasks_cover_the_loop_in_whole_chunks_and_share_it_out() {
        for threads in [1, 2, 3, 8] {
            for len in [
                0,
                1,
                4095,
                4096,
                30_000,
                100_000,
                1 << 16,
                1_000_000,
                10_000_001,
            ] {
                let size = task_size(len, threads);
                assert!(
                    size > 0 && size <= TASK && size.is_multiple_of(CHUNK),
                    "{len} {threads}"
                );
                let tasks = len.div_ceil(size);
                if len >= threads * MIN_TASK {
                    assert!(tasks >= threads, "{len} on {threads}: {tasks} tasks");
                }
                if len < 2 * MIN_TASK {
                    assert!(tasks <= 1, "{len}: {tasks} tasks");
                }
            }
        }
        // 1e5 on two threads: two near-equal halves, not 65536 + 34464.
        assert_eq!(task_size(100_000, 2), 53_248);
    }
}
