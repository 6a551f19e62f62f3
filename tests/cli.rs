//! The command-line host, run as a user would.

use std::process::Output;

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

#[test]
fn topology_json_reports_the_published_v5e_figures() {
    let report = json(&optirs(&["topology", "v5e-256", "--json"]));
    for key in [
        "name",
        "generation",
        "chips",
        "hosts",
        "links",
        "diameter_hops",
        "bisection_bytes_per_s",
        "allreduce_bytes_per_s",
    ] {
        assert!(report.get(key).is_some(), "missing `{key}` in {report}");
    }
    assert_eq!(report["name"], "v5e-256");
    assert_eq!(report["generation"], "v5e");
    assert_eq!(report["chips"], 256);
    let bisection = report["bisection_bytes_per_s"].as_f64().unwrap();
    let allreduce = report["allreduce_bytes_per_s"].as_f64().unwrap();
    assert!((bisection / 1.6e12 - 1.0).abs() <= 0.10, "{bisection}");
    assert!((allreduce / 5.12e13 - 1.0).abs() <= 0.10, "{allreduce}");
}

#[test]
fn run_defaults_to_a_bundled_pod() {
    let report = json(&optirs(&["run", "--steps", "25", "--json"]));
    assert_eq!(report["pod"], "v5e-16");
    assert_eq!(report["ticks"], 25);
    let simulated = report["simulated_seconds"].as_f64().unwrap();
    assert!((simulated - 0.25).abs() < 1e-12, "{simulated}");

    let text = optirs(&["run", "v4-16", "--steps", "3"]);
    assert!(text.status.success());
    let stdout = String::from_utf8(text.stdout).unwrap();
    assert!(
        stdout.contains("v4-16") && stdout.contains("at tick 3"),
        "{stdout}"
    );
}

#[test]
fn a_pod_file_path_works_like_a_preset() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.ron");
    std::fs::write(
        &path,
        "Pod(name: \"tiny\", generation: \"v6e\", shape: \"2x2\")",
    )
    .unwrap();
    let report = json(&optirs(&["topology", path.to_str().unwrap(), "--json"]));
    assert_eq!(
        (report["name"].as_str(), report["chips"].as_u64()),
        (Some("tiny"), Some(4))
    );
}

