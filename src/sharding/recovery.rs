//! Re-sharding a model onto the devices that survive a failure.
//!
//! The lost devices are excluded, the layout is rebuilt over a ring of the
//! survivors (the ring order without them, every hop routed on the torus),
//! and the model is reinstalled with the given parameters, count and state,
//! every shard reserved in its new device's heap. If that does not fit, the
//! previous model is put back as it was.
//!
//! Modeled time (the next step waits for it): each survivor receives its
//! new state shards, `slots · shard_elements · element_bytes` (twice with
//! redundant copies), over one ICI link at the generation's bandwidth and
//! latency ([`crate::hardware`]); a rollback first reads the checkpoint's
//! parameters and state at
//! [`crate::hardware::CHECKPOINT_READ_BYTES_PER_S_PER_HOST`] on every host.
//!
//! A spare-cube recovery ([`swap_cubes_after_loss`]) excludes nobody: the
//! lost devices' cubes are swapped for spares ([`crate::health::cubes`]),
//! so the model keeps its layout (every device, the torus plan) and is
//! reinstalled with the checkpoint's state; its time is the checkpoint
//! read, the OCS reconfiguration and the same shard transfer.

use bevy_ecs::prelude::*;

use super::error::ShardingError;
use super::layout::ShardPlan;
use super::model::{
    RecoveryPolicy, RecoveryRecord, ShardedModel, SlotValues, model_of, replace_model,
};
use crate::clock::SimClock;
use crate::health::cubes::swap_in_spares;
use crate::health::{DeviceState, Excluded};
use crate::ir::FloatElement;
use crate::memory::ShardSlot;
use crate::topology::{DeviceId, DeviceIndex, PodTopology};

