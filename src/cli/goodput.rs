//! `optirs-tpu goodput`: a long training run's goodput through failures,
//! simulated as a seeded discrete-event timeline (`optirs_tpu::goodput`).
//!
//! Every value is checked by its parser (exit 2), then every combination
//! the library refuses (too many failures, no spare cube, a run shorter
//! than a step) is a usage error too: nothing has been simulated then.

use super::output::{self, plural};
use super::parse::{
    MAX_SECONDS, number, parse_count, parse_positive, parse_prefetch, parse_seconds, usage,
};
use super::progress;
use super::train::StrategyChoice;
use anyhow::Result;
use clap::Args;
use clap::builder::PossibleValuesParser;
use optirs_tpu::cost_model::DataReduction;
use optirs_tpu::goodput::{
    CheckpointInterval, Costs, DEFAULT_CUBE_REPAIR_HOURS, DEFAULT_RECONFIGURE_SECONDS,
    DEFAULT_RESTART_SECONDS, FailureUnit, Fleet, GoodputConfig, GoodputError, GoodputReport,
    MAX_DAYS, modeled_step_seconds, parse_recovery, simulate_with_progress,
};
use optirs_tpu::sharding::{RecoveryPolicy, Strategy};
use optirs_tpu::step_model::PipelineOptions;
use optirs_tpu::topology::{DEFAULT_PRESET, load_topology};
use std::time::Instant;

#[derive(Args, Debug)]
pub struct GoodputArgs {
    /// A preset name (see `optirs-tpu presets`) or a pod file path.
    #[arg(default_value = DEFAULT_PRESET)]
    pod: String,
    /// Parameters of the model (e.g. 405e9); with --model, the model's.
    #[arg(long, value_name = "N", value_parser = parse_count,
          required_unless_present = "model", conflicts_with = "model")]
    model_params: Option<usize>,
    /// A transformer (a bundled name such as maxtext-v5e-16b or
    /// gpt3-175b, or a RON model file): its whole step on the pod under
    /// --strategy, --mesh, --prefetch and --data-reduction (as train takes
    /// them) becomes the step, and its parameters the checkpoint's;
    /// --step-seconds still overrides the step. A model that does not fit
    /// the layout is refused (a run that cannot start has no goodput).
    #[arg(long, value_name = "NAME|FILE")]
    model: Option<String>,
    /// With --model: how the model is split over the mesh: replicated,
    /// zero2, fsdp, or auto (the fastest layout that fits, searched as
    /// `plan` searches, narrowed by --mesh, --prefetch, --data-reduction,
    /// --microbatches and --repeats) [default: fsdp, MaxText's].
    #[arg(long, value_name = "STRATEGY|auto")]
    strategy: Option<StrategyChoice>,
    /// With --model: the device mesh, `data=D,stage=P,fsdp=F,tensor=T,expert=E` (as train;
    /// default: fsdp over every chip of a slice, data over the slices).
    #[arg(long, value_name = "SPEC")]
    mesh: Option<String>,
    /// With --model and fsdp: gathered buckets ahead of the one in use
    /// (default 1).
    #[arg(long, value_name = "N", value_parser = parse_prefetch,
          allow_negative_numbers = true)]
    prefetch: Option<usize>,
    /// With --model: when the gradients' all-reduce over the data axis
    /// runs: after-backward (default) or overlapped.
    #[arg(long, value_name = "WHEN")]
    data_reduction: Option<DataReduction>,
    /// With --model and a stage axis in --mesh: microbatches a step (as
    /// train).
    #[arg(long, value_name = "M")]
    microbatches: Option<usize>,
    /// With --model and a stage axis in --mesh: rounds of the stages (as
    /// train).
    #[arg(long, value_name = "R")]
    repeats: Option<usize>,
    /// With --model: model a layout that does not fit each device's HBM
    /// anyway, rather than refuse it.
    #[arg(long)]
    allow_overflow: bool,
    /// Mean time between failures of one failure unit (one chip, or one
    /// host with --failure-unit host), hours. The pod fails every
    /// MTBF / units on average.
    #[arg(long, value_name = "H", allow_negative_numbers = true, value_parser = parse_mtbf_hours)]
    mtbf_hours: f64,
    /// Simulated time, days (at most 10000).
    #[arg(long, value_name = "D", allow_negative_numbers = true, value_parser = parse_days)]
    days: f64,
    /// What one failure takes down: chip or host.
    #[arg(long, default_value = "chip")]
    failure_unit: FailureUnit,
    /// Seconds of training between checkpoints, `auto` (chosen by
    /// simulation; never worse than `never`) or `never`.
    #[arg(
        long,
        value_name = "SECONDS|auto|never",
        default_value = "auto",
        allow_negative_numbers = true,
        value_parser = parse_interval
    )]
    checkpoint_every: CheckpointInterval,
    /// Asynchronous checkpoints (Orbax's async save): training waits only
    /// for the device-to-host copy; the write to storage overlaps the
    /// steps after it.
    #[arg(long)]
    async_checkpoint: bool,
    /// rollback (to the last checkpoint), redundant (state copies on each
    /// device's ring successor) or spare-cube (swap the failed cube for a
    /// spare, then roll back, with no job restart; a pod file with
    /// `cubes: (spares: N)`; a failure that finds no free spare is
    /// recovered by a rollback).
    #[arg(long, default_value = "rollback", value_parser = parse_recovery)]
    recovery: RecoveryPolicy,
    /// Seed of the failure times and of which unit fails.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The optimizer whose state is checkpointed (its slot count matters).
    #[arg(long, default_value = "adam", ignore_case = true,
          value_parser = PossibleValuesParser::new(optirs_tpu::optimizers::NAMES))]
    optimizer: String,
    /// One training step, seconds (default: --model's whole step, or
    /// without --model the pod's modeled sharded optimizer step, which has
    /// no forward or backward pass in it).
    #[arg(long, value_name = "S", allow_negative_numbers = true, value_parser = parse_seconds)]
    step_seconds: Option<f64>,
    /// Job restart after a failure is detected, seconds (0 or more).
    #[arg(long, value_name = "S", default_value_t = DEFAULT_RESTART_SECONDS,
          allow_negative_numbers = true, value_parser = parse_seconds_or_zero)]
    restart_seconds: f64,
    /// Swapping the failed unit for a spare, seconds (0 or more).
    #[arg(long, value_name = "S", default_value_t = DEFAULT_RECONFIGURE_SECONDS,
          allow_negative_numbers = true, value_parser = parse_seconds_or_zero)]
    reconfigure_seconds: f64,
    /// Under spare-cube (only), hours until a failed cube is a spare again
    /// [default: 24].
    #[arg(long, value_name = "H", allow_negative_numbers = true,
          value_parser = parse_repair_hours)]
    cube_repair_hours: Option<f64>,
    /// Aggregate checkpoint storage bandwidth, bytes per second (default
    /// 1 GB/s per host).
    #[arg(long, value_name = "B", allow_negative_numbers = true, value_parser = parse_bandwidth)]
    storage_bytes_per_s: Option<f64>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// `--mtbf-hours`: hours above 0.
