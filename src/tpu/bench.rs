//! [`bench_optimizer`]: one compiled optimizer step against the practical
//! limit, measured in the same run.
//!
//! The limit is a hand-written single-pass loop over slices with the same
//! arithmetic, spread over the same rayon pool in 64 Ki-element chunks, that
//! returns fresh params like `tpu_step` does (for SGD and Adam the loops of
//! `benches/optimizers.rs`; for the other optimizers their own `step`, which
//! is such a loop and measured within a few percent of it). Rounds
//! alternate between the two, so background load lands on both sides; the
//! figures are medians, and the ratio is the median of per-round ratios.
//!
//! Bytes per step are what the update must read and write, without
//! write-allocate traffic: params and grads read, params written, each
//! state slot read and written (SGD 12 B per `f32` element, Adam 28 B).

use std::fmt;
use std::hint::black_box;
use std::mem::MaybeUninit;
use std::time::Instant;

use ndarray::{Array1, ArrayD, IxDyn};
use rayon::prelude::*;
use serde::Serialize;

use super::{TPUConfig, TPUOptimizer};
use crate::error::{OptimError, Result};
use crate::memory::output_buffer;
use crate::optimizers::{Adagrad, Adam, AdamW, Momentum, Nesterov, RMSProp, SGD};
use crate::optimizers::{Optimizer, UpdateKind};

/// Learning rate of the benchmarked optimizers.
pub const BENCH_LEARNING_RATE: f32 = 1e-3;

/// Elements per rayon task of the limit loops.
const LIMIT_CHUNK: usize = 1 << 16;

/// The result of [`bench_optimizer`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OptimizerBench {
    /// The optimizer's name (`adam`).
    pub optimizer: String,
    /// Parameters (`f32`).
    pub size: usize,
    /// Median seconds per compiled `tpu_step` (cached program).
    pub step_seconds: f64,
    /// Median seconds per step of the hand-written loop.
    pub limit_seconds: f64,
    /// Median of per-round `step / limit`.
    pub ratio_to_limit: f64,
    /// Seconds the first step spent compiling.
    pub compile_seconds: f64,
    /// Bytes one step must read and write.
    pub bytes_per_step: u64,
    /// `bytes_per_step / step_seconds`, in GB/s (1e9 bytes/s).
    pub gbps: f64,
    /// `bytes_per_step / limit_seconds`, in GB/s.
    pub limit_gbps: f64,
}

impl fmt::Display for OptimizerBench {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} on {} f32 parameters ({} bytes per step)",
            self.optimizer, self.size, self.bytes_per_step
        )?;
        writeln!(
            f,
            "  compiled step  {:>10.3} ms  {:>7.1} GB/s",
            self.step_seconds * 1e3,
            self.gbps
        )?;
        writeln!(
            f,
            "  limit (loop)   {:>10.3} ms  {:>7.1} GB/s",
            self.limit_seconds * 1e3,
            self.limit_gbps
        )?;
        writeln!(f, "  ratio to limit {:>10.3}", self.ratio_to_limit)?;
        write!(
            f,
            "  compile        {:>10.3} ms",
            self.compile_seconds * 1e3
        )
    }
}

/// The optimizers [`bench_optimizer`] knows, by name.
pub const BENCH_OPTIMIZERS: [&str; 7] = [
    "sgd", "momentum", "nesterov", "adam", "adamw", "rmsprop", "adagrad",
];

fn optimizer_named(name: &str) -> Result<(UpdateKind, Box<dyn Optimizer<f32, IxDyn>>)> {
    let lr = BENCH_LEARNING_RATE;
    let kind = UpdateKind::ALL
        .into_iter()
        .find(|k| k.as_str() == name.to_ascii_lowercase())
        .ok_or_else(|| {
            OptimError::InvalidConfig(format!(
                "unknown optimizer `{name}` (known: {})",
                BENCH_OPTIMIZERS.join(", ")
            ))
        })?;
    let opt: Box<dyn Optimizer<f32, IxDyn>> = match kind {
        UpdateKind::Sgd => Box::new(SGD::new(lr)),
        UpdateKind::Momentum => Box::new(Momentum::new(lr, 0.9)),
        UpdateKind::Nesterov => Box::new(Nesterov::new(lr, 0.9)),
        UpdateKind::Adam => Box::new(Adam::new(lr)),
        UpdateKind::AdamW => Box::new(AdamW::new(lr, 1e-4)),
        UpdateKind::RmsProp => Box::new(RMSProp::new(lr)),
        UpdateKind::Adagrad => Box::new(Adagrad::new(lr)),
    };
    Ok((kind, opt))
}

