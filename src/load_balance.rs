//! Placement of workloads over the healthy devices of a pod.
//!
//! A [`LoadBalancer`] tracks, per device, its health, a load reported from
//! outside (utilization from monitoring, say) and the workloads placed on
//! it. A device's load is its reported load plus the costs of its active
//! workloads, recomputed from the active set whenever it changes, so a
//! device whose workloads have all finished is back at exactly its reported
//! load (0 unless reported otherwise): no float residue accumulates.
//!
//! Policies:
//!
//! * [`Policy::LeastLoaded`]: the healthy device with the smallest load;
//!   ties go to fewer active workloads, then to the smallest [`DeviceId`].
//! * [`Policy::RoundRobin`]: the next healthy device after the previously
//!   chosen one, in [`DeviceId`] order, wrapping around.
//!
//! **Valid loads only.** A reported load and a workload cost must both be
//! finite and ≥ 0; anything else (NaN, ±∞, a negative number) is an error
//! ([`LoadBalanceError::InvalidLoad`], [`LoadBalanceError::InvalidCost`])
//! and leaves the balancer unchanged. A negative or −∞ load would otherwise
//! win every placement, and a NaN would have no place in the order; a failed
//! measurement is the caller's to handle (report nothing, or mark the device
//! unhealthy). `-0.0` is taken as `0.0`. As a last defence, loads are
//! compared with [`f64::total_cmp`] after mapping NaN to +∞ (a sum of huge
//! finite loads may reach +∞, never NaN), so no comparison panics.
//!
//! Placement scans the devices (O(devices) per call: 4096 devices take a
//! few microseconds), which keeps every update O(1) and the choice exact.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use crate::topology::DeviceId;

/// A workload, named by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WorkId(pub u64);

impl fmt::Display for WorkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "work {}", self.0)
    }
}

/// A workload to place: its id and its cost in the caller's load unit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// Unique among active workloads.
    pub id: WorkId,
    /// Finite and ≥ 0.
    pub cost: f64,
}

/// How [`LoadBalancer::place`] chooses a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Policy {
    /// The healthy device with the least load.
    LeastLoaded,
    /// Healthy devices in turn.
    RoundRobin,
}

/// Why a placement or update was refused. Nothing changes when one is
/// returned.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum LoadBalanceError {
    /// Every device is unhealthy (or there are none).
    #[error(
        "no healthy device to place {work} on: {unhealthy} of {devices} devices are unhealthy; mark a device healthy or add one"
    )]
    NoHealthyDevice {
        /// The workload that could not be placed.
        work: WorkId,
        /// Devices known.
        devices: usize,
        /// Of which unhealthy.
        unhealthy: usize,
    },
    /// The device is not known to the balancer.
    #[error("{0} is not known to the load balancer")]
    UnknownDevice(DeviceId),
    /// The device was already added.
    #[error("{0} was already added to the load balancer")]
    DuplicateDevice(DeviceId),
    /// No active workload has this id.
    #[error("{0} is not active: it was never placed or has already finished")]
    UnknownWork(WorkId),
    /// A workload with this id is already active.
    #[error("{work} is already active on {device}; finish it before placing it again")]
    DuplicateWork {
        /// The workload.
        work: WorkId,
        /// Where it runs.
        device: DeviceId,
    },
    /// A reported load that is NaN, infinite or negative.
    #[error("{device} reported load {load}; a load must be finite and ≥ 0")]
    InvalidLoad {
        /// The device.
        device: DeviceId,
        /// The load as reported.
        load: f64,
    },
    /// A workload cost that is NaN, infinite or negative.
    #[error("{work} has cost {cost}; a cost must be finite and ≥ 0")]
    InvalidCost {
        /// The workload.
        work: WorkId,
        /// Its cost.
        cost: f64,
    },
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct DeviceState {
    healthy: bool,
    reported: f64,
    /// Active workloads and their costs, in placement order.
    active: Vec<Workload>,
    load: f64,
}

impl DeviceState {
    fn recompute(&mut self) {
        self.load = self.reported + self.active.iter().map(|w| w.cost).sum::<f64>();
    }

