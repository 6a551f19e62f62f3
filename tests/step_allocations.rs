//! A cached in-place step does not allocate per element or per argument:
//! at 1e3 parameters an allocation costs as much as a tenth of the step.
//! Counted per thread, so other tests' threads do not count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use ndarray::Array1;
use optirs_tpu::optimizers::{Adam, RMSProp, SGD};
use optirs_tpu::{TPUConfig, TPUOptimizer};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the counter is a plain
// thread-local `Cell` that allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: as the caller guarantees for `GlobalAlloc::alloc`.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: as the caller guarantees for `GlobalAlloc::realloc`.
        unsafe { System.realloc(ptr, layout, size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// Allocations per cached in-place step of `opt` at 1e3 parameters,
/// after warm-up steps have compiled the program, built the state and
/// filled the memory profile's bounded timeline (two events a step).
fn per_step<O>(mut opt: TPUOptimizer<O, f32>) -> f64
where
    O: optirs_tpu::Optimizer<f32, ndarray::IxDyn>,
{
    let grads = Array1::from_iter((0..1000).map(|i| ((i % 7) as f32 - 3.0) * 0.1));
    let mut params = Array1::from_iter((0..1000).map(|i| (i % 100) as f32 * 0.01));
    for _ in 0..optirs_tpu::tpu::MEMORY_TIMELINE_CAPACITY {
        opt.tpu_step_in_place(&mut params, &grads).unwrap();
    }
    let steps = 200;
    let before = allocations();
    for _ in 0..steps {
        opt.tpu_step_in_place(&mut params, &grads).unwrap();
    }
    (allocations() - before) as f64 / steps as f64
}

#[test]
fn a_cached_in_place_step_allocates_only_its_result_list() {
    let cases = [
        (
            "adam",
            per_step(TPUOptimizer::new(Adam::new(1e-3), TPUConfig::default()).unwrap()),
        ),
        (
            "sgd",
            per_step(TPUOptimizer::new(SGD::new(1e-2), TPUConfig::default()).unwrap()),
        ),
        (
            "rmsprop",
            per_step(TPUOptimizer::new(RMSProp::new(1e-3), TPUConfig::default()).unwrap()),
        ),
    ];
    for (name, allocations) in cases {
        // The one allocation is the `Vec` of run outputs.
        assert!(
            allocations <= 1.0,
            "{name}: {allocations} allocations per cached step"
        );
    }
}
