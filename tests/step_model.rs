//! A transformer's whole step on a pod (`optirs_tpu::step_model`): the
//! roofline per layer, the model FLOPs as MaxText counts them, FSDP's
//! communication hidden behind compute, and the refusals.

use optirs_tpu::model::{FlopFormula, ModelDType, RematPolicy, bundled, training_flops_per_device};
use optirs_tpu::sharding::Strategy;
use optirs_tpu::step_model::{
    ModelStepOptions, StepModelError, calibration, model_step, recomputed_fraction,
};
use optirs_tpu::topology::{Topology, load_preset, parse_topology};

fn v5e_256() -> Topology {
    load_preset("v5e-256").unwrap()
}

#[test]
fn each_pass_is_its_flops_at_the_calibrated_peak_and_the_model_flops_are_maxtexts() {
    let topology = v5e_256();
    let config = bundled("maxtext-v5e-16b").unwrap();
    let step = model_step(&config, &topology, &ModelStepOptions::new(&topology)).unwrap();
    let peak = topology.generation.spec().peak_bf16_flops;
    let rate = peak * calibration::V5E_MXU_EFFICIENCY;
    assert!(step.calibrated);
    let f = step.layer.forward;
    assert!(
        (f.seconds - f.flops / rate).abs() <= 1e-12 * f.seconds,
        "compute-bound forward"
    );
    // remat full: the backward recomputes every matmul whose result it
    // reads; in this parallel block neither output projection (only the
    // residual reads them).
    let g = optirs_tpu::step_model::hardware_matmul_flops(&config);
    let full = recomputed_fraction(&config, RematPolicy::Full);
    assert!((full - (g.total() - g.out - g.mlp_out) / g.total()).abs() < 1e-12);
    // The flash kernel's own backward: 7/2 of the forward's attention in
    // its two kernels, where the weights' matmuls take twice theirs.
    let kernel = (config.attention_kernel.backward_factor() - 2.0) * g.attention;
    assert_eq!(config.attention_kernel.backward_factor(), 3.5);
    assert!((step.layer.backward.flops - (2.0 + full) * f.flops - kernel).abs() <= 1e-6 * f.flops);
    // MaxText's current count by default.
    assert_eq!(step.flop_formula, FlopFormula::MatmulsCausal);
    let maxtext = training_flops_per_device(&config, FlopFormula::MatmulsCausal).total();
    assert_eq!(step.model_flops_per_device, maxtext);
    assert!((step.tflops_per_chip * 1e12 - maxtext / step.step_seconds).abs() < 1e-3);
    assert!((step.mfu - step.tflops_per_chip * 1e12 / peak).abs() < 1e-12);
    assert!(
        (step.tokens_per_s_per_chip
            - config.per_device_batch * config.seq_len as f64 / step.step_seconds)
            .abs()
            < 1e-9
    );
    // The step is its compute plus what communication leaves exposed.
    assert!((step.step_seconds - step.compute_seconds - step.exposed_communication).abs() < 1e-9);
    assert!(step.fits_in_hbm, "{:?}", step.not_fitting);
}

#[test]
fn fsdp_gathers_hide_behind_a_layer_long_enough_and_show_when_it_is_not() {
    let topology = v5e_256();
    let mut config = bundled("maxtext-v5e-16b").unwrap();
    let mut exposed = Vec::new();
    for batch in [1.0 / 64.0, 1.0 / 8.0, 1.0, 8.0] {
        config.per_device_batch = batch;
        let step = model_step(&config, &topology, &ModelStepOptions::new(&topology)).unwrap();
        exposed.push(step.exposed_communication / step.step_seconds);
    }
    // More tokens per layer: more compute for the same gathers.
    assert!(exposed.windows(2).all(|w| w[1] <= w[0]), "{exposed:?}");
    assert!(
        exposed[0] > 0.5,
        "a tiny batch is communication-bound: {exposed:?}"
    );
    assert!(exposed[3] < 0.01, "{exposed:?}");
}

