//! Heartbeat emission and the detector's guarantee against false failures,
//! for every configuration the pod loader accepts.

use optirs_tpu::Pod;
use optirs_tpu::health::{Fault, Heartbeat, HeartbeatConfig};
use optirs_tpu::topology::{DeviceId, parse_topology};
use proptest::prelude::*;

#[test]
fn a_device_sends_at_most_one_heartbeat_per_tick() {
    let mut pod = Pod::from_preset("v5e-16").unwrap();
    // 1 µs between heartbeats and 10 ms ticks: 10,000 intervals elapse per
    // tick. The loader refuses such a file; a config changed at run time
    // must still cost one heartbeat per device per tick, not one per interval.
    pod.world_mut()
        .resource_mut::<HeartbeatConfig>()
        .interval_ns = 1_000;
    let ticks = 5;
    pod.run(ticks);
    let world = pod.world_mut();
    let sent: Vec<u64> = world
        .query::<&Heartbeat>()
        .iter(world)
        .map(|h| h.sent)
        .collect();
    assert_eq!(sent.len(), 16);
    for (device, &count) in sent.iter().enumerate() {
        assert!(
            count <= ticks,
            "device {device} sent {count} in {ticks} ticks"
        );
    }
    assert!(pod.failures().is_empty(), "{:?}", pod.failures());
    let now = pod.clock().now_ns;
    let world = pod.world_mut();
    for heartbeat in world.query::<&Heartbeat>().iter(world) {
        assert!(heartbeat.next_due_ns > now, "{heartbeat:?}");
        // Staggered first heartbeats may still lie ahead; after the first,
        // the schedule is on the new interval.
        if heartbeat.sent > 0 {
            assert!(heartbeat.next_due_ns <= now + 1_000, "{heartbeat:?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Any pod the loader accepts, with control jitter inside the documented
    /// bound (latency + jitter + interval <= timeout), fails no device when
    /// no fault is injected.
    #[test]
    fn accepted_configs_never_fail_a_healthy_device(
        seed: u64,
        tick_ms in prop::sample::select(vec![1.0f64, 2.5, 5.0, 10.0]),
        interval_ms in 1.0f64..2_000.0,
        timeout_factor in 1.0f64..6.0,
        latency_share in 0.0f64..1.2,
        jitter_share in proptest::collection::vec(0.0f64..=1.0, 4),
    ) {
        let timeout_ms = interval_ms * timeout_factor;
        // Latencies both inside and beyond the room the timeout leaves.
        let latency_us = (timeout_ms - interval_ms).max(0.0) * latency_share * 1e3;
        let text = format!(
            "Pod(name: \"p\", generation: \"v5e\", shape: \"2x2\", \
             dcn: (latency_us: {latency_us:?}), \
             heartbeat: (interval_ms: {interval_ms:?}, timeout_ms: {timeout_ms:?}), \
             tick_ms: {tick_ms:?})"
        );
        let Ok(topology) = parse_topology(&text, "prop.ron") else {
            // Rejected: the loader's business, covered by tests/topology.rs.
            return Ok(());
        };
        let (interval, timeout) = (topology.heartbeat_interval_ns, topology.heartbeat_timeout_ns);
        let latency = topology.dcn.latency_ns;
        prop_assert!(latency + interval <= timeout, "accepted beyond the bound: {}", text);
        let mut pod = Pod::from_topology(topology.clone()).unwrap();
        pod.set_seed(seed);
        let room = timeout - interval - latency;
        for (device, share) in jitter_share.iter().enumerate() {
            let jitter_ns = (room as f64 * share) as u64;
            pod.inject(Fault::DeviceJitter(DeviceId(device as u32), jitter_ns)).unwrap();
        }
        // Three timeouts of simulated time, at most 10,000 ticks.
        let ticks = (3 * timeout).div_ceil(topology.tick_ns).min(10_000);
        pod.run(ticks);
        prop_assert!(pod.failures().is_empty(), "{}: {:?}", text, pod.failures());
    }
}

/// What the world holds after `ticks`: snapshot bytes, messages in flight,
/// delivery-log entries and failure records.
fn held(pod: &mut Pod) -> (usize, usize, usize, usize) {
    let bytes = pod.snapshot().unwrap().to_bytes().len();
    let world = pod.world_mut();
    let in_flight = world
        .resource::<optirs_tpu::transport::Transport>()
        .in_flight_sorted()
        .len();
    let delivered = world
        .resource::<optirs_tpu::transport::DeliveryLog>()
        .recent
        .len();
    let failures = world
        .resource::<optirs_tpu::health::FailureLog>()
        .records
        .len();
    (bytes, in_flight, delivered, failures)
}

#[test]
fn a_long_run_holds_a_bounded_world() {
    // Heartbeats (and monitor samples) every tick, so every ring fills in
    // 128 ticks; after that, ten times the ticks hold no more entries, and
    // the snapshot grows only as counters need longer varints (logarithmic:
    // a leak of one byte per tick would add 18,000 bytes here).
    let mut pod = Pod::from_ron_str(
        "Pod(name: \"long\", generation: \"v5e\", shape: \"4x4\", tick_ms: 10.0, \
         heartbeat: (interval_ms: 10.0, timeout_ms: 1000.0))",
        "long.ron",
    )
    .unwrap();
    let n = 2_000;
    pod.run(n);
    let (bytes, in_flight, delivered, failures) = held(&mut pod);
    pod.run(9 * n);
    let (bytes_10n, in_flight_10n, delivered_10n, failures_10n) = held(&mut pod);
    assert!(
        bytes_10n <= bytes + bytes / 20,
        "snapshot grew from {bytes} to {bytes_10n} bytes"
    );
    assert!(
        in_flight_10n <= in_flight.max(16),
        "{in_flight} -> {in_flight_10n}"
    );
    assert!(
        delivered_10n <= optirs_tpu::transport::DELIVERY_LOG_CAPACITY,
        "{delivered} -> {delivered_10n}"
    );
    assert_eq!((failures, failures_10n), (0, 0));
}
