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
//! the backward's are twice the forward's weight matmuls and the
//! attention kernel's own backward (a flash kernel recomputes the scores:
//! 7/2 of the forward's attention in two kernels, 5/2 fused,
//! [`crate::model::AttentionKernel::backward_factor`]), plus what the
//! remat policy recomputes ([`recomputed_fraction`]: of the forward's
//! matmuls, those whose results the backward reads and the policy does
//! not save); the logits and the loss run between the passes, with a
//! one-hot embedding's matmuls (`use_iota_embed`) when the model looks
//! its tokens up that way. A pass lasts the larger of its FLOPs at the
//! generation's bf16 peak times the MXU efficiency ([`calibration`]) and
//! its weight and activation bytes at HBM bandwidth.
//!
//! **Communication.** The model's parameters are laid out one tensor per
//! layer (and the embedding and logits matrices), in buckets of one
//! layer, and the step is [`crate::cost_model::strategy`]'s with these
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
//! **Experts and stages.** An `expert` axis ([`expert_parallel`]) splits
//! a mixture's experts over its devices, shards every other weight over it
//! as over `fsdp`, and adds each MoE layer's all-to-alls on its links; a
//! `stage` axis ([`pipeline`]) models one stage's layers on its devices'
//! whole batch and adds the pipeline's bubble, its permutes from stage to
//! stage and the tokens' way into and out of it.
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
//! overlapping by the same rules (`cost_model::strategy`'s training
//! order): each bucket's gradient collectives behind the backward, its new
//! parameters in before the next forward uses them.
//!
//! **Quantization** (`quantization: int8 | fp8 | fp8_full`): the
//! forward's weight matmuls, and the backward's recomputation of them, run
//! at the type's peak, after a memory pass per operand to quantize it
//! (AQT's dynamic scaling, [`compute`]); the attention and the logits stay
//! bf16. Under `int8` and `fp8` the backward's gradient matmuls are
//! modeled at the bf16 peak: AQT quantizes them too, with stochastic
//! rounding on the gradients, and the published pair that isolates it
//! (GPT-3 175B on v6e-256, the same recipe bf16 and int8: 357.6 and 431.3
//! tokens/s/chip, 1.21×) gains what an int8 forward alone gives (1.2× at
//! twice the peak), not the 2× of every matmul. `fp8_full` (qwix) runs the
//! gradient matmuls at the fp8 peak too, each after quantizing its
//! operands (the output's gradient among them): Ironwood's published
//! `fp8_full` runs are predicted within 8 % (`docs/validation.md`). A chip
//! with no native peak for the type is refused.
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
//! HBM per device by kind at the step's peak ([`hbm`]). A step of a kind
//! the published runs show the model misses (a dropless mixture of more
//! experts than the validated ones) is flagged by [`known_gap()`] with those
//! runs' errors.

pub mod bound;
pub mod calibration;
pub mod compute;
pub mod expert_parallel;
pub mod hbm;
pub mod known_gap;
pub mod offload;
pub mod pipeline;
pub mod recipes;
pub mod stages_over_dcn;
pub mod tensor;
pub mod validation;

pub use bound::{default_efficiency, hbm_floor, passes_lower_bound};
pub use compute::{
    hardware_matmul_flops, hardware_matmul_flops_on, recomputed_flops, recomputed_fraction,
};
pub use expert_parallel::ExpertParallel;
pub use hbm::{HbmTypes, ModelHbm};
pub use known_gap::{GapRun, KnownGap, known_gap};
pub use offload::HostOffload;
pub use pipeline::{PipelineOptions, PipelineStep};

use std::collections::BTreeMap;

use serde::Serialize;
use thiserror::Error;

