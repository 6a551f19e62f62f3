//! Goodput: the share of a long training run's wall time spent on steps
//! that count, through failures, checkpoints and recoveries.
//!
//! A run of `days` on a [`Fleet`] is a seeded discrete-event simulation of
//! its timeline ([`timeline`]): failures drawn from the unit's MTBF
//! (exponential inter-arrival, per chip or per host), checkpoints that cost
//! their bytes over the storage bandwidth ([`Costs`]: parameters and
//! optimizer state through [`crate::hardware::checkpoint_io_seconds`], as
//! `recovery::rollback` reads them and `train` writes them), and recoveries under
//! the model's [`crate::sharding::RecoveryPolicy`]: a rollback loses the steps since the
//! last checkpoint and reads it back; a redundant recovery loses none but
//! pays a state copy to the ring successor every step, as the pod's sharded
//! step does; a spare-cube recovery loses the steps a rollback does but
//! swaps the failed cube for a spare in the OCS reconfiguration time
//! instead of restarting the job. [`interval::search_interval`] picks the checkpoint interval by
//! simulation; `tests/goodput.rs` checks it against Young/Daly and the run
//! against published goodput (`docs/goodput.md`).
//!
//! Goodput here is productive step time over simulated time, in [0, 1]:
//! the replication, checkpoint waits, recoveries, steps a rollback lost and
//! steps cut off in flight are the rest, and the report accounts every
//! second once. With `async_checkpoint` a checkpoint costs training only
//! its device-to-host copy (Orbax's asynchronous save); its write overlaps
//! the steps after it and it is usable once that write has finished.

pub mod error;
pub mod inputs;
pub mod interval;
pub mod timeline;

pub use error::{GoodputError, StepModelError, readable};
pub use inputs::{
    CheckpointInterval, Costs, DEFAULT_CUBE_REPAIR_HOURS, DEFAULT_OPTIMIZER_SLOTS,
    DEFAULT_RECONFIGURE_SECONDS, DEFAULT_RESTART_SECONDS, FailureUnit, Fleet, GoodputConfig,
    MAX_DAYS, MAX_STEPS, modeled_step_seconds, parse_recovery,
};
pub use interval::{
    IntervalSearch, search_interval, search_interval_with_progress, young_daly_seconds,
};
pub use timeline::{Exposure, Plan, Tally, simulate_failures, simulate_run};

use serde::Serialize;

/// What a goodput run found. Times are simulated seconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GoodputReport {
    /// The pod.
    pub pod: String,
    /// Chips.
    pub chips: u32,
    /// Hosts.
    pub hosts: u32,
    /// The inputs.
    pub config: GoodputConfig,
    /// The costs derived from them.
    pub costs: Costs,
    /// Productive step time over simulated time, in [0, 1].
    pub goodput: f64,
    /// Simulated time: the run's length.
    pub simulated_seconds: f64,
    /// Time in steps that count.
    pub productive_seconds: f64,
    /// Steps that count.
    pub steps_completed: u64,
    /// Completed steps a rollback threw away.
    pub lost_steps: u64,
    /// Time in lost steps and in steps cut off in flight.
    pub lost_seconds: f64,
    /// Checkpoints whose write finished.
    pub checkpoints: u64,
    /// Asynchronous writes a failure cut off before they finished.
    pub checkpoint_writes_cut: u64,
    /// Time training waited for checkpoints: the writes (synchronous), or
    /// the host copies and any wait for a previous write (asynchronous).
    pub checkpoint_seconds: f64,
    /// Of `checkpoint_seconds`, waiting for a previous asynchronous write.
    pub checkpoint_wait_seconds: f64,
    /// Failures; each restarts the job (or its recovery).
    pub restarts: u64,
    /// Time from failures until training resumed.
    pub recovery_seconds: f64,
    /// Time copying state to ring successors (redundant).
    pub replication_seconds: f64,
    /// Redundant recoveries that lost both copies and rolled back.
    pub fallbacks_to_checkpoint: u64,
    /// Failures a spare cube was swapped in for (spare-cube).
    pub spare_swaps: u64,
    /// Failures with no free spare cube, recovered by a rollback.
    pub spare_shortfalls: u64,
    /// Steps between checkpoints (`None`: no checkpoints).
    pub checkpoint_interval_steps: Option<u64>,
    /// Seconds of training between checkpoints.
    pub checkpoint_interval_seconds: Option<f64>,
    /// Young/Daly's `√(2·C·MTBF)` for this fleet's checkpoint cost (what
    /// training waits for per checkpoint) and MTBF.
    pub young_daly_seconds: f64,
    /// How `auto` chose the interval.
    pub search: Option<IntervalSearch>,
}

