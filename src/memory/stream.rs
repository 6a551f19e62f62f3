//! The machine's streaming floor: the best rate at which this host moves
//! bytes through memory, measured with every core, and the least time an
//! operation that must move a given number of bytes can take at it.
//!
//! [`measure_stream_floor`] times three streaming kernels over two `f32`
//! arrays that together span a given footprint (the operation's working
//! set, so the floor sees the same caches the operation does): an in-place
//! add `a += b`, a read-only sum of both, and a copy of `b` into `a`. Each
//! runs on one thread and on every thread of the rayon pool (one large
//! contiguous chunk per thread), on warm buffers backed by huge pages where
//! the kernel grants them ([`output_buffer`], as numpy's large arrays are)
//! and touched beforehand, and each is timed best-of-`reps`. The sum keeps
//! sixteen partial sums so it runs in vector registers. The floor's rate is the
//! best of them all, in bytes the kernel must move ([`StreamKernel::bytes`])
//! per second: no write-allocate traffic counted, so it is a rate no
//! operation that moves those bytes can beat.
//!
//! `bench optimizer` and the collectives' `floor_seconds` both derive their
//! floor from it with [`StreamFloor::seconds`]. It reads the wall clock: it
//! is benchmark code, never called from a system.

use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use super::output_buffer;

/// Below this many bytes of footprint per thread the kernels run on one
/// thread only: handing out the work would cost more than it moves.
const MIN_BYTES_PER_THREAD: u64 = 1 << 18;

/// One streaming kernel over two arrays `a` and `b` of `n` `f32` each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamKernel {
    /// `a += b`: reads `a` and `b`, writes `a` (12 bytes per element).
    Add,
    /// The sum of every element of `a` and `b`: reads both (8 bytes).
    Sum,
    /// `a.copy_from_slice(b)`: reads `b`, writes `a` (8 bytes).
    Copy,
}

impl StreamKernel {
    /// Every kernel.
    pub const ALL: [StreamKernel; 3] = [StreamKernel::Add, StreamKernel::Sum, StreamKernel::Copy];

    /// The kernel's name (`add`, `sum`, `copy`).
    pub fn name(self) -> &'static str {
        match self {
            StreamKernel::Add => "add",
            StreamKernel::Sum => "sum",
            StreamKernel::Copy => "copy",
        }
    }

    /// Bytes one pass over arrays of `n` `f32` must read and write.
    pub fn bytes(self, n: usize) -> u64 {
        let per_element = match self {
            StreamKernel::Add => 12,
            StreamKernel::Sum | StreamKernel::Copy => 8,
        };
        per_element * n as u64
    }

    /// One pass over `a` and `b` in `threads` contiguous chunks.
    fn run(self, a: &mut [f32], b: &[f32], threads: usize) -> f32 {
        let chunk = a.len().div_ceil(threads.max(1)).max(1);
        let one = |a: &mut [f32], b: &[f32]| -> f32 {
            match self {
                StreamKernel::Add => {
                    for (a, &b) in a.iter_mut().zip(b) {
                        *a += b;
                    }
                    0.0
                }
                StreamKernel::Sum => lanes_sum(a) + lanes_sum(b),
                StreamKernel::Copy => {
                    a.copy_from_slice(b);
                    0.0
                }
            }
        };
        if threads <= 1 {
            return one(a, b);
        }
        a.par_chunks_mut(chunk)
            .zip(b.par_chunks(chunk))
            .map(|(a, b)| one(a, b))
            .sum()
    }
}

/// The sum of `x` in sixteen independent lanes (no chain of dependent
/// adds, so the loop vectorizes), then the lanes and the tail.
fn lanes_sum(x: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 16];
    let chunks = x.chunks_exact(16);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += v;
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// `n` `f32` from `f`, in a buffer advised onto huge pages, every page
/// touched.
fn filled(n: usize, f: impl Fn(usize) -> f32) -> Vec<f32> {
    let mut v = output_buffer::<f32>(n);
    v.clear();
    v.extend((0..n).map(f));
    v
}

/// One kernel's best time at one thread count.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StreamRate {
    /// The kernel.
    pub kernel: StreamKernel,
    /// Threads it ran on.
    pub threads: usize,
    /// Best seconds per pass.
    pub seconds: f64,
    /// Bytes one pass must move ([`StreamKernel::bytes`]).
    pub bytes: u64,
    /// `bytes / seconds`, GB/s (10⁹ bytes per second).
    pub gbps: f64,
}

/// The streaming floor over one footprint: every kernel's rate and the best.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StreamFloor {
    /// Bytes the two arrays span together.
    pub footprint_bytes: u64,
    /// Every kernel at one thread and at every thread.
    pub rates: Vec<StreamRate>,
}

