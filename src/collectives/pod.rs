//! Collectives on a pod's devices, following its topology.
//!
//! [`launch_all_reduce`] and [`launch_ring`] (wrapped by `Pod::all_reduce`
//! and friends) move the real data at once (the CPU does
//! the work, in parallel), charge every transfer to the [`Link`] entity it
//! crosses, in the direction it crosses it, and start a [`Collective`]
//! entity whose completion time comes from an alpha-beta model of each
//! link it used. The [`progress_collectives`] system, in
//! `StepSystems::Collectives`, completes it when simulated time reaches
//! that point if every participant is still alive then; it fails it when a
//! participant is declared failed first, or, at that point, when a
//! participant was killed before it (even if the detector has not noticed
//! yet). The blocking forms step the pod until then, like a host waiting on
//! a collective: every wait ends by the completion time (plus one tick),
//! with the result or an error naming the device.
//!
//! The launch computes the result into the buffers at once; it is the
//! collective's result only once the collective has completed. When it
//! fails, the buffers hold a result the pod never delivered: treat them as
//! undefined (as after a failed NCCL collective) and restore them from a
//! checkpoint or recompute.
//!
//! All-reduce runs the torus algorithm along every axis of the slice
//! (rings laid along torus dimensions); reduce-scatter, all-gather and
//! broadcast run on a ring that snakes through the torus, so every hop is
//! one link. On a multislice pod, all-reduce and [`launch_multislice`]'s
//! reduce-scatter and all-gather are hierarchical (ICI inside each slice,
//! then DCN across over the fabric's link entities; see
//! [`crate::collectives::multislice`]); a snake ring or a broadcast across
//! slices is refused. Buffers are indexed by device id.

use super::{
    CollectiveError, Element, LinkModel, MultisliceShape, PassSummary, ReduceOp, TorusShape,
    Traffic, multislice_all_gather, multislice_all_reduce, multislice_reduce_scatter,
    multislice_shard_ranges, torus_all_reduce,
};
use crate::clock::{NextEvent, SimClock};
use crate::health::{DeviceState, Health};
use crate::schedule::{CollectiveSystems, Step};
use crate::topology::{Device, DeviceId, DeviceIndex, Link, LinkTraffic};
use crate::topology::{PodTopology, Topology};
use crate::transport::LinkState;
use bevy_ecs::prelude::*;
use bevy_ecs::schedule::Schedules;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Which collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CollectiveKind {
    /// Reduce, then everyone holds the result.
    AllReduce,
    /// Reduce; rank `i` of the ring holds chunk `i` of the result.
    ReduceScatter,
    /// Everyone holds every rank's chunk.
    AllGather,
    /// The root's buffer is copied to everyone.
    Broadcast,
}

/// A collective in flight or finished.
#[derive(Component, Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Collective {
    /// Which collective.
    pub kind: CollectiveKind,
    /// Bytes per rank.
    pub bytes: u64,
    /// Participating devices, sorted.
    pub participants: Vec<DeviceId>,
    /// Simulated launch time, ns.
    pub launched_at_ns: u64,
    /// Simulated completion time from the link model, ns.
    pub completes_at_ns: u64,
}

/// Where a collective stands.
#[derive(Component, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CollectiveOutcome {
    /// Data in flight on the links.
    Pending,
    /// Every participant holds its result.
    Completed {
        /// When, ns.
        at_ns: u64,
    },
    /// A participant failed before completion.
    Failed {
        /// When, ns.
        at_ns: u64,
        /// The failed participant.
        device: DeviceId,
    },
}

/// What a collective did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CollectiveReport {
    /// The collective entity.
    #[serde(skip)]
    pub entity: Entity,
    /// Which collective.
    pub kind: CollectiveKind,
    /// Bytes per rank.
    pub bytes: u64,
    /// Bytes over all links.
    pub link_bytes: u64,
    /// Links used.
    pub links_used: usize,
    /// Modeled duration on the pod's links, seconds.
    pub modeled_seconds: f64,
    /// Simulated launch time, ns.
    pub launched_at_ns: u64,
    /// Simulated completion time, ns.
    pub completes_at_ns: u64,
    /// Every pass (ICI axes, and the DCN pass of a multislice pod) with its
    /// bytes and its modeled span on the charged links.
    pub passes: Vec<PassSummary>,
}

