//! One exit-code rule for every subcommand: a bad name or a bad path on
//! the command line exits 2 before any work, with one `error:` line that
//! names the flag (or what the argument is) and the value, and a
//! did-you-mean where a known name is near.

use std::path::Path;
use std::process::{Command, Output};

fn optirs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_optirs-tpu"))
        .args(args)
        .output()
        .expect("the binary runs")
}

/// Runs `args`, which must be refused as usage: exit 2, nothing on
/// stdout, one line on stderr containing each of `says`.
fn refused(args: &[&str], says: &[&str]) {
    let output = optirs(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let command = format!("optirs-tpu {}", args.join(" "));
    assert_eq!(output.status.code(), Some(2), "`{command}`: {stderr}");
    assert!(output.stdout.is_empty(), "`{command}` printed on stdout");
    assert_eq!(stderr.lines().count(), 1, "`{command}`: {stderr}");
    assert!(stderr.starts_with("error: "), "`{command}`: {stderr}");
    for part in says {
        assert!(
            stderr.contains(part),
            "`{command}` does not say `{part}`: {stderr}"
        );
    }
}

const GOODPUT: [&str; 5] = ["goodput", "--mtbf-hours", "1000", "--days", "1"];

/// Every subcommand that takes a pod names the near preset.
#[test]
fn an_unknown_pod_is_refused_by_every_command_that_takes_one() {
    let goodput: Vec<&str> = [&GOODPUT[..], &["--model-params", "1e9", "v5e16"]].concat();
    for args in [
        &["topology", "v5e16"][..],
        &["train", "v5e16", "--params", "10", "--steps", "1"],
        &["train", "v5e16", "--model", "llama2-7b", "--modeled-only"],
        &["run", "v5e16", "--steps", "1"],
        &["collectives", "v5e16"],
        &["checkpoint", "save", "v5e16", "--out", "unused-ck"],
        &["bench", "schedule", "v5e16", "--steps", "1"],
        &goodput,
    ] {
        refused(args, &["`v5e16`", "did you mean `v5e-16`?"]);
    }
    // Cloud's v5p-1024 is 512 chips; a size Cloud does not sell is refused
    // with the Cloud name for it.
    refused(
        &["topology", "v5p-1000"],
        &["`v5p-1000`", "did you mean `v5p-1024`?"],
    );
    refused(
        &["topology", "v5p-6143"],
        &["`v5p-6143`", "did you mean `v5p-6144`?"],
    );
    refused(&["topology", ""], &["named ``", "presets: "]);
    assert!(!Path::new("unused-ck").exists());
}

/// Each named value, in each command that takes it.
#[test]
fn an_unknown_name_says_the_flag_and_the_near_name() {
    let train = ["train", "--params", "10", "--steps", "1"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> { [&train[..], extra].concat() };
    let goodput = |extra: &[&'static str]| -> Vec<&'static str> { [&GOODPUT[..], extra].concat() };
    let cases: Vec<(Vec<&str>, &[&str])> = vec![
        (
            with(&["--optimizer", "adamm"]),
            &["--optimizer", "'adamm'", "did you mean 'adam'?"],
        ),
        (
            with(&["--strategy", "fsd"]),
            &["--strategy", "`fsd`", "did you mean `fsdp`?"],
        ),
        (
            with(&["--recovery", "spare-cub"]),
            &["--recovery", "did you mean `spare-cube`?"],
        ),
        (
            with(&["--reduction", "meen"]),
            &["--reduction", "`meen`", "did you mean `mean`?"],
        ),
        (
            with(&["--mesh", "dat=16"]),
            &["--mesh", "`dat`", "did you mean `data`?"],
        ),
        (
            vec!["train", "--model", "lama2-7b", "--modeled-only"],
            &["--model lama2-7b", "did you mean `llama2-7b`?"],
        ),
        (
            vec![
                "train",
                "--model",
                "llama2-7b",
                "--modeled-only",
                "--data-reduction",
                "overlaped",
            ],
            &["--data-reduction", "did you mean `overlapped`?"],
        ),
        (
            goodput(&["--model", "gpt3-157b"]),
            &["--model gpt3-157b", "did you mean `gpt3-175b`?"],
        ),
        (
            goodput(&["--failure-unit", "hots"]),
            &["--failure-unit", "did you mean `host`?"],
        ),
        (
            goodput(&["--recovery", "rollbak"]),
            &["--recovery", "did you mean `rollback`?"],
        ),
        (
            goodput(&["--optimizer", "adamw2"]),
            &["--optimizer", "did you mean 'adamw'?"],
        ),
        (
            vec!["collectives", "--op", "all_reduc"],
            &["--op", "did you mean `all_reduce`?"],
        ),
        (
            vec!["bench", "optimizer", "--optimizer", "sdg"],
            &["--optimizer", "'sdg'"],
        ),
        (
            vec![
                "compile",
                "assets/programs/adam.ron",
                "--disable-pass",
                "fusoin",
            ],
            &["--disable-pass", "did you mean 'fusion'?"],
        ),
        (vec!["trian"], &["'trian'", "did you mean 'train'?"]),
        (
            vec!["checkpoint", "lsit", "x"],
            &["'lsit'", "did you mean 'list'?"],
        ),
        (
            vec!["run", "--stepz", "3"],
            &["--stepz", "did you mean '--steps'?"],
        ),
    ];
    for (args, says) in cases {
        refused(&args, says);
    }
}

/// A missing input and an output into a missing directory, in every
/// subcommand that reads or writes a path.
#[test]
fn a_bad_path_says_the_flag_and_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let into_missing = missing.join("out");
    let (m, o) = (missing.to_str().unwrap(), into_missing.to_str().unwrap());
    let pod_file = dir.path().join("pod.ron");
    let p = pod_file.to_str().unwrap();
    let goodput: Vec<&str> = [&GOODPUT[..], &["--model-params", "1e9", p]].concat();
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec!["topology", p], vec![p]),
        (vec!["run", p], vec![p]),
        (vec!["train", p, "--params", "10"], vec![p]),
        (goodput, vec![p]),
        (vec!["collectives", p], vec![p]),
        (vec!["bench", "schedule", p], vec![p]),
        (vec!["checkpoint", "save", p, "--out", "unused-ck"], vec![p]),
        (vec!["compile", m], vec![m, "no such file"]),
        (
            vec!["train", "--model", m, "--modeled-only"],
            vec!["--model", m],
        ),
        (
            vec!["goodput", "--mtbf-hours", "1", "--days", "1", "--model", m],
            vec!["--model", m],
        ),
        (vec!["run", "--restore", m], vec!["--restore", m]),
        (
            vec!["checkpoint", "verify", m],
            vec![m, "no such checkpoint directory"],
        ),
        (
            vec!["checkpoint", "restore", m],
            vec![m, "no such checkpoint directory"],
        ),
        (
            vec!["checkpoint", "inspect", m],
            vec![m, "no such checkpoint directory"],
        ),
        (
            vec!["checkpoint", "list", m],
            vec![m, "no such storage root"],
        ),
        (
            vec![
                "train",
                "--params",
                "10",
                "--checkpoint-every",
                "1",
                "--resume",
                m,
            ],
            vec!["--resume", m],
        ),
        (vec!["checkpoint", "save", "--out", o], vec!["--out", o]),
        (vec!["topology", "--svg", o], vec!["--svg", o]),
        (vec!["topology", "--dot", o], vec!["--dot", o]),
        (
            vec!["run", "--steps", "1", "--trace", o],
            vec!["--trace", o],
        ),
        (
            vec!["train", "--params", "10", "--trace", o],
            vec!["--trace", o],
        ),
        (vec!["collectives", "--trace", o], vec!["--trace", o]),
        (
            vec!["compile", "assets/programs/adam.ron", "--memory-svg", o],
            vec!["--memory-svg", o],
        ),
        (
            vec![
                "train",
                "--params",
                "10",
                "--checkpoint-every",
                "1",
                "--checkpoint-dir",
                "/proc/x",
            ],
            vec!["--checkpoint-dir", "/proc/x"],
        ),
        (
            vec![
                "run",
                "--checkpoint-every",
                "1",
                "--checkpoint-dir",
                "/proc/x",
            ],
            vec!["--checkpoint-dir", "/proc/x"],
        ),
    ];
    for (args, says) in cases {
        refused(&args, &says);
    }
    assert!(!missing.exists(), "a refused command created {m}");
}

