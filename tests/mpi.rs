//! The pod over MPI ranks, under `mpirun` (built with `--features mpi`;
//! `.ci/run` installs OpenMPI and runs these).
#![cfg(feature = "mpi")]

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_optirs-tpu");

/// `mpirun` as any user, with more ranks than cores allowed.
fn mpirun() -> Command {
    let mut command = Command::new("mpirun");
    command
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .arg("--oversubscribe");
    command
}

fn output(command: &mut Command) -> Output {
    command
        .output()
        .expect("mpirun runs (install OpenMPI's mpirun)")
}

fn json_digest(stdout: &[u8]) -> (String, serde_json::Value) {
    let report: serde_json::Value = serde_json::from_slice(stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(stdout)));
    (report["world_sha256"].as_str().unwrap().to_string(), report)
}

/// `mpirun -n ranks` of the binary with `args`, which must succeed
/// (`what` and the ranks' stderr otherwise): the merged world's digest and
/// the report.
fn split_run<S: AsRef<std::ffi::OsStr>>(
    ranks: u32,
    args: impl IntoIterator<Item = S>,
    what: &str,
) -> (String, serde_json::Value) {
    let out = output(mpirun().args(["-n", &ranks.to_string(), BIN]).args(args));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    json_digest(&out.stdout)
}

fn single(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json_digest(&out.stdout).0
}

#[test]
fn every_preset_over_mpi_ranks_is_the_one_process_world() {
    for (preset, hosts, ticks) in [
        ("assets/pods/examples/v2-4x2-custom.ron", 2, "400"),
        ("v4-16", 2, "400"),
        ("v5e-16", 2, "400"),
        ("v3-64", 8, "300"),
        ("v4-128", 16, "300"),
        ("v5p-256", 32, "200"),
        ("v5e-256", 32, "200"),
        ("v6e-256", 32, "200"),
        ("tpu7x-512", 64, "200"),
        ("v4-8192", 1024, "10"),
    ] {
        let args = [
            "run", preset, "--steps", ticks, "--kill", "1@0.003", "--pause", "0@0.002", "--json",
        ];
        let one = single(&args);
        for ranks in [1u32, 2, 4] {
            if ranks > hosts {
                continue;
            }
            let (digest, report) = split_run(ranks, args, &format!("{preset} on {ranks} ranks"));
            assert_eq!(digest, one, "{preset} on {ranks} ranks");
            assert_eq!(report["ranks"], ranks, "{preset}");
        }
    }
}

#[test]
fn failures_over_ranks_are_detected_as_in_one_process() {
    let args = [
        "run", "v4-16", "--steps", "3000", "--kill", "6@0.5", "--json",
    ];
    let one = single(&args);
    let (digest, report) = split_run(2, args, "v4-16 with a kill on 2 ranks");
    assert_eq!(digest, one);
    let failures = report["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{report}");
    assert_eq!(failures[0]["device"], 6);
}

fn all_ranks_fail_with(out: &Output, ranks: u32, needle: &str) {
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for rank in 0..ranks {
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&format!("error: rank {rank}")) && l.contains(needle)),
            "rank {rank} does not say `{needle}`:\n{stderr}"
        );
    }
}

#[test]
fn more_ranks_than_hosts_is_an_error_on_every_rank() {
    let out = output(mpirun().args(["-n", "3", BIN, "run", "v4-16", "--steps", "10"]));
    all_ranks_fail_with(&out, 3, "3 ranks for a pod of 2 hosts");
}

#[test]
fn ranks_started_with_different_runs_or_pods_refuse_naming_the_difference() {
    let out = output(mpirun().args([
        "-n", "1", BIN, "run", "v4-16", "--steps", "100", ":", "-n", "1", BIN, "run", "v4-16",
        "--steps", "101",
    ]));
    all_ranks_fail_with(&out, 2, "101 ticks");
    let out = output(mpirun().args([
        "-n", "1", BIN, "run", "v4-16", "--steps", "10", ":", "-n", "1", BIN, "run", "v5e-16",
        "--steps", "10",
    ]));
    all_ranks_fail_with(&out, 2, "pod `v5e-16`");
}

