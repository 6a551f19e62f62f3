//! Barriers as entities, progressed by systems in simulated time.
//!
//! A barrier has a name, participants (device ids), a generation and a
//! deadline: the timeout it was created with, or [`DEFAULT_TIMEOUT_NS`]
//! (60 s of simulated time) when it was created without one. Participants arrive by sending a control message to the
//! coordination service ([`arrive`], or automatically for barriers created
//! with `auto_arrive`: every running participant arrives as soon as it sees the
//! barrier, a paused one when it resumes, a killed one never). The barrier
//! **completes** when every participant's arrival has been delivered. It
//! **fails** — it never hangs — when a participant that has not arrived is
//! declared failed by the detector, or when its deadline passes; the failure
//! says how many of how many arrived and names up to three stragglers (the
//! participants that never sent an arrival; arrivals sent but still in
//! flight are counted apart). Every barrier therefore finishes by its
//! deadline at the latest, so a wait on it is bounded.
//! Reusing a finished barrier's name starts its next generation; arrivals
//! stamped with an older generation are ignored.

mod error;

use crate::clock::{NextEvent, SimClock, SimDuration};
use crate::health::Excluded;
use crate::health::{DeviceState, FailureEpoch, Health, HeartbeatConfig};
use crate::rng::{SimRng, stream};
use crate::schedule::{Step, StepSystems};
use crate::topology::{DeviceId, DeviceIndex};
use crate::transport::{Inbox, Payload, Transport};
use bevy_ecs::prelude::*;
use bevy_ecs::schedule::Schedules;
pub use error::BarrierError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// The deadline of a barrier created without a timeout: 60 s of simulated
/// time after its creation (the [`crate::coordination::PodConfig`] default
/// barrier timeout). A participant that never arrives therefore fails the
/// barrier by then at the latest, even when it stays healthy.
pub const DEFAULT_TIMEOUT_NS: u64 = 60_000_000_000;

/// A barrier over a set of devices.
#[derive(Component, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Barrier {
    /// Name, unique in the pod.
    pub name: String,
    /// Dense id (index in the [`BarrierRegistry`]).
    pub id: u64,
    /// Generation; bumped each time the name is reused.
    pub generation: u64,
    /// Participants, sorted by id.
    pub participants: Vec<DeviceId>,
    /// When this generation started, ns.
    pub started_at_ns: u64,
    /// Fail if not complete by then, ns. Set on every barrier this crate
    /// creates ([`DEFAULT_TIMEOUT_NS`] when no timeout is given); `None`
    /// only in worlds restored from checkpoints written before that rule,
    /// where the default applies from `started_at_ns`.
    pub deadline_ns: Option<u64>,
    /// Whether running participants arrive by themselves.
    pub auto_arrive: bool,
}

impl Barrier {
    /// When the barrier fails unless complete, ns.
    pub fn deadline(&self) -> u64 {
        self.deadline_ns
            .unwrap_or_else(|| self.started_at_ns.saturating_add(DEFAULT_TIMEOUT_NS))
    }

    /// When this generation started.
    pub fn started_at(&self) -> SimDuration {
        SimDuration::from_nanos(self.started_at_ns)
    }

    /// When the barrier fails unless complete ([`Barrier::deadline`]).
    pub fn deadline_at(&self) -> SimDuration {
        SimDuration::from_nanos(self.deadline())
    }

    /// The index of a participant, if it is one.
    pub fn participant_index(&self, device: DeviceId) -> Option<usize> {
        self.participants.binary_search(&device).ok()
    }
}

/// Who has sent and whose arrival has been delivered.
#[derive(Component, Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BarrierArrivals {
    /// Per participant: arrival delivered.
    pub arrived: Vec<bool>,
    /// Arrivals delivered.
    pub count: u32,
    /// Per participant: arrival sent (automatic arrivals).
    pub sent: Vec<bool>,
    /// Participants that have not sent yet.
    pub unsent: u32,
    /// The failure epoch last checked for failed participants.
    pub checked_epoch: u64,
    /// Arrival messages from devices that are not participants.
    pub rejected: u32,
}

