//! [`bench_optimizer`]: one compiled optimizer step, in place and with a
//! fresh output, against the physical floor, measured in the same run.
//!
//! The floor is the machine's streaming floor ([`crate::memory::stream`]):
//! the best rate of an in-place add, a read-only sum and a copy, each on
//! one thread and on every core, over a working set the size of the
//! update's (params, grads and state), best-of-N on warm buffers. The
//! update's floor is the bytes it must move at that rate. A plain copy into
//! a buffer that already exists gives the machine's copy bandwidth beside
//! it.
//!
//! A second reference is the hand-written fresh-output loop: a single pass
//! over slices with the same arithmetic, in 64 Ki-element chunks, that
//! returns fresh params like `tpu_step` does (for SGD and Adam the loops of
//! `benches/optimizers.rs`; for the other optimizers their own `step`). It
//! measures the fresh-output path against a loop that pays the same page
//! faults, not against the machine.
//!
//! Rounds are paired: each runs every side once, starting one further along
//! each round, so background load lands on all of them; the figures are
//! medians, and the ratios between sides are medians of per-round ratios.
//! The floor is measured before the rounds, after them and after the warm
//! run, the best taken.
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
use crate::memory::stream::{StreamFloor, measure_stream_floor};
use crate::optimizers::{Adam, Optimizer, UpdateKind};
use crate::training::median;

/// Learning rate of the benchmarked optimizers.
pub const BENCH_LEARNING_RATE: f32 = 1e-3;

/// Elements per rayon task of the reference kernels.
const CHUNK: usize = 1 << 16;

/// The result of [`bench_optimizer`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OptimizerBench {
    /// The optimizer's name (`adam`).
    pub optimizer: String,
    /// Parameters (`f32`).
    pub size: usize,
    /// Median seconds per compiled `tpu_step` (fresh output, cached program).
    pub step_seconds: f64,
    /// Median seconds per compiled `tpu_step_in_place` (cached program).
    pub in_place_step_seconds: f64,
    /// Median seconds per compiled `tpu_step` whose caller hands the
    /// previous output back with `TPUOptimizer::recycle` (fresh output in
    /// pages already faulted in).
    pub recycled_step_seconds: f64,
    /// Median of per-round `recycled_step / in_place_step`.
    pub recycled_ratio_to_in_place: f64,
    /// Seconds per step at the streaming floor: `bytes_per_step` at
    /// `floor_gbps`.
    pub floor_seconds: f64,
    /// `in_place_step_seconds / floor_seconds`.
    pub ratio_to_floor: f64,
    /// Median seconds per in-place step in a run of `steps` back to back
    /// on the same buffers (after one untimed): how a loop that only steps,
    /// or a peer timing its step back to back (`benches/xla_peer.py`), sees
    /// it. The rounds above run five sides in turn, so each finds its
    /// buffers evicted; where the last-level cache holds the step's working
    /// set (the reference machine's 260 MiB of L3 against 80 MB for SGD at
    /// 1e7), the two differ.
    pub warm_in_place_step_seconds: f64,
    /// The floor for the warm step: the same as `floor_seconds` (the
    /// floor's kernels are timed warm, best-of-N).
    pub warm_floor_seconds: f64,
    /// `warm_in_place_step_seconds / warm_floor_seconds`.
    pub warm_ratio_to_floor: f64,
    /// `step_seconds / floor_seconds` (the fresh-output path).
    pub fresh_ratio_to_floor: f64,
    /// Median seconds per plain copy of `size` `f32` into a buffer that
    /// already exists (`8 * size` bytes moved).
    pub copy_seconds: f64,
    /// Median seconds per step of the hand-written fresh-output loop.
    pub fresh_loop_seconds: f64,
    /// Median of per-round `step / fresh_loop`.
    pub ratio_to_fresh_loop: f64,
    /// Seconds the first step spent compiling.
    pub compile_seconds: f64,
    /// Bytes one step must read and write.
    pub bytes_per_step: u64,
    /// `bytes_per_step / step_seconds`, in GB/s (1e9 bytes/s).
    pub gbps: f64,
    /// `bytes_per_step / in_place_step_seconds`, in GB/s.
    pub in_place_gbps: f64,
    /// The machine's streaming floor, GB/s: the best rate of its kernels.
    pub floor_gbps: f64,
    /// The kernel the floor was measured with (`add`, `sum`, `copy`).
    pub floor_kernel: String,
    /// Threads that kernel ran on.
    pub floor_threads: usize,
    /// `8 * size / copy_seconds`, in GB/s.
    pub copy_gbps: f64,
    /// `bytes_per_step / fresh_loop_seconds`, in GB/s.
    pub fresh_loop_gbps: f64,
}