/// Completes collectives whose time has come; fails those with a
/// participant declared failed, and at their completion time those with a
/// participant killed before it (the data it was to send or receive never
/// moved, whether or not the detector has noticed yet). A collective
/// completes only if every participant stayed alive until its completion
/// time.
pub fn progress_collectives(world: &mut World) {
    let mut pending = world.query::<(&Collective, &CollectiveOutcome)>();
    let mut participants: Vec<DeviceId> = pending
        .iter(world)
        .filter(|(_, o)| **o == CollectiveOutcome::Pending)
        .flat_map(|(c, _)| c.participants.iter().copied())
        .collect();
    if participants.is_empty() {
        return;
    }
    participants.sort_unstable();
    participants.dedup();
    // Rank 0's detector's view on a pod split over ranks, so every rank
    // fails a collective alike.
    let failed = match crate::health::declared_failed(world, &participants) {
        Ok(failed) => failed,
        Err(e) => {
            world
                .resource_mut::<crate::transport::Network>()
                .fail(crate::transport::TransportError::Cluster(e));
            return;
        }
    };
    let now = world.resource::<SimClock>().now_ns;
    let index = world.resource::<DeviceIndex>().clone();
    let killed: Vec<(DeviceId, u64)> = participants
        .iter()
        .filter_map(
            |&d| match index.get(d).and_then(|e| world.get::<DeviceState>(e)) {
                Some(DeviceState::Killed { at_ns }) => Some((d, *at_ns)),
                _ => None,
            },
        )
        .collect();
    let mut collectives = world.query::<(&Collective, &mut CollectiveOutcome)>();
    for (collective, mut outcome) in collectives.iter_mut(world) {
        if *outcome != CollectiveOutcome::Pending {
            continue;
        }
        let declared = collective
            .participants
            .iter()
            .copied()
            .find(|d| failed.contains(d));
        let done = now >= collective.completes_at_ns;
        let died = || {
            collective.participants.iter().copied().find(|d| {
                killed
                    .iter()
                    .any(|(k, at)| k == d && *at < collective.completes_at_ns)
            })
        };
        if let Some(device) = declared.or_else(|| done.then(died).flatten()) {
            *outcome = CollectiveOutcome::Failed { at_ns: now, device };
        } else if done {
            *outcome = CollectiveOutcome::Completed { at_ns: now };
        }
    }
}

/// The earliest time [`progress_collectives`] changes the world: the
/// completion time of the first pending collective. A participant declared
/// failed fails it at once, so one already failed makes it due now; a
/// failure declared later happens on a tick the detector is due anyway.
pub fn next_event(world: &mut World) -> NextEvent {
    let mut outcomes = world.query::<&CollectiveOutcome>();
    if !outcomes
        .iter(world)
        .any(|o| *o == CollectiveOutcome::Pending)
    {
        return NextEvent::Never;
    }
    let failed: Vec<DeviceId> = world
        .query::<(&Device, &Health)>()
        .iter(world)
        .filter(|(_, health)| health.is_failed())
        .map(|(device, _)| device.id)
        .collect();
    let mut next = NextEvent::Never;
    let mut collectives = world.query::<(&Collective, &CollectiveOutcome)>();
    for (collective, outcome) in collectives.iter(world) {
        if *outcome != CollectiveOutcome::Pending {
            continue;
        }
        if collective.participants.iter().any(|d| failed.contains(d)) {
            return NextEvent::Unknown;
        }
        next = next.min(NextEvent::At(collective.completes_at_ns));
    }
    next
}

/// Installs [`progress_collectives`] in [`CollectiveSystems::Progress`],
/// first in `StepSystems::Collectives`.
pub fn install(world: &mut World) {
    world.resource_mut::<Schedules>().add_systems(
        Step,
        progress_collectives.in_set(CollectiveSystems::Progress),
    );
}

