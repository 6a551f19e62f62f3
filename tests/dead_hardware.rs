//! No success on dead hardware: a step on a failed device and a collective
//! whose participant dies before it completes are errors naming the device.

use ndarray::Array1;
use optirs_tpu::collectives::ReduceOp;
use optirs_tpu::collectives::pod::CollectiveOutcome;
use optirs_tpu::health::FaultError;
use optirs_tpu::optimizers::Adam;
use optirs_tpu::topology::DeviceId;
use optirs_tpu::{Pod, TPUConfig, TPUOptimizer, TPUVersion};

fn inputs(n: usize, len: usize) -> Vec<Vec<f32>> {
    (0..n).map(|r| vec![r as f32; len]).collect()
}

#[test]
fn a_step_on_a_killed_and_failed_device_is_an_error_naming_it() {
    let config = TPUConfig {
        tpu_version: TPUVersion::V4,
        num_cores: 2,
        ..Default::default()
    };
    let pod = Pod::from_preset("v4-16").unwrap();
    let mut opt = TPUOptimizer::on_pod(Adam::new(0.01f32), config, pod).unwrap();
    let p = Array1::from_elem(64, 0.5f32);
    opt.tpu_step(&p, &p).unwrap();

    let pod = opt.pod_mut().unwrap();
    pod.kill_device(0).unwrap();
    // Killed, not yet detected: the step still cannot run on it.
    let error = opt.tpu_step(&p, &p).unwrap_err();
    assert!(
        matches!(
            error.downcast_ref::<FaultError>(),
            Some(FaultError::DeviceDead {
                device: DeviceId(0),
                ..
            })
        ),
        "{error}"
    );
    let pod = opt.pod_mut().unwrap();
    for _ in 0..10_000 {
        if pod.health(0).unwrap().is_failed() {
            break;
        }
        pod.step();
    }
    assert!(pod.health(0).unwrap().is_failed());
    let error = opt.tpu_step(&p, &p).unwrap_err();
    assert!(
        matches!(
            error.downcast_ref::<FaultError>(),
            Some(FaultError::DeviceFailed {
                device: DeviceId(0),
                ..
            })
        ),
        "{error}"
    );
    assert!(error.to_string().contains("device 0"), "{error}");
}

#[test]
fn a_collective_whose_participant_dies_before_completion_fails() {
    // 4 MB over 0.1 GB/s links: the collective takes well under the 10 s
    // heartbeat timeout, so the detector has not noticed the kill when it
    // would complete.
    let mut pod = Pod::from_ron_str(
        "Pod(name: \"slowish\", generation: \"v5e\", shape: \"4x4\", ici: (bandwidth_gb_per_s: 0.1))",
        "slowish",
    )
    .unwrap();
    let mut buffers = inputs(16, 1 << 20);
    let report = pod.launch_all_reduce(&mut buffers, ReduceOp::Sum).unwrap();
    let timeout = pod.topology().heartbeat_timeout_ns;
    assert!(report.completes_at_ns > pod.clock().now_ns + pod.topology().tick_ns);
    assert!(report.completes_at_ns < pod.clock().now_ns + timeout / 2);
    pod.kill_device(9).unwrap();
    let error = pod.wait_for_collective(&report).unwrap_err().to_string();
    assert!(error.contains("device 9"), "{error}");
    assert!(
        pod.failures().is_empty(),
        "failed before the detector noticed"
    );
    assert!(matches!(
        pod.world().get::<CollectiveOutcome>(report.entity),
        Some(CollectiveOutcome::Failed {
            device: DeviceId(9),
            ..
        })
    ));

    // A kill after the completion time does not undo a completed collective.
    let mut pod = Pod::from_preset("v5e-16").unwrap();
    let mut buffers = inputs(16, 256);
    pod.all_reduce(&mut buffers, ReduceOp::Sum).unwrap();
    pod.kill_device(9).unwrap();
    pod.step();
}
