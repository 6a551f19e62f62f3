//! Monitoring: per-device and per-link metric history in bounded rings,
//! health checks with thresholds, and a performance report.
//!
//! Systems in `StepSystems::Monitor`, in order:
//!
//! 1. [`tally_heartbeats`]: every tick, counts the heartbeats the
//!    coordination service received from each device and their latency.
//! 2. [`sample_metrics`]: every [`MonitorConfig::sample_every_ns`] of
//!    simulated time, appends a slot to [`DeviceHistory`] with one
//!    [`DeviceSample`] per device (heartbeat
//!    age, heartbeats heard vs expected, mean heartbeat latency, HBM in use)
//!    and a [`LinkSample`] per link that carried traffic (bytes/s each way
//!    since its previous sample; idle samples are implicit, so an idle pod
//!    pays nothing per link).
//! 3. [`evaluate_health_checks`]: after each sample, sets each device's
//!    [`HealthChecks`] from its newest samples and [`HealthThresholds`]; a
//!    check goes back to `Ok` as soon as its metric is back under the threshold.
//!
//! Everything reads simulated time ([`SimClock`]), so a restored pod
//! monitors identically; wall-clock step times belong to the profiler
//! ([`crate::profile::profiling_integration`]) and enter the report
//! only as an argument ([`report::performance_report`]).
//!
//! Device memory in use is read from [`HbmUsage`], which
//! [`crate::memory::device`] sets from the device's heap at every reservation and
//! release (a [`crate::TPUOptimizer`] on the pod keeps its state resident
//! there); it is 0 on a device that never held anything.

pub use crate::memory::HbmUsage;

pub mod checks;
pub mod history;
pub mod report;
pub mod ring;

pub use checks::{CheckState, HealthChecks, HealthThresholds, evaluate_health_checks};
pub use history::{DeviceHistory, HistoryError};
pub use report::{PerformanceReport, performance_report};
pub use ring::Ring;

use crate::clock::{NextEvent, SimClock};
use crate::health::{HeartbeatConfig, LastHeard};
use crate::schedule::{Step, StepSystems};
use crate::topology::{Device, HbmCapacity, Link, LinkTraffic};
use crate::transport::{Inbox, Payload};
use bevy_ecs::prelude::*;
use bevy_ecs::schedule::Schedules;
use serde::{Deserialize, Serialize};

/// Samples kept per device and per link unless configured otherwise: at
/// the default one sample per heartbeat interval (1 s on the presets), two
/// minutes of history; a full history of v4-8192 is 4,096 × 128 × 56 B =
/// 29 MB (it grows as it fills).
pub const DEFAULT_HISTORY_LEN: usize = 128;

/// How often and how much the monitor samples.
#[derive(Resource, Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MonitorConfig {
    /// Simulated time between samples, ns (default: the heartbeat interval,
    /// the finest grain at which heartbeat metrics change).
    pub sample_every_ns: u64,
    /// Samples kept per device and per link.
    pub history_len: usize,
    /// Samples a windowed check (error rate, latency) looks back over.
    pub window_samples: usize,
}

/// When the next sample is due and how many were taken.
#[derive(Resource, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MonitorState {
    /// Simulated time of the next sample, ns.
    pub next_sample_ns: u64,
    /// Samples taken so far.
    pub samples: u64,
    /// Whether the newest tick took a sample (checks run after it).
    pub sampled_this_tick: bool,
    /// Simulated time of the newest sample, ns.
    pub last_sample_ns: u64,
}

/// Heartbeats the coordination service received from a device, cumulative.
#[derive(Component, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatTally {
    /// Heartbeats received.
    pub heard: u64,
    /// Sum of their latencies (sent → delivered), ns.
    pub latency_sum_ns: u64,
}