/// The single slice's torus (collectives on one torus run within one
/// slice; a multislice pod has [`multislice_of`]).
pub fn torus_of(topology: &Topology) -> Result<TorusShape, CollectiveError> {
    if topology.slices != 1 {
        return Err(CollectiveError::AcrossSlices {
            pod: topology.name.clone(),
            slices: topology.slices,
            what: "a collective over one torus (the snake ring's reduce-scatter, all-gather, \
                   broadcast)"
                .into(),
        });
    }
    slice_torus(topology)
}

/// One slice's torus, whatever the slice count: the shape every
/// collective, the sharded step and its closed form lay their rings on.
pub fn slice_torus(topology: &Topology) -> Result<TorusShape, CollectiveError> {
    let n = topology.ndims;
    let dims: Vec<usize> = topology.dims[..n].iter().map(|&d| d as usize).collect();
    // A twisted wraparound link does not close its axis's ring (it lands in
    // another plane), so a twisted axis runs two-way lines over the links
    // that exist, at a ring's bytes and steps (`RingRoute::line_messages`).
    let wrap: Vec<bool> = (0..n)
        .map(|a| topology.wraparound[a] && topology.dims[a] >= 3 && topology.twist[a] == [0; 3])
        .collect();
    TorusShape::new(&dims, &wrap)
}

/// A multislice pod's shape for the hierarchical collectives
/// ([`crate::collectives::multislice`]): its slice's torus, its slices, and
/// each chip's host NIC chip (the host's first chip, where the DCN fabric
/// meets it). Needs 2 or more slices and the fabric.
pub fn multislice_of(topology: &Topology) -> Result<MultisliceShape, CollectiveError> {
    if topology.slices < 2 {
        return Err(CollectiveError::InvalidMultislice {
            dims: topology.dims.iter().map(|&d| d as usize).collect(),
            slices: topology.slices as usize,
            reason: format!("`{}` is one slice: use its torus", topology.name),
        });
    }
    if topology.dcn_fabric.is_none() {
        return Err(CollectiveError::NoFabric {
            pod: topology.name.clone(),
            slices: topology.slices,
        });
    }
    let slice = slice_torus(topology)?;
    let nic: Vec<usize> = (0..topology.chips_per_slice())
        .map(|local| topology.host_leader(0, topology.host_of(local)) as usize)
        .collect();
    MultisliceShape::new(&slice, topology.slices as usize, nic)
}

/// The participants of a collective over every device: `buffers` must be
/// one per device, and every device must be running and not failed.
pub fn check_participants(
    world: &mut World,
    buffers: usize,
) -> Result<Vec<DeviceId>, CollectiveError> {
    let topology = &world.resource::<PodTopology>().0;
    let devices = topology.num_devices() as usize;
    if buffers != devices {
        return Err(CollectiveError::DeviceBuffers {
            pod: topology.name.clone(),
            devices,
            buffers,
        });
    }
    let mut down: Vec<DeviceId> = world
        .query::<(&Device, &DeviceState, &Health)>()
        .iter(world)
        .filter(|(_, state, health)| !state.is_running() || health.is_failed())
        .map(|(device, _, _)| device.id)
        .collect();
    down.sort();
    if let Some(&device) = down.first() {
        return Err(CollectiveError::DeviceDown {
            device,
            down: down.len(),
        });
    }
    Ok((0..devices as u32).map(DeviceId).collect())
}

/// What [`charge_links`] charged: bytes over every link, the links used
/// (entities and their alpha-beta models, keyed by directed device pair).
#[derive(Debug, Clone, Default)]
pub struct LinkCharge {
    /// Bytes over all links.
    pub link_bytes: u64,
    /// The link entities used, in `(src, dst)` order, one per direction used.
    pub links: Vec<Entity>,
    /// The model of each directed hop used.
    pub models: HashMap<(usize, usize), LinkModel>,
}

