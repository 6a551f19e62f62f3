//! The rollback's read: the newest verified periodic checkpoint that holds
//! the live model, or the model as the run began (module docs of
//! [`crate::recovery`]).

use std::path::{Path, PathBuf};

use bevy_ecs::prelude::*;

use super::reshard::Restored;
use crate::checkpoint::split::{is_split_checkpoint, read_any_checkpoint};
use crate::checkpoint::{PeriodicCheckpoints, list_checkpoints, verify_checkpoint};
use crate::ir::{FloatElement, Tensor};
use crate::persist::SnapshotRegistry;
use crate::sharding::model::{StartingModel, gather_state};
use crate::sharding::{ShardedModel, ShardingError, model_of};
use crate::topology::PodTopology;

/// [`newest_model`], read by rank 0 alone on a pod split over ranks and
/// sent to the others, so every rank rolls back to the same state.
pub fn from_checkpoint<A: FloatElement>(world: &mut World) -> Result<Restored<A>, ShardingError> {
    let Some(ctx) = crate::sharding::ranked::context(world) else {
        return newest_model(world);
    };
    // On the wire: the restored values as bytes, or rank 0's reason.
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
pub fn newest_model<A: FloatElement>(world: &mut World) -> Result<Restored<A>, ShardingError> {
    let live = model_of(world).ok_or(ShardingError::NoModel)?.clone();
    let roots = periodic_roots(world)?;
    let hosts = world.resource::<PodTopology>().0.num_hosts();
    let mut problems = Vec::new();
    let candidates = candidates(&roots, world.resource::<SnapshotRegistry>(), &mut problems);
    for path in candidates {
        if let Some(restored) = model_in(world, &path, &live, hosts, &mut problems)? {
            return Ok(restored);
        }
    }
    if problems.is_empty()
        && let Some(restored) = from_start(world, &live)?
    {
        return Ok(restored);
    }
    Err(ShardingError::Recovery {
        reason: if problems.is_empty() {
            "no checkpoint of the model has been written yet".into()
        } else {
            format!("no usable checkpoint: {}", problems.join("; "))
        },
    })
}

/// The roots periodic checkpoints are written to (an error if none are).
fn periodic_roots(world: &World) -> Result<Vec<PathBuf>, ShardingError> {
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
    Ok(roots)
}

/// Every verified checkpoint under `roots`, newest tick first; why each
/// other one is unusable goes to `problems`.
fn candidates(
    roots: &[PathBuf],
    registry: &SnapshotRegistry,
    problems: &mut Vec<String>,
) -> Vec<PathBuf> {
    let mut candidates = Vec::new();
    for root in roots {
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
    candidates.into_iter().map(|(_, path)| path).collect()
}

/// The model the checkpoint at `path` holds, if it reads back, verifies
/// and holds the `live` model's tensors and element type; otherwise why
/// not goes to `problems`.
fn model_in<A: FloatElement>(
    world: &World,
    path: &Path,
    live: &ShardedModel,
    hosts: u32,
    problems: &mut Vec<String>,
) -> Result<Option<Restored<A>>, ShardingError> {
    let registry = world.resource::<SnapshotRegistry>();
    // A pod split over ranks writes split checkpoints.
    let read = if is_split_checkpoint(path) {
        read_any_checkpoint(path, registry)
    } else {
        verify_checkpoint(path, registry).map(|(_, snapshot)| snapshot)
    };
    let snapshot = match read {
        Ok(snapshot) => snapshot,
        Err(e) => {
            problems.push(e.to_string());
            return Ok(None);
        }
    };
    let mut scratch = World::new();
    if let Err(e) = registry.restore(&mut scratch, &snapshot) {
        problems.push(format!("{}: {e}", path.display()));
        return Ok(None);
    }
    let Some(model) = model_of(&scratch).cloned() else {
        problems.push(format!("{}: holds no sharded model", path.display()));
        return Ok(None);
    };
    if model.layout.tensors != live.layout.tensors || model.layout.dtype != live.layout.dtype {
        problems.push(format!("{}: holds another model", path.display()));
        return Ok(None);
    }
    let state = gather_state::<A>(&mut scratch)?;
    Ok(Some(Restored {
        params: model.flat_params::<A>()?.to_vec(),
        state,
        count: model.count,
        steps_completed: model.steps_completed,
        read_seconds: model.checkpoint_io_seconds(hosts),
    }))
}

/// Before the first checkpoint: back to the start, from memory (when the
/// host kept the starting model).
fn from_start<A: FloatElement>(
    world: &World,
    live: &ShardedModel,
) -> Result<Option<Restored<A>>, ShardingError> {
    let Some(start) = world.get_resource::<StartingModel>() else {
        return Ok(None);
    };
    let elements = live.layout.elements;
    let flat = |t: &Tensor| -> Result<Vec<A>, ShardingError> {
        let v = A::array_ref(t).and_then(|a| a.as_slice()).ok_or_else(|| {
            ShardingError::InvalidState {
                reason: "the starting model holds another element type".into(),
            }
        })?;
        Ok(v[..elements.min(v.len())].to_vec())
    };
    Ok(Some(Restored {
        params: flat(&start.params)?,
        state: start.state.iter().map(flat).collect::<Result<_, _>>()?,
        count: start.count,
        steps_completed: start.steps_completed,
        read_seconds: 0.0,
    }))
}