#[test]
fn a_malformed_pod_file_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.ron");
    std::fs::write(
        &path,
        "Pod(\n  name: \"bad\",\n  generation: \"v4\",\n  shape: 4,\n)\n",
    )
    .unwrap();
    let output = optirs(&["run", path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("bad.ron:4:"),
        "names file and line: {stderr}"
    );
    assert!(stderr.contains("`shape`"), "names the field: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn an_unknown_pod_is_a_usage_error_like_a_bad_value() {
    // An unknown pod is a bad value like any other (exit 2); a pod file
    // that cannot be read as one is a runtime failure (exit 1, above).
    let output = optirs(&["topology", "v9-9"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("v5litepod-256"));
    // A Cloud family's form at a size Cloud does not sell: exit 2, with the
    // Cloud name for that many chips.
    let output = optirs(&["topology", "v5p-1000"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("did you mean `v5p-1024`?"));
    // A name whose meaning changed says so on stderr, and means Cloud's.
    let output = optirs(&["topology", "v4-8", "--json"]);
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("the 8-chip pod this name meant before Cloud's names is `v4-16`"),
        "{stderr}"
    );
    assert_eq!(json(&output)["chips"], 4);
    let usage = optirs(&["run", "--steps", "many"]);
    assert_eq!(usage.status.code(), Some(2));
}

#[test]
fn dot_export_draws_hosts_and_links() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pod.dot");
    let output = optirs(&["topology", "v4-16", "--dot", path.to_str().unwrap()]);
    assert!(output.status.success());
    let dot = std::fs::read_to_string(&path).unwrap();
    assert!(dot.starts_with("graph \"v4-16\""));
    assert_eq!(dot.matches("subgraph cluster_host").count(), 2);
    assert_eq!(dot.matches(" -- ").count(), 12);
}

#[test]
fn presets_lists_every_cloud_accelerator_type() {
    let rows = json(&optirs(&["presets", "--json"]));
    assert_eq!(
        rows.as_array().unwrap().len(),
        optirs_tpu::topology::cloud_types().len()
    );
    let names: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["name"].as_str().unwrap())
        .collect();
    for expected in [
        "v2-512",
        "v3-2048",
        "v4-8192",
        "v5litepod-1",
        "v5p-1024",
        "v5p-17920",
        "v6e-1",
        "tpu7x-2",
        "v2-8",
        "v3-64",
        "v4-16",
        "v4-128",
        "v4-8192",
        "v5litepod-16",
        "v5litepod-256",
        "v5p-256",
        "v6e-256",
        "tpu7x-512",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
}

#[test]
fn run_reports_when_each_killed_device_was_detected() {
    let report = json(&optirs(&[
        "run", "v5e-16", "--steps", "2000", "--kill", "5@3", "--kill", "9@4.5", "--json",
    ]));
    let failures = report["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 2, "{report}");
    for (row, (device, injected)) in failures.iter().zip([(5, 3.0), (9, 4.5)]) {
        assert_eq!(row["device"], device);
        assert_eq!(row["injected_at_s"].as_f64(), Some(injected));
        let detected = row["detected_at_s"].as_f64().unwrap();
        // Default heartbeat: 1 s interval, 10 s timeout.
        assert!(detected > injected && detected <= injected + 11.0, "{row}");
    }
    let output = optirs(&["run", "--kill", "99@1"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("device 99 does not exist"));
}

#[test]
fn checkpoint_save_restore_continues_the_same_world() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ckpt");
    let out = out.to_str().unwrap();
    let saved = optirs(&[
        "checkpoint",
        "save",
        "v4-16",
        "--steps",
        "100",
        "--out",
        out,
    ]);
    assert!(
        saved.status.success(),
        "{}",
        String::from_utf8_lossy(&saved.stderr)
    );
    let verified = optirs(&["checkpoint", "verify", out]);
    assert!(verified.status.success());
    let restored = json(&optirs(&[
        "checkpoint",
        "restore",
        out,
        "--steps",
        "50",
        "--json",
    ]));
    let straight = json(&optirs(&["run", "v4-16", "--steps", "150", "--json"]));
    assert_eq!(restored["ticks"], 150);
    assert_eq!(restored["world_sha256"], straight["world_sha256"]);
    assert_eq!(restored["world_sha256"].as_str().unwrap().len(), 64);

    let listed = json(&optirs(&[
        "checkpoint",
        "list",
        dir.path().to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(listed[0]["name"], "ckpt");
    let inspect = optirs(&["checkpoint", "inspect", out]);
    let text = String::from_utf8(inspect.stdout).unwrap();
    assert!(text.contains("component topology.Device") && text.contains("generation: V4"));

    let world = dir.path().join("ckpt").join("world.bin");
    let mut bytes = std::fs::read(&world).unwrap();
    bytes[10] ^= 1;
    std::fs::write(&world, bytes).unwrap();
    let broken = optirs(&["checkpoint", "verify", out]);
    assert_eq!(broken.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&broken.stderr);
    assert!(
        stderr.contains("world.bin") && stderr.contains("SHA-256"),
        "{stderr}"
    );
    // A path that ends in `..` names no checkpoint (whether or not the
    // directory above exists).
    let absent = dir.path().join("absent").join("..");
    let escaped = optirs(&["checkpoint", "save", "--out", absent.to_str().unwrap()]);
    assert_eq!(escaped.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&escaped.stderr).contains("does not end in a checkpoint name"),
        "{}",
        String::from_utf8_lossy(&escaped.stderr)
    );
}

#[test]
fn compile_reports_passes_kernels_refusals_and_memory() {
    let adam = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/programs/adam.ron");
    let report = json(&optirs(&["compile", adam, "--json"]));
    let passes = report["passes"].as_array().unwrap();
    for pass in passes {
        for key in ["name", "changed", "nodes_before", "nodes_after", "micros"] {
            assert!(pass.get(key).is_some(), "{key} missing in {pass}");
        }
    }
    assert_eq!(passes[0]["name"], "verify");
    assert_eq!(report["kernels"], 1, "Adam is one fused kernel");
    assert!(report["fusion_refusals"].is_array());
    let memory = &report["memory"];
    assert_eq!(memory["peak_bytes"], memory["lower_bound_bytes"]);
    assert!(memory.get("fragmentation_bytes").is_some());

    let dir = tempfile::tempdir().unwrap();
    let dot = dir.path().join("adam.dot");
    let text = optirs(&["compile", adam, "--dot", dot.to_str().unwrap()]);
    assert!(text.status.success());
    assert!(String::from_utf8_lossy(&text.stdout).contains("fusion.0"));
    assert!(std::fs::read_to_string(&dot).unwrap().contains("digraph"));

    let bad = dir.path().join("bad.ron");
    std::fs::write(
        &bad,
        "(name: \"bad\", nodes: [(name: \"x\", op: \"parameter\", ty: \"f32[4]\"), \
         (name: \"y\", op: \"add\", operands: [\"x\", \"nope\"])], outputs: [\"y\"])",
    )
    .unwrap();
    let output = optirs(&["compile", bad.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("%y") && stderr.contains("nope"), "{stderr}");
}

#[test]
fn collectives_prints_an_nccl_style_table_with_a_correctness_column() {
    let rows = json(&optirs(&[
        "collectives",
        "v4-16",
        "--sizes",
        "4K,64K",
        "--json",
    ]));
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        for key in [
            "op",
            "bytes",
            "measured_seconds",
            "algbw_gbps",
            "busbw_gbps",
            "wrong",
            "modeled_seconds",
            "modeled_busbw_gbps",
            "floor_seconds",
            "ratio_to_floor",
        ] {
            assert!(row.get(key).is_some(), "{key} missing in {row}");
        }
        assert_eq!(row["wrong"], 0);
        assert_eq!(row["op"], "all_reduce");
        // busbw = algbw * 2(n-1)/n with n = 8.
        let (alg, bus) = (
            row["algbw_gbps"].as_f64().unwrap(),
            row["busbw_gbps"].as_f64().unwrap(),
        );
        assert!(
            (bus - alg * 14.0 / 8.0).abs() <= 1e-9 * bus.max(1.0),
            "{row}"
        );
    }
    assert_eq!(rows[1]["bytes"], 65536);
    let text = optirs(&[
        "collectives",
        "v5e-16",
        "--op",
        "broadcast",
        "--sizes",
        "4K",
    ]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("#wrong"));
    let too_big = optirs(&["collectives", "v4-8192", "--sizes", "1G"]);
    assert_eq!(too_big.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&too_big.stderr).contains("host memory"));
    let bad = optirs(&["collectives", "--op", "all_to_one"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("all_to_all"));
    // All-to-all is one of them: every element where it belongs.
    let a2a = json(&optirs(&[
        "collectives",
        "assets/pods/examples/v2-4x2-custom.ron",
        "--op",
        "all-to-all",
        "--sizes",
        "4K",
        "--json",
    ]));
    assert_eq!(a2a[0]["op"], "all_to_all");
    assert_eq!(a2a[0]["wrong"], 0);
}

#[test]
fn bench_optimizer_reports_the_step_against_the_floor() {
    let report = json(&optirs(&[
        "bench",
        "optimizer",
        "--optimizer",
        "sgd",
        "--size",
        "4096",
        "--steps",
        "3",
        "--json",
    ]));
    for key in [
        "optimizer",
        "size",
        "step_seconds",
        "in_place_step_seconds",
        "floor_seconds",
        "ratio_to_floor",
        "fresh_ratio_to_floor",
        "fresh_loop_seconds",
        "ratio_to_fresh_loop",
        "compile_seconds",
    ] {
        assert!(report.get(key).is_some(), "{key} missing in {report}");
    }
    assert_eq!(report["optimizer"], "sgd");
    assert_eq!(report["size"], 4096);
    let (step, in_place, floor) = (
        report["step_seconds"].as_f64().unwrap(),
        report["in_place_step_seconds"].as_f64().unwrap(),
        report["floor_seconds"].as_f64().unwrap(),
    );
    assert!(step > 0.0 && in_place > 0.0 && floor > 0.0);
    let unknown = optirs(&["bench", "optimizer", "--optimizer", "lion"]);
    assert_eq!(
        unknown.status.code(),
        Some(2),
        "a bad value is a usage error"
    );
}

/// The pass names `compile --help` offers to `--disable-pass`.
fn disable_pass_names_in_help() -> Vec<String> {
    let help = optirs(&["compile", "--help"]);
    assert!(help.status.success());
    let help = String::from_utf8(help.stdout).unwrap();
    let option = help
        .find("--disable-pass")
        .expect("compile has --disable-pass");
    let marker = "[possible values:";
    let start = option
        + help[option..]
            .find(marker)
            .expect("--disable-pass lists the passes")
        + marker.len();
    let list = &help[start..];
    let end = list.find(']').expect("the list ends");
    list[..end]
        .split(',')
        .map(|s| s.split_whitespace().collect::<String>())
        .filter(|s| !s.is_empty())
        .collect()
}

#[test]
fn every_pass_the_help_lists_can_be_disabled() {
    let names = disable_pass_names_in_help();
    assert!(names.iter().any(|n| n == "fusion"), "{names:?}");
    let programs = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/programs");
    for program in ["adam", "mlp", "conv_block", "cse_fold"] {
        let path = format!("{programs}/{program}.ron");
        for name in &names {
            let out = optirs(&["compile", &path, "--disable-pass", name, "--json"]);
            let report = json(&out);
            let row = report["passes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == name.as_str())
                .unwrap_or_else(|| panic!("no `{name}` row for {program}"))
                .clone();
            assert_eq!(row["changed"], false, "{program} without {name}: {row}");
        }
    }
    let adam = format!("{programs}/adam.ron");
    let text = optirs(&["compile", &adam, "--disable-pass", "fusion"]);
    assert!(text.status.success());
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(stdout.contains("disabled: one kernel per op"), "{stdout}");
    assert!(!stdout.contains("fusion.0"), "{stdout}");
}

#[test]
fn compile_errors_name_the_program_file_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.ron");
    std::fs::write(
        &path,
        r#"(name: "big", nodes: [(name: "c", op: "constant", ty: "f32[16777217]", value: [1.0])], outputs: ["c"])"#,
    )
    .unwrap();
    let out = optirs(&["compile", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim_end(),
        format!(
            "error: {}: node %c: constant f32[16777217] is larger than 16777216 elements",
            path.display()
        )
    );
}

#[test]
fn bad_values_are_usage_errors_everywhere() {
    let adam = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/programs/adam.ron");
    let cases: &[&[&str]] = &[
        &["bench", "optimizer", "--optimizer", "lamb"],
        &["bench", "optimizer", "--size", "0"],
        &["bench", "optimizer", "--size", "1.5"],
        &["bench", "optimizer", "--steps", "0"],
        &["collectives", "--op", "bogus"],
        &["compile", adam, "--disable-pass", "bogus"],
        &["compile", adam, "--disable-pass", "verify"],
    ];
    for args in cases {
        let out = optirs(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("invalid value"), "{args:?}: {stderr}");
    }
}

#[test]
fn bench_optimizer_checks_host_memory_before_allocating() {
    for size in ["1e11", "100000000000"] {
        let out = optirs(&["bench", "optimizer", "--size", size, "--steps", "1"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("GiB of host memory") && stderr.contains("100000000000"),
            "{stderr}"
        );
    }
}

#[test]
fn errors_do_not_repeat_their_cause() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    for args in [
        vec!["compile", path],
        vec!["run", path, "--steps", "1"],
        vec!["topology", path],
    ] {
        let out = optirs(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        // A directory is refused before it is opened, naming it once.
        let cause = stderr.find("is a directory").expect("the cause is shown");
        assert_eq!(
            stderr.matches("is a directory").count(),
            1,
            "{args:?}: {stderr}"
        );
        assert_eq!(stderr.matches(path).count(), 1, "{args:?}: {stderr}");
        assert!(stderr[..cause].contains(path), "{args:?}: {stderr}");
    }
    let missing = dir.path().join("no/such/dir/trace.json");
    let out = optirs(&["run", "--steps", "1", "--trace", missing.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("no/such/dir") && stderr.contains("does not exist"),
        "{stderr}"
    );
}

#[test]
fn train_reports_a_sharded_run_and_refuses_bad_input() {
    let args = [
        "train",
        "v4-16",
        "--params",
        "3000,17,400",
        "--steps",
        "3",
        "--bucket-bytes",
        "4096",
        "--json",
    ];
    let report = json(&optirs(&args));
    for key in [
        "pod",
        "chips",
        "optimizer",
        "params",
        "steps_completed",
        "step_seconds",
        "phases",
        "hbm_bytes_per_device",
        "link_bytes",
        "failures",
        "recoveries",
        "goodput",
        "wall_seconds",
        "world_sha256",
    ] {
        assert!(report.get(key).is_some(), "missing `{key}` in {report}");
    }
    assert_eq!(report["chips"], 8);
    assert_eq!(report["params"], 3417);
    assert_eq!(report["steps_completed"], 3);
    assert!(report["phases"]["update"].as_f64().unwrap() > 0.0);
    let goodput = report["goodput"].as_f64().unwrap();
    assert!(goodput > 0.0 && goodput <= 1.0, "{goodput}");
    // The same run gives the same world.
    let again = json(&optirs(&args));
    assert_eq!(report["world_sha256"], again["world_sha256"]);
    // A killed device with redundant shards: one failure, one recovery, no lost step.
    let report = json(&optirs(&[
        "train",
        "v4-16",
        "--params",
        "20000",
        "--steps",
        "4",
        "--bucket-bytes",
        "8192",
        "--kill",
        "3@0.00001",
        "--recovery",
        "redundant",
        "--json",
    ]));
    assert_eq!(report["failures"].as_array().unwrap().len(), 1, "{report}");
    assert_eq!(report["failures"][0]["device"], 3);
    assert_eq!(report["recoveries"][0]["policy"], "redundant");
    assert_eq!(report["recoveries"][0]["lost_steps"], 0);
    assert_eq!(report["chips_at_end"], 7);
    assert_eq!(report["steps_completed"], 4);
    // Bad values are usage errors (exit 2) or clear errors before any work.
    for args in [
        &["train", "--optimizer", "lamb"][..],
        &["train", "--bucket-bytes", "0"],
        &["train", "--steps", "0"],
        &["train", "--params", "10,0"],
        &["train", "--recovery", "pray"],
    ] {
        let out = optirs(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = optirs(&[
        "train",
        "v4-16",
        "--kill",
        "99@0.001",
        "--recovery",
        "redundant",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("device 99 does not exist"));
    let out = optirs(&["train", "v4-16", "--kill", "1@0.001"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--checkpoint-every"));
}

#[test]
fn train_models_a_pod_too_large_for_this_machine() {
    let dir = tempfile::tempdir().unwrap();
    let pod = dir.path().join("v5p-8960.ron");
    std::fs::write(
        &pod,
        "Pod(name: \"v5p-8960\", generation: \"v5p\", shape: \"16x20x28\", custom: true)",
    )
    .unwrap();
    let report = json(&optirs(&[
        "train",
        pod.to_str().unwrap(),
        "--modeled-only",
        "--params",
        "175e9",
        "--json",
    ]));
    assert_eq!(report["chips"], 8960);
    assert_eq!(report["params"], 175_000_000_000u64);
    assert!(report["step_seconds"].as_f64().unwrap() > 0.0);
    assert_eq!(report["fits_in_hbm"], false);
}

#[test]
fn train_trace_is_a_perfetto_file_with_every_device() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("train.json");
    let out = optirs(&[
        "train",
        "v4-16",
        "--params",
        "4000",
        "--steps",
        "2",
        "--bucket-bytes",
        "4096",
        "--trace",
        trace.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let value: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let events = value["traceEvents"].as_array().unwrap();
    for device in 0..8 {
        for cat in ["compute", "communication"] {
            assert!(
                events
                    .iter()
                    .any(|e| e["pid"] == device && e["cat"] == cat && e["ph"] == "X"),
                "device {device} has {cat} spans"
            );
        }
    }
    // Never overwrites.
    let again = optirs(&[
        "train",
        "v4-16",
        "--params",
        "4000",
        "--steps",
        "1",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    // An output path that exists is a bad value, refused before any work.
    assert_eq!(again.status.code(), Some(2));
}

/// A binary without the `mpi` feature started as one of several MPI ranks
/// says so, instead of running the whole pod alone as if it were the pod.
#[cfg(not(feature = "mpi"))]
#[test]
fn a_build_without_mpi_refuses_to_run_as_one_of_several_ranks() {
    for (size, rank) in [
        ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
        ("PMI_SIZE", "PMI_RANK"),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_optirs-tpu"))
            .args(["run", "v4-16", "--steps", "10"])
            .env(size, "2")
            .env(rank, "1")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("rank 1 of 2"), "{stderr}");
        assert!(stderr.contains("--features mpi"), "{stderr}");
    }
    // One rank is one process: it runs.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_optirs-tpu"))
        .args(["run", "v4-16", "--steps", "10"])
        .env("OMPI_COMM_WORLD_SIZE", "1")
        .env("OMPI_COMM_WORLD_RANK", "0")
        .output()
        .unwrap();
    assert!(output.status.success());
}

#[test]
fn goodput_simulates_a_run_and_refuses_bad_input() {
    let args = [
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
        "--seed",
        "5",
        "--json",
    ];
    let report = json(&optirs(&args));
    for key in [
        "goodput",
        "lost_steps",
        "checkpoint_seconds",
        "restarts",
        "checkpoint_interval_seconds",
        "young_daly_seconds",
    ] {
        assert!(report.get(key).is_some(), "missing `{key}` in {report}");
    }
    let goodput = report["goodput"].as_f64().unwrap();
    assert!(goodput > 0.5 && goodput < 1.0, "{goodput}");
    // 64 chips at 200 h: a failure every 3.1 h, about 23 in 3 days.
    let restarts = report["restarts"].as_u64().unwrap();
    assert!((8..=45).contains(&restarts), "{restarts}");
    assert_eq!(report["config"]["recovery"], "rollback");
    assert_eq!(report["step_source"], "--step-seconds");
    // The seed replays the run.
    let again = json(&optirs(&args));
    assert_eq!(again["goodput"], report["goodput"]);

    let text = optirs(&args[..args.len() - 1]);
    assert!(text.status.success());
    let stdout = String::from_utf8(text.stdout).unwrap();
    assert!(
        stdout.starts_with("goodput ") && stdout.contains("restarts"),
        "{stdout}"
    );

    for (flag, value, code, message) in [
        ("--mtbf-hours", "0", 2, "not a mean time between failures"),
        ("--days", "-2", 2, "not a run length"),
        ("--model-params", "0", 2, "not a positive whole number"),
        (
            "--recovery",
            "sometimes",
            2,
            "unknown recovery policy `sometimes`",
        ),
        (
            "--checkpoint-every",
            "soon",
            2,
            "is not a positive number of seconds",
        ),
    ] {
        let mut bad: Vec<&str> = args.to_vec();
        let at = bad.iter().position(|a| *a == flag);
        match at {
            Some(i) => bad[i + 1] = value,
            None => bad.extend([flag, value]),
        }
        let out = optirs(&bad);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{flag} {value}: {stderr}");
        assert!(stderr.contains(message), "{flag} {value}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn run_writes_periodic_checkpoints_and_continues_from_one() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().to_str().unwrap();
    let args = [
        "run",
        "v4-16",
        "--steps",
        "100",
        "--checkpoint-every",
        "0.5",
    ];
    let out = optirs(&[&args[..], &["--checkpoint-dir", dir, "--json"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut names: Vec<String> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, vec!["tick-000000000050", "tick-000000000100"]);
    let saved = root.path().join("tick-000000000100");
    let continued = json(&optirs(&[
        "run",
        "v4-16",
        "--steps",
        "50",
        "--restore",
        saved.to_str().unwrap(),
        "--json",
    ]));
    let straight = json(&optirs(&["run", "v4-16", "--steps", "150", "--json"]));
    assert_eq!(continued["world_sha256"], straight["world_sha256"]);
    assert_eq!(continued["ticks"], 150);
    // Another pod's checkpoint is refused, naming both.
    let out = optirs(&["run", "v5e-16", "--restore", saved.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("v4-16") && stderr.contains("v5e-16"),
        "{stderr}"
    );
    // Half a pair of flags is a usage error.
    assert_eq!(
        optirs(&["run", "--checkpoint-every", "5"]).status.code(),
        Some(2)
    );
}

#[test]
fn checkpoint_list_and_verify_read_a_split_pods_checkpoints() {
    use optirs_tpu::pod::ranks::RankedPod;
    use optirs_tpu::transport::cluster::thread_mailboxes;
    let root = tempfile::tempdir().unwrap();
    let topology = optirs_tpu::topology::load_preset("v4-16").unwrap();
    std::thread::scope(|s| {
        let ranks: Vec<_> = thread_mailboxes(2)
            .into_iter()
            .map(|mailbox| {
                let topology = topology.clone();
                let root = root.path();
                s.spawn(move || {
                    let mut pod = RankedPod::new(topology, Box::new(mailbox)).unwrap();
                    pod.run(20).unwrap();
                    pod.save_checkpoint(root, "split").unwrap();
                })
            })
            .collect();
        ranks.into_iter().for_each(|r| r.join().unwrap());
    });
    let listed = json(&optirs(&[
        "checkpoint",
        "list",
        root.path().to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(listed[0]["name"], "split");
    assert_eq!(listed[0]["tick"], 20);
    assert!(listed[0]["problem"].is_null(), "{listed}");
    let dir = root.path().join("split");
    let out = optirs(&["checkpoint", "verify", dir.to_str().unwrap()]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 parts"));
}

#[test]
fn run_skip_idle_reports_skipped_ticks_and_the_same_world() {
    let args = [
        "run", "v4-16", "--steps", "2000", "--kill", "3@7.5", "--json",
    ];
    let ticked = json(&optirs(&args));
    let skipped = json(&optirs(&[&args[..], &["--skip-idle"]].concat()));
    assert_eq!(ticked["world_sha256"], skipped["world_sha256"]);
    assert_eq!(ticked["failures"], skipped["failures"]);
    assert!(ticked.get("skipped_ticks").is_none(), "{ticked}");
    let count = skipped["skipped_ticks"].as_u64().unwrap();
    assert!(count > 1_000 && count < 2_000, "{skipped}");

    let text = optirs(&["run", "v4-16", "--steps", "500", "--skip-idle"]);
    let stdout = String::from_utf8(text.stdout).unwrap();
    assert!(stdout.contains("idle ticks skipped"), "{stdout}");
    let refused = optirs(&["run", "v4-16", "--skip-idle", "--trace", "t.json"]);
    assert!(!refused.status.success());
}

#[test]
fn collectives_and_train_across_slices_show_the_dcn_phase() {
    let pod = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/assets/pods/examples/v5e-16x2-multislice.ron"
    );
    let rows = json(&optirs(&["collectives", pod, "--sizes", "64K", "--json"]));
    let row = &rows.as_array().unwrap()[0];
    assert_eq!(row["wrong"], 0);
    let passes = row["passes"].as_array().unwrap();
    let dcn: Vec<&serde_json::Value> = passes
        .iter()
        .filter(|p| p["name"].as_str().unwrap().ends_with(".dcn"))
        .collect();
    assert_eq!(dcn.len(), 2, "{passes:?}");
    for p in dcn {
        assert!(p["bytes"].as_u64().unwrap() > 0);
        assert!(p["end_seconds"].as_f64().unwrap() > p["start_seconds"].as_f64().unwrap());
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("rs.json");
    let text = optirs(&[
        "collectives",
        pod,
        "--op",
        "reduce_scatter",
        "--sizes",
        "4K,1M",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(
        stdout.contains("expected DCN bandwidth per slice") && stdout.contains("DCN busbw"),
        "{stdout}"
    );
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let on_dcn = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"] == 1)
        .count();
    assert_eq!(on_dcn, 2, "one DCN span per size");
    let bad = optirs(&["collectives", pod, "--op", "broadcast", "--sizes", "4K"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("broadcast across slices"));

    let args = [
        "train",
        pod,
        "--params",
        "5000,300",
        "--steps",
        "2",
        "--bucket-bytes",
        "4096",
    ];
    let report = json(&optirs(&[&args[..], &["--json"]].concat()));
    assert_eq!(report["chips"], 32);
    assert!(report["phases"]["all_gather.dcn"].as_f64().unwrap() > 0.0);
    let train_trace = dir.path().join("train.json");
    let text = optirs(&[&args[..], &["--trace", train_trace.to_str().unwrap()]].concat());
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(
        stdout.contains("reduce_scatter.dcn") && stdout.contains("DCN phase (across slices)"),
        "{stdout}"
    );
    // The DCN passes are on their own track of every device.
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&train_trace).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let dcn_spans = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"] == 2)
        .collect::<Vec<_>>();
    assert!(!dcn_spans.is_empty());
    assert!(
        dcn_spans
            .iter()
            .all(|e| e["cat"] == "dcn" && e["name"].as_str().unwrap().contains(".dcn"))
    );
    let modeled = json(&optirs(
        &[&args[..], &["--modeled-only", "--json"]].concat(),
    ));
    let stepped = report["step_seconds"].as_f64().unwrap();
    let closed = modeled["step_seconds"].as_f64().unwrap();
    assert!(
        (stepped - closed).abs() <= 1e-9 * stepped,
        "{stepped} vs {closed}"
    );
}
