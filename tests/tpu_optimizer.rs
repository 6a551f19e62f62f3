//! `TPUOptimizer`: golden vectors through the compiled step, equivalence
//! with the base optimizers, the program cache, errors, IEEE specials,
//! opaque optimizers, HBM reservations, profile and checkpoints.

use ndarray::{Array, Array1, Array2, ArrayD, IxDyn};
use optirs_tpu::optimizers::OptimizerError;
use optirs_tpu::optimizers::{Adagrad, Adam, AdamW, Momentum, Nesterov, RMSProp, SGD};
use optirs_tpu::tpu::{MemoryEventKind, bench_optimizer};
use optirs_tpu::{Optimizer, TPUConfig, TPUOptimizer, TPUVersion};
use serde_json::Value;

mod common;
use common::golden::{golden_optimizer, hp};
#[path = "common/heap.rs"]
mod heap;
use heap::heap_used;

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/optimizers.json");

type Boxed = Box<dyn Optimizer<f32, IxDyn>>;

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

fn build(case: &Value) -> Boxed {
    golden_optimizer!(case, hp(case, "learning_rate") as f32)
}

fn every_optimizer() -> Vec<Boxed> {
    vec![
        Box::new(SGD::new(0.05f32)),
        Box::new(Momentum::new(0.05f32, 0.9)),
        Box::new(Nesterov::new(0.05f32, 0.9)),
        Box::new(Adam::new(0.01f32)),
        Box::new(AdamW::new(0.01f32, 0.01)),
        Box::new(RMSProp::new(0.01f32)),
        Box::new(Adagrad::new(0.1f32)),
    ]
}

fn tpu(base: Boxed) -> TPUOptimizer<Boxed, f32> {
    TPUOptimizer::new(base, TPUConfig::default()).unwrap()
}

fn bits(a: &[f32]) -> Vec<u32> {
    a.iter().map(|x| x.to_bits()).collect()
}

/// Values with a deterministic spread of signs and magnitudes.
fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 20_000) as f32 / 10_000.0 - 1.0
        })
        .collect()
}

#[test]
fn golden_vectors_through_tpu_step_are_bit_exact() {
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(GOLDEN).unwrap()).unwrap();
    for case in golden["cases"].as_array().unwrap() {
        let id = case["id"].as_str().unwrap();
        let mut opt = tpu(build(case));
        let mut params = Array1::from(f32s(&case["params0"]));
        for (step, grads) in case["grads"].as_array().unwrap().iter().enumerate() {
            let grads = Array1::from(f32s(grads));
            params = opt.tpu_step(&params, &grads).unwrap();
            let expected = f32s(&case["params"][step]);
            assert_eq!(
                bits(params.as_slice().unwrap()),
                bits(&expected),
                "{id} step {step}: params differ from optax"
            );
            let jit = f32s(&case["params_jit"][step]);
            for (a, b) in params.iter().zip(&jit) {
                assert!((a - b).abs() <= 1e-6, "{id} step {step}: {a} vs jit {b}");
            }
        }
        for (key, value) in case["final_state"].as_object().unwrap() {
            let name = key.rsplit('.').next().unwrap();
            if name == "count" {
                assert_eq!(
                    i64::from(opt.step_count()),
                    value.as_i64().unwrap(),
                    "{id}: count"
                );
                continue;
            }
            let slot = opt
                .slot(name)
                .unwrap_or_else(|| panic!("{id}: slot {name}"));
            assert_eq!(
                bits(
                    &slot
                        .to_f64_vec()
                        .iter()
                        .map(|&v| v as f32)
                        .collect::<Vec<_>>()
                ),
                bits(&f32s(value)),
                "{id}: state {name}"
            );
        }
        assert_eq!(opt.profile().cache.misses, 1, "{id}: compiled once");
    }
}

