//! `--model NAME|FILE` for `train` and `goodput`: a transformer's whole
//! step on the pod (`optirs_tpu::step_model`) under the layout both take
//! (`--strategy`, `--mesh`, `--prefetch`, `--data-reduction`,
//! `--recovery`, `--optimizer`).

use super::output;
use super::parse::usage;
use super::train::TrainArgs;
use anyhow::Result;
use optirs_tpu::cost_model::DataReduction;
use optirs_tpu::model::{BUNDLED_NAMES, ModelConfig, bundled, parameter_count};
use optirs_tpu::optimizers::UpdateCost;
use optirs_tpu::sharding::{Mesh, MeshAxisName, RecoveryPolicy, Strategy};
use optirs_tpu::step_model::{
    KnownGap, ModelStep, ModelStepOptions, PipelineOptions, StepModelError, known_gap, model_step,
};
use optirs_tpu::topology::Topology;
use serde_json::json;
use std::io::Write;
use std::time::Instant;

/// The model `spec` names: a bundled one, or a RON file.
pub(super) fn load_model(spec: &str) -> Result<ModelConfig> {
    if BUNDLED_NAMES.contains(&spec) {
        return Ok(bundled(spec)?);
    }
    let path = std::path::Path::new(spec);
    if path.exists() {
        // A model file that does not parse or validate is the input to
        // change: a usage error naming its file, line and field.
        return ModelConfig::from_ron_file(path).map_err(|e| usage(e.to_string()));
    }
    Err(usage(format!(
        "--model {spec}: neither a bundled model nor a file{}; bundled: {}",
        optirs_tpu::error::did_you_mean(spec, BUNDLED_NAMES.iter().copied()),
        BUNDLED_NAMES.join(", ")
    )))
}

/// `--optimizer NAME`'s state slots and update, a usage error naming the
/// flag for an unknown name.
pub(super) fn update_cost(optimizer: &str) -> Result<UpdateCost> {
    let kind = optirs_tpu::optimizers::kind_by_name(optimizer)
        .map_err(|e| usage(format!("--optimizer {optimizer}: {e}")))?;
    Ok(UpdateCost::of(kind))
}

/// The model's parameters as tensors, one per layer and the embedding
/// (with the logits and positions): what a real run shards.
pub(super) fn tensor_sizes(config: &ModelConfig) -> Vec<usize> {
    optirs_tpu::step_model::layer_tensors(config)
        .0
        .iter()
        .map(|(_, shape)| shape.iter().product())
        .collect()
}

/// `--mesh SPEC` for a transformer's step on `topology` (slices may be
/// shared among axes), a usage error naming the flag.
pub(super) fn mesh_flag(spec: &str, topology: &Topology) -> Result<Mesh> {
    Mesh::parse_split(spec, topology).map_err(|e| usage(format!("--mesh {spec}: {e}")))
}

/// A transformer's layout and optimizer as `train` and `goodput` take them.
pub(super) struct ModelLayout<'a> {
    pub(super) strategy: Strategy,
    /// `--mesh`, or the pod's default mesh.
    pub(super) mesh: Option<&'a str>,
    pub(super) prefetch: Option<usize>,
    pub(super) data_reduction: Option<DataReduction>,
    pub(super) recovery: RecoveryPolicy,
    /// `--optimizer`.
    pub(super) optimizer: &'a str,
    /// Keep every layer's spans (`--trace`).
    pub(super) record_spans: bool,
    /// `--microbatches` and `--repeats`.
    pub(super) pipeline: PipelineOptions,
}

