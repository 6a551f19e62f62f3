//! `train --model` and `goodput --model`: a transformer's whole step from
//! the command line, and the refusals.

#[path = "common/binary.rs"]
mod binary;
#[path = "common/cli_json.rs"]
mod cli_json;
use binary::optirs;
use cli_json::{json, usage_error};

#[test]
fn train_model_reports_the_whole_step() {
    let r = json(&[
        "train",
        "v5e-256",
        "--model",
        "maxtext-v5e-16b",
        "--modeled-only",
        "--strategy",
        "fsdp",
        "--json",
    ]);
    assert_eq!(r["model"], "maxtext-v5e-16b");
    assert_eq!(r["mesh"], "data=1,fsdp=256,tensor=1");
    for key in [
        "step_seconds",
        "tokens_per_s_per_chip",
        "tflops_per_chip",
        "mfu",
        "exposed_communication",
    ] {
        assert!(r[key].as_f64().unwrap() >= 0.0, "{key}");
    }
    // The calibrated row: 120 TFLOP/s per chip published, by the v5e
    // table's formula (the report's is MaxText's current one, named).
    assert_eq!(r["flop_formula"], "matmuls_causal");
    let config = optirs_tpu::model::bundled("maxtext-v5e-16b").unwrap();
    let table = optirs_tpu::model::training_flops_per_device(
        &config,
        optirs_tpu::model::FlopFormula::ParamsFullAttention,
    )
    .total();
    let tflops = table / r["step_seconds"].as_f64().unwrap() / 1e12;
    assert!((tflops / 120.0 - 1.0).abs() < 0.01, "{tflops}");
    let (mfu, hardware) = (
        r["mfu"].as_f64().unwrap(),
        r["hardware_utilization"].as_f64().unwrap(),
    );
    assert!(mfu <= hardware && hardware <= r["mxu_efficiency"].as_f64().unwrap());
    assert_eq!(r["optimizer"]["name"], "adam");
    assert_eq!(r["optimizer"]["slots"], 2);
    assert!(r["hbm_margin_bytes"].as_i64().unwrap() > 0);
    assert_eq!(r["fits_in_hbm"], true);
    let text = optirs(&["train", "v5e-256", "--model", "gpt3-175b", "--modeled-only"]);
    assert!(text.status.success());
    let out = String::from_utf8_lossy(&text.stdout);
    assert!(
        out.contains("does not fit"),
        "replicated 175e9 on v5e: {out}"
    );
}

#[test]
fn a_model_file_loads_and_a_bad_one_names_its_field() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("m.ron");
    std::fs::write(&good, optirs_tpu::model::bundled_text("llama2-7b").unwrap()).unwrap();
    let r = json(&[
        "train",
        "v5e-256",
        "--model",
        good.to_str().unwrap(),
        "--modeled-only",
        "--json",
    ]);
    assert_eq!(r["model"], "llama2-7b");
    let bad = dir.path().join("bad.ron");
    let text = optirs_tpu::model::bundled_text("llama2-7b")
        .unwrap()
        .replace("remat: ", "remat: sometimes, _was: ");
    std::fs::write(&bad, text).unwrap();
    let out = optirs(&[
        "train",
        "v5e-256",
        "--model",
        bad.to_str().unwrap(),
        "--modeled-only",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("bad.ron") && err.contains("remat"), "{err}");
}

