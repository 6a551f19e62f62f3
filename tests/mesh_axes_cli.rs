//! The expert and stage axes on the command line: `train --model
//! --modeled-only --mesh …,expert=E` and `…,stage=P --microbatches M
//! --repeats R` report the all-to-alls and the pipeline (text, JSON and the
//! trace's per-stage tracks), and every input the model cannot take exits 2
//! naming the flag or field.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn optirs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_optirs-tpu"))
        .args(args)
        .output()
        .expect("the binary runs")
}

/// A v5p 4x8x8 slice (an 8-long torus axis takes expert=8) in `dir`.
fn pod(dir: &Path) -> PathBuf {
    let path = dir.join("v5p-4x8x8.ron");
    std::fs::write(
        &path,
        "Pod(name: \"v5p-4x8x8\", generation: \"v5p\", shape: \"4x8x8\")",
    )
    .unwrap();
    path
}

fn refused(args: &[&str], says: &[&str]) {
    let output = optirs(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let command = format!("optirs-tpu {}", args.join(" "));
    assert_eq!(output.status.code(), Some(2), "`{command}`: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "`{command}`: {stderr}");
    for part in says {
        assert!(
            stderr.contains(part),
            "`{command}` does not say `{part}`: {stderr}"
        );
    }
}

#[test]
fn an_expert_axis_reports_its_all_to_alls() {
    let dir = tempfile::tempdir().unwrap();
    let pod = pod(dir.path());
    let pod = pod.to_str().unwrap();
    let args = [
        "train",
        pod,
        "--model",
        "mixtral-8x7b",
        "--modeled-only",
        "--strategy",
        "fsdp",
        "--mesh",
        "fsdp=-1,expert=8",
    ];
    let text = optirs(&args);
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("mesh data=1,fsdp=32,tensor=1,expert=8"),
        "{text}"
    );
    assert!(
        text.contains("expert axis 8: 1 expert a device; all-to-alls"),
        "{text}"
    );
    let json = optirs(&[&args[..], &["--json"]].concat());
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["expert_parallel"]["size"], 8);
    assert!(report["phases"]["all_to_all.expert"].as_f64().unwrap() > 0.0);
    assert!(
        report["hbm_by_kind"]["all_to_all_buffers"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(report["pipeline"].is_null());
}

#[test]
fn a_pipelined_run_reports_its_bubble_and_draws_each_stage() {
    let dir = tempfile::tempdir().unwrap();
    let pod = pod(dir.path());
    let trace = dir.path().join("pipeline.json");
    let args = [
        "train",
        pod.to_str().unwrap(),
        "--model",
        "llama2-70b",
        "--modeled-only",
        "--strategy",
        "fsdp",
        "--mesh",
        "stage=4,fsdp=-1",
        "--microbatches",
        "16",
        "--repeats",
        "2",
    ];
    let text = optirs(&[&args[..], &["--trace", trace.to_str().unwrap()]].concat());
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.status.success(),
        "{}",
        String::from_utf8_lossy(&text.stderr)
    );
    assert!(
        stdout.contains("pipeline of 4 stages (20 layers each), 16 microbatches, 2 rounds: bubble"),
        "{stdout}"
    );
    // (4 − 1)/(2·16 + 4 − 1) = 8.6 %.
    assert!(
        stdout.contains("(8.6 % of the pipelined passes)"),
        "{stdout}"
    );
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let stage_tracks = events
        .iter()
        .filter(|e| e["name"] == "thread_name" && e["pid"] == 1)
        .count();
    assert_eq!(stage_tracks, 4);
    let slots = events
        .iter()
        .filter(|e| e["cat"] == "pipeline" && e["pid"] == 1)
        .count();
    assert_eq!(slots, 2 * 4 * 2 * 16);
    let json = optirs(&[&args[..], &["--json"]].concat());
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["pipeline"]["stages"], 4);
    assert_eq!(report["pipeline"]["iterations"], 2 * 16 + 3);
    assert!(report["hbm_by_kind"]["pipeline_buffers"].as_u64().unwrap() > 0);
}

#[test]
fn what_the_axes_cannot_take_exits_2_naming_the_flag_or_field() {
    let dir = tempfile::tempdir().unwrap();
    let pod = pod(dir.path());
    let pod = pod.to_str().unwrap();
    let model = |name: &'static str, extra: &[&'static str]| -> Vec<String> {
        let mut args: Vec<String> = ["train", pod, "--model", name, "--modeled-only"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let run = |args: Vec<String>, says: &[&str]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused(&args, says);
    };
    run(
        model("llama2-7b", &["--mesh", "fsdp=-1,expert=8"]),
        &["--mesh", "expert=8", "dense"],
    );
    run(
        model(
            "llama2-70b",
            &["--mesh", "stage=4,fsdp=-1", "--microbatches", "6"],
        ),
        &["--microbatches 6", "multiple of 4"],
    );
    run(
        model(
            "llama2-70b",
            &["--mesh", "stage=4,fsdp=-1", "--repeats", "3"],
        ),
        &["layers", "80 is not a multiple of 12"],
    );
    run(
        model("llama2-70b", &["--microbatches", "4"]),
        &["--microbatches 4", "no stage axis"],
    );
    refused(
        &[
            "train",
            pod,
            "--params",
            "1000",
            "--steps",
            "1",
            "--microbatches",
            "4",
        ],
        &["--microbatches 4", "--model NAME --modeled-only"],
    );
    refused(
        &[
            "train",
            pod,
            "--params",
            "1000",
            "--modeled-only",
            "--mesh",
            "expert=8,fsdp=-1",
        ],
        &["--mesh expert=8,fsdp=-1", "expert=8 needs a model"],
    );
    refused(
        &[
            "goodput",
            pod,
            "--model-params",
            "1e9",
            "--mtbf-hours",
            "1000",
            "--days",
            "1",
            "--repeats",
            "2",
        ],
        &["--repeats", "needs --model"],
    );
}
