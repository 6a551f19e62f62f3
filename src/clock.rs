//! Simulated time. Systems read time from [`SimClock`], never the wall clock,
//! so the same inputs give the same world bit for bit.

use crate::schedule::{Step, StepSystems};
use bevy_ecs::prelude::*;
use bevy_ecs::schedule::Schedules;
use serde::{Deserialize, Serialize};
use std::fmt;
use thiserror::Error;

/// A span of simulated time, or a time since the pod started (the clock
/// starts at zero, so the two are the same number): whole nanoseconds,
/// the unit every system counts in, so converting never rounds.
///
/// Host calls that take a time (`Pod::schedule_fault`, `Pod::advance_until`,
/// a barrier's timeout) take `impl Into<SimDuration>`: a bare `u64` is still
/// accepted and means nanoseconds, as it did before the type existed, but
/// `SimDuration::from_secs(3)` says what it is at the call site.
/// Records keep their `u64` nanosecond fields (they are persisted and
/// printed as such) and offer typed accessors.
///
/// The integer constructors saturate at [`SimDuration::MAX`] (about 584
/// years), as the engine's own deadline arithmetic does;
/// [`SimDuration::from_secs_f64`] refuses what has no nanosecond value.
/// Serialized as the integer nanoseconds.
///
/// ```
/// use optirs_tpu::clock::SimDuration;
///
/// assert_eq!(SimDuration::from_millis(250).as_nanos(), 250_000_000);
/// assert_eq!(SimDuration::from_secs_f64(1.5)?, SimDuration::from_millis(1_500));
/// assert!(SimDuration::from_secs_f64(-1.0).is_err());
/// assert_eq!(SimDuration::from_micros(2_500).to_string(), "0.0025 s");
/// # Ok::<(), optirs_tpu::clock::SimDurationError>(())
/// ```
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct SimDuration(u64);

impl SimDuration {
    /// No time.
    pub const ZERO: SimDuration = SimDuration(0);
    /// The longest time the clock can count.
    pub const MAX: SimDuration = SimDuration(u64::MAX);

    /// `nanos` nanoseconds.
    pub const fn from_nanos(nanos: u64) -> SimDuration {
        SimDuration(nanos)
    }

    /// `micros` microseconds, saturating at [`SimDuration::MAX`].
    pub const fn from_micros(micros: u64) -> SimDuration {
        SimDuration(micros.saturating_mul(1_000))
    }

    /// `millis` milliseconds, saturating at [`SimDuration::MAX`].
    pub const fn from_millis(millis: u64) -> SimDuration {
        SimDuration(millis.saturating_mul(1_000_000))
    }

    /// `secs` seconds, saturating at [`SimDuration::MAX`].
    pub const fn from_secs(secs: u64) -> SimDuration {
        SimDuration(secs.saturating_mul(1_000_000_000))
    }

    /// `secs` seconds, rounded to the nearest nanosecond. NaN, infinities,
    /// negative times and times past [`SimDuration::MAX`] have no
    /// nanosecond count and are refused.
    pub fn from_secs_f64(secs: f64) -> Result<SimDuration, SimDurationError> {
        if !secs.is_finite() {
            return Err(SimDurationError::NotFinite(secs));
        }
        if secs < 0.0 {
            return Err(SimDurationError::Negative(secs));
        }
        let nanos = (secs * 1e9).round();
        // 2^64 is exact as an f64; anything at or past it does not fit.
        if nanos >= 18_446_744_073_709_551_616.0 {
            return Err(SimDurationError::TooLong(secs));
        }
        Ok(SimDuration(nanos as u64))
    }

    /// Whole nanoseconds.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Seconds, as the engine's reports print them (`ns * 1e-9`).
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 * 1e-9
    }

    /// `self + other`, saturating at [`SimDuration::MAX`].
    pub const fn saturating_add(self, other: SimDuration) -> SimDuration {
        SimDuration(self.0.saturating_add(other.0))
    }

    /// `self - other`, or zero when `other` is longer.
    pub const fn saturating_sub(self, other: SimDuration) -> SimDuration {
        SimDuration(self.0.saturating_sub(other.0))
    }
}

/// Saturates at [`SimDuration::MAX`] rather than panicking, as the
/// engine's deadline arithmetic does.
impl std::ops::Add for SimDuration {
    type Output = SimDuration;

    fn add(self, other: SimDuration) -> SimDuration {
        self.saturating_add(other)
    }
}

/// A bare `u64` is nanoseconds: what every host call took before
/// [`SimDuration`], so those calls keep their meaning.
impl From<u64> for SimDuration {
    fn from(nanos: u64) -> SimDuration {
        SimDuration(nanos)
    }
}

/// Saturates at [`SimDuration::MAX`] (a `Duration` holds about 2^64 s).
impl From<std::time::Duration> for SimDuration {
    fn from(duration: std::time::Duration) -> SimDuration {
        SimDuration(u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX))
    }
}

impl From<SimDuration> for std::time::Duration {
    fn from(duration: SimDuration) -> std::time::Duration {
        std::time::Duration::from_nanos(duration.0)
    }
}

/// Seconds with every nonzero decimal (`3 s`, `0.25 s`, `1.000000001 s`),
/// exact; with a precision (`{:.3}`), rounded as the engine's reports
/// print times.
impl fmt::Display for SimDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(precision) = f.precision() {
            return write!(f, "{:.*} s", precision, self.as_secs_f64());
        }
        let (secs, nanos) = (self.0 / 1_000_000_000, self.0 % 1_000_000_000);
        if nanos == 0 {
            return write!(f, "{secs} s");
        }
        let fraction = format!("{nanos:09}");
        write!(f, "{secs}.{} s", fraction.trim_end_matches('0'))
    }
}

