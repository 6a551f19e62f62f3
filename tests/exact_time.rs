//! Exact time in training: steps end at their modeled nanosecond, every
//! kill recovers whatever tick it lands in, checkpoint writes cost their
//! modeled time, and a run resumes bit for bit from its checkpoints.

use std::process::{Command, Output};

use ndarray::{ArrayD, IxDyn};
use optirs_tpu::Pod;
use optirs_tpu::health::Fault;
use optirs_tpu::optimizers::Adam;
use optirs_tpu::sharding::ledger::TimeParts;
use optirs_tpu::sharding::{ParamSet, RecoveryPolicy, StepPhase};
use optirs_tpu::topology::{DeviceId, load_preset};
use optirs_tpu::tpu::sharded::{CheckpointWrite, WriteOutcome};
use optirs_tpu::tpu::{ShardedOptimizer, ShardingConfig};
use optirs_tpu::training::{RunPlan, run_steps};
use proptest::prelude::*;

#[path = "common/binary.rs"]
mod binary;
use binary::optirs;

fn json(output: &Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("stdout is one JSON value")
}

/// The ledger's parts of a `train --json` report, checked to add up.
fn parts(report: &serde_json::Value) -> [u64; 7] {
    let t = &report["time_ns"];
    let get = |k: &str| t[k].as_u64().unwrap_or_else(|| panic!("{k} in {t}"));
    let p = [
        get("productive_ns"),
        get("undone_ns"),
        get("cut_off_ns"),
        get("checkpoint_write_ns"),
        get("recovery_ns"),
        get("other_ns"),
        get("total_ns"),
    ];
    assert_eq!(p[..6].iter().sum::<u64>(), p[6], "{t}");
    assert_eq!(p[5], 0, "time nothing explains: {t}");
    let goodput = report["goodput"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&goodput), "{goodput}");
    assert!(
        (goodput - p[0] as f64 / p[6] as f64).abs() <= 1e-15,
        "{goodput}"
    );
    let simulated = report["simulated_seconds"].as_f64().unwrap();
    assert!((simulated - p[6] as f64 * 1e-9).abs() <= 1e-15 * simulated.max(1.0));
    p
}

#[test]
fn a_failure_free_run_does_not_depend_on_the_tick() {
    let mut goodputs = Vec::new();
    let mut totals = Vec::new();
    for tick_ms in ["0.001", "0.01", "1", "5"] {
        let report = json(&optirs(&[
            "train",
            "v4-16",
            "--params",
            "100000",
            "--steps",
            "10",
            "--tick-ms",
            tick_ms,
            "--json",
        ]));
        let p = parts(&report);
        assert_eq!(report["steps_completed"], 10);
        goodputs.push(report["goodput"].as_f64().unwrap());
        totals.push(p[6]);
    }
    // Every step's own time, back to back: goodput 1 at every tick.
    for g in &goodputs {
        assert!((g - 1.0).abs() < 1e-9, "{goodputs:?}");
    }
    assert!(totals.windows(2).all(|w| w[0] == w[1]), "{totals:?}");
}

#[test]
fn checkpoint_writes_cost_their_bytes_over_the_storage_bandwidth() {
    let base = [
        "train", "v4-16", "--params", "100000", "--steps", "10", "--json",
    ];
    let plain = json(&optirs(&base));
    let with = json(&optirs(
        &[&base[..], &["--checkpoint-every", "0.00002"]].concat(),
    ));
    let (p, w) = (parts(&plain), parts(&with));
    let checkpoints = &with["checkpoints"];
    let written = checkpoints["written"].as_u64().unwrap();
    assert!(written >= 2, "{checkpoints}");
    // 100000 f32 parameters and Adam's two slots: 1.2 MB at 1 GB/s on
    // each of v4-16's two hosts.
    let io = checkpoints["io_seconds"].as_f64().unwrap();
    assert!((io - 1.2e6 / 2e9).abs() < 1e-12, "{io}");
    let write_ns = (io * 1e9).ceil() as u64;
    assert_eq!(w[3], written * write_ns);
    assert_eq!(w[0], p[0], "the same steps");
    assert_eq!(w[6], p[6] + written * write_ns);
    assert!(with["goodput"].as_f64().unwrap() < plain["goodput"].as_f64().unwrap());
}

