//! Scans of the model's participants for one that is lost: the step's own
//! failure detection and the host's waits use them (the recovery that
//! follows a failure is [`crate::recovery`]).

use bevy_ecs::prelude::*;

use super::model::model_of;
use crate::health::DeviceState;
use crate::topology::{DeviceId, DeviceIndex};

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
