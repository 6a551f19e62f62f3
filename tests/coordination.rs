//! Heartbeats, fault detection, barriers and transport in simulated time.

use optirs_tpu::Pod;
use optirs_tpu::barrier::{BarrierFailureReason, BarrierOutcome, BarrierSpec};
use optirs_tpu::clock::{SimDuration, Ticks};
use optirs_tpu::health::{Fault, Health, KnownFailures};
use optirs_tpu::topology::{DeviceId, Link, LinkTraffic};
use proptest::prelude::*;

const SECOND: u64 = 1_000_000_000;

fn v5e16() -> Pod {
    Pod::from_preset("v5e-16").unwrap()
}

#[test]
fn a_killed_device_is_detected_within_the_timeout_and_everyone_learns_at_once() {
    let mut pod = v5e16();
    let (interval, timeout) = (
        pod.topology().heartbeat_interval_ns,
        pod.topology().heartbeat_timeout_ns,
    );
    pod.schedule_fault(SimDuration::from_secs(3), Fault::KillDevice(DeviceId(5)));
    let ticks = pod.run_until(Ticks(5_000), |world| {
        !world
            .resource::<optirs_tpu::health::FailureLog>()
            .records
            .is_empty()
    });
    assert!(ticks.is_some(), "the kill was detected");
    let record = pod.failures()[0];
    assert_eq!(record.device, DeviceId(5));
    assert_eq!(record.injected_at_ns, Some(3 * SECOND));
    assert!(
        record.detected_at_ns > 3 * SECOND + timeout - interval,
        "{record:?}"
    );
    assert!(
        record.detected_at_ns <= 3 * SECOND + timeout + interval,
        "{record:?}"
    );
    // Detected in the tick that just ran; every device knows in that same tick.
    assert_eq!(pod.clock().now_ns, record.detected_at_ns);
    let world = pod.world_mut();
    for known in world.query::<&KnownFailures>().iter(world) {
        assert_eq!(known.epoch, record.epoch);
    }
    for id in 0..16 {
        let health = pod.health(id).unwrap();
        assert_eq!(health.is_failed(), id == 5, "device {id}: {health:?}");
    }
}

#[test]
fn a_paused_device_turns_suspect_then_recovers_or_fails() {
    let mut pod = v5e16();
    pod.run(100);
    pod.inject(Fault::PauseDevice(DeviceId(2))).unwrap();
    pod.run(700); // 7 s of silence: past suspect_after (5 s), short of the timeout.
    assert!(
        matches!(pod.health(2), Some(Health::Suspect { .. })),
        "{:?}",
        pod.health(2)
    );
    pod.inject(Fault::ResumeDevice(DeviceId(2))).unwrap();
    pod.run(200);
    assert_eq!(pod.health(2), Some(Health::Healthy));
    assert!(pod.failures().is_empty());

    pod.inject(Fault::PauseDevice(DeviceId(2))).unwrap();
    pod.run(1200);
    assert!(pod.health(2).unwrap().is_failed());
    assert_eq!(pod.failures().len(), 1);
    // Failed is final: resuming does not bring it back without recovery.
    pod.inject(Fault::ResumeDevice(DeviceId(2))).unwrap();
    pod.run(200);
    assert!(pod.health(2).unwrap().is_failed());
}

