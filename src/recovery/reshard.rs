//! Re-sharding a model onto the devices that survive a failure, the
//! redundant policy's state from the copies, and the reinstall every policy
//! ends with (module docs of [`crate::recovery`]).

use bevy_ecs::prelude::*;

use crate::clock::SimClock;
use crate::hardware::HardwareSpec;
use crate::health::Excluded;
use crate::ir::FloatElement;
use crate::memory::ShardSlot;
use crate::sharding::layout::{ShardLayout, ShardPlan};
use crate::sharding::model::{
    RecoveryPolicy, RecoveryRecord, ShardedModel, SlotValues, flat_tensor, gather_slots, model_of,
    replace_model,
};
use crate::sharding::{ShardingError, ranked};
use crate::topology::{DeviceId, DeviceIndex, PodTopology};

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

/// The failure a recovery answers.
pub(super) struct Failure<'a> {
    /// The step that failed.
    pub step: u64,
    /// When the failure was seen, ns.
    pub at_ns: u64,
    /// The devices lost.
    pub lost: &'a [DeviceId],
}

/// A recovery's modeled time by part, seconds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Seconds {
    /// Reading the checkpoint restored.
    pub read: f64,
    /// The optical switches' reconfiguration.
    pub reconfigure: f64,
    /// Moving the new state shards to their devices.
    pub reshard: f64,
}

impl Failure<'_> {
    /// The record of recovering from it with `policy`: `model` reinstalled
    /// on `layout` from `restored`, in `seconds`, with the cubes `swapped`.
    /// Both re-sharding and the cube swap build their record here.
    pub(super) fn record<A>(
        &self,
        policy: RecoveryPolicy,
        model: &ShardedModel,
        layout: &ShardLayout,
        restored: &Restored<A>,
        seconds: Seconds,
        swapped: Vec<[u32; 2]>,
    ) -> RecoveryRecord {
        RecoveryRecord {
            policy,
            failed_step: self.step,
            lost_devices: self.lost.to_vec(),
            lost_steps: model
                .steps_completed
                .saturating_sub(restored.steps_completed),
            recovery_seconds: seconds.read + seconds.reconfigure + seconds.reshard,
            read_seconds: seconds.read,
            reconfigure_seconds: seconds.reconfigure,
            reshard_seconds: seconds.reshard,
            failed_at_ns: self.at_ns,
            devices_after: layout.devices(),
            swapped_cubes: swapped,
        }
    }
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
        (moved_shards(&model) * layout.shard_elements() * layout.element_bytes()) as f64 * copies;
    let failure = Failure {
        step: failed_step,
        at_ns: failed_at_ns,
        lost,
    };
    let seconds = Seconds {
        read: restored.read_seconds,
        reconfigure: 0.0,
        reshard: shard_transfer_seconds(generation, shard_bytes),
    };
    let record = failure.record(
        model.recovery,
        &model,
        &layout,
        &restored,
        seconds,
        Vec::new(),
    );
    // A ring of survivors has no mesh axes: the model shards over all of
    // them.
    let model = ShardedModel {
        mesh: None,
        ..model
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

/// Shards of the model a device receives when it re-shards: one per state
/// slot, and under fsdp (the parameters sharded too) its parameter shard.
pub(super) fn moved_shards(model: &ShardedModel) -> usize {
    model.slots.len() + usize::from(model.strategy == crate::sharding::Strategy::Fsdp)
}

/// The modeled time to move a device's new state shards (`bytes`) over
/// one ICI link of the generation.
pub(super) fn shard_transfer_seconds(generation: &HardwareSpec, bytes: f64) -> f64 {
    generation.ici_latency_ns as f64 * 1e-9 + bytes / generation.ici_bytes_per_s
}

/// Installs `model` on `layout` with `restored`'s parameters, state and
/// count (padded to the layout), `record` appended to its recoveries, and
/// the next step held until the recovery's modeled time has passed. If it
/// does not fit, the previous model is put back as it was.
pub(super) fn reinstall<A: FloatElement>(
    world: &mut World,
    model: ShardedModel,
    layout: ShardLayout,
    restored: Restored<A>,
    record: &RecoveryRecord,
) -> Result<(), ShardingError> {
    let pad = |v: Vec<A>| layout.fit_padded(v, A::ZERO);
    let params = pad(restored.params);
    let state: Vec<Vec<A>> = restored.state.into_iter().map(pad).collect();
    let now = world.resource::<SimClock>().now_ns;
    let mut recoveries = model.recoveries.clone();
    recoveries.push(record.clone());
    let next = ShardedModel {
        layout,
        params: flat_tensor(params),
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
    let state = match ranked::context(world) {
        Some(ctx) => {
            let all = ranked::all_slots::<A>(world, &ctx, model.steps_completed + 1)?;
            let slots: Vec<&ShardSlot> = all.iter().collect();
            gather_slots(&model, &slots, lost)?
        }
        None => {
            let mut q = world.query::<&ShardSlot>();
            let slots: Vec<&ShardSlot> = q.iter(world).collect();
            gather_slots(&model, &slots, lost)?
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
