//! Why a data message could not be sent.

use thiserror::Error;

use crate::topology::DeviceId;

/// A data message that cannot be sent.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The device id is not in the pod.
    #[error("{0} is not in the pod")]
    UnknownDevice(DeviceId),
    /// No path of links that are up joins the two devices.
    #[error("no route from {from} to {to}: the links between them are cut")]
    NoRoute {
        /// Sender.
        from: DeviceId,
        /// Receiver.
        to: DeviceId,
    },
}
