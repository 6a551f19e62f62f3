//! Heartbeats, fault detection and fault injection, in simulated time.
//!
//! Two views of every device, as in a real coordination service:
//!
//! - [`DeviceState`] is the ground truth of the simulated chip: running,
//!   paused or killed. Only fault injection changes it.
//! - [`Health`] is what the coordination service believes: healthy, suspect
//!   or failed. Only heartbeats (or their absence) change it.
//!
//! Every running device sends a heartbeat each `heartbeat_interval`,
//! stamped with its send time; device `i`'s first one is offset by
//! `i / n` of an interval so they do not all arrive in one tick. The
//! detector tracks, per device, the newest send time it has received. A device
//! silent for longer than `suspect_after` is [`Health::Suspect`] (and healthy
//! again when a heartbeat arrives); silent for longer than
//! `heartbeat_timeout`, it is [`Health::Failed`] for good. Measuring silence
//! from send times (not arrival times) bounds detection: a device killed at
//! `k` sends nothing after `k`, so it is failed by the first tick after
//! `k + timeout`; and a running device is never failed while the control
//! latency plus its jitter plus one interval stays within the timeout (the
//! newest heartbeat it sent that long ago has arrived). The pod loader
//! enforces that bound for the control latency with no jitter
//! (`latency + interval <= timeout`); a jitter fault larger than
//! `timeout - interval - latency` may fail a running device.
//!
//! A device sends at most one heartbeat per tick (see [`emit_heartbeats`]);
//! the loader also rejects an interval shorter than the tick.
//!
//! When the detector fails a device, it bumps the pod's [`FailureEpoch`] and,
//! in the same tick, every device's [`KnownFailures`] — the coordination
//! service's error propagation to all tasks.

pub mod cubes;
mod error;

pub use error::FaultError;
mod faults;

pub use faults::{
    Fault, FaultPlan, ScheduledFault, UnappliableFault, apply_fault, faults_that_cannot_apply,
    schedule_fault,
};

use crate::clock::{NextEvent, SimClock, SimDuration};
use crate::rng::{SimRng, stream};
use crate::schedule::{Step, StepSystems};
use crate::topology::{Device, DeviceId, PodTopology};
use crate::transport::{Inbox, Payload, Transport};
use bevy_ecs::prelude::*;
use bevy_ecs::schedule::Schedules;
use serde::{Deserialize, Serialize};

/// The ground truth of a simulated device.
#[derive(Component, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceState {
    /// Computing and sending heartbeats.
    Running,
    /// Alive but silent (a hung host, a long GC pause) until resumed.
    Paused,
    /// Gone for good.
    Killed {
        /// Simulated time of death, ns.
        at_ns: u64,
    },
}

impl DeviceState {
    /// Whether the device is running.
    pub fn is_running(&self) -> bool {
        matches!(self, DeviceState::Running)
    }

    /// When the device was killed; `None` while it lives.
    pub fn killed_at(&self) -> Option<SimDuration> {
        match *self {
            DeviceState::Killed { at_ns } => Some(SimDuration::from_nanos(at_ns)),
            _ => None,
        }
    }
}

/// What the coordination service believes about a device.
#[derive(Component, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Health {
    /// Heard from recently.
    Healthy,
    /// Silent for longer than `suspect_after`.
    Suspect {
        /// When it became suspect, ns.
        since_ns: u64,
    },
    /// Silent for longer than the heartbeat timeout.
    Failed {
        /// When the detector declared it failed, ns.
        detected_at_ns: u64,
    },
}

impl Health {
    /// Whether the device has been declared failed.
    pub fn is_failed(&self) -> bool {
        matches!(self, Health::Failed { .. })
    }

    /// When the detector declared the device failed; `None` unless it is.
    pub fn detected_at(&self) -> Option<SimDuration> {
        match *self {
            Health::Failed { detected_at_ns } => Some(SimDuration::from_nanos(detected_at_ns)),
            _ => None,
        }
    }