/// A time in seconds that has no [`SimDuration`].
#[derive(Debug, Clone, Copy, PartialEq, Error)]
#[non_exhaustive]
pub enum SimDurationError {
    /// NaN or an infinity.
    #[error("a simulated time must be a finite number of seconds, not {0}")]
    NotFinite(f64),
    /// Before the pod started.
    #[error("a simulated time cannot be negative ({0} s)")]
    Negative(f64),
    /// Past what a `u64` of nanoseconds counts (about 584 years).
    #[error("{0} s is past the longest simulated time (about 584 years)")]
    TooLong(f64),
}

impl From<SimDurationError> for crate::error::OptimError {
    fn from(error: SimDurationError) -> Self {
        crate::error::OptimError::new(crate::error::ErrorKind::InvalidConfig, error)
    }
}

/// A count of ticks (a bound on how many [`Pod::step`](crate::Pod::step)s
/// a call may run), kept apart from [`SimDuration`] at the call site:
/// `pod.run_until(Ticks(500), …)` is a step budget, not a time. A bare
/// `u64` converts, for calls written before the type existed.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Ticks(pub u64);

impl From<u64> for Ticks {
    fn from(ticks: u64) -> Ticks {
        Ticks(ticks)
    }
}

impl fmt::Display for Ticks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ticks", self.0)
    }
}

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

    /// Simulated time since the pod started.
    pub fn now(&self) -> SimDuration {
        SimDuration(self.now_ns)
    }

    /// Simulated time per tick.
    pub fn tick_length(&self) -> SimDuration {
        SimDuration(self.tick_ns)
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

#[cfg(test)]
mod duration_tests {
    use super::*;

    #[test]
    fn constructors_count_nanoseconds_and_saturate() {
        assert_eq!(SimDuration::from_secs(3).as_nanos(), 3_000_000_000);
        assert_eq!(SimDuration::from_millis(7).as_nanos(), 7_000_000);
        assert_eq!(SimDuration::from_micros(7).as_nanos(), 7_000);
        assert_eq!(SimDuration::from_nanos(7).as_nanos(), 7);
        assert_eq!(SimDuration::from(7u64), SimDuration::from_nanos(7));
        assert_eq!(SimDuration::from_secs(u64::MAX), SimDuration::MAX);
        assert_eq!(
            SimDuration::from(std::time::Duration::from_secs(u64::MAX)),
            SimDuration::MAX
        );
        assert_eq!(
            SimDuration::from(std::time::Duration::from_millis(10)),
            SimDuration::from_millis(10)
        );
        assert_eq!(SimDuration::from_secs(2).as_secs_f64(), 2.0);
        assert_eq!(
            SimDuration::from_secs(1) + SimDuration::from_millis(1),
            SimDuration::from_micros(1_001_000)
        );
        assert_eq!(
            SimDuration::MAX + SimDuration::from_nanos(1),
            SimDuration::MAX
        );
        assert_eq!(
            SimDuration::ZERO.saturating_sub(SimDuration::from_nanos(1)),
            SimDuration::ZERO
        );
    }

    #[test]
    fn seconds_as_f64_are_refused_without_a_nanosecond_count() {
        assert_eq!(
            SimDuration::from_secs_f64(0.25),
            Ok(SimDuration::from_millis(250))
        );
        assert_eq!(SimDuration::from_secs_f64(0.0), Ok(SimDuration::ZERO));
        assert!(matches!(
            SimDuration::from_secs_f64(f64::NAN),
            Err(SimDurationError::NotFinite(_))
        ));
        assert_eq!(
            SimDuration::from_secs_f64(f64::INFINITY),
            Err(SimDurationError::NotFinite(f64::INFINITY))
        );
        assert_eq!(
            SimDuration::from_secs_f64(-0.5),
            Err(SimDurationError::Negative(-0.5))
        );
        assert_eq!(
            SimDuration::from_secs_f64(1e11),
            Err(SimDurationError::TooLong(1e11))
        );
        assert!(SimDuration::from_secs_f64(1.8e10).is_ok());
    }

    #[test]
    fn display_is_exact_seconds_or_rounded_with_a_precision() {
        assert_eq!(SimDuration::from_secs(3).to_string(), "3 s");
        assert_eq!(SimDuration::ZERO.to_string(), "0 s");
        assert_eq!(SimDuration::from_millis(250).to_string(), "0.25 s");
        assert_eq!(
            SimDuration::from_nanos(1_000_000_001).to_string(),
            "1.000000001 s"
        );
        assert_eq!(format!("{:.3}", SimDuration::from_micros(1_500)), "0.002 s");
        assert_eq!(Ticks(5).to_string(), "5 ticks");
    }

    #[test]
    fn serialized_as_the_integer_nanoseconds() {
        let json = serde_json::to_string(&SimDuration::from_millis(3)).unwrap();
        assert_eq!(json, "3000000");
        let back: SimDuration = serde_json::from_str(&json).unwrap();
        assert_eq!(back, SimDuration::from_millis(3));
        assert_eq!(serde_json::to_string(&Ticks(4)).unwrap(), "4");
    }

    #[test]
    fn the_clock_reads_as_durations() {
        let mut clock = SimClock::new(10);
        clock.advance(None);
        assert_eq!(clock.now(), SimDuration::from_nanos(10));
        assert_eq!(clock.tick_length(), SimDuration::from_nanos(10));
    }
}