use crate::cost_model::{
    DataReduction, Precision, StepOrder, StrategyOptions, StrategyStep, modeled_strategy_step,
};
use crate::hardware::TpuGeneration;
use crate::ir::DType;
use crate::model::{
    FlopFormula, ModelConfig, ModelDType, ModelError, RematPolicy, parameter_count,
    training_flops_per_device,
};
use crate::optimizers::{UpdateCost, UpdateKind};
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
    /// A pipelined step's microbatches and repeats (with a `stage` axis).
    pub pipeline: PipelineOptions,
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
            pipeline: PipelineOptions::default(),
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
    /// Its expert-parallel all-to-alls, seconds (0 without an expert axis;
    /// on the layer's critical path but for what the shared experts'
    /// matmuls cover, [`expert_parallel`]).
    pub all_to_all_seconds: f64,
    /// Of `all_to_all_seconds`, what the shared experts' matmuls cover.
    pub all_to_all_hidden_seconds: f64,
}

impl PassCompute {
    /// How long the pass lasts: its compute, or its tensor-parallel
    /// collectives or host transfers if they take longer, and its exposed
    /// all-to-alls.
    pub fn elapsed(&self) -> f64 {
        self.seconds.max(self.tensor_seconds).max(self.host_seconds)
            + self.exposed_all_to_all_seconds()
    }

    /// The all-to-alls the shared experts' matmuls do not cover.
    pub fn exposed_all_to_all_seconds(&self) -> f64 {
        (self.all_to_all_seconds - self.all_to_all_hidden_seconds).max(0.0)
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
    /// The expert axis's all-to-alls per layer (with an `expert` axis).
    pub expert_parallel: Option<ExpertParallel>,
    /// The pipeline's schedule, bubble and permutes (with a `stage` axis).
    pub pipeline: Option<PipelineStep>,
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

/// The step at the efficiency `options` give or the generation's: one
/// stage's step, pipelined when the mesh has a `stage` axis ([`pipeline`]).
fn model_step_at(
    config: &ModelConfig,
    topology: &Topology,
    options: &ModelStepOptions,
) -> Result<ModelStep, StepModelError> {
    checked(config, topology, options)?;
    let chips = u64::from(topology.num_devices());
    let Some(schedule) = pipeline::pipeline_of(config, chips, &options.mesh, options.pipeline)?
    else {
        return stage_step((config, config, config), topology, options, 0);
    };
    let stage = pipeline::stage_config(config, schedule.0);
    let buffers = pipeline::buffer_bytes(config, schedule);
    let microbatch = pipeline::microbatch_config(&stage, schedule);
    let step = stage_step((&stage, config, &microbatch), topology, options, buffers)?;
    let model_flops = training_flops_per_device(config, options.formula).total();
    pipeline::pipelined(config, topology, &options.mesh, schedule, step, model_flops)
}

/// The step of `config` on every device of the mesh (one pipeline stage's
/// model, when pipelined: one layer's backward then works on `working`'s
/// batch, a microbatch), its embedding and logits run on `outside`'s
/// batch (the whole model's: MaxText shards them over `stage` too,
/// `activation_embed_and_logits_batch`), with `loop_buffers` bytes of a
/// pipeline's loop state beside it.
fn stage_step(
    (config, outside, working): (&ModelConfig, &ModelConfig, &ModelConfig),
    topology: &Topology,
    options: &ModelStepOptions,
    loop_buffers: u64,
) -> Result<ModelStep, StepModelError> {
    let (efficiency, calibrated) = checked(config, topology, options)?;
    let spec = topology.generation.spec();
    let recompute = recomputed_fraction(config, config.remat);
    let (layer, tp, ep) = passes(
        (config, outside),
        topology,
        options,
        (efficiency, recompute),
    )?;
    let t = tp.map_or(1, |tp| tp.size);
    let layers = parameter_count(config).layers as f64;
    let expert_share = ep.map_or(0.0, |ep| ep.expert_share);
    let step = strategy_step(config, topology, options, &layer, (t, expert_share))?;
    let host = offload::host_offload(config, spec, &step.memory);
    let (tensor_exposed, host_exposed) = exposed(&layer, layers);
    let all_to_all_exposed = (layer.forward.exposed_all_to_all_seconds()
        + layer.backward.exposed_all_to_all_seconds())
        * layers;
    let compute =
        step.use_seconds + step.update_seconds - tensor_exposed - host_exposed - all_to_all_exposed;
    let step_seconds = step.step_seconds + host.update_seconds;
    let mut phases = step_phases(
        &step,
        &layer,
        tp.as_ref(),
        &host,
        (layers, recompute, compute),
    );
    if ep.is_some() {
        let all = (layer.forward.all_to_all_seconds + layer.backward.all_to_all_seconds) * layers;
        phases.insert("all_to_all.expert".into(), all);
        phases.insert("exposed_all_to_all".into(), all_to_all_exposed);
    }
    let model_flops = training_flops_per_device(config, options.formula).total();
    let hardware_flops = (layer.forward.flops + layer.backward.flops) * layers + layer.logits.flops;
    let per_chip = |flops: f64| flops / step_seconds / 1e12;
    let hbm = hbm::model_hbm(
        (config, outside, working),
        &step,
        spec.hbm_bytes,
        hbm::Buffers {
            all_to_all: ep.map_or(0, |ep| ep.buffer_bytes),
            pipeline_loop: loop_buffers,
        },
    );
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
        expert_parallel: ep,
        pipeline: None,
        strategy_step: step,
    })
}