/// Why a barrier failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BarrierFailureReason {
    /// A participant that had not arrived was declared failed.
    ParticipantFailed(DeviceId),
    /// The deadline passed.
    DeadlineExceeded,
}

/// A failed barrier: who arrived and who did not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BarrierFailure {
    /// Barrier name.
    pub name: String,
    /// Generation that failed.
    pub generation: u64,
    /// When, ns.
    pub at_ns: u64,
    /// Arrivals delivered.
    pub arrived: u32,
    /// Participants.
    pub participants: u32,
    /// Participants that never sent an arrival, by id (an arrival sent
    /// but still in flight when the barrier failed is not a straggler's).
    pub stragglers: Vec<DeviceId>,
    /// Why.
    pub reason: BarrierFailureReason,
}

impl BarrierFailure {
    /// When the barrier failed.
    pub fn at(&self) -> SimDuration {
        SimDuration::from_nanos(self.at_ns)
    }
}

impl fmt::Display for BarrierFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "barrier `{}` (generation {}) failed at t={:.3} s: {}/{} arrived",
            self.name,
            self.generation,
            self.at_ns as f64 * 1e-9,
            self.arrived,
            self.participants
        )?;
        let in_flight = self
            .participants
            .saturating_sub(self.arrived)
            .saturating_sub(self.stragglers.len() as u32);
        if in_flight > 0 {
            write!(f, " ({in_flight} more in flight)")?;
        }
        match &self.reason {
            BarrierFailureReason::ParticipantFailed(device) => {
                write!(f, "; participant {device} failed")?
            }
            BarrierFailureReason::DeadlineExceeded => write!(f, "; deadline exceeded")?,
        }
        if self.stragglers.is_empty() {
            return Ok(());
        }
        let shown: Vec<String> = self
            .stragglers
            .iter()
            .take(3)
            .map(|d| d.0.to_string())
            .collect();
        write!(f, "; stragglers: device {}", shown.join(", "))?;
        if self.stragglers.len() > 3 {
            write!(f, " and {} more", self.stragglers.len() - 3)?;
        }
        Ok(())
    }
}

/// Where a barrier stands.
#[derive(Component, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BarrierOutcome {
    /// Waiting for arrivals.
    Pending,
    /// Everyone arrived.
    Completed {
        /// When the last arrival was delivered, ns.
        at_ns: u64,
    },
    /// See the failure.
    Failed(BarrierFailure),
}

impl BarrierOutcome {
    /// When the barrier completed or failed; `None` while it is pending.
    pub fn finished_at(&self) -> Option<SimDuration> {
        match self {
            BarrierOutcome::Pending => None,
            BarrierOutcome::Completed { at_ns } => Some(SimDuration::from_nanos(*at_ns)),
            BarrierOutcome::Failed(failure) => Some(failure.at()),
        }
    }
}

/// Marks a barrier whose outcome is still [`BarrierOutcome::Pending`], so the
/// barrier systems touch only live barriers, however many have finished.
#[derive(Component, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingBarrier;

/// Barrier entities by id and by name.
#[derive(Resource, Debug, Clone, Default)]
pub struct BarrierRegistry {
    /// Entity of each barrier id.
    pub by_id: Vec<Entity>,
    /// Id of each name.
    pub by_name: BTreeMap<String, u64>,
}

/// A barrier to create, named at the call site:
/// `BarrierSpec::named("step-0").auto_arrive()` instead of
/// `("step-0", None, None, true)`. By default every device not
/// [`Excluded`] takes part, arrivals are the host's ([`arrive`]) and the
/// barrier fails [`DEFAULT_TIMEOUT_NS`] (60 s of simulated time) after its
/// creation. A name alone converts, so `pod.create_barrier("step-0")` is
/// that default barrier.
///
/// ```
/// use optirs_tpu::barrier::{BarrierOutcome, BarrierSpec};
/// use optirs_tpu::clock::SimDuration;
/// use optirs_tpu::Pod;
///
/// let mut pod = Pod::from_preset("v5e-16")?;
/// let id = pod.create_barrier(
///     BarrierSpec::named("step-0")
///         .participants([0, 1, 2, 3])
///         .timeout(SimDuration::from_secs(5))
///         .auto_arrive(),
/// )?;
/// assert!(matches!(pod.wait_for_barrier(id)?, BarrierOutcome::Completed { .. }));
/// # Ok::<(), optirs_tpu::OptimError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BarrierSpec {
    name: String,
    participants: Option<Vec<DeviceId>>,
    timeout: Option<SimDuration>,
    auto_arrive: bool,
}

