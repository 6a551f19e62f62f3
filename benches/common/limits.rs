//! The practical limit both optimizer benchmarks compare against: single-pass
//! loops over slices with the optimizers' arithmetic, on the same rayon pool,
//! and the paired timing used to compare them on a shared machine.
//! Included by `benches/optimizers.rs` and `benches/executor.rs`.

#![allow(dead_code, reason = "each benchmark uses a subset")]

use ndarray::Array1;
use optirs_tpu::optimizers::Adam;
use rayon::prelude::*;
use std::mem::MaybeUninit;
use std::time::Instant;

/// Elements per rayon task of the hand-written loops.
pub const CHUNK: usize = 1 << 16;

/// The learning rate every optimizer benchmark uses.
pub const LR: f32 = 1e-3;

/// Adam's scalars for step `t`, as the crate computes them.
pub struct AdamScalars {
    pub neg_lr: f32,
    pub b1: f32,
    pub omb1: f32,
    pub b2: f32,
    pub omb2: f32,
    pub ibc1: f32,
    pub ibc2: f32,
    pub eps: f32,
}

impl AdamScalars {
    pub fn new(t: i32) -> Self {
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
pub fn output(n: usize, huge_pages: bool) -> Vec<f32> {
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

pub fn adam_limit_in_place(
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    c: &AdamScalars,
) {
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

pub fn adam_limit_fresh(
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

pub fn sgd_limit_in_place(p: &mut [f32], g: &[f32], neg_lr: f32) {
    (p.par_chunks_mut(CHUNK), g.par_chunks(CHUNK))
        .into_par_iter()
        .for_each(|(p, g)| {
            for (p, &g) in p.iter_mut().zip(g) {
                *p += neg_lr * g;
            }
        });
}

pub fn sgd_limit_fresh(p: &[f32], g: &[f32], neg_lr: f32, huge_pages: bool) -> Vec<f32> {
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
pub fn paired(rounds: usize, mut a: impl FnMut(), mut b: impl FnMut()) -> (f64, f64, f64) {
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

/// The benchmarks' params and grads of length `n`: small, varied values.
pub fn inputs(n: usize) -> (Array1<f32>, Array1<f32>) {
    let params = Array1::from_shape_fn(n, |i| ((i % 1009) as f32 - 504.0) * 1e-3);
    let grads = Array1::from_shape_fn(n, |i| ((i % 101) as f32 - 50.0) * 1e-2);
    (params, grads)
}

/// A Markdown table of [`paired`] results over `n` elements.
pub struct PairedTable {
    n: usize,
}

impl PairedTable {
    /// Prints the header; `ours` names the measured side (`step`, `ours`).
    pub fn new(rounds: usize, n: usize, ours: &str) -> Self {
        println!(
            "\n| pair (1e7 f32, {rounds} alternating rounds) | {ours} min ms | limit min ms | {ours} GB/s | limit GB/s | ratio of mins | median paired ratio |"
        );
        println!("|---|---|---|---|---|---|---|");
        PairedTable { n }
    }

    /// One pair moving `bytes` per element, from [`paired`]'s result.
    pub fn row(&self, name: &str, bytes: usize, (a, b, r): (f64, f64, f64)) {
        let gb = |secs: f64| bytes as f64 * self.n as f64 / secs / 1e9;
        println!(
            "| {name} | {:.2} | {:.2} | {:.1} | {:.1} | {:.3} | {r:.3} |",
            a * 1e3,
            b * 1e3,
            gb(a),
            gb(b),
            a / b
        );
    }
}
