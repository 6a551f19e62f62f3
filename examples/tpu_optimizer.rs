//! The DESIGN.md usage example: a TPU optimizer compiled once and reused,
//! then the pod coordinator's barrier. Run with
//! `cargo run --release --example tpu_optimizer`.

use ndarray::Array1;
use optirs_tpu::coordination::{PodConfig, PodCoordinator};
use optirs_tpu::optimizers::{Adam, SGD};
use optirs_tpu::{Optimizer, TPUConfig, TPUOptimizer, TPUVersion};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let params = Array1::from_iter((0..1_000_000).map(|i| (i % 100) as f32 * 0.01));
    let gradients = Array1::from_iter((0..1_000_000).map(|i| ((i % 7) as f32 - 3.0) * 0.1));

    let mut tpu_opt = TPUOptimizer::new(
        SGD::new(0.01f32),
        TPUConfig {
            tpu_version: TPUVersion::V4,
            num_cores: 8,
            ..Default::default()
        },
    )?;
    let updated = tpu_opt.tpu_step(&params, &gradients)?; // compile once, reuse, execute, profile
    // TPUOptimizer also implements Optimizer, so generic code can call step.
    let updated = tpu_opt.step(&updated, &gradients)?;
    println!("sgd: params[1] = {}", updated[1]);

    let mut adam = TPUOptimizer::new(Adam::new(1e-3f32), TPUConfig::default())?;
    let mut p = params.clone();
    for _ in 0..10 {
        adam.tpu_step_in_place(&mut p, &gradients)?;
    }
    let profile = adam.profile();
    println!(
        "adam: {} steps, {} kernel(s), cache {} hit(s) / {} miss(es), compile {:.2} ms, \
         execute {:.3} ms per step, peak HBM {} bytes",
        profile.executions,
        profile.last_kernels,
        profile.cache.hits,
        profile.cache.misses,
        profile.compile_seconds * 1e3,
        profile.execute_seconds * 1e3 / profile.executions as f64,
        profile.memory.peak.as_ref().map_or(0, |p| p.used_bytes),
    );

    let mut pod = PodCoordinator::new(PodConfig {
        num_devices: 8,
        ..Default::default()
    })?;
    pod.synchronize_devices("step-0".to_string())?;
    println!("pod of 8 devices synchronized at barrier step-0");
    Ok(())
}
