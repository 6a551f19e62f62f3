//! `--model NAME|FILE` for `train` and `goodput`: a transformer's whole
//! step on the pod (`optirs_tpu::step_model`).

use super::output;
use super::parse::usage;
use super::train::TrainArgs;
use anyhow::Result;
use optirs_tpu::model::{BUNDLED_NAMES, ModelConfig, bundled, parameter_count};
use optirs_tpu::sharding::MeshAxisName;
use optirs_tpu::sharding::strategy_model::DataReduction;
use optirs_tpu::step_model::{ModelStep, ModelStepOptions, model_step};
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
        return Ok(ModelConfig::from_ron_file(path)?);
    }
    Err(usage(format!(
        "--model {spec}: neither a bundled model ({}) nor a file",
        BUNDLED_NAMES.join(", ")
    )))
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

/// The model's step on `topology` under `train`'s strategy, mesh, prefetch
/// and recovery.
pub(super) fn step_of(
    config: &ModelConfig,
    topology: &Topology,
    args: &TrainArgs,
) -> Result<ModelStep> {
    let options = ModelStepOptions {
        strategy: args.strategy,
        mesh: args.mesh_on(topology)?,
        prefetch: args.prefetch.unwrap_or(1),
        recovery: args.recovery,
        record_spans: args.trace.is_some(),
        data_reduction: args
            .data_reduction
            .unwrap_or(ModelStepOptions::new(topology).data_reduction),
        ..ModelStepOptions::new(topology)
    };
    model_step(config, topology, &options)
        .map_err(|e| usage(format!("--model {}: {e}", config.name)))
}

/// `goodput --model`: its step seconds (fsdp on the pod's default mesh,
/// as MaxText runs) and its parameters.
pub(super) fn goodput_step(spec: &str, topology: &Topology) -> Result<(f64, u64)> {
    let config = load_model(spec)?;
    let step = model_step(&config, topology, &ModelStepOptions::new(topology))
        .map_err(|e| usage(format!("--model {spec}: {e}")))?;
    Ok((step.step_seconds, parameter_count(&config).total()))
}

/// `train --model --modeled-only`: the report of the model's step.
pub(super) fn modeled(args: &TrainArgs, config: &ModelConfig, topology: &Topology) -> Result<()> {
    let started = Instant::now();
    let step = step_of(config, topology, args)?;
    let wall_seconds = started.elapsed().as_secs_f64();
    if let Some(path) = &args.trace {
        output::write_new("--trace", path, &serde_json::to_string(&trace_of(&step))?)?;
    }
    let params = parameter_count(config).total();
    let report = json!({
        "pod": topology.name,
        "devices": step.chips,
        "model": step.model,
        "params": params,
        "strategy": step.strategy.name(),
        "mesh": step.mesh,
        "recovery": args.recovery.to_string(),
        "data_reduction": step.data_reduction.name(),
        "tokens_per_device": step.tokens_per_device,
        "step_seconds": step.step_seconds,
        "tokens_per_s_per_chip": step.tokens_per_s_per_chip,
        "tflops_per_chip": step.tflops_per_chip,
        "mfu": step.mfu,
        "mxu_efficiency": step.efficiency,
        "calibrated": step.calibrated,
        "model_flops_per_device": step.model_flops_per_device,
        "hardware_flops_per_device": step.hardware_flops_per_device,
        "compute_seconds": step.compute_seconds,
        "exposed_communication": step.exposed_communication,
        "phases": step.phases,
        "layer": step.layer,
        "hbm_by_kind": step.hbm,
        "hbm_bytes_per_device": step.hbm.total,
        "hbm_capacity_bytes": topology.hbm_bytes,
        "fits_in_hbm": step.fits_in_hbm,
        "not_fitting": step.not_fitting,
        "wall_seconds": wall_seconds,
    });
    if args.json {
        return output::print_json(&report);
    }
    print_text(&step, topology, params, wall_seconds)
}