    /// The load as ranked: NaN counts as +∞.
    fn rank_load(&self) -> f64 {
        if self.load.is_nan() {
            f64::INFINITY
        } else {
            self.load
        }
    }
}

/// Least-loaded or round-robin placement over healthy devices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadBalancer {
    policy: Policy,
    devices: BTreeMap<DeviceId, DeviceState>,
    placements: BTreeMap<WorkId, DeviceId>,
    last_round_robin: Option<DeviceId>,
}

impl LoadBalancer {
    /// A balancer over `devices`, all healthy and idle. Repeated ids are
    /// kept once.
    pub fn new(policy: Policy, devices: impl IntoIterator<Item = DeviceId>) -> Self {
        let devices = devices
            .into_iter()
            .map(|id| {
                let state = DeviceState {
                    healthy: true,
                    ..DeviceState::default()
                };
                (id, state)
            })
            .collect();
        Self {
            policy,
            devices,
            placements: BTreeMap::new(),
            last_round_robin: None,
        }
    }

    /// The placement policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Adds a healthy, idle device.
    pub fn add_device(&mut self, id: DeviceId) -> Result<(), LoadBalanceError> {
        if self.devices.contains_key(&id) {
            return Err(LoadBalanceError::DuplicateDevice(id));
        }
        let state = DeviceState {
            healthy: true,
            ..DeviceState::default()
        };
        self.devices.insert(id, state);
        Ok(())
    }

    /// Places `work` on a healthy device chosen by the policy.
    pub fn place(&mut self, work: Workload) -> Result<DeviceId, LoadBalanceError> {
        if !(work.cost.is_finite() && work.cost >= 0.0) {
            return Err(LoadBalanceError::InvalidCost {
                work: work.id,
                cost: work.cost,
            });
        }
        if let Some(&device) = self.placements.get(&work.id) {
            return Err(LoadBalanceError::DuplicateWork {
                work: work.id,
                device,
            });
        }
        let chosen = match self.policy {
            Policy::LeastLoaded => self.least_loaded(),
            Policy::RoundRobin => self.next_round_robin(),
        }
        .ok_or_else(|| LoadBalanceError::NoHealthyDevice {
            work: work.id,
            devices: self.devices.len(),
            unhealthy: self.devices.values().filter(|d| !d.healthy).count(),
        })?;
        if self.policy == Policy::RoundRobin {
            self.last_round_robin = Some(chosen);
        }
        if let Some(state) = self.devices.get_mut(&chosen) {
            state.active.push(work);
            state.recompute();
        }
        self.placements.insert(work.id, chosen);
        Ok(chosen)
    }

    /// Marks `work` finished; returns the device it ran on. The device's
    /// load drops by the workload's cost (exactly to its reported load when
    /// nothing else is active).
    pub fn finish(&mut self, work: WorkId) -> Result<DeviceId, LoadBalanceError> {
        let device = self
            .placements
            .remove(&work)
            .ok_or(LoadBalanceError::UnknownWork(work))?;
        if let Some(state) = self.devices.get_mut(&device) {
            state.active.retain(|w| w.id != work);
            state.recompute();
        }
        Ok(device)
    }

    /// Marks a device healthy (eligible for placement) or not. Work already
    /// on an unhealthy device stays there until finished or evacuated.
    pub fn set_healthy(&mut self, id: DeviceId, healthy: bool) -> Result<(), LoadBalanceError> {
        let state = self
            .devices
            .get_mut(&id)
            .ok_or(LoadBalanceError::UnknownDevice(id))?;
        state.healthy = healthy;
        Ok(())
    }

    /// Sets the load measured on a device outside the balancer's own
    /// placements. The load must be finite and ≥ 0 (`-0.0` counts as `0.0`);
    /// anything else is [`LoadBalanceError::InvalidLoad`] and changes nothing.
    pub fn report_load(&mut self, id: DeviceId, load: f64) -> Result<(), LoadBalanceError> {
        let state = self
            .devices
            .get_mut(&id)
            .ok_or(LoadBalanceError::UnknownDevice(id))?;
        if !(load.is_finite() && load >= 0.0) {
            return Err(LoadBalanceError::InvalidLoad { device: id, load });
        }
        // `-0.0 + 0.0` is `+0.0`: one zero, whatever sign was reported.
        state.reported = load + 0.0;
        state.recompute();
        Ok(())
    }

