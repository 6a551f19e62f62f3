//! What today's recipes set, each held to a closed form: a custom remat
//! policy's placements, host offload over the host link and into the
//! host's memory, quantized matmuls at their type's peak (and refused
//! where the chip has none), sliding-window attention's band.

use optirs_tpu::model::flops::window_pairs;
use optirs_tpu::model::{
    AttentionKernel, FlopFormula, ModelConfig, Placement, Quantization, RematPolicy, SlidingWindow,
    activation_memory_per_layer, bundled, layer_matmul_flops, parameter_count,
    training_flops_per_device,
};
use optirs_tpu::step_model::{ModelStepOptions, StepModelError, model_step, recomputed_fraction};
use optirs_tpu::topology::{Topology, load_preset};

fn custom(input: Placement, qkv: Placement) -> RematPolicy {
    RematPolicy::Custom {
        decoder_layer_input: input,
        query_proj: qkv,
        key_proj: qkv,
        value_proj: qkv,
        context: Placement::Remat,
        out_proj: Placement::Remat,
        mlpwi: Placement::Remat,
        mlpwo: Placement::Remat,
    }
}

fn step(config: &ModelConfig, topology: &Topology) -> optirs_tpu::step_model::ModelStep {
    model_step(config, topology, &ModelStepOptions::new(topology)).unwrap()
}

/// `custom` with only the layer input on the device is `full`; offloading
/// a tensor moves it from HBM to the host and stops its recomputation.
#[test]
fn a_custom_policy_places_each_tensor() {
    let mut config = bundled("llama3.1-70b").unwrap();
    config.remat = custom(Placement::Device, Placement::Remat);
    let as_custom = activation_memory_per_layer(&config);
    let full_fraction = recomputed_fraction(&config, RematPolicy::Full);
    assert_eq!(recomputed_fraction(&config, config.remat), full_fraction);
    config.remat = RematPolicy::Full;
    assert_eq!(activation_memory_per_layer(&config), as_custom);
    // q, k, v offloaded: (64 + 2·8)·128 elements a token leave HBM for the
    // host, and their matmuls are no longer recomputed.
    config.remat = custom(Placement::Device, Placement::Offload);
    let m = activation_memory_per_layer(&config);
    assert_eq!(m.host_elements_per_token, (64 + 16) * 128);
    assert_eq!(m.device_elements_per_token, 8192);
    assert!(recomputed_fraction(&config, config.remat) < full_fraction);
    // The layer input cannot be rematerialized.
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/assets/models/llama3.1-70b.ron"
    ))
    .unwrap()
    .replace("decoder_layer_input: offload", "decoder_layer_input: remat");
    let err = ModelConfig::from_ron_str(&text, "l.ron").unwrap_err();
    assert!(err.to_string().contains("decoder_layer_input"), "{err}");
}

/// Offloaded activations cross each chip's host link in both passes: hidden
/// behind a layer's matmuls when shorter, exposed by the difference when
/// longer; the host holds every layer's for each of its chips.
#[test]
fn offloaded_activations_cross_the_host_link() {
    let v6e = load_preset("v6e-256").unwrap();
    let spec = v6e.generation.spec();
    let config = bundled("llama3.1-8b").unwrap();
    let s = step(&config, &v6e);
    let h = s.host_offload;
    let per_layer = activation_memory_per_layer(&config).host_bytes;
    assert_eq!(h.layer_activation_bytes, per_layer);
    assert!((h.layer_seconds - per_layer / spec.host_link_bytes_per_s).abs() < 1e-12);
    let layers = parameter_count(&config).layers as f64;
    assert!(
        (s.phases["host_offload"] - 2.0 * h.layer_seconds * layers).abs() < 1e-9,
        "{:?}",
        s.phases
    );
    let exposed = (s.layer.forward.host_seconds - s.layer.forward.seconds).max(0.0)
        + (s.layer.backward.host_seconds - s.layer.backward.seconds).max(0.0);
    assert!((s.phases["exposed_host_offload"] - exposed * layers).abs() < 1e-9);
    assert_eq!(
        h.host_bytes,
        (per_layer * layers).ceil() as u64 * u64::from(spec.chips_per_host())
    );
    // At 4000 layers every layer's offloaded activations outgrow the
    // host's memory, and the step says so.
    let mut huge = config.clone();
    huge.layers = 4000;
    let s = step(&huge, &v6e);
    assert!(!s.host_offload.fits());
    let why = s.not_fitting.unwrap();
    assert!(why.contains("offloaded per host"), "{why}");
}

