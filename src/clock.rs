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
