//! `train`'s printing: the text and JSON of a run's report, the text of a
//! closed-form `--modeled-only` step, and the trace file.

use super::output;
use anyhow::Result;
use optirs_tpu::cost_model::StrategyStep;
use optirs_tpu::sharding::Strategy;
use optirs_tpu::topology::Topology;
use optirs_tpu::training::report::{
    TrainReport, phases_in_execution_order, recovery_parts, time_breakdown,
};
use optirs_tpu::training::trace::{TraceInput, trace_of};
use std::path::Path;

/// The text of a `--modeled-only` step: its figures, its phases, the DCN's
/// share, its HBM by kind and what does not fit.
pub(super) fn print_modeled_text(
    topology: &Topology,
    step: &StrategyStep,
    params: u128,
    optimizer: &str,
    (simulated_seconds, wall_seconds): (f64, f64),
    steps: u64,
) -> Result<()> {
    let prefetch = if step.strategy == Strategy::Fsdp {
        format!(", prefetch {}", step.prefetch)
    } else {
        String::new()
    };
    let mut text = format!(
        "modeled {params} parameters with {optimizer} on {} ({}, {}), {} on mesh {}{prefetch}, \
         {} recovery: step {}, {} for {} (modeled in {} wall)\n",
        topology.name,
        output::plural(step.devices as u64, "device", "devices"),
        output::plural(step.buckets as u64, "bucket", "buckets"),
        step.strategy,
        step.mesh,
        step.recovery,
        output::seconds(step.step_seconds),
        output::seconds(simulated_seconds),
        output::plural(steps, "step", "steps"),
        output::seconds(wall_seconds),
    );
    for (k, v) in phases_in_execution_order(&step.phases) {
        let bytes = step
            .phase_bytes
            .get(k)
            .map_or_else(String::new, |b| format!("  {}", output::bytes(*b)));
        text += &format!("  {k:<24} {}{bytes}\n", output::seconds(v));
    }
    let dcn: f64 = ["reduce_scatter.dcn", "all_gather.dcn"]
        .iter()
        .filter_map(|k| step.phases.get(*k))
        .sum();
    if dcn > 0.0 {
        text += &format!(
            "DCN phase (across slices) {} of the {} step\n",
            output::seconds(dcn),
            output::seconds(step.step_seconds)
        );
    }
    let kinds: Vec<String> = step
        .memory
        .kinds()
        .iter()
        .filter(|(_, b)| *b > 0)
        .map(|(k, b)| format!("{k} {}", output::bytes(*b)))
        .collect();
    text += &format!(
        "HBM per device {} of {} ({}): {}; links move {} per step\n",
        output::bytes(step.hbm_bytes_per_device),
        output::bytes(topology.hbm_bytes),
        if step.fits(topology.hbm_bytes).is_ok() {
            "fits"
        } else {
            "does not fit"
        },
        kinds.join(", "),
        output::bytes(step.link_bytes)
    );
    if let Err(over) = step.fits(topology.hbm_bytes) {
        let advice = match step.strategy {
            Strategy::Replicated => {
                "every replica holds all parameters and gradients (ZeRO-1 shards the \
                 optimizer state only): try --strategy zero2 or fsdp"
            }
            Strategy::Zero2 => "every replica holds all parameters: try --strategy fsdp",
            Strategy::Fsdp => {
                "even sharded over the fsdp axis: give fsdp more devices (--mesh), or \
                 smaller buckets or prefetch"
            }
        };
        text += &format!("does not fit: {over}; {advice}\n");
    }
    output::print_text(&text)
}

/// `device 5`, `devices 5 and 6`, `devices 1, 2 and 3`, `no device`.
fn devices_text(devices: &[u32]) -> String {
    let ids: Vec<String> = devices.iter().map(u32::to_string).collect();
    match ids.as_slice() {
        [] => "no device".into(),
        [one] => format!("device {one}"),
        [init @ .., last] => format!("devices {} and {last}", init.join(", ")),
    }
}

