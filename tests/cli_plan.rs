//! `plan` from the command line: the ranking and the commands it prints,
//! `train`'s searched layout, goodput in the objective, pods compared, the
//! picture, and the refusals.

#[path = "common/binary.rs"]
mod binary;
#[path = "common/cli_json.rs"]
mod cli_json;
use binary::optirs;
use cli_json::{json, usage_error};

use serde_json::Value;

const POD: &str = "v5e-64";
const MODEL: &str = "maxtext-v5e-16b";

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The ranking fits, is sorted, beats the faster layouts only by fitting,
/// and each row's command models exactly that row.
#[test]
fn every_ranked_row_fits_and_its_command_models_it() {
    let plan = json(&["plan", POD, "--model", MODEL, "--top", "3", "--json"]);
    assert_eq!(plan["ranked_by"], "tokens_per_s_per_chip");
    let ranked = plan["ranked"].as_array().unwrap();
    assert_eq!(ranked.len(), 3, "{plan}");
    let best = f(&ranked[0]["tokens_per_s_per_chip"]);
    for pair in ranked.windows(2) {
        assert!(f(&pair[0]["tokens_per_s_per_chip"]) >= f(&pair[1]["tokens_per_s_per_chip"]));
    }
    for row in ranked {
        assert_eq!(row["fits_in_hbm"], true, "{row}");
        assert!(f(&row["hbm_margin_bytes"]) >= 0.0, "{row}");
        assert!(f(&row["mfu"]) > 0.0 && f(&row["mfu"]) <= 1.0, "{row}");
        let command = row["command"].as_str().unwrap();
        let words: Vec<&str> = command
            .strip_prefix("optirs-tpu ")
            .unwrap()
            .split(' ')
            .chain(["--json"])
            .collect();
        let step = json(&words);
        assert_eq!(step["fits_in_hbm"], true, "{command}: {step}");
        assert_eq!(step["mesh"], row["mesh"], "{command}");
        assert_eq!(step["strategy"], row["strategy"], "{command}");
        assert_eq!(step["remat"], row["remat"], "{command}");
        // The same model of the same layout: the same figures, bit for bit.
        assert_eq!(step["step_seconds"], row["step_seconds"], "{command}");
        assert_eq!(step["tokens_per_s_per_chip"], row["tokens_per_s_per_chip"]);
        assert_eq!(step["hbm_bytes_per_device"], row["hbm_bytes_per_device"]);
    }
    // Below #1, each row says what it loses by.
    assert!(ranked[0]["loses_by"].is_null());
    for row in &ranked[1..] {
        assert!(row["loses_by"].is_string(), "{row}");
    }
    // The rejected layouts shown are the faster ones that do not fit.
    let rejected = plan["rejected"].as_array().unwrap();
    assert!(!rejected.is_empty(), "{plan}");
    for row in rejected {
        assert_eq!(row["fits_in_hbm"], false, "{row}");
        assert!(f(&row["tokens_per_s_per_chip"]) >= best, "{row}");
        assert!(
            row["not_fitting"].as_str().unwrap().contains("over"),
            "{row}"
        );
    }
    // The search is deterministic, and pruning never changes the ranking.
    let again = json(&["plan", POD, "--model", MODEL, "--top", "3", "--json"]);
    assert_eq!(again["ranked"], plan["ranked"]);
    let exhaustive = json(&[
        "plan",
        POD,
        "--model",
        MODEL,
        "--top",
        "3",
        "--exhaustive",
        "--json",
    ]);
    assert_eq!(exhaustive["ranked"], plan["ranked"]);
    let search = &plan["search"];
    assert!(
        f(&search["modeled"]) < f(&exhaustive["search"]["modeled"]),
        "{search}"
    );
}