#[test]
fn a_kill_where_a_step_ends_recovers_under_every_policy() {
    for (params, kill) in [
        ("1000000", "3@0.00017"),
        ("1000", "3@0.00001"),
        ("1000", "3@0.00002"),
        ("1000", "3@0.000005"),
    ] {
        for policy in ["redundant", "rollback"] {
            let out = optirs(&[
                "train",
                "v4-16",
                "--params",
                params,
                "--steps",
                "4",
                "--kill",
                kill,
                "--recovery",
                policy,
                "--checkpoint-every",
                "0.000001",
                "--json",
            ]);
            let report = json(&out);
            parts(&report);
            assert_eq!(report["steps_completed"], 4, "{params} {kill} {policy}");
            assert_eq!(report["chips_at_end"], 7, "{params} {kill} {policy}");
            assert_eq!(report["recoveries"].as_array().unwrap().len(), 1);
        }
    }
}

/// A small model on v4-16, as `train` runs it: step checkpoints into
/// `root` under rollback, and a kill of device 3 at `kill_ns`, stepped by
/// the training layer's loop.
fn run(policy: RecoveryPolicy, kill_ns: Option<u64>, root: &std::path::Path) -> Outcome {
    let mut topology = load_preset("v4-16").unwrap();
    topology.tick_ns = 10_000;
    let mut pod = Pod::from_topology(topology).unwrap();
    if let Some(at) = kill_ns {
        pod.schedule_fault(at, Fault::KillDevice(DeviceId(3)));
    }
    let params = ParamSet::new()
        .with("w", ArrayD::from_elem(IxDyn(&[3000]), 0.5f32))
        .unwrap();
    let sharding = ShardingConfig {
        recovery: policy,
        ..ShardingConfig::default()
    };
    let mut opt = ShardedOptimizer::on_pod(Adam::new(1e-3f32), pod, params, sharding).unwrap();
    opt.enable_step_checkpoints(1, root.to_path_buf(), 3)
        .unwrap();
    let plan = RunPlan {
        steps: 4,
        seed: 1,
        kills: kill_ns.map_or_else(Vec::new, |at| vec![(3, at as f64 * 1e-9)]),
        optimizer: "adam".into(),
    };
    let ran = run_steps(&mut opt, &plan, &|| false, &mut |_| {})
        .unwrap_or_else(|e| panic!("kill at {kill_ns:?} under {policy}: {e}"));
    Outcome {
        steps_completed: opt.steps_completed(),
        devices: opt.layout().unwrap().devices(),
        parts: ran.ledger.parts(),
        sha: opt.pod_mut().world_sha256().unwrap(),
        steps: ran
            .reports
            .iter()
            .map(|r| (r.launched_at_ns, r.completed_at_ns, r.spans.clone()))
            .collect(),
        phases: ran.failures.iter().map(|f| f.phase).collect(),
        writes: ran.writes,
        lost_steps: opt.recoveries().iter().map(|r| r.lost_steps).collect(),
    }
}

struct Outcome {
    steps_completed: u64,
    devices: usize,
    parts: TimeParts,
    sha: String,
    /// Each completed step's launch, end and phases (seconds from launch).
    steps: Vec<(u64, u64, Vec<optirs_tpu::sharding::Span>)>,
    phases: Vec<StepPhase>,
    writes: Vec<CheckpointWrite>,
    lost_steps: Vec<u64>,
}

/// Kill times around every phase boundary and step end of the first two
/// steps of a failure-free run: before, at and after each.
fn kill_times() -> Vec<u64> {
    let dir = tempfile::tempdir().unwrap();
    let clean = run(RecoveryPolicy::Redundant, None, dir.path());
    let mut times = vec![];
    for (launched, completed, spans) in clean.steps.iter().take(2) {
        for t in [*launched, *completed] {
            times.extend([t.saturating_sub(1), t, t + 1]);
        }
        for span in spans {
            for s in [span.start_seconds, span.end_seconds] {
                let t = launched + (s * 1e9).round() as u64;
                times.extend([t.saturating_sub(1), t, t + 1]);
            }
        }
    }
    times.sort_unstable();
    times.dedup();
    times
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn every_kill_recovers_deterministically_with_goodput_at_most_one(
        pick in any::<prop::sample::Index>(),
        redundant in any::<bool>(),
    ) {
        let times = kill_times();
        let kill = times[pick.index(times.len())];
        let policy = if redundant { RecoveryPolicy::Redundant } else { RecoveryPolicy::Rollback };
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let first = run(policy, Some(kill), a.path());
        prop_assert_eq!(first.steps_completed, 4);
        prop_assert_eq!(first.devices, 7);
        prop_assert_eq!(first.phases.len(), 1, "one failure at {}", kill);
        prop_assert_eq!(first.parts.accounted_ns(), first.parts.total_ns);
        prop_assert_eq!(first.parts.other_ns, 0);
        prop_assert!(first.parts.goodput() <= 1.0 && first.parts.goodput() > 0.0);
        let second = run(policy, Some(kill), b.path());
        prop_assert_eq!(&first.sha, &second.sha);
        prop_assert_eq!(first.parts, second.parts);
    }
}

