//! [`PerformanceReport`]: figures over the live metric history.
//!
//! Everything is computed from the rings the monitor keeps (so it covers at
//! most `history_len` samples) and from wall-clock step times the host
//! passes in (the profiler's, never the world's).

use super::checks::{HealthChecks, Level, Window};
use super::{DeviceHistory, LinkMetrics, MonitorConfig, MonitorState};
use crate::topology::{Device, Link};
use bevy_ecs::prelude::*;
use serde::Serialize;

/// Mean, p50, p99 and max of a set of values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Values summarized.
    pub count: usize,
    /// Mean.
    pub mean: f64,
    /// Median (nearest rank).
    pub p50: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Summary {
    /// Summarizes `values` (any order).
    pub fn of(mut values: Vec<f64>) -> Summary {
        if values.is_empty() {
            return Summary::default();
        }
        values.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            let r = ((p / 100.0) * values.len() as f64).ceil() as usize;
            values[r.clamp(1, values.len()) - 1]
        };
        Summary {
            count: values.len(),
            mean: values.iter().sum::<f64>() / values.len() as f64,
            p50: rank(50.0),
            p99: rank(99.0),
            max: values[values.len() - 1],
        }
    }
}

/// A busy link.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkRow {
    /// Device ids at its ends.
    pub ends: (u32, u32),
    /// Mean rate over the history, both ways, bytes/s.
    pub mean_bytes_per_s: f64,
    /// That rate over the link's bandwidth (both ways: 2 × bytes_per_s).
    pub utilization: f64,
}

/// Devices per check level.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CheckCounts {
    /// All checks ok.
    pub ok: usize,
    /// Worst check is a warning.
    pub warning: usize,
    /// Worst check is critical.
    pub critical: usize,
}

/// Performance over the live history.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PerformanceReport {
    /// Samples taken so far (the history holds the newest `history_len`).
    pub samples: u64,
    /// Simulated time between samples, ns.
    pub sample_every_ns: u64,
    /// Devices (`chips` in JSON).
    #[serde(rename = "chips")]
    pub devices: usize,
    /// Heard / expected heartbeats per device over its history (1 = never lost one).
    pub availability: Summary,
    /// Heartbeat age at every sample of every device, ns.
    pub heartbeat_age_ns: Summary,
    /// Mean heartbeat latency per device over its history, ns.
    pub heartbeat_latency_ns: Summary,
    /// Mean rate of each link over the history (both ways, idle samples
    /// included), bytes/s: one value per link.
    pub link_bytes_per_s: Summary,
    /// Highest single-sample rate of any link, bytes/s.
    pub link_peak_bytes_per_s: f64,
    /// Mean utilization of each link (rate / bandwidth both ways).
    pub link_utilization: Summary,
    /// The busiest links by mean rate (at most 8).
    pub busiest_links: Vec<LinkRow>,
    /// Devices by worst check.
    pub checks: CheckCounts,
    /// Wall-clock time per `Step`, ns, when the host measured it.
    pub step_wall_ns: Option<Summary>,
}

/// The report over `world`'s history; `step_wall_ns` are the wall-clock
/// step times the host measured (e.g. the profiler's), if any.
pub fn performance_report(world: &mut World, step_wall_ns: Option<&[u64]>) -> PerformanceReport {
    let config = *world.resource::<MonitorConfig>();
    let state = *world.resource::<MonitorState>();
    let history = world.resource::<DeviceHistory>();
    let n = history.devices();
    let mut windows = vec![Window::default(); n];
    let mut ages = Vec::with_capacity(n * history.len());
    for slot in history.slots() {
        for (window, sample) in windows.iter_mut().zip(slot) {
            window.add(sample);
            ages.push(sample.heartbeat_age_ns as f64);
        }
    }
    let availability: Vec<f64> = windows
        .iter()
        .filter(|w| w.expected >= 1.0)
        .map(|w| 1.0 - w.error_rate())
        .collect();
    let latencies: Vec<f64> = windows.iter().filter_map(Window::mean_latency_ns).collect();
    let mut checks = CheckCounts::default();
    let mut devices = world.query::<(&Device, &HealthChecks)>();
    let mut count = 0;
    for (_, health) in devices.iter(world) {
        count += 1;
        match health.worst() {
            Level::Ok => checks.ok += 1,
            Level::Warning => checks.warning += 1,
            Level::Critical => checks.critical += 1,
        }
    }
    // Per link, its mean rate over the sample slots the history spans
    // (slots without an entry were idle: 0 bytes/s).
    let slots = state.samples.min(config.history_len as u64).max(1);
    let window_start = world
        .resource::<crate::clock::SimClock>()
        .now_ns
        .saturating_sub(slots * config.sample_every_ns);
    let mut rates = Vec::new();
    let mut utilization = Vec::new();
    let mut peak: f64 = 0.0;
    let mut rows = Vec::new();
    let mut ids = world.query::<&Device>();
    let mut links = world.query::<(&Link, &LinkMetrics)>();
    for (link, metrics) in links.iter(world) {
        let both_ways = 2.0 * link.bytes_per_s;
        let busy = metrics
            .history
            .iter()
            .filter(|s| s.at_ns > window_start)
            .map(|s| s.ab_bytes_per_s + s.ba_bytes_per_s);
        let (sum, max) = busy.fold((0.0, 0.0f64), |(sum, max), r| (sum + r, max.max(r)));
        let mean = sum / slots as f64;
        peak = peak.max(max);
        rates.push(mean);
        if both_ways > 0.0 {
            utilization.push(mean / both_ways);
        }
        if mean > 0.0 {
            let mut end = |e| ids.get(world, e).map_or(u32::MAX, |d| d.id.0);
            rows.push(LinkRow {
                ends: (end(link.a), end(link.b)),
                mean_bytes_per_s: mean,
                utilization: if both_ways > 0.0 {
                    mean / both_ways
                } else {
                    0.0
                },
            });
        }
    }
    rows.sort_by(|a, b| {
        b.mean_bytes_per_s
            .total_cmp(&a.mean_bytes_per_s)
            .then(a.ends.cmp(&b.ends))
    });
    rows.truncate(8);
    PerformanceReport {
        samples: state.samples,
        sample_every_ns: config.sample_every_ns,
        devices: count,
        availability: Summary::of(availability),
        heartbeat_age_ns: Summary::of(ages),
        heartbeat_latency_ns: Summary::of(latencies),
        link_bytes_per_s: Summary::of(rates),
        link_peak_bytes_per_s: peak,
        link_utilization: Summary::of(utilization),
        busiest_links: rows,
        checks,
        step_wall_ns: step_wall_ns.map(|ns| Summary::of(ns.iter().map(|&n| n as f64).collect())),
    }
}
