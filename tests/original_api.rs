//! The original crate README's examples, compiled and run unchanged: the
//! optimizer facade, generic code over `Optimizer` that returns the
//! crate's one error type, and the pod coordinator.

use ndarray::{Array1, Ix1};
use optirs_tpu::coordination::{CoordinationError, PodConfig, PodCoordinator};
use optirs_tpu::error::ErrorKind;
use optirs_tpu::optimizers::{Adam, OptimizerError, SGD};
use optirs_tpu::{Optimizer, TPUConfig, TPUOptimizer, TPUVersion};

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
