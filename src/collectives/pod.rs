//! Collectives on a [`Pod`]'s devices, following its topology.
//!
//! [`Pod::all_reduce`] and friends move the real data at once (the CPU does
//! the work, in parallel), charge every transfer to the [`Link`] entity it
//! crosses, in the direction it crosses it, and start a [`Collective`]
//! entity whose completion time comes from an alpha-beta model of each
//! link it used. The [`progress_collectives`] system, in
//! [`StepSystems::Collectives`], completes it when simulated time reaches
//! that point, or fails it if a participant is declared failed first. The
//! blocking forms step the pod until then, like a host waiting on a
//! collective.
//!
//! All-reduce runs the torus algorithm along every axis of the slice
//! (rings laid along torus dimensions); reduce-scatter, all-gather and
//! broadcast run on a ring that snakes through the torus, so every hop is
//! one link. Buffers are indexed by device id.

use super::{
    CollectiveError, Element, LinkModel, ReduceOp, TorusShape, Traffic, all_gather, broadcast,
    reduce_scatter, torus_all_reduce,
};
use crate::clock::SimClock;
use crate::error::{OptimError, Result};
use crate::health::{DeviceState, Health};
use crate::pod::Pod;
use crate::schedule::{Step, StepSystems};
use crate::topology::{Device, DeviceId, DeviceIndex, Link, LinkTraffic};
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
}

/// Completes collectives whose time has come; fails those with a failed
/// participant.
pub fn progress_collectives(
    clock: Res<SimClock>,
    index: Res<DeviceIndex>,
    health: Query<&Health>,
    mut collectives: Query<(&Collective, &mut CollectiveOutcome)>,
) {
    for (collective, mut outcome) in &mut collectives {
        if *outcome != CollectiveOutcome::Pending {
            continue;
        }
        let failed = collective.participants.iter().copied().find(|&d| {
            index
                .get(d)
                .and_then(|e| health.get(e).ok())
                .is_some_and(Health::is_failed)
        });
        if let Some(device) = failed {
            *outcome = CollectiveOutcome::Failed {
                at_ns: clock.now_ns,
                device,
            };
        } else if clock.now_ns >= collective.completes_at_ns {
            *outcome = CollectiveOutcome::Completed {
                at_ns: clock.now_ns,
            };
        }
    }
}

/// Installs [`progress_collectives`] in [`StepSystems::Collectives`].
pub fn install(world: &mut World) {
    world
        .resource_mut::<Schedules>()
        .add_systems(Step, progress_collectives.in_set(StepSystems::Collectives));
}

fn collective_error(error: CollectiveError) -> OptimError {
    OptimError::InvalidConfig(format!("collective: {error}"))
}

/// The single slice's torus (collectives run within one slice).
fn torus_of(topology: &crate::topology::Topology) -> Result<TorusShape> {
    if topology.slices != 1 {
        return Err(OptimError::Unsupported {
            operation: "a collective across slices".into(),
            reason: format!(
                "`{}` has {} slices joined by DCN links, not one torus; run collectives per slice",
                topology.name, topology.slices
            ),
        });
    }
    let n = topology.ndims;
    let dims: Vec<usize> = topology.dims[..n].iter().map(|&d| d as usize).collect();
    let wrap: Vec<bool> = (0..n)
        .map(|a| topology.wraparound[a] && topology.dims[a] >= 3)
        .collect();
    TorusShape::new(&dims, &wrap).map_err(collective_error)
}

impl Pod {
    /// The pod's slice as a torus for the collectives.
    pub fn torus_shape(&self) -> Result<TorusShape> {
        torus_of(self.topology())
    }

    fn check_participants(&mut self, buffers: usize) -> Result<Vec<DeviceId>> {
        let devices = self.topology().num_devices() as usize;
        if buffers != devices {
            return Err(OptimError::InvalidConfig(format!(
                "collective: {} has {devices} devices but {buffers} buffers were passed (one per device, by id)",
                self.topology().name
            )));
        }
        let world = self.world_mut();
        let mut down: Vec<DeviceId> = world
            .query::<(&Device, &DeviceState, &Health)>()
            .iter(world)
            .filter(|(_, state, health)| !state.is_running() || health.is_failed())
            .map(|(device, _, _)| device.id)
            .collect();
        down.sort();
        if let Some(&first) = down.first() {
            return Err(OptimError::InvalidConfig(format!(
                "collective: {first} is not running or has failed ({} devices down); \
                 exclude it or roll back before launching collectives",
                down.len()
            )));
        }
        Ok((0..devices as u32).map(DeviceId).collect())
    }