pub(super) fn print_report(r: &TrainReport, json: bool) -> Result<()> {
    if json {
        return output::print_json(r);
    }
    let whole = if r.segment.is_some() {
        " in the whole run"
    } else {
        ""
    };
    let mut text = format!(
        "trained {} ({} in {}, {}) with {} on {} ({}), {} on the mesh {}\n\
         {} completed ({} attempted){whole}; step {} modeled, {} wall per step; compile {}\n",
        "the model",
        output::plural(r.params as u64, "parameter", "parameters"),
        output::plural(r.tensors as u64, "tensor", "tensors"),
        output::plural(r.buckets as u64, "bucket", "buckets"),
        r.optimizer,
        r.pod,
        output::plural(u64::from(r.devices), "device", "devices"),
        r.strategy,
        r.mesh,
        output::plural(r.steps_completed, "step", "steps"),
        r.steps_attempted,
        output::seconds(r.step_modeled_seconds),
        output::seconds(r.wall_seconds_per_step),
        output::seconds(r.compile_seconds),
    );
    for (k, v) in phases_in_execution_order(&r.phases) {
        text += &format!("  {k:<24} {}\n", output::seconds(v));
    }
    let dcn: f64 = ["reduce_scatter.dcn", "all_gather.dcn"]
        .iter()
        .filter_map(|k| r.phases.get(*k))
        .sum();
    if dcn > 0.0 {
        text += &format!(
            "DCN phase (across slices) {} of the {} step\n",
            output::seconds(dcn),
            output::seconds(r.step_modeled_seconds)
        );
    }
    text += &format!(
        "HBM per device (max) {}; links moved {}\n",
        output::bytes(r.hbm_bytes_per_device),
        output::bytes(r.link_bytes)
    );
    for f in &r.failures {
        let seen = f.killed_at_seconds.map_or_else(String::new, |killed| {
            format!(
                " (killed at {}, seen {} later)",
                output::seconds(killed),
                output::seconds(f.at_seconds - killed)
            )
        });
        text += &format!(
            "  step {} failed at {} during {}: {}{seen}\n",
            f.step,
            output::seconds(f.at_seconds),
            f.phase.key(),
            f.cause
        );
    }
    for rec in &r.recoveries {
        let parts: Vec<String> = recovery_parts(rec)
            .iter()
            .map(|(name, seconds)| format!("{name} {}", output::seconds(*seconds)))
            .collect();
        text += &format!(
            "  recovered by {} from step {} in {} modeled ({}): lost {}, {} lost\n",
            rec.policy,
            rec.failed_step,
            output::seconds(rec.recovery_seconds),
            parts.join(" + "),
            devices_text(&rec.lost_devices),
            output::plural(rec.lost_steps, "step", "steps"),
        );
        for [failed, spare] in &rec.swapped_cubes {
            text += &format!("    cube {failed} swapped for spare cube {spare}\n");
        }
    }
    text += &time_breakdown(r);
    let ranks = if r.ranks > 1 {
        format!(" (merged from {} ranks)", r.ranks)
    } else {
        String::new()
    };
    text += &resumed_text(r);
    text += &format!(
        "goodput {:.1} % of {} simulated{whole} ({} at the end); {} wall\nworld sha256 {}{ranks}\n",
        r.goodput * 100.0,
        output::seconds(r.simulated_seconds),
        output::plural(r.devices_at_end as u64, "device", "devices"),
        output::seconds(r.wall_seconds),
        r.world_sha256
    );
    output::print_text(&text)
}

/// A resumed run's lines: the checkpoint it resumed from, the damaged
/// ones it skipped, and this segment's figures apart from the whole run's.
fn resumed_text(r: &TrainReport) -> String {
    let (Some(from), Some(seg)) = (&r.resumed_from, &r.segment) else {
        return String::new();
    };
    let mut text = format!(
        "resumed from {} ({} at {})\n",
        from.path,
        output::plural(from.steps_completed, "step", "steps"),
        output::seconds(from.at_seconds)
    );
    for skipped in &from.skipped {
        text += &format!(
            "  skipped {} (left as it is): {}\n",
            skipped.path, skipped.problem
        );
    }
    text += &format!(
        "this segment: {} completed ({} attempted); goodput {:.1} % of {} simulated\n",
        output::plural(seg.steps_completed, "step", "steps"),
        seg.steps_attempted,
        seg.goodput * 100.0,
        output::seconds(seg.simulated_seconds)
    );
    text
}

/// Writes the run's trace ([`trace_of`]) into a new file.
pub(super) fn write_trace(path: &Path, input: &TraceInput<'_>) -> Result<()> {
    output::write_new("--trace", path, &serde_json::to_string(&trace_of(input))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn phases_read_in_the_order_the_step_runs_them() {
        let phases: BTreeMap<String, f64> = [
            "all_gather.axis0",
            "all_gather.axis1",
            "all_gather.dcn",
            "exposed_communication",
            "reduce_scatter.axis0",
            "reduce_scatter.axis1",
            "reduce_scatter.dcn",
            "replicate_state",
            "update",
        ]
        .into_iter()
        .map(|k| (k.to_string(), 1.0))
        .collect();
        let order: Vec<&str> = phases_in_execution_order(&phases)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            order,
            [
                "reduce_scatter.axis0",
                "reduce_scatter.axis1",
                "reduce_scatter.dcn",
                "update",
                "all_gather.dcn",
                "all_gather.axis1",
                "all_gather.axis0",
                "replicate_state",
                "exposed_communication",
            ]
        );
        assert_eq!(devices_text(&[]), "no device");
        assert_eq!(devices_text(&[5]), "device 5");
        assert_eq!(devices_text(&[1, 2, 3]), "devices 1, 2 and 3");
    }
}
