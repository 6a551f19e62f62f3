//! A decoder layer's programs against MaxText's per-matmul FLOP count: the
//! dots of `(forward + backward) × layers + logits` equal
//! `FlopFormula::Matmuls` (learnable weights + full attention) for every
//! bundled model and random small ones; the error is printed
//! (`cargo test --test model_programs -- --nocapture`).

use optirs_tpu::model::flops::FlopFormula;
use optirs_tpu::model::programs::MAX_TOKENS;
use optirs_tpu::model::{
    BUNDLED_NAMES, DecoderBlock, ModelConfig, ModelDType, ModelError, RematPolicy, bundled,
    layer_programs, parameter_count, training_flops_per_device,
};
use proptest::prelude::*;

fn tokens(config: &ModelConfig) -> u64 {
    config.tokens_per_device().round() as u64
}

fn relative_error(modeled: f64, maxtext: f64) -> f64 {
    (modeled - maxtext).abs() / maxtext
}

#[test]
fn bundled_models_match_maxtext_matmul_count() {
    for name in BUNDLED_NAMES {
        let config = bundled(name).unwrap();
        if config.sliding_window.is_some() {
            // Local layers' banded attention is not compiled: refused,
            // naming the field.
            let err = layer_programs(&config, tokens(&config)).unwrap_err();
            assert!(err.to_string().contains("sliding_window"), "{err}");
            continue;
        }
        if config.moe.is_some() {
            // Experts are not compiled as a dense layer: refused, naming
            // the field (their count is held in tests/model_features.rs).
            let err = layer_programs(&config, tokens(&config)).unwrap_err();
            assert!(err.to_string().contains("moe"), "{err}");
            continue;
        }
        let programs = layer_programs(&config, tokens(&config)).unwrap();
        let maxtext = training_flops_per_device(&config, FlopFormula::Matmuls).total();
        let modeled = programs.step_dot_flops(config.layers);
        let error = relative_error(modeled, maxtext);
        println!(
            "{name:>18}: dots {modeled:.6e} vs MaxText {maxtext:.6e} (rel {error:.1e}); \
             other flops {:.3e} ({:.3}% of dots)",
            programs.step_other_flops(config.layers),
            100.0 * programs.step_other_flops(config.layers) / modeled,
        );
        assert!(error <= 1e-9, "{name}: {modeled} vs {maxtext}");
        assert_eq!(
            programs.dot_flops[1],
            2 * programs.dot_flops[0],
            "{name}: backward dots are twice the forward's"
        );
        assert_eq!(programs.dot_flops[3], 2 * programs.dot_flops[2], "{name}");
        // The matmuls' weights are the layer's attention and MLP matrices.
        let (e, h, kv, d, m) = (
            config.embed,
            config.heads,
            config.kv_heads,
            config.head_dim,
            config.mlp_dim,
        );
        let n = config.mlp_activations.len() as u64;
        assert_eq!(
            programs.weight_elements(),
            e * (h + 2 * kv) * d + h * d * e + (n + 1) * m * e,
            "{name}"
        );
        let p = parameter_count(&config);
        assert!(programs.weight_elements() <= p.per_layer(), "{name}");
        assert!(programs.forward.flops > programs.dot_flops[0], "{name}");
        assert!(programs.backward.bytes_accessed() > 0, "{name}");
    }
}

#[test]
fn causal_maxtext_count_is_the_full_one_less_half_the_attention() {
    // The programs compute full scores; the causal formula counts half of them.
    let config = bundled("llama2-7b").unwrap();
    let programs = layer_programs(&config, tokens(&config)).unwrap();
    let full = training_flops_per_device(&config, FlopFormula::Matmuls);
    let causal = training_flops_per_device(&config, FlopFormula::MatmulsCausal);
    let modeled = programs.step_dot_flops(config.layers);
    let error = relative_error(modeled - full.attention / 2.0, causal.total());
    assert!(error <= 1e-9, "{error}");
}

#[test]
fn a_fractional_batch_is_built_whole_and_scaled() {
    // v5e-128b runs one sequence per chip; half a sequence is the same
    // graphs scaled by one half.
    let config = ModelConfig {
        per_device_batch: 0.5,
        ..bundled("maxtext-v5e-128b").unwrap()
    };
    let half = layer_programs(&config, tokens(&config)).unwrap();
    assert_eq!((half.shape_batch, half.scale), (1, 0.5));
    let maxtext = training_flops_per_device(&config, FlopFormula::Matmuls).total();
    let error = relative_error(half.step_dot_flops(config.layers), maxtext);
    println!("v5e-128b at batch 0.5: rel error {error:.1e}");
    assert!(error <= 1e-9);
}

#[test]
fn bf16_activations_move_half_the_bytes_of_f32() {
    let bf16 = bundled("llama2-7b").unwrap();
    assert_eq!(bf16.activation_dtype, ModelDType::Bf16);
    let f32s = ModelConfig {
        activation_dtype: ModelDType::F32,
        grad_dtype: None,
        mu_dtype: None,
        num_vocab_tiling: 1,
        quantization: None,
        sliding_window: None,
        optimizer_memory_host_offload: false,
        parameter_memory_host_offload: false,
        ..bf16.clone()
    };
    let t = tokens(&bf16);
    let (a, b) = (
        layer_programs(&bf16, t).unwrap(),
        layer_programs(&f32s, t).unwrap(),
    );
    assert_eq!(a.forward.flops, b.forward.flops);
    assert_eq!(2 * a.forward.bytes_read, b.forward.bytes_read);
    assert_eq!(
        2 * a.logits_backward.bytes_written,
        b.logits_backward.bytes_written
    );
}

