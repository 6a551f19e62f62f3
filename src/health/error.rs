//! Why a fault could not be injected.

use thiserror::Error;

use crate::topology::DeviceId;

/// A fault that cannot be applied, or work refused on a device that is down.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FaultError {
    /// The device id is not in the pod.
    #[error("{0} is not in the pod")]
    UnknownDevice(DeviceId),
    /// No link joins the two devices.
    #[error("no link joins {0} and {1}")]
    NoSuchLink(DeviceId, DeviceId),
    /// Work was sent to a device the coordination service declared failed.
    #[error(
        "{device} was declared failed at t={:.3} s; no work runs on it (exclude it or roll back)",
        *detected_at_ns as f64 * 1e-9
    )]
    DeviceFailed {
        /// The device.
        device: DeviceId,
        /// When the detector declared it failed, ns.
        detected_at_ns: u64,
    },
    /// Work was sent to a device that was killed (the detector may not
    /// have noticed yet).
    #[error(
        "{device} was killed at t={:.3} s; no work runs on it (exclude it or roll back)",
        *killed_at_ns as f64 * 1e-9
    )]
    DeviceDead {
        /// The device.
        device: DeviceId,
        /// When it was killed, ns.
        killed_at_ns: u64,
    },
    /// A killed device cannot be resumed or paused.
    #[error("{0} was killed; it cannot be paused or resumed")]
    DeviceKilled(DeviceId),
    /// A device of a pod not built of cubes was asked for its cube.
    #[error("{0} is not in a cube: the pod file has no `cubes` (v4, v5p and tpu7x pods only)")]
    NotCubeBuilt(DeviceId),
    /// More cubes failed than there are spares to swap in.
    #[error(
        "cube(s) {failed:?} failed and {spares} healthy spare cube(s) remain; a spare-cube \
         recovery needs one per failed cube (add `cubes: (spares: N)` to the pod file, or \
         recover with rollback)"
    )]
    NoSpareCube {
        /// The failed cubes.
        failed: Vec<u32>,
        /// Healthy spares left.
        spares: u32,
    },
    /// A cube to swap out is not part of a slice.
    #[error("cube {cube} is not part of a slice; only a slice's cubes are swapped for spares")]
    CubeNotInSlice {
        /// The cube.
        cube: u32,
    },
}

impl From<FaultError> for crate::error::OptimError {
    fn from(error: FaultError) -> Self {
        crate::error::OptimError::new(crate::error::ErrorKind::Fault, error)
    }
}