impl BarrierSpec {
    /// A barrier over every device, arrived at by the host, with the
    /// default timeout.
    pub fn named(name: impl Into<String>) -> BarrierSpec {
        BarrierSpec {
            name: name.into(),
            participants: None,
            timeout: None,
            auto_arrive: false,
        }
    }

    /// Only these devices take part (ids or bare numbers; order and
    /// repeats do not matter).
    pub fn participants(
        mut self,
        devices: impl IntoIterator<Item = impl Into<DeviceId>>,
    ) -> BarrierSpec {
        self.participants = Some(devices.into_iter().map(Into::into).collect());
        self
    }

    /// Fails the barrier this long after its creation instead of after
    /// [`DEFAULT_TIMEOUT_NS`] (a bare `u64` is nanoseconds).
    pub fn timeout(mut self, timeout: impl Into<SimDuration>) -> BarrierSpec {
        self.timeout = Some(timeout.into());
        self
    }

    /// Running participants arrive by themselves (a paused one when it
    /// resumes, a killed one never).
    pub fn auto_arrive(mut self) -> BarrierSpec {
        self.auto_arrive = true;
        self
    }

    /// The barrier's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Creates the barrier (or its next generation) in `world`, as
    /// [`create_barrier`]. Returns its id.
    pub fn create(self, world: &mut World) -> Result<u64, BarrierError> {
        create_barrier(
            world,
            &self.name,
            self.participants,
            self.timeout.map(SimDuration::as_nanos),
            self.auto_arrive,
        )
    }
}

impl From<&str> for BarrierSpec {
    fn from(name: &str) -> BarrierSpec {
        BarrierSpec::named(name)
    }
}

impl From<String> for BarrierSpec {
    fn from(name: String) -> BarrierSpec {
        BarrierSpec::named(name)
    }
}

/// Creates (or starts the next generation of) a barrier. `participants`
/// `None` means every device not [`Excluded`] after a failure. The barrier
/// fails `timeout_ns` after now, or [`DEFAULT_TIMEOUT_NS`] after now when
/// `timeout_ns` is `None`. Returns its id.
pub fn create_barrier(
    world: &mut World,
    name: &str,
    participants: Option<Vec<DeviceId>>,
    timeout_ns: Option<u64>,
    auto_arrive: bool,
) -> Result<u64, BarrierError> {
    let devices = world.resource::<DeviceIndex>().0.len() as u32;
    let mut participants = match participants {
        Some(participants) => participants,
        None => world
            .query_filtered::<&crate::topology::Device, Without<Excluded>>()
            .iter(world)
            .map(|device| device.id)
            .collect(),
    };
    participants.sort();
    participants.dedup();
    if participants.is_empty() {
        return Err(BarrierError::NoParticipants(name.to_string()));
    }
    if let Some(&unknown) = participants.iter().find(|d| d.0 >= devices) {
        return Err(BarrierError::UnknownDevice(unknown));
    }
    let now = world.resource::<SimClock>().now_ns;
    let n = participants.len();
    let arrivals = BarrierArrivals {
        arrived: vec![false; n],
        count: 0,
        sent: vec![false; n],
        unsent: if auto_arrive { n as u32 } else { 0 },
        checked_epoch: u64::MAX,
        rejected: 0,
    };
    let existing = world
        .resource::<BarrierRegistry>()
        .by_name
        .get(name)
        .copied();
    let (id, generation) = match existing {
        Some(id) => {
            let entity = world.resource::<BarrierRegistry>().by_id[id as usize];
            if world.get::<BarrierOutcome>(entity) == Some(&BarrierOutcome::Pending) {
                return Err(BarrierError::StillPending(name.to_string()));
            }
            let generation = world.get::<Barrier>(entity).map_or(0, |b| b.generation + 1);
            (id, generation)
        }
        None => (world.resource::<BarrierRegistry>().by_id.len() as u64, 0),
    };
    let barrier = Barrier {
        name: name.to_string(),
        id,
        generation,
        participants,
        started_at_ns: now,
        deadline_ns: Some(now.saturating_add(timeout_ns.unwrap_or(DEFAULT_TIMEOUT_NS))),
        auto_arrive,
    };
    match existing {
        Some(id) => {
            let entity = world.resource::<BarrierRegistry>().by_id[id as usize];
            world.entity_mut(entity).insert((
                barrier,
                arrivals,
                BarrierOutcome::Pending,
                PendingBarrier,
            ));
        }
        None => {
            let entity = world
                .spawn((barrier, arrivals, BarrierOutcome::Pending, PendingBarrier))
                .id();
            let mut registry = world.resource_mut::<BarrierRegistry>();
            registry.by_id.push(entity);
            registry.by_name.insert(name.to_string(), id);
        }
    }
    Ok(id)
}