pub(super) fn parse_mtbf_hours(text: &str) -> Result<f64, String> {
    parse_positive(text, f64::MAX).map_err(|_| {
        format!("`{text}` is not a mean time between failures: give hours above 0 (e.g. 50000)")
    })
}

/// `--days`: above 0 and at most [`MAX_DAYS`].
pub(super) fn parse_days(text: &str) -> Result<f64, String> {
    parse_positive(text, MAX_DAYS).map_err(|_| {
        format!(
            "`{text}` is not a run length: give days above 0 and at most {}",
            number(MAX_DAYS)
        )
    })
}

/// `--cube-repair-hours`: above 0 and within the longest run.
fn parse_repair_hours(text: &str) -> Result<f64, String> {
    parse_positive(text, MAX_DAYS * 24.0).map_err(|_| {
        format!(
            "`{text}` is not a repair time: give hours above 0 and at most {}",
            number(MAX_DAYS * 24.0)
        )
    })
}

/// `--storage-bytes-per-s`: a bandwidth above 0.
fn parse_bandwidth(text: &str) -> Result<f64, String> {
    parse_positive(text, f64::MAX).map_err(|_| {
        format!("`{text}` is not a bandwidth: give bytes per second above 0 (e.g. 2e12)")
    })
}

/// A duration that may be 0 (a restart that costs nothing): `0`, or what
/// [`parse_seconds`] takes.
fn parse_seconds_or_zero(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(0.0) => Ok(0.0), // -0 too: a float pattern compares with ==
        _ => parse_seconds(text).map_err(|_| {
            format!(
                "`{text}` is not a duration: give seconds from 0 up to {}",
                number(MAX_SECONDS)
            )
        }),
    }
}