#[test]
fn faults_name_what_does_not_exist() {
    let mut pod = v5e16();
    let error = pod
        .inject(Fault::KillDevice(DeviceId(99)))
        .unwrap_err()
        .to_string();
    assert!(error.contains("device 99"), "{error}");
    let error = pod
        .inject(Fault::CutLink(DeviceId(0), DeviceId(5)))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("no link joins device 0 and device 5"),
        "{error}"
    );
    pod.kill_device(1).unwrap();
    assert!(pod.inject(Fault::ResumeDevice(DeviceId(1))).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Every kill is detected within timeout + one interval, and jitter below
    /// half the timeout never fails a running device.
    #[test]
    fn detection_is_timely_and_has_no_false_positives(
        seed: u64,
        kills in proptest::collection::btree_map(0u32..16, 0u64..20_000, 0..4),
        jitter_ms in proptest::collection::vec(0u64..5_000, 16),
    ) {
        let mut pod = v5e16();
        pod.set_seed(seed);
        let (interval, timeout) = (pod.topology().heartbeat_interval_ns, pod.topology().heartbeat_timeout_ns);
        for (device, &jitter) in jitter_ms.iter().enumerate() {
            // Strictly below timeout / 2.
            let jitter_ns = (jitter * 1_000_000).min(timeout / 2 - 1);
            pod.inject(Fault::DeviceJitter(DeviceId(device as u32), jitter_ns)).unwrap();
        }
        for (&device, &at_ms) in &kills {
            pod.schedule_fault(at_ms * 1_000_000, Fault::KillDevice(DeviceId(device)));
        }
        pod.run(4_000); // 40 s: every kill at <= 20 s is due by 31 s.
        let failures = pod.failures();
        prop_assert_eq!(failures.len(), kills.len(), "false positive or missed kill: {:?}", failures);
        for record in failures {
            let killed_at = kills.get(&record.device.0).map(|ms| ms * 1_000_000);
            prop_assert!(killed_at.is_some(), "false positive: {:?}", record);
            let killed_at = killed_at.unwrap();
            // The kill lands at its own time, inside a tick if need be.
            let applied = killed_at;
            prop_assert_eq!(record.injected_at_ns, Some(applied));
            prop_assert!(record.detected_at_ns >= applied);
            prop_assert!(record.detected_at_ns <= applied + timeout + interval, "{:?}", record);
        }
    }
}

#[test]
fn a_barrier_completes_when_everyone_arrives() {
    let mut pod = v5e16();
    let id = pod
        .create_barrier(
            BarrierSpec::named("step-0")
                .timeout(SimDuration::from_secs(30))
                .auto_arrive(),
        )
        .unwrap();
    let outcome = pod.wait_for_barrier(id).unwrap();
    assert!(
        matches!(outcome, BarrierOutcome::Completed { .. }),
        "{outcome:?}"
    );
    // The name can be reused: the next generation starts pending.
    let again = pod
        .create_barrier(BarrierSpec::named("step-0").auto_arrive())
        .unwrap();
    assert_eq!(again, id);
    assert_eq!(pod.barrier_outcome(id), Some(&BarrierOutcome::Pending));
    assert!(matches!(
        pod.wait_for_barrier(id).unwrap(),
        BarrierOutcome::Completed { .. }
    ));
}

#[test]
fn a_barrier_with_a_dead_participant_fails_and_names_it() {
    let mut pod = v5e16();
    pod.kill_device(7).unwrap();
    let id = pod
        .create_barrier(BarrierSpec::named("sync").auto_arrive())
        .unwrap();
    let BarrierOutcome::Failed(failure) = pod.wait_for_barrier(id).unwrap() else {
        panic!("a barrier with a dead participant must fail");
    };
    assert_eq!((failure.arrived, failure.participants), (15, 16));
    assert_eq!(failure.stragglers, vec![DeviceId(7)]);
    assert_eq!(
        failure.reason,
        BarrierFailureReason::ParticipantFailed(DeviceId(7))
    );
    let message = failure.to_string();
    assert!(
        message.contains("15/16 arrived") && message.contains("device 7"),
        "{message}"
    );
    // It failed when the detector declared device 7 failed, not before.
    assert_eq!(
        Some(failure.at_ns),
        pod.failures().first().map(|r| r.detected_at_ns)
    );
}