/// A hand-written fresh-output loop for one optimizer.
enum Limit {
    Sgd {
        neg_lr: f32,
    },
    Adam {
        c: crate::optimizers::AdamConstants<f32>,
        mu: Vec<f32>,
        nu: Vec<f32>,
    },
    Step(Box<dyn Optimizer<f32, IxDyn>>),
}

impl Limit {
    fn step(&mut self, p: &ArrayD<f32>, g: &ArrayD<f32>) -> Result<Vec<f32>> {
        let (ps, gs) = (
            p.as_slice().expect("standard layout"),
            g.as_slice().expect("standard layout"),
        );
        match self {
            Limit::Sgd { neg_lr } => {
                let neg_lr = *neg_lr;
                Ok(fresh_map(ps, gs, move |p, g| p + neg_lr * g))
            }
            Limit::Adam { c, mu, nu } => Ok(adam_fresh(ps, gs, mu, nu, c)),
            Limit::Step(opt) => Ok(opt.step(p, g)?.into_raw_vec_and_offset().0),
        }
    }
}

fn fresh_map(p: &[f32], g: &[f32], f: impl Fn(f32, f32) -> f32 + Sync) -> Vec<f32> {
    let n = p.len();
    let mut out = output_buffer::<f32>(n);
    let o: &mut [MaybeUninit<f32>] = &mut out.spare_capacity_mut()[..n];
    (
        o.par_chunks_mut(LIMIT_CHUNK),
        p.par_chunks(LIMIT_CHUNK),
        g.par_chunks(LIMIT_CHUNK),
    )
        .into_par_iter()
        .for_each(|(o, p, g)| {
            for ((o, &p), &g) in o.iter_mut().zip(p).zip(g) {
                o.write(f(p, g));
            }
        });
    // SAFETY: the zipped chunks cover all `n` outputs and each was written.
    unsafe { out.set_len(n) };
    out
}