#[test]
fn bad_model_flags_are_usage_errors() {
    usage_error(
        &["train", "v5e-256", "--model", "no-such", "--modeled-only"],
        "maxtext-v5e-16b",
    );
    usage_error(
        &["train", "v5e-256", "--model", "llama2-7b", "--params", "10"],
        "--params",
    );
    usage_error(
        &[
            "train",
            "v5e-256",
            "--model",
            "llama2-7b",
            "--modeled-only",
            "--checkpoint-every",
            "1",
        ],
        "need a real run",
    );
    // A real run of a model this host cannot hold is refused before any work.
    let out = optirs(&["train", "v5e-256", "--model", "gpt3-175b", "--steps", "1"]);
    assert!(!out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
}

#[test]
fn goodput_takes_the_models_step_unless_one_is_given() {
    let modeled = json(&[
        "goodput",
        "v5e-256",
        "--model",
        "maxtext-v5e-16b",
        "--mtbf-hours",
        "50000",
        "--days",
        "2",
        "--json",
    ]);
    let step = json(&[
        "train",
        "v5e-256",
        "--model",
        "maxtext-v5e-16b",
        "--modeled-only",
        "--strategy",
        "fsdp",
        "--json",
    ])["step_seconds"]
        .as_f64()
        .unwrap();
    let config = &modeled["config"];
    assert!(
        (config["step_seconds"].as_f64().unwrap() - step).abs() < 1e-9,
        "{config}"
    );
    assert_eq!(config["model_params"], 16274117632u64);
    let given = json(&[
        "goodput",
        "v5e-256",
        "--model",
        "maxtext-v5e-16b",
        "--mtbf-hours",
        "50000",
        "--days",
        "2",
        "--step-seconds",
        "3",
        "--json",
    ]);
    assert_eq!(given["config"]["step_seconds"], 3.0);
    usage_error(
        &[
            "goodput",
            "v5e-256",
            "--model",
            "llama2-7b",
            "--model-params",
            "7e9",
        ],
        "--model-params",
    );
}

#[test]
fn the_trace_shows_each_layers_compute_with_the_next_layers_gather_under_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("step.json");
    let args = [
        "train",
        "v5e-256",
        "--model",
        "maxtext-v5e-16b",
        "--modeled-only",
        "--strategy",
        "fsdp",
        "--trace",
        path.to_str().unwrap(),
    ];
    let out = optirs(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let span = |name: &str| -> (f64, f64) {
        let e = events
            .iter()
            .find(|e| e["name"] == name && e["ph"] == "X")
            .unwrap_or_else(|| panic!("no `{name}`"));
        let ts = e["ts"].as_f64().unwrap();
        (ts, ts + e["dur"].as_f64().unwrap())
    };
    // Layer 3's forward runs while layer 4's gather is on the links.
    let compute = span("forward layer 3");
    let gather = span("gather (forward) layer 4");
    assert!(
        gather.0 < compute.1 && compute.0 < gather.1,
        "{compute:?} {gather:?}"
    );
    // The backward reduce-scatter of a layer follows its backward use.
    let backward = span("backward layer 5");
    let reduce = span("gradient reduce-scatter layer 5");
    assert!(reduce.0 >= backward.1 - 1e-6);
    assert!(events.iter().any(|e| e["name"] == "logits and loss"));
    assert!(
        events
            .iter()
            .any(|e| e["ph"] == "i" && e["name"] == "free layer 0 (forward)")
    );
    // An existing file is never overwritten.
    assert!(!optirs(&args).status.success());
}

#[test]
fn a_tensor_axis_and_the_data_reduction_are_taken_for_a_models_modeled_step_only() {
    let r = json(&[
        "train",
        "v5e-256",
        "--model",
        "maxtext-v5e-128b",
        "--modeled-only",
        "--strategy",
        "fsdp",
        "--mesh",
        "fsdp=16,tensor=16",
        "--data-reduction",
        "overlapped",
        "--json",
    ]);
    assert_eq!(r["mesh"], "data=1,fsdp=16,tensor=16");
    assert_eq!(r["data_reduction"], "overlapped");
    assert!(r["phases"]["all_gather.tensor"].as_f64().unwrap() > 0.0);
    assert!(r["layer"]["forward"]["tensor_seconds"].as_f64().unwrap() > 0.0);
    let default = json(&[
        "train",
        "v5e-256",
        "--model",
        "llama2-7b",
        "--modeled-only",
        "--json",
    ]);
    assert_eq!(default["data_reduction"], "after-backward");
    // Flat tensors declare no split; a real run overlaps its reduction.
    usage_error(
        &[
            "train",
            "v5e-256",
            "--modeled-only",
            "--mesh",
            "fsdp=16,tensor=16",
        ],
        "declares how its tensors split",
    );
    usage_error(
        &[
            "train",
            "v5e-256",
            "--model",
            "llama2-7b",
            "--steps",
            "1",
            "--mesh",
            "fsdp=16,tensor=16",
        ],
        "declares how its tensors split",
    );
    usage_error(
        &[
            "train",
            "v5e-256",
            "--modeled-only",
            "--data-reduction",
            "overlapped",
        ],
        "--model NAME --modeled-only",
    );
    usage_error(
        &[
            "train",
            "v5e-256",
            "--model",
            "llama2-7b",
            "--modeled-only",
            "--data-reduction",
            "later",
        ],
        "after-backward or overlapped",
    );
    // llama2-7b's 32 heads do not split 256 ways: the field is named.
    usage_error(
        &[
            "train",
            "v5e-256",
            "--model",
            "llama2-7b",
            "--modeled-only",
            "--mesh",
            "tensor=256",
        ],
        "heads",
    );
}

/// `goodput --model` takes `train`'s layout, and a run that cannot start
/// has no goodput: a layout that does not fit is refused with `train`'s
/// message unless `--allow-overflow`.
#[test]
fn goodput_takes_the_layout_and_refuses_what_does_not_fit() {
    fn goodput<'a>(extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec![
            "goodput",
            "v5e-256",
            "--model",
            "maxtext-v5e-128b",
            "--mtbf-hours",
            "50000",
            "--days",
            "2",
        ];
        args.extend_from_slice(extra);
        args
    }
    // The published layout (tensor=16) fits; goodput's step is train's.
    let fits = json(&goodput(&["--mesh", "fsdp=16,tensor=16", "--json"]));
    let train = json(&[
        "train",
        "v5e-256",
        "--model",
        "maxtext-v5e-128b",
        "--modeled-only",
        "--strategy",
        "fsdp",
        "--mesh",
        "fsdp=16,tensor=16",
        "--json",
    ]);
    assert_eq!(train["fits_in_hbm"], true);
    let step = fits["config"]["step_seconds"].as_f64().unwrap();
    assert!((step - train["step_seconds"].as_f64().unwrap()).abs() < 1e-9);
    // Its report names the layout and the fit, as train's does.
    let layout = &fits["model_step"];
    assert_eq!(layout["mesh"], "data=1,fsdp=16,tensor=16");
    assert_eq!(layout["strategy"], "fsdp");
    assert_eq!(layout["fits_in_hbm"], true);
    assert_eq!(layout["hbm_margin_bytes"], train["hbm_margin_bytes"]);
    assert_eq!(
        layout["hbm_bytes_per_device"],
        train["hbm_bytes_per_device"]
    );
    let text = optirs(&goodput(&["--mesh", "fsdp=16,tensor=16"]));
    let text = String::from_utf8_lossy(&text.stdout);
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("model "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("fsdp on mesh data=1,fsdp=16,tensor=16") && line.contains(" left)"),
        "{line}"
    );
    // A model that fits no layout of the pod is refused.
    let too_large = |extra: &[&'static str]| {
        let mut args = goodput(extra);
        args[3] = "gpt3-175b";
        args
    };
    let out = optirs(&too_large(&[]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let refusal = err.lines().next().unwrap().to_string();
    let train_text = optirs(&[
        "train",
        "v5e-256",
        "--model",
        "gpt3-175b",
        "--modeled-only",
        "--strategy",
        "fsdp",
    ]);
    let text = String::from_utf8_lossy(&train_text.stdout);
    let why = text
        .lines()
        .find_map(|l| l.split("does not fit: ").nth(1))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(refusal.contains(why), "{refusal} / {why}");
    assert!(refusal.contains("--allow-overflow"), "{refusal}");
    // Asked for, the number anyway.
    let anyway = json(&too_large(&["--allow-overflow", "--json"]));
    assert!(anyway["goodput"].as_f64().unwrap() > 0.0);
    assert_eq!(anyway["model_step"]["fits_in_hbm"], false);
    assert!(anyway["model_step"]["hbm_margin_bytes"].as_i64().unwrap() < 0);
    // The strategy and data reduction change the step.
    let zero2 = json(&goodput(&[
        "--mesh",
        "fsdp=16,tensor=16",
        "--strategy",
        "zero2",
        "--allow-overflow",
        "--json",
    ]));
    assert!(zero2["config"]["step_seconds"].as_f64().unwrap() >= step * (1.0 - 1e-12));
    // A layout flag without --model, a bad mesh, a prefetch without fsdp.
    for (args, needle) in [
        (
            vec![
                "goodput",
                "--model-params",
                "1e9",
                "--mtbf-hours",
                "1e4",
                "--days",
                "1",
                "--strategy",
                "zero2",
            ],
            "--strategy",
        ),
        (goodput(&["--mesh", "data=3"]), "--mesh data=3"),
        (
            goodput(&["--strategy", "zero2", "--prefetch", "2"]),
            "--prefetch 2",
        ),
        (goodput(&["--prefetch", "5000"]), "--prefetch"),
    ] {
        usage_error(&args, needle);
    }
}

/// `--optimizer` counts in a model's modeled step: its state slots in the
/// HBM account and its update in the step, named in the JSON.
#[test]
fn the_optimizer_counts_in_a_model_s_step() {
    let of = |optimizer: &str| {
        json(&[
            "train",
            "v5p-256",
            "--model",
            "llama2-7b",
            "--modeled-only",
            "--strategy",
            "fsdp",
            "--optimizer",
            optimizer,
            "--json",
        ])
    };
    let (sgd, momentum, adam) = (of("sgd"), of("momentum"), of("ADAM"));
    for (r, name, slots) in [
        (&sgd, "sgd", 0),
        (&momentum, "momentum", 1),
        (&adam, "adam", 2),
    ] {
        assert_eq!(r["optimizer"]["name"], name);
        assert_eq!(r["optimizer"]["slots"], slots);
    }
    let state = |r: &serde_json::Value| r["hbm_by_kind"]["state"].as_u64().unwrap();
    assert_eq!(state(&sgd), 0);
    assert_eq!(state(&adam), 2 * state(&momentum));
    let update = |r: &serde_json::Value| r["optimizer"]["seconds"].as_f64().unwrap();
    assert!(update(&sgd) < update(&momentum) && update(&momentum) < update(&adam));
}

/// An uncalibrated generation's step is a range in both commands: `train`
/// prints it beside the step, `goodput` on its model line and in
/// `model_step`.
#[test]
fn an_uncalibrated_generation_reports_the_range_of_the_fitted_constants() {
    let train = json(&[
        "train",
        "v4-128",
        "--model",
        "llama2-7b",
        "--strategy",
        "fsdp",
        "--modeled-only",
        "--json",
    ]);
    assert_eq!(train["calibrated"], false);
    let range = train["step_seconds_range"].as_array().unwrap();
    let (slow, fast) = (range[0].as_f64().unwrap(), range[1].as_f64().unwrap());
    let step = train["step_seconds"].as_f64().unwrap();
    assert!(fast < step && step < slow, "{fast} {step} {slow}");
    let goodput = json(&[
        "goodput",
        "v4-128",
        "--model",
        "llama2-7b",
        "--mtbf-hours",
        "50000",
        "--days",
        "1",
        // Its minimal-remat activations outgrow v4's 32 GiB: the range is
        // what is asked here.
        "--allow-overflow",
        "--json",
    ]);
    assert_eq!(goodput["model_step"]["calibrated"], false);
    assert_eq!(
        goodput["model_step"]["step_seconds_range"],
        train["step_seconds_range"]
    );
    let calibrated = json(&[
        "train",
        "v6e-256",
        "--model",
        "llama3.1-70b",
        "--strategy",
        "fsdp",
        "--modeled-only",
        "--json",
    ]);
    assert_eq!(calibrated["calibrated"], true);
    assert!(calibrated["step_seconds_range"].is_null());
}

/// A step of a kind the published runs show the model misses says so in
/// `train`, `goodput` and `plan`, text and JSON; a validated kind does not.
#[test]
fn a_step_beyond_the_validated_mixtures_is_reported_as_a_lower_bound() {
    let args = [
        "v5p-1024",
        "--model",
        "deepseek3-671b",
        "--strategy",
        "fsdp",
    ];
    let train = json(&[&["train"], &args[..], &["--modeled-only", "--json"]].concat());
    let gap = &train["known_gap"];
    assert_eq!(gap["kind"], "dropless mixture of 256 experts", "{gap}");
    assert_eq!(gap["validated_experts"], 16);
    let ids: Vec<&str> = gap["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["P3", "P5", "I9", "I9f"]);
    let goodput_args = [
        &["goodput"],
        &args[..],
        &["--mtbf-hours", "1e4", "--days", "1"],
    ]
    .concat();
    let goodput = json(&[&goodput_args[..], &["--json"]].concat());
    assert_eq!(goodput["model_step"]["known_gap"], *gap);
    let plan = json(&["plan", "v5p-1024", "--model", "deepseek3-671b", "--json"]);
    assert_eq!(plan["known_gap"], *gap);
    for text_args in [
        [&["train"], &args[..], &["--modeled-only"]].concat(),
        goodput_args.clone(),
        vec!["plan", "v5p-1024", "--model", "deepseek3-671b"],
    ] {
        let out = optirs(&text_args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text_args:?}");
        assert!(
            text.contains("not validated: a dropless mixture of 256 experts")
                && text.contains("lower bound"),
            "{text_args:?}: {text}"
        );
    }
    let scout = json(&[
        "train",
        "v5p-1024",
        "--model",
        "llama4-17b-16e",
        "--modeled-only",
        "--strategy",
        "fsdp",
        "--json",
    ]);
    assert!(scout["known_gap"].is_null(), "{}", scout["known_gap"]);
}
