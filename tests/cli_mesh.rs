//! `train --strategy`, `--mesh` and `--prefetch`: the modeled step of each
//! strategy on a mesh, and the refusals, each before any work.

use std::process::Output;

#[path = "common/binary.rs"]
mod binary;
use binary::optirs;

const MULTISLICE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/pods/examples/v5e-16x2-multislice.ron"
);

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn json(args: &[&str]) -> serde_json::Value {
    let out = optirs(args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON value")
}

/// Exit code 2, one error line naming every `needle`, nothing on stdout.
fn assert_usage(args: &[&str], needles: &[&str]) {
    let out = optirs(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(out.stdout.is_empty(), "{args:?}");
    let first = err.lines().next().unwrap_or_default();
    for needle in needles {
        assert!(first.contains(needle), "`{needle}` not in: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn the_json_names_the_strategy_the_mesh_and_the_hbm_by_kind() {
    let r = json(&[
        "train",
        "v5e-16",
        "--modeled-only",
        "--params",
        "1600000",
        "--strategy",
        "fsdp",
        "--prefetch",
        "2",
        "--json",
    ]);
    assert_eq!(r["strategy"], "fsdp");
    assert_eq!(r["mesh"], "data=1,fsdp=16,tensor=1");
    assert_eq!(
        r["mesh_axes"][1]["physical"],
        serde_json::json!(["axis0", "axis1"])
    );
    assert_eq!(r["prefetch"], 2);
    let kinds = &r["hbm_by_kind"];
    // 1.6e6 f32 over 16 devices: 400 kB shards.
    assert_eq!(kinds["params"], 400_000);
    assert_eq!(kinds["grads"], 400_000);
    assert_eq!(kinds["state"], 800_000);
    let sum: u64 = kinds
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(r["hbm_bytes_per_device"], sum);
    assert_eq!(r["fits_in_hbm"], true);
    assert_eq!(r["not_fitting"], serde_json::Value::Null);
    let phase_bytes: u64 = r["phase_bytes"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(phase_bytes, r["link_bytes"].as_u64().unwrap());
    assert!(r["axes"]["axis0"]["seconds"].as_f64().unwrap() > 0.0);
}

#[test]
fn replicated_is_the_default_and_fsdp_holds_less() {
    let base = [
        "train",
        MULTISLICE,
        "--modeled-only",
        "--params",
        "100000000",
        "--json",
    ];
    let rep = json(&base);
    assert_eq!(rep["strategy"], "replicated");
    assert_eq!(rep["mesh"], "data=2,fsdp=16,tensor=1");
    assert_eq!(rep["prefetch"], serde_json::Value::Null);
    let explicit = json(
        &[
            &base[..],
            &["--strategy", "replicated", "--mesh", "fsdp=-1,data=2"],
        ]
        .concat(),
    );
    assert_eq!(
        explicit["hbm_bytes_per_device"],
        rep["hbm_bytes_per_device"]
    );
    assert_eq!(explicit["phases"], rep["phases"]);
    let fsdp = json(&[&base[..], &["--strategy", "fsdp"]].concat());
    let z2 = json(&[&base[..], &["--strategy", "zero2"]].concat());
    let hbm = |r: &serde_json::Value| r["hbm_bytes_per_device"].as_u64().unwrap();
    assert!(hbm(&fsdp) < hbm(&z2) && hbm(&z2) < hbm(&rep));
    // Data across the slices: the shard all-reduced over the DCN.
    assert!(fsdp["phases"]["reduce_scatter.dcn"].as_f64().unwrap() > 0.0);
    assert!(fsdp["phases"]["all_gather.dcn"].as_f64().unwrap() > 0.0);
    // --prefetch 0 is allowed: one gathered bucket in flight.
    let none = json(&[&base[..], &["--strategy", "fsdp", "--prefetch", "0"]].concat());
    assert_eq!(
        none["hbm_by_kind"]["gathered_buckets"],
        none["hbm_by_kind"]["gradient_bucket"]
    );
    // A mesh of the whole pod as fsdp: no DCN all-reduce, the shard halves
    // (to the 64-byte alignment).
    let flat = json(&[&base[..], &["--strategy", "fsdp", "--mesh", "fsdp=32"]].concat());
    let halved = flat["hbm_by_kind"]["params"].as_u64().unwrap() * 2;
    let whole = fsdp["hbm_by_kind"]["params"].as_u64().unwrap();
    assert!(halved.abs_diff(whole) <= 128, "{halved} vs {whole}");
    assert_eq!(
        flat["mesh_axes"][1]["physical"],
        serde_json::json!(["axis0", "axis1", "dcn"])
    );
}

#[test]
fn the_text_says_what_does_not_fit() {
    let out = optirs(&["train", "v5e-16", "--modeled-only", "--params", "4e9"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("replicated on mesh data=1,fsdp=16,tensor=1"),
        "{text}"
    );
    assert!(
        text.contains("does not fit: params 14.90 GiB + grads 14.90 GiB + state 1.86 GiB = 31.66 GiB of 16.00 GiB: 15.66 GiB over"),
        "{text}"
    );
    let out = optirs(&[
        "train",
        "v5e-16",
        "--modeled-only",
        "--params",
        "4e9",
        "--strategy",
        "fsdp",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("(fits)"), "{text}");
    assert!(!text.contains("does not fit"), "{text}");
}

#[test]
fn a_real_run_builds_every_strategy_on_every_mesh_and_reports_it() {
    let cases: [(&str, &str, Option<&str>, &str); 6] = [
        ("v5e-16", "zero2", None, "data=1,fsdp=16,tensor=1"),
        (
            "v5e-16",
            "fsdp",
            Some("data=4,fsdp=4"),
            "data=4,fsdp=4,tensor=1",
        ),
        (
            "v4-128",
            "zero2",
            Some("data=16,fsdp=-1"),
            "data=16,fsdp=4,tensor=1",
        ),
        // Hybrid across slices (the default), and fsdp across them.
        (MULTISLICE, "fsdp", None, "data=2,fsdp=16,tensor=1"),
        (
            MULTISLICE,
            "zero2",
            Some("fsdp=32"),
            "data=1,fsdp=32,tensor=1",
        ),
        (
            MULTISLICE,
            "replicated",
            Some("data=8,fsdp=4"),
            "data=8,fsdp=4,tensor=1",
        ),
    ];
    for (pod, strategy, mesh, shown) in cases {
        let mut args = vec![
            "train",
            pod,
            "--strategy",
            strategy,
            "--params",
            "1000",
            "--steps",
            "1",
            "--json",
        ];
        if let Some(mesh) = mesh {
            args.extend(["--mesh", mesh]);
        }
        let r = json(&args);
        assert_eq!(r["strategy"], strategy, "{args:?}");
        assert_eq!(r["mesh"], shown, "{args:?}");
        assert_eq!(r["steps_completed"], 1, "{args:?}");
    }
    // The redundant copies on a data axis that replicates the state.
    assert_usage(
        &[
            "train",
            "v4-128",
            "--strategy",
            "fsdp",
            "--mesh",
            "data=4,fsdp=16",
            "--recovery",
            "redundant",
        ],
        &[
            "--recovery redundant with --strategy fsdp on the mesh data=4,fsdp=16,tensor=1",
            "4 times",
        ],
    );
}

#[test]
fn bad_layouts_are_usage_errors_naming_the_axis_and_the_pod() {
    let modeled = |extra: &[&'static str]| -> Vec<&'static str> {
        [
            &["train", "v4-128", "--modeled-only", "--params", "1000"][..],
            extra,
        ]
        .concat()
    };
    assert_usage(
        &modeled(&["--mesh", "data=2,fsdp=32"]),
        &["mesh axis data=2 is not a product of whole axes of v4 4x4x4 (torus axes 4, 4, 4)"],
    );
    assert_usage(
        &modeled(&["--mesh", "data=4,data=4,fsdp=4"]),
        &["data is named twice", "v4 4x4x4"],
    );
    assert_usage(
        &modeled(&["--mesh", "tensor=4,fsdp=16"]),
        &["tensor=4 needs a model that declares how its tensors split"],
    );
    assert_usage(&modeled(&["--mesh", "model=4"]), &["`model`", "v4 4x4x4"]);
    assert_usage(
        &modeled(&["--mesh", "data=4,fsdp=4"]),
        &["has 16 devices but v4 4x4x4", "has 64"],
    );
    assert_usage(&modeled(&["--mesh", "data=NaN"]), &["data=NaN", "v4 4x4x4"]);
    assert_usage(&modeled(&["--mesh", "data=1e99"]), &["data=1e99"]);
    assert_usage(
        &modeled(&["--mesh", "data=-1,fsdp=-1"]),
        &["at most one axis takes the rest"],
    );
    assert_usage(&modeled(&["--strategy", "zero3"]), &["zero3"]);
    assert_usage(
        &modeled(&["--strategy", "fsdp", "--prefetch", "-1"]),
        &["--prefetch"],
    );
    assert_usage(
        &modeled(&["--strategy", "fsdp", "--prefetch", "NaN"]),
        &["--prefetch"],
    );
    assert_usage(
        &modeled(&["--strategy", "fsdp", "--prefetch", "1e400"]),
        &["--prefetch"],
    );
    assert_usage(
        &modeled(&["--prefetch", "2"]),
        &["--prefetch 2", "--strategy replicated"],
    );
    // Checked before any work: a real run with a bad mesh builds no pod.
    assert_usage(&["train", "v4-128", "--mesh", "data=3"], &["data=3"]);
    // Past the limit: refused, naming it.
    assert_usage(
        &modeled(&["--strategy", "fsdp", "--prefetch", "1e18"]),
        &["--prefetch", "4096"],
    );
    // A prefetch past the model's buckets holds no more than they (one here).
    let r = json(&modeled(&[
        "--strategy",
        "fsdp",
        "--prefetch",
        "4096",
        "--json",
    ]));
    let kinds = &r["hbm_by_kind"];
    assert_eq!(
        kinds["gathered_buckets"].as_u64().unwrap(),
        kinds["gradient_bucket"].as_u64().unwrap()
    );
}