impl ModelLayout<'_> {
    /// The step model's options on `topology`: a mesh that does not lay
    /// out, or `--prefetch` without fsdp, is a usage error.
    fn options(&self, topology: &Topology) -> Result<ModelStepOptions> {
        if let (Some(n), false) = (self.prefetch, self.strategy == Strategy::Fsdp) {
            return Err(usage(format!(
                "--prefetch {n} sets how many gathered buckets fsdp keeps in flight; \
                 --strategy {} gathers no parameters before use: drop --prefetch or use \
                 --strategy fsdp",
                self.strategy
            )));
        }
        let mesh = match self.mesh {
            Some(spec) => mesh_flag(spec, topology)?,
            None => Mesh::default_for(topology),
        };

        let defaults = ModelStepOptions::new(topology);
        Ok(ModelStepOptions {
            strategy: self.strategy,
            mesh,
            prefetch: self.prefetch.unwrap_or(defaults.prefetch),
            recovery: self.recovery,
            record_spans: self.record_spans,
            data_reduction: self.data_reduction.unwrap_or(defaults.data_reduction),
            optimizer: update_cost(self.optimizer)?,
            pipeline: self.pipeline,
            ..defaults
        })
    }

    /// `config`'s step on `topology` under this layout. An error of a flag
    /// (`--microbatches`, `--repeats`, `--mesh`) names the flag; the rest
    /// the model.
    pub(super) fn step(&self, config: &ModelConfig, topology: &Topology) -> Result<ModelStep> {
        model_step(config, topology, &self.options(topology)?).map_err(|e| match e {
            StepModelError::Field {
                field: field @ ("microbatches" | "repeats" | "mesh"),
                value,
                problem,
            } => usage(format!(
                "--{field} {value}: {problem} (--model {})",
                config.name
            )),
            e => usage(format!("--model {}: {e}", config.name)),
        })
    }
}

/// The model's step on `topology` under `train`'s strategy, mesh, prefetch,
/// recovery and optimizer.
pub(super) fn step_of(
    config: &ModelConfig,
    topology: &Topology,
    args: &TrainArgs,
) -> Result<ModelStep> {
    layout_of(args).step(config, topology)
}

/// `train`'s layout flags.
fn layout_of(args: &TrainArgs) -> ModelLayout<'_> {
    ModelLayout {
        strategy: args.strategy(),
        mesh: args.mesh.as_deref(),
        prefetch: args.prefetch,
        data_reduction: args.data_reduction,
        recovery: args.recovery,
        optimizer: &args.optimizer,
        record_spans: args.trace.is_some(),
        pipeline: PipelineOptions {
            microbatches: args.microbatches,
            repeats: args.repeats,
        },
    }
}

/// `goodput --model`: the model's step under `layout` (or, when
/// `searched`, the fastest layout that fits among those it leaves open,
/// and what the search chose) and its parameters. A step that does not
/// fit is refused with `train`'s message (a run that cannot start has no
/// goodput) unless `allow_overflow`.
pub(super) fn goodput_step(
    spec: &str,
    topology: &Topology,
    (layout, searched): (&ModelLayout, bool),
    allow_overflow: bool,
) -> Result<GoodputModel> {
    let config = load_model(spec)?;
    let (step, auto) = if searched {
        let (step, auto) = super::plan::auto_step(layout, &config, topology)?;
        (step, Some(auto))
    } else {
        (layout.step(&config, topology)?, None)
    };
    if let (Some(why), false) = (&step.not_fitting, allow_overflow) {
        if let Some(a) = &auto {
            return Err(usage(format!(
                "--model {spec} on {}: no layout --strategy auto searched fits; the nearest, {}, \
                 does not: {why}; a run that cannot start has no goodput (`plan` shows what \
                 would fit; --allow-overflow models the nearest anyway)",
                topology.name, a.flags
            )));
        }
        return Err(usage(format!(
            "--model {spec} on {}: does not fit: {why}; a run that cannot start has no goodput \
             (choose a layout that fits, --strategy auto to search for one, or \
             --allow-overflow to model it anyway)",
            topology.name
        )));
    }
    Ok(GoodputModel {
        params: parameter_count(&config).total(),
        known_gap: known_gap(&config)?,
        step,
        auto,
    })
}

/// The model `goodput --model` takes its step from.
pub(super) struct GoodputModel {
    /// The step.
    pub step: ModelStep,
    /// The model's parameters.
    pub params: u64,
    /// What `--strategy auto` chose.
    pub auto: Option<super::plan::AutoChoice>,
    /// Whether the step lies where the published runs show the model
    /// misses ([`optirs_tpu::step_model::known_gap()`]).
    pub known_gap: Option<KnownGap>,
}

