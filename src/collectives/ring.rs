//! Ring kernels on slices in ring order, and the traffic a ring pass makes.
//!
//! A ring of `n` positions splits a segment of `len` elements into `n`
//! chunks with [`chunk_range`]: the first `len % n` chunks hold one element
//! more than the rest, so chunks differ in size by at most one and some are
//! empty when `len < n`.
//!
//! **Reduce-scatter.** At step `s` (`0..n−1`) position `i` sends its partial
//! of chunk `(i−1−s) mod n` to position `i+1`, which combines it with its own
//! elements. Chunk `c` therefore starts at position `c+1`, visits every
//! position once and is complete at position `c`: position `i` owns chunk
//! `i`, as in `ncclReduceScatter`.
//!
//! **All-gather.** At step `s` position `i` forwards chunk `(i−s) mod n`.
//!
//! **Execution.** Each chunk's journey around the ring depends on no other
//! chunk, so the kernels run chunk by chunk (in parallel over chunks with
//! rayon) instead of step by step, and within a chunk in slices of
//! [`SLICE_ELEMS`] elements, the way NCCL pipelines a step in slices. The
//! message in flight lives in a stack scratch slice (NCCL's
//! `recvReduceSend`): a rank's buffer is read once and written once, the
//! arithmetic and its order are exactly those of the step-by-step ring, and
//! nothing is allocated per step. Chunks are further cut into pieces of
//! [`PIECE_ELEMS`] so rayon can balance the tasks. The traffic record is produced from the
//! step-by-step schedule.

use std::ops::Range;

use rayon::prelude::*;

use smallvec::SmallVec;

use super::element::{Element, ReduceOp, combine_in_order, divide_all};
use super::traffic::{Phase, PhaseKind, Traffic, Transfer};

/// Elements per pipelined slice: 32 KiB of `f32`, 64 KiB of `f64`. The
/// message in flight and the slices combined into it stay in L1/L2 while
/// every rank's stream advances by a whole slice. On the 2-core reference
/// machine (8 ranks, `optirs-tpu collectives assets/pods/examples/v2-4x2-custom.ron`, paired runs) 8192
/// elements ran a 16 MiB-per-rank reduce-scatter in 4.7–5.5 ms against
/// 6.9–7.7 ms with 2048, and the fused torus all-reduce in 8.0–10.2 ms
/// against 12.8–16.3 ms (16384: 7.8–7.9 ms).
pub const SLICE_ELEMS: usize = 8192;

/// Elements per parallel task within a chunk (128 KiB of `f32` per rank):
/// chunks are cut into pieces of this size so that rayon can balance the
/// work when a core is busy with something else.
pub const PIECE_ELEMS: usize = 4 * SLICE_ELEMS;

/// Collectives over fewer bytes than this (summed over every participating
/// buffer) run on the calling thread. On the 2-core reference machine an
/// 8-rank `f32` all-reduce of 64 KiB per rank (512 KiB in all) took 14 µs on
/// one thread and 26–41 µs with rayon; at 256 KiB per rank the two were even.
pub const PARALLEL_MIN_BYTES: usize = 4 * 1024 * 1024;

/// The elements of chunk `c` when `len` elements are split over `n` ranks.
///
/// Chunks `0..len % n` have `len / n + 1` elements, the rest `len / n`.
/// Returns an empty range for `n == 0` or `c >= n`.
pub fn chunk_range(len: usize, n: usize, c: usize) -> Range<usize> {
    if n == 0 || c >= n {
        return len..len;
    }
    let base = len / n;
    let rem = len % n;
    let start = c * base + c.min(rem);
    start..start + base + usize::from(c < rem)
}

/// What a reduction pass does after a chunk is complete at its owner.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Epilogue {
    /// Divide by this count (`Mean`); `None` leaves the sum.
    pub divisor: Option<usize>,
    /// Also run the all-gather for the chunk (a fused all-reduce).
    pub gather: bool,
}

/// Splits every position's slice into its `n` chunks and regroups them by
/// chunk: `result[c][p]` is chunk `c` of position `p`.
fn chunks_by_index<'a, T>(slices: Vec<&'a mut [T]>) -> Vec<Vec<&'a mut [T]>> {
    let n = slices.len();
    let mut by_chunk: Vec<Vec<&'a mut [T]>> = (0..n).map(|_| Vec::with_capacity(n)).collect();
    for slice in slices {
        let len = slice.len();
        let mut rest = slice;
        for (c, chunk_list) in by_chunk.iter_mut().enumerate() {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(chunk_range(len, n, c).len());
            chunk_list.push(head);
            rest = tail;
        }
    }
    by_chunk
}