impl LinkCharge {
    /// The traffic's modeled duration on the charged links.
    pub fn modeled_seconds(&self, traffic: &Traffic) -> f64 {
        traffic.modeled_seconds_by_link(|s, d| self.model(s, d))
    }

    /// The model of the hop `src → dst` (a zero-cost one if it was not used).
    pub fn model(&self, src: usize, dst: usize) -> LinkModel {
        self.models
            .get(&(src, dst))
            .copied()
            .unwrap_or_else(|| LinkModel::new(0.0, f64::MAX).expect("a zero-cost model is valid"))
    }
}

/// Charges `traffic` to the link entities it crosses, in the direction it
/// crosses them. Every link is checked first: a missing or cut link fails
/// before any counter moves.
pub fn charge_links(world: &mut World, traffic: &Traffic) -> Result<LinkCharge, CollectiveError> {
    let index = world.resource::<DeviceIndex>().clone();
    let mut links: HashMap<(Entity, Entity), Entity> = HashMap::new();
    for (entity, link) in world.query::<(Entity, &Link)>().iter(world) {
        links.insert((link.a, link.b), entity);
        links.insert((link.b, link.a), entity);
    }
    let per_link = traffic.per_link();
    let mut charge = LinkCharge::default();
    let mut charges = Vec::with_capacity(per_link.len());
    for (&(src, dst), &moved) in &per_link {
        let (a, b) = (
            index.get(DeviceId(src as u32)),
            index.get(DeviceId(dst as u32)),
        );
        let entity = a
            .zip(b)
            .and_then(|(a, b)| links.get(&(a, b)).copied())
            .ok_or(CollectiveError::NoLink { src, dst })?;
        if !world.get::<LinkState>(entity).is_none_or(|s| s.up) {
            return Err(CollectiveError::LinkCut { src, dst });
        }
        let link = *world.get::<Link>(entity).expect("links exist");
        let model = LinkModel::new(link.latency_ns as f64 * 1e-9, link.bytes_per_s)?;
        charge.models.insert((src, dst), model);
        charges.push((entity, a == Some(link.a), moved));
    }
    for (entity, forward, moved) in charges {
        let mut counters = world
            .get_mut::<LinkTraffic>(entity)
            .expect("links count traffic");
        if forward {
            counters.bytes_ab += moved;
        } else {
            counters.bytes_ba += moved;
        }
        counters.messages += 1;
        charge.link_bytes += moved;
        charge.links.push(entity);
    }
    Ok(charge)
}

/// Charges the traffic to the links and starts a [`Collective`]. Every
/// link is checked first: a missing or cut link fails the launch before
/// any counter moves.
pub fn launch(
    world: &mut World,
    kind: CollectiveKind,
    bytes: u64,
    participants: Vec<DeviceId>,
    traffic: &Traffic,
) -> Result<CollectiveReport, CollectiveError> {
    let charge = charge_links(world, traffic)?;
    let modeled_seconds = charge.modeled_seconds(traffic);
    let passes = traffic.passes(|s, d| charge.model(s, d));
    let launched_at_ns = world.resource::<SimClock>().now_ns;
    let completes_at_ns = launched_at_ns + (modeled_seconds * 1e9).ceil() as u64;
    let entity = world
        .spawn((
            Collective {
                kind,
                bytes,
                participants,
                launched_at_ns,
                completes_at_ns,
            },
            CollectiveOutcome::Pending,
        ))
        .id();
    Ok(CollectiveReport {
        entity,
        kind,
        bytes,
        link_bytes: charge.link_bytes,
        links_used: charge.models.len(),
        modeled_seconds,
        launched_at_ns,
        completes_at_ns,
        passes,
    })
}

