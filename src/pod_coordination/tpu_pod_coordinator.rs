//! [`TPUPodCoordinator`]: the typed coordinator of a training job, a thin
//! layer over [`PodCoordinator`] that every operation delegates to.

use crate::collectives::{Element, ReduceOp};
use crate::coordination::{CoordinationError, PodConfig, PodCoordinator};
use crate::hardware::TpuGeneration;
use crate::topology::DeviceId;
use std::marker::PhantomData;
use std::time::Duration;

/// How a training job's pod is set up.
#[derive(Debug, Clone, PartialEq)]
pub struct PodCoordinationConfig {
    /// Chips in the pod; zero is an error.
    pub num_devices: usize,
    /// Chip generation.
    pub tpu_version: TpuGeneration,
    /// Heartbeat period.
    pub heartbeat_interval: Duration,
    /// Silence before a device is declared failed.
    pub heartbeat_timeout: Duration,
    /// How long a synchronization barrier may take.
    pub barrier_timeout: Duration,
}

impl Default for PodCoordinationConfig {
    fn default() -> Self {
        let base = PodConfig::default();
        PodCoordinationConfig {
            num_devices: base.num_devices,
            tpu_version: base.tpu_version,
            heartbeat_interval: base.heartbeat_interval,
            heartbeat_timeout: base.heartbeat_timeout,
            barrier_timeout: base.barrier_timeout,
        }
    }
}

impl From<&PodCoordinationConfig> for PodConfig {
    fn from(config: &PodCoordinationConfig) -> PodConfig {
        PodConfig {
            num_devices: config.num_devices,
            tpu_version: config.tpu_version,
            heartbeat_interval: config.heartbeat_interval,
            heartbeat_timeout: config.heartbeat_timeout,
            barrier_timeout: config.barrier_timeout,
            ..PodConfig::default()
        }
    }
}

/// Coordinates a pod for gradients of element type `T`.
///
/// ```
/// use optirs_tpu::pod_coordination::{PodCoordinationConfig, TPUPodCoordinator};
/// use optirs_tpu::collectives::ReduceOp;
///
/// let mut pod = TPUPodCoordinator::<f32>::new(PodCoordinationConfig {
///     num_devices: 4,
///     ..Default::default()
/// })?;
/// pod.synchronize("step-0")?;
/// let mut grads = vec![vec![1.0f32; 8]; 4];
/// pod.all_reduce_gradients(&mut grads, ReduceOp::Mean)?;
/// assert!(grads.iter().all(|g| g.iter().all(|&x| x == 1.0)));
/// # Ok::<(), optirs_tpu::coordination::CoordinationError>(())
/// ```
#[derive(Debug)]
pub struct TPUPodCoordinator<T> {
    inner: PodCoordinator,
    _element: PhantomData<fn() -> T>,
}

impl<T: Element> TPUPodCoordinator<T> {
    /// Builds the pod; zero devices is an error.
    pub fn new(config: PodCoordinationConfig) -> Result<Self, CoordinationError> {
        if config.num_devices == 0 {
            return Err(CoordinationError::InvalidConfig(
                "TPUPodCoordinator needs at least one device (num_devices is 0)".into(),
            ));
        }
        Ok(TPUPodCoordinator {
            inner: PodCoordinator::new(PodConfig::from(&config))?,
            _element: PhantomData,
        })
    }

    /// A barrier across every device ([`PodCoordinator::synchronize_devices`]).
    pub fn synchronize(&mut self, id: &str) -> Result<(), CoordinationError> {
        self.inner.synchronize_devices(id.to_string())
    }

    /// All-reduces one gradient buffer per device over the torus.
    pub fn all_reduce_gradients(
        &mut self,
        grads: &mut [Vec<T>],
        op: ReduceOp,
    ) -> Result<(), CoordinationError> {
        self.inner.all_reduce(grads, op)
    }

    /// Devices not declared failed.
    pub fn healthy_devices(&self) -> Vec<DeviceId> {
        self.inner.healthy_devices()
    }

    /// Devices in the pod.
    pub fn num_devices(&self) -> usize {
        self.inner.num_devices()
    }

    /// Kills a device (fault injection; a [`DeviceId`] or its bare number).
    pub fn kill_device(&mut self, device: impl Into<DeviceId>) -> Result<(), CoordinationError> {
        self.inner.kill_device(device)
    }

    /// The coordinator every call delegates to.
    pub fn coordinator(&self) -> &PodCoordinator {
        &self.inner
    }

    /// The coordinator, mutably.
    pub fn coordinator_mut(&mut self) -> &mut PodCoordinator {
        &mut self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_devices_is_an_error() {
        let error = TPUPodCoordinator::<f32>::new(PodCoordinationConfig {
            num_devices: 0,
            ..Default::default()
        })
        .unwrap_err();
        assert!(error.to_string().contains("num_devices is 0"), "{error}");
    }

    #[test]
    fn every_operation_reaches_the_pod() {
        let mut pod = TPUPodCoordinator::<i32>::new(PodCoordinationConfig {
            num_devices: 8,
            heartbeat_timeout: Duration::from_secs(3),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(pod.num_devices(), 8);
        assert_eq!(
            pod.coordinator().config().heartbeat_timeout,
            Duration::from_secs(3)
        );
        pod.synchronize("a").unwrap();
        let mut grads: Vec<Vec<i32>> = (0..8).map(|r| vec![r; 3]).collect();
        pod.all_reduce_gradients(&mut grads, ReduceOp::Sum).unwrap();
        assert!(grads.iter().all(|g| *g == vec![28, 28, 28]));
        pod.kill_device(2).unwrap();
        let error = pod.synchronize("b").unwrap_err().to_string();
        assert!(
            error.contains("7/8 arrived") && error.contains("device 2"),
            "{error}"
        );
        assert_eq!(pod.healthy_devices().len(), 7);
    }
}
