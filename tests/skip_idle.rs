//! `Pod::run_skipping` leaves the world `Pod::run` leaves, bit for bit,
//! over random pods, heartbeat settings, faults and host calls.

use optirs_tpu::Pod;
use optirs_tpu::health::Fault;
use optirs_tpu::topology::{DeviceId, load_preset};
use proptest::prelude::*;

const MS: u64 = 1_000_000;

const PRESETS: [&str; 4] = ["v4-16", "v5e-16", "v3-64", "v4-128"];

/// A pod of `preset` with the tick and heartbeat timing the loader would
/// accept (interval at least one tick, timeout past interval plus latency).
fn pod(preset: &str, tick_ms: u64, interval_ticks: u64, slack_ms: u64) -> Pod {
    let mut topology = load_preset(preset).unwrap();
    topology.tick_ns = tick_ms * MS;
    topology.heartbeat_interval_ns = interval_ticks * topology.tick_ns;
    topology.heartbeat_timeout_ns =
        topology.heartbeat_interval_ns + topology.dcn.latency_ns + slack_ms * MS;
    Pod::from_topology(topology).unwrap()
}

fn fault(kind: u8, a: u32, b: u32, amount_ms: u64) -> Fault {
    let (a, b) = (DeviceId(a), DeviceId(b));
    match kind % 6 {
        0 => Fault::KillDevice(a),
        1 => Fault::PauseDevice(a),
        2 => Fault::ResumeDevice(a),
        3 => Fault::DeviceJitter(a, amount_ms * MS),
        4 => Fault::CutLink(a, b),
        _ => Fault::LinkJitter(a, b, amount_ms * MS),
    }
}

/// What the host does between two runs, to both pods alike.
#[derive(Debug, Clone)]
enum HostCall {
    Nothing,
    /// Schedules a fault this many ms from now.
    Schedule(u64, u8, u32, u32, u64),
    /// Injects a fault now.
    Inject(u8, u32, u32, u64),
    /// Snapshots the world and restores it in place.
    SnapshotRestore,
    /// Sends data between two devices.
    Send(u32, u32, u64),
}

fn host_call() -> impl Strategy<Value = HostCall> {
    prop_oneof![
        Just(HostCall::Nothing),
        (0..3_000u64, any::<u8>(), 0..64u32, 0..64u32, 0..400u64)
            .prop_map(|(t, k, a, b, j)| HostCall::Schedule(t, k, a, b, j)),
        (any::<u8>(), 0..64u32, 0..64u32, 0..400u64)
            .prop_map(|(k, a, b, j)| HostCall::Inject(k, a, b, j)),
        Just(HostCall::SnapshotRestore),
        (0..64u32, 0..64u32, 1..1_000_000u64).prop_map(|(a, b, n)| HostCall::Send(a, b, n)),
    ]
}

