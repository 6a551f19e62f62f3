//! Health checks: each device's newest samples against [`HealthThresholds`].
//!
//! | check | metric | warning | critical |
//! |---|---|---|---|
//! | heartbeat | age of the newest heartbeat heard | > suspect-after | > heartbeat timeout |
//! | error rate | heartbeats lost over the window: 1 − heard / expected | ≥ 25 % | ≥ 75 % |
//! | memory | HBM in use / capacity | ≥ 85 % | ≥ 95 % |
//! | straggling | mean heartbeat latency over the window vs the pod's median | > 2× median and > median + base latency | — |
//!
//! A check changes state on the sample where its metric crosses a threshold
//! and returns to `Ok` on the first sample where it no longer does; `since_ns`
//! keeps when the current level began.

use super::{DeviceMetrics, DeviceSample, MonitorState};
use crate::clock::SimClock;
use crate::health::HeartbeatConfig;
use bevy_ecs::prelude::*;
use serde::{Deserialize, Serialize};

/// Fraction of expected heartbeats lost over the window that is a warning:
/// with jitter, a window of 8 intervals loses at most one at its edges (12.5 %).
pub const ERROR_RATE_WARNING: f64 = 0.25;
/// Fraction lost that is critical: the device is mostly silent.
pub const ERROR_RATE_CRITICAL: f64 = 0.75;
/// HBM fraction in use that is a warning (little headroom for a new buffer).
pub const MEMORY_WARNING: f64 = 0.85;
/// HBM fraction in use that is critical (the next step's allocations will not fit).
pub const MEMORY_CRITICAL: f64 = 0.95;
/// A device whose heartbeat latency exceeds this multiple of the pod's median straggles.
pub const STRAGGLER_FACTOR: f64 = 2.0;

/// Where a check stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CheckState {
    /// Under every threshold.
    #[default]
    Ok,
    /// Over the warning threshold.
    Warning {
        /// When it crossed, ns.
        since_ns: u64,
    },
    /// Over the critical threshold.
    Critical {
        /// When it crossed, ns.
        since_ns: u64,
    },
}

/// How bad a metric is, before it becomes a [`CheckState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Fine.
    Ok,
    /// Warning.
    Warning,
    /// Critical.
    Critical,
}

impl CheckState {
    /// Its level.
    pub fn level(&self) -> Level {
        match self {
            CheckState::Ok => Level::Ok,
            CheckState::Warning { .. } => Level::Warning,
            CheckState::Critical { .. } => Level::Critical,
        }
    }

    /// The state after observing `level` at `now_ns` (keeps `since_ns` while
    /// the level holds).
    pub fn next(self, level: Level, now_ns: u64) -> CheckState {
        if level == self.level() {
            return self;
        }
        match level {
            Level::Ok => CheckState::Ok,
            Level::Warning => CheckState::Warning { since_ns: now_ns },
            Level::Critical => CheckState::Critical { since_ns: now_ns },
        }
    }
}

/// The checks of one device.
#[derive(Component, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthChecks {
    /// Heartbeat age.
    pub heartbeat: CheckState,
    /// Heartbeats lost over the window.
    pub error_rate: CheckState,
    /// HBM in use.
    pub memory: CheckState,
    /// Heartbeat latency against the pod's median.
    pub straggling: CheckState,
}

impl HealthChecks {
    /// The worst level of any check.
    pub fn worst(&self) -> Level {
        [
            self.heartbeat,
            self.error_rate,
            self.memory,
            self.straggling,
        ]
        .iter()
        .map(CheckState::level)
        .max()
        .unwrap_or(Level::Ok)
    }
}

/// The thresholds of the checks.
#[derive(Resource, Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HealthThresholds {
    /// Heartbeat age that is a warning, ns.
    pub heartbeat_age_warning_ns: u64,
    /// Heartbeat age that is critical, ns.
    pub heartbeat_age_critical_ns: u64,
    /// Lost-heartbeat fraction that is a warning.
    pub error_rate_warning: f64,
    /// Lost-heartbeat fraction that is critical.
    pub error_rate_critical: f64,
    /// HBM fraction that is a warning.
    pub memory_warning: f64,
    /// HBM fraction that is critical.
    pub memory_critical: f64,
    /// Latency multiple of the pod's median that straggles.
    pub straggler_factor: f64,
    /// Least excess over the median that straggles, ns (ignores noise on an idle network).
    pub straggler_min_excess_ns: u64,
}