#[test]
fn tpu_step_is_bit_identical_to_the_base_step_on_many_chunks() {
    // 37 x 1500 elements: many runtime chunks with an uneven tail.
    let shape = (37, 1500);
    for (mut base, wrapped) in every_optimizer().into_iter().zip(every_optimizer()) {
        let name = base.name().to_owned();
        let mut opt = tpu(wrapped);
        let mut p_base = Array2::from_shape_vec(shape, data(37 * 1500, 1))
            .unwrap()
            .into_dyn();
        let mut p_tpu = Array2::from_shape_vec(shape, data(37 * 1500, 1)).unwrap();
        let mut p_in_place = p_tpu.clone();
        let mut in_place = tpu(every_optimizer()
            .into_iter()
            .find(|o| o.name() == name)
            .unwrap());
        for step in 0..4 {
            let g = Array2::from_shape_vec(shape, data(37 * 1500, step + 7)).unwrap();
            p_base = base.step(&p_base, &g.clone().into_dyn()).unwrap();
            p_tpu = opt.tpu_step(&p_tpu, &g).unwrap();
            in_place.tpu_step_in_place(&mut p_in_place, &g).unwrap();
            assert_eq!(
                bits(p_base.as_slice().unwrap()),
                bits(p_tpu.as_slice().unwrap()),
                "{name} step {step}"
            );
            assert_eq!(p_tpu, p_in_place, "{name} step {step}: in place");
        }
        let state = base.update_rule().unwrap().state().unwrap().clone();
        assert_eq!(opt.step_count(), state.count, "{name}");
        for slot in &state.slots {
            let ours = opt.slot(slot.name).unwrap();
            let theirs: Vec<f64> = slot.value.iter().map(|&v| f64::from(v)).collect();
            assert_eq!(ours.to_f64_vec(), theirs, "{name}: slot {}", slot.name);
        }
        if name == "adam" {
            assert_eq!(opt.profile().last_kernels, 1, "adam fuses into one kernel");
        }
    }
}

#[test]
fn f64_params_compile_too() {
    let mut base = Adam::new(0.01f64);
    let mut opt = TPUOptimizer::new(Adam::new(0.01f64), TPUConfig::default()).unwrap();
    let mut p = Array1::from_iter((0..5000).map(|i| f64::from(i) * 1e-3));
    let mut q = p.clone();
    for step in 0..3 {
        let g = Array1::from_iter((0..5000).map(|i| f64::from((i * 7 + step) % 13) - 6.0));
        p = base.step(&p, &g).unwrap();
        q = opt.tpu_step(&q, &g).unwrap();
        assert_eq!(p, q, "step {step}");
    }
}

#[test]
fn the_second_step_is_a_cache_hit_and_a_new_shape_compiles() {
    let mut opt = TPUOptimizer::new(Adam::new(0.01f32), TPUConfig::default()).unwrap();
    let p = Array1::from(data(100, 1));
    let g = Array1::from(data(100, 2));
    let p1 = opt.tpu_step(&p, &g).unwrap();
    let cache = opt.profile().cache;
    assert_eq!((cache.hits, cache.misses, cache.entries), (0, 1, 1));
    opt.tpu_step(&p1, &g).unwrap();
    let cache = opt.profile().cache;
    assert_eq!(
        (cache.hits, cache.misses),
        (1, 1),
        "same program for step 2"
    );
    let mut other = TPUOptimizer::new(SGD::new(0.01f32), TPUConfig::default()).unwrap();
    for n in [100, 101] {
        let p = Array1::from(data(n, 1));
        other.tpu_step(&p, &p).unwrap();
    }
    let cache = other.profile().cache;
    assert_eq!((cache.hits, cache.misses, cache.entries), (0, 2, 2));
    assert_eq!(other.profile().compiles, 2);
}

/// A learning-rate schedule reuses the compiled program (the learning rate
/// is a run-time argument, as in a jitted optax update) and still matches
/// the base optimizer bit for bit at every step.
#[test]
fn a_learning_rate_schedule_compiles_once_and_matches_the_base() {
    for base in every_optimizer() {
        let name = base.name().to_owned();
        let mut reference = every_optimizer()
            .into_iter()
            .find(|o| o.name() == name)
            .unwrap();
        let mut opt = TPUOptimizer::new(base, TPUConfig::default()).unwrap();
        let mut p = Array1::from(data(1000, 1)).into_dyn();
        let mut q = p.clone();
        for (step, lr) in [0.05f32, 0.04, 0.025, 0.01, 0.003].into_iter().enumerate() {
            Optimizer::<f32, IxDyn>::set_learning_rate(&mut opt, lr);
            reference.set_learning_rate(lr);
            let g = Array1::from(data(1000, step as u32 + 3)).into_dyn();
            p = reference.step(&p, &g).unwrap();
            q = opt.tpu_step(&q, &g).unwrap();
            assert_eq!(
                bits(p.as_slice().unwrap()),
                bits(q.as_slice().unwrap()),
                "{name} step {step} at lr {lr}"
            );
        }
        let cache = opt.profile().cache;
        assert_eq!(
            (cache.hits, cache.misses),
            (4, 1),
            "{name}: one program for the whole schedule"
        );
    }
}