/// Optimizer state and parameters on the host leave HBM and cost the
/// update their trip in and out over the host link.
#[test]
fn optimizer_and_parameter_offload_leave_hbm_for_the_host_link() {
    let v5p = load_preset("v5p-256").unwrap();
    let spec = v5p.generation.spec();
    let config = bundled("llama2-7b").unwrap();
    let base = step(&config, &v5p);
    let mut off = config.clone();
    off.optimizer_memory_host_offload = true;
    off.parameter_memory_host_offload = true;
    let s = step(&off, &v5p);
    assert_eq!(s.hbm.state, 0);
    assert_eq!(s.hbm.params, 0);
    let moved = (base.hbm.state + base.hbm.params) as f64;
    assert!(
        (s.host_offload.update_seconds - 2.0 * moved / spec.host_link_bytes_per_s).abs() < 1e-12
    );
    assert!((s.step_seconds - base.step_seconds - s.host_offload.update_seconds).abs() < 1e-9);
}

/// int8 runs the forward's weight matmuls at twice v6e's bf16 peak, plus
/// its operand passes; fp8 is refused where the chip has no fp8 and runs
/// on TPU7x; MFU stays against the bf16 peak.
#[test]
fn quantized_matmuls_run_at_their_types_peak() {
    let v6e = load_preset("v6e-256").unwrap();
    let mut config = bundled("gpt3-175b").unwrap();
    config.per_device_batch = 3.0;
    let bf16 = step(&config, &v6e);
    config.quantization = Some(Quantization::Int8);
    let int8 = step(&config, &v6e);
    assert!(int8.layer.forward.peak_seconds < bf16.layer.forward.peak_seconds);
    let spec = v6e.generation.spec();
    assert_eq!(spec.peak_int8_ops, 2.0 * spec.peak_bf16_flops);
    assert!(int8.layer.forward.quantize_seconds > 0.0);
    assert!(int8.step_seconds < bf16.step_seconds);
    // The same model FLOPs, over a shorter step.
    assert_eq!(int8.model_flops_per_device, bf16.model_flops_per_device);
    assert!(int8.mfu > bf16.mfu && int8.mfu < 1.0);
    config.quantization = Some(Quantization::Fp8);
    let err = model_step(&config, &v6e, &ModelStepOptions::new(&v6e)).unwrap_err();
    assert!(
        matches!(
            err,
            StepModelError::Field {
                field: "quantization",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("fp8"), "{err}");
    // Half precision is no TPU compute type.
    let mut half = bundled("llama2-7b").unwrap();
    half.activation_dtype = optirs_tpu::model::ModelDType::F16;
    let err = model_step(&half, &v6e, &ModelStepOptions::new(&v6e)).unwrap_err();
    assert!(
        err.to_string().starts_with("activation_dtype = f16"),
        "{err}"
    );
    let tpu7x = load_preset("tpu7x-512").unwrap();
    let fp8 = step(&config, &tpu7x);
    config.quantization = None;
    let bf16 = step(&config, &tpu7x);
    assert!(fp8.calibrated && fp8.step_seconds < bf16.step_seconds);
    let spec = tpu7x.generation.spec();
    assert_eq!(spec.peak_fp8_flops, 2.0 * spec.peak_bf16_flops);
    // fp8_full quantizes the gradients' matmuls too: the forward is fp8's,
    // the backward's weight gradients run at the fp8 peak after their own
    // quantizing passes, and no matmul passes its type's peak.
    config.quantization = Some(Quantization::Fp8Full);
    let full = step(&config, &tpu7x);
    assert_eq!(full.layer.forward, fp8.layer.forward);
    let gradients = 2.0 * (fp8.layer.forward.flops - bf16_attention(&fp8));
    let saved = gradients / spec.peak_bf16_flops - gradients / spec.peak_fp8_flops;
    assert!(
        ((fp8.layer.backward.peak_seconds - full.layer.backward.peak_seconds) - saved).abs()
            < 1e-9 * saved,
        "the gradients' matmuls at the fp8 peak"
    );
    assert!(full.layer.backward.quantize_seconds > fp8.layer.backward.quantize_seconds);
    assert!(full.step_seconds < fp8.step_seconds);
    assert_eq!(full.model_flops_per_device, fp8.model_flops_per_device);
    assert!(full.hardware_utilization <= full.efficiency * (1.0 + 1e-9));
    let err = model_step(&config, &v6e, &ModelStepOptions::new(&v6e)).unwrap_err();
    assert!(
        err.to_string().starts_with("quantization = fp8_full"),
        "{err}"
    );
}

/// The forward's attention FLOPs of `step`'s layer (the part no
/// quantization touches): its bf16 share of the forward's peak seconds.
fn bf16_attention(step: &optirs_tpu::step_model::ModelStep) -> f64 {
    let f = &step.layer.forward;
    let spec = optirs_tpu::hardware::TpuGeneration::Tpu7x.spec();
    // peak = q/fp8 + a/bf16 with q + a = flops, fp8 = 2 bf16.
    let bf16 = spec.peak_bf16_flops;
    2.0 * (f.peak_seconds * bf16 - f.flops / 2.0)
}

/// A local layer sees `W·L − W(W−1)/2` query-key pairs; a window as long
/// as the sequence is causal attention, which the current formula halves;
/// the kernel's blocks cover the band, never less; a window past the
/// sequence is refused naming the field.
#[test]
fn sliding_windows_count_their_band() {
    assert_eq!(window_pairs(8, 1), 8.0);
    assert_eq!(window_pairs(8, 8), 36.0);
    assert_eq!(
        window_pairs(32768, 1024),
        1024.0 * 32768.0 - 1024.0 * 1023.0 / 2.0
    );
    let mut config = bundled("gemma3-12b").unwrap();
    let w = config.sliding_window.unwrap();
    assert_eq!(w.global_and_local(48), (8, 40));
    let g = layer_matmul_flops(&config);
    let (b, l, hd) = (1.0, 32768.0, 16.0 * 256.0);
    assert!((g.attention - 4.0 * b * l * l * hd * 8.0 / 48.0).abs() < 1.0);
    assert!(
        (g.window_attention - 4.0 * b * window_pairs(32768, 1024) * hd * 40.0 / 48.0).abs() < 1.0
    );
    // The kernel computes at least the band, at most every score.
    let kernel = config.attention_kernel;
    let computed = kernel.window_pairs_computed(32768, 1024);
    assert!(computed >= window_pairs(32768, 1024) && computed <= l * l);
    assert_eq!(
        AttentionKernel::Full.window_pairs_computed(64, 8),
        64.0 * 64.0
    );
    // A window of the whole sequence is the causal count.
    config.sliding_window = Some(SlidingWindow {
        window: 32768,
        local_per_global: 5,
    });
    let windowed = training_flops_per_device(&config, FlopFormula::MatmulsCausal).attention;
    config.sliding_window = None;
    let causal = training_flops_per_device(&config, FlopFormula::MatmulsCausal).attention;
    assert!(
        (windowed / causal - 1.0).abs() < 1e-4,
        "{windowed} {causal}"
    );
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/assets/models/gemma3-12b.ron"
    ))
    .unwrap()
    .replace("window: 1024", "window: 40000");
    let err = ModelConfig::from_ron_str(&text, "g.ron").unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("sliding_window") && msg.contains("g.ron"),
        "{msg}"
    );
}

