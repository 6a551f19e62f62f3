//! `optirs-tpu goodput` run as a user would: the default step on every
//! pod, exit codes, names in `--json`, text a person reads, `auto` against
//! `never`, asynchronous checkpoints.

use std::process::Output;

#[path = "common/binary.rs"]
mod binary;
use binary::optirs;

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json(output: &Output) -> serde_json::Value {
    assert!(output.status.success(), "stderr: {}", stderr(output));
    serde_json::from_slice(&output.stdout).expect("stdout is one JSON value")
}

fn text(output: &Output) -> String {
    assert!(output.status.success(), "stderr: {}", stderr(output));
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// The longest run of digits in `text`: a number spelled out digit by
/// digit (`18446744073709551616`) is unreadable.
fn longest_digit_run(text: &str) -> usize {
    text.split(|c: char| !c.is_ascii_digit())
        .map(str::len)
        .max()
        .unwrap_or(0)
}

#[test]
fn the_default_step_is_the_modeled_one_on_every_pod() {
    // The issue's own command: no --step-seconds.
    let report = json(&optirs(&[
        "goodput",
        "v5e-16",
        "--model-params",
        "1e9",
        "--mtbf-hours",
        "1000",
        "--days",
        "5",
        "--json",
    ]));
    assert_eq!(report["step_source"], "modeled sharded optimizer step");
    let step = report["costs"]["step_seconds"].as_f64().unwrap();
    assert!(step > 1e-6 && step < 10.0, "{step}");
    let goodput = report["goodput"].as_f64().unwrap();
    assert!(goodput > 0.5 && goodput <= 1.0, "{goodput}");

    let mut pods: Vec<String> = optirs_tpu::topology::PRESETS
        .iter()
        .map(|(name, _)| name.to_string())
        .collect();
    for example in [
        "v4-4x4x8-cubes.ron",
        "v4-4x4x8-twisted.ron",
        "v5e-16x2-multislice.ron",
    ] {
        pods.push(format!(
            "{}/assets/pods/examples/{example}",
            env!("CARGO_MANIFEST_DIR")
        ));
    }
    for pod in &pods {
        let out = optirs(&[
            "goodput",
            pod,
            "--model-params",
            "1e6",
            "--mtbf-hours",
            "10000",
            "--days",
            "1",
            "--checkpoint-every",
            "600",
            "--json",
        ]);
        let report = json(&out);
        assert_eq!(
            report["step_source"], "modeled sharded optimizer step",
            "{pod}"
        );
        let step = report["costs"]["step_seconds"].as_f64().unwrap();
        assert!(step.is_finite() && step > 0.0, "{pod}: {step}");
        let goodput = report["goodput"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&goodput), "{pod}: {goodput}");
        assert!(report["steps_completed"].as_u64().unwrap() > 0, "{pod}");
    }
}

