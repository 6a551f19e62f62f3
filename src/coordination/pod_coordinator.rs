//! [`PodCoordinator`]: barriers and faults over a pod built from a device
//! count.

use crate::barrier::{BarrierFailure, BarrierOutcome, BarrierSpec};
use crate::error::OptimError;
use crate::hardware::TpuGeneration;
use crate::pod::Pod;
use crate::topology::{DeviceId, Topology, parse_topology};
use std::collections::BTreeSet;
use std::time::Duration;
use thiserror::Error;

/// How to build a coordinated pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodConfig {
    /// Chips in the pod (at least 1). They are laid out as the squarest
    /// torus slice the generation allows (4096 v4 chips: 16x16x16).
    pub num_devices: usize,
    /// Chip generation.
    pub tpu_version: TpuGeneration,
    /// Time between heartbeats.
    pub heartbeat_interval: Duration,
    /// Silence before a device is declared failed.
    pub heartbeat_timeout: Duration,
    /// How long a barrier may wait before it fails.
    pub barrier_timeout: Duration,
    /// Simulated time per tick.
    pub tick: Duration,
}

impl Default for PodConfig {
    fn default() -> Self {
        PodConfig {
            num_devices: 8,
            tpu_version: TpuGeneration::V4,
            heartbeat_interval: Duration::from_secs(1),
            heartbeat_timeout: Duration::from_secs(10),
            barrier_timeout: Duration::from_secs(60),
            tick: Duration::from_millis(10),
        }
    }
}

/// What can go wrong coordinating a pod.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CoordinationError {
    /// The configuration cannot describe a pod.
    #[error("invalid pod configuration: {0}")]
    InvalidConfig(String),
    /// A barrier failed: who arrived, who did not, and why.
    #[error("{0}")]
    BarrierFailed(Box<BarrierFailure>),
    /// The pod refused an operation.
    #[error(transparent)]
    Pod(#[from] Box<OptimError>),
}

impl From<OptimError> for CoordinationError {
    fn from(error: OptimError) -> Self {
        CoordinationError::Pod(Box::new(error))
    }
}

/// A pod with barrier synchronization and fault injection, in simulated time.
#[derive(Debug)]
pub struct PodCoordinator {
    pod: Pod,
    config: PodConfig,
    /// Devices the user left out of synchronization.
    excluded: BTreeSet<u32>,
}

impl PodCoordinator {
    /// Builds the pod described by `config`.
    pub fn new(config: PodConfig) -> Result<PodCoordinator, CoordinationError> {
        let topology = topology_for(&config)?;
        let pod = Pod::from_topology(topology)?;
        Ok(PodCoordinator {
            pod,
            config,
            excluded: BTreeSet::new(),
        })
    }

    /// A real barrier across the [participants](Self::participants): each
    /// running one arrives over the control network and simulated time
    /// advances until the barrier completes, or fails because a participant
    /// died, stalled past the heartbeat timeout, or the barrier timeout
    /// passed. A device declared failed is left out of every later barrier,
    /// so the pod synchronizes again after a failure (with one device
    /// fewer); the failure itself names the participants that never arrived.
    pub fn synchronize_devices(&mut self, id: String) -> Result<(), CoordinationError> {
        let barrier = self.pod.create_barrier(
            BarrierSpec::named(id)
                .participants(self.participants())
                .timeout(self.config.barrier_timeout)
                .auto_arrive(),
        )?;
        match self.pod.wait_for_barrier(barrier)? {
            BarrierOutcome::Completed { .. } => Ok(()),
            BarrierOutcome::Failed(failure) => {
                Err(CoordinationError::BarrierFailed(Box::new(failure)))
            }
            BarrierOutcome::Pending => unreachable!("wait_for_barrier returns a final outcome"),
        }
    }

    /// The devices [`synchronize_devices`](Self::synchronize_devices) waits
    /// for: every device not declared failed by the coordination service and
    /// not [excluded](Self::exclude_device) by the user, by id.
    pub fn participants(&self) -> Vec<DeviceId> {
        self.healthy_devices()
            .into_iter()
            .filter(|d| !self.excluded.contains(&d.0))
            .collect()
    }

    /// Leaves a device out of later synchronizations (a device known to be
    /// going away, before the detector declares it failed).
    pub fn exclude_device(&mut self, device: impl Into<DeviceId>) -> Result<(), CoordinationError> {
        let device = device.into();
        self.pod.device_entity(device)?;
        self.excluded.insert(device.0);
        Ok(())
    }

    /// Takes a device [excluded](Self::exclude_device) by the user back into
    /// synchronization (a device declared failed stays out).
    pub fn include_device(&mut self, device: impl Into<DeviceId>) -> Result<(), CoordinationError> {
        let device = device.into();
        self.pod.device_entity(device)?;
        self.excluded.remove(&device.0);
        Ok(())
    }

    /// All-reduces one buffer per device (indexed by device id) over the
    /// pod's torus, stepping simulated time until the collective completes.
    pub fn all_reduce<T: crate::collectives::Element>(
        &mut self,
        buffers: &mut [Vec<T>],
        op: crate::collectives::ReduceOp,
    ) -> Result<(), CoordinationError> {
        self.pod.all_reduce(buffers, op)?;
        Ok(())
    }

    /// Devices in the pod.
    pub fn num_devices(&self) -> usize {
        self.pod.topology().num_devices() as usize
    }