impl StreamFloor {
    /// The fastest rate, the one the floor is taken at.
    pub fn best(&self) -> Option<&StreamRate> {
        self.rates.iter().max_by(|x, y| x.gbps.total_cmp(&y.gbps))
    }

    /// The floor's rate in GB/s (0 when nothing was measured).
    pub fn gbps(&self) -> f64 {
        self.best().map_or(0.0, |r| r.gbps)
    }

    /// The least seconds an operation that must move `bytes` can take at
    /// the floor's rate (0 when nothing was measured).
    pub fn seconds(&self, bytes: u64) -> f64 {
        let gbps = self.gbps();
        if gbps > 0.0 {
            bytes as f64 / (gbps * 1e9)
        } else {
            0.0
        }
    }

    /// The better of two measurements, rate by rate.
    pub fn best_of(mut self, other: &StreamFloor) -> StreamFloor {
        for (mine, theirs) in self.rates.iter_mut().zip(&other.rates) {
            if theirs.gbps > mine.gbps {
                *mine = theirs.clone();
            }
        }
        self
    }
}

/// Thread counts the kernels run at over `footprint_bytes`: one, and every
/// thread of the pool when each gets at least `MIN_BYTES_PER_THREAD`.
pub fn stream_threads(footprint_bytes: u64) -> Vec<usize> {
    let pool = rayon::current_num_threads();
    let most = (footprint_bytes / MIN_BYTES_PER_THREAD).clamp(1, pool as u64) as usize;
    if most > 1 { vec![1, most] } else { vec![1] }
}

/// Best seconds of `reps` passes of `kernel` on `threads` threads over
/// `a` and `b` (after one untimed pass).
pub fn time_kernel(
    kernel: StreamKernel,
    threads: usize,
    a: &mut [f32],
    b: &[f32],
    reps: usize,
) -> f64 {
    black_box(kernel.run(a, b, threads));
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        black_box(kernel.run(black_box(&mut *a), b, threads));
        best = best.min(start.elapsed().as_secs_f64());
    }
    best
}

/// Measures the streaming floor over `footprint_bytes` (two arrays of
/// `footprint_bytes / 8` `f32` each, at least one element), every kernel
/// at every thread count of [`stream_threads`], best-of-`reps` each.
pub fn measure_stream_floor(footprint_bytes: u64, reps: usize) -> StreamFloor {
    let n = ((footprint_bytes / 8) as usize).max(1);
    // Small values that stay small: the add adds ±1e-7 a pass.
    let mut a = filled(n, |i| (i % 7) as f32);
    let b = filled(n, |i| ((i % 3) as f32 - 1.0) * 1e-7);
    let mut rates = Vec::new();
    for threads in stream_threads(8 * n as u64) {
        for kernel in StreamKernel::ALL {
            let seconds = time_kernel(kernel, threads, &mut a, &b, reps);
            let bytes = kernel.bytes(n);
            rates.push(StreamRate {
                kernel,
                threads,
                seconds,
                bytes,
                gbps: if seconds > 0.0 {
                    bytes as f64 / seconds / 1e9
                } else {
                    0.0
                },
            });
        }
    }
    black_box(&a);
    StreamFloor {
        footprint_bytes: 8 * n as u64,
        rates,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_count_the_bytes_they_must_move() {
        assert_eq!(StreamKernel::Add.bytes(1000), 12_000);
        assert_eq!(StreamKernel::Sum.bytes(1000), 8_000);
        assert_eq!(StreamKernel::Copy.bytes(1000), 8_000);
        let floor = measure_stream_floor(1 << 12, 2);
        assert_eq!(floor.footprint_bytes, 1 << 12);
        for r in &floor.rates {
            assert_eq!(r.bytes, r.kernel.bytes(512), "{r:?}");
            assert!((r.gbps - r.bytes as f64 / r.seconds / 1e9).abs() < 1e-9);
        }
        let best = floor.gbps();
        assert!(best > 0.0);
        assert!((floor.seconds(1_000_000_000) - 1.0 / best).abs() < 1e-12);
        assert_eq!(floor.seconds(0), 0.0);
    }

    #[test]
    fn the_kernels_compute_what_they_say() {
        let (mut a, b) = (vec![1.0f32; 10], vec![2.0f32; 10]);
        StreamKernel::Add.run(&mut a, &b, 3);
        assert_eq!(a, vec![3.0; 10]);
        assert_eq!(StreamKernel::Sum.run(&mut a, &b, 2), 50.0);
        let x: Vec<f32> = (0..37).map(|i| i as f32).collect();
        assert_eq!(lanes_sum(&x), 666.0);
        StreamKernel::Copy.run(&mut a, &b, 4);
        assert_eq!(a, b);
        assert_eq!(stream_threads(1), vec![1]);
        assert_eq!(stream_threads(1 << 30)[0], 1);
    }
}
