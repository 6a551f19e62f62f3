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

/// Advances the clock by one tick.
pub fn advance_clock(mut clock: ResMut<SimClock>) {
    clock.tick += 1;
    clock.now_ns += clock.tick_ns;
}

/// Installs the clock: the resource and [`advance_clock`] in
/// [`StepSystems::AdvanceClock`].
pub fn install(world: &mut World, tick_ns: u64) {
    world.insert_resource(SimClock::new(tick_ns));
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

    /// How many of the next ticks of `clock` are before this event (all of
    /// `limit` for [`NextEvent::Never`], none for [`NextEvent::Unknown`]),
    /// at most `limit`.
    pub fn idle_ticks(self, clock: &SimClock, limit: u64) -> u64 {
        match self {
            NextEvent::Unknown => 0,
            NextEvent::Never => limit,
            NextEvent::At(_) if clock.tick_ns == 0 => 0,
            // Ticks j >= 1 with now + j * tick < t.
            NextEvent::At(t) if t <= clock.now_ns => 0,
            NextEvent::At(t) => ((t - clock.now_ns - 1) / clock.tick_ns).min(limit),
        }
    }
}

/// Moves the clock `ticks` ticks ahead without running them, exactly as
/// `ticks` runs of [`advance_clock`] would; `false` (and no change) if the
/// time would overflow.
pub fn jump_clock(clock: &mut SimClock, ticks: u64) -> bool {
    let Some(now_ns) = ticks
        .checked_mul(clock.tick_ns)
        .and_then(|ns| clock.now_ns.checked_add(ns))
    else {
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