#[test]
fn a_kill_at_a_step_boundary_fails_the_next_step_at_its_launch_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let clean = run(RecoveryPolicy::Redundant, None, dir.path());
    let end_of_first = clean.steps[0].1;
    let dir = tempfile::tempdir().unwrap();
    let killed = run(RecoveryPolicy::Redundant, Some(end_of_first), dir.path());
    assert_eq!(killed.phases, vec![StepPhase::Launch]);
    assert_eq!(killed.steps_completed, 4);
    assert_eq!(killed.parts.cut_off_ns, 0);
}

#[test]
fn a_device_lost_mid_write_voids_the_checkpoint_and_rollback_restarts_from_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let clean = run(RecoveryPolicy::Rollback, None, dir.path());
    let first = &clean.writes[0];
    // 3000 f32 parameters and Adam's two slots over v4-16's two hosts.
    assert_eq!(first.ended_at_ns - first.started_at_ns, 18_000);
    assert_eq!(first.started_at_ns, clean.steps[0].1, "at the step's end");
    let dir = tempfile::tempdir().unwrap();
    let killed = run(
        RecoveryPolicy::Rollback,
        Some(first.started_at_ns + 9_000),
        dir.path(),
    );
    assert!(
        matches!(killed.writes[0].outcome, WriteOutcome::Voided { device } if device == DeviceId(3)),
        "{:?}",
        killed.writes[0]
    );
    assert_eq!(killed.writes[0].ended_at_ns, first.started_at_ns + 9_000);
    // Nothing reached disk: the next step fails at its launch and the
    // rollback goes back to the model as it began.
    assert_eq!(killed.phases, vec![StepPhase::Launch]);
    assert_eq!(killed.lost_steps, vec![1]);
    assert_eq!(killed.steps_completed, 4);
    assert_eq!(killed.parts.undone_ns, clean.steps[0].1 - clean.steps[0].0);
    assert_eq!(killed.parts.accounted_ns(), killed.parts.total_ns);
}

