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
//! recomputes ([`recomputed_fraction`]: of the forward's matmuls, those
//! whose results the backward reads and the policy does not save); the
//! logits and the loss run between the passes. A pass lasts the larger of its FLOPs at the
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
//! exposed communication.
//!
//! **Precision** ([`precision`]): the weights' gathers, the gradients'
//! reduce-scatter over `fsdp` and the activations' collectives carry the
//! compute type (`dtype`); the parameters are held in `weight_dtype` (with
//! an f32 master shard beside a bf16 replica under replicated and zero2
//! when they are wider than the compute type), the gradient shards and
//! their reduction over `data` in `grad_dtype`, Adam's first moment in
//! `mu_dtype` and its second in the weights' type; the update reads and
//! writes each in its own.
//!
//! **The step** is the steady state of back-to-back steps, every strategy
//! overlapping by the same rules (`sharding::strategy_model`'s training
//! order): each bucket's gradient collectives behind the backward, its new
//! parameters in before the next forward uses them.
//!
//! **Quantization** (`quantization: int8 | fp8`): the forward's weight
//! matmuls, and the backward's recomputation of them, run at the type's
//! peak, after a memory pass per operand to quantize it (AQT's dynamic
//! scaling, [`quantize_bytes`]); the attention and the logits stay bf16.
//! The backward's gradient matmuls are modeled at the bf16 peak: AQT
//! quantizes them too, with stochastic rounding on the gradients, and the
//! published pair that isolates it (GPT-3 175B on v6e-256, the same
//! recipe bf16 and int8: 357.6 and 431.3 tokens/s/chip, 1.21×) gains what
//! an int8 forward alone gives (1.2× at twice the peak), not the 2× of
//! every matmul. A chip with no native peak for the type is refused.
//! MFU stays against the bf16 peak, as MaxText reports it; hardware
//! utilization counts each matmul against its own type's peak.
//!
//! **The optimizer** ([`crate::optimizers::UpdateCost`]) sets the state
//! slots the HBM account and the update carry, and the update's FLOPs;
//! the update streams its bytes at HBM bandwidth (its few FLOPs per byte
//! are far below any generation's ridge point).
//!
//! **What it reports.** Step seconds, tokens/s/chip, and two
//! utilizations: **MFU**, the model FLOPs of MaxText's formula (the current
//! one by default: causal attention halved, [`FlopFormula::MatmulsCausal`];
//! the formula is named in the report) over the step and the peak; and
//! **hardware utilization**, the FLOPs the MXU runs (a causal kernel's
//! blocks, the recomputed matmuls) over the same. The hardware runs at
//! most the peak times the MXU efficiency, so hardware utilization never
//! exceeds the efficiency; the current formula never counts more than the
//! hardware runs, so MFU never exceeds hardware utilization
//! (`tests/utilization.rs`). Then compute and exposed communication, and
//! HBM per device by kind at the step's peak ([`hbm`]).

pub mod calibration;
pub mod hbm;
pub mod offload;
pub mod recipes;
pub mod tensor;
pub mod validation;

pub use hbm::{HbmTypes, ModelHbm};
pub use offload::HostOffload;

use std::collections::BTreeMap;

use serde::Serialize;
use thiserror::Error;

use crate::hardware::TpuGeneration;
use crate::ir::DType;
use crate::model::{
    FlopFormula, LayerMatmulFlops, ModelConfig, ModelDType, ModelError, Placement, Quantization,
    RematPolicy, layer_matmul_flops, parameter_count, training_flops_per_device,
};
use crate::optimizers::{UpdateCost, UpdateKind};
use crate::sharding::bucket_runs::BucketRuns;
use crate::sharding::strategy_model::{
    DataReduction, Precision, StepOrder, StrategyOptions, StrategyStep, modeled_strategy_step,
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
    /// The optimizer: its state slots and update.
    pub optimizer: UpdateCost,
}

