//! One whole training step of a transformer on a pod, in closed form:
//! every layer's forward and backward on the MXU at the roofline, the
//! mesh's collectives of the strategy placed around them, the optimizer
//! update — what `train --model` and `goodput --model` report.
//!
//! **Compute.** Per layer and device, the forward's matmul FLOPs are
//! MaxText's per-matmul count ([`crate::model::flops`]) with the
//! attention's scores and values as the model's kernel computes them
//! ([`hardware_matmul_flops`]: all of them, or a causal flash kernel's
//! blocks on and below the diagonal);
//! the backward's are twice the forward's, plus what the remat policy
//! recomputes ([`recomputed_fraction`]); the logits and the loss run
//! between the passes. A pass lasts the larger of its FLOPs at the
//! generation's bf16 peak times the MXU efficiency ([`calibration`]) and
//! its weight and activation bytes at HBM bandwidth.
//!
//! **Communication.** The model's parameters are laid out one tensor per
//! layer (and the embedding and logits matrices), in buckets of one
//! layer, and the step is [`crate::sharding::strategy_model`]'s with these
//! uses: under fsdp each layer's gather is prefetched behind the previous
//! layer's compute and the gradient's reduce-scatter runs behind the
//! backward. The all-reduce over `data` (across the DCN on a multislice
//! pod) runs after the whole backward pass by default
//! ([`DataReduction::AfterBackward`]): MaxText's published multislice runs
//! lose about that much or more, never the nothing a hidden one would
//! cost (`docs/validation.md`); `Overlapped` hides it behind the backward
//! instead. A `tensor` axis splits every layer's heads
//! and MLP ([`tensor`]): each device holds `1/t` of the weights, fsdp
//! gathers that `1/t`, and the layer's activation gathers and
//! reduce-scatters run with its matmuls. What does not hide is the
//! exposed communication. Collectives carry the weights' element type
//! (MaxText's `weight_dtype`, f32 in every bundled model).
//!
//! **What it reports.** Step seconds, tokens/s/chip, TFLOP/s/chip (the
//! model FLOPs of MaxText's formula over the step time) and MFU (that
//! over the peak), compute and exposed communication, and HBM per device
//! by kind with the saved activations of the remat policy.

pub mod calibration;
pub mod tensor;
pub mod validation;

use std::collections::BTreeMap;

use serde::Serialize;
use thiserror::Error;

use crate::hardware::TpuGeneration;
use crate::ir::DType;
use crate::model::{
    FlopFormula, LayerMatmulFlops, ModelConfig, ModelDType, ModelError, RematPolicy,
    activation_memory_per_layer, layer_matmul_flops, parameter_count, training_flops_per_device,
};
use crate::sharding::strategy_model::{
    DataReduction, StrategyOptions, StrategyStep, modeled_strategy_step,
};
use crate::sharding::{Mesh, RecoveryPolicy, ShardingError, Strategy};
use crate::topology::Topology;

/// How a model's step is modeled.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelStepOptions {
    /// The strategy (fsdp, MaxText's default inside a slice).
    pub strategy: Strategy,
    /// The mesh, laid out on the pod.
    pub mesh: Mesh,
    /// fsdp: layers gathered ahead of the one in use.
    pub prefetch: usize,
    /// The recovery policy whose per-step costs are in the figures.
    pub recovery: RecoveryPolicy,
    /// The MXU efficiency, if not the generation's calibrated one.
    pub efficiency: Option<f64>,
    /// The FLOP formula of the reported TFLOP/s and MFU (MaxText's
    /// current one by default; a published table's for validation).
    pub formula: FlopFormula,
    /// Whether to keep every layer's spans (for a trace).
    pub record_spans: bool,
    /// When the gradients' reduction over `data` (across the slices on a
    /// multislice pod) runs: after the backward pass by default
    /// (module docs).
    pub data_reduction: DataReduction,
}

impl ModelStepOptions {
    /// fsdp on the pod's default mesh, prefetch 1, rollback, the
    /// calibrated efficiency, MaxText's current formula.
    pub fn new(topology: &Topology) -> ModelStepOptions {
        ModelStepOptions {
            strategy: Strategy::Fsdp,
            mesh: Mesh::default_for(topology),
            prefetch: 1,
            recovery: RecoveryPolicy::Rollback,
            efficiency: None,
            formula: FlopFormula::Matmuls,
            record_spans: false,
            data_reduction: DataReduction::AfterBackward,
        }
    }
}

