//! One set of rules for every command line: the same parsers, units and
//! exit codes in `run`, `topology`, `collectives`, `bench` and
//! `checkpoint`; output paths checked before any work.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

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

/// Asserts a refusal: exit code 2, one `error:` line containing each of
/// `names`, nothing on stdout, no panic.
fn refused(args: &[&str], names: &[&str]) -> String {
    let out = optirs(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    assert!(out.stdout.is_empty(), "{args:?}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    // clap adds a usage hint after its own one-line error.
    let first = lines.first().copied().unwrap_or_default();
    assert!(first.starts_with("error:"), "{args:?}: {stderr}");
    for name in names {
        assert!(first.contains(name), "{args:?}: `{name}` not in {first:?}");
    }
    stderr
}

#[test]
fn every_bad_value_of_run_exits_2_naming_the_flag_and_value() {
    for value in ["0", "-1", "nan", "inf", "1e300", "1.5", "1e-300"] {
        refused(&["run", "v4-16", "--steps", value], &["--steps", value]);
    }
    for flag in ["--kill", "--pause"] {
        for value in ["5@nan", "5@-1", "5@1e300", "5@inf", "x@1", "5"] {
            refused(&["run", "v4-16", flag, value], &[flag, value]);
        }
    }
    for value in ["0", "-1", "nan", "inf", "1e300"] {
        refused(
            &[
                "run",
                "v4-16",
                "--checkpoint-every",
                value,
                "--checkpoint-dir",
                "d",
            ],
            &["--checkpoint-every", value],
        );
        refused(
            &["run", "v4-16", "--rank-timeout", value],
            &["--rank-timeout", value],
        );
    }
    refused(
        &["run", "v4-16", "--keep-checkpoints", "0"],
        &["--keep-checkpoints"],
    );
    // Checked against the pod, still before any work.
    refused(
        &["run", "v4-16", "--kill", "99@1"],
        &["--kill", "device 99 does not exist", "0 to 7"],
    );
    let after_the_end = refused(
        &["run", "v4-16", "--steps", "10", "--kill", "5@30"],
        &["--kill 5@30", "after the run ends", "10 ticks"],
    );
    assert_eq!(after_the_end.lines().count(), 1, "{after_the_end}");
    // A checkpoint period that is not a whole number of 10 ms ticks.
    refused(
        &[
            "run",
            "v4-16",
            "--checkpoint-every",
            "0.015",
            "--checkpoint-dir",
            "d",
        ],
        &["--checkpoint-every 0.015", "10.000 ms", "ticks"],
    );
}

#[test]
fn run_counts_steps_like_train_and_checkpoints_every_simulated_seconds() {
    let report = json(&optirs(&["run", "v4-16", "--steps", "1e2", "--json"]));
    assert_eq!(report["ticks"], 100);
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ckpt");
    // v4-16 ticks at 10 ms: every 0.3 s is every 30 ticks.
    let out = optirs(&[
        "run",
        "v4-16",
        "--steps",
        "1e2",
        "--checkpoint-every",
        "0.3",
        "--checkpoint-dir",
        dir.to_str().unwrap(),
        "--keep-checkpoints",
        "5",
        "--json",
    ]);
    json(&out);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "tick-000000000030",
            "tick-000000000060",
            "tick-000000000090"
        ]
    );
}

