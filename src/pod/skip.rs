//! Time that skips idle ticks.
//!
//! A long simulated run is mostly ticks in which nothing happens: no
//! heartbeat is due, no message arrives, no fault is scheduled, no sample
//! or checkpoint is taken. [`Pod::run_skipping`] asks every domain when it
//! next changes the world ([`NextEvent`]), moves the clock straight to the
//! tick at which the earliest event is due, and runs that tick as usual.
//! The world it leaves is bit-identical (same [`Pod::world_sha256`]) to
//! [`Pod::run`] over the same ticks, because a skipped tick is one in which
//! every system would have changed nothing but [`SimClock`].
//!
//! The domains and what they report:
//!
//! | domain | next event |
//! |---|---|
//! | faults | the first scheduled fault |
//! | heartbeats | the earliest `Heartbeat::next_due_ns` |
//! | clock sync | the earliest `ClockSync::next_exchange_ns` |
//! | transport | the first in-flight message's delivery; unknown while the inbox holds the last tick's messages or a backend spans processes |
//! | failure detection | when a device's silence next crosses `suspect_after` or the timeout |
//! | barriers | unknown while one is pending |
//! | collectives | the first pending completion; unknown if a participant has failed |
//! | sharded step, recovery | unknown while a step is pending, unreleased or awaiting recovery |
//! | monitor | the next sample; unknown right after one |
//! | periodic checkpoints | the next tick that is a multiple of `every_ticks` |
//!
//! It is conservative: an unknown anywhere, or a `Step` schedule with
//! systems the engine did not install (the host's, or a profiler's), runs
//! one ordinary tick. An event that turns out to change nothing only costs
//! an ordinary tick; an event never reported would be skipped past, so a
//! domain that adds a time-driven system reports it in [`Pod::next_event`].
//!
//! ```
//! use optirs_tpu::pod::Pod;
//!
//! let mut ticked = Pod::from_preset("v4-16")?;
//! let mut skipped = Pod::from_preset("v4-16")?;
//! ticked.run(5_000);
//! let stats = skipped.run_skipping(5_000)?;
//! assert_eq!(stats.ticks(), 5_000);
//! assert!(stats.skipped > 0);
//! assert_eq!(ticked.world_sha256()?, skipped.world_sha256()?);
//! # Ok::<(), optirs_tpu::OptimError>(())
//! ```

use super::Pod;
use crate::clock::{ExactStops, NextEvent, SimClock, SimDuration, jump_clock};
use crate::error::Result;
use crate::schedule::Step;
use bevy_ecs::prelude::World;
use bevy_ecs::schedule::Schedules;

/// How a [`Pod::run_skipping`] run spent its ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SkipStats {
    /// Ticks run through the `Step` schedule to their boundary.
    pub stepped: u64,
    /// Runs of the `Step` schedule that ended at an exact stop inside a
    /// tick (a scheduled fault, a step's modeled end, the host's target).
    pub stops: u64,
    /// Idle ticks jumped over.
    pub skipped: u64,
    /// Jumps (runs of consecutive skipped ticks).
    pub jumps: u64,
}

impl SkipStats {
    /// Tick boundaries the clock crossed: stepped plus skipped.
    pub fn ticks(&self) -> u64 {
        self.stepped + self.skipped
    }
}

