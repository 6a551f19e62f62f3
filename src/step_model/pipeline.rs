//! Pipeline parallelism in a model's step: the mesh's `stage` axis splits
//! the decoder's layers into `P` stages (MaxText's `ici_/dcn_pipeline_parallelism`),
//! and the step's batch into `M` microbatches (`num_pipeline_microbatches`,
//! a multiple of `P`) that pass from stage to stage, `R` times round the
//! stages when the schedule is circular (`num_pipeline_repeats`; each stage
//! then holds `R` runs of `layers/(P·R)` layers).
//!
//! **A stage's step.** The batch is not sharded over `stage`
//! (`activation_batch` is `data`, `fsdp` and `expert`), so a stage's
//! devices run every sequence of the step through their `layers/P` layers:
//! `P` times the per-device batch over `1/P` of the layers, the same layer
//! FLOPs per device as without the axis. The step model times that stage
//! as a model of its own (its weights, state and saved activations: every
//! microbatch's, as GPipe keeps them for the backward), with the strategy's
//! collectives over the stage's devices. The embedding and the logits are
//! outside the pipeline (MaxText runs them on every stage, on the stage's
//! whole batch), and each layer's weights are gathered once a pass, not
//! once a microbatch (`pipeline_fsdp_ag_once`).
//!
//! **The bubble.** A pipelined pass lasts `R·M + P − 1` iterations of one
//! microbatch through one run of a stage's layers; `P − 1` of them are
//! idle on every stage, so the step gains `(P − 1)/(R·M)` of the stage's
//! layer compute, and the idle fraction of the pipelined part is
//! `(P − 1)/(R·M + P − 1)` (MaxText's and Narayanan et al.'s bubble).
//!
//! **The permutes.** After every iteration each stage sends its
//! microbatch's activations (`T·P/M` tokens of `embed`, the activations'
//! type) to the next (MaxText's `ppermute` of the loop state; the backward
//! sends the gradients back): `2·(R·M + P − 1)` collective permutes a step
//! on the stage axis's links, ICI or DCN
//! ([`crate::cost_model::axis_permute`]). The next iteration
//! needs the permuted state, so they are exposed.
//!
//! **Into and out of the pipeline.** The embedding and the logits run on
//! the batch sharded over `stage` as well (MaxText's
//! `activation_embed_and_logits_batch` is `stage`, `data`, `fsdp`), so
//! the embedded tokens are all-gathered over the stage axis into the
//! pipeline's layout (`P·T` tokens a stage's device) and its output
//! reduce-scattered back for the logits; the backward runs the two
//! transposes. The pipeline waits for its input and the logits for its
//! output: exposed.
//!
//! **HBM.** A stage's account ([`super::hbm`]) holds its layers, every
//! microbatch's saved activations and one layer's backward working set for
//! one microbatch at a time; beside it the loop holds
//! its inputs for every microbatch (`state_io`), the shifted microbatch,
//! and under a circular schedule the microbatches waiting for their next
//! round (`circ_storage`).

use serde::Serialize;

use super::{ModelStep, StepModelError};
use crate::cost_model::{AxisCollective, axis_collective, axis_permute};
use crate::model::ModelConfig;
use crate::sharding::strategy::CollectiveKind;
use crate::sharding::{Mesh, MeshAxisName};
use crate::topology::Topology;

/// How a pipelined step is scheduled (`--microbatches`, `--repeats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PipelineOptions {
    /// Microbatches a step (MaxText's `num_pipeline_microbatches`); `None`
    /// is one per stage, MaxText's default.
    pub microbatches: Option<usize>,
    /// Rounds of the stages (MaxText's `num_pipeline_repeats`); `None` is 1.
    pub repeats: Option<usize>,
}

/// A pipelined step's schedule and what it adds to its stage's step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PipelineStep {
    /// Stages (`stage`).
    pub stages: usize,
    /// Microbatches a step.
    pub microbatches: usize,
    /// Rounds of the stages.
    pub repeats: usize,
    /// Decoder layers each stage holds.
    pub layers_per_stage: u64,
    /// Iterations a pass lasts: `R·M + P − 1`.
    pub iterations: usize,
    /// `(P − 1)/(R·M + P − 1)`: the idle fraction of the pipelined part.
    pub bubble_fraction: f64,
    /// One iteration: a microbatch through one run of a stage's layers,
    /// forward and backward, seconds.
    pub iteration_seconds: f64,
    /// Of it, the forward's.
    pub forward_iteration_seconds: f64,
    /// The `P − 1` idle iterations, seconds.
    pub bubble_seconds: f64,
    /// One permute of a microbatch's activations to the next stage.
    pub permute: AxisCollective,
    /// Every permute of the step (forward and backward), seconds.
    pub permute_seconds: f64,
    /// One all-gather of the embedded tokens into the pipeline's layout
    /// (or reduce-scatter of its output), over the stage axis.
    pub reshard: AxisCollective,
    /// The two reshards in and out and their backward transposes, seconds.
    pub reshard_seconds: f64,
    /// The loop's buffers, bytes per device.
    pub buffer_bytes: u64,
}

