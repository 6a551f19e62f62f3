//! Utilization that cannot exceed the chip: over random transformers
//! (sequences up to a million tokens, any causal block, every remat policy
//! and block), pods, strategies and meshes, the hardware runs at most the
//! MXU efficiency of the bf16 peak, and MaxText's current FLOP count (the
//! default) never counts more than the hardware runs, so MFU stays below
//! hardware utilization and 100 %. The optimizer's state and update count
//! in the step, and the step's cost does not grow with the model.

use optirs_tpu::model::{
    AttentionKernel, DecoderBlock, FlopFormula, ModelConfig, ModelDType, Quantization, RematPolicy,
    SlidingWindow, bundled,
};
use optirs_tpu::optimizers::{UpdateCost, UpdateKind};
use optirs_tpu::sharding::Strategy as Sharding;
use optirs_tpu::sharding::{Mesh, MeshSizes};
use optirs_tpu::step_model::{ModelStepOptions, model_step};
use optirs_tpu::topology::{Topology, load_preset, parse_topology};
use proptest::prelude::*;

fn llama_style(layers: u64, embed: u64, seq: u64, block: u64, batch: f64) -> ModelConfig {
    ModelConfig {
        name: "long".into(),
        source: String::new(),
        decoder_block: DecoderBlock::Llama2,
        layers,
        embed,
        heads: 8,
        kv_heads: 8,
        head_dim: embed / 8,
        mlp_dim: 4 * embed,
        mlp_activations: vec!["silu".into(), "linear".into()],
        vocab: 32000,
        seq_len: seq,
        per_device_batch: batch,
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
        attention_width_is_embed: true,
        trainable_position_size: 0,
        attention_kernel: AttentionKernel::Causal {
            block,
            fused_backward: false,
        },
        use_iota_embed: false,
        moe: None,
        mla: None,
    }
}

/// The cases the planner once reported above the chip: a llama2-style model
/// at 131072 tokens in 128-token blocks on v5e-16 (156 % MFU), Llama 2 7B
/// at 131072 and at 32768 tokens on v5p-256 (120 % and 97 %).
#[test]
fn long_sequences_under_a_causal_kernel_stay_below_the_chip() {
    let v5e = load_preset("v5e-16").unwrap();
    let v5p = load_preset("v5p-256").unwrap();
    let mut llama = bundled("llama2-7b").unwrap();
    let cases: Vec<(ModelConfig, &Topology)> = vec![
        (llama_style(4, 1024, 131_072, 128, 1.0), &v5e),
        (
            {
                llama.seq_len = 131_072;
                llama.per_device_batch = 1.0;
                llama.clone()
            },
            &v5p,
        ),
        (
            {
                llama.seq_len = 32_768;
                llama.clone()
            },
            &v5p,
        ),
    ];
    for (config, pod) in cases {
        let step = model_step(&config, pod, &ModelStepOptions::new(pod)).unwrap();
        assert_eq!(step.flop_formula, FlopFormula::MatmulsCausal);
        assert!(step.mfu <= step.hardware_utilization, "{step:?}");
        assert!(
            step.hardware_utilization <= step.efficiency * (1.0 + 1e-9),
            "{} at {} tokens: hardware {} above the efficiency {}",
            config.name,
            config.seq_len,
            step.hardware_utilization,
            step.efficiency
        );
        assert!(step.mfu < 1.0);
    }
}

/// A pod of `chips` v5e or v5p chips.
fn pod(v5p: bool, slices: u32) -> Topology {
    let text = if v5p {
        format!("Pod(name: \"p\", generation: \"v5p\", shape: \"4x4x4\", slices: {slices})")
    } else {
        format!("Pod(name: \"e\", generation: \"v5e\", shape: \"4x4\", slices: {slices})")
    };
    parse_topology(&text, "pod.ron").unwrap()
}