/// What `goodput --model` reports of the step it took: the layout, the
/// step, and whether (and by how much) it fits.
pub(super) fn goodput_layout_json(model: &GoodputModel, topology: &Topology) -> serde_json::Value {
    let step = &model.step;
    json!({
        "model": step.model,
        "strategy": step.strategy.name(),
        "mesh": step.mesh,
        "remat": step.remat.name(),
        "data_reduction": step.data_reduction.name(),
        "optimizer": step.optimizer.name,
        "step_seconds": step.step_seconds,
        "step_seconds_range": step.step_seconds_range,
        "calibrated": step.calibrated,
        "mfu": step.mfu,
        "hbm_bytes_per_device": step.hbm.total,
        "hbm_capacity_bytes": topology.hbm_bytes,
        "hbm_margin_bytes": step.hbm.margin,
        "fits_in_hbm": step.fits_in_hbm,
        "not_fitting": step.not_fitting,
        "known_gap": model.known_gap,
    })
}

/// `goodput --model`'s layout line: the strategy, the mesh and the HBM at
/// the step's peak against the chip's.
pub(super) fn goodput_layout_line(model: &GoodputModel, topology: &Topology) -> String {
    let step = &model.step;
    format!(
        "  model          {}, {} on mesh {}, MFU {:.1} %{}; HBM per device at the step's peak {} \
         of {} ({})\n{}",
        step.model,
        step.strategy,
        step.mesh,
        step.mfu * 100.0,
        match step.step_seconds_range {
            None => String::new(),
            Some((slow, fast)) => format!(
                " (uncalibrated: {} to {} a step at the fitted generations' constants)",
                output::seconds(fast),
                output::seconds(slow)
            ),
        },
        super::output::bytes(step.hbm.total),
        super::output::bytes(topology.hbm_bytes),
        hbm_left(step.hbm.margin),
        model
            .known_gap
            .as_ref()
            .map_or(String::new(), |g| format!("  {}\n", g.line())),
    )
}

/// `5.52 GB left`, `192.0 GB over`.
fn hbm_left(margin: i64) -> String {
    let bytes = super::output::bytes;
    if margin >= 0 {
        format!("{} left", bytes(margin as u64))
    } else {
        format!("{} over", bytes(margin.unsigned_abs()))
    }
}

/// `train --model --modeled-only`: the report of the model's step.
pub(super) fn modeled(args: &TrainArgs, config: &ModelConfig, topology: &Topology) -> Result<()> {
    let started = Instant::now();
    let (step, auto) = if args.searches_layout() {
        let (step, auto) = super::plan::auto_step(&layout_of(args), config, topology)?;
        (step, Some(auto))
    } else {
        (step_of(config, topology, args)?, None)
    };
    let wall_seconds = started.elapsed().as_secs_f64();
    if let Some(path) = &args.trace {
        output::write_new(
            "--trace",
            path,
            &serde_json::to_string(&super::model_trace::trace_of(&step))?,
        )?;
    }
    let params = parameter_count(config).total();
    let gap = known_gap(config)?;
    let report = json!({
        "pod": topology.name,
        "chips": step.chips,
        "model": step.model,
        "params": params,
        "strategy": step.strategy.name(),
        "mesh": step.mesh,
        "remat": step.remat.name(),
        "recovery": args.recovery.to_string(),
        "data_reduction": step.data_reduction.name(),
        "optimizer": step.optimizer,
        "tokens_per_device": step.tokens_per_device,
        "step_seconds": step.step_seconds,
        "tokens_per_s_per_chip": step.tokens_per_s_per_chip,
        "tflops_per_chip": step.tflops_per_chip,
        "mfu": step.mfu,
        "flop_formula": step.flop_formula,
        "hardware_tflops_per_chip": step.hardware_tflops_per_chip,
        "hardware_utilization": step.hardware_utilization,
        "mxu_efficiency": step.efficiency,
        "calibrated": step.calibrated,
        "step_seconds_range": step.step_seconds_range,
        "model_flops_per_device": step.model_flops_per_device,
        "hardware_flops_per_device": step.hardware_flops_per_device,
        "compute_seconds": step.compute_seconds,
        "exposed_communication": step.exposed_communication,
        "phases": step.phases,
        "layer": step.layer,
        "hbm_by_kind": step.hbm,
        "host_offload": step.host_offload,
        "hbm_types": step.hbm_types,
        "hbm_bytes_per_device": step.hbm.total,
        "hbm_capacity_bytes": topology.hbm_bytes,
        "hbm_margin_bytes": step.hbm.margin,
        "fits_in_hbm": step.fits_in_hbm,
        "not_fitting": step.not_fitting,
        "expert_parallel": step.expert_parallel,
        "pipeline": step.pipeline,
        "known_gap": gap,
        "wall_seconds": wall_seconds,
    });
    let mut report = report;
    if let Some(a) = &auto {
        report["layout_search"] = a.json();
        report["remat"] = config.remat.name().into();
        report["prefetch"] =
            json!((step.strategy == Strategy::Fsdp).then_some(step.strategy_step.prefetch));
    }
    if args.json {
        return output::print_json(&report);
    }
    if let Some(a) = &auto {
        println!("{}", a.line());
    }
    print_text(&step, topology, params, wall_seconds)?;
    if let Some(gap) = &gap {
        println!("  {}", gap.line());
    }
    Ok(())
}

