//! Every wait ends: barriers have a deadline even without a timeout, and
//! a coordinator synchronizes again after a failure.

use optirs_tpu::Pod;
use optirs_tpu::barrier::{BarrierFailureReason, BarrierOutcome, BarrierSpec, DEFAULT_TIMEOUT_NS};
use optirs_tpu::coordination::{CoordinationError, PodConfig, PodCoordinator};
use optirs_tpu::topology::DeviceId;

#[test]
fn a_barrier_without_a_timeout_fails_at_the_default_deadline() {
    let mut pod = Pod::from_preset("v5e-16").unwrap();
    let start = pod.clock().now_ns;
    let id = pod
        .create_barrier(BarrierSpec::named("manual").participants([0, 1]))
        .unwrap();
    // Device 1 is healthy but never arrives: the wait must still end.
    pod.arrive(id, 0).unwrap();
    let BarrierOutcome::Failed(failure) = pod.wait_for_barrier(id).unwrap() else {
        panic!("a barrier nobody completes must fail by its deadline");
    };
    assert_eq!(failure.reason, BarrierFailureReason::DeadlineExceeded);
    assert_eq!(failure.at_ns, start + DEFAULT_TIMEOUT_NS);
    assert_eq!(failure.stragglers, vec![DeviceId(1)]);
    assert_eq!((failure.arrived, failure.participants), (1, 2));
    assert!(pod.failures().is_empty(), "device 1 stayed healthy");
}

#[test]
fn stragglers_are_only_the_devices_that_never_arrived() {
    let mut pod = Pod::from_preset("v5e-16").unwrap();
    pod.kill_device(5).unwrap();
    for _ in 0..5_000 {
        if pod.health(5).unwrap().is_failed() {
            break;
        }
        pod.step();
    }
    assert!(pod.health(5).unwrap().is_failed());
    // Every device is a participant, and device 5 is known failed: the
    // barrier fails at once, while the other arrivals are in flight.
    let id = pod
        .create_barrier(BarrierSpec::named("again").auto_arrive())
        .unwrap();
    let BarrierOutcome::Failed(failure) = pod.wait_for_barrier(id).unwrap() else {
        panic!("a barrier over a failed device fails");
    };
    assert_eq!(
        failure.reason,
        BarrierFailureReason::ParticipantFailed(DeviceId(5))
    );
    assert_eq!(failure.stragglers, vec![DeviceId(5)]);
    let message = failure.to_string();
    assert!(message.contains("stragglers: device 5"), "{message}");
    assert!(!message.contains("more;"), "{message}");
}

#[test]
fn a_coordinator_synchronizes_again_after_a_failure() {
    let mut pod = PodCoordinator::new(PodConfig {
        num_devices: 12,
        ..Default::default()
    })
    .unwrap();
    pod.synchronize_devices("step-0".into()).unwrap();
    pod.kill_device(4).unwrap();
    let error = pod.synchronize_devices("step-1".into()).unwrap_err();
    let CoordinationError::BarrierFailed(failure) = &error else {
        panic!("{error}");
    };
    assert_eq!(failure.stragglers, vec![DeviceId(4)], "{error}");
    assert!(error.to_string().contains("11/12 arrived"), "{error}");
    // Device 4 is declared failed now: it is left out and the pod goes on.
    assert_eq!(pod.participants().len(), 11);
    assert!(!pod.participants().contains(&DeviceId(4)));
    for step in 2..5 {
        pod.synchronize_devices(format!("step-{step}")).unwrap();
    }
    // The user can leave out a device too, and take it back.
    pod.exclude_device(7).unwrap();
    assert_eq!(pod.participants().len(), 10);
    pod.synchronize_devices("step-5".into()).unwrap();
    pod.include_device(7).unwrap();
    pod.synchronize_devices("step-6".into()).unwrap();
    assert!(pod.exclude_device(99).is_err());
}