    /// Charges the traffic to the links and starts a [`Collective`].
    fn launch(
        &mut self,
        kind: CollectiveKind,
        bytes: u64,
        participants: Vec<DeviceId>,
        traffic: &Traffic,
    ) -> Result<CollectiveReport> {
        let world = self.world_mut();
        let index = world.resource::<DeviceIndex>().clone();
        let mut links: HashMap<(Entity, Entity), Entity> = HashMap::new();
        for (entity, link) in world.query::<(Entity, &Link)>().iter(world) {
            links.insert((link.a, link.b), entity);
            links.insert((link.b, link.a), entity);
        }
        let per_link = traffic.per_link();
        let mut models: HashMap<(usize, usize), LinkModel> = HashMap::new();
        let mut link_bytes = 0u64;
        // Check every link first: a cut link fails the launch before any
        // counter moves.
        let mut charges = Vec::with_capacity(per_link.len());
        for (&(src, dst), &moved) in &per_link {
            let (a, b) = (
                index.get(DeviceId(src as u32)),
                index.get(DeviceId(dst as u32)),
            );
            let entity = a
                .zip(b)
                .and_then(|(a, b)| links.get(&(a, b)).copied())
                .ok_or_else(|| {
                    OptimError::InvalidConfig(format!(
                        "collective: no link joins device {src} and device {dst}"
                    ))
                })?;
            if !world.get::<LinkState>(entity).is_none_or(|s| s.up) {
                return Err(OptimError::InvalidConfig(format!(
                    "collective: the link between device {src} and device {dst} is cut"
                )));
            }
            let link = *world.get::<Link>(entity).expect("links exist");
            let model = LinkModel::new(link.latency_ns as f64 * 1e-9, link.bytes_per_s)
                .map_err(collective_error)?;
            models.insert((src, dst), model);
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
            link_bytes += moved;
        }
        let modeled_seconds = traffic.modeled_seconds_by_link(|s, d| {
            models.get(&(s, d)).copied().unwrap_or_else(|| {
                LinkModel::new(0.0, f64::MAX).expect("a zero-cost model is valid")
            })
        });
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
            link_bytes,
            links_used: per_link.len(),
            modeled_seconds,
            launched_at_ns,
            completes_at_ns,
        })
    }

    /// Steps until the collective completes; an error if a participant fails
    /// first.
    pub fn wait_for_collective(&mut self, report: &CollectiveReport) -> Result<()> {
        loop {
            match self.world().get::<CollectiveOutcome>(report.entity) {
                Some(CollectiveOutcome::Pending) => self.step(),
                Some(CollectiveOutcome::Completed { .. }) => return Ok(()),
                Some(CollectiveOutcome::Failed { device, at_ns }) => {
                    return Err(OptimError::InvalidConfig(format!(
                        "collective {:?} failed at t={:.3} s: participant {device} failed",
                        report.kind,
                        *at_ns as f64 * 1e-9
                    )));
                }
                None => {
                    return Err(OptimError::InvalidConfig(
                        "collective entity no longer exists (the world was restored)".into(),
                    ));
                }
            }
        }
    }

    /// Starts an all-reduce over every device (`buffers[i]` is device `i`'s):
    /// the data is reduced now; the collective completes in simulated time.
    pub fn launch_all_reduce<T: Element>(
        &mut self,
        buffers: &mut [Vec<T>],
        op: ReduceOp,
    ) -> Result<CollectiveReport> {
        let participants = self.check_participants(buffers.len())?;
        let shape = self.torus_shape()?;
        let bytes = (buffers.first().map_or(0, Vec::len) * T::BYTES) as u64;
        let traffic = torus_all_reduce(buffers, &shape, op).map_err(collective_error)?;
        self.launch(CollectiveKind::AllReduce, bytes, participants, &traffic)
    }

    /// All-reduce over every device, stepping the pod until it completes.
    pub fn all_reduce<T: Element>(
        &mut self,
        buffers: &mut [Vec<T>],
        op: ReduceOp,
    ) -> Result<CollectiveReport> {
        let report = self.launch_all_reduce(buffers, op)?;
        self.wait_for_collective(&report)?;
        Ok(report)
    }

    fn ring_collective<T: Element>(
        &mut self,
        kind: CollectiveKind,
        buffers: &mut [Vec<T>],
        run: impl FnOnce(&mut [Vec<T>], &[usize]) -> std::result::Result<Traffic, CollectiveError>,
    ) -> Result<CollectiveReport> {
        let participants = self.check_participants(buffers.len())?;
        let shape = self.torus_shape()?;
        let ring = shape.snake_ring();
        let bytes = (buffers.first().map_or(0, Vec::len) * T::BYTES) as u64;
        let traffic = run(buffers, &ring)
            .map_err(collective_error)?
            .routed_on(&shape);
        let report = self.launch(kind, bytes, participants, &traffic)?;
        self.wait_for_collective(&report)?;
        Ok(report)
    }

    /// Reduce-scatter over every device along the snake ring; returns the
    /// ring order (ring position `i` holds chunk `i`).
    pub fn reduce_scatter<T: Element>(
        &mut self,
        buffers: &mut [Vec<T>],
        op: ReduceOp,
    ) -> Result<(CollectiveReport, Vec<usize>)> {
        let ring = self.torus_shape()?.snake_ring();
        let report = self.ring_collective(CollectiveKind::ReduceScatter, buffers, |b, r| {
            reduce_scatter(b, r, op)
        })?;
        Ok((report, ring))
    }

    /// All-gather over every device along the snake ring.
    pub fn all_gather<T: Element>(&mut self, buffers: &mut [Vec<T>]) -> Result<CollectiveReport> {
        self.ring_collective(CollectiveKind::AllGather, buffers, |b, r| all_gather(b, r))
    }

    /// Broadcast device `root`'s buffer to every device.
    pub fn broadcast<T: Element>(
        &mut self,
        buffers: &mut [Vec<T>],
        root: u32,
    ) -> Result<CollectiveReport> {
        self.ring_collective(CollectiveKind::Broadcast, buffers, |b, r| {
            broadcast(b, r, root as usize)
        })
    }
}
