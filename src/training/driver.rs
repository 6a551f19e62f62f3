//! The pod a [`ShardedOptimizer`](super::ShardedOptimizer) steps, one
//! process or this rank's part of a split pod: what differs between the two
//! (advancing time, whole-world operations) is decided here, so the
//! optimizer and its checkpoints read the same either way.

use bevy_ecs::world::World;

use crate::error::{OptimError, Result};
use crate::persist::WorldSnapshot;
use crate::pod::Pod;
use crate::pod::ranks::RankedPod;

/// The pod a sharded optimizer steps: all of it in this process, or this
/// rank's part of a pod split over ranks.
pub(super) enum Driver {
    /// The whole pod, in this process.
    One(Pod),
    /// This rank's part of a pod split over ranks.
    Ranked(RankedPod),
}

impl Driver {
    pub(super) fn pod(&self) -> &Pod {
        match self {
            Driver::One(pod) => pod,
            Driver::Ranked(ranked) => ranked.pod(),
        }
    }

    pub(super) fn pod_mut(&mut self) -> &mut Pod {
        match self {
            Driver::One(pod) => pod,
            Driver::Ranked(ranked) => ranked.pod_mut(),
        }
    }

    pub(super) fn world(&self) -> &bevy_ecs::world::World {
        self.pod().world()
    }

    pub(super) fn world_mut(&mut self) -> &mut bevy_ecs::world::World {
        self.pod_mut().world_mut()
    }

    pub(super) fn clock(&self) -> &crate::clock::SimClock {
        self.pod().clock()
    }

    /// Advances to simulated time `until_ns` exactly, or until `done`
    /// holds; in one process idle ticks are skipped (bit for bit the same
    /// world), so waiting out a long recovery — a cube swap's seconds at
    /// microsecond ticks — costs only the ticks where something happens.
    /// A split pod steps every tick in lockstep (its exact stops, a step's
    /// end or a recovery's, are the same on every rank).
    pub(super) fn advance_until(
        &mut self,
        until_ns: u64,
        mut done: impl FnMut(&World) -> bool,
    ) -> Result<()> {
        match self {
            Driver::One(pod) => pod.advance_until(until_ns, done).map(|_| ()),
            Driver::Ranked(ranked) => {
                // The host's target is an exact stop, as in one process:
                // the last tick ends at `until_ns`, on a boundary or not.
                fn set_target(ranked: &mut RankedPod, target: Option<u64>) -> Option<u64> {
                    let world = ranked.pod_mut().world_mut();
                    let mut stops = world.resource_mut::<crate::clock::ExactStops>();
                    std::mem::replace(&mut stops.host_ns, target)
                }
                let previous = set_target(ranked, Some(until_ns));
                let mut stepped = Ok(());
                while ranked.pod().clock().now_ns < until_ns && !done(ranked.pod().world()) {
                    stepped = ranked.step().map(|_| ());
                    if stepped.is_err() {
                        break;
                    }
                }
                set_target(ranked, previous);
                stepped
            }
        }
    }

    pub(super) fn snapshot(&mut self) -> Result<WorldSnapshot> {
        self.whole("a snapshot")?;
        self.pod_mut().snapshot()
    }

    pub(super) fn restore_snapshot(&mut self, snapshot: &WorldSnapshot) -> Result<()> {
        self.whole("restoring a snapshot")?;
        self.pod_mut().restore_snapshot(snapshot)
    }

    /// Refuses what needs the whole world in this process.
    pub(super) fn whole(&self, operation: &str) -> Result<()> {
        match self {
            Driver::One(_) => Ok(()),
            Driver::Ranked(ranked) => Err(OptimError::from(crate::error::Unsupported {
                operation: format!("{operation} of a sharded optimizer split over ranks"),
                reason: format!(
                    "rank {} holds only its devices' state shards; gather the world on rank 0 \
                     (`ranked_mut().gather()`) or write a split checkpoint \
                     (`ranked_mut().save_checkpoint(..)`)",
                    ranked.layout().rank()
                ),
            })),
        }
    }
}
