//! Why a fault could not be injected.

use thiserror::Error;

use crate::topology::DeviceId;

/// A fault that cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FaultError {
    /// The device id is not in the pod.
    #[error("{0} is not in the pod")]
    UnknownDevice(DeviceId),
    /// No link joins the two devices.
    #[error("no link joins {0} and {1}")]
    NoSuchLink(DeviceId, DeviceId),
    /// A killed device cannot be resumed or paused.
    #[error("{0} was killed; it cannot be paused or resumed")]
    DeviceKilled(DeviceId),
}
