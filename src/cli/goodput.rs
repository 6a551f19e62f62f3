//! `optirs-tpu goodput`: a long training run's goodput through failures,
//! simulated as a seeded discrete-event timeline (`optirs_tpu::goodput`).

use super::output;
use super::parse::parse_count;
use anyhow::Result;
use clap::Args;
use clap::builder::PossibleValuesParser;
use optirs_tpu::goodput::{
    CheckpointInterval, DEFAULT_CUBE_REPAIR_HOURS, DEFAULT_RECONFIGURE_SECONDS,
    DEFAULT_RESTART_SECONDS, FailureUnit, Fleet, GoodputConfig, GoodputReport,
    modeled_step_seconds, parse_recovery, simulate,
};
use optirs_tpu::sharding::RecoveryPolicy;
use optirs_tpu::topology::{DEFAULT_PRESET, load_topology};
use std::time::Instant;

#[derive(Args, Debug)]
pub struct GoodputArgs {
    /// A preset name (see `optirs-tpu presets`) or a pod file path.
    #[arg(default_value = DEFAULT_PRESET)]
    pod: String,
    /// Parameters of the model (e.g. 405e9).
    #[arg(long, value_name = "N", value_parser = parse_count)]
    model_params: usize,
    /// Mean time between failures of one failure unit (one chip, or one
    /// host with --failure-unit host), hours. The pod fails every
    /// MTBF / units on average.
    #[arg(long, value_name = "H", allow_negative_numbers = true)]
    mtbf_hours: f64,
    /// Simulated wall time, days.
    #[arg(long, value_name = "D", allow_negative_numbers = true)]
    days: f64,
    /// What one failure takes down: chip or host.
    #[arg(long, default_value = "chip")]
    failure_unit: FailureUnit,
    /// Seconds of training between checkpoints, `auto` (chosen by
    /// simulation) or `never`.
    #[arg(
        long,
        value_name = "SECONDS|auto|never",
        default_value = "auto",
        allow_negative_numbers = true
    )]
    checkpoint_every: CheckpointInterval,
    /// rollback (to the last checkpoint), redundant (state copies on each
    /// device's ring successor) or spare-cube (swap the failed cube for a
    /// spare, then roll back, with no job restart; a pod file with
    /// `cubes: (spares: N)`).
    #[arg(long, default_value = "rollback", value_parser = parse_recovery)]
    recovery: RecoveryPolicy,
    /// Seed of the failure times and of which unit fails.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The optimizer whose state is checkpointed (its slot count matters).
    #[arg(long, default_value = "adam", ignore_case = true,
          value_parser = PossibleValuesParser::new(optirs_tpu::optimizers::NAMES))]
    optimizer: String,
    /// One training step, seconds (default: the pod's modeled sharded
    /// optimizer step, which has no forward or backward pass in it).
    #[arg(long, value_name = "S", allow_negative_numbers = true)]
    step_seconds: Option<f64>,
    /// Job restart after a failure is detected, seconds.
    #[arg(long, value_name = "S", default_value_t = DEFAULT_RESTART_SECONDS,
          allow_negative_numbers = true)]
    restart_seconds: f64,
    /// Swapping the failed unit for a spare, seconds.
    #[arg(long, value_name = "S", default_value_t = DEFAULT_RECONFIGURE_SECONDS,
          allow_negative_numbers = true)]
    reconfigure_seconds: f64,
    /// Under spare-cube, hours until a failed cube is a spare again.
    #[arg(long, value_name = "H", default_value_t = DEFAULT_CUBE_REPAIR_HOURS,
          allow_negative_numbers = true)]
    cube_repair_hours: f64,
    /// Aggregate checkpoint storage bandwidth, bytes per second (default
    /// 1 GB/s per host).
    #[arg(long, value_name = "B", allow_negative_numbers = true)]
    storage_bytes_per_s: Option<f64>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn goodput(args: GoodputArgs) -> Result<()> {
    let started = Instant::now();
    let slots = optirs_tpu::optimizers::by_name(&args.optimizer, 1e-3f32)?
        .update_rule()
        .map_or(0, |r| r.slot_names().len());
    let topology = load_topology(&args.pod)?;
    let fleet = Fleet::from_topology(&topology)?;
    let mut config = GoodputConfig::new(
        args.model_params as u64,
        args.mtbf_hours,
        args.days,
        args.step_seconds.unwrap_or(f64::MIN_POSITIVE),
    );
    config.optimizer_slots = slots;
    config.failure_unit = args.failure_unit;
    config.checkpoint = args.checkpoint_every;
    config.recovery = args.recovery;
    config.seed = args.seed;
    config.restart_seconds = args.restart_seconds;
    config.reconfigure_seconds = args.reconfigure_seconds;
    config.cube_repair_hours = args.cube_repair_hours;
    config.storage_bytes_per_s = args.storage_bytes_per_s;
    // Every input is checked (with a placeholder step) before the step is
    // modeled, so bad input is refused before any work.
    optirs_tpu::goodput::Costs::derive(&fleet, &config)?;
    let step_source = match args.step_seconds {
        Some(_) => "--step-seconds",
        None => {
            config.step_seconds = modeled_step_seconds(&topology, config.model_params, slots)?;
            "modeled sharded optimizer step"
        }
    };
    let report = simulate(&fleet, &config)?;
    let wall = started.elapsed().as_secs_f64();
    if args.json {
        let mut value = serde_json::to_value(&report)?;
        value["step_source"] = step_source.into();
        value["wall_clock_seconds"] = wall.into();
        return output::print_json(&value);
    }
    output::print_text(&text(&report, step_source, wall))
}