#[test]
fn commands_that_run_as_one_process_refuse_a_split() {
    let out = output(mpirun().args(["-n", "2", BIN, "topology", "v4-16"]));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("only `run` and `train` split"), "{stderr}");
}

/// `train` on `preset`: three Adam steps of three small tensors in
/// 4 KiB buckets, as JSON.
fn three_steps_of_a_small_model(preset: &str) -> [&str; 11] {
    [
        "train",
        preset,
        "--params",
        "3000,77,512",
        "--bucket-bytes",
        "4096",
        "--steps",
        "3",
        "--optimizer",
        "adam",
        "--json",
    ]
}

#[test]
fn training_over_mpi_ranks_is_the_one_process_training() {
    for (preset, ranks) in [("v4-16", 1u32), ("v4-16", 2), ("v5e-16", 2), ("v3-64", 4)] {
        let args = three_steps_of_a_small_model(preset);
        let one = single(&args);
        let (digest, report) = split_run(ranks, args, &format!("{preset} on {ranks} ranks"));
        assert_eq!(digest, one, "{preset} trained on {ranks} ranks");
        assert_eq!(report["ranks"], ranks, "{preset}");
        assert_eq!(report["steps_completed"], 3, "{preset}");
    }
}

#[test]
fn split_training_by_messages_is_the_one_process_training() {
    // Ranks on one node read each other's members in an MPI-3 shared
    // window (the test above); `--no-shared-memory` moves the bytes by
    // MPI messages, as ranks on several nodes do: the same bits.
    for (preset, ranks) in [("v4-16", 2u32), ("v3-64", 4)] {
        let args = three_steps_of_a_small_model(preset);
        let one = single(&args);
        let by_messages = args.iter().copied().chain(["--no-shared-memory"]);
        let what = format!("{preset} on {ranks} ranks by messages");
        let (digest, _) = split_run(ranks, by_messages, &what);
        assert_eq!(digest, one, "{what}");
    }
}

#[test]
fn a_kill_in_split_training_recovers_from_redundant_copies_as_one_process_does() {
    let args = [
        "train",
        "v4-16",
        "--params",
        "3000,77",
        "--bucket-bytes",
        "4096",
        "--steps",
        "4",
        "--kill",
        "6@0.00004",
        "--recovery",
        "redundant",
        "--tick-ms",
        "0.001",
        "--json",
    ];
    let one = single(&args);
    let (digest, report) = split_run(2, args, "a redundant recovery on 2 ranks");
    assert_eq!(digest, one);
    assert_eq!(report["failures"][0]["device"], 6, "{report}");
    assert_eq!(report["recoveries"][0]["policy"], "redundant", "{report}");
    assert_eq!(report["steps_completed"], 4);
}

#[test]
fn split_training_refuses_a_checkpoint_directory_of_another_model() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().to_str().unwrap();
    let common = [
        "--steps",
        "8",
        "--checkpoint-every",
        "0.00002",
        "--checkpoint-dir",
        ck,
    ];
    let first = Command::new(BIN)
        .args(["train", "v4-16", "--params", "3000", "--json"])
        .args(common)
        .output()
        .unwrap();
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let out = output(
        mpirun()
            .args([
                "-n", "2", BIN, "train", "v4-16", "--params", "5000", "--json",
            ])
            .args(common),
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("another run"), "{stderr}");
}