fn config_strategy() -> impl Strategy<Value = (ModelConfig, usize, usize, u32, bool)> {
    (
        (1u64..6, 1u64..5, 0usize..4, 0u32..21, 0u32..15),
        (
            0usize..RematPolicy::ALL.len(),
            0usize..2,
            0usize..3,
            1u32..3,
            any::<bool>(),
        ),
        (proptest::option::of((0u32..21, 1u64..7)), any::<bool>()),
    )
        .prop_map(
            |(
                (layers, width, block, seq_exp, block_exp),
                (remat, kernel, strategy, slices, v5p),
                (window, int8),
            )| {
                let embed = 512 * width;
                let seq = (1u64 << seq_exp.min(20)).max(16);
                let block_tokens = 1u64 << block_exp;
                let mut config = llama_style(layers, embed, seq, block_tokens, 1.0);
                config.decoder_block = [
                    DecoderBlock::Llama2,
                    DecoderBlock::Gpt3,
                    DecoderBlock::Default,
                    DecoderBlock::Gemma3,
                ][block];
                config.remat = RematPolicy::ALL[remat];
                if kernel == 0 {
                    config.attention_kernel = AttentionKernel::Full;
                }
                // Sliding windows of any width up to the sequence, any pattern.
                config.sliding_window = window.map(|(exp, local)| SlidingWindow {
                    window: (seq >> exp.min(seq_exp)).max(1),
                    local_per_global: local,
                });
                if int8 {
                    config.quantization = Some(Quantization::Int8);
                }
                (config, strategy, block, slices, v5p)
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn no_model_uses_more_than_the_chip(
        (config, strategy, _block, slices, v5p) in config_strategy(),
        tensor in 0u32..2,
    ) {
        let topology = pod(v5p, slices);
        let per_slice = topology.chips_per_slice() as usize;
        let t = if tensor == 1 { 4 } else { 1 };
        let mesh = if t > 1 {
            MeshSizes::new(slices as usize, per_slice / t, t)
                .lay_out_split(&topology)
                .ok()
        } else {
            Some(Mesh::default_for(&topology))
        };
        let Some(mesh) = mesh else { return Ok(()) };
        let options = ModelStepOptions {
            strategy: Sharding::ALL[strategy],
            mesh,
            ..ModelStepOptions::new(&topology)
        };
        let step = model_step(&config, &topology, &options)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(
            step.hardware_utilization <= step.efficiency * (1.0 + 1e-9),
            "hardware {} above the MXU efficiency {} ({} tokens, {:?})",
            step.hardware_utilization, step.efficiency, config.seq_len, config.attention_kernel
        );
        // MFU is against the bf16 peak, as MaxText reports it; hardware
        // utilization counts a quantized matmul against its own type's, so
        // only unquantized MFU is bounded by it.
        if config.quantization.is_none() {
            prop_assert!(
                step.mfu <= step.hardware_utilization * (1.0 + 1e-9),
                "MFU {} above the hardware's {}", step.mfu, step.hardware_utilization
            );
            // The step holds the compute the hardware FLOPs take.
            let peak = topology.generation.spec().peak_bf16_flops;
            prop_assert!(
                step.step_seconds * (1.0 + 1e-9)
                    >= step.hardware_flops_per_device / (peak * step.efficiency)
            );
        }
        prop_assert!(step.mfu < 1.0);
        prop_assert!(step.hardware_flops_per_device >= step.model_flops_per_device * (1.0 - 1e-12));
    }
}

/// `--optimizer` changes the step: its slots the HBM state and its update's
/// bytes and FLOPs (what the compiled update program counts).
#[test]
fn the_optimizer_counts_in_the_step() {
    let topology = load_preset("v5p-256").unwrap();
    let config = bundled("llama2-7b").unwrap();
    let of = |kind| {
        let options = ModelStepOptions {
            optimizer: UpdateCost::of(kind),
            ..ModelStepOptions::new(&topology)
        };
        model_step(&config, &topology, &options).unwrap()
    };
    let (sgd, momentum, adam) = (
        of(UpdateKind::Sgd),
        of(UpdateKind::Momentum),
        of(UpdateKind::Adam),
    );
    assert_eq!(
        (
            sgd.optimizer.slots,
            momentum.optimizer.slots,
            adam.optimizer.slots
        ),
        (0, 1, 2)
    );
    assert_eq!(sgd.hbm.state, 0);
    assert_eq!(adam.hbm.state, 2 * momentum.hbm.state);
    assert!(sgd.hbm.total < momentum.hbm.total && momentum.hbm.total < adam.hbm.total);
    // Every device updates the same shard; the bytes are (3 + 2·slots) f32
    // words an element, at HBM bandwidth.
    assert_eq!(sgd.optimizer.elements, adam.optimizer.elements);
    let n = adam.optimizer.elements as f64;
    assert_eq!(sgd.optimizer.bytes, 3.0 * 4.0 * n);
    assert_eq!(adam.optimizer.bytes, 7.0 * 4.0 * n);
    let hbm = topology.generation.spec().hbm_bytes_per_s;
    assert!((adam.optimizer.seconds - adam.optimizer.bytes / hbm).abs() < 1e-12);
    assert!(adam.optimizer.flops > momentum.optimizer.flops);
    assert!(momentum.optimizer.flops > sgd.optimizer.flops);
    assert_eq!(adam.optimizer.name, "adam");
    // The update is memory-bound on every generation: its FLOPs per byte
    // are far below the ridge point the roofline would switch at.
    for kind in UpdateKind::ALL {
        let cost = UpdateCost::of(kind);
        let intensity = cost.flops_per_element as f64 / cost.bytes_per_element(4) as f64;
        let ridge = topology.generation.spec().peak_bf16_flops / hbm;
        assert!(intensity < ridge / 50.0, "{kind}: {intensity} FLOP/B");
    }
}