fn adam_fresh(
    p: &[f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    c: &crate::optimizers::AdamConstants<f32>,
) -> Vec<f32> {
    let n = p.len();
    let mut out = output_buffer::<f32>(n);
    let o: &mut [MaybeUninit<f32>] = &mut out.spare_capacity_mut()[..n];
    (
        o.par_chunks_mut(LIMIT_CHUNK),
        p.par_chunks(LIMIT_CHUNK),
        g.par_chunks(LIMIT_CHUNK),
        m.par_chunks_mut(LIMIT_CHUNK),
        v.par_chunks_mut(LIMIT_CHUNK),
    )
        .into_par_iter()
        .for_each(|(o, p, g, m, v)| {
            for ((((o, &p), &g), m), v) in o.iter_mut().zip(p).zip(g).zip(m).zip(v) {
                *m = c.one_minus_b1 * g + c.b1 * *m;
                *v = c.one_minus_b2 * (g * g) + c.b2 * *v;
                let d = (*m * c.inv_bias_correction1)
                    / ((*v * c.inv_bias_correction2 + c.eps_root).sqrt() + c.eps);
                o.write(p + c.neg_lr * d);
            }
        });
    // SAFETY: the zipped chunks cover all `n` outputs and each was written.
    unsafe { out.set_len(n) };
    out
}

/// Refuses a benchmark whose buffers need more than `budget` bytes.
fn check_host_memory(name: &str, slots: usize, size: usize, budget: u128) -> Result<()> {
    let needed = bench_host_bytes(slots, size);
    if needed > budget {
        let gib = |b: u128| b as f64 / (1u64 << 30) as f64;
        return Err(OptimError::InvalidConfig(format!(
            "{name} on {size} f32 parameters needs {:.1} GiB of host memory for params, \
             grads, state and outputs; {:.1} GiB is available: use a smaller size",
            gib(needed),
            gib(budget)
        )));
    }
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Host memory [`bench_optimizer`] may use when the available memory
/// cannot be read (`MemAvailable` of `/proc/meminfo` on Linux).
pub const FALLBACK_HOST_BYTES: u128 = 16 << 30;

/// `f32` arrays of `size` elements [`bench_optimizer`] holds at once for an
/// optimizer with `slots` state slots: params and grads; the compiled
/// step's state and its fresh output; the limit loop's state and output;
/// and one more of each output while a round's result is dropped.
pub fn bench_host_bytes(slots: usize, size: usize) -> u128 {
    (6 + 2 * slots as u128) * size as u128 * 4
}

/// The host memory available for the benchmark's buffers.
pub fn host_memory_budget() -> u128 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
            let kib: u128 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(FALLBACK_HOST_BYTES)
}

/// Measures `steps` alternating rounds of the compiled step of optimizer
/// `name` on `size` `f32` params and of the hand-written limit loop.
///
/// Refuses, before allocating anything, a `size` whose buffers
/// ([`bench_host_bytes`]) do not fit in [`host_memory_budget`].
pub fn bench_optimizer(name: &str, size: usize, steps: usize) -> Result<OptimizerBench> {
    if size == 0 || steps == 0 {
        return Err(OptimError::InvalidConfig(format!(
            "size ({size}) and steps ({steps}) must be positive"
        )));
    }
    let (kind, base) = optimizer_named(name)?;
    let slots = base.update_rule().map_or(0, |r| r.slot_names().len());
    check_host_memory(kind.as_str(), slots, size, host_memory_budget())?;
    let bytes_per_step = ((3 + 2 * slots as u128) * size as u128 * 4) as u64;
    let p: ArrayD<f32> =
        Array1::from_iter((0..size).map(|i| ((i % 1000) as f32 - 500.0) * 1e-3)).into_dyn();
    let g: ArrayD<f32> =
        Array1::from_iter((0..size).map(|i| ((i % 777) as f32 - 388.0) * 1e-4)).into_dyn();
    let mut tpu = TPUOptimizer::new(base, TPUConfig::default())?;
    drop(black_box(tpu.tpu_step(&p, &g)?));
    let compile_seconds = tpu.profile().compile_seconds;
    let mut limit = match kind {
        UpdateKind::Sgd => Limit::Sgd {
            neg_lr: -BENCH_LEARNING_RATE,
        },
        UpdateKind::Adam => Limit::Adam {
            c: Adam::new(BENCH_LEARNING_RATE).constants(2),
            mu: vec![0.0; size],
            nu: vec![0.0; size],
        },
        _ => Limit::Step(optimizer_named(name)?.1),
    };
    drop(black_box(limit.step(&p, &g)?));
    let (mut ours, mut theirs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..steps {
        let t = Instant::now();
        drop(black_box(tpu.tpu_step(&p, &g)?));
        let a = t.elapsed().as_secs_f64();
        let t = Instant::now();
        drop(black_box(limit.step(&p, &g)?));
        let b = t.elapsed().as_secs_f64();
        ours.push(a);
        theirs.push(b);
        ratios.push(a / b);
    }
    let step_seconds = median(&mut ours);
    let limit_seconds = median(&mut theirs);
    Ok(OptimizerBench {
        optimizer: kind.as_str().to_owned(),
        size,
        step_seconds,
        limit_seconds,
        ratio_to_limit: median(&mut ratios),
        compile_seconds,
        bytes_per_step,
        gbps: bytes_per_step as f64 / step_seconds / 1e9,
        limit_gbps: bytes_per_step as f64 / limit_seconds / 1e9,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_beyond_host_memory_is_refused_before_allocating() {
        let err = bench_optimizer("adam", 100_000_000_000, 1).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("host memory"), "{msg}");
        assert!(msg.contains("100000000000"), "{msg}");
        assert!(check_host_memory("sgd", 0, 1 << 20, 1 << 30).is_ok());
        assert!(check_host_memory("sgd", 0, 1 << 30, 1 << 30).is_err());
        assert_eq!(bench_host_bytes(2, usize::MAX), 10 * 4 * usize::MAX as u128);
    }
}