/// Simulates `config`'s run on `fleet`. Every input is checked first: an
/// `Err` means nothing was simulated.
pub fn simulate(fleet: &Fleet, config: &GoodputConfig) -> Result<GoodputReport, GoodputError> {
    simulate_with_progress(fleet, config, &|_, _| {})
}

/// [`simulate`], reporting the `auto` search's progress as
/// `progress(candidates done, candidates planned)` (not called for a
/// fixed interval, which is one run).
pub fn simulate_with_progress(
    fleet: &Fleet,
    config: &GoodputConfig,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<GoodputReport, GoodputError> {
    let costs = Costs::derive(fleet, config)?;
    let exposure = Exposure::new(fleet, config.failure_unit);
    let horizon = config.days * 86_400.0;
    let step = costs.step_seconds + costs.replication_seconds_per_step;
    let base = Plan {
        steps_per_checkpoint: None,
        recovery: config.recovery,
        horizon_seconds: horizon,
        seed: config.seed,
    };
    let (steps_per_checkpoint, search) = match config.checkpoint {
        CheckpointInterval::Never => (None, None),
        // Whole steps, at least one; an interval past MAX_STEPS is longer
        // than any run, and counting stays exact.
        CheckpointInterval::Every(seconds) => (
            Some((seconds / step).round().clamp(1.0, MAX_STEPS as f64) as u64),
            None,
        ),
        CheckpointInterval::Auto => {
            let found = search_interval_with_progress(&exposure, &costs, base, progress);
            (found.steps, Some(found))
        }
    };
    let plan = Plan {
        steps_per_checkpoint,
        ..base
    };
    let tally = simulate_run(&exposure, &costs, plan, 0);
    let productive = tally.productive_steps() as f64 * costs.step_seconds;
    Ok(GoodputReport {
        pod: fleet.name.clone(),
        chips: fleet.chips,
        hosts: fleet.hosts,
        config: config.clone(),
        goodput: tally.goodput(costs.step_seconds),
        simulated_seconds: tally.simulated_seconds,
        productive_seconds: productive,
        steps_completed: tally.productive_steps(),
        lost_steps: tally.lost_steps,
        lost_seconds: tally.lost_steps as f64 * costs.step_seconds + tally.void_step_seconds,
        checkpoints: tally.checkpoints,
        checkpoint_writes_cut: tally.writes_cut,
        checkpoint_seconds: tally.checkpoint_seconds,
        checkpoint_wait_seconds: tally.checkpoint_wait_seconds,
        restarts: tally.restarts,
        recovery_seconds: tally.recovery_seconds,
        replication_seconds: tally.replication_seconds,
        fallbacks_to_checkpoint: tally.fallbacks,
        spare_swaps: tally.spare_swaps,
        spare_shortfalls: tally.spare_shortfalls,
        checkpoint_interval_steps: steps_per_checkpoint,
        checkpoint_interval_seconds: steps_per_checkpoint.map(|n| n as f64 * step),
        young_daly_seconds: young_daly_seconds(
            costs.checkpoint_blocking_seconds,
            costs.system_mtbf_seconds,
        ),
        search,
        costs,
    })
}
