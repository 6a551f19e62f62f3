//! `train`'s command line refuses what it cannot honour, its text report
//! reads in execution order with its parts adding up, and its trace shows
//! where the simulated time went.

use std::process::Output;

#[path = "common/binary.rs"]
mod binary;
use binary::optirs;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A small, fast run: one bucket of 2000 parameters on v4-16.
const SMALL: &[&str] = &["train", "v4-16", "--params", "2000", "--steps", "3"];

fn with(extra: &[&str]) -> Vec<String> {
    SMALL.iter().chain(extra).map(|s| s.to_string()).collect()
}

fn run(args: &[String]) -> Output {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    optirs(&refs)
}

/// Exit code 2, the error's one line naming `needle` (clap adds a hint
/// line after its own), nothing on stdout, no panic.
fn assert_usage(out: &Output, needle: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let first = err.lines().next().unwrap_or_default();
    assert!(first.starts_with("error: "), "{err}");
    assert!(first.contains(needle), "`{needle}` not in: {err}");
    if !first.contains("invalid value") {
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.stdout.is_empty(), "{}", stdout(out));
}

#[test]
fn a_checkpoint_dir_without_an_interval_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let out = run(&with(&["--checkpoint-dir", ckpt.to_str().unwrap()]));
    assert_usage(&out, "--checkpoint-every");
    assert!(!ckpt.exists(), "nothing created");
}

/// How a split pod moves its collectives' data is no question for one
/// process: the flag is refused, not ignored.
#[test]
fn no_shared_memory_is_refused_in_one_process() {
    assert_usage(&run(&with(&["--no-shared-memory"])), "--no-shared-memory");
    let modeled = ["train", "v5e-256", "--model", "llama2-7b", "--modeled-only"];
    let mut args: Vec<String> = modeled.iter().map(|s| s.to_string()).collect();
    args.push("--no-shared-memory".into());
    assert_usage(&run(&args), "--no-shared-memory");
}

/// `--rank-timeout` bounds the waits between the ranks of a split run;
/// one process waits for none, so the flag is refused there, not ignored.
#[test]
fn rank_timeout_is_refused_in_one_process() {
    assert_usage(
        &run(&with(&["--rank-timeout", "5"])),
        "--rank-timeout 5: a run in one process waits for no other rank",
    );
    let run_command = ["run", "v4-16", "--steps", "2", "--rank-timeout", "5"];
    let args: Vec<String> = run_command.iter().map(|s| s.to_string()).collect();
    assert_usage(&run(&args), "--rank-timeout 5: a run in one process");
}