impl fmt::Display for OptimizerBench {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} on {} f32 parameters ({} bytes per step)",
            self.optimizer, self.size, self.bytes_per_step
        )?;
        let row = |f: &mut fmt::Formatter<'_>, name: &str, s: f64, gbps: f64| {
            writeln!(f, "  {name:<22} {:>10.3} ms  {gbps:>7.1} GB/s", s * 1e3)
        };
        row(
            f,
            "step, in place",
            self.in_place_step_seconds,
            self.in_place_gbps,
        )?;
        row(f, "step, fresh output", self.step_seconds, self.gbps)?;
        row(
            f,
            "step, fresh, recycled",
            self.recycled_step_seconds,
            self.bytes_per_step as f64 / self.recycled_step_seconds / 1e9,
        )?;
        row(f, "floor", self.floor_seconds, self.floor_gbps)?;
        writeln!(
            f,
            "  floor kernel           {} on {} thread{}",
            self.floor_kernel,
            self.floor_threads,
            if self.floor_threads == 1 { "" } else { "s" }
        )?;
        row(
            f,
            "step, in place, warm",
            self.warm_in_place_step_seconds,
            self.bytes_per_step as f64 / self.warm_in_place_step_seconds / 1e9,
        )?;
        row(f, "copy (8 B/element)", self.copy_seconds, self.copy_gbps)?;
        row(
            f,
            "fresh-output loop",
            self.fresh_loop_seconds,
            self.fresh_loop_gbps,
        )?;
        writeln!(
            f,
            "  ratio to floor         {:>10.3}  (in place)",
            self.ratio_to_floor
        )?;
        writeln!(
            f,
            "  ratio to floor         {:>10.3}  (fresh output)",
            self.fresh_ratio_to_floor
        )?;
        writeln!(
            f,
            "  ratio to fresh loop    {:>10.3}  (fresh output)",
            self.ratio_to_fresh_loop
        )?;
        write!(
            f,
            "  compile                {:>10.3} ms",
            self.compile_seconds * 1e3
        )
    }
}

/// The optimizers [`bench_optimizer`] knows, by name (every built-in one).
pub const BENCH_OPTIMIZERS: [&str; 7] = crate::optimizers::NAMES;

fn optimizer_named(name: &str) -> Result<(UpdateKind, Box<dyn Optimizer<f32, IxDyn>>)> {
    let opt = crate::optimizers::by_name(name, BENCH_LEARNING_RATE)?;
    let kind = opt
        .update_rule()
        .map(|r| r.update_kind())
        .ok_or_else(|| OptimError::invalid_config(format!("`{name}` has no update rule")))?;
    Ok((kind, opt))
}