impl HealthThresholds {
    /// Thresholds that agree with the failure detector: a heartbeat age
    /// warning when it would call the device suspect, critical at its timeout.
    pub fn from_heartbeats(config: &HeartbeatConfig) -> Self {
        HealthThresholds {
            heartbeat_age_warning_ns: config.suspect_after_ns,
            heartbeat_age_critical_ns: config.timeout_ns,
            error_rate_warning: ERROR_RATE_WARNING,
            error_rate_critical: ERROR_RATE_CRITICAL,
            memory_warning: MEMORY_WARNING,
            memory_critical: MEMORY_CRITICAL,
            straggler_factor: STRAGGLER_FACTOR,
            straggler_min_excess_ns: config.control_latency_ns.max(1),
        }
    }

    fn level(&self, value: f64, warning: f64, critical: f64) -> Level {
        if value >= critical {
            Level::Critical
        } else if value >= warning {
            Level::Warning
        } else {
            Level::Ok
        }
    }
}

/// Heard, expected and latency over a device's newest `window` samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Window {
    /// Heartbeats heard.
    pub heard: u64,
    /// Heartbeats expected.
    pub expected: f64,
    /// Sum of latencies, ns.
    pub latency_sum_ns: u64,
}

impl Window {
    /// Adds one sample.
    pub fn add(&mut self, sample: &DeviceSample) {
        self.heard += sample.heard;
        self.expected += sample.expected;
        self.latency_sum_ns += sample.latency_sum_ns;
    }

    /// Removes a sample added before.
    pub fn remove(&mut self, sample: &DeviceSample) {
        self.heard = self.heard.saturating_sub(sample.heard);
        self.expected = (self.expected - sample.expected).max(0.0);
        self.latency_sum_ns = self.latency_sum_ns.saturating_sub(sample.latency_sum_ns);
    }

    /// Sums samples.
    pub fn of<'a>(samples: impl Iterator<Item = &'a DeviceSample>) -> Window {
        let mut window = Window::default();
        for sample in samples {
            window.add(sample);
        }
        window
    }

    /// Fraction of expected heartbeats not heard (0 when none were expected).
    pub fn error_rate(&self) -> f64 {
        if self.expected < 1.0 {
            return 0.0;
        }
        (1.0 - self.heard as f64 / self.expected).clamp(0.0, 1.0)
    }

    /// Mean heartbeat latency, ns.
    pub fn mean_latency_ns(&self) -> Option<f64> {
        (self.heard > 0).then(|| self.latency_sum_ns as f64 / self.heard as f64)
    }
}

/// Sets every device's checks from its newest samples (after a sample only).
pub fn evaluate_health_checks(
    clock: Res<SimClock>,
    thresholds: Res<HealthThresholds>,
    state: Res<MonitorState>,
    mut devices: Query<(&DeviceMetrics, &mut HealthChecks)>,
) {
    if !state.sampled_this_tick {
        return;
    }
    let now = clock.now_ns;
    let t = *thresholds;
    let mut latencies: Vec<f64> = devices
        .iter()
        .filter_map(|(m, _)| m.window.mean_latency_ns())
        .collect();
    latencies.sort_by(f64::total_cmp);
    let median = latencies.get(latencies.len() / 2).copied();
    for (metrics, mut checks) in &mut devices {
        let (Some(sample), window) = (metrics.latest, metrics.window) else {
            continue;
        };
        let heartbeat = t.level(
            sample.heartbeat_age_ns as f64,
            t.heartbeat_age_warning_ns as f64,
            t.heartbeat_age_critical_ns as f64,
        );
        let error_rate = t.level(
            window.error_rate(),
            t.error_rate_warning,
            t.error_rate_critical,
        );
        let memory = if sample.hbm_capacity == 0 {
            Level::Ok
        } else {
            t.level(
                sample.hbm_used as f64 / sample.hbm_capacity as f64,
                t.memory_warning,
                t.memory_critical,
            )
        };
        let straggling = match (window.mean_latency_ns(), median) {
            (Some(mine), Some(median))
                if mine > t.straggler_factor * median
                    && mine - median > t.straggler_min_excess_ns as f64 =>
            {
                Level::Warning
            }
            _ => Level::Ok,
        };
        let next = HealthChecks {
            heartbeat: checks.heartbeat.next(heartbeat, now),
            error_rate: checks.error_rate.next(error_rate, now),
            memory: checks.memory.next(memory, now),
            straggling: checks.straggling.next(straggling, now),
        };
        if *checks != next {
            *checks = next;
        }
    }
}
