//! In-process collectives on 8 ranks × 1e6 `f32` (4 MB per rank).
//!
//! Criterion reports throughput as bytes per rank per second, which is
//! nccl-tests' `algbw`; `busbw` = algbw × 2(n−1)/n for all-reduce,
//! × (n−1)/n for reduce-scatter and all-gather, × 1 for broadcast.
//! Inputs are restored before every timed call, outside the timed region.
//!
//! ```text
//! cargo bench --bench collectives -- --warm-up-time 1 --measurement-time 3
//! ```

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use optirs_tpu::collectives::bench::{BenchOp, bench_inputs, run_op};

const RANKS: usize = 8;
const ELEMENTS: usize = 1_000_000;

fn collectives(c: &mut Criterion) {
    let ring: Vec<usize> = (0..RANKS).collect();
    let inputs = bench_inputs(RANKS, ELEMENTS);
    let mut group = c.benchmark_group("pod::collectives");
    group.throughput(Throughput::Bytes((ELEMENTS * 4) as u64));
    group.sample_size(20);
    for op in BenchOp::ALL {
        let mut buffers = inputs.clone();
        group.bench_function(format!("{}/8x1e6xf32", op.name()), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    for (buffer, input) in buffers.iter_mut().zip(&inputs) {
                        buffer.copy_from_slice(input);
                    }
                    let start = Instant::now();
                    let traffic = run_op(op, &mut buffers, &ring).expect("valid ring");
                    total += start.elapsed();
                    std::hint::black_box(traffic);
                }
                total
            });
        });
    }
    group.finish();
}

criterion_group!(benches, collectives);
criterion_main!(benches);
