use super::*;
use crate::health::Fault;
use crate::pod::Pod;
use crate::topology::DeviceId;

fn checks(pod: &Pod, device: u32) -> HealthChecks {
    let entity = pod.device_entity(device).unwrap();
    *pod.world().get::<HealthChecks>(entity).unwrap()
}

fn interval(pod: &Pod) -> u64 {
    pod.world().resource::<MonitorConfig>().sample_every_ns
}

/// Runs until `ns` more simulated time has passed.
fn run_for(pod: &mut Pod, ns: u64) {
    let ticks = ns.div_ceil(pod.clock().tick_ns);
    pod.run(ticks);
}

#[test]
fn a_quiet_pod_is_healthy_and_its_history_is_bounded() {
    let mut pod = Pod::from_preset("v4-8").unwrap();
    let len = pod.world().resource::<MonitorConfig>().history_len;
    let every = interval(&pod);
    run_for(&mut pod, every * (len as u64 + 20));
    for device in 0..8 {
        assert_eq!(
            checks(&pod, device),
            HealthChecks::default(),
            "device {device}"
        );
        let history = pod.world().resource::<DeviceHistory>();
        assert_eq!(
            history.device(device as usize).count(),
            len,
            "exactly history_len samples"
        );
    }
    assert_eq!(pod.world().resource::<DeviceHistory>().len(), len);
    let report = performance_report(pod.world_mut(), None);
    assert_eq!(report.checks.ok, 8);
    assert!(report.availability.p50 > 0.85, "{report:?}");
    assert!(report.heartbeat_latency_ns.p50 > 0.0);
}

#[test]
fn heartbeat_checks_cross_and_recover_with_a_pause() {
    let mut pod = Pod::from_preset("v4-8").unwrap();
    let thresholds = *pod.world().resource::<HealthThresholds>();
    let every = interval(&pod);
    run_for(&mut pod, 4 * every);
    pod.inject(Fault::PauseDevice(DeviceId(5))).unwrap();
    let paused_at = pod.clock().now_ns;
    run_for(&mut pod, thresholds.heartbeat_age_warning_ns + 2 * every);
    let c = checks(&pod, 5);
    assert!(
        matches!(c.heartbeat, CheckState::Warning { since_ns } if since_ns > paused_at),
        "{c:?}"
    );
    assert_eq!(
        checks(&pod, 4).heartbeat,
        CheckState::Ok,
        "peers stay healthy"
    );
    pod.inject(Fault::ResumeDevice(DeviceId(5))).unwrap();
    run_for(&mut pod, 2 * every);
    assert_eq!(
        checks(&pod, 5).heartbeat,
        CheckState::Ok,
        "back once heartbeats arrive"
    );
}

#[test]
fn a_killed_device_goes_critical() {
    let mut pod = Pod::from_preset("v4-8").unwrap();
    let thresholds = *pod.world().resource::<HealthThresholds>();
    let every = interval(&pod);
    run_for(&mut pod, 4 * every);
    pod.kill_device(2).unwrap();
    run_for(&mut pod, thresholds.heartbeat_age_critical_ns + 2 * every);
    let c = checks(&pod, 2);
    assert!(matches!(c.heartbeat, CheckState::Critical { .. }), "{c:?}");
    assert!(matches!(c.error_rate, CheckState::Critical { .. }), "{c:?}");
    let report = performance_report(pod.world_mut(), None);
    assert_eq!(report.checks.critical, 1);
}

#[test]
fn memory_pressure_crosses_both_thresholds_and_back() {
    let mut pod = Pod::from_preset("v4-8").unwrap();
    let entity = pod.device_entity(1).unwrap();
    let capacity = pod
        .world()
        .get::<crate::topology::HbmCapacity>(entity)
        .unwrap()
        .0;
    let every = interval(&pod);
    let set = |pod: &mut Pod, fraction: f64| {
        pod.world_mut()
            .entity_mut(entity)
            .insert(HbmUsage((capacity as f64 * fraction) as u64));
        run_for(pod, every);
        checks(pod, 1).memory.level()
    };
    assert_eq!(set(&mut pod, 0.50), checks::Level::Ok);
    assert_eq!(set(&mut pod, 0.90), checks::Level::Warning);
    assert_eq!(set(&mut pod, 0.97), checks::Level::Critical);
    assert_eq!(set(&mut pod, 0.10), checks::Level::Ok);
}

#[test]
fn a_slow_control_path_straggles_until_it_is_fixed() {
    let mut pod = Pod::from_preset("v4-8").unwrap();
    let every = interval(&pod);
    let window = pod.world().resource::<MonitorConfig>().window_samples as u64;
    let base = pod.world().resource::<HeartbeatConfig>().control_latency_ns;
    run_for(&mut pod, 2 * every);
    pod.inject(Fault::DeviceJitter(DeviceId(6), base * 20))
        .unwrap();
    run_for(&mut pod, (window + 1) * every);
    assert_eq!(checks(&pod, 6).straggling.level(), checks::Level::Warning);
    assert_eq!(checks(&pod, 0).straggling.level(), checks::Level::Ok);
    pod.inject(Fault::DeviceJitter(DeviceId(6), 0)).unwrap();
    run_for(&mut pod, (window + 1) * every);
    assert_eq!(checks(&pod, 6).straggling.level(), checks::Level::Ok);
}

#[test]
fn link_rates_follow_traffic() {
    let mut pod = Pod::from_preset("v4-8").unwrap();
    let every = interval(&pod);
    run_for(&mut pod, every);
    pod.send_data(0, 1, 1 << 30).unwrap();
    run_for(&mut pod, 3 * every);
    let report = performance_report(pod.world_mut(), Some(&[1000, 2000, 3000]));
    assert!(report.link_bytes_per_s.max > 0.0, "{report:?}");
    assert!(report.link_peak_bytes_per_s >= report.link_bytes_per_s.max);
    assert_eq!(report.link_bytes_per_s.p50, 0.0, "most links stay idle");
    assert_eq!(report.busiest_links[0].ends, (0, 1));
    assert_eq!(report.step_wall_ns.unwrap().p50, 2000.0);
}

#[test]
fn the_sliding_window_equals_a_sum_over_the_newest_samples() {
    let mut pod = Pod::from_preset("v4-8").unwrap();
    let every = interval(&pod);
    pod.inject(Fault::DeviceJitter(DeviceId(2), 50_000))
        .unwrap();
    run_for(&mut pod, 30 * every);
    let window = pod.world().resource::<MonitorConfig>().window_samples;
    let history = pod.world().resource::<DeviceHistory>();
    for device in 0..8u32 {
        let summed = checks::Window::of(history.device(device as usize).rev().take(window));
        let entity = pod.device_entity(device).unwrap();
        let kept = pod.world().get::<DeviceMetrics>(entity).unwrap().window;
        assert_eq!(
            (kept.heard, kept.latency_sum_ns),
            (summed.heard, summed.latency_sum_ns)
        );
        assert!((kept.expected - summed.expected).abs() < 1e-9);
    }
}