/// A model's step that cannot be modeled.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StepModelError {
    /// The model's configuration.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The strategy's collectives and memory.
    #[error(transparent)]
    Sharding(#[from] ShardingError),
    /// A field the step model does not take as given.
    #[error("{field} = {value}: {problem}")]
    Field {
        /// The field (`weight_dtype`, `efficiency`).
        field: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        problem: String,
    },
}

/// One pass's compute on one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PassCompute {
    /// Matmul FLOPs the hardware runs.
    pub flops: f64,
    /// HBM bytes read and written.
    pub bytes: f64,
    /// Seconds: the larger of FLOPs and bytes at their roofs.
    pub seconds: f64,
    /// Its tensor-parallel collectives, seconds (0 without a tensor axis;
    /// they run while the matmuls do, [`tensor`]).
    pub tensor_seconds: f64,
}

impl PassCompute {
    /// How long the pass lasts: its compute, or its tensor-parallel
    /// collectives if they take longer.
    pub fn elapsed(&self) -> f64 {
        self.seconds.max(self.tensor_seconds)
    }

    /// The part of the tensor-parallel collectives the compute does not cover.
    pub fn exposed_tensor_seconds(&self) -> f64 {
        (self.tensor_seconds - self.seconds).max(0.0)
    }
}

/// One decoder layer's compute on one device, and the logits'.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LayerCompute {
    /// A layer's forward pass.
    pub forward: PassCompute,
    /// A layer's backward pass, with what remat recomputes.
    pub backward: PassCompute,
    /// The logits and loss, forward and backward.
    pub logits: PassCompute,
}

/// HBM per device by kind, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ModelHbm {
    /// Parameters (the replica, or under fsdp the shard).
    pub params: u64,
    /// Gradient buffers.
    pub grads: u64,
    /// Optimizer state.
    pub state: u64,
    /// Redundant copies.
    pub redundant: u64,
    /// Gathered layers in flight (fsdp).
    pub gathered: u64,
    /// The activations every layer keeps for the backward pass under the
    /// remat policy.
    pub activations: u64,
    /// All of it.
    pub total: u64,
}

/// A model's modeled step on a pod.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelStep {
    /// The model's name.
    pub model: String,
    /// The strategy.
    pub strategy: Strategy,
    /// The mesh (`data=1,fsdp=256,tensor=1`).
    pub mesh: String,
    /// When the gradients' reduction over `data` ran.
    pub data_reduction: DataReduction,
    /// Chips.
    pub chips: usize,
    /// Tokens per device per step.
    pub tokens_per_device: f64,
    /// The MXU efficiency used.
    pub efficiency: f64,
    /// Whether the efficiency is a generation's calibrated one (false: the
    /// default for a generation without fitted rows, or given).
    pub calibrated: bool,
    /// The step, seconds.
    pub step_seconds: f64,
    /// Tokens per second per chip.
    pub tokens_per_s_per_chip: f64,
    /// Model TFLOP/s per chip (the formula's FLOPs over the step).
    pub tflops_per_chip: f64,
    /// `tflops_per_chip` over the generation's bf16 peak.
    pub mfu: f64,
    /// Model FLOPs per device per step (the formula's).
    pub model_flops_per_device: f64,
    /// FLOPs the hardware runs per device per step (with recomputation).
    pub hardware_flops_per_device: f64,
    /// Compute seconds (the passes and the update).
    pub compute_seconds: f64,
    /// Step seconds not covered by compute.
    pub exposed_communication: f64,
    /// Seconds per phase (`forward`, `backward`, `logits`, `update`, the
    /// collectives' passes, `exposed_communication`).
    pub phases: BTreeMap<String, f64>,
    /// Per layer and the logits.
    pub layer: LayerCompute,
    /// HBM per device by kind.
    pub hbm: ModelHbm,
    /// Whether the step fits each device's HBM.
    pub fits_in_hbm: bool,
    /// What does not fit, and by how much.
    pub not_fitting: Option<String>,
    /// The strategy's step (collectives, memory) behind it.
    #[serde(skip)]
    pub strategy_step: StrategyStep,
}