/// The model step's report as text.
fn print_text(step: &ModelStep, topology: &Topology, params: u64, wall_seconds: f64) -> Result<()> {
    let fits = match &step.not_fitting {
        None => "fits in HBM".to_string(),
        Some(why) => format!("does not fit: {why}"),
    };
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "modeled {} ({} parameters) on {} ({}), {} on mesh {}: step {}, {:.0} tokens/s/chip, \
         {:.1} TFLOP/s/chip, MFU {:.1} % (MXU efficiency {}{}), modeled in {} wall",
        step.model,
        params,
        topology.name,
        output::plural(step.chips as u64, "chip", "chips"),
        step.strategy,
        step.mesh,
        output::seconds(step.step_seconds),
        step.tokens_per_s_per_chip,
        step.tflops_per_chip,
        step.mfu * 100.0,
        step.efficiency,
        if step.calibrated {
            ""
        } else {
            ", uncalibrated"
        },
        output::seconds(wall_seconds),
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
    writeln!(
        out,
        "  HBM per device {} of {}: {fits}",
        optirs_tpu::sharding::strategy::decimal_bytes(step.hbm.total),
        optirs_tpu::sharding::strategy::decimal_bytes(topology.hbm_bytes),
    )?;
    Ok(())
}

/// The step as a Chrome/Perfetto trace: one device (every device of the
/// symmetric pod does the same), its compute on track 0 (each layer's
/// forward and backward use, the logits between, the updates), its
/// communication on track 1 (each layer's gathers, its gradient's
/// reduce-scatter and all-reduce), each free an instant.
fn trace_of(step: &ModelStep) -> optirs_tpu::profile::trace::Trace {
    use optirs_tpu::profile::trace::{Event, Scope, Trace};
    use optirs_tpu::sharding::strategy_model::SpanKind;
    let mut trace = Trace::new();
    trace
        .process(
            0,
            format!("{} on {} chips (each alike)", step.model, step.chips),
        )
        .thread(0, 0, "compute")
        .thread(0, 1, "communication");
    let layers = step.strategy_step.buckets.saturating_sub(1);
    let name = |bucket: u32| {
        if bucket as usize >= layers {
            "embedding".to_string()
        } else {
            format!("layer {bucket}")
        }
    };
    for s in &step.strategy_step.spans {
        let (what, tid) = match s.kind {
            SpanKind::Gather { backward } => (format!("gather ({})", pass(backward)), 1),
            SpanKind::Use { backward } => (pass(backward).to_string(), 0),
            SpanKind::Free { backward } => {
                trace.push(
                    Event::instant(
                        format!("free {} ({})", name(s.bucket), pass(backward)),
                        s.start_seconds * 1e6,
                        Scope::Thread,
                    )
                    .category("memory")
                    .on(0, 0),
                );
                continue;
            }
            SpanKind::ReduceScatter => ("gradient reduce-scatter".to_string(), 1),
            SpanKind::DataReduction => ("gradient all-reduce over data".to_string(), 1),
            SpanKind::Update => ("update".to_string(), 0),
            SpanKind::AllGather => ("all-gather".to_string(), 1),
            SpanKind::ReplicateState => ("state copy".to_string(), 1),
            SpanKind::Between => {
                trace.push(
                    Event::complete(
                        "logits and loss",
                        s.start_seconds * 1e6,
                        (s.end_seconds - s.start_seconds) * 1e6,
                    )
                    .category("compute")
                    .on(0, 0),
                );
                continue;
            }
        };
        let category = if tid == 0 { "compute" } else { "communication" };
        trace.push(
            Event::complete(
                format!("{what} {}", name(s.bucket)),
                s.start_seconds * 1e6,
                (s.end_seconds - s.start_seconds).max(0.0) * 1e6,
            )
            .category(category)
            .on(0, tid),
        );
    }
    trace
}

fn pass(backward: bool) -> &'static str {
    if backward { "backward" } else { "forward" }
}
