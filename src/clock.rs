//! Simulated time. Systems read time from [`SimClock`], never the wall clock,
//! so the same inputs give the same world bit for bit.

use crate::schedule::{Step, StepSystems};
use bevy_ecs::prelude::*;
use bevy_ecs::schedule::Schedules;
use serde::{Deserialize, Serialize};

/// The pod's simulated clock.
#[derive(Resource, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimClock {
    /// Ticks completed.
    pub tick: u64,
    /// Simulated time since the pod started, ns.
    pub now_ns: u64,
    /// Simulated time per tick, ns.
    pub tick_ns: u64,
}

impl SimClock {
    /// A clock at time zero that advances `tick_ns` per tick.
    pub fn new(tick_ns: u64) -> SimClock {
        SimClock {
            tick: 0,
            now_ns: 0,
            tick_ns,
        }
    }

    /// Simulated time in seconds.
    pub fn now_seconds(&self) -> f64 {
        self.now_ns as f64 * 1e-9
    }
}

impl SimClock {
    /// The next tick boundary after `now_ns` (boundaries are the multiples
    /// of `tick_ns`; `now_ns` itself with a zero tick).
    pub fn next_boundary_ns(&self) -> u64 {
        match self.tick_ns {
            0 => self.now_ns,
            tick_ns => (self.now_ns / tick_ns)
                .saturating_add(1)
                .saturating_mul(tick_ns),
        }
    }

    /// Whether `now_ns` is on a tick boundary (not at an exact stop inside
    /// a tick).
    pub fn at_boundary(&self) -> bool {
        self.tick_ns == 0 || self.now_ns.is_multiple_of(self.tick_ns)
    }

    /// Moves the clock to the earlier of the next tick boundary and `stop`
    /// (when `stop` is after now): `tick` counts boundaries crossed, so it
    /// moves on only when the boundary is reached.
    pub fn advance(&mut self, stop: Option<u64>) {
        let boundary = self.next_boundary_ns();
        match stop {
            Some(stop) if stop > self.now_ns && stop < boundary => self.now_ns = stop,
            _ => {
                self.tick += 1;
                self.now_ns = boundary;
            }
        }
    }
}

/// A time a domain needs the clock to stop at exactly, even inside a tick
/// (a scheduled fault, a step's modeled end), or `None`.
pub type ExactStopSource = fn(&World) -> Option<u64>;

/// Where the clock stops inside a tick: the sources domains register and
/// the time the host is advancing to. A tick ends at the earliest of them
/// that falls inside it, so work ends at its modeled nanosecond, not at
/// the next boundary. Not state: the sources read the world, and the
/// host's target lasts one call.
#[derive(Resource, Debug, Clone, Default)]
pub struct ExactStops {
    sources: Vec<ExactStopSource>,
    /// The host's target time (`Pod::advance_until`), while it advances.
    pub host_ns: Option<u64>,
}

impl ExactStops {
    /// Registers a source (once: registering it again does nothing).
    pub fn register(&mut self, source: ExactStopSource) {
        if !self.sources.contains(&source) {
            self.sources.push(source);
        }
    }

    /// The earliest stop after `now_ns` of every source and the host.
    pub fn earliest_after(&self, world: &World, now_ns: u64) -> Option<u64> {
        self.sources
            .iter()
            .filter_map(|source| source(world))
            .chain(self.host_ns)
            .filter(|&t| t > now_ns)
            .min()
    }
}

/// Registers `source` as an exact stop of the clock ([`ExactStops`]).
pub fn register_exact_stop(world: &mut World, source: ExactStopSource) {
    world
        .get_resource_or_insert_with(ExactStops::default)
        .register(source);
}

/// Advances the clock by one tick, or less: to the earliest exact stop
/// inside the tick ([`ExactStops`]).
pub fn advance_clock(world: &mut World) {
    let now_ns = world.resource::<SimClock>().now_ns;
    let stop = world
        .get_resource::<ExactStops>()
        .and_then(|stops| stops.earliest_after(world, now_ns));
    world.resource_mut::<SimClock>().advance(stop);
}

/// Installs the clock: the resource, its [`ExactStops`] and
/// [`advance_clock`] in [`StepSystems::AdvanceClock`].
pub fn install(world: &mut World, tick_ns: u64) {
    world.insert_resource(SimClock::new(tick_ns));
    world.init_resource::<ExactStops>();
    world
        .resource_mut::<Schedules>()
        .add_systems(Step, advance_clock.in_set(StepSystems::AdvanceClock));
}

/// When a domain's systems next change the world, as each domain reports it
/// for `Pod::run_skipping`: a tick whose `now_ns` is before every domain's
/// event changes nothing but the clock, so it can be jumped over.
///
/// The order is the urgency: `Unknown < At(_) < Never`, and the pod's next
/// event is the minimum over its domains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum NextEvent {
    /// The domain cannot say (work in progress, per-tick state to reset):
    /// run the next tick.
    Unknown,
    /// Ticks with `now_ns` before this time (ns) leave the domain as it is.
    At(u64),
    /// Nothing happens until a host call changes the world.
    Never,
}