/// A hand-written fresh-output loop for one optimizer.
enum FreshLoop {
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

impl FreshLoop {
    fn step(&mut self, p: &ArrayD<f32>, g: &ArrayD<f32>) -> Result<Vec<f32>> {
        let (ps, gs) = (
            p.as_slice().expect("standard layout"),
            g.as_slice().expect("standard layout"),
        );
        match self {
            FreshLoop::Sgd { neg_lr } => {
                let neg_lr = *neg_lr;
                Ok(fresh_map(ps, gs, move |p, g| p + neg_lr * g))
            }
            FreshLoop::Adam { c, mu, nu } => Ok(adam_fresh(ps, gs, mu, nu, c)),
            FreshLoop::Step(opt) => Ok(opt.step(p, g)?.into_raw_vec_and_offset().0),
        }
    }
}

fn fresh_map(p: &[f32], g: &[f32], f: impl Fn(f32, f32) -> f32 + Sync) -> Vec<f32> {
    let n = p.len();
    let mut out = output_buffer::<f32>(n);
    let o: &mut [MaybeUninit<f32>] = &mut out.spare_capacity_mut()[..n];
    (
        o.par_chunks_mut(CHUNK),
        p.par_chunks(CHUNK),
        g.par_chunks(CHUNK),
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
        o.par_chunks_mut(CHUNK),
        p.par_chunks(CHUNK),
        g.par_chunks(CHUNK),
        m.par_chunks_mut(CHUNK),
        v.par_chunks_mut(CHUNK),
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

/// A plain parallel copy of `src` into `dst` (both already faulted in).
fn copy(dst: &mut [f32], src: &[f32]) {
    (dst.par_chunks_mut(CHUNK), src.par_chunks(CHUNK))
        .into_par_iter()
        .for_each(|(d, s)| d.copy_from_slice(s));
}

/// Refuses a benchmark whose buffers need more than `budget` bytes.
fn check_host_memory(name: &str, slots: usize, size: usize, budget: u128) -> Result<()> {
    let needed = bench_host_bytes(slots, size);
    if needed > budget {
        let gib = |b: u128| b as f64 / (1u64 << 30) as f64;
        return Err(OptimError::invalid_config(format!(
            "{name} on {size} f32 parameters needs {:.1} GiB of host memory for params, \
             grads, state and outputs; {:.1} GiB is available: use a smaller size",
            gib(needed),
            gib(budget)
        )));
    }
    Ok(())
}

/// Host memory [`bench_optimizer`] may use when the available memory
/// cannot be read, and the memory available for the benchmark's buffers:
/// one budget for every run on this host, in [`crate::training::host`].
pub use crate::training::host::{FALLBACK_HOST_BYTES, host_memory_budget};

/// `f32` arrays of `size` elements [`bench_optimizer`] holds at once for an
/// optimizer with `slots` state slots: params and grads; the fresh step's
/// state and its output; the fresh-output loop's state and output; one
/// more of each output while a round's result is dropped; the in-place
/// step's params and state; the floor's two arrays, which span the
/// update's working set (params, grads and state); and the copy's
/// destination.
pub fn bench_host_bytes(slots: usize, size: usize) -> u128 {
    (10 + 4 * slots as u128) * size as u128 * 4
}

/// Streaming passes the floor is the best of, per kernel and thread count.
const FLOOR_REPS: usize = 15;

/// The streaming floor over the working set of an update with `slots`
/// state slots on `size` params: params, grads and every slot.
fn measure_floor(slots: usize, size: usize) -> StreamFloor {
    measure_stream_floor((2 + slots as u64) * 4 * size as u64, FLOOR_REPS)
}

/// The benchmark's params and gradients: `size` deterministic `f32`s each.
fn bench_inputs(size: usize) -> (ArrayD<f32>, ArrayD<f32>) {
    let p = Array1::from_iter((0..size).map(|i| ((i % 1000) as f32 - 500.0) * 1e-3)).into_dyn();
    let g = Array1::from_iter((0..size).map(|i| ((i % 777) as f32 - 388.0) * 1e-4)).into_dyn();
    (p, g)
}

/// The hand-written fresh-output loop for rule `kind` (the optimizer's own
/// `step` where no loop is written out).
fn fresh_loop_for(kind: UpdateKind, name: &str, size: usize) -> Result<FreshLoop> {
    Ok(match kind {
        UpdateKind::Sgd => FreshLoop::Sgd {
            neg_lr: -BENCH_LEARNING_RATE,
        },
        UpdateKind::Adam => FreshLoop::Adam {
            c: Adam::new(BENCH_LEARNING_RATE).constants(2),
            mu: vec![0.0; size],
            nu: vec![0.0; size],
        },
        _ => FreshLoop::Step(optimizer_named(name)?.1),
    })
}

/// Warm: like a peer's benchmark (and a loop that only steps), a side runs
/// `steps + 1` times in a row over its own buffers, the first pass untimed;
/// the median pass. A few passes do not refill a shared victim cache that
/// the other sides emptied; a run of them does.
fn warm(steps: usize, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut times = Vec::with_capacity(steps);
    for _ in 0..steps {
        let start = Instant::now();
        f()?;
        times.push(start.elapsed().as_secs_f64());
    }
    Ok(median(times))
}

/// Measures `steps` paired rounds of optimizer `name` on `size` `f32`
/// params: the compiled fresh-output step, the compiled in-place step, the
/// recycled fresh-output step, a plain copy and the hand-written
/// fresh-output loop. Each round runs all five, starting one further along
/// each round, so machine drift lands on every side; figures are medians
/// and ratios between sides are medians of per-round ratios. The streaming
/// floor ([`crate::memory::stream`]) over the update's working set is
/// measured before the rounds, after them and after the warm run, the best
/// taken; the update's
/// floor is `bytes_per_step` at its rate.
///
/// Refuses, before allocating anything, a `size` whose buffers
/// ([`bench_host_bytes`]) do not fit in [`host_memory_budget`].
pub fn bench_optimizer(name: &str, size: usize, steps: usize) -> Result<OptimizerBench> {
    if size == 0 || steps == 0 {
        return Err(OptimError::invalid_config(format!(
            "size ({size}) and steps ({steps}) must be positive"
        )));
    }
    let (kind, base) = optimizer_named(name)?;
    let slots = base.update_rule().map_or(0, |r| r.slot_names().len());
    check_host_memory(kind.as_str(), slots, size, host_memory_budget())?;
    let bytes_per_step = ((3 + 2 * slots as u128) * size as u128 * 4) as u64;
    let (p, g) = bench_inputs(size);
    let gs = g.as_slice().expect("standard layout");
    let mut fresh = TPUOptimizer::new(base, TPUConfig::default())?;
    drop(black_box(fresh.tpu_step(&p, &g)?));
    let compile_seconds = fresh.profile().compile_seconds;
    let mut recycled = TPUOptimizer::new(optimizer_named(name)?.1, TPUConfig::default())?;
    let out = recycled.tpu_step(&p, &g)?;
    recycled.recycle(out);
    let mut in_place = TPUOptimizer::new(optimizer_named(name)?.1, TPUConfig::default())?;
    let mut p_in_place = p.clone();
    in_place.tpu_step_in_place(&mut p_in_place, &g)?;
    let floor_before = measure_floor(slots, size);
    let mut copy_dst = vec![0.0f32; size];
    copy(&mut copy_dst, gs);
    let mut fresh_loop = fresh_loop_for(kind, name, size)?;
    drop(black_box(fresh_loop.step(&p, &g)?));
    const SIDES: usize = 5;
    let mut times: [Vec<f64>; SIDES] = Default::default();
    let (mut fresh_vs_loop, mut recycled_vs_in_place) = (Vec::new(), Vec::new());
    for round in 0..steps {
        let mut t = [0.0; SIDES];
        for k in 0..SIDES {
            let side = (round + k) % SIDES;
            let start = Instant::now();
            match side {
                0 => drop(black_box(fresh.tpu_step(&p, &g)?)),
                1 => in_place.tpu_step_in_place(&mut p_in_place, &g)?,
                2 => copy(black_box(&mut copy_dst), gs),
                3 => drop(black_box(fresh_loop.step(&p, &g)?)),
                _ => {
                    let out = recycled.tpu_step(&p, &g)?;
                    recycled.recycle(black_box(out));
                }
            }
            t[side] = start.elapsed().as_secs_f64();
        }
        for (all, &one) in times.iter_mut().zip(&t) {
            all.push(one);
        }
        fresh_vs_loop.push(t[0] / t[3]);
        recycled_vs_in_place.push(t[4] / t[1]);
    }
    let floor_between = measure_floor(slots, size).best_of(&floor_before);
    let warm_in_place_step_seconds = warm(steps, &mut || {
        in_place.tpu_step_in_place(&mut p_in_place, &g)
    })?;
    black_box((&p_in_place, &copy_dst));
    let floor = measure_floor(slots, size).best_of(&floor_between);
    let best = floor.best().expect("the floor measures every kernel");
    let floor_seconds = floor.seconds(bytes_per_step);
    let [
        step_seconds,
        in_place_step_seconds,
        copy_seconds,
        fresh_loop_seconds,
        recycled_step_seconds,
    ] = times.map(median);
    let gbps = |bytes: u64, s: f64| bytes as f64 / s / 1e9;
    Ok(OptimizerBench {
        optimizer: kind.as_str().to_owned(),
        size,
        step_seconds,
        in_place_step_seconds,
        recycled_step_seconds,
        recycled_ratio_to_in_place: median(recycled_vs_in_place),
        floor_seconds,
        ratio_to_floor: in_place_step_seconds / floor_seconds,
        warm_in_place_step_seconds,
        warm_floor_seconds: floor_seconds,
        warm_ratio_to_floor: warm_in_place_step_seconds / floor_seconds,
        fresh_ratio_to_floor: step_seconds / floor_seconds,
        copy_seconds,
        fresh_loop_seconds,
        ratio_to_fresh_loop: median(fresh_vs_loop),
        compile_seconds,
        bytes_per_step,
        gbps: gbps(bytes_per_step, step_seconds),
        in_place_gbps: gbps(bytes_per_step, in_place_step_seconds),
        floor_gbps: floor.gbps(),
        floor_kernel: best.kernel.name().to_owned(),
        floor_threads: best.threads,
        copy_gbps: gbps(8 * size as u64, copy_seconds),
        fresh_loop_gbps: gbps(bytes_per_step, fresh_loop_seconds),
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
        assert_eq!(bench_host_bytes(2, usize::MAX), 18 * 4 * usize::MAX as u128);
    }
}