#[test]
fn a_barrier_past_its_deadline_fails_naming_up_to_three_stragglers() {
    let mut pod = v5e16();
    let participants: Vec<DeviceId> = (0..8).map(DeviceId).collect();
    let id = pod
        .create_barrier(
            BarrierSpec::named("manual")
                .participants(participants)
                .timeout(SimDuration::from_millis(500)),
        )
        .unwrap();
    for device in [0, 1, 2, 3] {
        pod.arrive(id, device).unwrap();
    }
    let BarrierOutcome::Failed(failure) = pod.wait_for_barrier(id).unwrap() else {
        panic!("deadline must fail the barrier");
    };
    assert_eq!(failure.reason, BarrierFailureReason::DeadlineExceeded);
    assert_eq!((failure.arrived, failure.participants), (4, 8));
    let message = failure.to_string();
    assert!(message.contains("4/8 arrived"), "{message}");
    assert!(message.contains("device 4, 5, 6 and 1 more"), "{message}");
}

#[test]
fn arrivals_from_non_participants_are_rejected() {
    let mut pod = v5e16();
    let id = pod
        .create_barrier(BarrierSpec::named("pair").participants([0, 1]))
        .unwrap();
    let error = pod.arrive(id, 9).unwrap_err().to_string();
    assert!(
        error.contains("device 9 is not a participant of barrier `pair`"),
        "{error}"
    );
    pod.arrive(id, 0).unwrap();
    pod.arrive(id, 1).unwrap();
    assert!(matches!(
        pod.wait_for_barrier(id).unwrap(),
        BarrierOutcome::Completed { .. }
    ));
    assert!(pod.arrive(id, 0).is_err(), "no arrivals after completion");
    assert!(
        pod.create_barrier(BarrierSpec::named("empty").participants(Vec::<DeviceId>::new()))
            .is_err()
    );
}

#[test]
fn data_travels_hop_by_hop_and_is_charged_to_each_link() {
    let mut pod = Pod::from_ron_str(
        "Pod(name: \"line\", generation: \"v3\", shape: \"4x1\", custom: true, chips_per_host: \"1x1\", \
         ici: (bandwidth_gb_per_s: 1.0, latency_us: 2.0))",
        "line",
    )
    .unwrap();
    // 0 -> 3 on a 4-chip ring: one hop over the wraparound link.
    let at = pod.send_data(0, 3, 1_000_000).unwrap();
    assert_eq!(at, 1_000_000 + 2_000, "1 MB at 1 GB/s plus 2 µs");
    // Cut it: the route now takes 3 hops.
    pod.inject(Fault::CutLink(DeviceId(3), DeviceId(0)))
        .unwrap();
    let now = pod.clock().now_ns;
    let at = pod.send_data(0, 3, 1_000).unwrap();
    assert_eq!(at - now, 3 * (1_000 + 2_000));
    let world = pod.world_mut();
    let mut moved = 0;
    for (_, traffic) in world.query::<(&Link, &LinkTraffic)>().iter(world) {
        moved += traffic.bytes_ab + traffic.bytes_ba;
    }
    assert_eq!(moved, 1_000_000 + 3 * 1_000);
    pod.run(1);
    assert_eq!(
        pod.world()
            .resource::<optirs_tpu::transport::Transport>()
            .in_flight(),
        0
    );
    // Cut the pod in two: no route.
    pod.inject(Fault::CutLink(DeviceId(1), DeviceId(2)))
        .unwrap();
    let error = pod.send_data(0, 3, 8).unwrap_err().to_string();
    assert!(
        error.contains("no route from device 0 to device 3"),
        "{error}"
    );
}

#[test]
fn a_message_on_a_link_cut_in_flight_is_dropped() {
    let mut pod = Pod::from_ron_str(
        "Pod(name: \"slow\", generation: \"v5e\", shape: \"4x1\", custom: true, chips_per_host: \"1x1\", \
         ici: (bandwidth_gb_per_s: 0.001))",
        "slow",
    )
    .unwrap();
    pod.send_data(0, 1, 1_000_000).unwrap(); // 1 s at 1 MB/s
    pod.run(10);
    pod.inject(Fault::CutLink(DeviceId(0), DeviceId(1)))
        .unwrap();
    pod.run(200);
    let transport = pod.world().resource::<optirs_tpu::transport::Transport>();
    assert_eq!((transport.dropped, transport.in_flight()), (1, 0));
}