/// A participant arrives: its arrival travels to the coordination service
/// over the control network. Non-participants are rejected.
pub fn arrive(world: &mut World, barrier_id: u64, device: DeviceId) -> Result<(), BarrierError> {
    let entity = *world
        .resource::<BarrierRegistry>()
        .by_id
        .get(barrier_id as usize)
        .ok_or(BarrierError::UnknownBarrier(barrier_id))?;
    let barrier = world
        .get::<Barrier>(entity)
        .expect("registered barriers exist")
        .clone();
    let Some(index) = barrier.participant_index(device) else {
        return Err(BarrierError::NotParticipant {
            barrier: barrier.name,
            device,
        });
    };
    if world.get::<BarrierOutcome>(entity) != Some(&BarrierOutcome::Pending) {
        return Err(BarrierError::NotPending(barrier.name));
    }
    let device_entity = world
        .resource::<DeviceIndex>()
        .get(device)
        .ok_or(BarrierError::UnknownDevice(device))?;
    if world.get::<DeviceState>(device_entity) != Some(&DeviceState::Running) {
        return Err(BarrierError::DeviceNotRunning(device));
    }
    let latency = world.resource::<HeartbeatConfig>().control_latency_ns;
    let now = world.resource::<SimClock>().now_ns;
    let mut arrivals = world
        .get_mut::<BarrierArrivals>(entity)
        .expect("barriers have arrivals");
    if !arrivals.sent[index] {
        arrivals.sent[index] = true;
        arrivals.unsent = arrivals.unsent.saturating_sub(1);
    }
    world.resource_mut::<Transport>().send_control(
        device,
        Payload::BarrierArrival {
            barrier: barrier_id,
            generation: barrier.generation,
        },
        now,
        latency,
    );
    Ok(())
}

/// Running participants of automatic barriers send their arrivals, barrier
/// by barrier in id order and participant by participant in id order.
pub fn send_automatic_arrivals(
    clock: Res<SimClock>,
    config: Res<HeartbeatConfig>,
    index: Res<DeviceIndex>,
    rng: Res<SimRng>,
    mut transport: ResMut<Transport>,
    mut barriers: Query<(&Barrier, &mut BarrierArrivals), With<PendingBarrier>>,
    devices: Query<(&DeviceState, &crate::health::ControlJitter)>,
) {
    let mut live: Vec<(&Barrier, Mut<BarrierArrivals>)> = barriers
        .iter_mut()
        .filter(|(barrier, arrivals)| barrier.auto_arrive && arrivals.unsent > 0)
        .collect();
    live.sort_unstable_by_key(|(barrier, _)| barrier.id);
    for (barrier, mut arrivals) in live {
        let arrivals = &mut *arrivals;
        for (i, &device) in barrier.participants.iter().enumerate() {
            if arrivals.sent[i] {
                continue;
            }
            let Some(entity) = index.get(device) else {
                continue;
            };
            let Ok((state, jitter)) = devices.get(entity) else {
                continue;
            };
            if !state.is_running() {
                continue;
            }
            arrivals.sent[i] = true;
            arrivals.unsent -= 1;
            let key = [barrier.id << 32 | u64::from(device.0), barrier.generation];
            let jitter = rng.up_to(jitter.jitter_ns, stream::BARRIER_ARRIVAL, key);
            transport.send_control(
                device,
                Payload::BarrierArrival {
                    barrier: barrier.id,
                    generation: barrier.generation,
                },
                clock.now_ns,
                config.control_latency_ns + jitter,
            );
        }
    }
}