    /// When the device became suspect; `None` unless it is.
    pub fn suspect_since(&self) -> Option<SimDuration> {
        match *self {
            Health::Suspect { since_ns } => Some(SimDuration::from_nanos(since_ns)),
            _ => None,
        }
    }
}

/// A device's heartbeat schedule: the device's side, held by the process
/// that runs the device.
#[derive(Component, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// Next send time, ns.
    pub next_due_ns: u64,
    /// Heartbeats sent.
    pub sent: u64,
}

/// What the detector last heard from a device: the coordination service's
/// side, held by the process that runs the service.
#[derive(Component, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastHeard {
    /// Newest heartbeat send time the detector has received, ns.
    pub sent_ns: u64,
}

/// Extra delay on a device's control messages, uniform in `0..=jitter_ns`.
#[derive(Component, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlJitter {
    /// Maximum extra delay, ns.
    pub jitter_ns: u64,
}

/// The failure epoch a device has been told about.
#[derive(Component, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KnownFailures {
    /// Equal to [`FailureEpoch`] once the device knows every failure.
    pub epoch: u64,
}

/// Heartbeat timing of the pod.
#[derive(Resource, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatConfig {
    /// Time between heartbeats, ns.
    pub interval_ns: u64,
    /// Silence before a device is suspect, ns.
    pub suspect_after_ns: u64,
    /// Silence before a device is failed, ns.
    pub timeout_ns: u64,
    /// Latency of the control network (heartbeats, barrier arrivals), ns.
    pub control_latency_ns: u64,
}

/// Failures declared so far; bumped once per failed device.
#[derive(Resource, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureEpoch(pub u64);

/// One detected failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureRecord {
    /// The device.
    pub device: DeviceId,
    /// When a fault was injected into it (kill or pause), if one was.
    pub injected_at_ns: Option<u64>,
    /// When the detector declared it failed.
    pub detected_at_ns: u64,
    /// The failure epoch this failure started.
    pub epoch: u64,
}

impl FailureRecord {
    /// When the detector declared the device failed.
    pub fn detected_at(&self) -> SimDuration {
        SimDuration::from_nanos(self.detected_at_ns)
    }

    /// When a fault was injected into the device, if one was.
    pub fn injected_at(&self) -> Option<SimDuration> {
        self.injected_at_ns.map(SimDuration::from_nanos)
    }

    /// How long detection took after the injected fault, if there was one.
    pub fn detection_delay(&self) -> Option<SimDuration> {
        self.injected_at()
            .map(|injected| self.detected_at().saturating_sub(injected))
    }
}

/// Every failure the detector has declared, in order.
#[derive(Resource, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureLog {
    /// Records, oldest first.
    pub records: Vec<FailureRecord>,
}

/// When a fault was last injected into a device (kept for failure reports).
#[derive(Component, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InjectedFault {
    /// Simulated time of the last kill or pause, ns.
    pub at_ns: Option<u64>,
}

/// Every running device sends the heartbeat that is due, in device-id
/// order (so message sequence numbers do not depend on query order).
///
/// At most one heartbeat per device per tick: if several intervals elapsed
/// since the last tick (an interval shorter than the tick, which the pod
/// loader rejects, or a `HeartbeatConfig` changed at run time), only the
/// newest is sent — the detector keeps only the newest send time anyway —
/// and the schedule skips to the next interval after now. The work of a tick
/// is bounded by the number of devices, whatever the interval.
pub fn emit_heartbeats(
    clock: Res<SimClock>,
    config: Res<HeartbeatConfig>,
    rng: Res<SimRng>,
    mut transport: ResMut<Transport>,
    mut devices: Query<(&Device, &DeviceState, &ControlJitter, &mut Heartbeat)>,
) {
    let now = clock.now_ns;
    let mut due: Vec<(DeviceId, u64, u64)> = Vec::new();
    let interval = config.interval_ns.max(1);
    for (device, state, jitter, mut heartbeat) in &mut devices {
        if heartbeat.next_due_ns > now {
            continue;
        }
        // The newest due time at or before now.
        let newest = heartbeat.next_due_ns + (now - heartbeat.next_due_ns) / interval * interval;
        // A silent device sends nothing; it resumes on the next interval.
        if state.is_running() {
            due.push((device.id, newest, jitter.jitter_ns));
            heartbeat.sent += 1;
        }
        heartbeat.next_due_ns = newest.saturating_add(interval);
    }
    due.sort_unstable();
    for (device, sent_ns, jitter_ns) in due {
        let jitter = rng.up_to(jitter_ns, stream::HEARTBEAT, [u64::from(device.0), sent_ns]);
        let latency = config.control_latency_ns + jitter;
        transport.send_control(device, Payload::Heartbeat { sent_ns }, sent_ns, latency);
    }
}