/// One sample of a device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceSample {
    /// Simulated time, ns.
    pub at_ns: u64,
    /// Time since the newest heartbeat heard was sent, ns.
    pub heartbeat_age_ns: u64,
    /// Heartbeats heard since the previous sample.
    pub heard: u64,
    /// Heartbeats a healthy device sends in that time.
    pub expected: f64,
    /// Sum of those heartbeats' latencies, ns.
    pub latency_sum_ns: u64,
    /// HBM bytes in use.
    pub hbm_used: u64,
    /// HBM capacity, bytes.
    pub hbm_capacity: u64,
}

/// A device's monitor state: the tally at the last sample, the newest
/// sample and the window sums, inline so the checks read one table (the
/// samples themselves are in [`DeviceHistory`]).
#[derive(Component, Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceMetrics {
    /// [`HeartbeatTally`] at the last sample.
    pub last_tally: HeartbeatTally,
    /// The newest sample.
    pub latest: Option<DeviceSample>,
    /// Sums over the newest [`MonitorConfig::window_samples`] samples.
    pub window: checks::Window,
}

/// One sample of a link: bytes per second each way since the previous one.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinkSample {
    /// Simulated time, ns.
    pub at_ns: u64,
    /// a → b, bytes/s.
    pub ab_bytes_per_s: f64,
    /// b → a, bytes/s.
    pub ba_bytes_per_s: f64,
}

/// The traffic history of a link. Only samples that are busy, or the first
/// idle one after a busy stretch, are stored; a sample time with no entry
/// was idle (0 bytes/s).
#[derive(Component, Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkMetrics {
    /// Samples, oldest first.
    pub history: Ring<LinkSample>,
    /// Counters and time at the last sample: (bytes a→b, bytes b→a, ns).
    pub last: (u64, u64, u64),
    /// Whether the newest stored sample carried traffic (kept inline so an
    /// idle link is skipped without touching its ring).
    pub busy: bool,
}

/// Counts the heartbeats delivered this tick, per sender.
pub fn tally_heartbeats(
    inbox: Res<Inbox>,
    index: Res<crate::topology::DeviceIndex>,
    mut tallies: Query<&mut HeartbeatTally>,
) {
    for message in &inbox.messages {
        if let Payload::Heartbeat { sent_ns } = message.payload
            && let Some(entity) = index.get(message.from)
            && let Ok(mut tally) = tallies.get_mut(entity)
        {
            tally.heard += 1;
            tally.latency_sum_ns += message.deliver_at_ns.saturating_sub(sent_ns);
        }
    }
}

