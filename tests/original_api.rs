//! The original crate README's examples, compiled and run unchanged: the
//! optimizer facade, generic code over `Optimizer` that returns the
//! crate's one error type, the pod coordinator, and the profiler's memory
//! export, which holds the device-memory reservations and releases a run
//! really makes (and nothing before one).

use ndarray::{Array1, Ix1};
use optirs_tpu::coordination::{CoordinationError, PodConfig, PodCoordinator};
use optirs_tpu::error::ErrorKind;
use optirs_tpu::memory::journal::HbmEventKind;
use optirs_tpu::optimizers::{Adam, OptimizerError, SGD};
use optirs_tpu::xla::backend::profiling_integration::ProfilingIntegration;
use optirs_tpu::{Optimizer, Pod, TPUConfig, TPUOptimizer, TPUVersion};

/// The original README's generic function, as written there.
fn run_step<O: Optimizer<f32, Ix1>>(
    o: &mut O,
    p: &Array1<f32>,
    g: &Array1<f32>,
) -> Result<Array1<f32>, optirs_tpu::error::OptimError> {
    o.step(p, g)
}

#[test]
fn generic_code_returns_the_crates_error_unchanged_for_sgd_and_adam() {
    let p = Array1::from(vec![1.0f32, -2.0, 0.5]);
    let g = Array1::from(vec![0.5f32, -0.5, 0.25]);
    let mut sgd = SGD::new(0.1f32);
    let stepped = run_step(&mut sgd, &p, &g).unwrap();
    assert_eq!(stepped, &p - &(&g * 0.1f32));
    let mut adam = Adam::new(1e-3f32);
    let stepped = run_step(&mut adam, &p, &g).unwrap();
    // The first bias-corrected Adam step moves each element by about lr.
    for (new, old) in stepped.iter().zip(&p) {
        assert!(((old - new).abs() - 1e-3).abs() < 1e-6, "{old} -> {new}");
    }
    // A refused step is the crate's error, its domain error kept whole.
    let short = Array1::from(vec![0.0f32; 2]);
    for err in [
        run_step(&mut sgd, &p, &short).unwrap_err(),
        run_step(&mut adam, &p, &short).unwrap_err(),
    ] {
        assert_eq!(err.kind(), ErrorKind::Optimizer);
        assert!(
            matches!(
                err.downcast_ref::<OptimizerError>(),
                Some(OptimizerError::ShapeMismatch { params, grads })
                    if params == &[3] && grads == &[2]
            ),
            "{err}"
        );
    }
}

#[test]
fn a_tpu_optimizer_is_an_optimizer_and_passes_its_own_errors_on() {
    let config = TPUConfig {
        tpu_version: TPUVersion::V4,
        num_cores: 8,
        ..Default::default()
    };
    let mut tpu_opt = TPUOptimizer::new(SGD::new(0.01f32), config).unwrap();
    let params = Array1::from(vec![1.0f32; 16]);
    let gradients = Array1::from(vec![0.5f32; 16]);
    let updated = tpu_opt.tpu_step(&params, &gradients).unwrap(); // compile once, reuse, execute, profile
    let again = run_step(&mut tpu_opt, &params, &gradients).unwrap();
    assert_eq!(updated, again);
    assert_eq!(updated, Array1::from(vec![1.0f32 - 0.01 * 0.5; 16]));
    let err = run_step(&mut tpu_opt, &params, &Array1::zeros(4)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Optimizer, "{err}");
}

#[test]
fn the_pod_coordinator_synchronizes_devices() -> Result<(), CoordinationError> {
    let mut pod = PodCoordinator::new(PodConfig {
        num_devices: 8,
        ..Default::default()
    })?;
    pod.synchronize_devices("step-0".to_string())?;
    assert_eq!(pod.participants().len(), 8);
    Ok(())
}