/// Cuts chunk `c` (one slice per position, all of one length) into tasks of
/// at most [`PIECE_ELEMS`] elements.
pub(super) fn pieces<'a, T>(
    c: usize,
    positions: Vec<&'a mut [T]>,
) -> Vec<(usize, Vec<&'a mut [T]>)> {
    let len = positions.first().map_or(0, |s| s.len());
    let count = len.div_ceil(PIECE_ELEMS).max(1);
    let mut tasks: Vec<(usize, Vec<&'a mut [T]>)> = (0..count)
        .map(|_| (c, Vec::with_capacity(positions.len())))
        .collect();
    for slice in positions {
        let mut rest = slice;
        for (_, task) in tasks.iter_mut() {
            let take = rest.len().min(PIECE_ELEMS);
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(take);
            task.push(head);
            rest = tail;
        }
    }
    tasks
}

/// Every ring's chunks, cut into pieces: `(chunk index, slices by position)`.
fn chunk_tasks<T>(rings: Vec<Vec<&mut [T]>>) -> Vec<(usize, Vec<&mut [T]>)> {
    rings
        .into_iter()
        .flat_map(|ring| chunks_by_index(ring).into_iter().enumerate())
        .flat_map(|(c, positions)| pieces(c, positions))
        .collect()
}

/// Copies position `owner`'s slice into every other position.
fn copy_from_owner<T: Copy>(positions: &mut [&mut [T]], owner: usize) {
    let (left, right) = positions.split_at_mut(owner);
    if let Some((src, right)) = right.split_first_mut() {
        for dst in left.iter_mut().chain(right.iter_mut()) {
            dst.copy_from_slice(src);
        }
    }
}

/// Reduces chunk `c` around the ring (`positions[p]` is chunk `c` of
/// position `p`), leaving the result at position `c`, then applies the
/// epilogue.
fn reduce_one_chunk<T: Element>(
    positions: &mut [&mut [T]],
    c: usize,
    op: ReduceOp,
    epilogue: Epilogue,
) {
    let n = positions.len();
    let len = positions[c].len();
    if n == 1 && epilogue.divisor.is_none() {
        return;
    }
    let mut scratch = [T::ZERO; SLICE_ELEMS];
    let mut start = 0;
    while start < len {
        let end = (start + SLICE_ELEMS).min(len);
        let acc = &mut scratch[..end - start];
        // The message leaves position c+1, is combined at c+2, …, c+n−1,
        // and is finished at c, which owns the chunk (for n = 1 the copy is
        // the rank's own data and only the epilogue remains).
        {
            let at = |j: usize| &positions[(c + j) % n][start..end];
            let rest: SmallVec<[&[T]; 16]> = (2..=n).map(at).collect();
            combine_in_order(op, acc, at(1), &rest);
        }
        if let Some(divisor) = epilogue.divisor {
            divide_all(acc, divisor);
        }
        if epilogue.gather {
            for position in positions.iter_mut() {
                position[start..end].copy_from_slice(acc);
            }
        } else {
            positions[c][start..end].copy_from_slice(acc);
        }
        start = end;
    }
}

/// Runs `task` on every item, in parallel when the buffers are large.
pub(super) fn for_each_maybe_parallel<I, F>(items: Vec<I>, total_bytes: usize, task: F)
where
    I: Send,
    F: Fn(I) + Send + Sync,
{
    if total_bytes >= PARALLEL_MIN_BYTES && items.len() > 1 {
        items.into_par_iter().for_each(task);
    } else {
        items.into_iter().for_each(task);
    }
}

/// Reduce-scatter over every ring in `rings` (each a list of equally long
/// slices in ring order). Rings are independent and run concurrently.
pub(crate) fn reduce_scatter_rings<T: Element>(
    rings: Vec<Vec<&mut [T]>>,
    op: ReduceOp,
    epilogue: Epilogue,
) {
    let total_bytes = rings.iter().flatten().map(|s| s.len() * T::BYTES).sum();
    let tasks = chunk_tasks(rings);
    for_each_maybe_parallel(tasks, total_bytes, |(c, mut positions)| {
        reduce_one_chunk(&mut positions, c, op, epilogue);
    });
}

/// All-gather over every ring in `rings`: position `p` contributes chunk `p`.
pub(crate) fn all_gather_rings<T: Element>(rings: Vec<Vec<&mut [T]>>) {
    let total_bytes = rings.iter().flatten().map(|s| s.len() * T::BYTES).sum();
    let tasks = chunk_tasks(rings);
    for_each_maybe_parallel(tasks, total_bytes, |(c, mut positions)| {
        copy_from_owner(&mut positions, c);
    });
}

/// Copies the slice at position `root` into every other position.
pub(crate) fn broadcast_ring<T: Element>(mut positions: Vec<&mut [T]>, root: usize) {
    let total_bytes = positions.iter().map(|s| s.len() * T::BYTES).sum();
    if root >= positions.len() {
        return;
    }
    let src: &[T] = positions.remove(root);
    for_each_maybe_parallel(positions, total_bytes, |dst| dst.copy_from_slice(src));
}

/// A ring's devices in ring order and the links each hop uses.
#[derive(Debug, Clone)]
pub(crate) struct RingRoute {
    /// `hops[i]` is the chain of adjacent device pairs that carries a message
    /// from position `i` to position `i+1 mod n`.
    pub hops: Vec<Vec<(usize, usize)>>,
}

impl RingRoute {
    /// A ring in which consecutive devices (and the last and first) are
    /// adjacent.
    pub fn neighbours(devices: &[usize]) -> Self {
        let n = devices.len();
        let hops = (0..n)
            .map(|i| vec![(devices[i], devices[(i + 1) % n])])
            .collect();
        Self { hops }
    }

    /// Positions (devices on the ring).
    fn len(&self) -> usize {
        self.hops.len()
    }

    /// A line of devices without a link closing it (a mesh axis, or a
    /// twisted torus's axis whose wraparound lands in another plane) runs
    /// two ways instead of as a ring: in a reduce-scatter, chunk `j`'s
    /// partial flows right from position 0 and left from position `n−1`,
    /// combined at each position it passes, and both arrive at `j`; an
    /// all-gather sends each chunk both ways from its owner. Each direction
    /// of each link carries at most one chunk per step, in the `n − 1` steps
    /// of a ring, and the line moves a ring's bytes, `(n−1)·len` per pass.
    ///
    /// The messages of step `s` of a two-way line's pass: `(from, to,
    /// chunk)` by line position. Reduce-scatter: rightwards, position `i ≤
    /// s` sends chunk `n−1−s+i`; leftwards the mirror image. All-gather:
    /// rightwards, position `i ≥ s` forwards chunk `i−s`; leftwards the
    /// mirror image.
    pub(super) fn line_messages(n: usize, s: usize, kind: PhaseKind) -> Vec<(usize, usize, usize)> {
        let mirror = |p: usize| n - 1 - p;
        let senders: Vec<(usize, usize)> = match kind {
            PhaseKind::ReduceScatter => (0..=s).map(|i| (i, n - 1 - s + i)).collect(),
            _ => (s..n - 1).map(|i| (i, i - s)).collect(),
        };
        senders
            .iter()
            .map(|&(i, c)| (i, i + 1, c))
            .chain(
                senders
                    .iter()
                    .map(|&(i, c)| (mirror(i), mirror(i + 1), mirror(c))),
            )
            .collect()
    }

    fn push_message(&self, traffic: &mut Traffic, from: usize, bytes: u64, phase: Phase) {
        if bytes == 0 {
            return;
        }
        let route = &self.hops[from];
        let hops = u32::try_from(route.len()).unwrap_or(u32::MAX);
        traffic
            .transfers
            .extend(route.iter().map(|&(src, dst)| Transfer {
                src,
                dst,
                bytes,
                hops,
                phase,
            }));
    }

    /// The traffic of one reduce-scatter or all-gather pass over a segment
    /// of `len` elements.
    pub fn record_pass(
        &self,
        traffic: &mut Traffic,
        kind: PhaseKind,
        order: u32,
        dim: u32,
        len: usize,
        elem_bytes: usize,
    ) {
        record_passes(
            traffic,
            &[(self.clone(), len)],
            kind,
            order,
            dim,
            elem_bytes,
        );
    }

    /// The traffic of a chain broadcast from position `root`, pipelined in
    /// [`broadcast_chunks`] chunks: at step `s` the `j`-th rank after the
    /// root forwards chunk `s − j`.
    pub fn record_broadcast(
        &self,
        traffic: &mut Traffic,
        root: usize,
        len: usize,
        elem_bytes: usize,
    ) {
        let n = self.len();
        let chunks = broadcast_chunks(n, len, elem_bytes);
        if n <= 1 || chunks == 0 {
            return;
        }
        for s in 0..(n - 1) + (chunks - 1) {
            let phase = Phase {
                order: 0,
                kind: PhaseKind::Broadcast,
                dim: 0,
                step: s as u32,
            };
            for j in 0..n - 1 {
                let Some(chunk) = s.checked_sub(j).filter(|&c| c < chunks) else {
                    continue;
                };
                let bytes = (chunk_range(len, chunks, chunk).len() * elem_bytes) as u64;
                self.push_message(traffic, (root + j) % n, bytes, phase);
            }
        }
    }
}

/// The traffic of concurrent reduce-scatter or all-gather passes, one per
/// `(ring, segment length)`, recorded step by step so the records come out
/// in [`Phase`] order.
pub(crate) fn record_passes(
    traffic: &mut Traffic,
    rings: &[(RingRoute, usize)],
    kind: PhaseKind,
    order: u32,
    dim: u32,
    elem_bytes: usize,
) {
    let steps = rings
        .iter()
        .map(|(r, _)| r.len())
        .max()
        .unwrap_or(0)
        .saturating_sub(1);
    for s in 0..steps {
        let phase = Phase {
            order,
            kind,
            dim,
            step: s as u32,
        };
        for (route, len) in rings {
            let n = route.len();
            if s + 1 >= n {
                continue;
            }
            for i in 0..n {
                let chunk = match kind {
                    PhaseKind::ReduceScatter => (i + 2 * n - 1 - s) % n,
                    _ => (i + n - s) % n,
                };
                let bytes = (chunk_range(*len, n, chunk).len() * elem_bytes) as u64;
                route.push_message(traffic, i, bytes, phase);
            }
        }
    }
}

/// Largest pipelined chunk of a broadcast: NCCL's default ring buffer
/// (4 MiB) divided by its 8 pipeline steps.
pub const BROADCAST_CHUNK_BYTES: usize = 512 * 1024;

/// Chunks a broadcast of `len` elements down a chain of `n` ranks is
/// pipelined in: at least `n`, enough that none exceeds
/// [`BROADCAST_CHUNK_BYTES`], never more than `len` (0 for an empty buffer).
pub fn broadcast_chunks(n: usize, len: usize, elem_bytes: usize) -> usize {
    let by_size = (len * elem_bytes).div_ceil(BROADCAST_CHUNK_BYTES);
    n.max(by_size).min(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Plays a two-way line's reduce-scatter with sets of contributors: a
    /// message carries only what its sender holds for that chunk (its own
    /// value and what reached it in earlier steps from the side it comes
    /// from), and every owner ends with every position's contribution.
    #[test]
    fn a_two_way_line_reduce_scatter_brings_every_contribution_to_each_owner() {
        for n in 3..=9 {
            // held[p][c]: contributions position p holds for chunk c.
            let mut held: Vec<Vec<BTreeSet<usize>>> = (0..n)
                .map(|p| (0..n).map(|_| BTreeSet::from([p])).collect())
                .collect();
            let mut used: BTreeSet<(usize, usize, usize)> = BTreeSet::new();
            for s in 0..n - 1 {
                let messages = RingRoute::line_messages(n, s, PhaseKind::ReduceScatter);
                let mut links = BTreeSet::new();
                let mut arriving = Vec::new();
                for (from, to, c) in messages {
                    assert_eq!(from.abs_diff(to), 1, "n={n} s={s}: not a link");
                    assert!(links.insert((from, to)), "n={n} s={s}: a link used twice");
                    // What it sends comes only from its own side of the line.
                    let side: BTreeSet<usize> = if to > from {
                        (0..=from).collect()
                    } else {
                        (from..n).collect()
                    };
                    assert!(
                        held[from][c].is_superset(&side),
                        "n={n} s={s} {from}->{to} c={c}"
                    );
                    assert!(
                        used.insert((from, to, c)),
                        "chunk {c} sent twice on {from}->{to}"
                    );
                    arriving.push((to, c, side));
                }
                for (to, c, side) in arriving {
                    held[to][c].extend(side);
                }
            }
            for (j, chunks) in held.iter().enumerate() {
                assert_eq!(chunks[j].len(), n, "n={n}: owner {j} misses contributions");
            }
            // A ring's bytes: n·(n−1) chunk messages in all.
            assert_eq!(used.len(), n * (n - 1));
        }
    }

    /// Plays a two-way line's all-gather: a position forwards only a chunk
    /// it holds, and every position ends with every chunk.
    #[test]
    fn a_two_way_line_all_gather_delivers_every_chunk_everywhere() {
        for n in 3..=9 {
            let mut held: Vec<BTreeSet<usize>> = (0..n).map(|p| BTreeSet::from([p])).collect();
            let mut messages_total = 0;
            for s in 0..n - 1 {
                let mut links = BTreeSet::new();
                let mut arriving = Vec::new();
                for (from, to, c) in RingRoute::line_messages(n, s, PhaseKind::AllGather) {
                    assert_eq!(from.abs_diff(to), 1);
                    assert!(links.insert((from, to)), "n={n} s={s}: a link used twice");
                    assert!(
                        held[from].contains(&c),
                        "n={n} s={s}: {from} lacks chunk {c}"
                    );
                    arriving.push((to, c));
                    messages_total += 1;
                }
                for (to, c) in arriving {
                    assert!(held[to].insert(c), "n={n}: chunk {c} reached {to} twice");
                }
            }
            assert!(held.iter().all(|h| h.len() == n), "n={n}");
            assert_eq!(messages_total, n * (n - 1));
        }
    }
}
