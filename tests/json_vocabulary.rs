//! One JSON vocabulary: a quantity has the same key and type in every
//! command's `--json` (the table in the README), and the old synonyms
//! (`devices`, `step_modeled_seconds`, `devices_at_end`) are gone.

use serde_json::Value;
use std::process::Command;

fn json(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_optirs-tpu"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

#[derive(Clone, Copy, Debug)]
enum Type {
    Int,
    Num,
    Str,
}

/// The README's table: key and type.
const VOCABULARY: &[(&str, Type)] = &[
    ("pod", Type::Str),
    ("chips", Type::Int),
    ("hosts", Type::Int),
    ("params", Type::Int),
    ("step_seconds", Type::Num),
    ("steps_completed", Type::Int),
    ("simulated_seconds", Type::Num),
    ("wall_seconds", Type::Num),
    ("hbm_bytes_per_device", Type::Int),
    ("hbm_capacity_bytes", Type::Int),
    ("goodput", Type::Num),
    ("world_sha256", Type::Str),
];

const GONE: &[&str] = &["devices", "devices_at_end", "step_modeled_seconds"];

fn holds(value: &Value, what: &str, keys: &[&str]) {
    for key in keys {
        let (_, kind) = VOCABULARY
            .iter()
            .find(|(k, _)| k == key)
            .unwrap_or_else(|| panic!("`{key}` is not in the vocabulary"));
        let got = value
            .get(*key)
            .unwrap_or_else(|| panic!("{what}: no `{key}` in {value}"));
        let ok = match kind {
            Type::Int => got.is_u64(),
            Type::Num => got.is_f64(),
            Type::Str => got.is_string(),
        };
        assert!(ok, "{what}: `{key}` is {got}, not {kind:?}");
    }
    for key in GONE {
        assert!(
            value.get(*key).is_none(),
            "{what}: the old key `{key}` is back"
        );
    }
}

#[test]
fn every_command_s_json_uses_the_same_keys_and_types() {
    let topology = json(&["topology", "v4-16", "--json"]);
    holds(&topology, "topology", &["chips", "hosts"]);
    assert_eq!(topology["chips"], 8);

    let presets = json(&["presets", "--generation", "v4", "--json"]);
    for row in presets.as_array().unwrap() {
        holds(row, "presets", &["chips", "hosts"]);
    }

    let run = json(&["run", "v4-16", "--steps", "10", "--json"]);
    let keys = [
        "pod",
        "chips",
        "hosts",
        "simulated_seconds",
        "wall_seconds",
        "world_sha256",
    ];
    holds(&run, "run", &keys);
    holds(&run["performance"], "run's performance", &["chips"]);

    let train = json(&[
        "train", "v4-16", "--params", "1000", "--steps", "2", "--json",
    ]);
    let keys = [
        "pod",
        "chips",
        "params",
        "step_seconds",
        "steps_completed",
        "simulated_seconds",
        "wall_seconds",
        "hbm_bytes_per_device",
        "goodput",
        "world_sha256",
    ];
    holds(&train, "train --params", &keys);

    let modeled = json(&[
        "train",
        "v4-16",
        "--params",
        "1e9",
        "--modeled-only",
        "--json",
    ]);
    let keys = [
        "pod",
        "chips",
        "params",
        "step_seconds",
        "simulated_seconds",
        "wall_seconds",
        "hbm_bytes_per_device",
        "hbm_capacity_bytes",
    ];
    holds(&modeled, "train --params --modeled-only", &keys);
    assert_eq!(modeled["chips"], train["chips"]);

    let model = json(&[
        "train",
        "v5e-16",
        "--model",
        "llama2-7b",
        "--modeled-only",
        "--json",
    ]);
    let keys = [
        "pod",
        "chips",
        "params",
        "step_seconds",
        "wall_seconds",
        "hbm_bytes_per_device",
        "hbm_capacity_bytes",
    ];
    holds(&model, "train --model --modeled-only", &keys);

    let goodput = json(&[
        "goodput",
        "v5e-16",
        "--model-params",
        "1e9",
        "--mtbf-hours",
        "1000",
        "--days",
        "1",
        "--json",
    ]);
    let keys = [
        "pod",
        "chips",
        "hosts",
        "steps_completed",
        "simulated_seconds",
        "goodput",
        "wall_seconds",
    ];
    holds(&goodput, "goodput", &keys);

    let goodput_model = json(&[
        "goodput",
        "v5e-256",
        "--model",
        "maxtext-v5e-16b",
        "--mtbf-hours",
        "50000",
        "--days",
        "1",
        "--json",
    ]);
    holds(
        &goodput_model,
        "goodput --model",
        &["pod", "chips", "goodput"],
    );
    let keys = ["step_seconds", "hbm_bytes_per_device", "hbm_capacity_bytes"];
    holds(
        &goodput_model["model_step"],
        "goodput --model's model_step",
        &keys,
    );
}