/// `--checkpoint-every`: `auto`, `never`, or a duration ([`parse_seconds`]).
fn parse_interval(text: &str) -> Result<CheckpointInterval, String> {
    match text.trim() {
        "auto" => Ok(CheckpointInterval::Auto),
        "never" => Ok(CheckpointInterval::Never),
        other => parse_seconds(other)
            .map(CheckpointInterval::Every)
            .map_err(|_| {
                format!(
                    "`{text}` is not a positive number of seconds (at most {}), `auto` or `never`",
                    number(MAX_SECONDS)
                )
            }),
    }
}

/// Refuses an option the run would not use: accepting it silently would
/// let a user believe it changed the figures.
fn refuse_ignored(args: &GoodputArgs) -> Result<()> {
    let layout = [
        ("--strategy", args.strategy.is_some()),
        ("--mesh", args.mesh.is_some()),
        ("--prefetch", args.prefetch.is_some()),
        ("--data-reduction", args.data_reduction.is_some()),
        ("--microbatches", args.microbatches.is_some()),
        ("--repeats", args.repeats.is_some()),
        ("--allow-overflow", args.allow_overflow),
    ];
    if let (None, Some((flag, _))) = (&args.model, layout.iter().find(|f| f.1)) {
        return Err(usage(format!(
            "{flag} lays out a transformer's step and needs --model; --model-params models the \
             pod's sharded optimizer step on its default mesh"
        )));
    }
    if args.cube_repair_hours.is_some() && args.recovery != RecoveryPolicy::SpareCube {
        return Err(usage(format!(
            "--cube-repair-hours applies to --recovery spare-cube only, and this run is {}",
            args.recovery
        )));
    }
    if args.async_checkpoint && args.checkpoint_every == CheckpointInterval::Never {
        return Err(usage(
            "--async-checkpoint needs checkpoints, and --checkpoint-every is never",
        ));
    }
    Ok(())
}

/// The recovery policy whose per-step costs a modeled step carries:
/// spare-cube's is rollback's (its cube check belongs to the failure
/// model, which falls back to rollback without a spare).
fn per_step_recovery(recovery: RecoveryPolicy) -> RecoveryPolicy {
    match recovery {
        RecoveryPolicy::Redundant => RecoveryPolicy::Redundant,
        RecoveryPolicy::Rollback | RecoveryPolicy::SpareCube => RecoveryPolicy::Rollback,
    }
}

/// A refusal of the library's input checks: nothing was simulated, and
/// the input is what has to change, so it is a usage error (exit 2).
fn refused(error: GoodputError) -> anyhow::Error {
    usage(error.to_string())
}

/// `--model`'s step under the layout flags (searched with `--strategy
/// auto`), its parameters, and what the search chose.
fn model_step(
    args: &GoodputArgs,
    spec: &str,
    topology: &optirs_tpu::topology::Topology,
) -> Result<super::model_step::GoodputModel> {
    let layout = super::model_step::ModelLayout {
        strategy: match args.strategy {
            Some(StrategyChoice::Given(s)) => s,
            // The search's choice replaces it.
            Some(StrategyChoice::Auto) | None => Strategy::Fsdp,
        },
        mesh: args.mesh.as_deref(),
        prefetch: args.prefetch,
        data_reduction: args.data_reduction,
        recovery: per_step_recovery(args.recovery),
        optimizer: &args.optimizer,
        record_spans: false,
        pipeline: PipelineOptions {
            microbatches: args.microbatches,
            repeats: args.repeats,
        },
    };
    let searched = args.strategy == Some(StrategyChoice::Auto);
    super::model_step::goodput_step(spec, topology, (&layout, searched), args.allow_overflow)
}