    /// Devices the coordination service believes are not failed.
    pub fn healthy_devices(&self) -> Vec<DeviceId> {
        (0..self.num_devices() as u32)
            .filter(|&d| self.pod.health(d).is_some_and(|h| !h.is_failed()))
            .map(DeviceId)
            .collect()
    }

    /// Kills a device now (fault injection; a [`DeviceId`] or its bare
    /// number).
    pub fn kill_device(&mut self, device: impl Into<DeviceId>) -> Result<(), CoordinationError> {
        Ok(self.pod.kill_device(device)?)
    }

    /// The configuration this coordinator was built from.
    pub fn config(&self) -> &PodConfig {
        &self.config
    }

    /// The underlying pod.
    pub fn pod(&self) -> &Pod {
        &self.pod
    }

    /// The underlying pod, to step it or inject other faults.
    pub fn pod_mut(&mut self) -> &mut Pod {
        &mut self.pod
    }
}

/// The squarest factorization of `n` into `dims` factors, ascending.
fn squarest_shape(n: u64, dims: usize) -> Vec<u64> {
    if dims == 1 {
        return vec![n];
    }
    let mut best: Option<Vec<u64>> = None;
    let mut a = 1;
    while a * a <= n || a == 1 {
        if n.is_multiple_of(a) {
            let mut shape = squarest_shape(n / a, dims - 1);
            shape.push(a);
            shape.sort_unstable();
            let spread = shape[dims - 1];
            if best.as_ref().is_none_or(|b| spread < b[dims - 1]) {
                best = Some(shape);
            }
        }
        a += 1;
        if a > n {
            break;
        }
    }
    best.unwrap_or_else(|| vec![n])
}

/// The topology a [`PodConfig`] describes.
fn topology_for(config: &PodConfig) -> Result<Topology, CoordinationError> {
    if config.num_devices == 0 {
        return Err(CoordinationError::InvalidConfig(
            "num_devices is 0; a pod needs at least one device".into(),
        ));
    }
    let spec = config.tpu_version.spec();
    let shape = squarest_shape(config.num_devices as u64, spec.torus_dims);
    let shape_text: Vec<String> = shape.iter().map(u64::to_string).collect();
    let host_divides = shape
        .iter()
        .zip(spec.chips_per_host_bounds)
        .all(|(&d, b)| d.is_multiple_of(u64::from(b).min(d)));
    let chips_per_host = if host_divides {
        String::new()
    } else {
        format!(
            "chips_per_host: \"{}\",",
            vec!["1"; spec.torus_dims].join("x")
        )
    };
    // A device count need not be a shape Google Cloud sells; say so.
    let mut dims = [1u32; 3];
    for (axis, &d) in shape.iter().enumerate() {
        dims[axis] = u32::try_from(d).unwrap_or(u32::MAX);
    }
    let custom = if spec.slice_shapes.offers(dims) {
        ""
    } else {
        "custom: true,"
    };
    let millis = |d: Duration| d.as_secs_f64() * 1e3;
    let text = format!(
        "Pod(name: \"{}-{}\", generation: \"{}\", shape: \"{}\", {chips_per_host} {custom} \
         heartbeat: (interval_ms: {:?}, timeout_ms: {:?}), tick_ms: {:?})",
        spec.name,
        config.num_devices,
        spec.name,
        shape_text.join("x"),
        millis(config.heartbeat_interval),
        millis(config.heartbeat_timeout),
        millis(config.tick),
    );
    parse_topology(&text, "PodConfig").map_err(|e| CoordinationError::InvalidConfig(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_as_square_as_the_count_allows() {
        assert_eq!(squarest_shape(4096, 3), vec![16, 16, 16]);
        assert_eq!(squarest_shape(8, 3), vec![2, 2, 2]);
        assert_eq!(squarest_shape(256, 2), vec![16, 16]);
        assert_eq!(squarest_shape(7, 3), vec![1, 1, 7]);
        assert_eq!(squarest_shape(1, 3), vec![1, 1, 1]);
        assert_eq!(squarest_shape(12, 2), vec![3, 4]);
    }

    #[test]
    fn zero_devices_is_an_error() {
        let error = PodCoordinator::new(PodConfig {
            num_devices: 0,
            ..Default::default()
        })
        .unwrap_err();
        assert!(error.to_string().contains("num_devices is 0"), "{error}");
    }

    #[test]
    fn odd_counts_fall_back_to_one_chip_per_host() {
        let pod = PodCoordinator::new(PodConfig {
            num_devices: 7,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(pod.num_devices(), 7);
        assert_eq!(pod.pod().topology().num_hosts(), 7);
    }

    #[test]
    fn the_config_reaches_the_pod() {
        let pod = PodCoordinator::new(PodConfig {
            num_devices: 16,
            tpu_version: TpuGeneration::V5e,
            heartbeat_interval: Duration::from_millis(250),
            heartbeat_timeout: Duration::from_secs(3),
            tick: Duration::from_millis(5),
            ..Default::default()
        })
        .unwrap();
        let topology = pod.pod().topology();
        assert_eq!(topology.shape_string(), "4x4");
        assert_eq!(topology.heartbeat_interval_ns, 250_000_000);
        assert_eq!(topology.heartbeat_timeout_ns, 3_000_000_000);
        assert_eq!(topology.tick_ns, 5_000_000);
    }
}
