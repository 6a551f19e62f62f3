//! Inputs that are not regular files, oversized inputs, and paths that are
//! not what a command expects, run as a user would: every loader refuses a
//! named pipe, a device and a directory naming the file, without blocking
//! (each command runs under a timeout, so a regression fails instead of
//! hanging); checkpoint commands say what a path is when it is not a
//! checkpoint.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use optirs_tpu::checkpoint::{CheckpointError, check_storage_root, write_checkpoint};

/// Longer than any of these commands takes in a debug build; a command
/// still running then is blocked on its input.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Runs the binary, killing it (and failing) if it runs past [`TIMEOUT`].
fn optirs(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_optirs-tpu"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let started = Instant::now();
    loop {
        if child
            .try_wait()
            .expect("the child can be waited on")
            .is_some()
        {
            return child.wait_with_output().expect("its output");
        }
        if started.elapsed() > TIMEOUT {
            let _ = child.kill();
            let output = child.wait_with_output().expect("its output");
            panic!(
                "`optirs-tpu {}` still ran after {TIMEOUT:?} (blocked on its input?); stderr: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs a command that must fail with exit code 1 and one line on stderr
/// containing every one of `expected`.
fn refused(args: &[&str], expected: &[&str]) -> String {
    let output = optirs(args);
    let message = stderr(&output);
    assert_eq!(
        output.status.code(),
        Some(1),
        "`optirs-tpu {}`: {message}",
        args.join(" ")
    );
    for part in expected {
        assert!(
            message.contains(part),
            "`optirs-tpu {}` does not say `{part}`: {message}",
            args.join(" ")
        );
    }
    assert_eq!(message.trim_end().lines().count(), 1, "{message}");
    message
}

fn mkfifo(path: &Path) {
    let name = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo reads nothing else.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn a_named_pipe_a_device_and_a_directory_are_refused_as_pod_files() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("ff.ron");
    mkfifo(&fifo);
    refused(&["topology", s(&fifo)], &["ff.ron", "is a named pipe"]);
    refused(
        &["run", s(&fifo), "--steps", "1"],
        &["ff.ron", "named pipe"],
    );
    refused(&["topology", "/dev/zero"], &["/dev/zero", "is a device"]);
    let sub = dir.path().join("pods.ron");
    std::fs::create_dir(&sub).unwrap();
    refused(&["topology", s(&sub)], &["pods.ron", "is a directory"]);
}

#[test]
fn an_oversized_pod_file_is_refused_by_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.ron");
    let file = std::fs::File::create(&big).unwrap();
    file.set_len(optirs_tpu::topology::MAX_POD_FILE_BYTES + 1)
        .unwrap();
    refused(
        &["topology", s(&big)],
        &[
            "big.ron",
            "16777217 bytes",
            "more than the 16777216 bytes a pod file may have",
        ],
    );
}

#[test]
fn a_named_pipe_a_device_and_a_directory_are_refused_as_program_files() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("ff.ron");
    mkfifo(&fifo);
    refused(&["compile", s(&fifo)], &["ff.ron", "is a named pipe"]);
    refused(&["compile", "/dev/zero"], &["/dev/zero", "is a device"]);
    refused(&["compile", s(dir.path())], &["is a directory"]);
    let big = dir.path().join("big.ron");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(optirs_tpu::compiler::MAX_PROGRAM_FILE_BYTES + 1)
        .unwrap();
    refused(
        &["compile", s(&big)],
        &["big.ron", "a program file may have"],
    );
}

/// A storage root with one checkpoint `ck` of a v4-16 at tick 5.
fn saved_checkpoint() -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let ck = root.path().join("ck");
    let output = optirs(&[
        "checkpoint",
        "save",
        "v4-16",
        "--steps",
        "5",
        "--out",
        s(&ck),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    (root, ck)
}

/// What an entry is, and how to make one at a path.
type Replacement = (&'static str, fn(&Path));

#[test]
fn a_checkpoint_file_that_is_not_a_regular_file_is_refused_by_every_command() {
    let replacements: [Replacement; 3] = [
        ("a named pipe", mkfifo),
        ("a directory", |p| std::fs::create_dir(p).unwrap()),
        ("a symbolic link", |p| {
            std::os::unix::fs::symlink("/dev/zero", p).unwrap()
        }),
    ];
    for (found, replace) in replacements {
        let (root, ck) = saved_checkpoint();
        let world = ck.join("world.bin");
        std::fs::remove_file(&world).unwrap();
        replace(&world);
        let expected = ["world.bin", &format!("is {found}, not a regular file")];
        refused(&["checkpoint", "verify", s(&ck)], &expected);
        refused(&["checkpoint", "restore", s(&ck)], &expected);
        refused(&["checkpoint", "inspect", s(&ck)], &expected);
        refused(&["run", "v4-16", "--restore", s(&ck)], &expected);
        // Listed with its problem, never as valid.
        let listed = optirs(&["checkpoint", "list", s(root.path()), "--json"]);
        assert!(listed.status.success(), "{}", stderr(&listed));
        let listings: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
        let problem = listings[0]["problem"].as_str().unwrap_or_default();
        assert!(
            problem.contains("world.bin") && problem.contains(found),
            "{found}: {listings}"
        );
        let text = stdout(&optirs(&["checkpoint", "list", s(root.path())]));
        assert!(!text.contains(" ok"), "{found}: {text}");
    }
}

#[test]
fn a_storage_root_given_as_a_checkpoint_names_its_newest() {
    let (root, ck) = saved_checkpoint();
    let newer = root.path().join("later");
    let output = optirs(&[
        "checkpoint",
        "save",
        "v4-16",
        "--steps",
        "9",
        "--out",
        s(&newer),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let message = refused(
        &["checkpoint", "verify", s(root.path())],
        &[
            "is a storage root holding 2 checkpoints, not a checkpoint",
            s(&newer),
        ],
    );
    assert!(!message.contains("listed in the manifest"), "{message}");
    refused(
        &["checkpoint", "restore", s(root.path())],
        &["is a storage root holding 2 checkpoints"],
    );
    let summary = check_storage_root(root.path()).unwrap();
    assert!(summary.exists);
    assert_eq!(
        summary.checkpoints,
        vec![("later".to_string(), 9), ("ck".to_string(), 5)]
    );
    assert_eq!(summary.newest(), Some(newer));
    // A directory with neither a manifest nor checkpoints is not one.
    let empty = root.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    refused(
        &["checkpoint", "verify", s(&empty)],
        &["not a checkpoint: it has no `manifest.ron`"],
    );
    // A split checkpoint whose commit record is a pipe is refused naming
    // it, not taken for a storage root because of its parts.
    let split = root.path().join("split");
    std::fs::create_dir(&split).unwrap();
    std::fs::rename(&ck, split.join("rank-0")).unwrap();
    let record = split.join(optirs_tpu::checkpoint::split::SPLIT_MANIFEST);
    mkfifo(&record);
    refused(
        &["checkpoint", "verify", s(&split)],
        &["ranks.ron", "is a named pipe, not a regular file"],
    );
}

#[test]
fn saving_over_something_that_is_not_a_checkpoint_says_what_is_there() {
    let (root, ck) = saved_checkpoint();
    let snapshot = optirs_tpu::Pod::from_preset("v4-16")
        .unwrap()
        .snapshot()
        .unwrap();
    let save = |name: &str| {
        write_checkpoint(root.path(), name, "v4-16", &snapshot, &mut |_| Ok(()))
            .unwrap_err()
            .to_string()
    };
    assert!(save("ck").contains("a checkpoint with this name exists"));
    let other = root.path().join("notes");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("a.txt"), "x").unwrap();
    let message = save("notes");
    assert!(
        message.contains("notes: exists and is a directory without a manifest, not a checkpoint"),
        "{message}"
    );
    std::fs::write(root.path().join("file"), "x").unwrap();
    let message = save("file");
    assert!(
        message.contains("exists and is a regular file, not a checkpoint"),
        "{message}"
    );
    // The command line refuses any existing --out before the pod runs.
    let output = optirs(&["checkpoint", "save", "v4-16", "--out", s(&other)]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("already exists"),
        "{}",
        stderr(&output)
    );
    drop(ck);
}

#[test]
fn a_storage_root_that_is_a_file_is_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("store");
    std::fs::write(&file, "x").unwrap();
    let output = optirs(&["checkpoint", "save", "v4-16", "--out", s(&file.join("ck"))]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("store is not a directory"),
        "{}",
        stderr(&output)
    );
    refused(
        &["checkpoint", "list", s(&file)],
        &["store", "is a regular file, not a directory"],
    );
    let error = check_storage_root(&file.join("deeper/still")).unwrap_err();
    assert!(
        matches!(&error, CheckpointError::RootNotDirectory { path, .. } if path == &file),
        "{error}"
    );
    let missing = check_storage_root(&dir.path().join("new")).unwrap();
    assert!(!missing.exists && missing.checkpoints.is_empty());
    // A root that is not there is a bad path on the command line (exit 2).
    let output = optirs(&["checkpoint", "list", s(&dir.path().join("new"))]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("no such storage root"));
}