/// A flash kernel's backward recomputes the scores: in two kernels it
/// runs 7/2 of the forward's attention, fused 5/2, so fusing saves
/// exactly one forward attention a layer; a one-hot embedding adds
/// `4·T·V·E` to the hardware's FLOPs and nothing to MaxText's count.
#[test]
fn the_attention_backward_and_a_one_hot_embedding_are_the_hardwares() {
    let pod = load_preset("v6e-256").unwrap();
    let mut config = bundled("llama3.1-8b").unwrap();
    assert_eq!(
        config.attention_kernel,
        AttentionKernel::Causal {
            block: 2048,
            fused_backward: true
        }
    );
    assert!(config.use_iota_embed);
    let fused = step(&config, &pod);
    config.attention_kernel = AttentionKernel::Causal {
        block: 2048,
        fused_backward: false,
    };
    let split = step(&config, &pod);
    let forward_attention = optirs_tpu::step_model::hardware_matmul_flops(&config).attention;
    let layers = config.layers as f64;
    let extra = split.hardware_flops_per_device - fused.hardware_flops_per_device;
    assert!(
        (extra - forward_attention * layers).abs() <= 1e-9 * extra,
        "{extra} vs {}",
        forward_attention * layers
    );
    assert_eq!(split.model_flops_per_device, fused.model_flops_per_device);
    assert!(split.step_seconds > fused.step_seconds);
    // The one-hot embedding: forward and gradient, 2·T·V·E each.
    config.use_iota_embed = false;
    let gathered = step(&config, &pod);
    let t = config.tokens_per_device();
    let one_hot = 4.0 * t * config.vocab as f64 * config.embed as f64;
    let added = split.hardware_flops_per_device - gathered.hardware_flops_per_device;
    assert!(
        (added - one_hot).abs() <= 1e-9 * one_hot,
        "{added} vs {one_hot}"
    );
    assert_eq!(
        split.model_flops_per_device,
        gathered.model_flops_per_device
    );
    assert!(split.hardware_utilization <= split.efficiency + 1e-12);
    // The kernel's field reads from a file, false unless set.
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/assets/models/llama3.1-8b.ron"
    ))
    .unwrap()
    .replace(
        "causal(block: 2048, fused_backward: true)",
        "causal(block: 2048)",
    );
    let parsed = ModelConfig::from_ron_str(&text, "l.ron").unwrap();
    assert_eq!(parsed.attention_kernel.backward_factor(), 3.5);
    assert_eq!(AttentionKernel::Full.backward_factor(), 3.5);
}