#[test]
fn the_cache_is_bounded_and_evicts_the_least_recently_used() {
    let config = TPUConfig {
        cache_capacity: 2,
        ..Default::default()
    };
    let mut opt = TPUOptimizer::new(SGD::new(0.1f32), config).unwrap();
    for n in [3usize, 4, 3, 5, 3, 4] {
        let p = Array1::from(data(n, 1));
        opt.tpu_step(&p, &p).unwrap();
    }
    let cache = opt.profile().cache;
    // 3 miss, 4 miss, 3 hit, 5 miss (evicts 4), 3 hit, 4 miss (evicts 5).
    assert_eq!((cache.hits, cache.misses, cache.evictions), (2, 4, 2));
    assert_eq!(cache.entries, 2);
}

#[test]
fn shape_mismatches_are_errors() {
    let mut opt = TPUOptimizer::new(Adam::new(0.01f32), TPUConfig::default()).unwrap();
    let p = Array1::from(data(4, 1));
    let g = Array1::from(data(5, 2));
    let err = opt.tpu_step(&p, &g).unwrap_err();
    assert!(
        matches!(
            err.downcast_ref::<OptimizerError>(),
            Some(OptimizerError::ShapeMismatch { .. })
        ),
        "{err}"
    );
    assert_eq!(opt.profile().executions, 0);
    opt.tpu_step(&p, &p).unwrap();
    let other = Array1::from(data(6, 1));
    let err = opt.tpu_step(&other, &other).unwrap_err();
    assert!(
        matches!(
            err.downcast_ref::<OptimizerError>(),
            Some(OptimizerError::StateShapeMismatch { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("reset()"), "{err}");
    Optimizer::<f32, ndarray::Ix1>::reset(&mut opt);
    opt.tpu_step(&other, &other).unwrap();
    assert_eq!(opt.step_count(), 1);
}

#[test]
fn nan_and_inf_in_grads_propagate_like_the_base_step() {
    let g = Array1::from(vec![
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1.0,
    ]);
    let p = Array1::from(vec![1.0f32, 2.0, 3.0, -0.0, 0.0, f32::INFINITY]);
    for (mut base, wrapped) in every_optimizer().into_iter().zip(every_optimizer()) {
        let name = base.name().to_owned();
        let mut opt = tpu(wrapped);
        let expected = base
            .step(&p.clone().into_dyn(), &g.clone().into_dyn())
            .unwrap();
        let got = opt.tpu_step(&p, &g).unwrap();
        assert_eq!(
            bits(expected.as_slice().unwrap()),
            bits(got.as_slice().unwrap()),
            "{name}"
        );
        assert!(got[0].is_nan(), "{name}: NaN grad gives NaN param");
    }
}

/// An optimizer with no update rule: `p - lr * sign(g)`.
struct SignSgd {
    lr: f32,
    steps: usize,
}

impl<D: ndarray::Dimension> Optimizer<f32, D> for SignSgd {
    fn step(
        &mut self,
        params: &Array<f32, D>,
        grads: &Array<f32, D>,
    ) -> optirs_tpu::optimizers::Result<Array<f32, D>> {
        self.steps += 1;
        Ok(params - &grads.mapv(|g| self.lr * g.signum()))
    }
    fn learning_rate(&self) -> f32 {
        self.lr
    }
    fn set_learning_rate(&mut self, lr: f32) {
        self.lr = lr;
    }
    fn name(&self) -> &str {
        "sign-sgd"
    }
    fn reset(&mut self) {}
}

#[test]
fn an_optimizer_without_a_rule_runs_as_a_custom_call() {
    let mut opt = TPUOptimizer::new(SignSgd { lr: 0.5, steps: 0 }, TPUConfig::default()).unwrap();
    let p = Array2::from_shape_vec((2, 3), vec![1.0f32, 2., 3., 4., 5., 6.]).unwrap();
    let g = Array2::from_shape_vec((2, 3), vec![-1.0f32, 0.5, 0., 2., -3., 1.]).unwrap();
    let out = opt.tpu_step(&p, &g).unwrap();
    // Rust's signum(+0.0) is 1.
    assert_eq!(out.as_slice().unwrap(), &[1.5, 1.5, 2.5, 3.5, 5.5, 5.5]);
    let out = opt.tpu_step(&out, &g).unwrap();
    assert_eq!(out[[0, 0]], 2.0);
    assert_eq!(opt.base().steps, 2);
    let profile = opt.profile();
    assert_eq!((profile.cache.misses, profile.cache.hits), (1, 1));
    assert!(
        profile.last_program.contains("opaque"),
        "{}",
        profile.last_program
    );
}

#[test]
fn config_is_validated_with_descriptive_errors() {
    let bad = |c: TPUConfig| {
        TPUOptimizer::new(SGD::new(0.1f32), c)
            .unwrap_err()
            .to_string()
    };
    let e = bad(TPUConfig {
        num_cores: 0,
        ..Default::default()
    });
    assert!(e.contains("num_cores is 0"), "{e}");
    let e = bad(TPUConfig {
        tpu_version: TPUVersion::V4,
        num_cores: 3,
        ..Default::default()
    });
    assert!(
        e.contains("not a multiple of 2") && e.contains("use 2 or 4"),
        "{e}"
    );
    let e = bad(TPUConfig {
        tpu_version: TPUVersion::V5e,
        num_cores: 512,
        ..Default::default()
    });
    assert!(e.contains("largest v5e pod has 256 chips"), "{e}");
    let e = bad(TPUConfig {
        cache_capacity: 0,
        ..Default::default()
    });
    assert!(e.contains("cache_capacity"), "{e}");
    assert!(
        TPUOptimizer::new(
            SGD::new(0.1f32),
            TPUConfig {
                tpu_version: TPUVersion::V5e,
                num_cores: 1,
                ..Default::default()
            }
        )
        .is_ok()
    );
}

#[test]
fn executions_reserve_and_release_hbm_and_profile_the_peak() {
    let mut opt = TPUOptimizer::new(Adam::new(0.01f32), TPUConfig::default()).unwrap();
    assert!(opt.memory_export().is_empty(), "nothing ran yet");
    assert!(opt.profile().memory.peak.is_none());
    let p = Array1::from(data(10_000, 1));
    opt.tpu_step(&p, &p).unwrap();
    let profile = opt.profile();
    // mu and nu when the state is created, then the step's buffers.
    assert_eq!(profile.memory.reservations, 3);
    assert_eq!(profile.memory.releases, 1);
    let events = opt.memory_export();
    let kinds: Vec<MemoryEventKind> = events.iter().map(|e| e.kind).collect();
    use MemoryEventKind::{Release, Reserve};
    assert_eq!(kinds, [Reserve, Reserve, Reserve, Release]);
    // Adam at 1e4 f32: mu and nu of 40 kB each stay resident.
    assert_eq!((events[0].bytes, events[1].bytes), (40_000, 40_000));
    assert_eq!(
        events[3].used_after, 80_000,
        "the step released, the state stays"
    );
    let peak = profile.memory.peak.clone().unwrap();
    // The step's params and grads (and results) beside the resident state.
    assert!(peak.reserved_bytes >= 2 * 40_000, "{peak:?}");
    assert_eq!(
        peak.used_bytes,
        peak.reserved_bytes + 80_000,
        "taken while held"
    );
    assert_eq!(peak.device, "device 0 (v4)");
    opt.reset_state();
    assert_eq!(opt.hbm_usage(0), 0, "reset releases the state");
    assert!(profile.bytes_moved >= 7 * 40_000);
    assert!(profile.execute_seconds > 0.0 && profile.compile_seconds > 0.0);
    let json: Value = serde_json::from_str(&profile.to_json()).unwrap();
    for key in [
        "compiles",
        "execute_seconds",
        "bytes_moved",
        "cache",
        "memory",
    ] {
        assert!(json.get(key).is_some(), "{key}");
    }
}

#[test]
fn out_of_hbm_names_the_device_and_the_bytes() {
    let config = TPUConfig {
        hbm_bytes: Some(64 * 1024),
        ..Default::default()
    };
    let mut opt = TPUOptimizer::new(Adam::new(0.01f32), config).unwrap();
    let p = Array1::from(data(100_000, 1));
    let err = opt.tpu_step(&p, &p).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(
            err.downcast_ref::<optirs_tpu::memory::MemoryError>(),
            Some(optirs_tpu::memory::MemoryError::OutOfDeviceMemory(_))
        ),
        "{msg}"
    );
    assert!(
        msg.starts_with("device 0 (v4): out of HBM: the optimizer state `mu` needs 400000 bytes"),
        "{msg}"
    );
    assert!(msg.contains("65536 bytes are free"), "{msg}");
    assert!(msg.contains("largest free block is 65536 bytes"), "{msg}");
    assert_eq!(opt.step_count(), 0, "a refused step changes nothing");
    assert_eq!(
        opt.hbm_usage(0),
        0,
        "a state that does not fit is not created"
    );
    assert!(opt.slot("mu").is_none());
    // A program that fits still runs.
    let small = Array1::from(data(100, 1));
    opt.tpu_step(&small, &small).unwrap();
    assert_eq!(
        opt.hbm_usage(0),
        2 * 448,
        "mu and nu, 400 B each, 64-aligned"
    );
}

#[test]
fn a_step_that_does_not_fit_beside_the_state_names_the_program() {
    // mu and nu of 1e4 f32 take 80 kB; params and grads do not fit beside them.
    let config = TPUConfig {
        hbm_bytes: Some(120 * 1024),
        ..Default::default()
    };
    let mut opt = TPUOptimizer::new(Adam::new(0.01f32), config).unwrap();
    let p = Array1::from(data(10_000, 1));
    let msg = opt.tpu_step(&p, &p).unwrap_err().to_string();
    assert!(msg.contains("out of HBM: the program `"), "{msg}");
    assert!(msg.contains("42880 bytes are free"), "{msg}");
    assert!(msg.contains("largest free block is 42880 bytes"), "{msg}");
    assert_eq!(opt.step_count(), 0);
    assert_eq!(opt.hbm_usage(0), 80_000, "the state stays resident");
}

#[test]
fn hbm_usage_is_the_resident_state_after_steps_resets_and_restores() {
    let mut opt = TPUOptimizer::new(Adam::new(0.01f32), TPUConfig::default()).unwrap();
    assert_eq!((opt.hbm_usage(0), heap_used(&opt)), (0, 0));
    let g = Array1::from(data(1000, 3));
    let mut p = Array1::from(data(1000, 1));
    // mu and nu of 4000 B each, 64-aligned.
    let state = 2 * 4032;
    for _ in 0..3 {
        p = opt.tpu_step(&p, &g).unwrap();
        assert_eq!(opt.hbm_usage(0), heap_used(&opt));
        assert_eq!(opt.hbm_usage(0), state);
    }
    let snapshot = opt.snapshot().unwrap();
    opt.reset_state();
    assert_eq!((opt.hbm_usage(0), heap_used(&opt)), (0, 0));
    opt.restore(&snapshot).unwrap();
    assert_eq!((opt.hbm_usage(0), heap_used(&opt)), (state, state));
    opt.tpu_step(&p, &g).unwrap();
    assert_eq!((opt.hbm_usage(0), heap_used(&opt)), (state, state));
    // Into an optimizer that never ran.
    let mut other = TPUOptimizer::new(Adam::new(0.01f32), TPUConfig::default()).unwrap();
    other.restore(&snapshot).unwrap();
    assert_eq!((other.hbm_usage(0), heap_used(&other)), (state, state));
    other.reset_state();
    assert_eq!((other.hbm_usage(0), heap_used(&other)), (0, 0));
}

#[test]
fn a_snapshot_carries_the_optimizer_state() {
    let mut opt = TPUOptimizer::new(Adam::new(0.01f32), TPUConfig::default()).unwrap();
    let g = Array1::from(data(1000, 3));
    let mut p = Array1::from(data(1000, 1));
    for _ in 0..3 {
        p = opt.tpu_step(&p, &g).unwrap();
    }
    let snapshot = opt.snapshot().unwrap();
    let fourth = opt.tpu_step(&p, &g).unwrap();
    opt.tpu_step(&fourth, &g).unwrap();
    assert_eq!(opt.step_count(), 5);
    opt.restore(&snapshot).unwrap();
    assert_eq!(opt.step_count(), 3);
    assert_eq!(opt.tpu_step(&p, &g).unwrap(), fourth, "same fourth step");
    // Through bytes (the moments travel beside them), into another optimizer.
    let bytes = snapshot.to_bytes();
    let decoded =
        optirs_tpu::checkpoint::WorldSnapshot::from_parts(&bytes, snapshot.tensors.clone())
            .unwrap();
    let mut other = TPUOptimizer::new(Adam::new(0.01f32), TPUConfig::default()).unwrap();
    other.restore(&decoded).unwrap();
    assert_eq!(other.tpu_step(&p, &g).unwrap(), fourth);
}

#[test]
fn bench_reports_the_documented_keys() {
    let b = bench_optimizer("adam", 5000, 3).unwrap();
    let json = serde_json::to_value(&b).unwrap();
    for key in [
        "optimizer",
        "size",
        "step_seconds",
        "in_place_step_seconds",
        "floor_seconds",
        "ratio_to_floor",
        "fresh_ratio_to_floor",
        "warm_in_place_step_seconds",
        "warm_floor_seconds",
        "warm_ratio_to_floor",
        "copy_seconds",
        "fresh_loop_seconds",
        "ratio_to_fresh_loop",
        "compile_seconds",
    ] {
        assert!(json.get(key).is_some(), "{key}");
    }
    assert!(b.warm_in_place_step_seconds > 0.0 && b.warm_floor_seconds > 0.0);
    assert!(b.warm_ratio_to_floor > 0.0);
    assert_eq!(b.bytes_per_step, 28 * 5000);
    assert!(b.step_seconds > 0.0 && b.in_place_step_seconds > 0.0 && b.compile_seconds > 0.0);
    assert!(b.floor_seconds > 0.0 && b.copy_seconds > 0.0 && b.fresh_loop_seconds > 0.0);
    assert!(b.ratio_to_floor > 0.0 && b.fresh_ratio_to_floor > 0.0);
    assert!(b.to_string().contains("ratio to floor"));
    let e = bench_optimizer("lamb", 10, 1).unwrap_err().to_string();
    assert!(e.contains("unknown optimizer `lamb`"), "{e}");
    let _: ArrayD<f32> = ArrayD::zeros(IxDyn(&[1]));
}

#[test]
fn state_slots_are_updated_in_place() {
    let mut opt = TPUOptimizer::new(Adam::new(0.01f32), TPUConfig::default()).unwrap();
    let mut p = Array1::from(data(200_000, 1));
    let g = Array1::from(data(200_000, 2));
    let addresses = |opt: &mut TPUOptimizer<Adam<f32>, f32>| -> Vec<usize> {
        let world = opt.world();
        let mut v: Vec<(u32, usize)> = world
            .try_query::<&optirs_tpu::tpu::state::OptimizerSlot>()
            .unwrap()
            .iter(world)
            .map(|s| match &s.tensor {
                optirs_tpu::exec::kernels::Tensor::F32(a) => (s.index, a.as_ptr() as usize),
                _ => unreachable!(),
            })
            .collect();
        v.sort();
        v.into_iter().map(|(_, a)| a).collect()
    };
    opt.tpu_step_in_place(&mut p, &g).unwrap();
    let before = addresses(&mut opt);
    let p_address = p.as_ptr() as usize;
    opt.tpu_step_in_place(&mut p, &g).unwrap();
    assert_eq!(addresses(&mut opt), before, "mu and nu stay where they are");
    assert_eq!(p.as_ptr() as usize, p_address, "params are donated");
}

#[test]
fn a_recycled_output_is_written_into_and_gives_the_same_numbers() {
    use ndarray::Array1;
    use optirs_tpu::optimizers::Adam;
    use optirs_tpu::{TPUConfig, TPUOptimizer};
    let n = 1 << 18;
    let g = Array1::from_shape_fn(n, |i| ((i % 17) as f32 - 8.0) * 1e-3);
    let mut plain = TPUOptimizer::new(Adam::new(1e-2f32), TPUConfig::default()).unwrap();
    let mut recycling = TPUOptimizer::new(Adam::new(1e-2f32), TPUConfig::default()).unwrap();
    // A buffer of garbage handed back first: its old contents never show.
    recycling.recycle(Array1::from_elem(n, f32::NAN));
    let mut p_plain = Array1::from_elem(n, 0.5f32);
    let mut p = Array1::from_elem(n, 0.5f32);
    let mut handed_back = None;
    for step in 0..4 {
        p_plain = plain.tpu_step(&p_plain, &g).unwrap();
        let next = recycling.tpu_step(&p, &g).unwrap();
        if let Some(address) = handed_back {
            assert_eq!(
                next.as_ptr(),
                address,
                "step {step} writes into the recycled buffer"
            );
        }
        assert_eq!(next, p_plain, "step {step}");
        let old = std::mem::replace(&mut p, next);
        handed_back = Some(old.as_ptr());
        recycling.recycle(old);
    }
}
