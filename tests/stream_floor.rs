//! The streaming floor holds: its rate is at least what a single-threaded
//! copy reaches over the same bytes, measured in the same test, and every
//! floor derived from it is the bytes an operation must move at that rate.

use std::hint::black_box;
use std::time::Instant;

use optirs_tpu::collectives::bench::{BenchOp, floor_bytes};
use optirs_tpu::memory::stream::{StreamKernel, measure_stream_floor};

/// Working set of the comparison: past the L2 caches, quick in a debug build.
const FOOTPRINT: u64 = 16 << 20;

/// Best GB/s of a single-threaded `copy_from_slice` of `FOOTPRINT / 2` bytes.
fn single_copy_gbps(reps: usize) -> f64 {
    let n = (FOOTPRINT / 8) as usize;
    let src: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut dst = vec![0.0f32; n];
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
        if floor.gbps() >= 0.8 * copy {
            return;
        }
        seen.push((floor.gbps(), copy));
    }
    panic!("floor GB/s below 0.8x a single-threaded copy's (floor, copy): {seen:?}");
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
