//! Why a barrier request was refused.

use thiserror::Error;

use crate::topology::DeviceId;

/// A barrier request that cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum BarrierError {
    /// A barrier with this name is still pending.
    #[error("barrier `{0}` is still pending; wait for it or pick another name")]
    StillPending(String),
    /// No barrier has this id.
    #[error("no barrier with id {0}")]
    UnknownBarrier(u64),
    /// A barrier needs at least one participant.
    #[error("barrier `{0}` has no participants")]
    NoParticipants(String),
    /// The device is not in the pod.
    #[error("{0} is not in the pod")]
    UnknownDevice(DeviceId),
    /// The device is not a participant.
    #[error("{device} is not a participant of barrier `{barrier}`; its arrival is rejected")]
    NotParticipant {
        /// The barrier.
        barrier: String,
        /// The device.
        device: DeviceId,
    },
    /// The barrier already completed or failed.
    #[error("barrier `{0}` is no longer pending")]
    NotPending(String),
    /// A wait passed the barrier's deadline and it is still pending: the
    /// barrier systems are not running on this world.
    #[error(
        "barrier `{name}` is still pending at t={:.3} s, past its deadline at t={:.3} s; \
         the barrier systems did not run",
        *now_ns as f64 * 1e-9,
        *deadline_ns as f64 * 1e-9
    )]
    Stalled {
        /// The barrier.
        name: String,
        /// Its deadline, ns.
        deadline_ns: u64,
        /// When the wait gave up, ns.
        now_ns: u64,
    },
    /// A device that is not running cannot arrive.
    #[error("{0} is not running and cannot arrive")]
    DeviceNotRunning(DeviceId),
}

impl From<BarrierError> for crate::error::OptimError {
    fn from(error: BarrierError) -> Self {
        crate::error::OptimError::new(crate::error::ErrorKind::Barrier, error)
    }
}