    /// Removes and returns every workload active on `id` (oldest first), so
    /// the caller can place them again elsewhere.
    pub fn evacuate(&mut self, id: DeviceId) -> Result<Vec<Workload>, LoadBalanceError> {
        let state = self
            .devices
            .get_mut(&id)
            .ok_or(LoadBalanceError::UnknownDevice(id))?;
        let works = std::mem::take(&mut state.active);
        state.recompute();
        for w in &works {
            self.placements.remove(&w.id);
        }
        Ok(works)
    }

    /// A device's current load (reported plus active costs).
    pub fn load(&self, id: DeviceId) -> Option<f64> {
        self.devices.get(&id).map(|d| d.load)
    }

    /// Whether the device is healthy.
    pub fn is_healthy(&self, id: DeviceId) -> Option<bool> {
        self.devices.get(&id).map(|d| d.healthy)
    }

    /// Whether the device has no active workload.
    pub fn is_idle(&self, id: DeviceId) -> Option<bool> {
        self.devices.get(&id).map(|d| d.active.is_empty())
    }

    /// Active workloads on a device, oldest first.
    pub fn active_on(&self, id: DeviceId) -> Option<&[Workload]> {
        self.devices.get(&id).map(|d| d.active.as_slice())
    }

    /// Where an active workload runs.
    pub fn device_of(&self, work: WorkId) -> Option<DeviceId> {
        self.placements.get(&work).copied()
    }

    /// Every device, in id order.
    pub fn devices(&self) -> impl Iterator<Item = DeviceId> + '_ {
        self.devices.keys().copied()
    }

    fn least_loaded(&self) -> Option<DeviceId> {
        self.devices
            .iter()
            .filter(|(_, d)| d.healthy)
            .min_by(|(a_id, a), (b_id, b)| {
                a.rank_load()
                    .total_cmp(&b.rank_load())
                    .then(a.active.len().cmp(&b.active.len()))
                    .then(a_id.cmp(b_id))
            })
            .map(|(&id, _)| id)
    }

    fn next_round_robin(&self) -> Option<DeviceId> {
        let healthy = |(_, d): &(&DeviceId, &DeviceState)| d.healthy;
        let after = match self.last_round_robin {
            Some(last) => self
                .devices
                .range((std::ops::Bound::Excluded(last), std::ops::Bound::Unbounded))
                .find(healthy),
            None => None,
        };
        after
            .or_else(|| self.devices.iter().find(healthy))
            .map(|(&id, _)| id)
    }
}