#[test]
fn a_checkpoint_dir_that_is_a_file_is_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let out = run(&with(&[
        "--checkpoint-every",
        "0.001",
        "--checkpoint-dir",
        file.to_str().unwrap(),
    ]));
    assert_usage(&out, "is a file, not a directory");
    assert!(!stderr(&out).contains("os error"), "{}", stderr(&out));
    // Below a file: cannot be created.
    let below = file.join("ckpt");
    let out = run(&with(&[
        "--checkpoint-every",
        "0.001",
        "--checkpoint-dir",
        below.to_str().unwrap(),
    ]));
    assert_usage(&out, "is a file, not a directory");
    // A missing directory is created.
    let fresh = dir.path().join("a/b");
    let out = run(&with(&[
        "--checkpoint-every",
        "0.00001",
        "--checkpoint-dir",
        fresh.to_str().unwrap(),
        "--json",
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(fresh.is_dir());
}

#[test]
fn a_trace_path_in_a_missing_directory_is_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("no/such/dir/trace.json");
    let started = std::time::Instant::now();
    let out = optirs(&[
        "train",
        "v4-16",
        "--steps",
        "1000000",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert_usage(&out, "does not exist");
    assert!(started.elapsed().as_secs() < 30, "refused before the run");
}

#[test]
fn a_device_killed_twice_is_refused_naming_both_times() {
    let out = run(&with(&[
        "--recovery",
        "redundant",
        "--kill",
        "3@0.002",
        "--kill",
        "3@0.001",
    ]));
    assert_usage(&out, "device 3");
    let err = stderr(&out);
    assert!(err.contains("3@0.001") && err.contains("3@0.002"), "{err}");
}

#[test]
fn a_kill_of_a_device_the_pod_lacks_is_a_bad_value() {
    let out = run(&with(&["--recovery", "redundant", "--kill", "99@0.001"]));
    assert_usage(&out, "device 99 does not exist");
}

#[test]
fn a_kill_after_the_run_ended_is_an_error_naming_it_and_the_end() {
    let out = run(&with(&["--recovery", "redundant", "--kill", "3@100"]));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--kill 3@100 never happened") && err.contains("the run ended at"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    // The run itself is reported.
    assert!(stdout(&out).contains("goodput"), "{}", stdout(&out));
}

#[test]
fn a_checkpoint_interval_shorter_than_a_tick_writes_at_every_step_boundary() {
    // Time is exact: a write is due at the first step boundary after its
    // interval, whatever the tick, and each costs its modeled time.
    let out = run(&with(&["--checkpoint-every", "1e-9", "--json"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["checkpoints"]["written"], 3, "{report}");
    let io = report["checkpoints"]["io_seconds"].as_f64().unwrap();
    let written_ns = report["time_ns"]["checkpoint_write_ns"].as_u64().unwrap();
    assert_eq!(written_ns, 3 * (io * 1e9).round() as u64, "{report}");
    let total = report["time_ns"]["total_ns"].as_u64().unwrap();
    let productive = report["time_ns"]["productive_ns"].as_u64().unwrap();
    assert_eq!(productive + written_ns, total, "{report}");
}

#[test]
fn a_kill_without_checkpoints_under_rollback_is_a_bad_value() {
    let out = run(&with(&["--kill", "3@0.0001"]));
    assert_usage(&out, "needs --checkpoint-every");
}

#[test]
fn learning_rates_outside_f32_are_refused() {
    for bad in ["1e300", "-1e300", "1e-300", "nan", "inf"] {
        let out = run(&with(&["--lr", bad]));
        assert_usage(&out, bad);
    }
    for good in ["0", "-1", "1e3"] {
        let out = run(&with(&["--lr", good, "--json"]));
        assert!(out.status.success(), "--lr {good}: {}", stderr(&out));
    }
}

#[test]
fn a_seed_reads_as_a_count_does_and_zero_is_a_seed() {
    let digest = |seed: &str| {
        let out = run(&with(&["--seed", seed, "--json"]));
        assert!(out.status.success(), "--seed {seed}: {}", stderr(&out));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        report["world_sha256"].as_str().unwrap().to_string()
    };
    assert_eq!(digest("1e3"), digest("1000"));
    assert_ne!(digest("0"), digest("1000"));
    for bad in ["-1", "nan", "1.5"] {
        assert_usage(&run(&with(&["--seed", bad])), "is not a seed");
    }
}

#[test]
fn every_bad_value_of_every_flag_exits_2_with_one_line() {
    for (flag, value) in [
        ("--params", "0"),
        ("--params", "-1"),
        ("--params", "nan"),
        ("--params", "1e300"),
        ("--steps", "0"),
        ("--steps", "1e300"),
        ("--steps", "-1"),
        ("--bucket-bytes", "0"),
        ("--bucket-bytes", "nan"),
        ("--checkpoint-every", "0"),
        ("--checkpoint-every", "-1"),
        ("--checkpoint-every", "nan"),
        ("--checkpoint-every", "1e300"),
        ("--tick-ms", "0"),
        ("--tick-ms", "nan"),
        ("--tick-ms", "-1"),
        ("--tick-ms", "1e300"),
        ("--tick-ms", "2000"),
        ("--kill", "1@nan"),
        ("--kill", "1@-1"),
        ("--kill", "1@1e300"),
        ("--seed", "-1"),
        ("--rank-timeout", "0"),
        ("--rank-timeout", "nan"),
    ] {
        let out = run(&with(&["--recovery", "redundant", flag, value]));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(!err.contains("panicked"), "{flag} {value}: {err}");
    }
}

#[test]
fn the_text_report_lists_phases_in_execution_order_and_reads_as_a_person_writes() {
    let out = optirs(&[
        "train",
        "v4-16",
        "--params",
        "4000",
        "--steps",
        "2",
        "--bucket-bytes",
        "4096",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(out.stderr.is_empty(), "no spinner or bar off a terminal");
    let text = stdout(&out);
    let position = |key: &str| {
        text.find(&format!("  {key} "))
            .unwrap_or_else(|| panic!("{key} in {text}"))
    };
    let rs = position("reduce_scatter.axis0");
    let update = position("update");
    let ag = position("all_gather.axis0");
    let exposed = position("exposed_communication");
    assert!(rs < update && update < ag && ag < exposed, "{text}");
    assert!(
        text.contains("KiB") || text.contains("MiB"),
        "sizes in binary units: {text}"
    );
    assert!(text.contains("(8 devices at the end)"), "{text}");
}

#[test]
fn a_recovery_is_reported_with_parts_that_add_up() {
    let out = optirs(&[
        "train",
        "v4-16",
        "--params",
        "100000",
        "--steps",
        "30",
        "--kill",
        "5@0.001",
        "--checkpoint-every",
        "0.0001",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let recovery = &report["recoveries"][0];
    let total = recovery["recovery_seconds"].as_f64().unwrap();
    let parts: f64 = ["read_seconds", "reconfigure_seconds", "reshard_seconds"]
        .iter()
        .map(|k| recovery[*k].as_f64().unwrap())
        .sum();
    assert!(total > 0.0);
    assert!((parts - total).abs() <= 1e-12 * total, "{parts} vs {total}");
    assert!(
        recovery["read_seconds"].as_f64().unwrap() > 0.0,
        "a rollback reads"
    );
    let failure = &report["failures"][0];
    assert!(
        failure["launched_at_seconds"].as_f64().unwrap() <= failure["at_seconds"].as_f64().unwrap()
    );
    assert!(
        failure["killed_at_seconds"].as_f64().unwrap() <= failure["at_seconds"].as_f64().unwrap()
    );

    let text = optirs(&[
        "train",
        "v4-16",
        "--params",
        "100000",
        "--steps",
        "30",
        "--kill",
        "5@0.001",
        "--checkpoint-every",
        "0.0001",
    ]);
    let text = stdout(&text);
    assert!(
        text.contains("checkpoint read") && text.contains(" + re-shard"),
        "{text}"
    );
    assert!(text.contains("lost device 5,"), "{text}");
    assert!(
        text.contains("% in steps that count") && text.contains("% recovering"),
        "where the time went: {text}"
    );
    assert!(!text.contains("1 steps"), "{text}");
}

/// One track's spans: (start µs, end µs, name).
type Spans = Vec<(f64, f64, String)>;

/// Per (pid, tid), the complete spans in time order never overlap.
fn assert_no_overlap(events: &[serde_json::Value]) {
    let mut tracks: std::collections::BTreeMap<(i64, i64), Spans> = Default::default();
    for e in events.iter().filter(|e| e["ph"] == "X") {
        let ts = e["ts"].as_f64().unwrap();
        let dur = e["dur"].as_f64().unwrap();
        assert!(dur >= 0.0, "{e}");
        tracks
            .entry((e["pid"].as_i64().unwrap(), e["tid"].as_i64().unwrap()))
            .or_default()
            .push((ts, ts + dur, e["name"].as_str().unwrap().to_string()));
    }
    for (track, mut spans) in tracks {
        spans.sort_by(|a, b| a.0.total_cmp(&b.0));
        for pair in spans.windows(2) {
            // 1e-6 µs: the float rounding of adjacent spans' ends.
            assert!(
                pair[1].0 >= pair[0].1 - 1e-6,
                "track {track:?}: {:?} overlaps {:?}",
                pair[0],
                pair[1]
            );
        }
    }
}

#[test]
fn the_trace_marks_the_failed_step_its_recovery_by_part_waits_and_checkpoint_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.json");
    let out = optirs(&[
        "train",
        "v4-16",
        "--params",
        "100000",
        "--steps",
        "30",
        "--kill",
        "5@0.001",
        "--checkpoint-every",
        "0.0001",
        "--trace",
        path.to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    assert_no_overlap(events);
    let run_pid = 8;
    let named = |cat: &str| -> Vec<&serde_json::Value> {
        events
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"] == run_pid && e["cat"] == cat)
            .collect()
    };
    // Every completed step, and the failed one marked with its cause.
    let steps = named("step");
    assert_eq!(
        steps.len() as u64,
        report["steps_attempted"].as_u64().unwrap()
            - report["failures"].as_array().unwrap().len() as u64
    );
    let failed = named("failure");
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["args"]["failed"], true);
    assert!(
        failed[0]["args"]["cause"]
            .as_str()
            .unwrap()
            .contains("device 5"),
        "{}",
        failed[0]
    );
    // The recovery, and its parts adding up to it, one after another.
    let recovery = named("recovery");
    let whole: Vec<_> = recovery.iter().filter(|e| e["tid"] == 0).collect();
    let parts: Vec<_> = recovery.iter().filter(|e| e["tid"] == 2).collect();
    assert_eq!(whole.len(), 1);
    assert!(parts.len() >= 2, "checkpoint read and re-shard");
    let part_sum: f64 = parts.iter().map(|e| e["dur"].as_f64().unwrap()).sum();
    let whole_dur = whole[0]["dur"].as_f64().unwrap();
    assert!((part_sum - whole_dur).abs() <= 1e-9 * whole_dur.max(1.0));
    assert_eq!(parts[0]["ts"], whole[0]["ts"]);
    assert!(parts.iter().any(|e| e["name"] == "checkpoint read"));
    // The kill, the wait until the step saw it, and checkpoint writes.
    assert!(
        events
            .iter()
            .any(|e| e["ph"] == "i" && e["name"] == "device 5 killed")
    );
    assert!(events.iter().any(|e| e["name"] == "detection wait"));
    assert!(!named("checkpoint").is_empty());
    // The timeline track covers the run from its first step to its end
    // without a hole: every gap is a wait span.
    let mut timeline: Vec<(f64, f64)> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["pid"] == run_pid && e["tid"] == 0)
        .map(|e| {
            let ts = e["ts"].as_f64().unwrap();
            (ts, ts + e["dur"].as_f64().unwrap())
        })
        .collect();
    timeline.sort_by(|a, b| a.0.total_cmp(&b.0));
    for pair in timeline.windows(2) {
        assert!((pair[1].0 - pair[0].1).abs() <= 1e-6, "{pair:?}");
    }
    // Every device still has its compute and communication spans.
    for device in 0..8 {
        assert!(
            events
                .iter()
                .any(|e| e["pid"] == device && e["cat"] == "compute"),
            "device {device}"
        );
    }
}

#[test]
fn a_model_too_large_for_this_host_is_refused_in_binary_units() {
    let out = optirs(&["train", "v4-16", "--params", "1e12"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("18.19 TiB on this host"), "{err}");
    assert!(!err.contains("20000000000000"), "{err}");
}

#[test]
fn an_fsdp_trace_shows_each_buckets_gathers_uses_frees_and_reduce_scatter_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fsdp.json");
    let out = optirs(&[
        "train",
        "v4-16",
        "--params",
        "300000",
        "--bucket-bytes",
        "400000",
        "--strategy",
        "fsdp",
        "--steps",
        "1",
        "--trace",
        path.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    assert_no_overlap(events);
    // Device 0's events of one bucket, by name prefix, as (start, end).
    let of = |prefix: &str, bucket: usize, ph: &str| -> Vec<(f64, f64)> {
        let suffix = format!(" bucket {bucket}");
        events
            .iter()
            .filter(|e| e["pid"] == 0 && e["ph"] == ph)
            .filter(|e| {
                let name = e["name"].as_str().unwrap_or("");
                name.starts_with(prefix) && name.ends_with(&suffix)
            })
            .map(|e| {
                let ts = e["ts"].as_f64().unwrap();
                (ts, ts + e["dur"].as_f64().unwrap_or(0.0))
            })
            .collect()
    };
    let buckets = (0..)
        .take_while(|&k| !of("use.forward", k, "X").is_empty())
        .count();
    assert!(buckets >= 3, "{buckets} buckets");
    for k in 0..buckets {
        let (fwd, bwd) = (of("use.forward", k, "X"), of("use.backward", k, "X"));
        let (free_fwd, free_bwd) = (of("free.forward", k, "i"), of("free.backward", k, "i"));
        assert_eq!((fwd.len(), bwd.len()), (1, 1), "bucket {k}");
        assert_eq!((free_fwd.len(), free_bwd.len()), (1, 1), "bucket {k}");
        // Two gathers (forward, backward): one done by the forward use,
        // both by the backward use.
        let gathers = of("all_gather", k, "X");
        assert!(gathers.len() >= 2, "bucket {k}: {gathers:?}");
        assert!(gathers.iter().any(|g| g.1 <= fwd[0].0 + 1e-6), "bucket {k}");
        assert!(gathers.iter().all(|g| g.1 <= bwd[0].0 + 1e-6), "bucket {k}");
        assert!(fwd[0].1 <= free_fwd[0].0 + 1e-6 && free_fwd[0].0 <= bwd[0].0);
        assert!(bwd[0].1 <= free_bwd[0].0 + 1e-6);
        // The reduce-scatter of its gradient after the backward use.
        let rs = of("reduce_scatter", k, "X");
        assert!(!rs.is_empty(), "bucket {k}");
        assert!(rs.iter().all(|r| r.0 >= bwd[0].1 - 1e-6), "bucket {k}");
    }
}

const MULTISLICE: &str = "assets/pods/examples/v5e-16x2-multislice.ron";

#[test]
fn a_recovery_the_run_cannot_build_is_refused_before_the_first_step() {
    // Redundant and rollback both re-shard onto a ring of the survivors,
    // which is not built across slices.
    let redundant = optirs(&[
        "train",
        MULTISLICE,
        "--params",
        "100000",
        "--steps",
        "5",
        "--kill",
        "20@0.00005",
        "--recovery",
        "redundant",
    ]);
    assert_usage(&redundant, "--kill 20@0.00005 with --recovery redundant");
    assert!(stderr(&redundant).contains("across slices"));
    // No checkpoint is written: nothing ran.
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let rollback = optirs(&[
        "train",
        MULTISLICE,
        "--params",
        "100000",
        "--steps",
        "5",
        "--kill",
        "20@0.00005",
        "--checkpoint-every",
        "0.00002",
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
    ]);
    assert_usage(&rollback, "--recovery rollback");
    assert!(std::fs::read_dir(&ckpt).map_or(true, |mut d| d.next().is_none()));

    // Spare-cube on a multislice pod falls back to a rollback once the
    // kills reach more cubes than there are spares.
    let pod = dir.path().join("two-cubes.ron");
    std::fs::write(
        &pod,
        r#"Pod(name: "v4-4x4x4x2-cubes", generation: "v4", shape: "4x4x4", slices: 2,
             dcn: (latency_us: 10.0, host_gb_per_s: 25.0, oversubscription: 1.0),
             cubes: (spares: 1))"#,
    )
    .unwrap();
    let spare = |kills: &[&str]| {
        let mut args = vec![
            "train",
            pod.to_str().unwrap(),
            "--params",
            "1000",
            "--steps",
            "3",
            "--recovery",
            "spare-cube",
            "--checkpoint-every",
            "0.00002",
        ];
        for kill in kills {
            args.extend(["--kill", kill]);
        }
        optirs(&args)
    };
    assert_usage(
        &spare(&["5@0.00002", "70@0.00003"]),
        "the kills reach 2 cubes and the pod has 1 spare",
    );
    // One cube's kill has its spare: the run is built and runs.
    assert!(spare(&["5@0.00002"]).status.success());

    // Spare-cube needs spares; re-sharding needs a survivor.
    assert_usage(
        &run(&with(&["--recovery", "spare-cube"])),
        "--recovery spare-cube needs spare cubes",
    );
    let mut every = with(&["--recovery", "redundant"]);
    for device in 0..8 {
        every.extend(["--kill".to_string(), format!("{device}@0.00001")]);
    }
    assert_usage(&run(&every), "every device of v4-16 is killed");
}
