//! Optimizer step throughput at 1e7 f32 parameters, against the practical
//! limit and the machine's memory bandwidth.
//!
//! * `adam/*`, `sgd/*`: the crate's `step` (returns fresh params) and
//!   `step_in_place` (overwrites a donated buffer).
//! * `limit/*`: a hand-written single-pass loop over slices, rayon over
//!   64 Ki-element chunks on the same threads, with the same arithmetic —
//!   what a step cannot beat. `*_fresh` variants write a newly allocated
//!   output, like `step`, allocated the same way (uninitialised, advised to
//!   use transparent huge pages); `*_fresh_zeroed` use a plain
//!   `vec![0.0; n]`, to show what the page faults of a fresh 40 MB buffer
//!   cost without the advice.
//! * `bandwidth/*`: plain copy (`a = b`) and triad (`a = b + s*c`) with the
//!   same chunking, for the machine's bandwidth; `triad_1e8` runs on 1e8
//!   elements, too large for any cache.
//!
//! Throughput is the bytes each must move (reads plus writes, no
//! write-allocate traffic): SGD 12 B/element, Adam 28 B/element.
//!
//! Run: `cargo bench --bench optimizers -- --warm-up-time 1 --measurement-time 3`

use criterion::{BenchmarkId, Criterion, Throughput, black_box, criterion_group};
use optirs_tpu::optimizers::{Adam, SGD};
use rayon::prelude::*;
use std::sync::OnceLock;

/// Without `--bench` (which `cargo bench` passes), criterion runs each
/// benchmark once as a smoke test, as under `cargo test --benches`; the
/// sizes then shrink and the paired report is skipped, to keep that quick.
fn smoke_test() -> bool {
    static SMOKE: OnceLock<bool> = OnceLock::new();
    *SMOKE.get_or_init(|| !std::env::args().any(|a| a == "--bench"))
}

/// Parameters per step: 1e7.
fn n() -> usize {
    if smoke_test() { 1 << 12 } else { 10_000_000 }
}

/// Elements of the DRAM-sized triad: 1e8.
fn n_dram() -> usize {
    if smoke_test() { 1 << 12 } else { 100_000_000 }
}
const SMALL: usize = 1_000;

#[path = "common/limits.rs"]
mod limits;
use limits::*;

fn bandwidth(c: &mut Criterion) {
    let (b, cc) = inputs(n());
    let (b, cc) = (b.to_vec(), cc.to_vec());
    let mut a = vec![0.0f32; n()];
    let mut group = c.benchmark_group("bandwidth");
    group.throughput(Throughput::Bytes((8 * n()) as u64));
    group.bench_function("copy", |bench| {
        bench.iter(|| {
            a.par_chunks_mut(CHUNK)
                .zip(b.par_chunks(CHUNK))
                .for_each(|(a, b)| a.copy_from_slice(b));
            black_box(&a);
        })
    });
    group.throughput(Throughput::Bytes((12 * n()) as u64));
    group.bench_function("triad", |bench| {
        bench.iter(|| {
            let s = black_box(0.5f32);
            a.par_chunks_mut(CHUNK)
                .zip(b.par_chunks(CHUNK))
                .zip(cc.par_chunks(CHUNK))
                .for_each(|((a, b), c)| {
                    for ((a, &b), &c) in a.iter_mut().zip(b).zip(c) {
                        *a = b + s * c;
                    }
                });
            black_box(&a);
        })
    });
    // 1e8 elements (1.2 GB per triad) cannot be cache-resident anywhere.
    let big_b = vec![1.0f32; n_dram()];
    let big_c = vec![2.0f32; n_dram()];
    let mut big_a = vec![0.0f32; n_dram()];
    group.throughput(Throughput::Bytes((12 * n_dram()) as u64));
    group.sample_size(10);
    group.bench_function("triad_1e8", |bench| {
        bench.iter(|| {
            let s = black_box(0.5f32);
            (
                big_a.par_chunks_mut(CHUNK),
                big_b.par_chunks(CHUNK),
                big_c.par_chunks(CHUNK),
            )
                .into_par_iter()
                .for_each(|(a, b, c)| {
                    for ((a, &b), &c) in a.iter_mut().zip(b).zip(c) {
                        *a = b + s * c;
                    }
                });
            black_box(&big_a);
        })
    });
    group.finish();
}

fn sgd(c: &mut Criterion) {
    let (params, grads) = inputs(n());
    let (p, g) = (params.to_vec(), grads.to_vec());
    let mut group = c.benchmark_group("sgd");
    group.throughput(Throughput::Bytes((12 * n()) as u64));
    let mut opt = SGD::new(LR);
    group.bench_function("step", |b| {
        b.iter(|| black_box(opt.step(&params, &grads).unwrap()))
    });
    group.bench_function("limit_fresh", |b| {
        b.iter(|| black_box(sgd_limit_fresh(&p, &g, -LR, true)))
    });
    group.bench_function("limit_fresh_zeroed", |b| {
        b.iter(|| black_box(sgd_limit_fresh(&p, &g, -LR, false)))
    });
    let mut donated = params.clone();
    group.bench_function("step_in_place", |b| {
        b.iter(|| opt.step_in_place(&mut donated, &grads).unwrap())
    });
    let mut p_in = p.clone();
    group.bench_function("limit_in_place", |b| {
        b.iter(|| sgd_limit_in_place(&mut p_in, &g, -LR))
    });
    group.finish();
}