impl NextEvent {
    /// `At(t)` for `Some(t)`, `Never` for `None`.
    pub fn at(time_ns: Option<u64>) -> NextEvent {
        time_ns.map_or(NextEvent::Never, NextEvent::At)
    }

    /// How many of the next tick boundaries of `clock` are before this
    /// event (all of `limit` for [`NextEvent::Never`], none for
    /// [`NextEvent::Unknown`]), at most `limit`.
    pub fn idle_ticks(self, clock: &SimClock, limit: u64) -> u64 {
        match self {
            NextEvent::Unknown => 0,
            NextEvent::Never => limit,
            NextEvent::At(_) if clock.tick_ns == 0 => 0,
            // Boundaries k * tick with now < k * tick < t.
            NextEvent::At(t) if t <= clock.now_ns => 0,
            NextEvent::At(t) => ((t - 1) / clock.tick_ns - clock.now_ns / clock.tick_ns).min(limit),
        }
    }
}

/// Moves the clock `ticks` tick boundaries ahead without running them,
/// exactly as `ticks` runs of [`advance_clock`] without exact stops would;
/// `false` (and no change) if the time would overflow.
pub fn jump_clock(clock: &mut SimClock, ticks: u64) -> bool {
    let now_ns = match clock.tick_ns {
        0 => Some(clock.now_ns),
        tick_ns => (clock.now_ns / tick_ns)
            .checked_add(ticks)
            .and_then(|k| k.checked_mul(tick_ns)),
    };
    let Some(now_ns) = now_ns else {
        return false;
    };
    let Some(tick) = clock.tick.checked_add(ticks) else {
        return false;
    };
    clock.tick = tick;
    clock.now_ns = now_ns;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_ticks_stop_before_the_tick_an_event_is_due() {
        let clock = SimClock {
            tick: 4,
            now_ns: 40,
            tick_ns: 10,
        };
        // Ticks at 50, 60 are idle; the one at 70 runs the event.
        assert_eq!(NextEvent::At(70).idle_ticks(&clock, 100), 2);
        assert_eq!(NextEvent::At(61).idle_ticks(&clock, 100), 2);
        assert_eq!(NextEvent::At(60).idle_ticks(&clock, 100), 1);
        assert_eq!(NextEvent::At(50).idle_ticks(&clock, 100), 0);
        assert_eq!(NextEvent::At(10).idle_ticks(&clock, 100), 0);
        assert_eq!(NextEvent::At(1_000).idle_ticks(&clock, 5), 5);
        assert_eq!(NextEvent::Never.idle_ticks(&clock, 7), 7);
        assert_eq!(NextEvent::Unknown.idle_ticks(&clock, 7), 0);
        assert!(NextEvent::Unknown < NextEvent::At(0));
        assert!(NextEvent::At(u64::MAX) < NextEvent::Never);
    }

    #[test]
    fn a_tick_ends_at_an_exact_stop_inside_it_and_counts_boundaries() {
        let mut clock = SimClock::new(10);
        clock.advance(Some(7));
        assert_eq!((clock.tick, clock.now_ns), (0, 7));
        assert!(!clock.at_boundary());
        // A stop at or past the boundary ends the tick at the boundary.
        clock.advance(Some(10));
        assert_eq!((clock.tick, clock.now_ns), (1, 10));
        clock.advance(Some(25));
        assert_eq!((clock.tick, clock.now_ns), (2, 20));
        clock.advance(Some(20));
        assert_eq!((clock.tick, clock.now_ns), (3, 30));
        // Off the grid, idle boundaries are counted from the grid.
        clock.advance(Some(33));
        assert_eq!(NextEvent::At(61).idle_ticks(&clock, 100), 3);
        assert_eq!(NextEvent::At(60).idle_ticks(&clock, 100), 2);
        assert!(jump_clock(&mut clock, 2));
        assert_eq!((clock.tick, clock.now_ns), (5, 50));
    }

    #[test]
    fn exact_stops_take_the_earliest_source_after_now() {
        let mut world = World::new();
        world.insert_resource(SimClock::new(100));
        register_exact_stop(&mut world, |_| Some(30));
        register_exact_stop(&mut world, |_| None);
        register_exact_stop(&mut world, |_| Some(30));
        world.resource_mut::<ExactStops>().host_ns = Some(12);
        advance_clock(&mut world);
        assert_eq!(world.resource::<SimClock>().now_ns, 12);
        advance_clock(&mut world);
        assert_eq!(world.resource::<SimClock>().now_ns, 30);
        advance_clock(&mut world);
        assert_eq!(
            *world.resource::<SimClock>(),
            SimClock {
                tick: 1,
                now_ns: 100,
                tick_ns: 100
            }
        );
    }

    #[test]
    fn a_jump_is_the_ticks_it_replaces() {
        let mut jumped = SimClock::new(7);
        let mut ticked = SimClock::new(7);
        assert!(jump_clock(&mut jumped, 5));
        for _ in 0..5 {
            ticked.tick += 1;
            ticked.now_ns += ticked.tick_ns;
        }
        assert_eq!(jumped, ticked);
        assert!(!jump_clock(&mut jumped, u64::MAX));
        assert_eq!(jumped, ticked);
    }
}