/// The pipeline `mesh` and `options` give `config` (none without a stage
/// axis). Errors name the field: a microbatch count that is not a multiple
/// of the stages or does not divide the batch, layers the stages and
/// repeats do not divide, more stages than layers, `--microbatches` or
/// `--repeats` without a stage axis.
pub fn pipeline_of(
    config: &ModelConfig,
    chips: u64,
    mesh: &Mesh,
    options: PipelineOptions,
) -> Result<Option<(usize, usize, usize)>, StepModelError> {
    let p = mesh.size(MeshAxisName::Stage);
    let field = |field: &'static str, value: String, problem: String| StepModelError::Field {
        field,
        value,
        problem,
    };
    if p <= 1 {
        if let Some(m) = options.microbatches {
            return Err(field(
                "microbatches",
                m.to_string(),
                "microbatches schedule a pipeline: the mesh has no stage axis (add stage=P)".into(),
            ));
        }
        if let Some(r) = options.repeats {
            return Err(field(
                "repeats",
                r.to_string(),
                "repeats schedule a pipeline: the mesh has no stage axis (add stage=P)".into(),
            ));
        }
        return Ok(None);
    }
    let m = options.microbatches.unwrap_or(p);
    let r = options.repeats.unwrap_or(1);
    if m == 0 || !m.is_multiple_of(p) {
        return Err(field(
            "microbatches",
            m.to_string(),
            format!("a pipeline of stage={p} takes a multiple of {p} microbatches"),
        ));
    }
    if r == 0 {
        return Err(field(
            "repeats",
            "0".into(),
            "a pipeline goes round its stages at least once".into(),
        ));
    }
    let layers = config.layers;
    if (p as u64) > layers {
        return Err(field(
            "layers",
            layers.to_string(),
            format!("stage={p} has more stages than {} has layers", config.name),
        ));
    }
    let runs = (p as u64).saturating_mul(r as u64);
    if !layers.is_multiple_of(runs) {
        return Err(field(
            "layers",
            layers.to_string(),
            format!(
                "stage={p} × repeats={r} splits the layers into {runs} runs: {layers} is not a \
                 multiple of {runs}"
            ),
        ));
    }
    let batch = config.global_batch(chips)?;
    if !batch.is_multiple_of(m as u64) {
        return Err(field(
            "microbatches",
            m.to_string(),
            format!("the step's {batch} sequences do not split into {m} microbatches"),
        ));
    }
    Ok(Some((p, m, r)))
}

/// `config` as one of `stages` stages runs it: its share of the layers,
/// and every sequence the stage's devices hold (`stages` times the
/// per-device batch).
pub fn stage_config(config: &ModelConfig, stages: usize) -> ModelConfig {
    ModelConfig {
        layers: config.layers / stages as u64,
        per_device_batch: config.per_device_batch * stages as f64,
        ..config.clone()
    }
}

/// `stage` (a stage's model, [`stage_config`]) for one microbatch of the
/// `(P, M, R)` schedule: what one layer's backward works on at a time,
/// `1/M` of the stage's batch.
pub fn microbatch_config(stage: &ModelConfig, (_, m, _): (usize, usize, usize)) -> ModelConfig {
    ModelConfig {
        per_device_batch: stage.per_device_batch / m as f64,
        ..stage.clone()
    }
}

