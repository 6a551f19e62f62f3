//! The streaming floor holds: its rate is at least what a single-threaded
//! copy reaches over the same bytes, measured in the same test; its own
//! single-threaded copy counts the bytes the test's does; and every floor
//! derived from it is the bytes an operation must move at that rate.

use std::hint::black_box;
use std::time::Instant;

use optirs_tpu::collectives::bench::{BenchOp, floor_bytes};
use optirs_tpu::memory::output_buffer;
use optirs_tpu::memory::stream::{StreamKernel, measure_stream_floor};

/// Working set of the comparison: past the L2 caches, quick in a debug build.
const FOOTPRINT: u64 = 16 << 20;

/// Best GB/s of a single-threaded `copy_from_slice` of `FOOTPRINT / 2`
/// bytes, in buffers allocated as the floor's are.
fn single_copy_gbps(reps: usize) -> f64 {
    let n = (FOOTPRINT / 8) as usize;
    let filled = |f: fn(usize) -> f32| {
        let mut v = output_buffer::<f32>(n);
        v.clear();
        v.extend((0..n).map(f));
        v
    };
    let src = filled(|i| i as f32);
    let mut dst = filled(|_| 0.0);
    dst.copy_from_slice(&src);
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let start = Instant::now();
        black_box(&mut dst).copy_from_slice(black_box(&src));
        best = best.min(start.elapsed().as_secs_f64());
    }
    8.0 * n as f64 / best / 1e9
}

#[test]
fn the_floor_is_at_least_a_single_threaded_copy() {
    // Noise on a shared machine can slow either side for a moment: a floor
    // that is sound passes in one of a few attempts; one that counts bytes
    // wrong or streams slowly fails them all.
    let mut seen = Vec::new();
    for _ in 0..3 {
        let copy = single_copy_gbps(5);
        let floor = measure_stream_floor(FOOTPRINT, 5);
        assert_eq!(floor.footprint_bytes, FOOTPRINT);
        let own_copy = floor
            .rates
            .iter()
            .find(|r| r.kernel == StreamKernel::Copy && r.threads == 1)
            .map_or(0.0, |r| r.gbps);
        // The same copy, timed the same way: a rate off by 2x or more is
        // bytes counted wrong, not noise.
        let agrees = (0.5..=2.0).contains(&(own_copy / copy));
        if floor.gbps() >= 0.8 * copy && agrees {
            return;
        }
        seen.push((floor.gbps(), own_copy, copy));
    }
    panic!(
        "the floor (GB/s) is below 0.8x a single-threaded copy's, or its own single-threaded \
         copy disagrees with the test's by 2x (floor, its copy, the test's copy): {seen:?}"
    );
}

#[test]
fn operations_take_their_floor_from_the_bytes_they_move() {
    let floor = measure_stream_floor(1 << 16, 2);
    let best = floor.best().unwrap();
    assert!(StreamKernel::ALL.contains(&best.kernel));
    assert_eq!(best.gbps, floor.gbps());
    assert!(floor.rates.iter().all(|r| r.gbps <= floor.gbps()));
    // 8 ranks of 1000 f32 (4000 bytes each).
    let b = 4000;
    assert_eq!(floor_bytes(BenchOp::AllReduce, 8, 1000), 16 * b);
    assert_eq!(floor_bytes(BenchOp::ReduceScatter, 8, 1000), 9 * b);
    assert_eq!(floor_bytes(BenchOp::AllGather, 8, 1000), 9 * b);
    assert_eq!(floor_bytes(BenchOp::Broadcast, 8, 1000), 8 * b);
    assert_eq!(floor_bytes(BenchOp::AllToAll, 8, 1000), 14 * b);
    let s = floor.seconds(16 * b);
    assert!((s * floor.gbps() * 1e9 - (16 * b) as f64).abs() < 1e-3);
}