/// Values out of range that used to fail only once the run had started.
#[test]
fn values_the_run_cannot_use_are_refused_before_it() {
    refused(
        &["train", "--params", "10", "--bucket-bytes", "1"],
        &["--bucket-bytes", "'1'", "at least 4"],
    );
    refused(
        &["train", "--params", "10", "--recovery", "spare-cube"],
        &["--recovery spare-cube", "v5e-16"],
    );
    refused(
        &[
            "goodput",
            "--mtbf-hours",
            "1",
            "--days",
            "1",
            "--model-params",
            "1e9",
            "--recovery",
            "spare-cube",
        ],
        &["--recovery spare-cube", "v5e-16"],
    );
}

/// Help is not an error; a runtime failure is 1, not 2.
#[test]
fn help_exits_0_and_a_damaged_input_exits_1() {
    let help = optirs(&["--help"]);
    assert_eq!(help.status.code(), Some(0));
    for command in [
        "train",
        "run",
        "topology",
        "presets",
        "collectives",
        "compile",
        "checkpoint",
        "goodput",
        "bench",
    ] {
        assert!(
            String::from_utf8_lossy(&help.stdout).contains(command),
            "{command}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let pod = dir.path().join("pod.ron");
    std::fs::write(&pod, "(name: \"x\", generation: \"v4\",").unwrap();
    let out = optirs(&["topology", pod.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A message names what the user gave: the model, not `--params`; the
/// last device that exists; a directory as a directory; the slice count
/// that takes a pod over the cap; a flag that does nothing in its mode.
#[test]
fn each_message_names_what_was_given() {
    let output = optirs(&["train", "v5e-16", "--model", "llama2-7b", "--steps", "1"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // A 6.7B model's state outgrows a CI host; where it fits, it runs.
    if !output.status.success() {
        assert!(stderr.contains("--model llama2-7b has"), "{stderr}");
        assert!(!stderr.contains("--params"), "{stderr}");
    }
    refused(
        &["run", "v4-16", "--steps", "1", "--kill", "99@0.001"],
        &["device 99", "devices 0 to 7"],
    );
    let dir = tempfile::tempdir().unwrap();
    let dir_text = dir.path().to_str().unwrap();
    refused(
        &["run", "v4-16", "--steps", "1", "--trace", dir_text],
        &["--trace", "is a directory"],
    );
    let pod = dir.path().join("many.ron");
    std::fs::write(
        &pod,
        "Pod(name: \"many\", generation: \"v5e\", shape: \"16x16\", slices: 100000)",
    )
    .unwrap();
    let output = optirs(&["topology", pod.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("`slices`"), "{stderr}");
    assert!(!stderr.contains("`shape`"), "{stderr}");
    refused(
        &[
            "train",
            "v5e-16",
            "--model",
            "llama2-7b",
            "--modeled-only",
            "--steps",
            "50",
        ],
        &["--steps 50", "does nothing"],
    );
}

/// `goodput`'s usage line shows both ways to give it a model.
#[test]
fn the_goodput_usage_line_names_both_models() {
    let help = optirs(&["goodput", "--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    let usage = text.lines().find(|l| l.starts_with("Usage:")).unwrap();
    assert!(
        usage.contains("--model <NAME|FILE>") && usage.contains("--model-params <N>"),
        "{usage}"
    );
}