impl Pod {
    /// The earliest event of any domain (see the [module docs](self)):
    /// ticks whose `now_ns` is before it change nothing but the clock.
    /// Once some event is due by the next tick the search stops (nothing
    /// can be skipped), so the time returned then may not be the earliest.
    /// [`NextEvent::Unknown`] when any domain cannot say, or the `Step`
    /// schedule holds systems the engine did not install.
    pub fn next_event(&mut self) -> NextEvent {
        let systems = self
            .world
            .resource::<Schedules>()
            .get(Step)
            .map(|s| s.systems_len());
        if systems != Some(self.engine_systems) {
            return NextEvent::Unknown;
        }
        // Cheapest first; the first unknown ends the search.
        let domains: [fn(&mut World) -> NextEvent; 8] = [
            |w| crate::transport::next_event(w),
            |w| crate::monitor::next_event(w),
            |w| crate::sharding::next_event(w),
            |w| crate::checkpoint::next_periodic_checkpoint(w),
            crate::barrier::next_event,
            crate::collectives::pod::next_event,
            crate::health::next_event,
            crate::clock_sync::systems::next_event,
        ];
        // An event due by the next tick boundary leaves nothing to skip:
        // stop there too, before the scans over every device. (The next
        // boundary, not now + one tick: after an exact stop inside a tick
        // the boundary is nearer, and an event before it must be seen.)
        let clock = *self.clock();
        let next_tick_ns = clock.next_boundary_ns();
        let mut next = NextEvent::Never;
        for domain in domains {
            next = next.min(domain(&mut self.world));
            if next <= NextEvent::At(next_tick_ns) {
                break;
            }
        }
        next
    }

    /// Runs `ticks` ticks like [`Pod::run`], jumping the clock over the
    /// idle ones: the world after it is bit-identical to `run(ticks)`'s.
    /// Returns how many ticks were stepped and skipped.
    ///
    /// The `Step` schedule is built first, so systems a host added through
    /// [`Pod::world_mut`] are counted (and fall back to single ticks), and
    /// an ambiguous schedule is an error of kind
    /// [`ErrorKind::Schedule`](crate::error::ErrorKind::Schedule) before any tick
    /// instead of a panic.
    pub fn run_skipping(&mut self, ticks: u64) -> Result<SkipStats> {
        crate::schedule::build(&mut self.world, Step)?;
        let mut stats = SkipStats::default();
        let target = self.clock().tick.saturating_add(ticks);
        while self.clock().tick < target {
            let remaining = target - self.clock().tick;
            let idle = self.next_event().idle_ticks(self.clock(), remaining);
            if idle > 0 && jump_clock(&mut self.world.resource_mut::<SimClock>(), idle) {
                stats.skipped += idle;
                stats.jumps += 1;
            }
            if self.clock().tick < target {
                self.step_counted(&mut stats);
            }
        }
        Ok(stats)
    }

    /// One run of the `Step` schedule, counted in `stats` as a tick or as
    /// an exact stop inside one.
    fn step_counted(&mut self, stats: &mut SkipStats) {
        let tick = self.clock().tick;
        self.step();
        if self.clock().tick == tick {
            stats.stops += 1;
        } else {
            stats.stepped += 1;
        }
    }

    /// Advances the pod to simulated time `until` (since the pod started;
    /// a bare `u64` is nanoseconds, as this call always took) exactly (the
    /// last tick ends there, on a boundary or not), or until `done` holds
    /// (checked before each tick), jumping over idle ticks as
    /// [`Pod::run_skipping`] does. While the host only waits (a checkpoint
    /// write, a recovery, a cube swap) this costs the ticks where something
    /// happens, not every tick of the wait. Returns how the ticks were spent.
    pub fn advance_until(
        &mut self,
        until: impl Into<SimDuration>,
        mut done: impl FnMut(&World) -> bool,
    ) -> Result<SkipStats> {
        let until_ns = until.into().as_nanos();
        crate::schedule::build(&mut self.world, Step)?;
        let mut stats = SkipStats::default();
        let previous = self.world.resource::<ExactStops>().host_ns;
        self.world.resource_mut::<ExactStops>().host_ns = Some(until_ns);
        while self.clock().now_ns < until_ns && !done(&self.world) {
            let clock = *self.clock();
            // Whole ticks that end no later than the target.
            let limit = (until_ns / clock.tick_ns.max(1))
                .saturating_sub(clock.now_ns / clock.tick_ns.max(1));
            let idle = self.next_event().idle_ticks(&clock, limit);
            if idle > 0 && jump_clock(&mut self.world.resource_mut::<SimClock>(), idle) {
                stats.skipped += idle;
                stats.jumps += 1;
                if self.clock().now_ns >= until_ns {
                    break;
                }
            }
            self.step_counted(&mut stats);
        }
        self.world.resource_mut::<ExactStops>().host_ns = previous;
        Ok(stats)
    }
}
