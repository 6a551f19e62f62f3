//! Model configs, MaxText's FLOP and parameter counts, and the published
//! MaxText tables: each figure against a closed form or a published one,
//! with the error printed (`cargo test --test models -- --nocapture`).

use optirs_tpu::error::ErrorKind;
use optirs_tpu::model::flops::FlopFormula;
use optirs_tpu::model::published::{chips_per_slice, implied_step_seconds};
use optirs_tpu::model::{
    BUNDLED_NAMES, DecoderBlock, ModelConfig, ModelError, RematPolicy, bundled, maxtext_published,
    parameter_count, parameter_scales, training_flops_per_device,
};
use optirs_tpu::{OptimError, TpuGeneration};
use proptest::prelude::*;

const LLAMA_LIKE: &str = r#"Model(
    name: "m",
    decoder_block: llama2,
    layers: 2,
    embed: 64,
    heads: 4,
    kv_heads: 2,
    head_dim: 16,
    mlp_dim: 128,
    mlp_activations: ["silu", "linear"],
    vocab: 100,
    seq_len: 32,
    per_device_batch: 0.5,
    remat: full,
    weight_dtype: f32,
    activation_dtype: bf16,
    logits_via_embedding: false,
    attention_width_is_embed: true,
)"#;

fn with(field: &str, value: &str) -> String {
    LLAMA_LIKE
        .lines()
        .map(|line| {
            if line.trim_start().starts_with(&format!("{field}:")) {
                format!("    {field}: {value},")
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn invalid(text: &str) -> (Option<usize>, String, String) {
    match ModelConfig::from_ron_str(text, "m.ron").unwrap_err() {
        ModelError::Invalid {
            line,
            field,
            problem,
            origin,
        } => {
            assert_eq!(origin, "m.ron");
            (line, field, problem)
        }
        other => panic!("expected Invalid, got {other}"),
    }
}

#[test]
fn every_bundled_model_loads_validates_and_is_named_as_listed() {
    for name in BUNDLED_NAMES {
        let config = bundled(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(config.name, name);
        assert!(!config.source.is_empty(), "{name} names its source");
    }
    let err = bundled("llama9-1t").unwrap_err();
    assert!(matches!(err, ModelError::UnknownModel { .. }));
    assert!(err.to_string().contains("maxtext-v5e-16b"), "{err}");
    let wrapped: OptimError = err.into();
    assert_eq!(wrapped.kind(), ErrorKind::Model);
}

#[test]
fn a_model_file_loads_from_disk_and_a_missing_one_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.ron");
    std::fs::write(&path, LLAMA_LIKE).unwrap();
    let config = ModelConfig::from_ron_file(&path).unwrap();
    assert_eq!(config.kv_heads, 2);
    let missing = dir.path().join("nope.ron");
    let err = ModelConfig::from_ron_file(&missing).unwrap_err();
    assert!(matches!(err, ModelError::Read(_)));
    assert!(err.to_string().contains("nope.ron"), "{err}");
}

#[test]
fn syntax_errors_carry_file_line_column_and_field() {
    let text = with("layers", "\"two\"");
    match ModelConfig::from_ron_str(&text, "m.ron").unwrap_err() {
        ModelError::Syntax {
            origin,
            line,
            field,
            ..
        } => {
            assert_eq!(origin, "m.ron");
            assert_eq!(line, 4);
            assert_eq!(field, "layers");
        }
        other => panic!("expected Syntax, got {other}"),
    }
    let text = LLAMA_LIKE.replace("    remat: full,", "    remat: full,\n    dropout: 0.1,");
    let err = ModelConfig::from_ron_str(&text, "m.ron").unwrap_err();
    assert!(err.to_string().contains("dropout"), "{err}");
}

#[test]
fn an_unknown_remat_policy_lists_the_valid_ones() {
    let text = with("remat", "everything");
    let err = ModelConfig::from_ron_str(&text, "m.ron").unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err, ModelError::Syntax { line: 14, .. }),
        "{message}"
    );
    assert!(message.contains("`remat`"), "{message}");
    for policy in RematPolicy::ALL {
        assert!(
            message.contains(policy.name()),
            "{message} lacks {}",
            policy.name()
        );
    }
}

#[test]
fn each_invalid_dimension_is_named_with_its_line() {
    for (field, line) in [
        ("layers", 4),
        ("embed", 5),
        ("heads", 6),
        ("kv_heads", 7),
        ("head_dim", 8),
        ("mlp_dim", 9),
        ("vocab", 11),
        ("seq_len", 12),
    ] {
        let (l, f, problem) = invalid(&with(field, "0"));
        assert_eq!((l, f.as_str()), (Some(line), field), "{problem}");
    }
    let (line, field, problem) = invalid(&with("kv_heads", "3"));
    assert_eq!((line, field.as_str()), (Some(7), "kv_heads"));
    assert!(problem.contains("must divide"), "{problem}");
    let (_, field, problem) = invalid(&with("head_dim", "32"));
    assert_eq!(field, "head_dim");
    assert!(problem.contains("4 x 32 = 128"), "{problem}");
    // The same width is fine for a family that does not tie it to embed.
    let untied = with("head_dim", "32").replace(
        "attention_width_is_embed: true",
        "attention_width_is_embed: false",
    );
    assert_eq!(
        ModelConfig::from_ron_str(&untied, "m.ron")
            .unwrap()
            .head_dim,
        32
    );
    let (_, field, _) = invalid(&with("per_device_batch", "-1.0"));
    assert_eq!(field, "per_device_batch");
    let (_, field, problem) = invalid(&with("mlp_activations", "[\"sillu\"]"));
    assert_eq!(field, "mlp_activations");
    assert!(problem.contains("sillu"), "{problem}");
    let (_, field, _) = invalid(&LLAMA_LIKE.replace(
        "    remat: full,",
        "    remat: full,\n    trainable_position_size: 8,",
    ));
    assert_eq!(field, "trainable_position_size");
}

#[test]
fn the_global_batch_must_be_whole() {
    let config = ModelConfig::from_ron_str(LLAMA_LIKE, "m.ron").unwrap();
    assert_eq!(config.global_batch(256).unwrap(), 128);
    let err = config.global_batch(3).unwrap_err();
    assert!(
        matches!(err, ModelError::FractionalGlobalBatch { chips: 3, .. }),
        "{err}"
    );
    assert!(config.global_batch(0).is_err());
}

/// Published parameter counts: Llama 2's Hugging Face checkpoints
/// (6,738,415,616 and 68,976,648,192 parameters; the paper's 7B and 70B),
/// and GPT-3's 175B (Brown et al. 2020, Table 2.1).
#[test]
fn parameter_counts_match_the_published_ones() {
    for (name, published, tolerance) in [
        ("llama2-7b", 6_738_415_616.0, 0.0),
        ("llama2-70b", 68_976_648_192.0, 0.0),
        ("gpt3-175b", 175e9, 0.005),
    ] {
        let count = parameter_count(&bundled(name).unwrap()).total() as f64;
        let error = (count - published) / published;
        println!(
            "{name}: {count:.0} parameters, published {published:.0}, error {:+.3}%",
            error * 100.0
        );
        assert!(error.abs() <= tolerance, "{name}: error {error}");
    }
}

/// The MaxText-scaled models are named by their size: the count is within
/// 3% of the label (MaxText's scaling is "a near perfect 8x" per 3 doublings).
#[test]
fn scaled_models_have_the_size_their_name_says() {
    for name in BUNDLED_NAMES.iter().filter(|n| n.starts_with("maxtext-")) {
        let label: f64 = name
            .rsplit('-')
            .next()
            .unwrap()
            .trim_end_matches('b')
            .parse()
            .unwrap();
        let count = parameter_count(&bundled(name).unwrap()).total() as f64;
        let error = (count - label * 1e9) / (label * 1e9);
        println!(
            "{name}: {:.3e} parameters, {:+.2}% from {label}B",
            count,
            error * 100.0
        );
        assert!(error.abs() < 0.03, "{name}: {error}");
    }
}

/// The bundled scaled configs are base.yml's `base_*` (2560, 8 heads, 8192,
/// 16 layers at the publication commits) scaled by MaxText's rule.
#[test]
fn scaled_models_follow_get_individual_scales() {
    for name in BUNDLED_NAMES.iter().filter(|n| n.starts_with("maxtext-")) {
        let scale: u64 = name
            .rsplit('-')
            .next()
            .unwrap()
            .trim_end_matches('b')
            .parse()
            .unwrap();
        let s = parameter_scales(scale).unwrap();
        let config = bundled(name).unwrap();
        assert_eq!(config.embed, 2560 << s.embed, "{name}");
        assert_eq!(config.heads, 8 << s.heads, "{name}");
        assert_eq!(config.kv_heads, 8 << s.heads, "{name}");
        assert_eq!(config.mlp_dim, 8192 << s.mlp, "{name}");
        assert_eq!(config.layers, 16 << s.layers, "{name}");
        assert_eq!(config.head_dim, 256, "{name}");
        assert!(config.logits_via_embedding);
        let block = if name.contains("v5e") {
            DecoderBlock::DefaultT5
        } else {
            DecoderBlock::Default
        };
        assert_eq!(config.decoder_block, block);
    }
}

/// `MaxText/configs/v5e/README.md` (e47fa1b5): "these configurations match
/// a per pod batch size of 3.1 million tokens for 16B and 2.1 million
/// tokens for 32B".
#[test]
fn v5e_batches_are_the_published_tokens_per_pod() {
    for (name, published) in [("maxtext-v5e-16b", 3.1e6), ("maxtext-v5e-32b", 2.1e6)] {
        let config = bundled(name).unwrap();
        let tokens = config.global_batch(256).unwrap() as f64 * config.seq_len as f64;
        let error = (tokens - published) / published;
        println!(
            "{name}: {tokens} tokens per v5e-256, published {published}, error {:+.2}%",
            error * 100.0
        );
        assert!(error.abs() < 0.02, "{name}: {error}");
    }
}

#[test]
fn the_published_tables_are_complete() {
    let published = maxtext_published().unwrap();
    assert_eq!(published.tables.len(), 3);
    // v5e: 4 models x 6 slice counts; v5p configs README: 16 rows; the
    // README's v5p table: 10 rows.
    assert_eq!(published.rows_of("v5e").count(), 24);
    assert_eq!(published.rows_of("v5p-configs").count(), 16);
    assert_eq!(published.rows_of("v5p-readme").count(), 10);
    assert_eq!(published.rows.len(), 50);
    for row in &published.rows {
        assert!(published.table_of(row).is_some());
        assert_eq!(
            chips_per_slice(&row.accelerator).unwrap() * u64::from(row.slices),
            row.chips
        );
    }
    assert_eq!(chips_per_slice("v5p-128"), Some(64));
    assert_eq!(chips_per_slice("v5e-256"), Some(256));
}

/// Published TFLOP/s ÷ the generation's peak (hardware.rs: v5e 197, v5p
/// 459 TFLOP/s) is the published MFU within 1%, except the one row the
/// table prints inconsistently (and whose note says so).
#[test]
fn published_tflops_over_peak_is_the_published_mfu() {
    let published = maxtext_published().unwrap();
    let mut inconsistent = Vec::new();
    let mut worst: f64 = 0.0;
    for row in &published.rows {
        let mfu = row.mfu_from_tflops().unwrap();
        let error = (mfu - row.mfu) / row.mfu;
        if error.abs() > 0.01 {
            inconsistent.push((
                row.table.clone(),
                row.model.clone(),
                row.accelerator.clone(),
                error,
            ));
            assert!(
                row.note
                    .as_deref()
                    .is_some_and(|n| n.contains("inconsistent")),
                "{row:?}: {error}"
            );
        } else {
            worst = worst.max(error.abs());
        }
    }
    println!(
        "worst MFU error of the consistent rows: {:.3}%",
        worst * 100.0
    );
    println!("inconsistent as printed: {inconsistent:?}");
    assert_eq!(inconsistent.len(), 1);
    assert_eq!(
        (
            inconsistent[0].0.as_str(),
            inconsistent[0].1.as_str(),
            inconsistent[0].2.as_str()
        ),
        ("v5p-readme", "1024B", "v5p-2048")
    );
    assert_eq!(TpuGeneration::V5e.spec().peak_bf16_flops, 197e12);
}

/// No table publishes a step time, so the formula × step time check runs
/// the other way: the step time the published TFLOP/s implies for our
/// config. A row of the same model at more chips never implies a shorter
/// step than its TFLOP/s allows, and the v5e 16B single-pod row implies
/// MaxText's FLOP count of that run divided by 120 TFLOP/s.
#[test]
fn published_rows_imply_step_times() {
    let published = maxtext_published().unwrap();
    for row in &published.rows {
        let formula = published.table_of(row).unwrap().formula;
        let Some(config) = row.model_config().unwrap() else {
            assert!(row.note.is_some(), "{row:?} has neither config nor note");
            continue;
        };
        let seconds = implied_step_seconds(row, &config, formula);
        let tokens_per_s = config.tokens_per_device() * row.chips as f64 / seconds;
        println!(
            "{} {} {}x{}: {:.3} s/step, {:.3e} tokens/s",
            row.table, row.model, row.slices, row.accelerator, seconds, tokens_per_s
        );
        assert!(seconds > 0.0 && seconds.is_finite());
    }
    let row = &published.rows[0];
    let config = row.model_config().unwrap().unwrap();
    let n = parameter_count(&config).total() as f64;
    let flops = 6.0 * n * 2048.0 * 6.0 + 12.0 * 32.0 * 32.0 * 256.0 * 2048.0 * 2048.0 * 6.0;
    let seconds = implied_step_seconds(row, &config, FlopFormula::ParamsFullAttention);
    assert!((seconds - flops / 120e12).abs() < 1e-12 * seconds);
}

fn scaled(base: &ModelConfig, layers: u64, batch: f64) -> ModelConfig {
    ModelConfig {
        layers,
        per_device_batch: batch,
        ..base.clone()
    }
}

proptest! {
    /// Every formula is linear in the batch; the attention term is linear
    /// in layers and the learnable term affine (the embedding matmul is
    /// paid once), so f(l) + f(3l) = 2 f(2l).
    #[test]
    fn flops_scale_linearly_in_batch_and_layers(
        model in 0..BUNDLED_NAMES.len(),
        layers in 1u64..200,
        batch in 0.25f64..16.0,
        k in 2u64..6,
    ) {
        let base = bundled(BUNDLED_NAMES[model]).unwrap();
        // A windowed model's global layers are every (k+1)-th: linear in
        // whole patterns.
        let layers = layers * base.sliding_window.map_or(1, |w| w.local_per_global + 1);
        for formula in [
            FlopFormula::ParamsFullAttention,
            FlopFormula::ParamsCausalAttention,
            FlopFormula::Matmuls,
            FlopFormula::MatmulsCausal,
        ] {
            let one = training_flops_per_device(&scaled(&base, layers, batch), formula);
            let kb = training_flops_per_device(&scaled(&base, layers, batch * k as f64), formula);
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * a.abs().max(b.abs());
            prop_assert!(close(kb.total(), one.total() * k as f64));
            let kl = training_flops_per_device(&scaled(&base, layers * k, batch), formula);
            prop_assert!(close(kl.attention, one.attention * k as f64));
            let two = training_flops_per_device(&scaled(&base, 2 * layers, batch), formula);
            let three = training_flops_per_device(&scaled(&base, 3 * layers, batch), formula);
            prop_assert!(close(one.learnable_weight + three.learnable_weight, 2.0 * two.learnable_weight));
            prop_assert!(kl.learnable_weight > one.learnable_weight);
        }
    }
}
