//! `train --modeled-only` against real runs of the same flags, under every
//! recovery policy; and the twisted torus's collectives against the plain
//! torus's.

#[path = "common/binary.rs"]
mod binary;
use binary::optirs;

fn json(args: &[&str]) -> serde_json::Value {
    let output = optirs(args);
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("stdout is one JSON value")
}

const TWISTED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/pods/examples/v4-4x4x8-twisted.ron"
);
/// The same 4x4x8 v4 slice untwisted (built of cubes, with a spare).
const CUBES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/pods/examples/v4-4x4x8-cubes.ron"
);
const MULTISLICE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/pods/examples/v5e-16x2-multislice.ron"
);

/// Relative closeness for modeled seconds: the two models add the same
/// terms, in a different order.
const TIME_TOLERANCE: f64 = 1e-9;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= TIME_TOLERANCE * a.abs().max(b.abs()) + 1e-15
}

fn f(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"))
}

#[test]
fn modeled_only_agrees_with_a_real_run_under_every_recovery_policy_and_strategy() {
    let steps = 2u64;
    let cases = [
        ("v5e-16", "rollback", "replicated", None),
        ("v5e-16", "redundant", "replicated", None),
        ("v4-16", "redundant", "replicated", None),
        (MULTISLICE, "redundant", "replicated", None),
        (TWISTED, "redundant", "replicated", None),
        (CUBES, "rollback", "replicated", None),
        (CUBES, "spare-cube", "replicated", None),
        ("v5e-16", "rollback", "zero2", None),
        ("v4-16", "redundant", "zero2", None),
        (CUBES, "spare-cube", "zero2", None),
        ("v5e-16", "rollback", "fsdp", None),
        ("v5e-16", "redundant", "fsdp", None),
        (TWISTED, "rollback", "fsdp", None),
        (CUBES, "spare-cube", "fsdp", None),
        // Meshes: data along torus axes, hybrid across slices (the
        // multislice default under zero2 and fsdp), fsdp across slices.
        ("v4-128", "redundant", "replicated", Some("data=4,fsdp=16")),
        ("v4-128", "rollback", "zero2", Some("data=4,fsdp=16")),
        ("v4-128", "rollback", "fsdp", Some("data=16,fsdp=4")),
        (CUBES, "spare-cube", "fsdp", Some("data=8,fsdp=-1")),
        (MULTISLICE, "rollback", "zero2", None),
        (MULTISLICE, "rollback", "fsdp", None),
        (MULTISLICE, "rollback", "replicated", Some("fsdp=32")),
        (MULTISLICE, "rollback", "fsdp", Some("fsdp=-1")),
        (MULTISLICE, "rollback", "zero2", Some("data=8,fsdp=4")),
    ];
    for (pod, recovery, strategy, mesh) in cases {
        let mut args = vec![
            "train",
            pod,
            "--params",
            "5000,300",
            "--steps",
            "2",
            "--bucket-bytes",
            "4096",
            "--recovery",
            recovery,
            "--strategy",
            strategy,
            "--json",
        ];
        if let Some(mesh) = mesh {
            args.extend(["--mesh", mesh]);
        }
        let real = json(&args);
        let modeled = json(&[&args[..], &["--modeled-only"]].concat());
        let what = format!("{pod} under {recovery}, {strategy}, mesh {mesh:?}");
        assert_eq!(modeled["strategy"], strategy, "{what}");
        assert_eq!(modeled["recovery"], recovery, "{what}");
        assert_eq!(modeled["chips"], real["chips"], "{what}");
        assert_eq!(modeled["buckets"], real["buckets"], "{what}");
        assert_eq!(
            modeled["hbm_bytes_per_device"], real["hbm_bytes_per_device"],
            "{what}: HBM per device"
        );
        let (m, r) = (f(&modeled["step_seconds"]), f(&real["step_seconds"]));
        assert!(close(m, r), "{what}: step {m} s modeled, {r} s real");
        let real_phases = real["phases"].as_object().unwrap();
        let modeled_phases = modeled["phases"].as_object().unwrap();
        assert_eq!(
            real_phases.keys().collect::<Vec<_>>(),
            modeled_phases.keys().collect::<Vec<_>>(),
            "{what}: phases"
        );
        for (k, v) in real_phases {
            assert!(
                close(f(&modeled_phases[k]), f(v)),
                "{what}: {k} {} vs {v}",
                modeled_phases[k]
            );
        }
        assert_eq!(
            modeled["link_bytes"].as_u64().unwrap() * steps,
            real["link_bytes"].as_u64().unwrap(),
            "{what}: link bytes per step"
        );
        // Per phase and per physical axis: the same bytes per step, the
        // same seconds.
        let real_bytes = real["phase_bytes"].as_object().unwrap();
        let modeled_bytes = modeled["phase_bytes"].as_object().unwrap();
        assert_eq!(
            real_bytes.keys().collect::<Vec<_>>(),
            modeled_bytes.keys().collect::<Vec<_>>(),
            "{what}: phase bytes"
        );
        for (k, v) in real_bytes {
            assert_eq!(
                modeled_bytes[k].as_u64().unwrap() * steps,
                v.as_u64().unwrap(),
                "{what}: {k} bytes"
            );
        }
        let real_axes = real["axes"].as_object().unwrap();
        let modeled_axes = modeled["axes"].as_object().unwrap();
        assert_eq!(
            real_axes.keys().collect::<Vec<_>>(),
            modeled_axes.keys().collect::<Vec<_>>(),
            "{what}: axes"
        );
        for (k, v) in real_axes {
            assert!(
                close(f(&modeled_axes[k]["seconds"]), f(&v["seconds"])),
                "{what}: axis {k} {} vs {}",
                modeled_axes[k]["seconds"],
                v["seconds"]
            );
            assert_eq!(
                modeled_axes[k]["link_bytes"].as_u64().unwrap() * steps,
                v["link_bytes"].as_u64().unwrap(),
                "{what}: axis {k} bytes"
            );
        }
        assert_eq!(
            real_phases.contains_key("replicate_state"),
            recovery == "redundant",
            "{what}"
        );
        // The real run ends each step on a tick at most one tick late.
        let (ms, rs) = (
            f(&modeled["simulated_seconds"]),
            f(&real["simulated_seconds"]),
        );
        let tick = real["tick_ns"].as_f64().unwrap() * 1e-9;
        assert!(
            ms <= rs * (1.0 + 1e-12) && rs <= ms + steps as f64 * tick + 1e-12,
            "{what}: simulated {ms} s modeled, {rs} s real"
        );
    }
}