fn adam(c: &mut Criterion) {
    let (params, grads) = inputs(n());
    let (p, g) = (params.to_vec(), grads.to_vec());
    let mut group = c.benchmark_group("adam");
    group.throughput(Throughput::Bytes((28 * n()) as u64));
    let mut opt = Adam::new(LR);
    // The first step allocates the moments; measure the steady state.
    opt.step(&params, &grads).unwrap();
    group.bench_function("step", |b| {
        b.iter(|| black_box(opt.step(&params, &grads).unwrap()))
    });
    let (mut m, mut v) = (vec![0.0f32; n()], vec![0.0f32; n()]);
    let scalars = AdamScalars::new(10);
    group.bench_function("limit_fresh", |b| {
        b.iter(|| black_box(adam_limit_fresh(&p, &g, &mut m, &mut v, &scalars, true)))
    });
    group.bench_function("limit_fresh_zeroed", |b| {
        b.iter(|| black_box(adam_limit_fresh(&p, &g, &mut m, &mut v, &scalars, false)))
    });
    let mut donated = params.clone();
    group.bench_function("step_in_place", |b| {
        b.iter(|| opt.step_in_place(&mut donated, &grads).unwrap())
    });
    let mut p_in = p.clone();
    group.bench_function("limit_in_place", |b| {
        b.iter(|| adam_limit_in_place(&mut p_in, &g, &mut m, &mut v, &scalars))
    });
    group.finish();
}

fn small(c: &mut Criterion) {
    let (params, grads) = inputs(SMALL);
    let mut group = c.benchmark_group("small");
    let mut adam = Adam::new(LR);
    adam.step(&params, &grads).unwrap();
    group.bench_function(BenchmarkId::new("adam_step", SMALL), |b| {
        b.iter(|| black_box(adam.step(&params, &grads).unwrap()))
    });
    let mut sgd = SGD::new(LR);
    group.bench_function(BenchmarkId::new("sgd_step", SMALL), |b| {
        b.iter(|| black_box(sgd.step(&params, &grads).unwrap()))
    });
    group.finish();
}

/// Prints the step-to-limit ratios as a Markdown table.
fn paired_report() {
    const ROUNDS: usize = 101;
    let (params, grads) = inputs(n());
    let (p, g) = (params.to_vec(), grads.to_vec());
    let table = PairedTable::new(ROUNDS, n(), "step");

    let mut sgd = SGD::new(LR);
    table.row(
        "SGD `step` vs fresh-output loop",
        12,
        paired(
            ROUNDS,
            || drop(black_box(sgd.step(&params, &grads).unwrap())),
            || drop(black_box(sgd_limit_fresh(&p, &g, -LR, true))),
        ),
    );
    let (mut donated, mut p_in) = (params.clone(), p.clone());
    table.row(
        "SGD `step_in_place` vs in-place loop",
        12,
        paired(
            ROUNDS,
            || sgd.step_in_place(&mut donated, &grads).unwrap(),
            || sgd_limit_in_place(&mut p_in, &g, -LR),
        ),
    );

    let mut adam = Adam::new(LR);
    adam.step(&params, &grads).unwrap();
    let (mut m, mut v) = (vec![0.0f32; n()], vec![0.0f32; n()]);
    let scalars = AdamScalars::new(10);
    table.row(
        "Adam `step` vs fresh-output loop",
        28,
        paired(
            ROUNDS,
            || drop(black_box(adam.step(&params, &grads).unwrap())),
            || {
                drop(black_box(adam_limit_fresh(
                    &p, &g, &mut m, &mut v, &scalars, true,
                )))
            },
        ),
    );
    let (mut donated, mut p_in) = (params.clone(), p.clone());
    table.row(
        "Adam `step_in_place` vs in-place loop",
        28,
        paired(
            ROUNDS,
            || adam.step_in_place(&mut donated, &grads).unwrap(),
            || adam_limit_in_place(&mut p_in, &g, &mut m, &mut v, &scalars),
        ),
    );
    let (mut m2, mut v2) = (m.clone(), v.clone());
    table.row(
        "Adam fresh-output loop, advised vs zeroed `vec!`",
        28,
        paired(
            ROUNDS,
            || {
                drop(black_box(adam_limit_fresh(
                    &p, &g, &mut m, &mut v, &scalars, true,
                )))
            },
            || {
                drop(black_box(adam_limit_fresh(
                    &p, &g, &mut m2, &mut v2, &scalars, false,
                )))
            },
        ),
    );
    println!();
}

criterion_group!(benches, bandwidth, sgd, adam, small);

fn main() {
    if !smoke_test() {
        paired_report();
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