/// A mixture of experts: its parameters are every expert's, its FLOPs
/// MaxText's dropless count (router and top-k experts a token), and the
/// published Trillium log's TFLOP/s × seconds is that count to 0.01 %
/// (MaxText's formula of October 2024, attention not halved:
/// `FlopFormula::Matmuls`). Dropping adds the capacity's padding and the
/// one-hot dispatch and combine to the hardware's FLOPs only.
#[test]
fn a_mixture_of_experts_counts_as_maxtext_and_runs_what_it_drops() {
    let mut config = bundled("mixtral-8x7b").unwrap();
    // 8 experts of 3·4096·14336, attention, norms, router: 46.7B.
    assert_eq!(parameter_count(&config).total(), 46_702_792_704);
    for (batch, published_tflops_per_s, seconds) in [(12.0, 302.311, 13.484), (8.0, 323.173, 8.409)]
    {
        config.per_device_batch = batch;
        let counted = training_flops_per_device(&config, FlopFormula::Matmuls).total() / 1e12;
        let logged = published_tflops_per_s * seconds;
        assert!(
            (counted / logged - 1.0).abs() < 1e-4,
            "batch {batch}: {counted} TFLOP against the log's {logged}"
        );
    }
    // Dropless routing runs what MaxText counts, in whole row tiles of 512
    // with each tile two experts share run for both; dropping at 1.25
    // runs 2.5 expert rows a token, plus dispatch and combine.
    let moe = config.moe.unwrap();
    assert_eq!(moe.capacity(config.seq_len), Some(1280));
    let dropping = optirs_tpu::step_model::hardware_matmul_flops(&config);
    let counted = layer_matmul_flops(&config);
    let mut dropless_config = config.clone();
    dropless_config.moe = Some(optirs_tpu::model::MixtureOfExperts {
        capacity_factor: None,
        ..moe
    });
    let dropless = optirs_tpu::step_model::hardware_matmul_flops(&dropless_config);
    let t = config.tokens_per_device();
    // 8 × 4096 tokens, top-2: 65536 rows, 128 tiles and 7 boundaries,
    // each inside a tile but 1/512 of the time.
    assert_eq!(t * 2.0, 65536.0);
    let tiles = (128.0 + 7.0 * (1.0 - 1.0 / 512.0)) / 128.0;
    assert!((dropless.mlp_out / (counted.mlp_out * tiles) - 1.0).abs() < 1e-12);
    let one_hot = 2.0 * t * (8 * 1280) as f64 * 4096.0;
    let expected_out = counted.mlp_out * 1.25 + one_hot;
    assert!((dropping.mlp_out / expected_out - 1.0).abs() < 1e-12);
    let pod = load_preset("v6e-256").unwrap();
    let mut options = ModelStepOptions::new(&pod);
    options.strategy = optirs_tpu::sharding::Strategy::Fsdp;
    let dropped = model_step(&config, &pod, &options).unwrap();
    let routed = model_step(&dropless_config, &pod, &options).unwrap();
    assert_eq!(
        dropped.model_flops_per_device,
        routed.model_flops_per_device
    );
    assert!(dropped.hardware_flops_per_device > routed.hardware_flops_per_device);
    assert!(dropped.step_seconds > routed.step_seconds);
    assert!(dropped.fits_in_hbm, "{:?}", dropped.not_fitting);
    // A mixture is not compiled as a dense layer program.
    let err = optirs_tpu::model::layer_programs(&config, 16).unwrap_err();
    assert!(err.to_string().contains("moe"), "{err}");
    // Top-k above the experts is refused, naming the field.
    let text = optirs_tpu::model::bundled_text("mixtral-8x7b")
        .unwrap()
        .replace("num_experts_per_tok: 2", "num_experts_per_tok: 9");
    let err = ModelConfig::from_ron_str(&text, "m.ron")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("moe") && err.contains("num_experts_per_tok 9"),
        "{err}"
    );
}