/// Appends a sample to every device and link history when one is due.
#[expect(clippy::type_complexity, reason = "one query per sampled entity kind")]
pub fn sample_metrics(
    clock: Res<SimClock>,
    config: Res<MonitorConfig>,
    heartbeat: Res<HeartbeatConfig>,
    mut state: ResMut<MonitorState>,
    mut history: ResMut<DeviceHistory>,
    mut devices: Query<(
        &Device,
        &LastHeard,
        &HeartbeatTally,
        Option<&HbmUsage>,
        Option<&HbmCapacity>,
        &mut DeviceMetrics,
    )>,
    mut links: Query<(&LinkTraffic, &mut LinkMetrics)>,
) {
    let now = clock.now_ns;
    state.sampled_this_tick = now >= state.next_sample_ns;
    if !state.sampled_this_tick {
        return;
    }
    let interval = config.sample_every_ns.max(1);
    state.next_sample_ns = (now / interval + 1) * interval;
    let since = state.last_sample_ns;
    state.last_sample_ns = now;
    state.samples += 1;
    let expected = (now - since) as f64 / heartbeat.interval_ns.max(1) as f64;
    // The window slides by one slot: add the new sample, subtract the one
    // that leaves (copied out first: 56 B per device).
    let window = config.window_samples.max(1);
    let leaving: Option<Vec<DeviceSample>> = history
        .slots()
        .rev()
        .nth(window - 1)
        .map(<[DeviceSample]>::to_vec);
    let slot = history.push_slot();
    for (device, heard, tally, usage, capacity, mut metrics) in &mut devices {
        let id = device.id.0 as usize;
        let sample = DeviceSample {
            at_ns: now,
            heartbeat_age_ns: now.saturating_sub(heard.sent_ns),
            heard: tally.heard - metrics.last_tally.heard,
            expected,
            latency_sum_ns: tally.latency_sum_ns - metrics.last_tally.latency_sum_ns,
            hbm_used: usage.map_or(0, |u| u.0),
            hbm_capacity: capacity.map_or(0, |c| c.0),
        };
        if let Some(cell) = slot.get_mut(id) {
            *cell = sample;
        }
        let metrics = &mut *metrics;
        metrics.last_tally = *tally;
        metrics.latest = Some(sample);
        metrics.window.add(&sample);
        if let Some(old) = leaving.as_ref().and_then(|l| l.get(id)) {
            metrics.window.remove(old);
        }
    }
    for (traffic, mut metrics) in &mut links {
        let (ab, ba, at) = metrics.last;
        let idle = traffic.bytes_ab == ab && traffic.bytes_ba == ba;
        if idle && !metrics.busy {
            // Idle stays implicit: most links of a pod are idle most of the
            // time, and the report counts the missing samples as zeros.
            continue;
        }
        let seconds = now.saturating_sub(at) as f64 * 1e-9;
        if seconds > 0.0 {
            metrics.history.push(LinkSample {
                at_ns: now,
                ab_bytes_per_s: (traffic.bytes_ab - ab) as f64 / seconds,
                ba_bytes_per_s: (traffic.bytes_ba - ba) as f64 / seconds,
            });
        }
        metrics.busy = !idle;
        metrics.last = (traffic.bytes_ab, traffic.bytes_ba, now);
    }
}

/// Installs the monitor with its defaults; see [`install_with`].
pub fn install(world: &mut World) {
    let heartbeat = *world.resource::<HeartbeatConfig>();
    let config = MonitorConfig {
        sample_every_ns: heartbeat.interval_ns.max(1),
        history_len: DEFAULT_HISTORY_LEN,
        window_samples: 8,
    };
    install_with(world, config, HealthThresholds::from_heartbeats(&heartbeat));
}

/// Installs the monitor: its resources, a history on every device and link,
/// and its systems in `StepSystems::Monitor`.
pub fn install_with(world: &mut World, config: MonitorConfig, thresholds: HealthThresholds) {
    world.insert_resource(config);
    world.insert_resource(thresholds);
    world.init_resource::<MonitorState>();
    let devices = world.resource::<crate::topology::DeviceIndex>().0.len();
    world.insert_resource(DeviceHistory::new(devices, config.history_len));
    let devices: Vec<Entity> = world
        .query_filtered::<Entity, With<Device>>()
        .iter(world)
        .collect();
    for entity in devices {
        world.entity_mut(entity).insert((
            HeartbeatTally::default(),
            HealthChecks::default(),
            DeviceMetrics::default(),
        ));
    }
    let links: Vec<Entity> = world
        .query_filtered::<Entity, With<Link>>()
        .iter(world)
        .collect();
    for entity in links {
        world.entity_mut(entity).insert(LinkMetrics {
            history: Ring::new(config.history_len),
            last: (0, 0, 0),
            busy: false,
        });
    }
    world.resource_mut::<Schedules>().add_systems(
        Step,
        (tally_heartbeats, sample_metrics, evaluate_health_checks)
            .chain()
            .in_set(StepSystems::Monitor),
    );
}

/// The earliest time the monitor changes the world: its next sample.
/// Unknown right after a sample (the next tick clears
/// [`MonitorState::sampled_this_tick`]).
pub fn next_event(world: &World) -> NextEvent {
    match world.get_resource::<MonitorState>() {
        Some(state) if !state.sampled_this_tick => NextEvent::At(state.next_sample_ns),
        Some(_) => NextEvent::Unknown,
        None => NextEvent::Never,
    }
}