/// The detector records the heartbeats delivered this tick.
pub fn record_heartbeats(
    inbox: Res<Inbox>,
    index: Res<crate::topology::DeviceIndex>,
    mut heard: Query<&mut LastHeard>,
) {
    for message in &inbox.messages {
        if let Payload::Heartbeat { sent_ns } = message.payload
            && let Some(entity) = index.get(message.from)
            && let Ok(mut last) = heard.get_mut(entity)
        {
            last.sent_ns = last.sent_ns.max(sent_ns);
        }
    }
}

/// Marks silent devices suspect or failed; tells every device of new failures
/// in the same tick.
pub fn detect_failures(
    clock: Res<SimClock>,
    config: Res<HeartbeatConfig>,
    mut epoch: ResMut<FailureEpoch>,
    mut log: ResMut<FailureLog>,
    mut devices: Query<(&Device, &LastHeard, &InjectedFault, &mut Health)>,
    mut known: Query<&mut KnownFailures>,
) {
    let now = clock.now_ns;
    let mut failed: Vec<(DeviceId, Option<u64>)> = Vec::new();
    for (device, heard, injected, mut health) in &mut devices {
        if health.is_failed() {
            continue;
        }
        let silence = now.saturating_sub(heard.sent_ns);
        let next = if silence > config.timeout_ns {
            failed.push((device.id, injected.at_ns));
            Health::Failed {
                detected_at_ns: now,
            }
        } else if silence > config.suspect_after_ns {
            match *health {
                Health::Suspect { since_ns } => Health::Suspect { since_ns },
                _ => Health::Suspect { since_ns: now },
            }
        } else {
            Health::Healthy
        };
        if *health != next {
            *health = next;
        }
    }
    if failed.is_empty() {
        return;
    }
    // Records in device-id order, whatever order the query visited them in.
    failed.sort_unstable();
    for (device, injected_at_ns) in failed {
        epoch.0 += 1;
        log.records.push(FailureRecord {
            device,
            injected_at_ns,
            detected_at_ns: now,
            epoch: epoch.0,
        });
    }
    for mut known in &mut known {
        known.epoch = epoch.0;
    }
}

/// Installs heartbeats and detection for the pod's devices.
pub fn install(world: &mut World) {
    let topology = world.resource::<PodTopology>().0.clone();
    let interval = topology.heartbeat_interval_ns;
    world.insert_resource(HeartbeatConfig {
        interval_ns: interval,
        suspect_after_ns: topology.heartbeat_timeout_ns / 2,
        timeout_ns: topology.heartbeat_timeout_ns,
        control_latency_ns: topology.dcn.latency_ns,
    });
    world.init_resource::<FailureEpoch>();
    world.init_resource::<FailureLog>();
    world.init_resource::<FaultPlan>();
    let n = u64::from(topology.num_devices().max(1));
    let devices: Vec<(Entity, DeviceId)> = world
        .query::<(Entity, &Device)>()
        .iter(world)
        .map(|(entity, device)| (entity, device.id))
        .collect();
    for (entity, id) in devices {
        world.entity_mut(entity).insert((
            DeviceState::Running,
            Health::Healthy,
            Heartbeat {
                next_due_ns: u64::from(id.0) * interval / n,
                sent: 0,
            },
            LastHeard::default(),
            ControlJitter::default(),
            KnownFailures::default(),
            InjectedFault::default(),
        ));
    }
    let mut schedules = world.resource_mut::<Schedules>();
    schedules.add_systems(
        Step,
        faults::apply_scheduled_faults.in_set(StepSystems::InjectFaults),
    );
    schedules.add_systems(Step, emit_heartbeats.in_set(StepSystems::Heartbeats));
    schedules.add_systems(
        Step,
        (record_heartbeats, detect_failures, cubes::mark_failed_cubes)
            .chain()
            .in_set(StepSystems::FaultDetection),
    );
}