/// A layer's forward matmul FLOPs as the hardware runs them: MaxText's
/// per-matmul count ([`layer_matmul_flops`]) with the attention's scores
/// and values at what the model's attention kernel computes
/// ([`crate::model::AttentionKernel::computed_fraction`]).
pub fn hardware_matmul_flops(config: &ModelConfig) -> LayerMatmulFlops {
    let mut g = layer_matmul_flops(config);
    g.attention *= config.attention_kernel.computed_fraction(config.seq_len);
    g
}

/// The fraction of a layer's forward matmul FLOPs `policy` recomputes in
/// the backward pass: `full` all of them; `none` and `minimal_flash`
/// none; `minimal` the attention's (it saves the weight matmuls only);
/// those that save some projections the rest (per group,
/// [`layer_matmul_flops`]).
pub fn recomputed_fraction(config: &ModelConfig, policy: RematPolicy) -> f64 {
    let g = hardware_matmul_flops(config);
    let all = g.total();
    if all <= 0.0 {
        return 0.0;
    }
    // Only `minimal_flash` keeps the attention's output; every other
    // policy that saves dots saves weight matmuls (the attention dots have
    // batch dimensions, and a flash kernel is no dot), so the attention is
    // recomputed.
    let recomputed = match policy {
        RematPolicy::Full => all,
        RematPolicy::None | RematPolicy::MinimalFlash => 0.0,
        RematPolicy::Minimal | RematPolicy::MinimalOffloaded => g.attention,
        RematPolicy::SaveQkvProj | RematPolicy::QkvProjOffloaded => all - g.qkv,
        RematPolicy::SaveOutProj => all - g.out,
        RematPolicy::SaveDotExceptMlp => g.attention + g.mlp_in + g.mlp_out,
        RematPolicy::SaveDotExceptMlpwi => g.attention + g.mlp_in,
    };
    recomputed / all
}

/// HBM bytes of one layer's forward on one device: its weights (its
/// `1/tensor` of them) read once (in the activations' type, as the MXU
/// takes them), each matmul's input
/// and output activations read or written once (the attention scores are
/// not materialized: a fused attention kernel keeps them on chip).
fn forward_bytes(c: &ModelConfig, tensor: usize) -> f64 {
    let t = c.tokens_per_device();
    let act = c.activation_dtype.byte_size() as f64;
    let weights = parameter_count(c).per_layer() as f64 * act / tensor.max(1) as f64;
    let (e, h, kv, d, m) = (
        c.embed as f64,
        c.heads as f64,
        c.kv_heads as f64,
        c.head_dim as f64,
        c.mlp_dim as f64,
    );
    let n_act = c.mlp_activations.len() as f64;
    // Per token: qkv in/out, attention in/out, out-projection in/out, MLP
    // in/out (its hidden read and written once more by the activation).
    let per_token = (e + (h + 2.0 * kv) * d)
        + ((h + 2.0 * kv) * d + h * d)
        + (h * d + e)
        + (e + n_act * m)
        + (n_act * m + m)
        + (m + e);
    weights + t * per_token * act
}