/// `train --model --modeled-only` with no layout takes the search's #1.
#[test]
fn train_without_a_layout_models_the_plans_best() {
    let plan = json(&["plan", POD, "--model", MODEL, "--top", "1", "--json"]);
    // train keeps the model's remat policy; so does this plan.
    let remat = optirs_tpu::model::bundled(MODEL).unwrap().remat;
    let narrowed = json(&[
        "plan",
        POD,
        "--model",
        MODEL,
        "--top",
        "1",
        "--remat",
        remat.name(),
        "--data-reduction",
        "after-backward",
        "--json",
    ]);
    let best = &narrowed["ranked"][0];
    let train = json(&["train", POD, "--model", MODEL, "--modeled-only", "--json"]);
    let search = &train["layout_search"];
    assert_eq!(search["fits"], true, "{train}");
    assert_eq!(train["mesh"], best["mesh"], "{train}");
    assert_eq!(train["strategy"], best["strategy"]);
    assert_eq!(
        train["tokens_per_s_per_chip"],
        best["tokens_per_s_per_chip"]
    );
    // The full search (every remat policy) is at least as fast.
    assert!(f(&plan["ranked"][0]["tokens_per_s_per_chip"]) >= f(&best["tokens_per_s_per_chip"]));
    // An explicit strategy wins over the search.
    let given = json(&[
        "train",
        POD,
        "--model",
        MODEL,
        "--modeled-only",
        "--strategy",
        "fsdp",
        "--json",
    ]);
    assert!(
        given.get("layout_search").is_none_or(Value::is_null),
        "{given}"
    );
    assert_eq!(given["strategy"], "fsdp");
}

/// With --mtbf-hours the ranking is by tokens/s × goodput: never above the
/// raw rate, sorted, and a row with a faster step below #1 loses by its
/// goodput and says so.
#[test]
fn goodput_ranks_by_effective_throughput() {
    let args = [
        "plan",
        POD,
        "--model",
        MODEL,
        "--top",
        "3",
        "--strategy",
        "zero2,fsdp",
        "--mesh",
        "fsdp=8,tensor=8",
        "--remat",
        "minimal_offloaded",
        "--mtbf-hours",
        "20",
        "--days",
        "2",
        "--json",
    ];
    let plan = json(&args);
    assert_eq!(plan["ranked_by"], "effective_tokens_per_s_per_chip");
    let ranked = plan["ranked"].as_array().unwrap();
    assert!(!ranked.is_empty(), "{plan}");
    let first_step = f(&ranked[0]["step_seconds"]);
    for row in ranked {
        let goodput = f(&row["goodput"]);
        assert!(goodput > 0.0 && goodput <= 1.0, "{row}");
        let effective = f(&row["effective_tokens_per_s_per_chip"]);
        assert!(effective <= f(&row["tokens_per_s_per_chip"]), "{row}");
    }
    for pair in ranked.windows(2) {
        assert!(
            f(&pair[0]["effective_tokens_per_s_per_chip"])
                >= f(&pair[1]["effective_tokens_per_s_per_chip"])
        );
    }
    // Failures every 19 minutes: redundant copies beat rollback, so
    // zero2's faster step (rollback; its copy does not fit) ranks below.
    let faster: Vec<&Value> = ranked[1..]
        .iter()
        .filter(|row| f(&row["step_seconds"]) < first_step)
        .collect();
    assert!(!faster.is_empty(), "{plan}");
    for row in faster {
        let why = row["loses_by"].as_str().unwrap();
        assert!(why.contains("goodput -"), "{row}");
    }
    assert_eq!(json(&args)["ranked"], plan["ranked"], "seeded, so replayed");
}

/// --pods ranks pods by time to train; chip-hours follow from it, and a
/// cost appears only with a price.
#[test]
fn pods_are_compared_by_time_to_train() {
    let args = [
        "plan",
        "--pods",
        "v5e-64,v5e-128",
        "--model",
        MODEL,
        "--tokens",
        "1e12",
        "--json",
    ];
    let r = json(&args);
    let pods = r["pods"].as_array().unwrap();
    assert_eq!(pods.len(), 2, "{r}");
    let seconds: Vec<f64> = pods.iter().map(|p| f(&p["seconds_to_train"])).collect();
    assert!(seconds[0] <= seconds[1], "{r}");
    for p in pods {
        let chips = f(&p["chips"]);
        let hours = f(&p["seconds_to_train"]) / 3600.0;
        assert!((f(&p["chip_hours"]) - chips * hours).abs() <= 1e-9 * chips * hours);
        assert!(p["cost"].is_null(), "no price, no cost: {p}");
        assert_eq!(p["best"]["recovery"], "rollback", "{p}");
        // Every pod is planned at the first pod's global batch.
        assert!(
            p["command"]
                .as_str()
                .unwrap()
                .contains("--global-batch 384"),
            "{p}"
        );
    }
    let mut priced = args.to_vec();
    priced.extend(["--price-per-chip-hour", "1.5"]);
    let r = json(&priced);
    for p in r["pods"].as_array().unwrap() {
        assert!((f(&p["cost"]) - 1.5 * f(&p["chip_hours"])).abs() < 1e-6 * f(&p["cost"]));
    }
}

