//! The spare-cube policy: the lost devices' cubes are swapped for spares
//! through the optical circuit switches, and the model is reinstalled on
//! its own layout from the newest checkpoint (module docs of
//! [`crate::recovery`]).

use bevy_ecs::prelude::*;

use super::reshard::{
    Failure, Restored, Seconds, moved_shards, reinstall, reshard_after_loss, shard_transfer_seconds,
};
use super::rollback::from_checkpoint;
use crate::clock::SimClock;
use crate::health::FaultError;
use crate::health::cubes::{cubes_of, plan_swaps, swap_in_spares};
use crate::ir::FloatElement;
use crate::sharding::{RecoveryPolicy, RecoveryRecord, ShardingError, model_of};
use crate::topology::{DeviceId, PodTopology};

/// The policy: swap the cubes when a spare is free for each, else roll
/// back onto the survivors, as `goodput` models a spare-cube run then (the
/// record's policy says which ran).
pub(super) fn recover<A: FloatElement>(
    world: &mut World,
    lost: &[DeviceId],
    number: u64,
    at_ns: u64,
) -> Result<RecoveryRecord, ShardingError> {
    let refuse = ShardingError::CubesRefused;
    let cubes = cubes_of(world, lost).map_err(refuse)?;
    match plan_swaps(world, &cubes) {
        Ok(_) => {
            let restored = from_checkpoint::<A>(world)?;
            swap_cubes_after_loss(world, lost, &cubes, restored, number, at_ns)
        }
        // No free spare: the job restarts on the survivors, a rollback.
        Err(FaultError::NoSpareCube { .. }) => {
            let restored = from_checkpoint::<A>(world)?;
            let mut record = reshard_after_loss(world, lost, restored, number, at_ns)?;
            record.policy = RecoveryPolicy::Rollback;
            if let Some(mut model) = crate::sharding::model::model_mut(world)
                && let Some(last) = model.recoveries.last_mut()
            {
                last.policy = RecoveryPolicy::Rollback;
            }
            Ok(record)
        }
        Err(e) => Err(refuse(e)),
    }
}

/// Swaps `cubes` (the lost devices' cubes) for spares and reinstalls the
/// model on its own layout with `restored` (module docs). The spares must
/// have been checked ([`crate::health::cubes::plan_swaps`]); on `Err` from
/// the swap nothing changed, and if the reinstall fails the model is put
/// back as it was (on the swapped cubes).
pub fn swap_cubes_after_loss<A: FloatElement>(
    world: &mut World,
    lost: &[DeviceId],
    cubes: &[u32],
    restored: Restored<A>,
    failed_step: u64,
    failed_at_ns: u64,
) -> Result<RecoveryRecord, ShardingError> {
    let model = model_of(world).ok_or(ShardingError::NoModel)?.clone();
    let topology = &world.resource::<PodTopology>().0;
    let reconfigure_seconds = topology
        .cubes
        .ok_or_else(|| ShardingError::Recovery {
            reason: format!("{} is not built of cubes", topology.name),
        })?
        .reconfigure_seconds();
    let generation = topology.generation.spec();
    let layout = model.layout.clone();
    let shard_bytes =
        (moved_shards(&model) * layout.shard_elements() * layout.element_bytes()) as f64;
    let reshard_seconds = shard_transfer_seconds(generation, shard_bytes);
    let now = world.resource::<SimClock>().now_ns;
    let swaps = swap_in_spares(world, cubes, now).map_err(ShardingError::CubesRefused)?;
    let failure = Failure {
        step: failed_step,
        at_ns: failed_at_ns,
        lost,
    };
    let seconds = Seconds {
        read: restored.read_seconds,
        reconfigure: reconfigure_seconds,
        reshard: reshard_seconds,
    };
    let swapped = swaps.iter().map(|s| [s.failed, s.spare]).collect();
    let record = failure.record(
        RecoveryPolicy::SpareCube,
        &model,
        &layout,
        &restored,
        seconds,
        swapped,
    );
    reinstall(world, model, layout, restored, &record)?;
    Ok(record)
}
