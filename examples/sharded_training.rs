//! Trains a least-squares model with its optimizer sharded over a v5e-16
//! pod: every replica computes the gradient of its own slice of the data
//! on the host, the pod reduce-scatters the gradients, updates each
//! device's shard and all-gathers the parameters. A device is killed
//! mid-run; its state's redundant copy is promoted, the 15 survivors
//! re-shard, and the loss keeps going down.
//!
//! ```sh
//! cargo run --release --example sharded_training
//! ```

use ndarray::{Array1, Array2, ArrayD, IxDyn, s};
use optirs_tpu::clock::SimDuration;
use optirs_tpu::health::Fault;
use optirs_tpu::optimizers::Adam;
use optirs_tpu::sharding::{ParamSet, RecoveryPolicy, SyntheticGradients};
use optirs_tpu::topology::DeviceId;
use optirs_tpu::tpu::{ShardedOptimizer, ShardingConfig};
use optirs_tpu::{OptimError, Pod};

const FEATURES: usize = 256;
const SAMPLES: usize = 4096;

/// A seeded design matrix and targets from a hidden weight vector.
fn dataset() -> (Array2<f32>, Array1<f32>) {
    let noise = SyntheticGradients {
        seed: 11,
        step: 0,
        replicas: 1,
        scale: 1.0,
    };
    let x = Array2::from_shape_fn((SAMPLES, FEATURES), |(i, j)| {
        noise.value(0, i * FEATURES + j) as f32
    });
    let truth = Array1::from_shape_fn(FEATURES, |j| ((j % 7) as f32 - 3.0) * 0.25);
    let y = x.dot(&truth) + 0.5;
    (x, y)
}

/// The model's weights and bias.
fn weights(params: &ParamSet<f32>) -> (Array1<f32>, f32) {
    let w = params.get("w").expect("the model has w");
    let w = w.clone().into_dimensionality().expect("w is 1-D");
    (w, params.get("b").expect("the model has b")[0])
}

/// Mean squared error of `w`, `b` over every sample.
fn loss(x: &Array2<f32>, y: &Array1<f32>, w: &Array1<f32>, b: f32) -> f32 {
    let r = x.dot(w) + b - y;
    r.dot(&r) / SAMPLES as f32
}

fn main() -> Result<(), OptimError> {
    let (x, y) = dataset();
    let pod = Pod::from_ron_str(
        // v5e-16 with a 10 µs tick, so a fault lands inside a step.
        "Pod(name: \"v5e-16\", generation: \"v5e\", shape: \"4x4\", tick_ms: 0.01)",
        "sharded_training",
    )?;
    let params = ParamSet::try_from_iter([
        ("w", ArrayD::zeros(IxDyn(&[FEATURES]))),
        ("b", ArrayD::zeros(IxDyn(&[1]))),
    ])?;
    let sharding = ShardingConfig {
        bucket_bytes: 512, // several buckets even for this small model
        recovery: RecoveryPolicy::Redundant,
        ..Default::default()
    };
    let mut opt = ShardedOptimizer::on_pod(Adam::new(0.05f32), pod, params, sharding)?;
    let mut killed = false;
    let mut step = 0;
    while opt.steps_completed() < 60 {
        step += 1;
        let (w, b) = weights(&opt.params()?);
        // Each replica: the gradient of the mean squared error on its
        // strided slice of the samples.
        let replicas = opt.layout()?.devices();
        let grads = (0..replicas)
            .map(|r| {
                let xs = x.slice(s![r..;replicas, ..]);
                let ys = y.slice(s![r..;replicas]);
                let residual: Array1<f32> = xs.dot(&w) + b - ys;
                let n = residual.len() as f32;
                let gw = xs.t().dot(&residual) * (2.0 / n);
                let gb = residual.sum() * 2.0 / n;
                ParamSet::try_from_iter([
                    ("w", gw.into_dyn()),
                    ("b", ArrayD::from_elem(IxDyn(&[1]), gb)),
                ])
            })
            .collect::<Result<Vec<_>, _>>()?;
        if opt.steps_completed() == 30 && !killed {
            let at = opt.pod().clock().now() + SimDuration::from_micros(20);
            opt.pod_mut()
                .schedule_fault(at, Fault::KillDevice(DeviceId(6)));
            killed = true;
        }
        match opt.step_replicas(&grads) {
            Ok(report) => {
                if report.step % 10 == 0 || report.step == 1 {
                    println!(
                        "step {:>3}: loss {:>10.5}  ({} replicas, {:.1} µs modeled)",
                        report.step,
                        loss(&x, &y, &w, b),
                        replicas,
                        report.modeled_seconds * 1e6
                    );
                }
            }
            Err(e) => {
                println!("attempt {step}: {e}");
                for r in opt.recoveries() {
                    let lost: Vec<u32> = r.lost_devices.iter().map(|d| d.0).collect();
                    println!(
                        "  recovered by {}: lost devices {lost:?}, {} steps lost, {:.1} µs, {} devices now",
                        r.policy,
                        r.lost_steps,
                        r.recovery_seconds * 1e6,
                        r.devices_after
                    );
                }
            }
        }
    }
    let (w, b) = weights(&opt.params()?);
    println!(
        "final loss {:.5} after {} steps",
        loss(&x, &y, &w, b),
        opt.steps_completed()
    );
    Ok(())
}
