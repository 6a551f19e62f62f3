//! The `Recovery` set's system: after a sharded step failed because
//! devices were lost, apply the model's [`RecoveryPolicy`] and re-shard
//! onto the survivors ([`crate::sharding::recovery`]).
//!
//! * **Rollback** reads the newest periodic checkpoint (every root of the
//!   pod's [`PeriodicCheckpoints`], newest tick first, each verified byte
//!   for byte; corrupt ones are skipped) that holds the same model, and
//!   takes its parameters, state and count; the steps completed since are
//!   lost; before the first checkpoint it restarts from the model as the
//!   run began ([`crate::sharding::model::StartingModel`], in memory, if
//!   the host kept it). Only the model rolls back: the pod's time, health and the
//!   failure stay as they are, which is what a training job restarting on
//!   the surviving hosts sees. These are the checkpoints
//!   `FaultToleranceManager` lists and restores.
//! * **Redundant** promotes the lost devices' state copies from their ring
//!   successors; no step is lost.
//! * **SpareCube** first checks that a spare cube is there for every lost
//!   device's cube (an error before any work otherwise), then reads the
//!   newest checkpoint as a rollback does and swaps the cubes
//!   ([`crate::sharding::recovery::swap_cubes_after_loss`]): the model
//!   keeps every device and its layout. With no spare free it falls back
//!   to a rollback onto the survivors, as `goodput` models it (the record
//!   names the policy that ran).
//!
//! What happened is in [`ShardedStep::recovery`] and, on success, appended
//! to the model's `recoveries`. A failure no policy can survive (no lost
//! device but a cut link, both copies of a shard lost, every device lost,
//! no checkpoint of the model) is recorded there as an error.

use bevy_ecs::prelude::*;

use super::periodic::PeriodicCheckpoints;
use super::store::{list_checkpoints, verify_checkpoint};
use crate::health::cubes::{cubes_of, plan_swaps};
use crate::ir::{DType, FloatElement};
use crate::persist::SnapshotRegistry;
use crate::sharding::recovery::{
    Restored, lost_devices, reshard_after_loss, state_from_copies, swap_cubes_after_loss,
};
use crate::sharding::{
    RecoveryPolicy, RecoveryRecord, ShardedStep, ShardingError, StepOutcome, model_of,
};
use crate::topology::{DeviceId, PodTopology};

/// Applies the policy once per failed step, after its memory is released.
pub fn recover_sharded_model(world: &mut World) {
    let Some(step) = world.get_resource::<ShardedStep>() else {
        return;
    };
    let StepOutcome::Failed { at_ns, cause, .. } = &step.outcome else {
        return;
    };
    if !step.released || step.recovery.is_some() {
        return;
    }
    let (at_ns, cause, number) = (*at_ns, cause.clone(), step.number);
    let ranks = crate::sharding::ranked::context(world);
    let lost = match lost_devices(world) {
        Ok(lost) => lost,
        Err(ShardingError::Cluster(e)) => {
            // The ranks cannot go on together; the split pod's step ends.
            world
                .resource_mut::<crate::transport::Network>()
                .fail(crate::transport::TransportError::Cluster(e));
            return;
        }
        Err(e) => {
            if let Some(mut step) = world.get_resource_mut::<ShardedStep>() {
                step.recovery = Some(Err(e.to_string()));
            }
            return;
        }
    };
    let policy = model_of(world).map(|m| m.recovery);
    let result = if ranks.is_some() && policy == Some(RecoveryPolicy::SpareCube) {
        Err(format!(
            "{cause}; spare-cube recovery runs in one process (cube-built pods are not split \
             over ranks)"
        ))
    } else if lost.is_empty() {
        Err(format!(
            "{cause}, and no device is lost: neither policy re-shards around it; restore the \
             link (or exclude a device) and step again"
        ))
    } else {
        match model_of(world).map(|m| m.layout.dtype) {
            Some(DType::F64) => recover::<f64>(world, &lost, number, at_ns),
            _ => recover::<f32>(world, &lost, number, at_ns),
        }
        .map_err(|e| e.to_string())
    };
    // Every rank re-sharded alike from every rank's shards; each keeps its
    // own devices' values.
    if let (Some(ctx), Ok(_)) = (&ranks, &result) {
        crate::sharding::ranked::hold_own_shards(world, &ctx.layout);
    }
    if let Some(mut step) = world.get_resource_mut::<ShardedStep>() {
        step.recovery = Some(result);
    }
}

fn recover<A: FloatElement>(
    world: &mut World,
    lost: &[DeviceId],
    number: u64,
    at_ns: u64,
) -> Result<RecoveryRecord, ShardingError> {
    let policy = model_of(world).ok_or(ShardingError::NoModel)?.recovery;
    let restored = match policy {
        RecoveryPolicy::Redundant => state_from_copies::<A>(world, lost)?,
        RecoveryPolicy::Rollback => from_checkpoint::<A>(world)?,
        RecoveryPolicy::SpareCube => {
            let refuse = |e: crate::health::FaultError| ShardingError::Recovery {
                reason: e.to_string(),
            };
            let cubes = cubes_of(world, lost).map_err(refuse)?;
            match plan_swaps(world, &cubes) {
                Ok(_) => {
                    let restored = from_checkpoint::<A>(world)?;
                    return swap_cubes_after_loss(world, lost, &cubes, restored, number, at_ns);
                }
                // No free spare: the job restarts on the survivors, a
                // rollback, as `goodput` models a spare-cube run then (the
                // record's policy says which ran).
                Err(crate::health::FaultError::NoSpareCube { .. }) => {
                    let restored = from_checkpoint::<A>(world)?;
                    let mut record = reshard_after_loss(world, lost, restored, number, at_ns)?;
                    record.policy = RecoveryPolicy::Rollback;
                    if let Some(mut model) = crate::sharding::model::model_mut(world)
                        && let Some(last) = model.recoveries.last_mut()
                    {
                        last.policy = RecoveryPolicy::Rollback;
                    }
                    return Ok(record);
                }
                Err(e) => return Err(refuse(e)),
            }
        }
    };
    reshard_after_loss(world, lost, restored, number, at_ns)
}