/// A layer's passes and the logits' (on `outside`'s batch) with what runs
/// beside their matmuls: the tensor axis's collectives, the expert axis's
/// all-to-alls and the host offload's transfers.
fn passes(
    (config, outside): (&ModelConfig, &ModelConfig),
    topology: &Topology,
    options: &ModelStepOptions,
    (efficiency, recompute): (f64, f64),
) -> Result<
    (
        LayerCompute,
        Option<tensor::TensorParallel>,
        Option<ExpertParallel>,
    ),
    StepModelError,
> {
    let spec = topology.generation.spec();
    let tp = tensor::tensor_parallel(config, topology, &options.mesh, recompute)?;
    let t = tp.map_or(1, |tp| tp.size);
    // A device's matmuls read its `1/t` of each weight and, on an expert
    // axis, its own experts only.
    let split = (t, options.mesh.size(crate::sharding::MeshAxisName::Expert));
    let mut layer = compute::layer_compute(config, spec, efficiency, split);
    if !std::ptr::eq(config, outside) {
        layer.logits = compute::layer_compute(outside, spec, efficiency, split).logits;
    }
    if let Some(tp) = &tp {
        layer.forward.tensor_seconds = tp.forward_seconds;
        layer.backward.tensor_seconds = tp.backward_seconds;
    }
    let ep = expert_parallel::expert_parallel(config, topology, &options.mesh, recompute, &layer)?;
    if let Some(ep) = &ep {
        layer.forward.all_to_all_seconds = ep.forward_seconds;
        layer.forward.all_to_all_hidden_seconds = ep.forward_hidden_seconds;
        layer.backward.all_to_all_seconds = ep.backward_seconds;
        layer.backward.all_to_all_hidden_seconds = ep.backward_hidden_seconds;
    }
    // The offloaded activations cross the host link in both passes; the
    // state and parameters held there are placed once the strategy's
    // memory is known (their bytes do not depend on the passes).
    let transfer = offload::layer_transfer_seconds(config, spec);
    layer.forward.host_seconds = transfer;
    layer.backward.host_seconds = transfer;
    Ok((layer, tp, ep))
}