/// --svg plots every layout, and never overwrites a file.
#[test]
fn the_picture_is_written_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plan.svg");
    let path_text = path.to_str().unwrap();
    let args = ["plan", POD, "--model", MODEL, "--svg", path_text];
    let out = optirs(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(
        svg.contains("<svg") && svg.contains(">Pareto front"),
        "{svg}"
    );
    usage_error(&args, "exists");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), svg);
}

/// A pod on which nothing fits names the nearest layout and what would
/// hold it; malformed values and a space narrowed to nothing exit 2.
#[test]
fn plan_refusals_exit_2_with_the_reason() {
    let err = usage_error(&["plan", "v5e-16", "--model", MODEL], "nothing fits");
    assert!(err.contains("nearest to fitting"), "{err}");
    assert!(err.contains("a pod of at least"), "{err}");
    for (extra, needle) in [
        (&["--global-batch", "0"][..], "--global-batch"),
        (&["--top", "0"][..], "--top"),
        (&["--tokens-per-step", "1000"][..], "sequence"),
        (&["--remat", "custom"][..], "custom"),
        (&["--remat", "everything"][..], "everything"),
        (&["--mesh", "tensor=3,fsdp=-1"][..], "--mesh"),
        (&["--days", "3"][..], "--mtbf-hours"),
        (&["--price-per-chip-hour", "2"][..], "--pods"),
        (&["--strategy", "zero9"][..], "zero9"),
        (&["--mtbf-hours", "nan"][..], "mean time between failures"),
        (&["--tokens", "1e300"][..], "--tokens"),
        (
            &["--strategy", "replicated", "--prefetch", "2"][..],
            "--prefetch",
        ),
        (
            &["--mesh", "stage=8,fsdp=8", "--no-stages"][..],
            "--no-stages",
        ),
        (
            &["--mesh", "data=2,stage=2,fsdp=-1"][..],
            "cannot be laid out",
        ),
    ] {
        let mut args = vec!["plan", POD, "--model", MODEL];
        args.extend_from_slice(extra);
        usage_error(&args, needle);
    }
    usage_error(&["plan", POD, "--model", "no-such-model"], "no-such-model");
}

/// `goodput --model --strategy auto` runs the search `train` runs, and
/// refuses a pod on which nothing fits, naming the nearest layout.
#[test]
fn goodput_searches_the_layout_with_auto() {
    let train = json(&["train", POD, "--model", MODEL, "--modeled-only", "--json"]);
    let goodput_args = [
        "goodput",
        POD,
        "--model",
        MODEL,
        "--strategy",
        "auto",
        "--mtbf-hours",
        "50000",
        "--days",
        "2",
        "--json",
    ];
    let goodput = json(&goodput_args);
    assert_eq!(
        goodput["layout_search"]["chosen"], train["layout_search"]["chosen"],
        "{goodput}"
    );
    assert_eq!(goodput["model_step"]["mesh"], train["mesh"]);
    assert_eq!(goodput["model_step"]["step_seconds"], train["step_seconds"]);
    let g = f(&goodput["goodput"]);
    assert!(g > 0.9 && g <= 1.0, "{goodput}");
    // Without auto the default is fsdp on the pod's default mesh, as before.
    let mut default = goodput_args.to_vec();
    default.drain(4..6);
    let fsdp = json(&default);
    assert_eq!(fsdp["model_step"]["strategy"], "fsdp");
    assert!(fsdp.get("layout_search").is_none_or(Value::is_null));
    let err = usage_error(
        &[
            "goodput",
            "v5e-16",
            "--model",
            MODEL,
            "--strategy",
            "auto",
            "--mtbf-hours",
            "50000",
            "--days",
            "2",
        ],
        "no layout --strategy auto searched fits",
    );
    assert!(err.contains("the nearest"), "{err}");
    usage_error(
        &[
            "goodput",
            POD,
            "--model-params",
            "1e9",
            "--strategy",
            "auto",
            "--mtbf-hours",
            "50000",
            "--days",
            "2",
        ],
        "needs --model",
    );
}
