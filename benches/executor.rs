//! The compiled optimizer step (`TPUOptimizer::tpu_step`: graph → fused
//! kernel → `exec::runtime`) at 1e7 f32 parameters against the practical
//! limit, and the cached step at 1e3 parameters.
//!
//! * `executor/{adam,sgd}_tpu_step`: `tpu_step` (fresh params, like `step`)
//!   and `tpu_step_in_place` (a donated params buffer), program cached.
//! * `executor/{adam,sgd}_limit_*`: the hand-written single-pass loops of
//!   `benches/optimizers.rs` (rayon over 64 Ki-element chunks, same threads,
//!   same arithmetic, fresh outputs advised to use transparent huge pages).
//! * `executor/small/*`: one cached `tpu_step` (and `tpu_step_in_place`) at
//!   1e3 parameters.
//!
//! Bytes moved: SGD 12 B/element, Adam 28 B/element (reads plus writes).
//!
//! Run: `cargo bench --bench executor -- --warm-up-time 1 --measurement-time 3`
//! (the paired table comes first; `cargo bench --bench executor -- '^none$'`
//! prints only the table).

use criterion::{BenchmarkId, Criterion, Throughput, black_box, criterion_group};
use ndarray::Array1;
use optirs_tpu::exec::kernels::Tensor;
use optirs_tpu::exec::runtime::{Arg, NoCustomCalls, Runtime};
use optirs_tpu::optimizers::UpdateRule;
use optirs_tpu::optimizers::{Adam, SGD};
use optirs_tpu::tpu::graph::build_update_graph;
use optirs_tpu::xla;
use optirs_tpu::{TPUConfig, TPUOptimizer};
use std::sync::OnceLock;
use std::time::Instant;

/// Without `--bench`, criterion runs each benchmark once as a smoke test;
/// sizes then shrink and the paired report is skipped.
fn smoke_test() -> bool {
    static SMOKE: OnceLock<bool> = OnceLock::new();
    *SMOKE.get_or_init(|| !std::env::args().any(|a| a == "--bench"))
}

/// Parameters per step: 1e7.
fn n() -> usize {
    if smoke_test() { 1 << 12 } else { 10_000_000 }
}

const SMALL: usize = 1_000;

#[path = "common/limits.rs"]
mod limits;
use limits::*;

fn tpu_adam() -> TPUOptimizer<Adam<f32>, f32> {
    TPUOptimizer::new(Adam::new(LR), TPUConfig::default()).unwrap()
}

fn tpu_sgd() -> TPUOptimizer<SGD<f32>, f32> {
    TPUOptimizer::new(SGD::new(LR), TPUConfig::default()).unwrap()
}

/// Adam's update program for `len` f32 compiled once, as a runtime with
/// native loops and one without, and borrowed arguments for it.
fn adam_runtimes(len: usize) -> (Runtime, Runtime, Vec<Tensor>) {
    let mut world = xla::compiler_world();
    let adam = Adam::<f32>::new(LR);
    let program = build_update_graph(&mut world, &adam as &dyn UpdateRule<f32>, &[len]).unwrap();
    let exe = xla::compile(&mut world, program).unwrap().executable;
    let native = Runtime::new(exe);
    assert_eq!(native.native_loops(), vec![Some(Ok(()))]);
    let interpreted = native.clone().with_native_code(false);
    let (p, g) = inputs(len);
    let f = |a: Array1<f32>| Tensor::F32(a.into_dyn());
    let args = vec![
        f(p),
        f(g),
        f(Array1::from_elem(len, 1e-3)),
        f(Array1::from_elem(len, 1e-4)),
        Tensor::I32(ndarray::arr0(10).into_dyn()),
        // The learning rate is a run-time argument (negated).
        Tensor::F32(ndarray::arr0(-LR).into_dyn()),
    ];
    (native, interpreted, args)
}

fn large(c: &mut Criterion) {
    let (params, grads) = inputs(n());
    let (p, g) = (params.to_vec(), grads.to_vec());
    let mut group = c.benchmark_group("executor");
    group.throughput(Throughput::Bytes(28 * n() as u64));
    let mut adam = tpu_adam();
    adam.tpu_step(&params, &grads).unwrap();
    group.bench_function("adam_tpu_step", |b| {
        b.iter(|| black_box(adam.tpu_step(&params, &grads).unwrap()))
    });
    let mut donated = params.clone();
    group.bench_function("adam_tpu_step_in_place", |b| {
        b.iter(|| adam.tpu_step_in_place(&mut donated, &grads).unwrap())
    });
    let (mut m, mut v) = (vec![0.0f32; n()], vec![0.0f32; n()]);
    let scalars = AdamScalars::new(10);
    group.bench_function("adam_limit_fresh", |b| {
        b.iter(|| black_box(adam_limit_fresh(&p, &g, &mut m, &mut v, &scalars, true)))
    });
    group.throughput(Throughput::Bytes(12 * n() as u64));
    let mut sgd = tpu_sgd();
    group.bench_function("sgd_tpu_step", |b| {
        b.iter(|| black_box(sgd.tpu_step(&params, &grads).unwrap()))
    });
    let mut donated = params.clone();
    group.bench_function("sgd_tpu_step_in_place", |b| {
        b.iter(|| sgd.tpu_step_in_place(&mut donated, &grads).unwrap())
    });
    group.bench_function("sgd_limit_fresh", |b| {
        b.iter(|| black_box(sgd_limit_fresh(&p, &g, -LR, true)))
    });
    group.finish();
}

