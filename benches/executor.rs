//! The compiled optimizer step (`TPUOptimizer::tpu_step`: graph → fused
//! kernel → `exec::runtime`) at 1e7 f32 parameters against the practical
//! limit, and the cached step at 1e3 parameters.
//!
//! * `executor/{adam,sgd}_tpu_step`: `tpu_step` (fresh params, like `step`)
//!   and `tpu_step_in_place` (a donated params buffer), program cached.
//! * `executor/{adam,sgd}_limit_*`: the hand-written single-pass loops of
//!   `benches/optimizers.rs` (rayon over 64 Ki-element chunks, same threads,
//!   same arithmetic, fresh outputs advised to use transparent huge pages).
//! * `executor/small/*`: one cached `tpu_step` at 1e3 parameters.
//!
//! Bytes moved: SGD 12 B/element, Adam 28 B/element (reads plus writes).
//!
//! Run: `cargo bench --bench executor -- --warm-up-time 1 --measurement-time 3`
//! (the paired table comes first; `cargo bench --bench executor -- '^none$'`
//! prints only the table).

use criterion::{BenchmarkId, Criterion, Throughput, black_box, criterion_group};
use ndarray::Array1;
use optirs_tpu::optimizers::{Adam, SGD};
use optirs_tpu::{TPUConfig, TPUOptimizer};
use rayon::prelude::*;
use std::mem::MaybeUninit;
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
const CHUNK: usize = 1 << 16;
const LR: f32 = 1e-3;

fn inputs(n: usize) -> (Array1<f32>, Array1<f32>) {
    let params = Array1::from_shape_fn(n, |i| ((i % 1009) as f32 - 504.0) * 1e-3);
    let grads = Array1::from_shape_fn(n, |i| ((i % 101) as f32 - 50.0) * 1e-2);
    (params, grads)
}

/// Adam's scalars for step `t`, as the crate computes them.
struct AdamScalars {
    neg_lr: f32,
    b1: f32,
    omb1: f32,
    b2: f32,
    omb2: f32,
    ibc1: f32,
    ibc2: f32,
    eps: f32,
}

impl AdamScalars {
    fn new(t: i32) -> Self {
        let c = Adam::new(LR).constants(t);
        Self {
            neg_lr: c.neg_lr,
            b1: c.b1,
            omb1: c.one_minus_b1,
            b2: c.b2,
            omb2: c.one_minus_b2,
            ibc1: c.inv_bias_correction1,
            ibc2: c.inv_bias_correction2,
            eps: c.eps,
        }
    }

    #[inline(always)]
    fn update(&self, p: f32, g: f32, m: &mut f32, v: &mut f32) -> f32 {
        *m = self.omb1 * g + self.b1 * *m;
        *v = self.omb2 * (g * g) + self.b2 * *v;
        let d = (*m * self.ibc1) / ((*v * self.ibc2).sqrt() + self.eps);
        p + self.neg_lr * d
    }
}

/// Room for `n` outputs (length 0): uninitialised and advised to use
/// transparent huge pages, as the crate allocates `step`'s result, or
/// (`huge_pages` false) the untouched memory of a plain `vec![0.0; n]`.
fn output(n: usize, huge_pages: bool) -> Vec<f32> {
    if !huge_pages {
        let mut out = vec![0.0; n];
        out.clear();
        return out;
    }
    let out = Vec::<f32>::with_capacity(n);
    const HUGE_PAGE: usize = 2 << 20;
    let start = (out.as_ptr() as usize).next_multiple_of(HUGE_PAGE);
    let end = (out.as_ptr() as usize + 4 * n) / HUGE_PAGE * HUGE_PAGE;
    if end > start {
        // SAFETY: the range lies inside `out`'s allocation; the advice changes
        // only how the pages are backed.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
    out
}

fn adam_limit_in_place(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], c: &AdamScalars) {
    (
        p.par_chunks_mut(CHUNK),
        g.par_chunks(CHUNK),
        m.par_chunks_mut(CHUNK),
        v.par_chunks_mut(CHUNK),
    )
        .into_par_iter()
        .for_each(|(p, g, m, v)| {
            for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m).zip(v) {
                *p = c.update(*p, g, m, v);
            }
        });
}

