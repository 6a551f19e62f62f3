//! Faults that can never apply are reported before the run, by the plan
//! check and by `run`.

use optirs_tpu::Pod;
use optirs_tpu::clock::SimDuration;
use optirs_tpu::health::Fault;
use optirs_tpu::topology::DeviceId;
use std::process::Command;

const SECOND: u64 = 1_000_000_000;

#[test]
fn the_plan_check_names_faults_that_can_never_apply() {
    let mut pod = Pod::from_preset("v5e-16").unwrap();
    let tick = pod.topology().tick_ns;
    pod.schedule_fault(SimDuration::from_secs(1), Fault::KillDevice(DeviceId(3)));
    pod.schedule_fault(SimDuration::from_secs(2), Fault::PauseDevice(DeviceId(3)));
    pod.schedule_fault(SimDuration::from_secs(2), Fault::PauseDevice(DeviceId(4)));
    pod.schedule_fault(SimDuration::from_secs(50), Fault::KillDevice(DeviceId(5)));
    pod.schedule_fault(
        SimDuration::from_secs(1),
        Fault::CutLink(DeviceId(0), DeviceId(10)),
    );
    let ticks = 10 * SECOND / tick;
    let found = pod.faults_that_cannot_apply(ticks);
    let faults: Vec<Fault> = found.iter().map(|f| f.scheduled.fault).collect();
    assert_eq!(
        faults,
        vec![
            Fault::CutLink(DeviceId(0), DeviceId(10)),
            Fault::PauseDevice(DeviceId(3)),
            Fault::KillDevice(DeviceId(5)),
        ],
        "{found:?}"
    );
    assert!(found[1].to_string().contains("killed at t=1.000 s first"));
    assert!(found[2].to_string().contains("after the run ends"));
    // Running confirms it: exactly those are rejected or left pending.
    pod.run(ticks);
    let plan = pod.world().resource::<optirs_tpu::health::FaultPlan>();
    assert_eq!(plan.rejected.len(), 2);
    assert_eq!(plan.pending.len(), 1);
    // A fault the run does reach is not reported.
    assert!(pod.faults_that_cannot_apply(50 * SECOND / tick).is_empty());
}

#[test]
fn run_refuses_a_pause_after_a_kill_and_a_kill_after_the_last_tick() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_optirs-tpu"))
            .args(args)
            .output()
            .unwrap()
    };
    let output = run(&[
        "run", "v5e-16", "--steps", "100", "--kill", "3@0.2", "--pause", "3@0.5",
    ]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("device 3 is killed at t=0.200 s first"),
        "{stderr}"
    );
    let output = run(&["run", "v5e-16", "--steps", "100", "--kill", "5@30"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("after the run ends"), "{stderr}");
    let output = run(&["run", "v5e-16", "--steps", "100", "--kill", "5@0.5"]);
    assert!(output.status.success());
}
