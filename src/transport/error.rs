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
    /// The ranks of a pod split over processes could not exchange a tick.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// A pod split over several processes (ranks) that cannot start or go on.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// More ranks than the pod has hosts: a rank would own nothing.
    #[error(
        "{ranks} ranks for a pod of {hosts} hosts: each rank owns a contiguous block of \
         hosts, so use at most {hosts} ranks"
    )]
    TooManyRanks {
        /// Ranks started.
        ranks: u32,
        /// Hosts in the pod.
        hosts: u32,
    },
    /// The rank is not below the rank count.
    #[error("rank {rank} of {ranks} does not exist")]
    NoSuchRank {
        /// The rank.
        rank: u32,
        /// Ranks started.
        ranks: u32,
    },
    /// The ranks were not started with the same pod, binary or run.
    #[error("the ranks disagree, so they cannot run one pod: {0}")]
    Mismatch(String),
    /// Rank 0 could not do its part of a step all ranks take together
    /// (merge the world, commit or read a checkpoint), and says why.
    #[error("rank 0 stopped the ranks: {0}")]
    Coordinator(String),
    /// A rank stopped answering within the wall-clock bound.
    #[error(
        "rank {rank} (hosts {hosts}) was lost: {reason}; the ranks stop here and the \
         last committed checkpoint stays as it was"
    )]
    RankLost {
        /// The lost rank.
        rank: u32,
        /// Its hosts, `first..=last`.
        hosts: String,
        /// What was waited for, and how long.
        reason: String,
    },
    /// A frame from another rank could not be decoded, or came out of turn.
    #[error("rank {rank} sent {what}")]
    Protocol {
        /// The sender.
        rank: u32,
        /// What was wrong.
        what: String,
    },
    /// The message layer itself failed.
    #[error("the message layer failed: {0}")]
    Transport(String),
}

/// Parts of a split pod's transport that cannot be one process's.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum MergePartsError {
    /// Two parts hold the sequence of one sender.
    #[error("{device} sent messages in two parts (one is part {part})")]
    SenderInTwoParts {
        /// The sender.
        device: DeviceId,
        /// The later part that claims it.
        part: usize,
    },
}

impl From<TransportError> for crate::error::OptimError {
    fn from(error: TransportError) -> Self {
        crate::error::OptimError::new(crate::error::ErrorKind::Transport, error)
    }
}

/// A split pod's rank failure is a transport error.
impl From<ClusterError> for crate::error::OptimError {
    fn from(error: ClusterError) -> Self {
        TransportError::Cluster(error).into()
    }
}