pub fn goodput(args: GoodputArgs) -> Result<()> {
    let started = Instant::now();
    refuse_ignored(&args)?;
    let slots = optirs_tpu::optimizers::by_name(&args.optimizer, 1e-3f32)?
        .update_rule()
        .map_or(0, |r| r.slot_names().len());
    let topology = load_topology(&args.pod)?;
    let fleet = Fleet::from_topology(&topology)?;
    let model = match &args.model {
        Some(spec) => Some(model_step(&args, spec, &topology)?),
        None => None,
    };
    let auto = model.as_ref().and_then(|m| m.auto.as_ref());
    let params = match (&model, args.model_params) {
        (Some(m), _) => m.params,
        (None, Some(params)) => params as u64,
        (None, None) => return Err(usage("--model-params N or --model NAME is required")),
    };
    let mut config = GoodputConfig::new(
        params,
        args.mtbf_hours,
        args.days,
        args.step_seconds.unwrap_or(0.0),
    );
    config.optimizer_slots = slots;
    config.failure_unit = args.failure_unit;
    config.checkpoint = args.checkpoint_every;
    config.async_checkpoint = args.async_checkpoint;
    config.recovery = args.recovery;
    config.seed = args.seed;
    config.restart_seconds = args.restart_seconds;
    config.reconfigure_seconds = args.reconfigure_seconds;
    config.cube_repair_hours = args.cube_repair_hours.unwrap_or(DEFAULT_CUBE_REPAIR_HOURS);
    config.storage_bytes_per_s = args.storage_bytes_per_s;
    // Everything but the step is checked before the step is modeled.
    config.check(&fleet).map_err(refused)?;
    let step_source = match (args.step_seconds, &model) {
        (Some(_), _) => "--step-seconds",
        (None, Some(m)) => {
            config.step_seconds = m.step.step_seconds;
            "the model's whole step (step_model)"
        }
        (None, None) => {
            config.step_seconds =
                modeled_step_seconds(&topology, config.model_params, slots, config.recovery)
                    .map_err(refused)?;
            "modeled sharded optimizer step"
        }
    };
    Costs::derive(&fleet, &config).map_err(refused)?;
    // Only `auto` runs many simulations (a fixed interval is one run).
    let searches = u64::from(config.checkpoint == CheckpointInterval::Auto);
    let bar = progress::bar(
        searches,
        args.json,
        "goodput: choosing the checkpoint interval",
    );
    let report = simulate_with_progress(&fleet, &config, &|done, planned| {
        bar.set_length(planned as u64);
        bar.set_position(done as u64);
    })
    .map_err(refused)?;
    bar.finish_and_clear();
    let host_seconds = started.elapsed().as_secs_f64();
    if args.json {
        let mut value = serde_json::to_value(&report)?;
        value["step_source"] = step_source.into();
        if let Some(m) = &model {
            value["model_step"] = super::model_step::goodput_layout_json(m, &topology);
        }
        if let Some(a) = auto {
            value["layout_search"] = a.json();
        }
        value["wall_seconds"] = host_seconds.into();
        return output::print_json(&value);
    }
    let mut layout = model.as_ref().map_or(String::new(), |m| {
        super::model_step::goodput_layout_line(m, &topology)
    });
    if let Some(a) = auto {
        layout = format!("{}\n{layout}", a.line());
    }
    output::print_text(&text(&report, step_source, &layout, host_seconds))
}

/// A span of simulated time: seconds below an hour, hours above (written
/// readably however long: `6.25e298 h`).
fn span(seconds: f64) -> String {
    if seconds == 0.0 {
        "0 s".into()
    } else if seconds < 3600.0 {
        secs(seconds)
    } else {
        format!("{} h", number((seconds / 3600.0 * 100.0).round() / 100.0))
    }
}

/// Seconds with a unit suited to their size, written readably when huge
/// (a 10^20-byte checkpoint's write: `1e11 s`).
fn secs(value: f64) -> String {
    if value >= 1e6 {
        format!("{} s", number(value.round()))
    } else {
        output::seconds(value)
    }
}

/// `rollback 620.047 s = detect 10.000 s + restart 600.000 s + ...`: one
/// recovery's downtime and the parts it is the sum of.
fn breakdown(costs: &Costs, recovery: RecoveryPolicy, name: &str) -> String {
    let parts = costs.recovery_parts(recovery, true);
    let total: f64 = parts.iter().map(|p| p.1).sum();
    let terms: Vec<String> = parts
        .iter()
        .map(|(what, s)| format!("{what} {}", secs(*s)))
        .collect();
    format!("{name} {} = {}", secs(total), terms.join(" + "))
}

fn text(r: &GoodputReport, step_source: &str, layout: &str, host_seconds: f64) -> String {
    let c = &r.costs;
    let mut out = headline(r);
    out += layout;
    out += &format!(
        "  productive     {} ({} of {}, {step_source})\n",
        span(r.productive_seconds),
        plural(r.steps_completed, "step", "steps"),
        secs(c.step_seconds),
    );
    out += &format!(
        "  lost           {}; {} in lost and cut-off steps\n",
        plural(r.lost_steps, "step", "steps"),
        span(r.lost_seconds),
    );
    out += &checkpoint_lines(r);
    out += &restart_lines(r);
    if r.replication_seconds > 0.0 {
        out += &format!(
            "  replication    {} ({} per step)\n",
            span(r.replication_seconds),
            secs(c.replication_seconds_per_step),
        );
    }
    out += &format!("simulated in {} of host time\n", secs(host_seconds));
    out
}