#[test]
fn the_redundant_copies_cost_modeled_hbm_and_time() {
    let base = ["train", "v5e-16", "--params", "1000000", "--json"];
    let rollback = json(&[&base[..], &["--modeled-only"]].concat());
    let redundant = json(&[&base[..], &["--modeled-only", "--recovery", "redundant"]].concat());
    // Adam's two slots, one more copy of each device's 1/16 (62,500
    // elements of 4 bytes, aligned).
    let extra = redundant["hbm_bytes_per_device"].as_u64().unwrap()
        - rollback["hbm_bytes_per_device"].as_u64().unwrap();
    assert_eq!(extra, 2 * 250_048, "{redundant}");
    assert!(f(&redundant["phases"]["replicate_state"]) > 0.0);
    assert!(f(&redundant["step_seconds"]) > f(&rollback["step_seconds"]));
    assert!(rollback["phases"].get("replicate_state").is_none());
}

/// What a real run refuses, `--modeled-only` refuses the same way: the
/// same exit code and the same message.
#[test]
fn modeled_only_refuses_what_a_real_run_refuses() {
    let cases: &[&[&str]] = &[
        &["v5e-16", "--recovery", "spare-cube"],
        &[TWISTED, "--recovery", "spare-cube"],
        &["v5e-16", "--recovery", "spare-cube", "--kill", "3@0.001"],
        &["v5e-16", "--kill", "3@0.001"],
        &["v5e-16", "--recovery", "redundant", "--kill", "99@0.001"],
        &["v5e-16", "--tick-ms", "2000"],
        &["v5e-16", "--recovery", "mirror"],
        &["v5e-16", "--optimizer", "lamb"],
        &["v5e-16", "--params", "0"],
        &["v5e-16", "--bucket-bytes", "0"],
        &["no-such-pod"],
    ];
    for case in cases {
        let mut real_args = vec!["train"];
        real_args.extend_from_slice(case);
        if !case.contains(&"--params") {
            real_args.extend(["--params", "1000"]);
        }
        real_args.extend(["--steps", "1"]);
        let real = optirs(&real_args);
        let modeled = optirs(&[&real_args[..], &["--modeled-only"]].concat());
        assert!(!real.status.success(), "a real run accepts {case:?}");
        assert_eq!(
            modeled.status.code(),
            real.status.code(),
            "{case:?}: exit code; modeled stderr {}",
            String::from_utf8_lossy(&modeled.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&modeled.stderr),
            String::from_utf8_lossy(&real.stderr),
            "{case:?}: message"
        );
    }
}

/// What one closed-form, failure-free step cannot model is a usage error
/// naming the flags, not silently ignored.
#[test]
fn modeled_only_refuses_what_it_cannot_model() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("ck");
    let trace = dir.path().join("trace.json");
    for extra in [
        vec!["--recovery", "redundant", "--kill", "3@0.001"],
        vec!["--checkpoint-every", "0.001"],
        vec![
            "--checkpoint-every",
            "0.001",
            "--checkpoint-dir",
            checkpoints.to_str().unwrap(),
        ],
        vec!["--trace", trace.to_str().unwrap()],
    ] {
        let args = [
            &["train", "v5e-16", "--params", "1000", "--modeled-only"][..],
            &extra[..],
        ]
        .concat();
        let out = optirs(&args);
        assert_eq!(out.status.code(), Some(2), "{extra:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("need a real run") && stderr.lines().count() == 1,
            "{extra:?}: {stderr}"
        );
        assert!(!checkpoints.exists() && !trace.exists(), "nothing written");
    }
}