/// The step's phases: the strategy's, the passes', the tensor axis's and
/// the host offload's, and what of the step no compute covers.
fn step_phases(
    step: &StrategyStep,
    layer: &LayerCompute,
    tp: Option<&tensor::TensorParallel>,
    host: &HostOffload,
    (layers, recompute, compute): (f64, f64, f64),
) -> BTreeMap<String, f64> {
    let mut phases = step.phases.clone();
    let step_seconds = step.step_seconds + host.update_seconds;
    let (tensor_exposed, host_exposed) = exposed(layer, layers);
    if host.layer_seconds > 0.0 || host.update_seconds > 0.0 {
        phases.insert(
            "host_offload".into(),
            2.0 * host.layer_seconds * layers + host.update_seconds,
        );
        phases.insert(
            "exposed_host_offload".into(),
            host_exposed + host.update_seconds,
        );
    }
    phases.insert("forward".into(), layer.forward.seconds * layers);
    phases.insert("backward".into(), layer.backward.seconds * layers);
    phases.insert("logits".into(), layer.logits.seconds);
    if let Some(tp) = tp {
        // Forward and backward: as many reduce-scatters as gathers.
        let count = tp.per_pass as f64 * (2.0 + recompute) * layers;
        phases.insert("all_gather.tensor".into(), tp.gather.seconds * count);
        phases.insert("reduce_scatter.tensor".into(), tp.scatter.seconds * count);
        phases.insert("exposed_tensor_parallel".into(), tensor_exposed);
    }
    // What neither compute nor the host transfers cover: the collectives.
    if (tp.is_some() || host_exposed + host.update_seconds > 0.0)
        && let Some(e) = phases.get_mut("exposed_communication")
    {
        *e = (step_seconds - compute - host_exposed - host.update_seconds).max(0.0);
    }
    phases
}

/// The tensor-parallel collectives and host transfers the layers' compute
/// does not cover, over every layer.
fn exposed(layer: &LayerCompute, layers: f64) -> (f64, f64) {
    (
        (layer.forward.exposed_tensor_seconds() + layer.backward.exposed_tensor_seconds()) * layers,
        (layer.forward.exposed_host_seconds() + layer.backward.exposed_host_seconds()) * layers,
    )
}

/// The strategy's step for `config`'s parameters (each device's `1/t` of
/// them under a tensor axis, one layer a bucket, `expert_share` of them
/// split over the expert axis) with the layers' compute spread over the
/// buckets.
fn strategy_step(
    config: &ModelConfig,
    topology: &Topology,
    options: &ModelStepOptions,
    layer: &LayerCompute,
    (t, expert_share): (usize, f64),
) -> Result<StrategyStep, StepModelError> {
    let layers = parameter_count(config).layers as f64;
    let (elements, bucket_bytes, runs) = bound::model_buckets(config, topology, t)?;
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
        expert_share,
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
    if config.activation_dtype == ModelDType::F16 {
        return Err(StepModelError::Field {
            field: "activation_dtype",
            value: "f16".into(),
            problem: format!(
                "{}'s MXU multiplies bf16 (and int8, fp8 where it has them), not IEEE half \
                 precision: the step's matmuls would not run at any published peak; use bf16",
                topology.generation.name()
            ),
        });
    }
    if let Some(q) = config.quantization {
        let spec = topology.generation.spec();
        if compute::matmul_peaks(config, spec).0 <= 0.0 {
            return Err(StepModelError::Field {
                field: "quantization",
                value: q.name().into(),
                problem: format!(
                    "{} has no native {} matmul (its published {} peak is none, or the bf16 \
                     rate): quantize to a type the chip runs faster, or not at all",
                    topology.generation.name(),
                    q.matmul_type(),
                    q.matmul_type()
                ),
            });
        }
    }
    let efficiency = efficiency_for(topology.generation, options.efficiency)?;
    config.global_batch(u64::from(topology.num_devices()))?;
    Ok(efficiency)
}

/// The model's parameters as tensors, one per layer and the embedding
/// (with the logits and positions), and one layer's bytes (the bucket):
/// what the step's collectives move, and what a real run shards.
pub fn layer_tensors(config: &ModelConfig) -> (Vec<(String, Vec<usize>)>, usize) {
    let counts = parameter_count(config);
    let mut tensors: Vec<(String, Vec<usize>)> = (0..counts.layers)
        .map(|i| (format!("layer{i}"), vec![counts.per_layer() as usize]))
        .collect();
    let rest = counts.outside_layers();
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