/// A profiled v4-16 with Adam on its device 0.
fn profiled_adam() -> (ProfilingIntegration, TPUOptimizer<Adam<f32>, f32>) {
    let profiler = ProfilingIntegration::new();
    let pod = profiler.build_pod(|| Pod::from_preset("v4-16")).unwrap();
    let config = TPUConfig {
        tpu_version: TPUVersion::V4,
        num_cores: 2,
        hbm_bytes: Some(1 << 20),
        ..Default::default()
    };
    let opt = TPUOptimizer::on_pod(Adam::new(0.01f32), config, pod).unwrap();
    (profiler, opt)
}

#[test]
fn the_memory_export_is_empty_before_any_run_even_after_a_compile() {
    let (mut profiler, mut opt) = profiled_adam();
    let pod = opt.pod_mut().unwrap();
    profiler.run(pod, 10, &mut |_| {});
    let program = include_str!("../assets/programs/adam.ron");
    let report = profiler.compile_program_str(pod, "adam", program).unwrap();
    assert!(report.kernels > 0);
    profiler.observe(pod);
    let memory = profiler.memory();
    assert!(
        memory.events.is_empty() && memory.peaks.is_empty(),
        "a compile reserves nothing: {memory:?}"
    );
}

#[test]
fn the_memory_export_holds_what_runs_reserve_and_release() {
    let (mut profiler, mut opt) = profiled_adam();
    let params = Array1::from_elem(30_000, 0.5f32);
    opt.tpu_step(&params, &params).unwrap();
    opt.tpu_step(&params, &params).unwrap();
    profiler.observe(opt.pod_mut().unwrap());
    let memory = profiler.memory().clone();
    let reserves: Vec<_> = memory
        .events
        .iter()
        .filter(|e| e.kind == HbmEventKind::Reserve)
        .collect();
    let releases: Vec<_> = memory
        .events
        .iter()
        .filter(|e| e.kind == HbmEventKind::Release)
        .collect();
    // mu and nu stay resident: reserved once, 120,000 bytes each.
    for slot in ["`mu`", "`nu`"] {
        let held: Vec<_> = reserves
            .iter()
            .filter(|e| e.holder.contains(slot))
            .collect();
        assert_eq!(held.len(), 1, "{slot}: {memory:?}");
        assert_eq!(held[0].bytes, 120_000);
        assert_eq!(held[0].device, "device 0 (v4)");
    }
    // Each step's buffers: reserved for the step and released after it.
    let step_reserves = reserves
        .iter()
        .filter(|e| e.holder.contains("program"))
        .count();
    assert_eq!(step_reserves, 2, "{memory:?}");
    assert_eq!(releases.len(), 2, "{memory:?}");
    assert!(releases.iter().all(|e| e.holder.contains("program")));
    let last = memory.events.last().unwrap();
    assert_eq!(last.used_after, opt.hbm_usage(0));
    assert_eq!(opt.hbm_usage(0), 240_000);
    // The peak was taken while the step's reservation was held.
    let peak = &memory.peaks[0];
    let highest = memory.events.iter().map(|e| e.used_after).max().unwrap();
    assert_eq!(peak.used_bytes, highest);
    assert!(peak.used_bytes > 240_000, "{peak:?}");
    assert_eq!(
        peak.blocks.iter().map(|b| b.2).sum::<u64>(),
        peak.used_bytes,
        "{peak:?}"
    );
    assert!(peak.holder.contains("program"), "{peak:?}");
    assert!(peak.blocks.iter().any(|b| b.0 == peak.holder));
    assert_eq!(peak.capacity_bytes, 1 << 20);
    // Releasing the state shows as releases; the heap ends empty.
    opt.reset_state();
    profiler.observe(opt.pod_mut().unwrap());
    let memory = profiler.memory();
    let last = memory.events.last().unwrap();
    assert_eq!(last.kind, HbmEventKind::Release);
    assert_eq!(last.used_after, 0);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("memory.json");
    profiler.write_memory(&path).unwrap();
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(
        written["events"].as_array().map(Vec::len),
        Some(memory.events.len())
    );
    assert_eq!(written["events"][0]["kind"], "reserve");
}