#[test]
fn the_same_faults_give_the_same_history() {
    let run = || {
        let mut pod = v5e16();
        pod.set_seed(42);
        for device in 0..16 {
            pod.inject(Fault::DeviceJitter(DeviceId(device), 3 * SECOND))
                .unwrap();
        }
        pod.schedule_fault(SimDuration::from_secs(2), Fault::KillDevice(DeviceId(3)));
        pod.schedule_fault(SimDuration::from_secs(4), Fault::PauseDevice(DeviceId(9)));
        pod.run(2_000);
        pod.failures().to_vec()
    };
    let (a, b) = (run(), run());
    assert_eq!(a.len(), 2);
    assert_eq!(a, b);
}

#[test]
fn link_jitter_delays_each_hop_within_its_bound() {
    let text = "Pod(name: \"line\", generation: \"v3\", shape: \"4x1\", custom: true, chips_per_host: \"1x1\", \
                ici: (bandwidth_gb_per_s: 1.0, latency_us: 2.0))";
    let mut pod = Pod::from_ron_str(text, "line").unwrap();
    pod.inject(Fault::LinkJitter(DeviceId(0), DeviceId(1), 50_000))
        .unwrap();
    let mut delays = std::collections::BTreeSet::new();
    for _ in 0..64 {
        let now = pod.clock().now_ns;
        let at = pod.send_data(0, 1, 1_000).unwrap();
        let delay = at - now;
        assert!((3_000..=53_000).contains(&delay), "{delay}");
        delays.insert(delay);
        pod.run(1);
    }
    assert!(delays.len() > 32, "jitter varies: {delays:?}");
}

#[test]
fn devices_estimate_their_clock_offset_by_ntp_within_half_the_asymmetry() {
    let mut pod = v5e16();
    let offsets = [5_000_000i64, -3_000_000, 0, 123_456];
    for (device, &offset) in offsets.iter().enumerate() {
        pod.set_device_clock(device as u32, offset, 0.0).unwrap();
    }
    // Up to 200 µs of jitter on each leg: the asymmetry of one exchange is at
    // most that, so the error is at most half of it.
    pod.inject(Fault::DeviceJitter(DeviceId(1), 200_000))
        .unwrap();
    pod.run(1_000); // 10 s: about ten exchanges per device.
    for (device, &offset) in offsets.iter().enumerate() {
        let estimate = pod.clock_estimate(device as u32).expect("exchanges ran");
        // The estimate is the service's clock minus the device's.
        let error = (estimate.offset_ns + offset as f64).abs();
        assert!(error <= 100_000.0, "device {device}: {estimate:?}");
        assert_eq!(estimate.samples, 8, "the filter keeps eight samples");
        if device != 1 {
            assert_eq!(error, 0.0, "no jitter: symmetric path, exact estimate");
        }
    }
    // A drifting clock is tracked too: 50 ppm over 10 s is 500 µs.
    pod.set_device_clock(7, 0, 50.0).unwrap();
    pod.run(1_000);
    let estimate = pod.clock_estimate(7).unwrap();
    let truth = -(pod.clock().now_ns as f64 * 50e-6);
    assert!(
        (estimate.offset_ns - truth).abs() < 60_000.0,
        "{estimate:?} vs {truth}"
    );
}

