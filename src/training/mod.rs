//! A training run in one place: the sharded optimizer's host API
//! ([`ShardedOptimizer`], its step checkpoints and resume), the run loop
//! that steps it through failures and charges every simulated nanosecond
//! to the time ledger ([`run`]), the run's report with its goodput and
//! time shares ([`report`]) and its Chrome trace ([`trace`]). The world
//! work it needs lives below, in [`crate::sharding::world`]; the command
//! line only parses arguments into a [`RunPlan`] and prints.

mod checkpoints;
mod driver;
pub mod host;
mod ledgers;
mod optimizer;
pub mod report;
pub mod run;
pub mod trace;

pub use checkpoints::{CheckpointWrite, Resumed, SkippedCheckpoint, WriteOutcome};
pub use host::{FALLBACK_HOST_BYTES, host_memory_budget};
pub use ledgers::RunRecord;
pub use optimizer::{ShardedOptimizer, ShardedStepReport, ShardingConfig, StepPart, StepProgress};
pub use report::{TrainReport, median};
pub use run::{Outcome, RunError, RunPlan, run_steps, run_steps_from};

use crate::error::Result;
use crate::pod::Pod;
use crate::sharding::ShardPlan;
use crate::topology::DeviceId;

/// The devices a model on `pod` is sharded over and how
/// ([`crate::sharding::world::participants`]).
pub fn participants(pod: &mut Pod) -> Result<(Vec<DeviceId>, ShardPlan)> {
    crate::sharding::world::participants(pod.world_mut())
}

/// The fused update of a rule over a flat shard
/// ([`crate::sharding::world::compile_update`]).
pub use crate::sharding::world::compile_update;