/// `--steps` counts in the modeled run: failure-free steps back to back.
#[test]
fn modeled_only_models_every_step_asked_for() {
    let one = json(&["train", "v4-16", "--modeled-only", "--steps", "1", "--json"]);
    let many = json(&[
        "train",
        "v4-16",
        "--modeled-only",
        "--steps",
        "1000",
        "--json",
    ]);
    assert_eq!(many["steps"], 1000);
    assert!(close(
        f(&many["simulated_seconds"]),
        1000.0 * f(&one["step_seconds"])
    ));
}

/// A plain 4x4x8 v4 torus, to compare the twisted one with.
fn plain_4x4x8(dir: &std::path::Path) -> String {
    let path = dir.join("v4-4x4x8.ron");
    std::fs::write(
        &path,
        "Pod(name: \"v4-4x4x8\", generation: \"v4\", shape: \"4x4x8\")",
    )
    .unwrap();
    path.to_str().unwrap().to_string()
}

/// A twisted axis runs two-way lines: a ring collective there moves no more
/// than on the plain torus, `2(N−1)/N` of the model per device per step.
/// It takes longer: the plain torus's rings send half of each part each
/// way, a line all of it one way at a time (at most `2(n−1)/n` of the
/// ring's time per pass).
#[test]
fn the_twisted_torus_moves_no_more_bytes_than_the_plain_one() {
    let dir = tempfile::tempdir().unwrap();
    let plain = plain_4x4x8(dir.path());
    let devices = 128u64;
    // A real run: 65,536 parameters split evenly over 128 devices.
    let params = 65_536u64;
    let run = |pod: &str| json(&["train", pod, "--params", "65536", "--steps", "2", "--json"]);
    let (twisted, untwisted) = (run(TWISTED), run(&plain));
    let per_device = |r: &serde_json::Value| r["link_bytes"].as_u64().unwrap() / 2 / devices;
    let ideal = 2 * (devices - 1) * params * 4 / devices;
    assert_eq!(
        per_device(&twisted),
        ideal,
        "exactly 2(N−1)/N × model bytes"
    );
    assert_eq!(per_device(&twisted), per_device(&untwisted));
    let (t, p) = (f(&twisted["step_seconds"]), f(&untwisted["step_seconds"]));
    assert!(t > p && t <= 2.0 * p, "twisted {t} s, plain {p} s");

    // The model, 1e6 parameters, in closed form: within 0.01 % of
    // 2(N−1)/N × 4 MB (the buckets are padded to a multiple of 128).
    let modeled = |pod: &str| {
        json(&[
            "train",
            pod,
            "--params",
            "1000000",
            "--modeled-only",
            "--json",
        ])
    };
    let (twisted, untwisted) = (modeled(TWISTED), modeled(&plain));
    let per_device = |r: &serde_json::Value| f(&r["link_bytes"]) / devices as f64;
    let ideal = 2.0 * 127.0 / 128.0 * 4e6;
    assert!(per_device(&twisted) <= per_device(&untwisted));
    assert!(
        (per_device(&twisted) / ideal - 1.0).abs() <= 1e-4,
        "{} vs {ideal}",
        per_device(&twisted)
    );
    let (t, p) = (f(&twisted["step_seconds"]), f(&untwisted["step_seconds"]));
    assert!(t > p && t <= 2.0 * p, "twisted {t} s, plain {p} s");

    // No faster than `topology`'s all-reduce bandwidth allows: the bytes
    // over the sum of every link's bandwidth both ways, the same figure for
    // both (the same links).
    let figure = |pod: &str| f(&json(&["topology", pod, "--json"])["allreduce_bytes_per_s"]);
    assert_eq!(figure(TWISTED), figure(&plain));
    let communication: f64 = twisted["phases"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.starts_with("reduce_scatter") || k.starts_with("all_gather"))
        .map(|(_, v)| f(v))
        .sum();
    assert!(communication >= f(&twisted["link_bytes"]) / figure(TWISTED));
}

/// A model of any size is modeled as fast as a small one (the closed form
/// jumps over its equal buckets), its byte counts past 2^64 written as
/// numbers; past the closed form's limit the input is refused, naming it.
#[test]
fn any_size_models_in_the_time_a_small_one_does() {
    for params in ["1e6", "1e17", "1e18"] {
        for strategy in ["replicated", "fsdp"] {
            let r = json(&[
                "train",
                "--params",
                params,
                "--modeled-only",
                "--strategy",
                strategy,
                "--json",
            ]);
            assert!(f(&r["step_seconds"]) > 0.0);
            assert!(f(&r["link_bytes"]) > 0.0);
            assert!(f(&r["wall_seconds"]) < 0.05, "{params} {strategy}: {r}");
        }
    }
    let r = json(&[
        "train",
        "--bucket-bytes",
        "64",
        "--params",
        "1e9",
        "--modeled-only",
        "--json",
    ]);
    assert_eq!(r["buckets"], 62_500_000);
    assert!(f(&r["wall_seconds"]) < 0.05);
    for args in [
        &["train", "--params", "2e18", "--modeled-only"][..],
        &["train", "--params", "1e18,1e18", "--modeled-only"][..],
    ] {
        let out = optirs(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("2^60"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