/// [`newest_model`], read by rank 0 alone on a pod split over ranks and
/// sent to the others, so every rank rolls back to the same state.
fn from_checkpoint<A: FloatElement>(world: &mut World) -> Result<Restored<A>, ShardingError> {
    let Some(ctx) = crate::sharding::ranked::context(world) else {
        return newest_model(world);
    };
    type Wire = Result<(Vec<u8>, Vec<Vec<u8>>, i32, u64, f64), String>;
    let bytes = |v: &[A]| bytemuck::cast_slice::<A, u8>(v).to_vec();
    let mine: Wire = if ctx.layout.runs_service() {
        newest_model::<A>(world)
            .map(|r| {
                let state = r.state.iter().map(|s| bytes(s)).collect();
                (
                    bytes(&r.params),
                    state,
                    r.count,
                    r.steps_completed,
                    r.read_seconds,
                )
            })
            .map_err(|e| e.to_string())
    } else {
        Err(String::new())
    };
    let values = |b: &[u8]| {
        let mut v = vec![A::ZERO; b.len() / std::mem::size_of::<A>()];
        bytemuck::cast_slice_mut::<A, u8>(&mut v).copy_from_slice(b);
        v
    };
    match ctx.broadcast_value(&mine)? {
        Ok((params, state, count, steps_completed, read_seconds)) => Ok(Restored {
            params: values(&params),
            state: state.iter().map(|s| values(s)).collect(),
            count,
            steps_completed,
            read_seconds,
        }),
        Err(reason) => Err(ShardingError::Recovery { reason }),
    }
}

/// The newest verified periodic checkpoint's model (same tensors and
/// element type as the live one).
fn newest_model<A: FloatElement>(world: &mut World) -> Result<Restored<A>, ShardingError> {
    let live = model_of(world).ok_or(ShardingError::NoModel)?.clone();
    let roots = world
        .get_resource::<PeriodicCheckpoints>()
        .map(|p| p.roots.clone())
        .unwrap_or_default();
    if roots.is_empty() {
        return Err(ShardingError::Recovery {
            reason: "rollback needs periodic checkpoints, and none are enabled \
                     (Pod::enable_periodic_checkpoints, or `train --checkpoint-every`)"
                .into(),
        });
    }
    let hosts = world.resource::<PodTopology>().0.num_hosts();
    let registry = world.resource::<SnapshotRegistry>();
    let mut candidates = Vec::new();
    let mut problems = Vec::new();
    for root in &roots {
        match list_checkpoints(root, registry) {
            Ok(listings) => {
                for l in listings {
                    match (l.tick, l.problem) {
                        (Some(tick), None) => candidates.push((tick, l.path)),
                        (_, Some(problem)) => problems.push(problem),
                        _ => {}
                    }
                }
            }
            Err(e) => problems.push(e.to_string()),
        }
    }
    candidates.sort_by_key(|c| std::cmp::Reverse(c.0));
    for (_, path) in candidates {
        let registry = world.resource::<SnapshotRegistry>();
        // A pod split over ranks writes split checkpoints.
        let read = if super::split::is_split_checkpoint(&path) {
            super::split::read_any_checkpoint(&path, registry)
        } else {
            verify_checkpoint(&path, registry).map(|(_, snapshot)| snapshot)
        };
        let snapshot = match read {
            Ok(snapshot) => snapshot,
            Err(e) => {
                problems.push(e.to_string());
                continue;
            }
        };
        let mut scratch = World::new();
        if let Err(e) = registry.restore(&mut scratch, &snapshot) {
            problems.push(format!("{}: {e}", path.display()));
            continue;
        }
        let Some(model) = model_of(&scratch).cloned() else {
            problems.push(format!("{}: holds no sharded model", path.display()));
            continue;
        };
        if model.layout.tensors != live.layout.tensors || model.layout.dtype != live.layout.dtype {
            problems.push(format!("{}: holds another model", path.display()));
            continue;
        }
        let state = crate::sharding::model::gather_state::<A>(&mut scratch)?;
        return Ok(Restored {
            params: model.flat_params::<A>()?.to_vec(),
            state,
            count: model.count,
            steps_completed: model.steps_completed,
            read_seconds: model.checkpoint_io_seconds(hosts),
        });
    }
    if problems.is_empty()
        && let Some(start) = world.get_resource::<crate::sharding::model::StartingModel>()
    {
        // Before the first checkpoint: back to the start, from memory.
        let elements = live.layout.elements;
        let flat = |t: &crate::ir::Tensor| -> Result<Vec<A>, ShardingError> {
            let v = A::array_ref(t).and_then(|a| a.as_slice()).ok_or_else(|| {
                ShardingError::InvalidState {
                    reason: "the starting model holds another element type".into(),
                }
            })?;
            Ok(v[..elements.min(v.len())].to_vec())
        };
        return Ok(Restored {
            params: flat(&start.params)?,
            state: start.state.iter().map(flat).collect::<Result<_, _>>()?,
            count: start.count,
            steps_completed: start.steps_completed,
            read_seconds: 0.0,
        });
    }
    Err(ShardingError::Recovery {
        reason: if problems.is_empty() {
            "no checkpoint of the model has been written yet".into()
        } else {
            format!("no usable checkpoint: {}", problems.join("; "))
        },
    })
}