fn apply(pod: &mut Pod, call: &HostCall) {
    let n = pod.topology().num_devices();
    match *call {
        HostCall::Nothing => {}
        HostCall::Schedule(in_ms, kind, a, b, j) => {
            let at = pod.clock().now_ns + in_ms * MS;
            pod.schedule_fault(at, fault(kind, a % n, b % n, j));
        }
        HostCall::Inject(kind, a, b, j) => {
            // A rejected fault (an unknown link) is rejected alike in both.
            let _ = pod.inject(fault(kind, a % n, b % n, j));
        }
        HostCall::SnapshotRestore => {
            let snapshot = pod.snapshot().unwrap();
            pod.restore_snapshot(&snapshot).unwrap();
        }
        HostCall::Send(a, b, bytes) => {
            let _ = pod.send_data(a % n, b % n, bytes);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn skipping_idle_ticks_leaves_the_world_ticking_leaves(
        preset in 0..PRESETS.len(),
        tick_ms in prop_oneof![Just(1u64), Just(5), Just(10)],
        interval_ticks in 1..60u64,
        slack_ms in 1..500u64,
        faults in prop::collection::vec(
            (0..4_000u64, any::<u8>(), 0..64u32, 0..64u32, 0..400u64), 0..6),
        segments in prop::collection::vec((host_call(), 0..400u64), 1..5),
    ) {
        let preset = PRESETS[preset];
        let mut ticked = pod(preset, tick_ms, interval_ticks, slack_ms);
        let mut skipped = pod(preset, tick_ms, interval_ticks, slack_ms);
        let n = ticked.topology().num_devices();
        for &(at_ms, kind, a, b, j) in &faults {
            for p in [&mut ticked, &mut skipped] {
                p.schedule_fault(at_ms * MS, fault(kind, a % n, b % n, j));
            }
        }
        for (call, ticks) in &segments {
            apply(&mut ticked, call);
            apply(&mut skipped, call);
            ticked.run(*ticks);
            let stats = skipped.run_skipping(*ticks).unwrap();
            prop_assert_eq!(stats.ticks(), *ticks);
            prop_assert_eq!(ticked.clock(), skipped.clock());
            prop_assert_eq!(ticked.world_sha256().unwrap(), skipped.world_sha256().unwrap());
        }
    }
}

#[test]
fn a_quiet_pod_skips_most_ticks_and_stays_identical() {
    let mut ticked = Pod::from_preset("v4-16").unwrap();
    let mut skipped = Pod::from_preset("v4-16").unwrap();
    ticked.run(3_000);
    let stats = skipped.run_skipping(3_000).unwrap();
    assert_eq!(stats.ticks(), 3_000);
    // 8 devices, 1 s heartbeats, 10 ms ticks: a heartbeat (and its
    // delivery, exchange and sample) every 125 ms leaves most ticks idle.
    assert!(stats.skipped > 2_000, "{stats:?}");
    assert_eq!(
        ticked.world_sha256().unwrap(),
        skipped.world_sha256().unwrap()
    );
}

#[test]
fn a_scheduled_fault_is_never_skipped_past() {
    let mut ticked = Pod::from_preset("v4-16").unwrap();
    let mut skipped = Pod::from_preset("v4-16").unwrap();
    for p in [&mut ticked, &mut skipped] {
        p.schedule_fault(1_234 * MS + 1, Fault::KillDevice(DeviceId(3)));
    }
    ticked.run(2_000);
    skipped.run_skipping(2_000).unwrap();
    assert_eq!(ticked.failures(), skipped.failures());
    assert_eq!(skipped.failures().len(), 1);
    assert_eq!(
        ticked.world_sha256().unwrap(),
        skipped.world_sha256().unwrap()
    );
}

/// Ticks a host system saw.
#[derive(bevy_ecs::prelude::Resource, Default)]
struct Count(u64);

fn bump(mut count: bevy_ecs::prelude::ResMut<Count>) {
    count.0 += 1;
}

#[test]
fn host_systems_fall_back_to_single_ticks() {
    use bevy_ecs::prelude::*;
    use optirs_tpu::schedule::StepSystems;
    let mut pod = Pod::from_preset("v4-16").unwrap();
    pod.world_mut().init_resource::<Count>();
    pod.add_systems(bump.in_set(StepSystems::Monitor)).unwrap();
    let stats = pod.run_skipping(500).unwrap();
    assert_eq!(stats.skipped, 0);
    assert_eq!(pod.world().resource::<Count>().0, 500);
}

#[test]
fn systems_added_through_the_world_fall_back_too() {
    use bevy_ecs::prelude::*;
    use bevy_ecs::schedule::Schedules;
    use optirs_tpu::schedule::{Step, StepSystems};
    let mut pod = Pod::from_preset("v4-16").unwrap();
    pod.world_mut().init_resource::<Count>();
    pod.world_mut()
        .resource_mut::<Schedules>()
        .add_systems(Step, bump.in_set(StepSystems::Monitor));
    let stats = pod.run_skipping(300).unwrap();
    assert_eq!((stats.skipped, pod.world().resource::<Count>().0), (0, 300));
}

#[test]
fn periodic_checkpoints_are_written_on_their_ticks() {
    let dir = std::env::temp_dir().join(format!("optirs-skip-{}", std::process::id()));
    let (a, b) = (dir.join("a"), dir.join("b"));
    let mut ticked = Pod::from_preset("v4-16").unwrap();
    let mut skipped = Pod::from_preset("v4-16").unwrap();
    ticked
        .enable_periodic_checkpoints(97, vec![a.clone()], 3)
        .unwrap();
    skipped
        .enable_periodic_checkpoints(97, vec![b.clone()], 3)
        .unwrap();
    ticked.run(400);
    skipped.run_skipping(400).unwrap();
    let names = |root: &std::path::Path| {
        let mut v: Vec<_> = std::fs::read_dir(root)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&a), names(&b));
    assert!(!names(&a).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