/// Orders loads as [`LoadBalancer`] ranks them: NaN as +∞, then
/// [`f64::total_cmp`].
pub fn compare_loads(a: f64, b: f64) -> Ordering {
    let rank = |x: f64| if x.is_nan() { f64::INFINITY } else { x };
    rank(a).total_cmp(&rank(b))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ids(n: u32) -> impl Iterator<Item = DeviceId> {
        (0..n).map(DeviceId)
    }

    fn work(id: u64, cost: f64) -> Workload {
        Workload {
            id: WorkId(id),
            cost,
        }
    }

    #[test]
    fn least_loaded_fills_the_emptiest_device_and_returns_to_idle() {
        let mut lb = LoadBalancer::new(Policy::LeastLoaded, ids(3));
        assert_eq!(lb.place(work(1, 5.0)), Ok(DeviceId(0)));
        assert_eq!(lb.place(work(2, 1.0)), Ok(DeviceId(1)));
        assert_eq!(lb.place(work(3, 1.0)), Ok(DeviceId(2)));
        assert_eq!(lb.place(work(4, 0.5)), Ok(DeviceId(1)));
        assert_eq!(lb.load(DeviceId(1)), Some(1.5));
        assert_eq!(lb.finish(WorkId(2)), Ok(DeviceId(1)));
        assert_eq!(lb.finish(WorkId(4)), Ok(DeviceId(1)));
        assert_eq!(lb.load(DeviceId(1)), Some(0.0));
        assert_eq!(lb.is_idle(DeviceId(1)), Some(true));
        assert_eq!(
            lb.finish(WorkId(4)),
            Err(LoadBalanceError::UnknownWork(WorkId(4)))
        );
    }

    #[test]
    fn float_residue_does_not_survive_finishing() {
        let mut lb = LoadBalancer::new(Policy::LeastLoaded, ids(1));
        for (i, c) in [0.1, 0.2, 0.3, 1e16, 0.7].into_iter().enumerate() {
            lb.place(work(i as u64, c)).unwrap();
        }
        for i in [3, 0, 4, 1, 2] {
            lb.finish(WorkId(i)).unwrap();
        }
        assert_eq!(lb.load(DeviceId(0)), Some(0.0));
    }

    #[test]
    fn invalid_loads_are_refused_and_change_nothing() {
        let mut lb = LoadBalancer::new(Policy::LeastLoaded, ids(3));
        lb.report_load(DeviceId(0), 5.0).unwrap();
        lb.report_load(DeviceId(1), 1e300).unwrap();
        lb.report_load(DeviceId(2), 7.0).unwrap();
        for load in [f64::NAN, f64::NEG_INFINITY, f64::INFINITY, -1.0, -1e-300] {
            assert_eq!(
                lb.report_load(DeviceId(2), load)
                    .map_err(|e| matches!(e, LoadBalanceError::InvalidLoad { device, .. } if device == DeviceId(2))),
                Err(true),
                "{load}"
            );
            assert_eq!(
                lb.load(DeviceId(2)),
                Some(7.0),
                "{load} left the load alone"
            );
        }
        // A −∞ device used to win every placement; now device 0 does.
        assert_eq!(lb.place(work(1, 0.0)), Ok(DeviceId(0)));
        lb.report_load(DeviceId(2), -0.0).unwrap();
        assert!(lb.load(DeviceId(2)).unwrap().is_sign_positive());
        let error = lb.report_load(DeviceId(1), -3.0).unwrap_err().to_string();
        assert_eq!(
            error,
            "device 1 reported load -3; a load must be finite and ≥ 0"
        );
    }

    #[test]
    fn nan_never_wins_a_comparison_and_never_panics() {
        let mut lb = LoadBalancer::new(Policy::LeastLoaded, ids(3));
        assert_eq!(compare_loads(f64::NAN, f64::INFINITY), Ordering::Equal);
        assert_eq!(compare_loads(1.0, f64::NAN), Ordering::Less);
        for cost in [f64::NAN, f64::INFINITY, -1.0] {
            assert!(matches!(
                lb.place(work(9, cost)),
                Err(LoadBalanceError::InvalidCost { .. })
            ));
        }
    }

    #[test]
    fn round_robin_skips_unhealthy_devices() {
        let mut lb = LoadBalancer::new(Policy::RoundRobin, ids(4));
        lb.set_healthy(DeviceId(2), false).unwrap();
        let placed: Vec<u32> = (0..6).map(|i| lb.place(work(i, 1.0)).unwrap().0).collect();
        assert_eq!(placed, [0, 1, 3, 0, 1, 3]);
        lb.set_healthy(DeviceId(2), true).unwrap();
        let placed: Vec<u32> = (10..14)
            .map(|i| lb.place(work(i, 1.0)).unwrap().0)
            .collect();
        assert_eq!(placed, [0, 1, 2, 3]);
    }

    #[test]
    fn no_healthy_device_is_a_descriptive_error() {
        let mut lb = LoadBalancer::new(Policy::LeastLoaded, ids(2));
        lb.set_healthy(DeviceId(0), false).unwrap();
        lb.set_healthy(DeviceId(1), false).unwrap();
        let err = lb.place(work(7, 1.0)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no healthy device to place work 7 on: 2 of 2 devices are unhealthy; mark a device healthy or add one"
        );
        let mut empty = LoadBalancer::new(Policy::RoundRobin, ids(0));
        assert!(matches!(
            empty.place(work(1, 1.0)),
            Err(LoadBalanceError::NoHealthyDevice { devices: 0, .. })
        ));
        assert_eq!(
            lb.set_healthy(DeviceId(5), true),
            Err(LoadBalanceError::UnknownDevice(DeviceId(5)))
        );
    }

    #[test]
    fn duplicate_work_and_evacuation() {
        let mut lb = LoadBalancer::new(Policy::LeastLoaded, ids(2));
        lb.place(work(1, 2.0)).unwrap();
        assert!(matches!(
            lb.place(work(1, 2.0)),
            Err(LoadBalanceError::DuplicateWork {
                device: DeviceId(0),
                ..
            })
        ));
        lb.place(work(2, 1.0)).unwrap();
        lb.place(work(3, 1.0)).unwrap();
        lb.set_healthy(DeviceId(1), false).unwrap();
        let moved = lb.evacuate(DeviceId(1)).unwrap();
        assert_eq!(moved.iter().map(|w| w.id.0).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(lb.is_idle(DeviceId(1)), Some(true));
        for w in moved {
            assert_eq!(lb.place(w), Ok(DeviceId(0)));
        }
        assert_eq!(lb.load(DeviceId(0)), Some(4.0));
        assert_eq!(
            lb.add_device(DeviceId(1)),
            Err(LoadBalanceError::DuplicateDevice(DeviceId(1)))
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Place(f64),
        Finish(usize),
        Health(u32, bool),
        Report(u32, f64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0.0f64..100.0).prop_map(Op::Place),
            3 => any::<usize>().prop_map(Op::Finish),
            1 => (0u32..6, any::<bool>()).prop_map(|(d, h)| Op::Health(d, h)),
            1 => (0u32..6, prop_oneof![Just(f64::NAN), Just(f64::NEG_INFINITY), -5.0f64..0.0, 0.0f64..50.0]).prop_map(|(d, l)| Op::Report(d, l)),
        ]
    }

    proptest! {
        #[test]
        fn placements_go_to_healthy_devices_and_loads_return_to_reported(
            least in any::<bool>(),
            ops in prop::collection::vec(op(), 0..80),
        ) {
            let policy = if least { Policy::LeastLoaded } else { Policy::RoundRobin };
            let mut lb = LoadBalancer::new(policy, ids(6));
            let mut active: Vec<WorkId> = Vec::new();
            let mut reported = [0.0f64; 6];
            let mut next = 0u64;
            for op in ops {
                match op {
                    Op::Place(cost) => {
                        next += 1;
                        let before: Vec<(DeviceId, f64, bool)> = lb
                            .devices()
                            .map(|d| (d, lb.load(d).unwrap(), lb.is_healthy(d).unwrap()))
                            .collect();
                        match lb.place(work(next, cost)) {
                            Ok(device) => {
                                prop_assert_eq!(lb.is_healthy(device), Some(true));
                                if least {
                                    let chosen = before.iter().find(|b| b.0 == device).unwrap().1;
                                    for &(_, load, healthy) in &before {
                                        if healthy {
                                            prop_assert_ne!(compare_loads(chosen, load), Ordering::Greater);
                                        }
                                    }
                                }
                                active.push(WorkId(next));
                            }
                            Err(LoadBalanceError::NoHealthyDevice { .. }) => {
                                prop_assert!(before.iter().all(|b| !b.2));
                            }
                            Err(e) => prop_assert!(false, "unexpected {e}"),
                        }
                    }
                    Op::Finish(i) if !active.is_empty() => {
                        let w = active.swap_remove(i % active.len());
                        prop_assert!(lb.finish(w).is_ok());
                    }
                    Op::Finish(_) => {}
                    Op::Health(d, h) => lb.set_healthy(DeviceId(d), h).unwrap(),
                    Op::Report(d, l) => {
                        let valid = l.is_finite() && l >= 0.0;
                        prop_assert_eq!(lb.report_load(DeviceId(d), l).is_ok(), valid, "{}", l);
                        if valid {
                            reported[d as usize] = l;
                        }
                    }
                }
            }
            for w in active {
                lb.finish(w).unwrap();
            }
            for d in 0..6u32 {
                let load = lb.load(DeviceId(d)).unwrap();
                let want = reported[d as usize];
                prop_assert!(load == want, "{load} vs {want}");
                prop_assert_eq!(lb.is_idle(DeviceId(d)), Some(true));
            }
        }
    }
}