/// The step of `config` on `topology` under `options` (module docs).
pub fn model_step(
    config: &ModelConfig,
    topology: &Topology,
    options: &ModelStepOptions,
) -> Result<ModelStep, StepModelError> {
    let (efficiency, calibrated) = checked(config, topology, options)?;
    let spec = topology.generation.spec();
    let recompute = recomputed_fraction(config, config.remat);
    let tp = tensor::tensor_parallel(config, topology, &options.mesh, recompute)?;
    let t = tp.map_or(1, |tp| tp.size);
    let mut layer = layer_compute(config, spec, efficiency, (t, recompute));
    if let Some(tp) = &tp {
        layer.forward.tensor_seconds = tp.forward_seconds;
        layer.backward.tensor_seconds = tp.backward_seconds;
    }
    let counts = parameter_count(config);
    let layers = counts.layers as f64;
    let (tensors, layer_bytes) = layer_tensors(config);
    let tensors = tensor::split_tensors(&tensors, t);
    let layer_bytes = layer_bytes.div_ceil(t);
    let buckets = tensors.len() as f64;
    let strategy_options = StrategyOptions {
        strategy: options.strategy,
        mesh: options.mesh.clone(),
        prefetch: options.prefetch,
        recovery: options.recovery,
        // The layers' compute spread over the buckets (one layer each, the
        // embedding's bucket a share of it).
        use_seconds: layer.forward.elapsed() * layers / buckets,
        backward_use_seconds: Some(layer.backward.elapsed() * layers / buckets),
        between_seconds: layer.logits.seconds,
        record_spans: options.record_spans,
        data_reduction: options.data_reduction,
    };
    let step = modeled_strategy_step(
        topology,
        &tensors,
        DType::F32,
        2,
        layer_bytes.max(1),
        &strategy_options,
    )?;
    let model_flops = training_flops_per_device(config, options.formula).total();
    let hardware_flops = (layer.forward.flops + layer.backward.flops) * layers + layer.logits.flops;
    let (hbm, not_fitting) = hbm_of(config, &step, spec.hbm_bytes);
    let tensor_exposed =
        (layer.forward.exposed_tensor_seconds() + layer.backward.exposed_tensor_seconds()) * layers;
    let compute = step.use_seconds + step.update_seconds - tensor_exposed;
    let step_seconds = step.step_seconds;
    let mut phases = step.phases.clone();
    phases.insert("forward".into(), layer.forward.seconds * layers);
    phases.insert("backward".into(), layer.backward.seconds * layers);
    phases.insert("logits".into(), layer.logits.seconds);
    if let Some(tp) = &tp {
        // Forward and backward: as many reduce-scatters as gathers.
        let count = tp.per_pass as f64 * (2.0 + recompute) * layers;
        phases.insert("all_gather.tensor".into(), tp.gather.seconds * count);
        phases.insert("reduce_scatter.tensor".into(), tp.scatter.seconds * count);
        phases.insert("exposed_tensor_parallel".into(), tensor_exposed);
        if let Some(e) = phases.get_mut("exposed_communication") {
            *e = (step_seconds - compute).max(0.0);
        }
    }
    let tflops = model_flops / step_seconds / 1e12;
    let t = config.tokens_per_device();
    Ok(ModelStep {
        model: config.name.clone(),
        strategy: options.strategy,
        mesh: options.mesh.to_string(),
        data_reduction: options.data_reduction,
        chips: topology.num_devices() as usize,
        tokens_per_device: t,
        efficiency,
        calibrated,
        step_seconds,
        tokens_per_s_per_chip: t / step_seconds,
        tflops_per_chip: tflops,
        mfu: tflops * 1e12 / spec.peak_bf16_flops,
        model_flops_per_device: model_flops,
        hardware_flops_per_device: hardware_flops,
        compute_seconds: compute,
        exposed_communication: (step_seconds - compute).max(0.0),
        phases,
        layer,
        fits_in_hbm: not_fitting.is_none(),
        not_fitting,
        hbm,
        strategy_step: step,
    })
}

/// The checks before any modeling, and the efficiency to use.
fn checked(
    config: &ModelConfig,
    topology: &Topology,
    options: &ModelStepOptions,
) -> Result<(f64, bool), StepModelError> {
    if let Err((field, problem)) = config.validate() {
        return Err(StepModelError::Field {
            field,
            value: config.name.clone(),
            problem,
        });
    }
    if config.weight_dtype != ModelDType::F32 {
        return Err(StepModelError::Field {
            field: "weight_dtype",
            value: format!("{:?}", config.weight_dtype).to_lowercase(),
            problem: "the step's collectives and optimizer state carry f32 weights; a \
                      narrower weight type is not modeled"
                .into(),
        });
    }
    let efficiency = efficiency_for(topology.generation, options.efficiency)?;
    config.global_batch(u64::from(topology.num_devices()))?;
    Ok(efficiency)
}