/// The first line: the goodput, the run and the pod, and how often it fails.
fn headline(r: &GoodputReport) -> String {
    let c = &r.costs;
    let unit = match r.config.failure_unit {
        FailureUnit::Chip => "chip",
        FailureUnit::Host => "host",
    };
    format!(
        "goodput {:.2}% over {} on {} ({}, {}), {}: {unit} MTBF {} h, the pod fails every {} \
         (seed {})\n",
        100.0 * r.goodput,
        plural_f64(r.config.days, "day", "days"),
        r.pod,
        plural(u64::from(r.chips), "chip", "chips"),
        plural(u64::from(r.hosts), "host", "hosts"),
        r.config.recovery,
        number(r.config.mtbf_hours),
        span(c.system_mtbf_seconds),
        r.config.seed,
    )
}

/// The checkpoints line: the interval (and how `auto` chose it), the time
/// spent waiting and what one checkpoint costs; for asynchronous
/// checkpoints, the waits and cut-off writes.
fn checkpoint_lines(r: &GoodputReport) -> String {
    let c = &r.costs;
    let interval = match (r.checkpoint_interval_seconds, &r.search) {
        (None, Some(search)) => format!(
            "never (auto: no checkpoints did best, {:.2}% against {} intervals x {})",
            100.0 * search.never_goodput,
            search.candidates,
            plural(search.replicates, "replicate", "replicates"),
        ),
        (None, None) => "never".to_string(),
        (Some(s), Some(search)) => format!(
            "every {} (auto: {} intervals x {})",
            span(s),
            search.candidates,
            plural(search.replicates, "replicate", "replicates"),
        ),
        (Some(s), None) => format!("every {}", span(s)),
    };
    let size = output::bytes(c.checkpoint_bytes);
    let cost = if r.config.async_checkpoint {
        format!(
            "asynchronous: training waits {} for the host copy of {size}, the {} write at {} \
             overlaps training",
            secs(c.host_copy_seconds),
            secs(c.checkpoint_write_seconds),
            output::bytes_per_s(c.storage_bytes_per_s),
        )
    } else {
        format!(
            "{} each: {size} at {}",
            secs(c.checkpoint_write_seconds),
            output::bytes_per_s(c.storage_bytes_per_s),
        )
    };
    let mut out = format!(
        "  checkpoints    {} {interval}; {} waiting ({cost}); Young/Daly {}\n",
        r.checkpoints,
        span(r.checkpoint_seconds),
        span(r.young_daly_seconds),
    );
    if r.config.async_checkpoint && (r.checkpoint_wait_seconds > 0.0 || r.checkpoint_writes_cut > 0)
    {
        out += &format!(
            "                 {} waiting for the previous write; {} cut off by a failure\n",
            span(r.checkpoint_wait_seconds),
            plural(r.checkpoint_writes_cut, "write", "writes"),
        );
    }
    out
}

/// The restarts line: each recovery's downtime and its parts; for
/// spare-cube runs, the spare pool.
fn restart_lines(r: &GoodputReport) -> String {
    let c = &r.costs;
    let first_read = "; no read before the first checkpoint";
    let each = match r.config.recovery {
        RecoveryPolicy::Redundant => format!(
            "{}; a fallback to a checkpoint is a {}{first_read}",
            breakdown(c, RecoveryPolicy::Redundant, "redundant"),
            breakdown(c, RecoveryPolicy::Rollback, "rollback"),
        ),
        RecoveryPolicy::SpareCube => format!(
            "{}, no restart; without a free spare {}{first_read}",
            breakdown(c, RecoveryPolicy::SpareCube, "spare cube"),
            breakdown(c, RecoveryPolicy::Rollback, "rollback"),
        ),
        _ => format!(
            "{}{first_read}",
            breakdown(c, RecoveryPolicy::Rollback, "rollback")
        ),
    };
    let mut out = format!(
        "  restarts       {}; {} recovering (each: {each}); {} fell back to a checkpoint\n",
        r.restarts,
        span(r.recovery_seconds),
        r.fallbacks_to_checkpoint,
    );
    if r.config.recovery == RecoveryPolicy::SpareCube {
        out += &format!(
            "  spare cubes    {} swapped in, {} found no free spare and rolled back ({}, \
             each back after {})\n",
            r.spare_swaps,
            plural(r.spare_shortfalls, "failure", "failures"),
            plural(u64::from(c.spare_cubes), "spare", "spares"),
            span(c.cube_repair_seconds),
        );
    }
    out
}

/// `1 day`, `0.5 days`, `54 days`.
fn plural_f64(value: f64, one: &str, many: &str) -> String {
    format!(
        "{} {}",
        number(value),
        if value == 1.0 { one } else { many }
    )
}
