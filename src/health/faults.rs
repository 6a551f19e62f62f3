//! Fault injection: kill or pause a device, cut a link, add jitter — now, or
//! at a simulated time through the [`FaultPlan`].

use super::error::FaultError;
use super::{ControlJitter, DeviceState, InjectedFault};
use crate::clock::{SimClock, SimDuration};
use crate::topology::{DeviceId, DeviceIndex, Link};
use crate::transport::{LinkState, Transport};
use bevy_ecs::prelude::*;
use serde::{Deserialize, Serialize};

/// A fault to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fault {
    /// The device dies: no more heartbeats, arrivals or data.
    KillDevice(DeviceId),
    /// The device stops responding until resumed.
    PauseDevice(DeviceId),
    /// A paused device responds again.
    ResumeDevice(DeviceId),
    /// The link between two devices stops carrying data.
    CutLink(DeviceId, DeviceId),
    /// A cut link carries data again.
    RestoreLink(DeviceId, DeviceId),
    /// Up to this much extra latency on each hop of a link.
    LinkJitter(DeviceId, DeviceId, u64),
    /// Up to this much extra latency on a device's control messages.
    DeviceJitter(DeviceId, u64),
}

/// A fault and when to apply it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduledFault {
    /// Simulated time, ns.
    pub at_ns: u64,
    /// The fault.
    pub fault: Fault,
}

impl ScheduledFault {
    /// When the fault applies.
    pub fn at(&self) -> SimDuration {
        SimDuration::from_nanos(self.at_ns)
    }
}

/// Faults waiting for their time, in time order (ties in insertion order).
#[derive(Resource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultPlan {
    /// Pending faults.
    pub pending: Vec<ScheduledFault>,
    /// Faults that could not be applied when due, with the reason.
    pub rejected: Vec<(ScheduledFault, String)>,
}

/// Schedules `fault` for simulated time `at_ns`.
pub fn schedule_fault(world: &mut World, at_ns: u64, fault: Fault) {
    let mut plan = world.resource_mut::<FaultPlan>();
    let position = plan.pending.partition_point(|f| f.at_ns <= at_ns);
    plan.pending
        .insert(position, ScheduledFault { at_ns, fault });
}

fn device(world: &World, id: DeviceId) -> Result<Entity, FaultError> {
    world
        .resource::<DeviceIndex>()
        .get(id)
        .ok_or(FaultError::UnknownDevice(id))
}

fn link_between(world: &mut World, a: DeviceId, b: DeviceId) -> Result<Entity, FaultError> {
    let (ea, eb) = (device(world, a)?, device(world, b)?);
    world
        .query::<(Entity, &Link)>()
        .iter(world)
        .find(|(_, link)| (link.a, link.b) == (ea, eb) || (link.a, link.b) == (eb, ea))
        .map(|(entity, _)| entity)
        .ok_or(FaultError::NoSuchLink(a, b))
}

fn set_state(world: &mut World, id: DeviceId, state: DeviceState) -> Result<(), FaultError> {
    let entity = device(world, id)?;
    let now = world.resource::<SimClock>().now_ns;
    let mut current = world
        .get_mut::<DeviceState>(entity)
        .expect("devices have a state");
    if matches!(*current, DeviceState::Killed { .. }) {
        return Err(FaultError::DeviceKilled(id));
    }
    // A device is dated from when it went silent: killing a paused device
    // keeps the pause's time, so detection latency counts from then.
    let was_running = current.is_running();
    *current = state;
    if was_running && !state.is_running() {
        world
            .get_mut::<InjectedFault>(entity)
            .expect("devices record injected faults")
            .at_ns = Some(now);
    }
    Ok(())
}

fn set_link(
    world: &mut World,
    a: DeviceId,
    b: DeviceId,
    change: impl FnOnce(&mut LinkState),
) -> Result<(), FaultError> {
    let entity = link_between(world, a, b)?;
    change(
        &mut world
            .get_mut::<LinkState>(entity)
            .expect("links have a state"),
    );
    world.resource_mut::<Transport>().invalidate_routes();
    Ok(())
}

