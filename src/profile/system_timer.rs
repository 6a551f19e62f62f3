//! Wall-clock time of every system run, read from bevy's `trace` spans.
//!
//! With its `trace` feature, bevy_ecs gives every system a `tracing` span
//! named `"system"` (field `name`) and enters it around each run. A span
//! only records if a subscriber was the thread's default when the system
//! was *constructed* (bevy makes the span in `SystemMeta::new`), so a host
//! that wants timings builds its world inside [`SystemTimer::scope`]. With
//! no subscriber, entering a disabled span is one branch: the `Step` of a
//! pod costs the same with or without the feature (`docs/benchmarks-monitor.md`).
//!
//! [`SystemTimer`] is a minimal `tracing::Subscriber`, not a
//! `tracing-subscriber` layer: it only needs the `"system"` spans, it says
//! `Interest::never` to every other callsite (bevy's per-system
//! `check_conditions` span then costs nothing), and a span's system index is
//! its id, so enter/exit is a vector push and pop under an uncontended lock.
//! Times are wall-clock, for profiling only; nothing here feeds the world.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};

/// The span name bevy_ecs gives a system run.
pub const SYSTEM_SPAN: &str = "system";

/// One run of one system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SystemSpan {
    /// Index into [`SystemTimer::names`].
    pub system: u32,
    /// Start, ns since the timer was made.
    pub start_ns: u64,
    /// Duration, ns.
    pub dur_ns: u64,
}

#[derive(Debug, Default)]
struct State {
    /// System name per span (span id − 1).
    names: Vec<String>,
    /// Spans entered and not yet exited: (system, start).
    open: Vec<(u32, Instant)>,
    /// Finished spans since the last [`SystemTimer::take`].
    finished: Vec<SystemSpan>,
    recording: bool,
}

#[derive(Debug)]
struct Inner {
    epoch: Instant,
    state: Mutex<State>,
}

/// Collects the duration of every system run while recording.
#[derive(Debug, Clone)]
pub struct SystemTimer {
    inner: Arc<Inner>,
}

impl Default for SystemTimer {
    fn default() -> Self {
        SystemTimer::new()
    }
}

impl SystemTimer {
    /// A timer that is not recording yet.
    pub fn new() -> Self {
        SystemTimer {
            inner: Arc::new(Inner {
                epoch: Instant::now(),
                state: Mutex::new(State::default()),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic inside a system leaves the state consistent (push/pop only).
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `build` with this timer as the thread's subscriber: systems
    /// constructed inside (a `Pod`, its schedules) report to it for life.
    pub fn scope<R>(&self, build: impl FnOnce() -> R) -> R {
        tracing::subscriber::with_default(self.clone(), build)
    }

    /// Starts or stops keeping finished spans.
    pub fn set_recording(&self, on: bool) {
        let mut state = self.state();
        state.recording = on;
        state.open.clear();
    }

    /// The finished spans since the last call, oldest first.
    pub fn take(&self) -> Vec<SystemSpan> {
        std::mem::take(&mut self.state().finished)
    }

    /// Names of the systems seen, indexed by [`SystemSpan::system`].
    pub fn names(&self) -> Vec<String> {
        self.state().names.clone()
    }

    /// Nanoseconds from the timer's epoch to `instant`.
    pub fn ns_since_epoch(&self, instant: Instant) -> u64 {
        instant
            .saturating_duration_since(self.inner.epoch)
            .as_nanos()
            .min(u128::from(u64::MAX)) as u64
    }

    /// Nanoseconds from the timer's epoch to now.
    pub fn now_ns(&self) -> u64 {
        self.ns_since_epoch(Instant::now())
    }
}

fn is_system_span(metadata: &Metadata<'_>) -> bool {
    metadata.is_span() && metadata.name() == SYSTEM_SPAN
}

/// Reads the `name` field of a span.
#[derive(Default)]
struct NameVisitor(Option<String>);

impl Visit for NameVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "name" {
            self.0 = Some(value.to_string());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "name" && self.0.is_none() {
            self.0 = Some(format!("{value:?}").trim_matches('"').to_string());
        }
    }
}

impl Subscriber for SystemTimer {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if is_system_span(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        is_system_span(metadata)
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut visitor = NameVisitor::default();
        span.record(&mut visitor);
        let mut state = self.state();
        let name = visitor.0.unwrap_or_else(|| "<unnamed system>".to_string());
        state.names.push(name);
        Id::from_u64(state.names.len() as u64)
    }

    fn record(&self, _span: &Id, _values: &Record<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, _event: &Event<'_>) {}

    fn enter(&self, span: &Id) {
        let now = Instant::now();
        let mut state = self.state();
        if state.recording {
            state.open.push(((span.into_u64() - 1) as u32, now));
        }
    }

    fn exit(&self, span: &Id) {
        let end = Instant::now();
        let mut state = self.state();
        let system = (span.into_u64() - 1) as u32;
        if let Some(pos) = state.open.iter().rposition(|(s, _)| *s == system) {
            let (_, start) = state.open.remove(pos);
            let start_ns = self.ns_since_epoch(start);
            let dur_ns = end.saturating_duration_since(start).as_nanos() as u64;
            state.finished.push(SystemSpan {
                system,
                start_ns,
                dur_ns,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bevy_ecs::prelude::*;

    fn tick(mut n: ResMut<Count>) {
        n.0 += 1;
    }

    #[derive(Resource, Default)]
    struct Count(u32);

    #[test]
    fn times_each_run_of_each_system() {
        let timer = SystemTimer::new();
        let (mut world, mut schedule) = timer.scope(|| {
            let mut world = World::new();
            world.init_resource::<Count>();
            let mut schedule = Schedule::default();
            schedule.add_systems(tick);
            (world, schedule)
        });
        schedule.run(&mut world); // not recording
        assert!(timer.take().is_empty());
        timer.set_recording(true);
        schedule.run(&mut world);
        schedule.run(&mut world);
        let spans = timer.take();
        assert_eq!(spans.len(), 2, "{spans:?}");
        let names = timer.names();
        assert!(
            names[spans[0].system as usize].ends_with("tick"),
            "{names:?}"
        );
        assert!(spans[1].start_ns >= spans[0].start_ns + spans[0].dur_ns);
        assert_eq!(world.resource::<Count>().0, 3);
    }

    #[test]
    fn systems_built_outside_the_scope_are_not_timed() {
        let timer = SystemTimer::new();
        let mut world = World::new();
        world.init_resource::<Count>();
        let mut schedule = Schedule::default();
        schedule.add_systems(tick);
        timer.set_recording(true);
        timer.scope(|| schedule.run(&mut world));
        assert!(timer.take().is_empty());
    }
}