/// The pipelined step of `config` from its stage's step `stage` (module
/// docs): the bubble and the permutes added, the rates over the whole
/// model's tokens and FLOPs.
pub fn pipelined(
    config: &ModelConfig,
    topology: &Topology,
    mesh: &Mesh,
    (p, m, r): (usize, usize, usize),
    mut step: ModelStep,
    model_flops: f64,
) -> Result<ModelStep, StepModelError> {
    let layers = (config.layers / p as u64) as f64;
    let forward = step.layer.forward.elapsed() * layers;
    let compute = forward + step.layer.backward.elapsed() * layers;
    let iteration = compute / (r * m) as f64;
    let iterations = r * m + p - 1;
    let bubble = (p - 1) as f64 * iteration;
    let elem = config.activation_dtype.byte_size() as usize;
    let microbatch = microbatch_elements(config, p, m);
    let permute = axis_permute(
        topology,
        mesh,
        MeshAxisName::Stage,
        microbatch as usize,
        elem,
    )?;
    let permutes = 2.0 * iterations as f64 * permute.seconds;
    let gathered = (config.tokens_per_device() * p as f64 * config.embed as f64).ceil() as usize;
    let on_stage =
        |kind| axis_collective(topology, mesh, MeshAxisName::Stage, kind, gathered, elem);
    let reshard = on_stage(CollectiveKind::AllGather)?;
    let reshards = 2.0 * (reshard.seconds + on_stage(CollectiveKind::ReduceScatter)?.seconds);
    let pipeline = PipelineStep {
        stages: p,
        microbatches: m,
        repeats: r,
        layers_per_stage: config.layers / p as u64,
        iterations,
        bubble_fraction: (p - 1) as f64 / iterations as f64,
        iteration_seconds: iteration,
        forward_iteration_seconds: forward / (r * m) as f64,
        bubble_seconds: bubble,
        permute,
        permute_seconds: permutes,
        reshard,
        reshard_seconds: reshards,
        // The stage's account holds the loop's buffers already.
        buffer_bytes: step.hbm.pipeline_buffers,
    };
    let stage_seconds = step.step_seconds;
    let seconds = stage_seconds + bubble + permutes + reshards;
    let tokens = config.tokens_per_device();
    let peak = topology.generation.spec().peak_bf16_flops;
    step.step_seconds = seconds;
    step.tokens_per_device = tokens;
    step.tokens_per_s_per_chip = tokens / seconds;
    step.model_flops_per_device = model_flops;
    step.tflops_per_chip = model_flops / seconds / 1e12;
    step.mfu = model_flops / seconds / peak;
    step.hardware_tflops_per_chip = step.hardware_flops_per_device / seconds / 1e12;
    step.hardware_utilization *= stage_seconds / seconds;
    step.exposed_communication = (seconds - step.compute_seconds - bubble).max(0.0);
    step.phases.insert("pipeline_bubble".into(), bubble);
    step.phases
        .insert("collective_permute.stage".into(), permutes);
    step.phases
        .insert("pipeline_reshard.stage".into(), reshards);
    if let Some(e) = step.phases.get_mut("exposed_communication") {
        *e += permutes + reshards;
    }
    step.step_seconds_range = None;
    step.pipeline = Some(pipeline);
    Ok(step)
}

/// One slot of a pipelined pass: a stage running a microbatch through one
/// run of its layers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PipelineSlot {
    /// The stage.
    pub stage: usize,
    /// The microbatch.
    pub microbatch: usize,
    /// The round of the stages it is on.
    pub repeat: usize,
    /// In the backward pass.
    pub backward: bool,
    /// From the pass's start, seconds.
    pub start_seconds: f64,
    /// Its end, seconds.
    pub end_seconds: f64,
}

impl PipelineStep {
    /// Every slot of the step's two passes, in iteration order (what the
    /// trace draws per stage): in forward iteration `t` stage `s` runs
    /// index `i = t − s` (microbatch `i mod M`, round `i div M`) when
    /// `0 ≤ i < R·M`, and is idle otherwise; the backward runs the stages
    /// in reverse. Each iteration is followed by its permute. Stage `s` is
    /// idle `P − 1` iterations a pass: the bubble.
    pub fn schedule(&self) -> Vec<PipelineSlot> {
        let (p, m, r) = (self.stages, self.microbatches, self.repeats);
        let forward = self.forward_iteration_seconds;
        let backward = self.iteration_seconds - forward;
        let permute = self.permute.seconds;
        let backward_start = self.iterations as f64 * (forward + permute);
        let mut slots = Vec::with_capacity(2 * p * r * m);
        for (pass_backward, length, start) in
            [(false, forward, 0.0), (true, backward, backward_start)]
        {
            for t in 0..self.iterations {
                for stage in 0..p {
                    let position = if pass_backward { p - 1 - stage } else { stage };
                    let Some(i) = t.checked_sub(position).filter(|&i| i < r * m) else {
                        continue;
                    };
                    let at = start + t as f64 * (length + permute);
                    slots.push(PipelineSlot {
                        stage,
                        microbatch: i % m,
                        repeat: i / m,
                        backward: pass_backward,
                        start_seconds: at,
                        end_seconds: at + length,
                    });
                }
            }
        }
        slots
    }
}

/// A microbatch's activations on a device of a stage: `T·P/M` tokens of
/// `embed`.
fn microbatch_elements(config: &ModelConfig, p: usize, m: usize) -> f64 {
    (config.tokens_per_device() * p as f64 / m as f64 * config.embed as f64).ceil()
}

/// The loop's buffers on a device (module docs): every microbatch's input,
/// the shifted one, and under `R > 1` the microbatches waiting for their
/// next round, in the activations' type.
pub fn buffer_bytes(config: &ModelConfig, (p, m, r): (usize, usize, usize)) -> u64 {
    let stage_tokens = config.tokens_per_device() * p as f64 * config.embed as f64;
    let waiting = if r > 1 { stage_tokens } else { 0.0 };
    let elem = config.activation_dtype.byte_size() as f64;
    ((stage_tokens + waiting + microbatch_elements(config, p, m)) * elem).ceil() as u64
}