/// The model step's report as text.
fn print_text(step: &ModelStep, topology: &Topology, params: u64, wall_seconds: f64) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "modeled {} ({} parameters) on {} ({}), {} on mesh {}: step {}, {} tokens/s/chip, \
         MFU {:.1} % ({:.1} TFLOP/s/chip by {}), hardware {:.1} % of the bf16 peak (MXU \
         efficiency {:.4}{}), modeled in {} wall",
        step.model,
        params,
        topology.name,
        output::plural(step.chips as u64, "chip", "chips"),
        step.strategy,
        step.mesh,
        output::seconds(step.step_seconds),
        output::tokens_per_s(step.tokens_per_s_per_chip),
        step.mfu * 100.0,
        step.tflops_per_chip,
        step.flop_formula.name(),
        step.hardware_utilization * 100.0,
        step.efficiency,
        match step.step_seconds_range {
            None => String::new(),
            Some((slow, fast)) => format!(
                ", uncalibrated: the fitted generations' constants give {} to {}",
                output::seconds(fast),
                output::seconds(slow)
            ),
        },
        output::seconds(wall_seconds),
    )?;
    let o = &step.optimizer;
    writeln!(
        out,
        "  {} update of {} parameters a device ({} state slots): {} ({} at HBM bandwidth, \
         {:.3} GFLOP)",
        o.name,
        o.elements,
        o.slots,
        output::seconds(o.seconds),
        super::output::bytes(o.bytes as u64),
        o.flops / 1e9,
    )?;
    writeln!(
        out,
        "  compute {} (forward {}, backward {}, logits {}), exposed communication {}",
        output::seconds(step.compute_seconds),
        output::seconds(step.phases.get("forward").copied().unwrap_or(0.0)),
        output::seconds(step.phases.get("backward").copied().unwrap_or(0.0)),
        output::seconds(step.phases.get("logits").copied().unwrap_or(0.0)),
        output::seconds(step.exposed_communication),
    )?;
    if let Some(gathers) = step.phases.get("all_gather.tensor") {
        let scatters = step
            .phases
            .get("reduce_scatter.tensor")
            .copied()
            .unwrap_or(0.0);
        writeln!(
            out,
            "  tensor-parallel gathers {} and reduce-scatters {} with the layers' matmuls, {} of \
             them exposed",
            output::seconds(*gathers),
            output::seconds(scatters),
            output::seconds(
                step.phases
                    .get("exposed_tensor_parallel")
                    .copied()
                    .unwrap_or(0.0)
            ),
        )?;
    }
    print_host_offload(&mut out, step)?;
    print_experts_and_stages(&mut out, step)?;
    if let Some(dcn) = step.strategy_step.axes.get("dcn") {
        let data = if step.strategy_step.mesh.size(MeshAxisName::Data) > 1 {
            match step.data_reduction {
                DataReduction::AfterBackward => "; the all-reduce over data after the backward",
                DataReduction::Overlapped => "; the all-reduce over data behind the backward",
            }
        } else {
            ""
        };
        writeln!(
            out,
            "  collectives across the slices (DCN) {}{data}",
            output::seconds(dcn.seconds),
        )?;
    }
    print_hbm(&mut out, step, topology)
}