/// The participants of the model that are killed, paused or declared
/// failed (rank 0's declarations on a pod split over ranks).
pub fn lost_devices(world: &mut World) -> Result<Vec<DeviceId>, ShardingError> {
    let Some(model) = model_of(world) else {
        return Ok(Vec::new());
    };
    let participants = model.layout.participants.clone();
    let declared = crate::health::declared_failed(world, &participants)?;
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

/// The first participant of the model (in layout order) that this
/// process sees killed, paused or declared failed: a wait with no step in
/// flight (a checkpoint write) is cut short by it.
pub fn lost_participant(world: &World) -> Option<DeviceId> {
    first_participant(world, |e| {
        is_stopped(world, e)
            || world
                .get::<crate::health::Health>(e)
                .is_some_and(|h| h.is_failed())
    })
}

/// The first participant the scenario has stopped (killed or paused):
/// the part of [`lost_participant`] every rank of a split pod holds alike
/// (a `Health` verdict lives on rank 0 only), so split ranks that wait on
/// it stop and decide together.
pub fn stopped_participant(world: &World) -> Option<DeviceId> {
    first_participant(world, |e| is_stopped(world, e))
}

fn is_stopped(world: &World, device: Entity) -> bool {
    world
        .get::<DeviceState>(device)
        .is_some_and(|s| !s.is_running())
}

fn first_participant(world: &World, lost: impl Fn(Entity) -> bool) -> Option<DeviceId> {
    let model = model_of(world)?;
    let index = world.resource::<DeviceIndex>();
    model
        .layout
        .participants
        .iter()
        .copied()
        .find(|&d| index.get(d).is_some_and(&lost))
}

/// What a recovery installs.
#[derive(Debug, Clone)]
pub struct Restored<A> {
    /// Flat parameters (model elements).
    pub params: Vec<A>,
    /// Per slot, the flat state (at least the model's elements).
    pub state: Vec<Vec<A>>,
    /// optax's count.
    pub count: i32,
    /// Completed steps it corresponds to.
    pub steps_completed: u64,
    /// Seconds spent before the re-shard (reading a checkpoint).
    pub read_seconds: f64,
}

/// Re-shards the model onto the participants not in `lost` (module docs)
/// and records the recovery. On `Err` the model is as it was.
pub fn reshard_after_loss<A: FloatElement>(
    world: &mut World,
    lost: &[DeviceId],
    restored: Restored<A>,
    failed_step: u64,
    failed_at_ns: u64,
) -> Result<RecoveryRecord, ShardingError> {
    let model = model_of(world).ok_or(ShardingError::NoModel)?.clone();
    let survivors: Vec<DeviceId> = model
        .layout
        .participants
        .iter()
        .copied()
        .filter(|d| !lost.contains(d))
        .collect();
    if survivors.is_empty() {
        return Err(ShardingError::Devices {
            reason: "every device of the model is lost".into(),
        });
    }
    let ring: Vec<DeviceId> = model
        .layout
        .ring_order()
        .into_iter()
        .filter(|d| !lost.contains(d))
        .collect();
    let layout = model
        .layout
        .reshard(survivors, ShardPlan::Ring { ring }, model.bucket_bytes)?;
    let copies = if model.recovery == RecoveryPolicy::Redundant {
        2.0
    } else {
        1.0
    };
    let generation = world.resource::<PodTopology>().0.generation.spec();
    let shard_bytes =
        (model.slots.len() * layout.shard_elements() * layout.element_bytes()) as f64 * copies;
    let reshard_seconds = shard_transfer_seconds(generation, shard_bytes);
    let recovery_seconds = restored.read_seconds + reshard_seconds;
    let record = RecoveryRecord {
        policy: model.recovery,
        failed_step,
        lost_devices: lost.to_vec(),
        lost_steps: model
            .steps_completed
            .saturating_sub(restored.steps_completed),
        recovery_seconds,
        read_seconds: restored.read_seconds,
        reconfigure_seconds: 0.0,
        reshard_seconds,
        failed_at_ns,
        devices_after: layout.devices(),
        swapped_cubes: Vec::new(),
    };
    reinstall(world, model, layout, restored, &record)?;
    let index = world.resource::<DeviceIndex>().clone();
    for &d in lost {
        if let Some(e) = index.get(d) {
            world.entity_mut(e).insert(Excluded);
        }
    }
    Ok(record)
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
    let shard_bytes = (model.slots.len() * layout.shard_elements() * layout.element_bytes()) as f64;
    let reshard_seconds = shard_transfer_seconds(generation, shard_bytes);
    let now = world.resource::<SimClock>().now_ns;
    let swaps = swap_in_spares(world, cubes, now).map_err(|e| ShardingError::Recovery {
        reason: e.to_string(),
    })?;
    let recovery_seconds = restored.read_seconds + reconfigure_seconds + reshard_seconds;
    let record = RecoveryRecord {
        policy: RecoveryPolicy::SpareCube,
        failed_step,
        lost_devices: lost.to_vec(),
        lost_steps: model
            .steps_completed
            .saturating_sub(restored.steps_completed),
        recovery_seconds,
        read_seconds: restored.read_seconds,
        reconfigure_seconds,
        reshard_seconds,
        failed_at_ns,
        devices_after: layout.devices(),
        swapped_cubes: swaps.iter().map(|s| [s.failed, s.spare]).collect(),
    };
    reinstall(world, model, layout, restored, &record)?;
    Ok(record)
}

/// The modeled time to move a device's new state shards (`bytes`) over
/// one ICI link of the generation.
fn shard_transfer_seconds(generation: &crate::hardware::HardwareSpec, bytes: f64) -> f64 {
    generation.ici_latency_ns as f64 * 1e-9 + bytes / generation.ici_bytes_per_s
}

/// Installs `model` on `layout` with `restored`'s parameters, state and
/// count (padded to the layout), `record` appended to its recoveries, and
/// the next step held until the recovery's modeled time has passed. If it
/// does not fit, the previous model is put back as it was.
fn reinstall<A: FloatElement>(
    world: &mut World,
    model: ShardedModel,
    layout: super::layout::ShardLayout,
    restored: Restored<A>,
    record: &RecoveryRecord,
) -> Result<(), ShardingError> {
    let padded = layout.padded_elements();
    let pad = |mut v: Vec<A>| {
        v.truncate(layout.elements);
        v.resize(padded, A::ZERO);
        v
    };
    let params = pad(restored.params);
    let state: Vec<Vec<A>> = restored.state.into_iter().map(pad).collect();
    let now = world.resource::<SimClock>().now_ns;
    let mut recoveries = model.recoveries.clone();
    recoveries.push(record.clone());
    let next = ShardedModel {
        layout,
        params: super::model::flat_tensor(params),
        count: restored.count,
        steps_completed: restored.steps_completed,
        recoveries,
        recovering_until_ns: now + (record.recovery_seconds * 1e9).ceil() as u64,
        ..model
    };
    replace_model(world, next, SlotValues::Flat(state))
}

/// The redundant policy's state: every survivor's primary shards, and the
/// lost devices' copies (an error naming the shard if a copy is lost too).
pub fn state_from_copies<A: FloatElement>(
    world: &mut World,
    lost: &[DeviceId],
) -> Result<Restored<A>, ShardingError> {
    let model = model_of(world).ok_or(ShardingError::NoModel)?.clone();
    if model.recovery != RecoveryPolicy::Redundant {
        return Err(ShardingError::InvalidState {
            reason: "the model keeps no redundant copies".into(),
        });
    }
    // A split pod's ranks each hold their devices' shards: every rank
    // takes every rank's, so all rebuild the same state.
    let state = match super::ranked::context(world) {
        Some(ctx) => {
            let all = super::ranked::all_slots::<A>(world, &ctx, model.steps_completed + 1)?;
            let slots: Vec<&ShardSlot> = all.iter().collect();
            super::model::gather_slots(&model, &slots, lost)?
        }
        None => {
            let mut q = world.query::<&ShardSlot>();
            let slots: Vec<&ShardSlot> = q.iter(world).collect();
            super::model::gather_slots(&model, &slots, lost)?
        }
    };
    Ok(Restored {
        params: model.flat_params::<A>()?.to_vec(),
        state,
        count: model.count,
        steps_completed: model.steps_completed,
        read_seconds: 0.0,
    })
}