#[test]
fn a_kill_in_split_training_rolls_back_to_the_split_checkpoint_as_one_process_does() {
    let (one_dir, split_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let args = |dir: &std::path::Path| -> Vec<String> {
        [
            "train",
            "v4-16",
            "--params",
            "3000,77",
            "--bucket-bytes",
            "4096",
            "--steps",
            "4",
            "--kill",
            "6@0.00007",
            "--recovery",
            "rollback",
            "--checkpoint-every",
            "0.00002",
            "--tick-ms",
            "0.001",
            "--json",
            "--checkpoint-dir",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([dir.display().to_string()])
        .collect()
    };
    let one_args = args(one_dir.path());
    let one = single(&one_args.iter().map(String::as_str).collect::<Vec<_>>());
    let (digest, report) = split_run(2, args(split_dir.path()), "a rollback on 2 ranks");
    assert_eq!(digest, one, "{report}");
    assert_eq!(report["recoveries"][0]["policy"], "rollback", "{report}");
    // The rollback read a split checkpoint: rank parts under a commit record.
    let split = std::fs::read_dir(split_dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| e.path().join("ranks.ron").is_file());
    assert!(
        split,
        "no split checkpoint in {}",
        split_dir.path().display()
    );
}

#[test]
fn split_training_refuses_what_it_does_not_do_and_mismatched_ranks() {
    let out = output(mpirun().args([
        "-n", "2", BIN, "train", "v4-16", "--params", "100", "--kill", "1@0.001",
    ]));
    all_ranks_fail_with(
        &out,
        2,
        "--kill with --recovery rollback needs --checkpoint-every",
    );
    let out = output(mpirun().args([
        "-n", "1", BIN, "train", "v4-16", "--params", "100", "--lr", "0.1", ":", "-n", "1", BIN,
        "train", "v4-16", "--params", "100", "--lr", "0.2",
    ]));
    all_ranks_fail_with(&out, 2, "lr 0.2");
}

/// Starts a long run on `ranks` ranks, waits until every rank is stepping,
/// signals one rank's process, and returns (stderr, seconds from the
/// signal to the end of the job).
fn signal_a_rank(
    ranks: u32,
    rank: u32,
    signal: &str,
    extra: &[&str],
    run_extra: &[&str],
) -> (String, f64) {
    let run = ["run", "v3-64", "--steps", "100000000"];
    signal_a_rank_of(&run, ranks, rank, signal, extra, run_extra)
}

/// [`signal_a_rank`] of a job running `job` (a command and its arguments).
fn signal_a_rank_of(
    job: &[&str],
    ranks: u32,
    rank: u32,
    signal: &str,
    extra: &[&str],
    run_extra: &[&str],
) -> (String, f64) {
    /// Kills the job if the test fails before it ends.
    struct Job(std::process::Child);
    impl Drop for Job {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut job = Job(mpirun()
        .args(extra)
        .args(["-n", &ranks.to_string(), BIN])
        .args(job)
        .args(["--rank-timeout", "2"])
        .args(run_extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap());
    let child = &mut job.0;
    // The ranks are mpirun's children, each with its rank in the environment.
    let parent = child.id().to_string();
    let pid = |r: u32| -> Option<String> {
        let wanted = format!("OMPI_COMM_WORLD_RANK={r}");
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            let ppid = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().nth(1));
            if ppid != Some(parent.as_str()) {
                continue;
            }
            let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
            if String::from_utf8_lossy(&environ)
                .split('\0')
                .any(|v| v == wanted)
            {
                return Some(entry.file_name().to_string_lossy().into_owned());
            }
        }
        None
    };
    let started = Instant::now();
    let target = loop {
        if let Some(p) = pid(rank)
            && (0..ranks).all(|r| pid(r).is_some())
        {
            break p;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "ranks never started"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // Let every rank get past start-up into the stepping loop.
    std::thread::sleep(Duration::from_secs(3));
    let signalled = Instant::now();
    assert!(
        Command::new("kill")
            .args([signal, &target])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Duration::from_secs(60);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if signalled.elapsed() > deadline {
            panic!("the job still runs {deadline:?} after rank {rank} got {signal}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let seconds = signalled.elapsed().as_secs_f64();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (stderr, seconds)
}

#[test]
fn a_hung_rank_is_named_with_its_hosts_by_every_other_rank_within_the_bound() {
    let (stderr, seconds) = signal_a_rank(4, 1, "-STOP", &[], &[]);
    for rank in [0, 2, 3] {
        assert!(
            stderr.contains(&format!(
                "error: rank {rank}: rank 1 (hosts 2..=3) was lost"
            )),
            "rank {rank}:\n{stderr}"
        );
    }
    assert!(seconds < 20.0, "{seconds} s");
}

#[test]
fn a_rank_hung_in_split_training_is_named_within_the_bound() {
    // The split step's ranks meet at the shared window's fences (one node):
    // a stopped rank is named there, or in the tick's exchange, within the
    // bound, and the job ends.
    let train = [
        "train",
        "v4-16",
        "--params",
        "200000,3000",
        "--bucket-bytes",
        "65536",
        "--steps",
        "100000000",
    ];
    let (stderr, seconds) = signal_a_rank_of(&train, 2, 1, "-STOP", &[], &[]);
    assert!(
        stderr.contains("error: rank 0: rank 1 (hosts") && stderr.contains("was lost"),
        "{stderr}"
    );
    assert!(seconds < 20.0, "{seconds} s");
}

#[test]
fn a_killed_rank_ends_the_job_naming_it() {
    // The launcher sees the death and ends the job at once.
    let (stderr, seconds) = signal_a_rank(4, 2, "-KILL", &[], &[]);
    assert!(stderr.contains("rank 2"), "{stderr}");
    assert!(seconds < 20.0, "{seconds} s");
    // With recovery on, the launcher leaves the others running: their own
    // bound names the lost rank and its hosts.
    let (stderr, seconds) = signal_a_rank(4, 2, "-KILL", &["--enable-recovery"], &[]);
    for rank in [0, 1, 3] {
        assert!(
            stderr.contains(&format!(
                "error: rank {rank}: rank 2 (hosts 4..=5) was lost"
            )),
            "rank {rank}:\n{stderr}"
        );
    }
    assert!(seconds < 20.0, "{seconds} s");
}

#[test]
fn a_checkpoint_written_by_four_ranks_restores_on_two_ranks_and_one_process() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().to_str().unwrap();
    let out = output(
        mpirun()
            .args(["-n", "4", BIN, "run", "v3-64", "--steps", "200"])
            .args([
                "--kill",
                "9@0.5",
                "--checkpoint-every",
                "1",
                "--checkpoint-dir",
                dir,
                "--keep-checkpoints",
                "1",
                "--json",
            ]),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Retention kept the newest only.
    let names: Vec<String> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["tick-000000000200"]);
    let saved = root.path().join("tick-000000000200");
    let saved = saved.to_str().unwrap();
    let verify = Command::new(BIN)
        .args(["checkpoint", "verify", saved])
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );
    assert!(String::from_utf8_lossy(&verify.stdout).contains("4 parts"));
    let one = single(&[
        "run", "v3-64", "--steps", "300", "--kill", "9@0.5", "--json",
    ]);
    let continued = [
        "run",
        "v3-64",
        "--steps",
        "100",
        "--restore",
        saved,
        "--json",
    ];
    assert_eq!(
        single(&continued),
        one,
        "one process from the split checkpoint"
    );
    let out = output(mpirun().args(["-n", "2", BIN]).args(continued));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        json_digest(&out.stdout).0,
        one,
        "two ranks from four ranks' checkpoint"
    );
}

#[test]
fn a_killed_rank_leaves_the_last_committed_checkpoint_valid() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().to_str().unwrap().to_string();
    let extra = [
        "--checkpoint-every",
        "0.5",
        "--checkpoint-dir",
        &dir,
        "--keep-checkpoints",
        "2",
    ];
    let (_, seconds) = signal_a_rank(4, 3, "-KILL", &[], &extra);
    assert!(seconds < 20.0, "{seconds} s");
    let mut committed: Vec<String> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("tick-"))
        .collect();
    committed.sort();
    assert!(
        !committed.is_empty(),
        "no checkpoint was committed before the kill"
    );
    for name in committed {
        let path = root.path().join(&name);
        let verify = Command::new(BIN)
            .args(["checkpoint", "verify", path.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            verify.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&verify.stderr)
        );
    }
}