fn adam_limit_fresh(
    p: &[f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    c: &AdamScalars,
    huge_pages: bool,
) -> Vec<f32> {
    let n = p.len();
    let mut out = output(n, huge_pages);
    let o: &mut [MaybeUninit<f32>] = &mut out.spare_capacity_mut()[..n];
    (
        o.par_chunks_mut(CHUNK),
        p.par_chunks(CHUNK),
        g.par_chunks(CHUNK),
        m.par_chunks_mut(CHUNK),
        v.par_chunks_mut(CHUNK),
    )
        .into_par_iter()
        .for_each(|(o, p, g, m, v)| {
            for ((((o, &p), &g), m), v) in o.iter_mut().zip(p).zip(g).zip(m).zip(v) {
                o.write(c.update(p, g, m, v));
            }
        });
    // SAFETY: the zipped chunks cover all `n` outputs and each was written.
    unsafe { out.set_len(n) };
    out
}

fn sgd_limit_in_place(p: &mut [f32], g: &[f32], neg_lr: f32) {
    (p.par_chunks_mut(CHUNK), g.par_chunks(CHUNK))
        .into_par_iter()
        .for_each(|(p, g)| {
            for (p, &g) in p.iter_mut().zip(g) {
                *p += neg_lr * g;
            }
        });
}

fn sgd_limit_fresh(p: &[f32], g: &[f32], neg_lr: f32, huge_pages: bool) -> Vec<f32> {
    let n = p.len();
    let mut out = output(n, huge_pages);
    let o: &mut [MaybeUninit<f32>] = &mut out.spare_capacity_mut()[..n];
    (
        o.par_chunks_mut(CHUNK),
        p.par_chunks(CHUNK),
        g.par_chunks(CHUNK),
    )
        .into_par_iter()
        .for_each(|(o, p, g)| {
            for ((o, &p), &g) in o.iter_mut().zip(p).zip(g) {
                o.write(p + neg_lr * g);
            }
        });
    // SAFETY: the zipped chunks cover all `n` outputs and each was written.
    unsafe { out.set_len(n) };
    out
}

/// Times `a` and `b` alternately, `rounds` times each after one warm-up
/// call, and returns (min a, min b, median of the per-round ratios a/b).
/// Other processes on a shared machine only ever add time, and they hit
/// both sides of a round alike, so the minimums and the paired ratios are
/// steadier than two separate criterion runs.
fn paired(rounds: usize, mut a: impl FnMut(), mut b: impl FnMut()) -> (f64, f64, f64) {
    let time = |f: &mut dyn FnMut()| {
        let start = Instant::now();
        f();
        start.elapsed().as_secs_f64()
    };
    a();
    b();
    let (mut ta, mut tb, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let x = time(&mut a);
        let y = time(&mut b);
        ta.push(x);
        tb.push(y);
        ratios.push(x / y);
    }
    ratios.sort_by(f64::total_cmp);
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    (min(&ta), min(&tb), ratios[rounds / 2])
}

fn tpu_adam() -> TPUOptimizer<Adam<f32>, f32> {
    TPUOptimizer::new(Adam::new(LR), TPUConfig::default()).unwrap()
}

fn tpu_sgd() -> TPUOptimizer<SGD<f32>, f32> {
    TPUOptimizer::new(SGD::new(LR), TPUConfig::default()).unwrap()
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
    group.finish();
}

/// Prints the compiled-step-to-limit ratios as a Markdown table.
fn paired_report() {
    const ROUNDS: usize = 61;
    let (params, grads) = inputs(n());
    let (p, g) = (params.to_vec(), grads.to_vec());
    let gb = |bytes: usize, secs: f64| bytes as f64 * n() as f64 / secs / 1e9;
    println!(
        "\n| pair (1e7 f32, {ROUNDS} alternating rounds) | ours min ms | limit min ms | ours GB/s | limit GB/s | ratio of mins | median paired ratio |"
    );
    println!("|---|---|---|---|---|---|---|");
    let row = |name: &str, bytes: usize, (a, b, r): (f64, f64, f64)| {
        println!(
            "| {name} | {:.2} | {:.2} | {:.1} | {:.1} | {:.3} | {r:.3} |",
            a * 1e3,
            b * 1e3,
            gb(bytes, a),
            gb(bytes, b),
            a / b
        );
    };
    let mut sgd = tpu_sgd();
    row(
        "SGD `tpu_step` vs fresh-output loop",
        12,
        paired(
            ROUNDS,
            || drop(black_box(sgd.tpu_step(&params, &grads).unwrap())),
            || drop(black_box(sgd_limit_fresh(&p, &g, -LR, true))),
        ),
    );
    let (mut donated, mut p_in) = (params.clone(), p.clone());
    row(
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
    row(
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
    row(
        "Adam `tpu_step_in_place` vs in-place loop",
        28,
        paired(
            ROUNDS,
            || adam.tpu_step_in_place(&mut donated, &grads).unwrap(),
            || adam_limit_in_place(&mut p_in, &g, &mut m, &mut v, &scalars),
        ),
    );
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