#[test]
fn remat_policies_recompute_what_they_do_not_save() {
    let config = bundled("llama2-70b").unwrap();
    // minimal saves the weight matmuls only: the attention is recomputed.
    let g = optirs_tpu::step_model::hardware_matmul_flops(&config);
    assert_eq!(
        recomputed_fraction(&config, RematPolicy::Minimal),
        g.attention / g.total()
    );
    assert_eq!(recomputed_fraction(&config, RematPolicy::MinimalFlash), 0.0);
    assert_eq!(recomputed_fraction(&config, RematPolicy::None), 0.0);
    let qkv = recomputed_fraction(&config, RematPolicy::SaveQkvProj);
    let mlp = recomputed_fraction(&config, RematPolicy::SaveDotExceptMlp);
    let wi = recomputed_fraction(&config, RematPolicy::SaveDotExceptMlpwi);
    let full = recomputed_fraction(&config, RematPolicy::Full);
    // `mlpwo`'s result is read by nothing in the backward, so neither
    // saving it nor not makes a difference, and full never recomputes it.
    assert_eq!(wi, mlp);
    assert!(
        0.0 < wi && mlp < qkv && qkv < full && full < 1.0,
        "{wi} {mlp} {qkv} {full}"
    );
    assert!((full - (g.total() - g.mlp_out) / g.total()).abs() < 1e-12);
}

#[test]
fn a_model_too_large_is_reported_not_refused() {
    let topology = v5e_256();
    let config = bundled("gpt3-175b").unwrap();
    let mut options = ModelStepOptions::new(&topology);
    options.strategy = optirs_tpu::sharding::Strategy::Replicated;
    let step = model_step(&config, &topology, &options).unwrap();
    assert!(!step.fits_in_hbm);
    assert!(step.not_fitting.unwrap().contains("over"));
}

#[test]
fn bad_fields_are_errors_naming_the_field() {
    let topology = v5e_256();
    let config = bundled("maxtext-v5e-16b").unwrap();
    for e in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
        let options = ModelStepOptions {
            efficiency: Some(e),
            ..ModelStepOptions::new(&topology)
        };
        let err = model_step(&config, &topology, &options).unwrap_err();
        assert!(
            matches!(
                err,
                StepModelError::Field {
                    field: "efficiency",
                    ..
                }
            ),
            "{e}: {err}"
        );
    }
    let mut fractional = config.clone();
    fractional.per_device_batch = 1.0 / 3.0;
    let err = model_step(&fractional, &topology, &ModelStepOptions::new(&topology)).unwrap_err();
    assert!(matches!(err, StepModelError::Model(_)), "{err}");
    let mut zero = config;
    zero.layers = 0;
    let err = model_step(&zero, &topology, &ModelStepOptions::new(&topology)).unwrap_err();
    assert!(err.to_string().contains("layers"), "{err}");
}

#[test]
fn an_uncalibrated_generation_says_so() {
    let topology = load_preset("v4-128").unwrap();
    let config = bundled("llama2-7b").unwrap();
    let step = model_step(&config, &topology, &ModelStepOptions::new(&topology)).unwrap();
    assert!(!step.calibrated);
    assert_eq!(step.efficiency, calibration::DEFAULT_MXU_EFFICIENCY);
}

#[test]
fn a_175e9_step_on_6144_chips_models_quickly() {
    let topology = parse_topology(
        "Pod(name: \"v5p-12288\", generation: \"v5p\", shape: \"16x16x24\")",
        "v5p.ron",
    )
    .unwrap();
    let config = bundled("gpt3-175b").unwrap();
    let started = std::time::Instant::now();
    let step = model_step(&config, &topology, &ModelStepOptions::new(&topology)).unwrap();
    let wall = started.elapsed().as_secs_f64();
    println!(
        "gpt3-175b on 6144 v5p chips: modeled in {:.1} ms",
        wall * 1e3
    );
    assert!(step.step_seconds > 0.0);
    // Under 100 ms in release (BENCHMARKS.md); a debug build is slower.
    assert!(wall < 2.0, "{wall} s");
}

#[test]
fn each_layers_flops_are_the_cost_analysis_of_its_compiled_programs() {
    let topology = v5e_256();
    for name in optirs_tpu::model::BUNDLED_NAMES {
        let config = bundled(name).unwrap();
        let mut options = ModelStepOptions::new(&topology);
        options.strategy = optirs_tpu::sharding::Strategy::Fsdp;
        let Ok(step) = model_step(&config, &topology, &options) else {
            continue; // a batch that does not split over 256 chips
        };
        if config.sliding_window.is_some() || config.moe.is_some() {
            continue; // banded attention and experts are not compiled (tests/model_features.rs)
        }
        let tokens = (config.per_device_batch * config.seq_len as f64).round() as u64;
        let programs = optirs_tpu::model::layer_programs(&config, tokens).unwrap();
        // The programs compute every score; a causal kernel skips the
        // blocks above the diagonal.
        let g = optirs_tpu::model::layer_matmul_flops(&config);
        let skipped =
            (1.0 - config.attention_kernel.computed_fraction(config.seq_len)) * g.attention;
        let forward = programs.dot_flops[0] as f64 - skipped;
        let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1.0);
        assert!(
            rel(step.layer.forward.flops, forward) < 1e-9,
            "{name}: forward"
        );
        // The backward's dots are twice the forward's, plus what remat
        // recomputes of the forward, plus the scores a flash kernel's
        // backward recomputes where the programs keep them.
        let recompute = recomputed_fraction(&config, config.remat);
        let kernel = (config.attention_kernel.backward_factor() - 2.0) * (g.attention - skipped);
        let backward = programs.dot_flops[1] as f64 - 2.0 * skipped + recompute * forward + kernel;
        assert!(
            rel(step.layer.backward.flops, backward) < 1e-9,
            "{name}: backward"
        );
    }
}

