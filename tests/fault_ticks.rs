//! A fault inside a tick takes effect at its nanosecond and the run still
//! runs every tick asked for: `Pod::run`, one tick at a time (as `run`
//! steps), the profiler's run (`run --trace`) and `Pod::run_skipping`
//! (`run --skip-idle`) leave the same world for every fault kind at any
//! time; and the binary's `run` says so for its flags.

use optirs_tpu::Pod;
use optirs_tpu::health::Fault;
use optirs_tpu::profile::profiling_integration::ProfilingIntegration;
use optirs_tpu::topology::DeviceId;
use proptest::prelude::*;

#[path = "common/binary.rs"]
mod binary;
use binary::optirs;

/// v4-16's tick, ns.
const TICK_NS: u64 = 10_000_000;

/// A fault of each kind the engine injects, on devices (or the link
/// between neighbours) of v4-16.
fn fault(kind: u8, device: u32, amount_ns: u64) -> Fault {
    let a = DeviceId(device % 8);
    // Devices 0-1, 2-3, … share a link on v4-16's 2x2x2 torus.
    let b = DeviceId((device % 8) ^ 1);
    match kind % 5 {
        0 => Fault::KillDevice(a),
        1 => Fault::PauseDevice(a),
        2 => Fault::CutLink(a, b),
        3 => Fault::DeviceJitter(a, amount_ns),
        _ => Fault::LinkJitter(a, b, amount_ns),
    }
}

fn pod_with(faults: &[(u64, u8, u32, u64)]) -> Pod {
    let mut pod = Pod::from_preset("v4-16").unwrap();
    for &(at_ns, kind, device, amount_ns) in faults {
        pod.schedule_fault(at_ns, fault(kind, device, amount_ns));
    }
    pod
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn every_way_of_running_ticks_lands_on_the_same_world(
        faults in prop::collection::vec(
            (0..400 * TICK_NS, any::<u8>(), 0..8u32, 0..50_000_000u64), 1..5),
        ticks in 1..400u64,
    ) {
        let mut whole = pod_with(&faults);
        whole.run(ticks);

        let mut one_by_one = pod_with(&faults);
        for _ in 0..ticks {
            one_by_one.run(1);
        }

        let mut skipped = pod_with(&faults);
        let stats = skipped.run_skipping(ticks).unwrap();
        prop_assert_eq!(stats.ticks(), ticks);

        let mut profiled = pod_with(&faults);
        let mut last = 0;
        ProfilingIntegration::new().run(&mut profiled, ticks, &mut |done| last = done);
        prop_assert_eq!(last, ticks);

        let digest = whole.world_sha256().unwrap();
        for pod in [&mut one_by_one, &mut skipped, &mut profiled] {
            prop_assert_eq!(pod.clock().tick, ticks);
            prop_assert_eq!(pod.clock().now_ns, ticks * TICK_NS);
            prop_assert_eq!(pod.failures(), whole.failures());
            prop_assert_eq!(pod.world_sha256().unwrap(), digest.clone());
        }
        // Every fault due within the run was applied at its time.
        let end_ns = ticks * TICK_NS;
        let pending = whole.world().resource::<optirs_tpu::health::FaultPlan>().pending.clone();
        prop_assert!(pending.iter().all(|f| f.at_ns > end_ns), "{:?}", pending);
    }
}

/// `run --json`'s ticks and world digest.
fn run_report(args: &[&str]) -> (u64, String) {
    let out = optirs(&[&["run", "v4-16", "--json"][..], args].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        report["ticks"].as_u64().unwrap(),
        report["world_sha256"].as_str().unwrap().to_string(),
    )
}

/// Seconds with every nanosecond, as a user may write them.
fn seconds(ns: u64) -> String {
    format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    #[test]
    fn run_steps_every_tick_and_skip_idle_agrees_at_any_fault_time(
        kill_ns in 0..300 * TICK_NS,
        pause_ns in 0..300 * TICK_NS,
        cut_ns in 0..300 * TICK_NS,
    ) {
        let steps = "300";
        let kill = format!("3@{}", seconds(kill_ns));
        let pause = format!("4@{}", seconds(pause_ns));
        let cut = format!("0-1@{}", seconds(cut_ns));
        let faults = ["--steps", steps, "--kill", &kill, "--pause", &pause, "--cut", &cut];
        let plain = run_report(&faults);
        let skipping = run_report(&[&faults[..], &["--skip-idle"]].concat());
        prop_assert_eq!(plain.0, 300);
        prop_assert_eq!(&plain, &skipping);
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("trace.json");
        let traced = run_report(&[&faults[..], &["--trace", trace.to_str().unwrap()]].concat());
        prop_assert_eq!(&plain, &traced);
    }
}

#[test]
fn a_kill_inside_a_tick_still_runs_every_tick() {
    // 2.5005 s is half-way through tick 250 of 10 ms.
    let plain = run_report(&["--steps", "1000", "--kill", "3@2.5005"]);
    let skipping = run_report(&["--steps", "1000", "--kill", "3@2.5005", "--skip-idle"]);
    assert_eq!(plain.0, 1000);
    assert_eq!(plain, skipping);
    // Three faults inside three ticks of a ten-tick run.
    let (ticks, _) = run_report(&[
        "--steps",
        "10",
        "--kill",
        "3@0.005",
        "--pause",
        "4@0.0071",
        "--cut",
        "0-1@0.0032",
    ]);
    assert_eq!(ticks, 10);
}