/// The coordination service records the arrivals delivered this tick.
pub fn collect_arrivals(
    inbox: Res<Inbox>,
    registry: Res<BarrierRegistry>,
    mut barriers: Query<(&Barrier, &mut BarrierArrivals, &BarrierOutcome)>,
) {
    for message in &inbox.messages {
        let Payload::BarrierArrival {
            barrier,
            generation,
        } = message.payload
        else {
            continue;
        };
        let Some(&entity) = registry.by_id.get(barrier as usize) else {
            continue;
        };
        let Ok((barrier, mut arrivals, outcome)) = barriers.get_mut(entity) else {
            continue;
        };
        if barrier.generation != generation || *outcome != BarrierOutcome::Pending {
            continue;
        }
        match barrier.participant_index(message.from) {
            Some(i) if !arrivals.arrived[i] => {
                arrivals.arrived[i] = true;
                arrivals.count += 1;
            }
            Some(_) => {}
            None => arrivals.rejected += 1,
        }
    }
}

/// Completes barriers whose participants all arrived; fails those with a
/// failed straggler or a passed deadline.
pub fn progress_barriers(
    clock: Res<SimClock>,
    epoch: Res<FailureEpoch>,
    index: Res<DeviceIndex>,
    health: Query<&Health>,
    mut barriers: Query<
        (Entity, &Barrier, &mut BarrierArrivals, &mut BarrierOutcome),
        With<PendingBarrier>,
    >,
    mut commands: Commands,
) {
    let now = clock.now_ns;
    for (entity, barrier, mut arrivals, mut outcome) in &mut barriers {
        let n = barrier.participants.len() as u32;
        if arrivals.count == n {
            *outcome = BarrierOutcome::Completed { at_ns: now };
            commands.entity(entity).remove::<PendingBarrier>();
            continue;
        }
        let mut reason = None;
        if arrivals.checked_epoch != epoch.0 {
            arrivals.checked_epoch = epoch.0;
            reason = barrier
                .participants
                .iter()
                .zip(&arrivals.arrived)
                .filter(|&(_, &arrived)| !arrived)
                .map(|(&device, _)| device)
                .find(|&device| {
                    index
                        .get(device)
                        .and_then(|e| health.get(e).ok())
                        .is_some_and(Health::is_failed)
                })
                .map(BarrierFailureReason::ParticipantFailed);
        }
        if reason.is_none() && now >= barrier.deadline() {
            reason = Some(BarrierFailureReason::DeadlineExceeded);
        }
        if let Some(reason) = reason {
            let stragglers = barrier
                .participants
                .iter()
                .zip(arrivals.arrived.iter().zip(&arrivals.sent))
                .filter(|&(_, (&arrived, &sent))| !arrived && !sent)
                .map(|(&device, _)| device)
                .collect();
            *outcome = BarrierOutcome::Failed(BarrierFailure {
                name: barrier.name.clone(),
                generation: barrier.generation,
                at_ns: now,
                arrived: arrivals.count,
                participants: n,
                stragglers,
                reason,
            });
            commands.entity(entity).remove::<PendingBarrier>();
        }
    }
}

/// Installs barriers: the registry and the systems in [`StepSystems::Barriers`].
pub fn install(world: &mut World) {
    world.init_resource::<BarrierRegistry>();
    world.resource_mut::<Schedules>().add_systems(
        Step,
        (send_automatic_arrivals, collect_arrivals, progress_barriers)
            .chain()
            .in_set(StepSystems::Barriers),
    );
}

/// When the barrier systems next change the world: never while no barrier
/// is pending; unknown (every tick) while one is, since arrivals, failures
/// and deadlines all move it.
pub fn next_event(world: &mut World) -> NextEvent {
    let mut pending = world.query_filtered::<(), With<PendingBarrier>>();
    if pending.iter(world).next().is_some() {
        NextEvent::Unknown
    } else {
        NextEvent::Never
    }
}