/// Where a launched collective stands: `Ok(true)` completed, `Ok(false)`
/// still pending, an error if a participant failed or died first or the
/// collective no longer exists, and [`CollectiveError::Stalled`] if it is
/// still pending more than one tick past its completion time (its system
/// is not in the schedule), so a wait built on polling is bounded.
pub fn poll_collective(world: &World, report: &CollectiveReport) -> Result<bool, CollectiveError> {
    match world.get::<CollectiveOutcome>(report.entity) {
        Some(CollectiveOutcome::Pending) => {
            let clock = world.resource::<SimClock>();
            if clock.now_ns > report.completes_at_ns.saturating_add(clock.tick_ns) {
                return Err(CollectiveError::Stalled {
                    kind: report.kind,
                    completes_at_ns: report.completes_at_ns,
                    now_ns: clock.now_ns,
                });
            }
            Ok(false)
        }
        Some(CollectiveOutcome::Completed { .. }) => Ok(true),
        Some(&CollectiveOutcome::Failed { device, at_ns }) => {
            Err(CollectiveError::ParticipantFailed {
                kind: report.kind,
                at_ns,
                device,
            })
        }
        None => Err(CollectiveError::Vanished),
    }
}

/// Starts an all-reduce over every device (`buffers[i]` is device `i`'s):
/// the data is reduced now (torus algorithm along every axis; on a
/// multislice pod hierarchically, ICI inside each slice and DCN across);
/// the collective completes in simulated time.
pub fn launch_all_reduce<T: Element>(
    world: &mut World,
    buffers: &mut [Vec<T>],
    op: ReduceOp,
) -> Result<CollectiveReport, CollectiveError> {
    let participants = check_participants(world, buffers.len())?;
    let topology = &world.resource::<PodTopology>().0;
    let bytes = (buffers.first().map_or(0, Vec::len) * T::BYTES) as u64;
    let traffic = if topology.slices > 1 {
        let shape = multislice_of(topology)?;
        multislice_all_reduce(buffers, &shape, op)?
    } else {
        let shape = torus_of(topology)?;
        torus_all_reduce(buffers, &shape, op)?
    };
    launch(
        world,
        CollectiveKind::AllReduce,
        bytes,
        participants,
        &traffic,
    )
}

/// Starts a hierarchical reduce-scatter (`op`) or all-gather (`op` is
/// `None`) over every device of a multislice pod; returns the report and
/// each device's range ([`multislice_shard_ranges`]): the range it holds
/// reduced after the reduce-scatter, the range it contributes to the
/// all-gather.
pub fn launch_multislice<T: Element>(
    world: &mut World,
    buffers: &mut [Vec<T>],
    op: Option<ReduceOp>,
) -> Result<(CollectiveReport, Vec<std::ops::Range<usize>>), CollectiveError> {
    let participants = check_participants(world, buffers.len())?;
    let shape = multislice_of(&world.resource::<PodTopology>().0)?;
    let len = buffers.first().map_or(0, Vec::len);
    let (kind, traffic) = match op {
        Some(op) => (
            CollectiveKind::ReduceScatter,
            multislice_reduce_scatter(buffers, &shape, op)?,
        ),
        None => (
            CollectiveKind::AllGather,
            multislice_all_gather(buffers, &shape)?,
        ),
    };
    let bytes = (len * T::BYTES) as u64;
    let report = launch(world, kind, bytes, participants, &traffic)?;
    Ok((report, multislice_shard_ranges(&shape, len)))
}

/// Starts a ring collective over every device along the snake ring
/// through the torus (every hop one link); `run` moves the data.
pub fn launch_ring<T: Element>(
    world: &mut World,
    kind: CollectiveKind,
    buffers: &mut [Vec<T>],
    run: impl FnOnce(&mut [Vec<T>], &[usize]) -> Result<Traffic, CollectiveError>,
) -> Result<CollectiveReport, CollectiveError> {
    let participants = check_participants(world, buffers.len())?;
    let shape = torus_of(&world.resource::<PodTopology>().0)?;
    let ring = shape.snake_ring();
    let bytes = (buffers.first().map_or(0, Vec::len) * T::BYTES) as u64;
    let traffic = run(buffers, &ring)?.routed_on(&shape);
    launch(world, kind, bytes, participants, &traffic)
}
