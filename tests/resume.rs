//! `train --resume` as a user runs it: through a damaged newest
//! checkpoint (skipped, said, left as it was, its name never reused), a
//! `--steps` already done refused, and a report that tells the whole run
//! from the resumed segment.

use std::path::Path;
use std::process::Output;

#[path = "common/binary.rs"]
mod binary;
use binary::optirs;

const ARGS: &[&str] = &[
    "train",
    "v4-16",
    "--params",
    "20000",
    "--checkpoint-every",
    "0.00001",
];

fn train(extra: &[&str]) -> Output {
    optirs(&[ARGS, extra].concat())
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The checkpoint directories under `root`, by name.
fn names(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Every file of a checkpoint with its bytes.
fn contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn resume_skips_a_damaged_newest_checkpoint_and_leaves_it_as_it_was() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let straight = json(&train(&[
        "--steps",
        "16",
        "--json",
        "--checkpoint-dir",
        a.path().to_str().unwrap(),
    ]));
    let root = b.path().join("ckpt");
    let r = root.to_str().unwrap();
    json(&train(&["--steps", "8", "--json", "--checkpoint-dir", r]));
    let newest = root.join(names(&root).pop().unwrap());
    let world = newest.join("world.bin");
    let mut bytes = std::fs::read(&world).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&world, &bytes).unwrap();
    let damaged = contents(&newest);
    let copy = b.path().join("copy");
    copy_root(&root, &copy);
    let verify = optirs(&["checkpoint", "verify", newest.to_str().unwrap()]);
    assert_eq!(verify.status.code(), Some(1));

    let out = train(&["--steps", "16", "--json", "--resume", r]);
    let report = json(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let name = newest.file_name().unwrap().to_str().unwrap();
    assert!(
        stderr.contains("skipped") && stderr.contains(name) && stderr.contains("world.bin"),
        "{stderr}"
    );
    let resumed = &report["resumed_from"];
    assert_ne!(resumed["path"].as_str().unwrap(), newest.to_str().unwrap());
    let skipped = resumed["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 1, "{resumed}");
    assert_eq!(skipped[0]["path"], newest.to_str().unwrap());
    assert!(
        skipped[0]["problem"]
            .as_str()
            .unwrap()
            .contains("world.bin")
    );
    assert_eq!(report["steps_completed"], 16);
    // The run from the checkpoint before it is the run never stopped.
    assert_eq!(report["world_sha256"], straight["world_sha256"]);
    // The damaged checkpoint is still there, byte for byte, and every
    // checkpoint written since has a name of its own.
    assert_eq!(contents(&newest), damaged);
    assert!(names(&root).len() > 1, "{:?}", names(&root));

    // The text report says it too.
    let text = train(&["--steps", "16", "--resume", copy.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.status.success(),
        "{}",
        String::from_utf8_lossy(&text.stderr)
    );
    assert!(
        stdout.contains("skipped") && stdout.contains(name),
        "{stdout}"
    );

    // Resuming again, from a newer good checkpoint, still leaves it be.
    json(&train(&["--steps", "20", "--json", "--resume", r]));
    assert_eq!(contents(&newest), damaged);
}

/// Copies the checkpoints of `from` into a new `to`.
fn copy_root(from: &Path, to: &Path) {
    for name in names(from) {
        std::fs::create_dir_all(to.join(&name)).unwrap();
        for (file, bytes) in contents(&from.join(&name)) {
            std::fs::write(to.join(&name).join(file), bytes).unwrap();
        }
    }
}

#[test]
fn a_resumed_report_tells_the_whole_run_from_its_segment() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let d = b.path().to_str().unwrap();
    let straight = json(&train(&[
        "--steps",
        "12",
        "--json",
        "--checkpoint-dir",
        a.path().to_str().unwrap(),
    ]));
    json(&train(&["--steps", "6", "--json", "--checkpoint-dir", d]));
    let resumed = json(&train(&["--steps", "12", "--json", "--resume", d]));
    // The whole run is the run never stopped: its steps, time and goodput.
    for key in [
        "steps_completed",
        "steps_attempted",
        "goodput",
        "simulated_seconds",
        "time_ns",
    ] {
        assert_eq!(resumed[key], straight[key], "{key}");
    }
    // The segment is this process's part only.
    let from = resumed["resumed_from"]["steps_completed"].as_u64().unwrap();
    let segment = &resumed["segment"];
    assert_eq!(segment["steps_completed"].as_u64().unwrap(), 12 - from);
    assert_eq!(segment["steps_attempted"].as_u64().unwrap(), 12 - from);
    let (part, whole) = (
        segment["simulated_seconds"].as_f64().unwrap(),
        resumed["simulated_seconds"].as_f64().unwrap(),
    );
    assert!(part > 0.0 && part < whole, "{part} of {whole}");
    assert_eq!(
        segment["time_ns"]["total_ns"].as_u64().unwrap(),
        segment["time_ns"]["productive_ns"].as_u64().unwrap()
            + segment["time_ns"]["checkpoint_write_ns"].as_u64().unwrap()
    );
    assert!(straight.get("segment").is_none());
    // The text labels both.
    let text = train(&["--steps", "13", "--resume", d]);
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(
        stdout.contains("13 steps completed (13 attempted) in the whole run"),
        "{stdout}"
    );
    assert!(
        stdout.contains("this segment: 1 step completed (1 attempted)"),
        "{stdout}"
    );
    assert!(stdout.contains("simulated in the whole run"), "{stdout}");
}

#[test]
fn steps_already_done_are_a_usage_error_naming_both_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    json(&train(&["--steps", "6", "--json", "--checkpoint-dir", d]));
    let before: Vec<_> = names(dir.path())
        .iter()
        .map(|n| contents(&dir.path().join(n)))
        .collect();
    for steps in ["3", "6"] {
        let out = train(&["--steps", steps, "--resume", d]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(stderr.contains(&format!("--steps {steps}")), "{stderr}");
        assert!(stderr.contains("6 steps completed"), "{stderr}");
        assert!(out.stdout.is_empty());
    }
    let after: Vec<_> = names(dir.path())
        .iter()
        .map(|n| contents(&dir.path().join(n)))
        .collect();
    assert_eq!(before, after);
}