/// The step's host offload line, when it offloads anything.
fn print_host_offload(out: &mut impl Write, step: &ModelStep) -> Result<()> {
    let host = &step.host_offload;
    if host.layer_seconds > 0.0 || host.update_seconds > 0.0 {
        let bytes = super::output::bytes;
        writeln!(
            out,
            "  host offload: {} a layer each way in {} ({} of it exposed), the update's state and \
             parameters {}; {} per host of its {}",
            bytes(host.layer_activation_bytes as u64),
            output::seconds(host.layer_seconds),
            output::seconds(
                step.phases
                    .get("exposed_host_offload")
                    .copied()
                    .unwrap_or(0.0)
            ),
            output::seconds(host.update_seconds),
            bytes(host.host_bytes),
            bytes(host.host_capacity),
        )?;
    }
    Ok(())
}

/// The expert axis's all-to-alls and the pipeline's schedule, when the
/// mesh has those axes.
fn print_experts_and_stages(out: &mut impl Write, step: &ModelStep) -> Result<()> {
    if let Some(ep) = &step.expert_parallel {
        writeln!(
            out,
            "  expert axis {}: {} a device; all-to-alls {} a step ({} a layer's dispatch), {} \
             of them exposed (the shared experts' matmuls cover the rest)",
            ep.size,
            output::plural(ep.experts_per_device, "expert", "experts"),
            output::seconds(step.phases.get("all_to_all.expert").copied().unwrap_or(0.0)),
            output::seconds(ep.all_to_all.seconds),
            output::seconds(
                step.phases
                    .get("exposed_all_to_all")
                    .copied()
                    .unwrap_or(0.0)
            ),
        )?;
    }
    if let Some(p) = &step.pipeline {
        writeln!(
            out,
            "  pipeline of {} stages ({} layers each), {} microbatches, {} round{}: bubble {} \
             ({:.1} % of the pipelined passes), stage-to-stage permutes {} ({} each), the \
             tokens in and out over the stage axis {} (both exposed)",
            p.stages,
            p.layers_per_stage,
            p.microbatches,
            p.repeats,
            if p.repeats == 1 { "" } else { "s" },
            output::seconds(p.bubble_seconds),
            p.bubble_fraction * 100.0,
            output::seconds(p.permute_seconds),
            output::seconds(p.permute.seconds),
            output::seconds(p.reshard_seconds),
        )?;
    }
    Ok(())
}

/// The step's HBM line: its peak per device against the chip's, by kind.
fn print_hbm(out: &mut impl Write, step: &ModelStep, topology: &Topology) -> Result<()> {
    let fits = match &step.not_fitting {
        None => "fits in HBM".to_string(),
        Some(why) => format!("does not fit: {why}"),
    };
    let h = &step.hbm;
    let bytes = super::output::bytes;
    let left = hbm_left(h.margin);
    writeln!(
        out,
        "  HBM per device at the step's peak {} of {} ({left}): weights, gradients and state {}, \
         fsdp buffers {}, activations {} (remat {}), logits or a layer's backward {}{}: {fits}",
        bytes(h.total),
        bytes(topology.hbm_bytes),
        bytes(h.params + h.grads + h.state + h.master + h.redundant),
        bytes(h.gathered + h.gradient_bucket),
        bytes(h.activations),
        step.remat.name(),
        bytes(h.logits.max(h.layer_working + h.all_to_all_buffers)),
        if h.pipeline_buffers > 0 {
            format!(", pipeline loop {}", bytes(h.pipeline_buffers))
        } else {
            String::new()
        },
    )?;
    Ok(())
}