#[test]
fn the_data_all_reduce_after_the_backward_adds_its_whole_duration() {
    use optirs_tpu::cost_model::DataReduction;
    // Two v5e-256 slices: fsdp inside each, data across them over DCN.
    let two = parse_topology(
        "Pod(name: \"2xv5e-256\", generation: \"v5e\", shape: \"16x16\", slices: 2)",
        "test",
    )
    .unwrap();
    let config = bundled("maxtext-v5e-64b").unwrap();
    let step = |when| {
        let options = ModelStepOptions {
            data_reduction: when,
            ..ModelStepOptions::new(&two)
        };
        model_step(&config, &two, &options).unwrap()
    };
    let after = step(DataReduction::AfterBackward);
    let overlapped = step(DataReduction::Overlapped);
    assert_eq!(
        ModelStepOptions::new(&two).data_reduction,
        DataReduction::AfterBackward
    );
    let dcn = after.strategy_step.axes["dcn"].seconds;
    assert!(dcn > 0.1, "{dcn}");
    // The same passes either way (summed in another order).
    let other = overlapped.strategy_step.axes["dcn"].seconds;
    assert!((other - dcn).abs() <= 1e-9 * dcn, "{other} vs {dcn}");
    // Behind the backward it hides; after it, all of it is on the step
    // (less what the overlapped step already left exposed at its end).
    let added = after.step_seconds - overlapped.step_seconds;
    assert!(
        added <= dcn + 1e-9 && added >= dcn - overlapped.exposed_communication - 1e-9,
        "added {added} s, DCN {dcn} s, exposed before {} s",
        overlapped.exposed_communication
    );
    assert!(after.exposed_communication >= dcn - 1e-9);
    assert_eq!(after.data_reduction, DataReduction::AfterBackward);
    // One slice: no reduction over data, the same step either way.
    let one = v5e_256();
    let single = |when| {
        let options = ModelStepOptions {
            data_reduction: when,
            ..ModelStepOptions::new(&one)
        };
        model_step(&config, &one, &options).unwrap().step_seconds
    };
    assert_eq!(
        single(DataReduction::AfterBackward),
        single(DataReduction::Overlapped)
    );
}

#[test]
fn a_causal_kernel_runs_the_blocks_on_and_below_the_diagonal() {
    use optirs_tpu::model::{AttentionKernel, ModelConfig};
    let causal = |block| AttentionKernel::Causal {
        block,
        fused_backward: false,
    };
    // 2048 tokens in 512-token blocks: 10 of 16 blocks.
    assert_eq!(causal(512).computed_fraction(2048), 10.0 / 16.0);
    assert_eq!(causal(2048).computed_fraction(2048), 1.0);
    assert_eq!(causal(4096).computed_fraction(2048), 1.0);
    assert_eq!(causal(1).computed_fraction(4), 10.0 / 16.0);
    assert_eq!(AttentionKernel::Full.computed_fraction(2048), 1.0);
    // The v5p runs' kernel: the hardware skips 3/8 of the attention, the
    // formula's model FLOPs do not change.
    let topology = load_preset("v5p-256").unwrap();
    let config = bundled("maxtext-v5p-32b").unwrap();
    assert_eq!(config.attention_kernel, causal(512));
    let full = ModelConfig {
        attention_kernel: AttentionKernel::Full,
        use_iota_embed: false,
        moe: None,
        mla: None,
        ..config.clone()
    };
    let options = ModelStepOptions::new(&topology);
    let c = model_step(&config, &topology, &options).unwrap();
    let f = model_step(&full, &topology, &options).unwrap();
    let attention = optirs_tpu::model::layer_matmul_flops(&config).attention;
    let skipped = f.layer.forward.flops - c.layer.forward.flops;
    assert!(
        (skipped - 0.375 * attention).abs() <= 1e-9 * attention,
        "{skipped}"
    );
    assert_eq!(c.model_flops_per_device, f.model_flops_per_device);
    assert!(c.step_seconds < f.step_seconds);
    // A block of 0 is refused, naming the field and its line.
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/assets/models/maxtext-v5p-32b.ron"
    ))
    .unwrap()
    .replace("causal(block: 512)", "causal(block: 0)");
    let err = ModelConfig::from_ron_str(&text, "bad.ron")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("attention_kernel") && err.contains("bad.ron"),
        "{err}"
    );
}