/// Checks that work can run on `devices` (entities): none was declared
/// failed by the detector or killed. Entities without a health state (an
/// optimizer's own devices, outside any pod) always pass. The first device
/// down, in the order given, is named.
pub fn check_devices_up(world: &World, devices: &[Entity]) -> Result<(), FaultError> {
    for &entity in devices {
        let id = || {
            world
                .get::<Device>(entity)
                .map_or(DeviceId(u32::MAX), |d| d.id)
        };
        if let Some(&Health::Failed { detected_at_ns }) = world.get::<Health>(entity) {
            return Err(FaultError::DeviceFailed {
                device: id(),
                detected_at_ns,
            });
        }
        if let Some(&DeviceState::Killed { at_ns }) = world.get::<DeviceState>(entity) {
            return Err(FaultError::DeviceDead {
                device: id(),
                killed_at_ns: at_ns,
            });
        }
    }
    Ok(())
}

/// A device left out of barriers over "every device", load balancing and
/// collectives after its failure was handled (recovery excluded it).
#[derive(Component, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Excluded;

/// The earliest time heartbeats, scheduled faults or the failure detector
/// change the world: the next heartbeat due (silent devices' schedules move
/// on too), the next scheduled fault, and the next time a device's silence
/// crosses `suspect_after` or the timeout. A device whose health is not
/// what its silence says now (a host changed it, or the configuration) is
/// due at once.
pub fn next_event(world: &mut World) -> NextEvent {
    let now = world.resource::<SimClock>().now_ns;
    let config = *world.resource::<HeartbeatConfig>();
    let mut next = NextEvent::at(
        world
            .resource::<FaultPlan>()
            .pending
            .first()
            .map(|f| f.at_ns),
    );
    let mut devices = world.query::<(&Heartbeat, &LastHeard, &Health)>();
    for (heartbeat, heard, health) in devices.iter(world) {
        next = next.min(NextEvent::At(heartbeat.next_due_ns));
        let suspect_at = heard
            .sent_ns
            .saturating_add(config.suspect_after_ns)
            .saturating_add(1);
        let failed_at = heard
            .sent_ns
            .saturating_add(config.timeout_ns)
            .saturating_add(1);
        let due = match health {
            Health::Failed { .. } => continue,
            Health::Healthy if now < suspect_at.min(failed_at) => suspect_at.min(failed_at),
            Health::Suspect { .. } if now >= suspect_at && now < failed_at => failed_at,
            _ => return NextEvent::Unknown,
        };
        next = next.min(NextEvent::At(due));
    }
    next
}

/// Which of `participants` the coordination service has declared failed.
/// On a pod split over ranks only rank 0 runs the detector, so its answer
/// is broadcast (one round trip) and every rank decides alike; a work item
/// that fails on a declared failure (a collective, a sharded step) asks
/// here.
pub fn declared_failed(
    world: &World,
    participants: &[crate::topology::DeviceId],
) -> Result<std::collections::BTreeSet<crate::topology::DeviceId>, crate::transport::ClusterError> {
    let index = world.resource::<crate::topology::DeviceIndex>();
    let local: std::collections::BTreeSet<_> = participants
        .iter()
        .copied()
        .filter(|&d| {
            index
                .get(d)
                .and_then(|e| world.get::<Health>(e))
                .is_some_and(|h| h.is_failed())
        })
        .collect();
    match world.get_resource::<crate::transport::cluster::RankContext>() {
        Some(ctx) if ctx.layout.ranks() > 1 => ctx.broadcast_value(&local),
        _ => Ok(local),
    }
}