fn hours(seconds: f64) -> String {
    format!("{:.2} h", seconds / 3600.0)
}

fn text(r: &GoodputReport, step_source: &str, wall: f64) -> String {
    let c = &r.costs;
    let unit = match r.config.failure_unit {
        FailureUnit::Chip => "chip",
        FailureUnit::Host => "host",
    };
    let mut out = format!(
        "goodput {:.2}% over {} days on {} ({} chips, {} hosts), {}: {unit} MTBF {} h, \
         the pod fails every {} (seed {})\n",
        100.0 * r.goodput,
        r.config.days,
        r.pod,
        r.chips,
        r.hosts,
        r.config.recovery,
        r.config.mtbf_hours,
        hours(c.system_mtbf_seconds),
        r.config.seed,
    );
    out += &format!(
        "  productive     {} ({} steps of {}, {step_source})\n",
        hours(r.productive_seconds),
        r.steps_completed,
        output::seconds(c.step_seconds),
    );
    out += &format!(
        "  lost           {} steps; {} in lost and cut-off steps\n",
        r.lost_steps,
        hours(r.lost_seconds),
    );
    let interval = match (r.checkpoint_interval_seconds, &r.search) {
        (None, _) => "never".to_string(),
        (Some(s), Some(search)) => format!(
            "every {} (auto: {} intervals x {} replicates)",
            output::seconds(s),
            search.candidates,
            search.replicates
        ),
        (Some(s), None) => format!("every {}", output::seconds(s)),
    };
    out += &format!(
        "  checkpoints    {} {interval}; {} writing ({} each: {:.3e} bytes at {}); \
         Young/Daly {}\n",
        r.checkpoints,
        hours(r.checkpoint_seconds),
        output::seconds(c.checkpoint_write_seconds),
        c.checkpoint_bytes,
        output::bytes_per_s(c.storage_bytes_per_s),
        output::seconds(r.young_daly_seconds),
    );
    let each = if r.config.recovery == RecoveryPolicy::Redundant {
        format!(
            "redundant {} (+ re-shard {})",
            output::seconds(c.redundant_seconds),
            output::seconds(c.reshard_seconds)
        )
    } else if r.config.recovery == RecoveryPolicy::SpareCube {
        format!(
            "spare cube {}, no restart; without a free spare rollback {}",
            output::seconds(c.spare_cube_seconds),
            output::seconds(c.rollback_seconds)
        )
    } else {
        format!("rollback {}", output::seconds(c.rollback_seconds))
    };
    out += &format!(
        "  restarts       {}; {} recovering ({each}: detect {}, restart {}, reconfigure {}); \
         {} fell back to a checkpoint\n",
        r.restarts,
        hours(r.recovery_seconds),
        output::seconds(c.detect_seconds),
        output::seconds(c.restart_seconds),
        output::seconds(c.reconfigure_seconds),
        r.fallbacks_to_checkpoint,
    );
    if r.config.recovery == RecoveryPolicy::SpareCube {
        out += &format!(
            "  spare cubes    {} swapped in, {} failures found no free spare ({} spares, \
             each back after {})\n",
            r.spare_swaps,
            r.spare_shortfalls,
            c.spare_cubes,
            hours(c.cube_repair_seconds),
        );
    }
    if r.replication_seconds > 0.0 {
        out += &format!(
            "  replication    {} ({} per step)\n",
            hours(r.replication_seconds),
            output::seconds(c.replication_seconds_per_step),
        );
    }
    out += &format!("simulated in {}\n", output::seconds(wall));
    out
}
