//! The cost of modeling does not grow with the model: the closed-form
//! strategy step, a transformer's whole step and `goodput`'s default step
//! at 10⁶ and 10¹⁸ parameters (and at 2²⁴ layers) each allocate a bounded
//! amount, under 50 MB at their peak, and in a release build take under
//! 10 ms. Counted per thread, so other tests' threads do not count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Instant;

use optirs_tpu::cost_model::{StepOrder, StrategyOptions, modeled_strategy_step};
use optirs_tpu::goodput::modeled_step_seconds;
use optirs_tpu::ir::DType;
use optirs_tpu::model::bundled;
use optirs_tpu::sharding::{RecoveryPolicy, Strategy};
use optirs_tpu::step_model::{ModelStepOptions, model_step};
use optirs_tpu::topology::load_preset;

struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn grew(bytes: usize) {
    LIVE.with(|l| {
        let now = l.get() + bytes;
        l.set(now);
        PEAK.with(|p| p.set(p.get().max(now)));
    });
}

fn shrank(bytes: usize) {
    LIVE.with(|l| l.set(l.get().saturating_sub(bytes)));
}

// SAFETY: forwards to the system allocator; the counters are plain
// thread-local `Cell`s that allocate nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: as the caller guarantees for `GlobalAlloc::alloc`.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        shrank(layout.size());
        // SAFETY: `ptr` came from `System.alloc` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        grew(size);
        shrank(layout.size());
        // SAFETY: as the caller guarantees for `GlobalAlloc::realloc`.
        unsafe { System.realloc(ptr, layout, size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The peak bytes live on this thread while `f` runs (above what was live
/// before) and its wall time.
fn cost<T>(f: impl FnOnce() -> T) -> (usize, f64) {
    let before = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(before));
    let started = Instant::now();
    let out = f();
    let wall = started.elapsed().as_secs_f64();
    drop(out);
    (PEAK.with(Cell::get) - before, wall)
}

const BUDGET_BYTES: usize = 50_000_000;
const BUDGET_SECONDS: f64 = 0.010;

fn within_budget(what: &str, (bytes, wall): (usize, f64)) {
    eprintln!("{what}: peak {bytes} B, {:.3} ms", wall * 1e3);
    assert!(bytes < BUDGET_BYTES, "{what}: {bytes} B at the peak");
    if !cfg!(debug_assertions) {
        assert!(wall < BUDGET_SECONDS, "{what}: {wall} s");
    }
}

#[test]
fn the_strategy_step_costs_the_same_at_any_size() {
    let topology = load_preset("v5e-16").unwrap();
    for (strategy, order) in [
        (Strategy::Replicated, StepOrder::Optimizer),
        (Strategy::Zero2, StepOrder::Training),
        (Strategy::Fsdp, StepOrder::Training),
    ] {
        let options = StrategyOptions {
            order,
            use_seconds: 1e-3,
            ..StrategyOptions::new(strategy, &topology)
        };
        let mut peaks = Vec::new();
        for params in [1_000_000usize, 1_000_000_000_000_000_000] {
            let tensors = [("params".to_string(), vec![params])];
            let run = || {
                modeled_strategy_step(&topology, &tensors, DType::F32, 2, 25 << 20, &options)
                    .unwrap()
            };
            let c = cost(run);
            within_budget(&format!("{strategy} {order:?} {params:e}"), c);
            peaks.push(c.0);
        }
        // The same handful of iterations either way.
        assert!(peaks[1] <= 2 * peaks[0] + 64 * 1024, "{peaks:?}");
    }
}

#[test]
fn a_model_s_step_costs_the_same_at_any_depth() {
    let topology = load_preset("v5p-256").unwrap();
    let mut config = bundled("llama2-7b").unwrap();
    let options = ModelStepOptions::new(&topology);
    let mut peaks = Vec::new();
    for layers in [32u64, 1 << 24] {
        config.layers = layers;
        let c = cost(|| model_step(&config, &topology, &options).unwrap());
        within_budget(&format!("llama2-7b at {layers} layers"), c);
        peaks.push(c.0);
    }
    assert!(peaks[1] <= 2 * peaks[0] + 64 * 1024, "{peaks:?}");
}

#[test]
fn goodput_s_default_step_costs_the_same_at_any_size() {
    let topology = load_preset("v4-8192").unwrap();
    let mut peaks = Vec::new();
    for params in [1_000_000u64, 100_000_000_000_000, 1_000_000_000_000_000_000] {
        let c =
            cost(|| modeled_step_seconds(&topology, params, 2, RecoveryPolicy::Rollback).unwrap());
        within_budget(&format!("goodput's step at {params:e}"), c);
        peaks.push(c.0);
    }
    assert!(peaks[2] <= 2 * peaks[0] + 64 * 1024, "{peaks:?}");
}