#[test]
fn every_bad_value_exits_2_with_one_readable_line() {
    let base = [
        "goodput",
        "v4-16",
        "--model-params",
        "1e9",
        "--mtbf-hours",
        "1000",
        "--days",
        "2",
        "--step-seconds",
        "1",
        "--checkpoint-every",
        "600",
    ];
    let cases: &[(&str, &str, &str)] = &[
        ("--mtbf-hours", "0", "not a mean time between failures"),
        ("--mtbf-hours", "-5", "not a mean time between failures"),
        ("--mtbf-hours", "nan", "not a mean time between failures"),
        // Valid alone, but 1e305 failures: refused before any work.
        ("--mtbf-hours", "1e-300", "failures, more than the"),
        ("--days", "0", "not a run length"),
        ("--days", "-2", "not a run length"),
        ("--days", "1e300", "not a run length"),
        ("--days", "inf", "not a run length"),
        ("--step-seconds", "0", "is not a duration"),
        ("--step-seconds", "nan", "is not a duration"),
        ("--step-seconds", "1e300", "is not a duration"),
        // Valid alone, more steps than a run counts.
        ("--step-seconds", "1e-300", "steps a run counts"),
        (
            "--checkpoint-every",
            "0",
            "is not a positive number of seconds",
        ),
        (
            "--checkpoint-every",
            "1e300",
            "is not a positive number of seconds",
        ),
        (
            "--checkpoint-every",
            "soon",
            "is not a positive number of seconds",
        ),
        ("--restart-seconds", "-1", "is not a duration"),
        ("--reconfigure-seconds", "nan", "is not a duration"),
        ("--cube-repair-hours", "0", "is not a repair time"),
        // Accepted and ignored would mislead: repairs matter to spare-cube only.
        (
            "--cube-repair-hours",
            "48",
            "applies to --recovery spare-cube only",
        ),
        (
            "--checkpoint-every",
            "never --async-checkpoint",
            "--async-checkpoint needs checkpoints",
        ),
        ("--storage-bytes-per-s", "0", "is not a bandwidth"),
        ("--model-params", "0", "not a positive whole number"),
        ("--recovery", "sometimes", "unknown recovery policy"),
        // v4-16 has no spare cubes.
        ("--recovery", "spare-cube", "needs spare cubes"),
    ];
    for &(flag, value, message) in cases {
        let mut args: Vec<&str> = base.to_vec();
        let mut words = value.split(' ');
        let value = words.next().unwrap();
        match args.iter().position(|a| *a == flag) {
            Some(i) => args[i + 1] = value,
            None => args.extend([flag, value]),
        }
        args.extend(words);
        let out = optirs(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(message), "{flag} {value}: {err}");
        assert!(err.starts_with("error:"), "{flag} {value}: {err}");
        let first = err.lines().next().unwrap();
        assert!(
            longest_digit_run(first) <= 10,
            "{flag} {value}: a number spelled out: {first}"
        );
        assert!(!err.contains("panicked"), "{err}");
        assert!(out.stdout.is_empty(), "{flag} {value}");
    }
    // The same without --step-seconds: the modeled step is not the check.
    let out = optirs(&[
        "goodput",
        "--model-params",
        "1e9",
        "--mtbf-hours",
        "0",
        "--days",
        "5",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // A pod that is not there is a bad value too (a missing path).
    let out = optirs(&[
        "goodput",
        "/nonexistent/pod.ron",
        "--model-params",
        "1e9",
        "--mtbf-hours",
        "1000",
        "--days",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn json_names_simulated_time_and_host_time_apart() {
    let report = json(&optirs(&[
        "goodput",
        "v4-128",
        "--model-params",
        "1e9",
        "--mtbf-hours",
        "200",
        "--days",
        "3",
        "--step-seconds",
        "2",
        "--checkpoint-every",
        "900",
        "--json",
    ]));
    let simulated = report["simulated_seconds"].as_f64().unwrap();
    assert_eq!(simulated, 3.0 * 86_400.0);
    let host = report["wall_seconds"].as_f64().unwrap();
    assert!(host > 0.0 && host < 60.0, "host time {host}");
    assert!(report.get("wall_clock_seconds").is_none());
    let accounted: f64 = [
        "productive_seconds",
        "lost_seconds",
        "checkpoint_seconds",
        "recovery_seconds",
        "replication_seconds",
    ]
    .iter()
    .map(|k| report[k].as_f64().unwrap())
    .sum();
    assert!(
        (accounted - simulated).abs() < 1e-6 * simulated,
        "{accounted}"
    );
}

/// `rollback 620.047 s = detect 10.000 s + restart 600.000 s + ...`: the
/// total and its parts, in seconds.
fn breakdown(line: &str, name: &str) -> (f64, Vec<(String, f64)>) {
    let seconds = |value: &str, unit: &str| {
        let v: f64 = value.parse().unwrap();
        match unit {
            "s" => v,
            "ms" => v * 1e-3,
            "µs" => v * 1e-6,
            "ns" => v * 1e-9,
            other => panic!("unit {other} in {line}"),
        }
    };
    let at = line
        .find(&format!("{name} "))
        .unwrap_or_else(|| panic!("no `{name}` in {line}"));
    let rest = &line[at + name.len() + 1..];
    let words: Vec<&str> = rest.split_whitespace().collect();
    let total = seconds(words[0], words[1]);
    assert_eq!(words[2], "=", "{line}");
    let mut parts = Vec::new();
    let mut i = 3;
    loop {
        let unit = words[i + 2].trim_end_matches([',', ';']);
        parts.push((words[i].to_string(), seconds(words[i + 1], unit)));
        if words.get(i + 3) != Some(&"+") {
            break;
        }
        i += 4;
    }
    (total, parts)
}

#[test]
fn text_adds_up_and_reads_as_a_person_writes() {
    // 4 v6e chips on one host.
    let dir = tempfile::tempdir().unwrap();
    let pod = dir.path().join("tiny.ron");
    std::fs::write(
        &pod,
        "Pod(name: \"tiny\", generation: \"v6e\", shape: \"2x2\")",
    )
    .unwrap();
    let pod = pod.to_str().unwrap();
    let out = text(&optirs(&[
        "goodput",
        pod,
        "--model-params",
        "1e9",
        "--mtbf-hours",
        "400",
        "--days",
        "5",
        "--step-seconds",
        "1",
        "--checkpoint-every",
        "600",
    ]));
    // 4 chips on 1 host.
    assert!(out.contains("(4 chips, 1 host)"), "{out}");
    // 12 GB of state (f32 parameters and Adam's two moments) in binary units.
    assert!(out.contains("11.18 GiB"), "{out}");
    assert!(!out.contains(" bytes"), "{out}");
    for wrong in [" 1 steps", " 1 hosts", " 1 chips", " 1 days", " 1 failures"] {
        assert!(!out.contains(wrong), "`{wrong}` in {out}");
    }
    let line = out.lines().find(|l| l.contains("restarts")).unwrap();
    let (total, parts) = breakdown(line, "rollback");
    let names: Vec<&str> = parts.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(
        names,
        ["detect", "restart", "reconfigure", "read"],
        "{line}"
    );
    let sum: f64 = parts.iter().map(|p| p.1).sum();
    // Each part and the total are shown to the millisecond.
    assert!((sum - total).abs() < 2e-3, "{line}: {sum} vs {total}");
    // The read is the checkpoint's bytes over one host's 1 GB/s: 12 s.
    assert!((parts[3].1 - 12.0).abs() < 1e-3, "{line}");
    assert!(
        line.contains("no read before the first checkpoint"),
        "{line}"
    );
    assert!(
        out.contains("simulated in") && out.contains("host time"),
        "{out}"
    );
    assert!(longest_digit_run(&out) <= 10, "{out}");

    let one_day = text(&optirs(&[
        "goodput",
        pod,
        "--model-params",
        "1e6",
        "--mtbf-hours",
        "1e9",
        "--days",
        "1",
        "--step-seconds",
        "1",
        "--checkpoint-every",
        "never",
    ]));
    assert!(one_day.contains("over 1 day on"), "{one_day}");
    assert!(one_day.contains("lost           0 steps"), "{one_day}");
}

#[test]
fn auto_never_does_worse_than_never() {
    // A run shorter than a restart: 8.64 s of 1 s steps, a 6 s checkpoint.
    let args = |interval: &'static str| {
        [
            "goodput",
            "v5e-16",
            "--model-params",
            "1e9",
            "--mtbf-hours",
            "1000",
            "--days",
            "0.0001",
            "--step-seconds",
            "1",
            "--checkpoint-every",
            interval,
            "--json",
        ]
    };
    let never = json(&optirs(&args("never")));
    let auto = json(&optirs(&args("auto")));
    let (n, a) = (
        never["goodput"].as_f64().unwrap(),
        auto["goodput"].as_f64().unwrap(),
    );
    assert!(a >= n, "auto {a} against never {n}");
    // 8 whole steps in 8.64 s.
    assert!((n - 8.0 / 8.64).abs() < 1e-12, "{n}");
    assert!(auto["checkpoint_interval_steps"].is_null(), "{auto}");
    let search = &auto["search"];
    assert!(search["goodput"].as_f64().unwrap() >= search["never_goodput"].as_f64().unwrap());

    let shown = text(&optirs(&args("auto")[..12]));
    assert!(
        shown.contains("never (auto: no checkpoints did best"),
        "{shown}"
    );
}

#[test]
fn async_checkpoints_block_only_for_the_host_copy() {
    // 1e11 parameters on v4-128 (16 hosts): 1.2 TB at 16 GB/s is a 75 s write.
    let args = |extra: &[&'static str]| {
        let mut a = vec![
            "goodput",
            "v4-128",
            "--model-params",
            "1e11",
            "--mtbf-hours",
            "2000",
            "--days",
            "10",
            "--step-seconds",
            "5",
            "--checkpoint-every",
            "600",
        ];
        a.extend_from_slice(extra);
        a
    };
    let sync = json(&optirs(&args(&["--json"])));
    let asynchronous = json(&optirs(&args(&["--async-checkpoint", "--json"])));
    assert_eq!(asynchronous["config"]["async_checkpoint"], true);
    let costs = &asynchronous["costs"];
    let write = costs["checkpoint_write_seconds"].as_f64().unwrap();
    assert!((write - 75.0).abs() < 1e-9, "{write}");
    assert_eq!(
        sync["costs"]["checkpoint_blocking_seconds"]
            .as_f64()
            .unwrap(),
        write
    );
    let copy = costs["host_copy_seconds"].as_f64().unwrap();
    assert_eq!(costs["checkpoint_blocking_seconds"].as_f64().unwrap(), copy);
    assert_eq!(
        costs["checkpoint_background_seconds"].as_f64().unwrap(),
        write
    );
    // 1.2 TB over 64 chips' host links (v4: PCIe Gen3 x16, 15.75 GB/s).
    let link = optirs_tpu::hardware::TpuGeneration::V4
        .spec()
        .host_link_bytes_per_s;
    assert_eq!(link, 15.75e9);
    let expected = 1.2e12 / (64.0 * link);
    assert!((copy - expected).abs() < 1e-9 * expected, "{copy}");
    assert!(copy < write);
    let (s, a) = (
        sync["goodput"].as_f64().unwrap(),
        asynchronous["goodput"].as_f64().unwrap(),
    );
    assert!(a > s, "async {a} against sync {s}");
    assert!(
        asynchronous["checkpoint_seconds"].as_f64().unwrap()
            < sync["checkpoint_seconds"].as_f64().unwrap()
    );

    let shown = text(&optirs(&args(&["--async-checkpoint"])));
    assert!(shown.contains("asynchronous: training waits"), "{shown}");
}

#[test]
fn spare_cube_without_a_free_spare_rolls_back_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let pod = dir.path().join("cubes.ron");
    std::fs::write(
        &pod,
        "Pod(name: \"v4-1024-cubes\", generation: \"v4\", shape: \"8x8x16\", \
         cubes: (spares: 1))",
    )
    .unwrap();
    let args = [
        "goodput",
        pod.to_str().unwrap(),
        "--model-params",
        "1e9",
        "--mtbf-hours",
        "3072",
        "--days",
        "20",
        "--step-seconds",
        "2",
        "--checkpoint-every",
        "900",
        "--recovery",
        "spare-cube",
        "--cube-repair-hours",
        "720",
        "--seed",
        "11",
    ];
    let report = json(&optirs(&[&args[..], &["--json"]].concat()));
    let restarts = report["restarts"].as_u64().unwrap();
    assert_eq!(report["spare_swaps"], 1);
    assert_eq!(report["spare_shortfalls"].as_u64().unwrap(), restarts - 1);
    let shown = text(&optirs(&args));
    let line = shown.lines().find(|l| l.contains("restarts")).unwrap();
    let (total, parts) = breakdown(line, "spare cube");
    let names: Vec<&str> = parts.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(names, ["detect", "reconfigure", "read"], "{line}");
    let sum: f64 = parts.iter().map(|p| p.1).sum();
    assert!((sum - total).abs() < 2e-3, "{line}");
    assert!(line.contains("without a free spare rollback"), "{line}");
    assert!(
        shown.contains("found no free spare and rolled back"),
        "{shown}"
    );
}