#[test]
fn run_restore_takes_the_pod_from_the_checkpoint() {
    let root = tempfile::tempdir().unwrap();
    let saved = root.path().join("saved");
    let saved = saved.to_str().unwrap();
    let out = optirs(&[
        "checkpoint",
        "save",
        "v4-16",
        "--steps",
        "1e2",
        "--out",
        saved,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("at tick 100") && stdout.contains("KiB"),
        "{stdout}"
    );
    let continued = json(&optirs(&[
        "run",
        "--restore",
        saved,
        "--steps",
        "50",
        "--json",
    ]));
    assert_eq!(continued["pod"], "v4-16");
    assert_eq!(continued["ticks"], 150);
    let straight = json(&optirs(&["run", "v4-16", "--steps", "150", "--json"]));
    assert_eq!(continued["world_sha256"], straight["world_sha256"]);
    // A save never writes into an existing directory, and says so first.
    refused(
        &[
            "checkpoint",
            "save",
            "v4-16",
            "--steps",
            "1",
            "--out",
            saved,
        ],
        &["--out", saved, "already exists"],
    );
    refused(
        &["checkpoint", "restore", saved, "--steps", "-1"],
        &["--steps", "-1"],
    );
    let fresh = root.path().join("fresh");
    refused(
        &[
            "checkpoint",
            "save",
            "v4-16",
            "--steps",
            "1e15",
            "--out",
            fresh.to_str().unwrap(),
        ],
        &["--steps 1e15", "1e13 s of simulated time"],
    );
    assert!(!fresh.exists());
}

#[test]
fn a_paused_then_killed_device_is_dated_from_its_pause() {
    let report = json(&optirs(&[
        "run", "v4-16", "--steps", "3000", "--pause", "5@2", "--kill", "5@3", "--json",
    ]));
    let failures = report["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{report}");
    let row = &failures[0];
    assert_eq!(row["device"], 5);
    assert_eq!(row["injected_at_s"].as_f64(), Some(2.0), "{row}");
    let detected = row["detected_at_s"].as_f64().unwrap();
    let latency = row["detection_latency_s"].as_f64().unwrap();
    assert!((latency - (detected - 2.0)).abs() < 1e-9, "{row}");
    // The detector times silence from the last heartbeat (1 s interval,
    // 10 s timeout): it went out in the second before the pause, so
    // detection comes 9 to 11 s after the pause. Dated from the kill (3 s)
    // it looked like 8.6 s.
    assert!(latency > 9.0 && latency <= 11.0, "{row}");
}

#[test]
fn run_cuts_a_link_and_refuses_a_pair_without_one() {
    let plain = json(&optirs(&["run", "v4-16", "--steps", "100", "--json"]));
    let cut = json(&optirs(&[
        "run", "v4-16", "--steps", "100", "--cut", "0-1@0.5", "--json",
    ]));
    assert_ne!(plain["world_sha256"], cut["world_sha256"]);
    assert_eq!(cut["failures"].as_array().unwrap().len(), 0, "{cut}");
    // Device 0 and device 7 are opposite corners of the 2x2x2 mesh.
    refused(
        &["run", "v4-16", "--cut", "0-7@1"],
        &["--cut 0-7", "no link between device 0 and device 7"],
    );
    refused(&["run", "v4-16", "--cut", "0-0@1"], &["--cut", "0-0@1"]);
    refused(&["run", "v4-16", "--cut", "0-99@1"], &["device 99"]);
    refused(
        &["run", "v4-16", "--steps", "10", "--cut", "0-1@5"],
        &["--cut 0-1@5", "after the run ends"],
    );
}

#[test]
fn output_paths_are_checked_before_any_work() {
    let root = tempfile::tempdir().unwrap();
    let missing = root.path().join("no/such/dir/x.json");
    let missing = missing.to_str().unwrap();
    // 100,000 ticks would take many seconds; the refusal comes first.
    let start = Instant::now();
    refused(
        &["run", "v4-16", "--steps", "100000", "--trace", missing],
        &["--trace", "does not exist"],
    );
    assert!(start.elapsed() < Duration::from_secs(10));
    let existing = root.path().join("there.json");
    std::fs::write(&existing, "keep").unwrap();
    let existing = existing.to_str().unwrap();
    for args in [
        vec!["run", "v4-16", "--trace", existing],
        vec!["topology", "v4-16", "--svg", existing],
        vec!["collectives", "v4-16", "--sizes", "4K", "--trace", existing],
    ] {
        refused(&args, &[existing, "already exists"]);
    }
    refused(
        &["topology", "v4-16", "--dot", missing],
        &["--dot", "does not exist"],
    );
    refused(
        &[
            "run",
            "v4-16",
            "--checkpoint-every",
            "0.5",
            "--checkpoint-dir",
            existing,
        ],
        &["--checkpoint-dir", "not a directory"],
    );
    assert_eq!(std::fs::read_to_string(existing).unwrap(), "keep");
    // Nothing was left behind by the probes.
    let left: Vec<_> = std::fs::read_dir(root.path()).unwrap().collect();
    assert_eq!(left.len(), 1);
    assert!(!Path::new(missing).exists());
}

#[test]
fn topology_json_never_prints_negative_zero() {
    for pod in [
        "assets/pods/examples/v2-4x2-custom.ron",
        "v2-8",
        "v4-16",
        "v5e-16",
        "v3-64",
        "v4-128",
    ] {
        let out = optirs(&["topology", pod, "--json"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{pod}");
        assert!(!text.contains("-0.0"), "{pod}: {text}");
    }
}

#[test]
fn collectives_and_bench_take_the_shared_counts() {
    for value in ["0", "0K", "-4", "nan", "6", "1e400"] {
        refused(
            &["collectives", "v4-16", "--sizes", value],
            &["--sizes", value],
        );
    }
    let rows = json(&optirs(&[
        "collectives",
        "v4-16",
        "--sizes",
        "4e3,1K",
        "--json",
    ]));
    let bytes: Vec<u64> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(bytes, [4000, 1024]);
    refused(
        &["bench", "schedule", "v4-16", "--compile-runs", "0"],
        &["--compile-runs", "0"],
    );
    refused(
        &["bench", "optimizer", "--steps", "nan"],
        &["--steps", "nan"],
    );
    let bench = json(&optirs(&[
        "bench",
        "schedule",
        "v4-16",
        "--steps",
        "1e1",
        "--compile-runs",
        "1",
        "--json",
    ]));
    assert_eq!(bench["steps"], 10);
}

#[test]
fn run_trace_marks_each_injected_fault_where_it_struck() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("run.json");
    let out = optirs(&[
        "run",
        "v4-16",
        "--steps",
        "1500",
        "--kill",
        "5@1",
        "--cut",
        "0-1@0.5",
        "--trace",
        path.to_str().unwrap(),
        "--json",
    ]);
    json(&out);
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let marker = |name: &str| {
        events
            .iter()
            .find(|e| e["ph"] == "i" && e["name"] == name)
            .unwrap_or_else(|| panic!("no `{name}` marker"))
            .clone()
    };
    assert_eq!(marker("kill device 5")["ts"].as_f64(), Some(1e6));
    assert_eq!(marker("cut link 0-1")["ts"].as_f64(), Some(5e5));
    // The detection span still runs from the fault to its detection.
    assert!(
        events
            .iter()
            .any(|e| e["name"] == "failure (fault → detection)" && e["ts"].as_f64() == Some(1e6)),
        "no failure span from the kill"
    );
}