impl ModelStepOptions {
    /// fsdp on the pod's default mesh, prefetch 1, rollback, Adam, the
    /// calibrated efficiency, MaxText's current formula.
    pub fn new(topology: &Topology) -> ModelStepOptions {
        ModelStepOptions {
            strategy: Strategy::Fsdp,
            mesh: Mesh::default_for(topology),
            prefetch: 1,
            recovery: RecoveryPolicy::Rollback,
            efficiency: None,
            formula: FlopFormula::MatmulsCausal,
            record_spans: false,
            data_reduction: DataReduction::AfterBackward,
            optimizer: UpdateCost::of(UpdateKind::Adam),
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
    /// Its offloaded activations over the host link, seconds (0 without
    /// offload; the DMA runs while the matmuls do, [`offload`]).
    pub host_seconds: f64,
    /// Seconds its FLOPs take at the chip's peaks (each matmul at its
    /// type's): what hardware utilization counts.
    pub peak_seconds: f64,
    /// Of `seconds`, quantizing the matmuls' operands (0 unquantized).
    pub quantize_seconds: f64,
}

impl PassCompute {
    /// How long the pass lasts: its compute, or its tensor-parallel
    /// collectives or host transfers if they take longer.
    pub fn elapsed(&self) -> f64 {
        self.seconds.max(self.tensor_seconds).max(self.host_seconds)
    }

    /// The part of the tensor-parallel collectives the compute does not cover.
    pub fn exposed_tensor_seconds(&self) -> f64 {
        (self.tensor_seconds - self.seconds).max(0.0)
    }

    /// The part of the host transfers neither the compute nor the
    /// tensor-parallel collectives cover.
    pub fn exposed_host_seconds(&self) -> f64 {
        (self.host_seconds - self.seconds.max(self.tensor_seconds)).max(0.0)
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
    /// The remat policy (the model's).
    pub remat: RematPolicy,
    /// Whether the efficiency is a generation's calibrated one (false: the
    /// default for a generation without fitted rows, or given).
    pub calibrated: bool,
    /// An uncalibrated generation's step at the least and the most of the
    /// fitted constants ([`calibration::fitted_range`]): the spread the
    /// other generations allow, seconds (slowest first). `None` when
    /// calibrated or the efficiency was given.
    pub step_seconds_range: Option<(f64, f64)>,
    /// The step, seconds.
    pub step_seconds: f64,
    /// Tokens per second per chip.
    pub tokens_per_s_per_chip: f64,
    /// Model TFLOP/s per chip (the formula's FLOPs over the step).
    pub tflops_per_chip: f64,
    /// `tflops_per_chip` over the generation's bf16 peak.
    pub mfu: f64,
    /// The formula of the model FLOPs.
    pub flop_formula: FlopFormula,
    /// Model FLOPs per device per step (the formula's).
    pub model_flops_per_device: f64,
    /// FLOPs the hardware runs per device per step (a causal kernel's
    /// blocks, the recomputed matmuls).
    pub hardware_flops_per_device: f64,
    /// Hardware TFLOP/s per chip.
    pub hardware_tflops_per_chip: f64,
    /// `hardware_tflops_per_chip` over the bf16 peak: at most the MXU
    /// efficiency.
    pub hardware_utilization: f64,
    /// The optimizer's update on a device.
    pub optimizer: OptimizerStep,
    /// Compute seconds (the passes and the update).
    pub compute_seconds: f64,
    /// Step seconds not covered by compute.
    pub exposed_communication: f64,
    /// Seconds per phase (`forward`, `backward`, `logits`, `update`, the
    /// collectives' passes, `exposed_communication`).
    pub phases: BTreeMap<String, f64>,
    /// Per layer and the logits.
    pub layer: LayerCompute,
    /// HBM per device by kind at the step's peak.
    pub hbm: ModelHbm,
    /// The element type of each kind.
    pub hbm_types: HbmTypes,
    /// Whether the step fits each device's HBM (and its host's memory
    /// what it offloads).
    pub fits_in_hbm: bool,
    /// What the step keeps in the host's memory, and moving it.
    pub host_offload: HostOffload,
    /// What does not fit, and by how much.
    pub not_fitting: Option<String>,
    /// The strategy's step (collectives, memory) behind it.
    #[serde(skip)]
    pub strategy_step: StrategyStep,
}

/// The optimizer's update in a model's step, on one device.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct OptimizerStep {
    /// The optimizer (`adam`).
    pub name: &'static str,
    /// State slots per parameter.
    pub slots: usize,
    /// Parameters the device updates per step (its shard).
    pub elements: u64,
    /// FLOPs of the update (its program's ops per element).
    pub flops: f64,
    /// HBM bytes the update reads and writes.
    pub bytes: f64,
    /// Seconds: the bytes at HBM bandwidth.
    pub seconds: f64,
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
/// the backward pass: the matmuls whose results the backward reads and the
/// policy does not save (`jax.checkpoint` rematerializes residuals only; a
/// result nothing in the backward reads is not recomputed). The backward
/// reads the query, key and value projections, the attention (a flash
/// kernel's output, for the output projection's weight gradient), the MLP's
/// input matmuls and, in a sequential block, the output projection (the
/// post-attention norm's input is the residual plus it); never `mlpwo`, and
/// not a parallel block's output projection, which only the residual
/// reads. So `full` recomputes those, `minimal` the attention (it saves the
/// weight matmuls only), `minimal_flash` and `none` nothing
/// ([`crate::model::memory`] has the saved set).
pub fn recomputed_fraction(config: &ModelConfig, policy: RematPolicy) -> f64 {
    let all = hardware_matmul_flops(config).total();
    if all <= 0.0 {
        return 0.0;
    }
    let (weights, attention) = recomputed_flops(config, policy);
    (weights + attention) / all
}

/// The forward FLOPs `policy` recomputes in the backward pass, as the
/// weights' matmuls and the attention's ([`recomputed_fraction`]).
pub fn recomputed_flops(config: &ModelConfig, policy: RematPolicy) -> (f64, f64) {
    let g = hardware_matmul_flops(config);
    let out = if config.decoder_block.is_parallel() {
        0.0
    } else {
        g.out
    };
    if let Some(placed) = crate::model::memory::custom_placements(config, policy) {
        // The matmuls whose residuals are rematerialized: the projections
        // by their widths, the attention with its output, the MLP's input.
        let [_, q, k, v, context, out_proj, mlpwi] = placed.map(|(p, _)| p == Placement::Remat);
        let (h, kv) = (config.heads as f64, config.kv_heads as f64);
        let qkv_share = |on: bool, heads: f64| if on { heads / (h + 2.0 * kv) } else { 0.0 };
        let weights = g.qkv * (qkv_share(q, h) + qkv_share(k, kv) + qkv_share(v, kv))
            + if out_proj { out } else { 0.0 }
            + if mlpwi { g.mlp_in } else { 0.0 };
        return (weights, if context { g.attention } else { 0.0 });
    }
    match policy {
        RematPolicy::Custom { .. } => unreachable!("placed above"),
        RematPolicy::Full => (g.qkv + out + g.mlp_in, g.attention),
        RematPolicy::None | RematPolicy::MinimalFlash => (0.0, 0.0),
        RematPolicy::Minimal | RematPolicy::MinimalOffloaded => (0.0, g.attention),
        RematPolicy::SaveQkvProj | RematPolicy::QkvProjOffloaded => (out + g.mlp_in, g.attention),
        RematPolicy::SaveOutProj => (g.qkv + g.mlp_in, g.attention),
        RematPolicy::SaveDotExceptMlp | RematPolicy::SaveDotExceptMlpwi => (g.mlp_in, g.attention),
    }
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

/// The step of `config` on `topology` under `options` (module docs); on
/// a generation without a fitted constant, with the range the fitted
/// ones give ([`ModelStep::step_seconds_range`]).
pub fn model_step(
    config: &ModelConfig,
    topology: &Topology,
    options: &ModelStepOptions,
) -> Result<ModelStep, StepModelError> {
    let mut step = model_step_at(config, topology, options)?;
    if !step.calibrated && options.efficiency.is_none() {
        let (least, most) = calibration::fitted_range();
        let at = |e: f64| {
            let o = ModelStepOptions {
                efficiency: Some(e),
                record_spans: false,
                ..options.clone()
            };
            model_step_at(config, topology, &o).map(|s| s.step_seconds)
        };
        step.step_seconds_range = Some((at(least)?, at(most)?));
    }
    Ok(step)
}

/// The step at the efficiency `options` give or the generation's.
fn model_step_at(
    config: &ModelConfig,
    topology: &Topology,
    options: &ModelStepOptions,
) -> Result<ModelStep, StepModelError> {
    let (efficiency, calibrated) = checked(config, topology, options)?;
    let spec = topology.generation.spec();
    let recompute = recomputed_fraction(config, config.remat);
    let tp = tensor::tensor_parallel(config, topology, &options.mesh, recompute)?;
    let t = tp.map_or(1, |tp| tp.size);
    let mut layer = layer_compute(config, spec, efficiency, t);
    if let Some(tp) = &tp {
        layer.forward.tensor_seconds = tp.forward_seconds;
        layer.backward.tensor_seconds = tp.backward_seconds;
    }
    // The offloaded activations cross the host link in both passes; the
    // state and parameters held there are placed once the strategy's
    // memory is known (their bytes do not depend on the passes).
    let activations_offloaded = offload::host_offload(config, spec, &Default::default());
    layer.forward.host_seconds = activations_offloaded.layer_seconds;
    layer.backward.host_seconds = activations_offloaded.layer_seconds;
    let layers = parameter_count(config).layers as f64;
    let step = strategy_step(config, topology, options, &layer, t)?;
    let host = offload::host_offload(config, spec, &step.memory);
    let tensor_exposed =
        (layer.forward.exposed_tensor_seconds() + layer.backward.exposed_tensor_seconds()) * layers;
    let host_exposed =
        (layer.forward.exposed_host_seconds() + layer.backward.exposed_host_seconds()) * layers;
    let compute = step.use_seconds + step.update_seconds - tensor_exposed - host_exposed;
    let step_seconds = step.step_seconds + host.update_seconds;
    let mut phases = step.phases.clone();
    if host.layer_seconds > 0.0 || host.update_seconds > 0.0 {
        phases.insert(
            "host_offload".into(),
            2.0 * host.layer_seconds * layers + host.update_seconds,
        );
        phases.insert(
            "exposed_host_offload".into(),
            host_exposed + host.update_seconds,
        );
        if let Some(e) = phases.get_mut("exposed_communication") {
            *e = (step_seconds - compute - host_exposed - host.update_seconds).max(0.0);
        }
    }
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
    let model_flops = training_flops_per_device(config, options.formula).total();
    let hardware_flops = (layer.forward.flops + layer.backward.flops) * layers + layer.logits.flops;
    let per_chip = |flops: f64| flops / step_seconds / 1e12;
    let hbm = hbm::model_hbm(config, &step, spec.hbm_bytes);
    let not_fitting = match (hbm::not_fitting(config, &hbm), host.not_fitting()) {
        (Some(device), Some(host)) => Some(format!("{device}; and {host}")),
        (device, host) => device.or(host),
    };
    let optimizer = optimizer_step(
        &options.optimizer,
        &step,
        precision(config, options.optimizer.slots),
        spec.hbm_bytes_per_s,
    );
    let t = config.tokens_per_device();
    Ok(ModelStep {
        model: config.name.clone(),
        strategy: options.strategy,
        mesh: options.mesh.to_string(),
        data_reduction: options.data_reduction,
        chips: topology.num_devices() as usize,
        tokens_per_device: t,
        efficiency,
        remat: config.remat,
        calibrated,
        step_seconds_range: None,
        step_seconds,
        tokens_per_s_per_chip: t / step_seconds,
        tflops_per_chip: per_chip(model_flops),
        mfu: per_chip(model_flops) * 1e12 / spec.peak_bf16_flops,
        flop_formula: options.formula,
        model_flops_per_device: model_flops,
        hardware_flops_per_device: hardware_flops,
        hardware_tflops_per_chip: per_chip(hardware_flops),
        hardware_utilization: ((layer.forward.peak_seconds + layer.backward.peak_seconds) * layers
            + layer.logits.peak_seconds)
            / step_seconds,
        optimizer,
        compute_seconds: compute,
        exposed_communication: (step_seconds - compute).max(0.0),
        phases,
        layer,
        fits_in_hbm: not_fitting.is_none(),
        host_offload: host,
        not_fitting,
        hbm,
        hbm_types: HbmTypes::of(config),
        strategy_step: step,
    })
}

/// The strategy's step for `config`'s parameters (each device's `1/t` of
/// them under a tensor axis, one layer a bucket) with the layers' compute
/// spread over the buckets.
fn strategy_step(
    config: &ModelConfig,
    topology: &Topology,
    options: &ModelStepOptions,
    layer: &LayerCompute,
    t: usize,
) -> Result<StrategyStep, StepModelError> {
    let counts = parameter_count(config);
    let layers = counts.layers as f64;
    let per_layer = counts.per_layer().div_ceil(t as u64);
    let rest =
        (counts.embedding + counts.logits + counts.position + counts.final_norm).div_ceil(t as u64);
    let elements = per_layer
        .checked_mul(counts.layers)
        .and_then(|e| e.checked_add(rest))
        .unwrap_or(u64::MAX);
    let elements = usize::try_from(elements).unwrap_or(usize::MAX);
    let bucket_bytes = (per_layer as usize)
        .saturating_mul(DType::F32.byte_size())
        .max(1);
    let runs = BucketRuns::new(
        elements,
        DType::F32,
        bucket_bytes,
        topology.num_devices() as usize,
    )?;
    let buckets = runs.buckets() as f64;
    let strategy_options = StrategyOptions {
        strategy: options.strategy,
        mesh: options.mesh.clone(),
        prefetch: options.prefetch,
        recovery: options.recovery,
        // The layers' compute spread over the buckets (one layer each, the
        // embedding's a share of it).
        use_seconds: layer.forward.elapsed() * layers / buckets,
        backward_use_seconds: Some(layer.backward.elapsed() * layers / buckets),
        between_seconds: layer.logits.seconds,
        record_spans: options.record_spans,
        data_reduction: options.data_reduction,
        order: StepOrder::Training,
        // The weights are cast before their gathers and the weight
        // gradients are the matmuls' outputs: both in the compute type.
        precision: Some(precision(config, options.optimizer.slots)),
    };
    Ok(modeled_strategy_step(
        topology,
        &[("model".to_string(), vec![elements])],
        DType::F32,
        options.optimizer.slots,
        bucket_bytes,
        &strategy_options,
    )?)
}

/// `config`'s mixed precision with `slots` optimizer-state slots: the
/// compute type `dtype`, the parameters in `weight_dtype`, the gradients in
/// `grad_dtype`, the first moment in `mu_dtype` and the other slots in the
/// parameters' type (optax's `adam(mu_dtype=…)`).
pub fn precision(config: &ModelConfig, slots: usize) -> Precision {
    let bytes = |t: ModelDType| t.byte_size() as usize;
    let params = bytes(config.weight_dtype);
    Precision {
        compute: bytes(config.activation_dtype),
        params,
        grads: bytes(config.grad_type()),
        state: match slots {
            0 => 0,
            n => bytes(config.mu_type()) + (n - 1) * params,
        },
    }
}

/// The optimizer's update on a device in `step`: it reads the parameter,
/// the gradient and the state and writes the parameter and the state,
/// each in its own type.
fn optimizer_step(
    cost: &UpdateCost,
    step: &StrategyStep,
    precision: Precision,
    hbm_per_s: f64,
) -> OptimizerStep {
    let elements = step.update_elements;
    let p = precision;
    let bytes = elements as f64 * (2 * p.params + p.grads + 2 * p.state) as f64;
    OptimizerStep {
        name: cost.name,
        slots: cost.slots,
        elements,
        flops: elements as f64 * cost.flops_per_element as f64,
        bytes,
        seconds: bytes / hbm_per_s,
    }
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
    if let Some(q) = config.quantization {
        let spec = topology.generation.spec();
        if matmul_peaks(config, spec).0 <= 0.0 {
            return Err(StepModelError::Field {
                field: "quantization",
                value: q.name().into(),
                problem: format!(
                    "{} has no native {} matmul (its published {} peak is none, or the bf16 \
                     rate): quantize to a type the chip runs faster, or not at all",
                    topology.generation.name(),
                    q.name(),
                    q.name()
                ),
            });
        }
    }
    let efficiency = efficiency_for(topology.generation, options.efficiency)?;
    config.global_batch(u64::from(topology.num_devices()))?;
    Ok(efficiency)
}

/// One layer's passes and the logits' at the roofline of `spec` with the
/// MXU at `efficiency` of its peaks, each device holding `1/tensor` of the
/// weights and the backward recomputing what the remat policy does not
/// save. The weights' matmuls run at the quantized type's peak when the
/// model quantizes them ([`matmul_peaks`]); the attention and the logits
/// at the bf16 peak.
fn layer_compute(
    config: &ModelConfig,
    spec: &crate::hardware::HardwareSpec,
    efficiency: f64,
    tensor: usize,
) -> LayerCompute {
    let (weight_peak, bf16_peak) = matmul_peaks(config, spec);
    let pass = |(weights, attention): (f64, f64), bytes: f64, quantize: f64, backward: bool| {
        // The backward's gradient matmuls gain nothing from quantizing
        // (module docs, "Quantization").
        let weight_peak = if backward { bf16_peak } else { weight_peak };
        let peak_seconds = weights / weight_peak + attention / bf16_peak;
        let quantize_seconds = quantize / spec.hbm_bytes_per_s;
        PassCompute {
            flops: weights + attention,
            bytes,
            seconds: (peak_seconds / efficiency).max(bytes / spec.hbm_bytes_per_s)
                + quantize_seconds,
            tensor_seconds: 0.0,
            host_seconds: 0.0,
            peak_seconds,
            quantize_seconds,
        }
    };
    let g = hardware_matmul_flops(config);
    let forward = (g.total() - g.attention, g.attention);
    let recomputed = recomputed_flops(config, config.remat);
    let recompute = (recomputed.0 + recomputed.1) / g.total().max(f64::MIN_POSITIVE);
    let fwd_bytes = forward_bytes(config, tensor);
    let t = config.tokens_per_device();
    let logits_matrix = config.vocab as f64 * config.embed as f64;
    let act = config.activation_dtype.byte_size() as f64;
    let quantize_forward = quantize_bytes(config, tensor);
    let weight_recompute = recomputed.0 / forward.0.max(f64::MIN_POSITIVE);
    // The recomputed forward matmuls run quantized, at the quantized peak.
    let recomputed_quantized = (recomputed.0, 0.0);
    let gradients = (2.0 * forward.0, 2.0 * forward.1 + recomputed.1);
    let backward_quantized = pass(
        recomputed_quantized,
        0.0,
        weight_recompute * quantize_forward,
        false,
    );
    let mut backward = pass(gradients, (2.0 + recompute) * fwd_bytes, 0.0, true);
    backward.flops += backward_quantized.flops;
    backward.peak_seconds += backward_quantized.peak_seconds;
    backward.seconds += backward_quantized.seconds;
    backward.quantize_seconds += backward_quantized.quantize_seconds;
    LayerCompute {
        forward: pass(forward, fwd_bytes, quantize_forward, false),
        backward,
        // Forward 2·T·E·V, backward twice that; the logits written and
        // read back by the loss, the matrix read.
        logits: pass(
            (0.0, 6.0 * t * logits_matrix),
            3.0 * (logits_matrix * act + t * config.vocab as f64 * act),
            0.0,
            false,
        ),
    }
}

/// HBM bytes a quantized layer's forward spends quantizing its matmuls'
/// operands, the weights and the inputs, each in a pass of its own (AQT's
/// dynamic scaling): read for its scale, read again to quantize, written
/// in 8 bits — 5 bytes per element of a 2-byte operand. 0 without
/// quantization.
fn quantize_bytes(config: &ModelConfig, tensor: usize) -> f64 {
    if config.quantization.is_none() {
        return 0.0;
    }
    let per_element = 2.0 * config.activation_dtype.byte_size() as f64 + 1.0;
    let t = config.tokens_per_device();
    let (e, h, d, m) = (
        config.embed as f64,
        config.heads as f64,
        config.head_dim as f64,
        config.mlp_dim as f64,
    );
    let n = config.mlp_activations.len() as f64;
    let tensor = tensor.max(1) as f64;
    // Per token: each matmul's input width (q, k, v, out, the MLP's
    // inputs and its output), each device 1/t of it.
    let inputs = (3.0 * e + h * d + n * e + m) / tensor;
    let weights = parameter_count(config).per_layer() as f64 / tensor;
    per_element * (weights + t * inputs)
}

/// The peaks the weights' matmuls and the rest run at on `spec`: the
/// quantized type's (`int8`, `fp8`) for the weights when the model
/// quantizes them, else both the bf16 peak (checked to exist first,
/// [`checked`]).
fn matmul_peaks(config: &ModelConfig, spec: &crate::hardware::HardwareSpec) -> (f64, f64) {
    let weights = match config.quantization {
        None => spec.peak_bf16_flops,
        Some(Quantization::Int8) => spec.peak_int8_ops,
        Some(Quantization::Fp8) => spec.peak_fp8_flops,
    };
    (weights, spec.peak_bf16_flops)
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