#[test]
fn resume_needs_the_runs_checkpoint_interval_and_its_own_kills() {
    let out = optirs(&["train", "v4-16", "--resume", "/nonexistent"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--checkpoint-every"), "{stderr}");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let args = [
        "train",
        "v4-16",
        "--params",
        "5000",
        "--checkpoint-every",
        "0.00001",
    ];
    json(&optirs(
        &[
            &args[..],
            &["--steps", "3", "--checkpoint-dir", d, "--json"],
        ]
        .concat(),
    ));
    // The checkpoint carries the run's faults still to come (none here).
    let out = optirs(
        &[
            &args[..],
            &["--steps", "5", "--resume", d, "--kill", "2@0.6"],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("none") && stderr.contains("2@0.6"),
        "{stderr}"
    );
}

#[test]
fn train_resumes_from_its_checkpoint_dir_bit_for_bit() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (da, db) = (a.path().to_str().unwrap(), b.path().to_str().unwrap());
    let args = [
        "train",
        "v4-16",
        "--params",
        "20000,17",
        "--checkpoint-every",
        "0.00001",
        "--json",
    ];
    let straight = json(&optirs(
        &[&args[..], &["--steps", "6", "--checkpoint-dir", da]].concat(),
    ));
    let first = json(&optirs(
        &[&args[..], &["--steps", "3", "--checkpoint-dir", db]].concat(),
    ));
    assert_eq!(first["steps_completed"], 3);
    let resumed = json(&optirs(
        &[&args[..], &["--steps", "6", "--resume", db]].concat(),
    ));
    assert_eq!(resumed["steps_completed"], 6);
    assert!(resumed["resumed_from"]["steps_completed"].as_u64().unwrap() >= 1);
    assert_eq!(resumed["world_sha256"], straight["world_sha256"]);

    // A fresh run into a directory holding this model's checkpoints is
    // refused (rollback would restore the earlier run's).
    let out = optirs(&[&args[..], &["--steps", "2", "--checkpoint-dir", db]].concat());
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--resume"), "{stderr}");

    // Another model's directory is refused before any work, naming both.
    for other in [
        &["--params", "20000,18"][..],
        &["--params", "20000,17", "--optimizer", "sgd"][..],
    ] {
        let mut line = vec![
            "train",
            "v4-16",
            "--checkpoint-every",
            "0.00001",
            "--steps",
            "2",
        ];
        line.extend_from_slice(other);
        for dir_flag in ["--checkpoint-dir", "--resume"] {
            let out = optirs(&[&line[..], &[dir_flag, db]].concat());
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{stderr}");
            assert!(
                stderr.contains("another run") && stderr.contains("[20000]"),
                "{stderr}"
            );
            assert!(!stderr.contains("panicked"), "{stderr}");
        }
    }
}

const CUBES: &str = "assets/pods/examples/v4-4x4x8-cubes.ron";

#[test]
fn a_spare_cube_run_waits_out_its_swap_in_seconds_not_minutes() {
    let started = std::time::Instant::now();
    let report = json(&optirs(&[
        "train",
        CUBES,
        "--params",
        "4096",
        "--steps",
        "8",
        "--kill",
        "5@0.00007",
        "--checkpoint-every",
        "0.00003",
        "--recovery",
        "spare-cube",
        "--json",
    ]));
    let took = started.elapsed();
    assert!(took.as_secs() < 60, "took {took:?}");
    let p = parts(&report);
    assert_eq!(report["steps_completed"], 8);
    let recoveries = report["recoveries"].as_array().unwrap();
    assert_eq!(recoveries.len(), 1, "{recoveries:?}");
    assert_eq!(recoveries[0]["policy"], "spare-cube");
    // The 10 s OCS reconfiguration is recovery time, and the pod keeps
    // every device.
    assert!(p[4] >= 10_000_000_000, "{p:?}");
    assert_eq!(report["chips_at_end"], 128);
}

#[test]
fn a_spare_cube_run_with_no_free_spare_rolls_back_onto_the_survivors() {
    // Two cubes fail at once and the pod has one spare.
    let report = json(&optirs(&[
        "train",
        CUBES,
        "--params",
        "4096",
        "--steps",
        "4",
        "--kill",
        "5@0.00007",
        "--kill",
        "100@0.00007",
        "--checkpoint-every",
        "0.00003",
        "--recovery",
        "spare-cube",
        "--json",
    ]));
    parts(&report);
    assert_eq!(report["steps_completed"], 4);
    let recoveries = report["recoveries"].as_array().unwrap();
    assert_eq!(recoveries.len(), 1, "{recoveries:?}");
    assert_eq!(recoveries[0]["policy"], "rollback");
    let note = recoveries[0]["note"].as_str().unwrap();
    assert!(note.contains("no spare cube"), "{note}");
    assert_eq!(report["chips_at_end"], 126);
}

/// Sends `signal` to a long `train` once it has written a checkpoint into
/// its temporary directory, and checks that it stops and removes it.
#[cfg(target_os = "linux")]
fn stop_with(signal: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_optirs-tpu"))
        .args([
            "train",
            "v4-16",
            "--params",
            "20000",
            "--steps",
            "1000000",
            "--checkpoint-every",
            "0.00001",
        ])
        .env("TMPDIR", tmp.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let has_checkpoint = || {
        std::fs::read_dir(tmp.path()).unwrap().flatten().any(|run| {
            std::fs::read_dir(run.path()).is_ok_and(|mut d| {
                d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("tick-")))
            })
        })
    };
    let started = std::time::Instant::now();
    while !has_checkpoint() {
        assert!(started.elapsed().as_secs() < 120, "no checkpoint written");
        assert!(child.try_wait().unwrap().is_none(), "train ended early");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed().as_secs() < 240, "train did not stop");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("stopped by a signal"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[cfg(target_os = "linux")]
#[test]
fn sigterm_and_sigint_stop_train_at_a_step_boundary_and_leave_no_temporary_checkpoints() {
    stop_with("TERM");
    stop_with("INT");
}

#[test]
fn a_kill_on_a_tick_boundary_inside_a_step_fails_that_step_at_every_tick() {
    // Step 3 of this model runs from 14.326 µs to 21.489 µs; the kill at
    // 20 µs is on the 10 µs tick grid, one boundary after the launch.
    let mut seen = Vec::new();
    for tick_ms in ["0.001", "0.003", "0.01", "0.02"] {
        let report = json(&optirs(&[
            "train",
            "v4-16",
            "--params",
            "1000",
            "--steps",
            "4",
            "--kill",
            "3@0.00002",
            "--recovery",
            "redundant",
            "--tick-ms",
            tick_ms,
            "--json",
        ]));
        let f = &report["failures"][0];
        assert_eq!(f["step"], 3, "--tick-ms {tick_ms}: {f}");
        assert_eq!(f["at_seconds"], 2e-5, "--tick-ms {tick_ms}: {f}");
        seen.push((report["time_ns"].clone(), f["phase"].clone()));
    }
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:?}");
}