/// Each kind in its own type: bf16 weights halve the parameters, the
/// gradient shards, the state and the update's bytes and keep no master
/// copy; `mu_dtype` narrows Adam's first moment only; `grad_dtype` sets
/// the gradient shards and the bytes of their reduction over `data`.
#[test]
fn weights_gradients_and_moments_each_take_their_own_type() {
    let topology = load_preset("v5p-256").unwrap();
    let f32s = bundled("llama2-7b").unwrap();
    let step = |config: &optirs_tpu::model::ModelConfig, strategy| {
        let options = ModelStepOptions {
            strategy,
            ..ModelStepOptions::new(&topology)
        };
        model_step(config, &topology, &options).unwrap()
    };
    let near = |a: u64, b: u64| (a as f64 - b as f64).abs() <= 4096.0 + 1e-6 * b as f64;
    let mut bf16 = f32s.clone();
    bf16.weight_dtype = ModelDType::Bf16;
    let (wide, narrow) = (step(&f32s, Strategy::Fsdp), step(&bf16, Strategy::Fsdp));
    assert!(
        near(2 * narrow.hbm.params, wide.hbm.params),
        "{:?}",
        narrow.hbm
    );
    assert!(near(2 * narrow.hbm.grads, wide.hbm.grads));
    assert!(near(2 * narrow.hbm.state, wide.hbm.state));
    assert!((2.0 * narrow.optimizer.bytes - wide.optimizer.bytes).abs() < 1.0);
    assert_eq!(narrow.hbm_types.params, ModelDType::Bf16);
    // The compute type is unchanged: the gathers and the FLOPs are too.
    assert_eq!(narrow.hbm.gathered, wide.hbm.gathered);
    assert!(narrow.step_seconds <= wide.step_seconds);
    // Under ZeRO-1 a master copy exists only when the weights are wider
    // than the compute type.
    let (wide, narrow) = (
        step(&f32s, Strategy::Replicated),
        step(&bf16, Strategy::Replicated),
    );
    assert!(wide.hbm.master > 0 && narrow.hbm.master == 0);
    assert_eq!(narrow.hbm.params, wide.hbm.params);
    // mu_dtype: Adam's first moment in bf16, the second in f32.
    let mut mu = f32s.clone();
    mu.mu_dtype = Some(ModelDType::Bf16);
    let (wide, moment) = (step(&f32s, Strategy::Fsdp), step(&mu, Strategy::Fsdp));
    assert!(
        near(4 * moment.hbm.state, 3 * wide.hbm.state),
        "{:?}",
        moment.hbm
    );
    assert_eq!(moment.hbm.params, wide.hbm.params);
    assert_eq!(moment.hbm_types.state, ModelDType::Bf16);
    // grad_dtype f32 under bf16 weights: the shards are f32 again, and the
    // reduction over data (two slices) carries twice the bytes.
    let mut grads = bf16.clone();
    grads.grad_dtype = Some(ModelDType::F32);
    let wide_grads = step(&grads, Strategy::Fsdp);
    assert!(near(
        wide_grads.hbm.grads,
        2 * step(&bf16, Strategy::Fsdp).hbm.grads
    ));
    let two = parse_topology(
        "Pod(name: \"v5p-2x64\", generation: \"v5p\", shape: \"4x4x4\", slices: 2, \
         dcn: (latency_us: 10.0, host_gb_per_s: 25.0, oversubscription: 1.0))",
        "v5p2.ron",
    )
    .unwrap();
    let dcn = |config: &optirs_tpu::model::ModelConfig| {
        model_step(config, &two, &ModelStepOptions::new(&two))
            .unwrap()
            .strategy_step
            .axes["dcn"]
            .link_bytes
    };
    assert_eq!(dcn(&grads), 2 * dcn(&bf16));
}