/// Applies a fault now.
pub fn apply_fault(world: &mut World, fault: Fault) -> Result<(), FaultError> {
    let now = world.resource::<SimClock>().now_ns;
    match fault {
        Fault::KillDevice(id) => set_state(world, id, DeviceState::Killed { at_ns: now }),
        Fault::PauseDevice(id) => set_state(world, id, DeviceState::Paused),
        Fault::ResumeDevice(id) => set_state(world, id, DeviceState::Running),
        Fault::CutLink(a, b) => set_link(world, a, b, |state| state.up = false),
        Fault::RestoreLink(a, b) => set_link(world, a, b, |state| state.up = true),
        Fault::LinkJitter(a, b, ns) => set_link(world, a, b, |state| state.jitter_ns = ns),
        Fault::DeviceJitter(id, ns) => {
            let entity = device(world, id)?;
            world
                .get_mut::<ControlJitter>(entity)
                .expect("devices have control jitter")
                .jitter_ns = ns;
            Ok(())
        }
    }
}

/// Applies every scheduled fault whose time has come.
pub fn apply_scheduled_faults(world: &mut World) {
    let now = world.resource::<SimClock>().now_ns;
    let due = {
        let mut plan = world.resource_mut::<FaultPlan>();
        let split = plan.pending.partition_point(|f| f.at_ns <= now);
        plan.pending.drain(..split).collect::<Vec<_>>()
    };
    for scheduled in due {
        if let Err(error) = apply_fault(world, scheduled.fault) {
            world
                .resource_mut::<FaultPlan>()
                .rejected
                .push((scheduled, error.to_string()));
        }
    }
}

/// A scheduled fault that can never apply, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnappliableFault {
    /// The fault as scheduled.
    pub scheduled: ScheduledFault,
    /// Why it cannot apply.
    pub reason: String,
}

impl std::fmt::Display for UnappliableFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} at t={:.3} s: {}",
            self.scheduled.fault,
            self.scheduled.at_ns as f64 * 1e-9,
            self.reason
        )
    }
}

/// The pending faults of the [`FaultPlan`] that can never apply if the pod
/// runs until simulated time `end_ns`, in plan order: those due after
/// `end_ns`; a pause, resume or second kill of a device killed before it
/// (now, or by an earlier fault of the plan); faults naming a device or
/// link the pod does not have. Applying the plan would reject or never
/// reach them; this says so before the run.
pub fn faults_that_cannot_apply(world: &mut World, end_ns: u64) -> Vec<UnappliableFault> {
    let pending = world.resource::<FaultPlan>().pending.clone();
    let mut killed: std::collections::BTreeMap<DeviceId, Option<u64>> = world
        .query::<(&crate::topology::Device, &DeviceState)>()
        .iter(world)
        .filter_map(|(device, state)| match state {
            DeviceState::Killed { .. } => Some((device.id, None)),
            _ => None,
        })
        .collect();
    let seconds = |ns: u64| ns as f64 * 1e-9;
    let mut found = Vec::new();
    for scheduled in pending {
        let reason = if scheduled.at_ns > end_ns {
            Some(format!(
                "it is due after the run ends at t={:.3} s",
                seconds(end_ns)
            ))
        } else {
            match scheduled.fault {
                Fault::KillDevice(id) | Fault::PauseDevice(id) | Fault::ResumeDevice(id) => {
                    match device(world, id) {
                        Err(error) => Some(error.to_string()),
                        Ok(_) => match killed.get(&id) {
                            Some(at) => Some(match at {
                                Some(at) => {
                                    format!("{id} is killed at t={:.3} s first", seconds(*at))
                                }
                                None => format!("{id} is already killed"),
                            }),
                            None => {
                                if let Fault::KillDevice(_) = scheduled.fault {
                                    killed.insert(id, Some(scheduled.at_ns));
                                }
                                None
                            }
                        },
                    }
                }
                Fault::DeviceJitter(id, _) => device(world, id).err().map(|e| e.to_string()),
                Fault::CutLink(a, b) | Fault::RestoreLink(a, b) | Fault::LinkJitter(a, b, _) => {
                    link_between(world, a, b).err().map(|e| e.to_string())
                }
            }
        };
        if let Some(reason) = reason {
            found.push(UnappliableFault { scheduled, reason });
        }
    }
    found
}