fn small(c: &mut Criterion) {
    let (params, grads) = inputs(SMALL);
    let mut group = c.benchmark_group("executor/small");
    let mut adam = tpu_adam();
    adam.tpu_step(&params, &grads).unwrap();
    group.bench_function(BenchmarkId::new("adam_tpu_step", SMALL), |b| {
        b.iter(|| black_box(adam.tpu_step(&params, &grads).unwrap()))
    });
    let mut sgd = tpu_sgd();
    sgd.tpu_step(&params, &grads).unwrap();
    group.bench_function(BenchmarkId::new("sgd_tpu_step", SMALL), |b| {
        b.iter(|| black_box(sgd.tpu_step(&params, &grads).unwrap()))
    });
    // The documented fast path: params donated, nothing allocated.
    let mut donated = params.clone();
    group.bench_function(BenchmarkId::new("adam_tpu_step_in_place", SMALL), |b| {
        b.iter(|| adam.tpu_step_in_place(&mut donated, &grads).unwrap())
    });
    group.bench_function(BenchmarkId::new("sgd_tpu_step_in_place", SMALL), |b| {
        b.iter(|| sgd.tpu_step_in_place(&mut donated, &grads).unwrap())
    });
    group.finish();
}

/// Prints the compiled-step-to-limit ratios as a Markdown table.
fn paired_report() {
    const ROUNDS: usize = 61;
    let (params, grads) = inputs(n());
    let (p, g) = (params.to_vec(), grads.to_vec());
    let table = PairedTable::new(ROUNDS, n(), "ours");
    let mut sgd = tpu_sgd();
    table.row(
        "SGD `tpu_step` vs fresh-output loop",
        12,
        paired(
            ROUNDS,
            || drop(black_box(sgd.tpu_step(&params, &grads).unwrap())),
            || drop(black_box(sgd_limit_fresh(&p, &g, -LR, true))),
        ),
    );
    let (mut donated, mut p_in) = (params.clone(), p.clone());
    table.row(
        "SGD `tpu_step_in_place` vs in-place loop",
        12,
        paired(
            ROUNDS,
            || sgd.tpu_step_in_place(&mut donated, &grads).unwrap(),
            || sgd_limit_in_place(&mut p_in, &g, -LR),
        ),
    );
    let mut adam = tpu_adam();
    adam.tpu_step(&params, &grads).unwrap();
    let (mut m, mut v) = (vec![0.0f32; n()], vec![0.0f32; n()]);
    let scalars = AdamScalars::new(10);
    table.row(
        "Adam `tpu_step` vs fresh-output loop",
        28,
        paired(
            ROUNDS,
            || drop(black_box(adam.tpu_step(&params, &grads).unwrap())),
            || {
                drop(black_box(adam_limit_fresh(
                    &p, &g, &mut m, &mut v, &scalars, true,
                )))
            },
        ),
    );
    let (mut donated, mut p_in) = (params.clone(), p.clone());
    table.row(
        "Adam `tpu_step_in_place` vs in-place loop",
        28,
        paired(
            ROUNDS,
            || adam.tpu_step_in_place(&mut donated, &grads).unwrap(),
            || adam_limit_in_place(&mut p_in, &g, &mut m, &mut v, &scalars),
        ),
    );
    // The same fused Adam loop run by the runtime as native code and by
    // its chunk interpreter: what the code generation buys.
    for len in [n(), SMALL] {
        let (native, interpreted, args) = adam_runtimes(len);
        let run = |rt: &Runtime| {
            let args: Vec<Arg<'_>> = args.iter().map(Arg::tensor).collect();
            drop(black_box(rt.run(args, &mut NoCustomCalls).unwrap()));
        };
        let rounds = if len == SMALL { 2001 } else { ROUNDS };
        let (a, b, r) = paired(rounds, || run(&native), || run(&interpreted));
        println!(
            "Adam fused loop at {len} f32, native vs chunk interpreter ({rounds} paired rounds): {:.2} µs vs {:.2} µs, median ratio {r:.3}",
            a * 1e6,
            b * 1e6
        );
    }
    let small = |opt: &mut dyn FnMut()| {
        let start = Instant::now();
        for _ in 0..10_000 {
            opt();
        }
        start.elapsed().as_secs_f64() / 10_000.0
    };
    let (sp, sg) = inputs(SMALL);
    let mut adam = tpu_adam();
    let mut sgd = tpu_sgd();
    let a = small(&mut || drop(black_box(adam.tpu_step(&sp, &sg).unwrap())));
    let s = small(&mut || drop(black_box(sgd.tpu_step(&sp, &sg).unwrap())));
    println!(
        "\ncached `tpu_step` at 1e3 f32: Adam {:.2} µs, SGD {:.2} µs (mean of 10,000)\n",
        a * 1e6,
        s * 1e6
    );
}

criterion_group!(benches, large, small);

fn main() {
    if !smoke_test() {
        paired_report();
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
