//! Periodic checkpoints as a system in the `Step` schedule's last set.

use super::error::CheckpointError;
use super::retention::{checkpoint_name, enforce_retention};
use super::store::write_checkpoint;
use crate::clock::{NextEvent, SimClock};
use crate::persist::{SnapshotError, SnapshotRegistry};
use crate::topology::PodTopology;
use crate::transport::ClusterError;
use crate::transport::cluster::RankContext;
use bevy_ecs::prelude::*;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Turns on periodic checkpoints: every `every_ticks` ticks the world is
/// written to each root, keeping the newest `max_checkpoints`.
#[derive(Resource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeriodicCheckpoints {
    /// Interval in ticks (at least 1).
    pub every_ticks: u64,
    /// Where to write.
    pub roots: Vec<PathBuf>,
    /// Kept per root.
    pub max_checkpoints: usize,
    /// Checkpoints written by the system.
    pub written: u64,
    /// The last write error, if the last attempt failed.
    pub last_error: Option<String>,
    /// What retention could not do after the last write (the checkpoint
    /// itself was written): each problem names the path.
    pub retention_problems: Vec<String>,
}

/// Writes a checkpoint when one is due. Errors are recorded in
/// [`PeriodicCheckpoints::last_error`]; the pod keeps running.
pub fn write_periodic_checkpoint(world: &mut World) {
    let Some(config) = world.get_resource::<PeriodicCheckpoints>() else {
        return;
    };
    let clock = *world.resource::<SimClock>();
    let tick = clock.tick;
    // Written at the boundary that ends the tick, not again at an exact
    // stop later inside the next one.
    if config.every_ticks == 0 || !tick.is_multiple_of(config.every_ticks) || !clock.at_boundary() {
        return;
    }
    let (roots, keep) = (config.roots.clone(), config.max_checkpoints.max(1));
    let pod = world.resource::<PodTopology>().0.name.clone();
    let name = checkpoint_name(tick);
    let mut retention_problems = Vec::new();
    if let Some(ctx) = world
        .get_resource::<RankContext>()
        .filter(|c| c.layout.ranks() > 1)
        .cloned()
    {
        // A pod split over ranks writes split checkpoints, every rank its
        // part (the roots must be one directory every rank sees).
        let mut result = Ok(());
        for root in &roots {
            match super::split::save_split(world, &ctx, root, &name) {
                Ok(_) => {
                    if ctx.layout.runs_service() {
                        retention_problems.extend(enforce_retention(root, keep, &name).problems);
                    }
                }
                Err(ClusterError::Coordinator(reason)) => {
                    result = Err(WriteFailure::Coordinator(reason));
                    break;
                }
                Err(lost) => {
                    world
                        .resource_mut::<crate::transport::Network>()
                        .fail(crate::transport::TransportError::Cluster(lost));
                    return;
                }
            }
        }
        record(world, result, retention_problems);
        return;
    }
    let result = world
        .resource_scope(|world, registry: Mut<SnapshotRegistry>| registry.capture(world, tick))
        .map_err(WriteFailure::from)
        .and_then(|snapshot| {
            for root in &roots {
                write_checkpoint(root, &name, &pod, &snapshot, &mut |_| Ok(()))?;
                retention_problems.extend(enforce_retention(root, keep, &name).problems);
            }
            Ok(())
        });
    record(world, result, retention_problems);
}

/// Why a periodic checkpoint was not written; its message is what
/// [`PeriodicCheckpoints::last_error`] keeps.
#[derive(Debug, thiserror::Error)]
enum WriteFailure {
    /// The world could not be captured.
    #[error(transparent)]
    Capture(#[from] SnapshotError),
    /// A root could not take the checkpoint.
    #[error(transparent)]
    Write(#[from] CheckpointError),
    /// Rank 0 refused a split pod's checkpoint, and says why.
    #[error("{0}")]
    Coordinator(String),
}

fn record(world: &mut World, result: Result<(), WriteFailure>, retention_problems: Vec<String>) {
    let mut config = world.resource_mut::<PeriodicCheckpoints>();
    config.retention_problems = retention_problems;
    match result {
        Ok(()) => {
            config.written += 1;
            config.last_error = None;
        }
        // Kept as its message: the config is part of the world a
        // checkpoint holds.
        Err(error) => config.last_error = Some(error.to_string()),
    }
}

/// The time of the next tick that writes a periodic checkpoint (a multiple
/// of `every_ticks`), or never when none are enabled.
pub fn next_periodic_checkpoint(world: &World) -> NextEvent {
    let Some(config) = world.get_resource::<PeriodicCheckpoints>() else {
        return NextEvent::Never;
    };
    if config.every_ticks == 0 {
        return NextEvent::Never;
    }
    let clock = world.resource::<SimClock>();
    let next_tick = (clock.tick / config.every_ticks + 1).saturating_mul(config.every_ticks);
    NextEvent::At(next_tick.saturating_mul(clock.tick_ns))
}