/// One layer's passes and the logits' at the roofline of `spec` with the
/// MXU at `efficiency` of its peak, each device holding `1/tensor` of the
/// weights and the backward recomputing `recompute` of the forward.
fn layer_compute(
    config: &ModelConfig,
    spec: &crate::hardware::HardwareSpec,
    efficiency: f64,
    (tensor, recompute): (usize, f64),
) -> LayerCompute {
    let flops_per_s = spec.peak_bf16_flops * efficiency;
    let pass = |flops: f64, bytes: f64| PassCompute {
        flops,
        bytes,
        seconds: (flops / flops_per_s).max(bytes / spec.hbm_bytes_per_s),
        tensor_seconds: 0.0,
    };
    let forward_flops = hardware_matmul_flops(config).total();
    let fwd_bytes = forward_bytes(config, tensor);
    let t = config.tokens_per_device();
    let logits_matrix = config.vocab as f64 * config.embed as f64;
    let act = config.activation_dtype.byte_size() as f64;
    LayerCompute {
        forward: pass(forward_flops, fwd_bytes),
        backward: pass(
            (2.0 + recompute) * forward_flops,
            (2.0 + recompute) * fwd_bytes,
        ),
        // Forward 2·T·E·V, backward twice that; the logits written and
        // read back by the loss, the matrix read.
        logits: pass(
            6.0 * t * logits_matrix,
            3.0 * (logits_matrix * act + t * config.vocab as f64 * act),
        ),
    }
}

/// The model's parameters as tensors, one per layer and the embedding
/// (with the logits and positions), and one layer's bytes (the bucket):
/// what the step's collectives move, and what a real run shards.
pub fn layer_tensors(config: &ModelConfig) -> (Vec<(String, Vec<usize>)>, usize) {
    let counts = parameter_count(config);
    let mut tensors: Vec<(String, Vec<usize>)> = (0..counts.layers)
        .map(|i| (format!("layer{i}"), vec![counts.per_layer() as usize]))
        .collect();
    let rest = counts.embedding + counts.logits + counts.position + counts.final_norm;
    tensors.push(("embedding".into(), vec![rest as usize]));
    (
        tensors,
        counts.per_layer() as usize * DType::F32.byte_size(),
    )
}

/// HBM per device: the strategy's and the activations the remat policy
/// keeps; what does not fit `capacity`, if anything.
fn hbm_of(config: &ModelConfig, step: &StrategyStep, capacity: u64) -> (ModelHbm, Option<String>) {
    let layers = parameter_count(config).layers as f64;
    let activations = (activation_memory_per_layer(config).device_bytes * layers).ceil() as u64;
    let m = &step.memory;
    let hbm = ModelHbm {
        params: m.params,
        grads: m.grads + m.gradient_bucket,
        state: m.state,
        redundant: m.redundant_state,
        gathered: m.gathered_buckets,
        activations,
        total: m.total() + activations,
    };
    let bytes = crate::sharding::strategy::decimal_bytes;
    let not_fitting = (hbm.total > capacity).then(|| {
        format!(
            "{} per device ({} of it activations under remat {}) of {}: {} over",
            bytes(hbm.total),
            bytes(activations),
            config.remat.name(),
            bytes(capacity),
            bytes(hbm.total - capacity)
        )
    });
    (hbm, not_fitting)
}

/// The efficiency to use on `generation`: the given one (checked), or the
/// calibrated one, or the default for a generation without fitted rows.
fn efficiency_for(
    generation: TpuGeneration,
    given: Option<f64>,
) -> Result<(f64, bool), StepModelError> {
    if generation.spec().peak_bf16_flops <= 0.0 {
        return Err(StepModelError::Field {
            field: "generation",
            value: generation.name().into(),
            problem: "no published bf16 peak for it".into(),
        });
    }
    match given {
        Some(e) if !(e.is_finite() && e > 0.0 && e <= 1.0) => Err(StepModelError::Field {
            field: "efficiency",
            value: e.to_string(),
            problem: "the MXU efficiency is a fraction of the peak, in (0, 1]".into(),
        }),
        Some(e) => Ok((e, false)),
        None => Ok(match calibration::mxu_efficiency(generation) {
            Some(e) => (e, true),
            None => (calibration::DEFAULT_MXU_EFFICIENCY, false),
        }),
    }
}
