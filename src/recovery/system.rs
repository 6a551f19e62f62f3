//! The `Recovery` set's system and the policy dispatch.

use bevy_ecs::prelude::*;

use super::reshard::{reshard_after_loss, state_from_copies};
use super::rollback::from_checkpoint;
use crate::health::{DeviceState, declared_failed};
use crate::ir::{DType, FloatElement};
use crate::sharding::{
    RecoveryFailure, RecoveryPolicy, RecoveryRecord, ShardedStep, ShardingError, StepOutcome,
    model_of,
};
use crate::topology::{DeviceId, DeviceIndex};

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
                step.recovery = Some(Err(e.into()));
            }
            return;
        }
    };
    let policy = model_of(world).map(|m| m.recovery);
    let result = if ranks.is_some() && policy == Some(RecoveryPolicy::SpareCube) {
        Err(RecoveryFailure::SpareCubeSplit { cause })
    } else if lost.is_empty() {
        Err(RecoveryFailure::NoDeviceLost { cause })
    } else {
        match model_of(world).map(|m| m.layout.dtype) {
            Some(DType::F64) => recover::<f64>(world, &lost, number, at_ns),
            _ => recover::<f32>(world, &lost, number, at_ns),
        }
        .map_err(RecoveryFailure::from)
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

/// The participants of the model that are killed, paused or declared
/// failed (rank 0's declarations on a pod split over ranks).
pub fn lost_devices(world: &mut World) -> Result<Vec<DeviceId>, ShardingError> {
    let Some(model) = model_of(world) else {
        return Ok(Vec::new());
    };
    let participants = model.layout.participants.clone();
    let declared = declared_failed(world, &participants)?;
    let index = world.resource::<DeviceIndex>().clone();
    Ok(participants
        .into_iter()
        .filter(|&d| {
            declared.contains(&d)
                || index
                    .get(d)
                    .is_some_and(|e| !world.get::<DeviceState>(e).is_none_or(|s| s.is_running()))
        })
        .collect())
}

/// The model's policy, applied to the devices `lost` in step `number`
/// (failed at `at_ns`).
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
            return super::spare_cube::recover::<A>(world, lost, number, at_ns);
        }
    };
    reshard_after_loss(world, lost, restored, number, at_ns)
}