#[test]
fn the_load_balancer_places_work_on_healthy_devices_only() {
    use optirs_tpu::coordination::load_balance::{Policy, WorkId, Workload};
    let mut pod = v5e16();
    pod.kill_device(4).unwrap();
    pod.run(1_200);
    let mut balancer = pod.load_balancer(Policy::LeastLoaded);
    let mut placed = std::collections::BTreeSet::new();
    for id in 0..30 {
        let device = balancer
            .place(Workload {
                id: WorkId(id),
                cost: 1.0,
            })
            .unwrap();
        assert_ne!(device, DeviceId(4), "a failed device gets no work");
        placed.insert(device);
    }
    assert_eq!(
        placed.len(),
        15,
        "least-loaded spreads over every healthy device"
    );
    let mut round_robin = pod.load_balancer(Policy::RoundRobin);
    // NaN is refused as a cost and as a reported load; so are negative and
    // −∞ loads, which would otherwise win every placement.
    assert!(
        round_robin
            .place(Workload {
                id: WorkId(9),
                cost: f64::NAN
            })
            .is_err()
    );
    for load in [f64::NAN, f64::NEG_INFINITY, -1.0] {
        assert!(balancer.report_load(DeviceId(0), load).is_err(), "{load}");
    }
    balancer.report_load(DeviceId(0), 1e300).unwrap();
    let next = balancer
        .place(Workload {
            id: WorkId(99),
            cost: 1.0,
        })
        .unwrap();
    assert_ne!(next, DeviceId(0));
    let first = round_robin
        .place(Workload {
            id: WorkId(0),
            cost: 1.0,
        })
        .unwrap();
    let second = round_robin
        .place(Workload {
            id: WorkId(1),
            cost: 1.0,
        })
        .unwrap();
    assert_ne!(first, second);
    assert_eq!(round_robin.finish(WorkId(0)).unwrap(), first);
}

/// A backend standing in for a second process: it owns the devices with
/// even ids and the coordination service, and loops every message for the
/// other devices straight back, as a network would deliver them to the
/// process that owns them.
#[derive(Debug, Default)]
struct Loopback {
    wire: Vec<optirs_tpu::transport::Envelope>,
}

impl optirs_tpu::transport::TransportBackend for Loopback {
    fn name(&self) -> &str {
        "loopback"
    }

    fn owns(&self, to: Option<DeviceId>) -> bool {
        to.is_none_or(|d| d.0 % 2 == 0)
    }

    fn send(&mut self, envelope: optirs_tpu::transport::Envelope) {
        self.wire.push(envelope);
    }

    fn receive(
        &mut self,
        into: &mut Vec<optirs_tpu::transport::Envelope>,
    ) -> Result<(), optirs_tpu::transport::TransportError> {
        into.append(&mut self.wire);
        Ok(())
    }
}

/// The systems do not know which backend moves the bytes: a pod whose
/// messages for half its devices go through a backend steps to the same
/// world, bit for bit, as one that delivers everything in process.
#[test]
fn a_transport_backend_moves_messages_without_changing_the_world() {
    let run = |backend: Option<Loopback>| {
        let mut pod = v5e16();
        if let Some(b) = backend {
            pod.set_transport_backend(Box::new(b));
        }
        for (from, to) in [(0, 5), (3, 8), (6, 1), (9, 15)] {
            pod.send_data(from, to, 1 << 20).unwrap();
        }
        let id = pod
            .create_barrier(
                BarrierSpec::named("sync")
                    .timeout(SimDuration::from_secs(30))
                    .auto_arrive(),
            )
            .unwrap();
        pod.run(50);
        pod.kill_device(7).unwrap();
        pod.run(3000);
        let sent = pod
            .world()
            .resource::<optirs_tpu::transport::Network>()
            .sent;
        (
            pod.world_sha256().unwrap(),
            pod.barrier_outcome(id).cloned(),
            sent,
        )
    };
    let (local, local_barrier, local_sent) = run(None);
    let (looped, looped_barrier, looped_sent) = run(Some(Loopback::default()));
    assert_eq!(local_sent, 0);
    assert!(
        looped_sent > 0,
        "messages for odd devices went through the backend"
    );
    assert_eq!(local_barrier, looped_barrier);
    assert_eq!(local, looped);
}

#[test]
fn a_restored_pod_keeps_its_transport_backend() {
    let mut pod = v5e16();
    pod.set_transport_backend(Box::new(Loopback::default()));
    pod.run(10);
    let snapshot = pod.snapshot().unwrap();
    pod.run(10);
    pod.restore_snapshot(&snapshot).unwrap();
    pod.send_data(0, 3, 4096).unwrap();
    pod.run(100);
    let network = pod.world().resource::<optirs_tpu::transport::Network>();
    assert_eq!(network.backend().name(), "loopback");
    assert!(network.sent >= 1);
}