#[test]
fn the_decoder_block_changes_the_elementwise_work_only() {
    let llama = ModelConfig {
        attention_width_is_embed: false,
        ..bundled("llama2-7b").unwrap()
    };
    let t = 4096;
    let base = layer_programs(&llama, t).unwrap();
    for block in [DecoderBlock::Gpt3, DecoderBlock::Default] {
        let other = layer_programs(
            &ModelConfig {
                decoder_block: block,
                ..llama.clone()
            },
            t,
        )
        .unwrap();
        assert_eq!(other.dot_flops, base.dot_flops, "{block:?}");
        assert_ne!(other.forward.flops, base.forward.flops, "{block:?}");
    }
}

#[test]
fn bad_configs_are_refused_with_the_validation_error() {
    let good = bundled("llama2-7b").unwrap();
    let cases = [
        (
            ModelConfig {
                kv_heads: 5,
                ..good.clone()
            },
            "kv_heads",
        ),
        (
            ModelConfig {
                embed: 0,
                ..good.clone()
            },
            "embed",
        ),
        (
            ModelConfig {
                mlp_activations: vec!["sigmiod".into()],
                ..good.clone()
            },
            "mlp_activations",
        ),
        (
            ModelConfig {
                per_device_batch: -1.0,
                ..good.clone()
            },
            "per_device_batch",
        ),
    ];
    for (config, expected) in cases {
        let (field, _) = config.validate().unwrap_err();
        assert_eq!(field, expected);
        match layer_programs(&config, 4096) {
            Err(ModelError::Invalid { field, .. }) => assert_eq!(field, expected),
            other => panic!("{expected}: {other:?}"),
        }
    }
    for tokens in [0, MAX_TOKENS + 1, u64::MAX] {
        assert!(matches!(
            layer_programs(&good, tokens),
            Err(ModelError::Invalid { field, .. }) if field == "tokens"
        ));
    }
}

#[test]
fn scores_larger_than_the_ir_allows_are_a_program_error() {
    // 2^24 tokens of one sequence: scores of 32 heads × 2^48 elements.
    let config = ModelConfig {
        seq_len: 1 << 24,
        ..bundled("llama2-7b").unwrap()
    };
    let err = layer_programs(&config, 1 << 24).unwrap_err();
    assert!(
        matches!(&err, ModelError::Program { program, .. } if program == "layer_forward"),
        "{err}"
    );
    assert!(err.to_string().contains("llama2-7b"), "{err}");
}

#[test]
fn gpt3_175b_builds_and_costs_quickly() {
    let config = bundled("gpt3-175b").unwrap();
    let t = tokens(&config);
    let runs = 20;
    let start = std::time::Instant::now();
    let mut nodes = 0;
    for _ in 0..runs {
        nodes = layer_programs(&config, t).unwrap().nodes;
    }
    let each = start.elapsed().as_secs_f64() / runs as f64;
    println!(
        "gpt3-175b at {t} tokens: {:.3} ms per layer_programs call, {nodes} nodes",
        each * 1e3
    );
    // A debug build is far slower than release; this bounds both.
    assert!(each < 0.5, "{each} s");
    assert!(nodes < 400, "{nodes}");
}

fn small_config() -> impl Strategy<Value = ModelConfig> {
    (
        (1u64..=64, 1u64..=64, 1u64..=64, 1u64..=64),
        (1u64..=8, 1u64..=4, 1u64..=64, 1u64..=64),
        (1usize..=3, 0usize..4, 1u64..=4, 0usize..3),
    )
        .prop_map(
            |(
                (embed, head_dim, mlp_dim, vocab),
                (kv, group, seq, layers),
                (n, act, batch, block),
            )| {
                let names = ["relu", "gelu", "silu", "linear"];
                ModelConfig {
                    name: "random".into(),
                    source: String::new(),
                    decoder_block: [
                        DecoderBlock::Llama2,
                        DecoderBlock::Gpt3,
                        DecoderBlock::Default,
                    ][block],
                    layers,
                    embed,
                    heads: kv * group,
                    kv_heads: kv,
                    head_dim,
                    mlp_dim,
                    mlp_activations: (0..n).map(|i| names[(act + i) % 4].to_string()).collect(),
                    vocab,
                    seq_len: seq,
                    per_device_batch: batch as f64,
                    remat: RematPolicy::Full,
                    weight_dtype: ModelDType::F32,
                    activation_dtype: ModelDType::Bf16,
                    grad_dtype: None,
                    mu_dtype: None,
                    num_vocab_tiling: 1,
                    quantization: None,
                    sliding_window: None,
                    optimizer_memory_host_offload: false,
                    parameter_memory_host_offload: false,
                    logits_via_embedding: false,
                    attention_width_is_embed: false,
                    trainable_position_size: 0,
                    attention_kernel: optirs_tpu::model::AttentionKernel::Full,
                    use_iota_embed: false,
                    moe: None,
                    mla: None,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn the_identity_holds_for_small_models(config in small_config()) {
        let programs = layer_programs(&config, tokens(&config)).unwrap();
        let maxtext = training_flops_per_device(&config, FlopFormula::Matmuls).total();
        let modeled = programs.step_dot_flops(config.layers);
        prop_assert!(relative_error(modeled, maxtext) <= 1e-9, "{} vs {}", modeled, maxtext);
        prop_assert_eq!(programs.dot_flops[1], 2 * programs.dot_flops[0]);
        prop_assert_eq!(programs.dot_flops[3], 2 * programs.dot_flops[2]);
        prop_assert!(programs.step_other_flops(config.layers) > 0.0);
    }
}
