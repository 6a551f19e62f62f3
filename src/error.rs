//! The crate's error type.
//!
//! Each domain owns a `thiserror` enum that names the offending element
//! (a file and line, a device, a node); [`OptimError`] wraps them so the
//! facade types (`TPUOptimizer`, `Pod`) return one error type.

use thiserror::Error;

/// Result alias used across the crate.
pub type Result<T, E = OptimError> = std::result::Result<T, E>;

/// Every error the engine returns.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum OptimError {
    /// A configuration value is out of range or inconsistent.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The operation needs a vendor TPU runtime, which this engine never links.
    #[error("{operation} is not supported: {reason}")]
    Unsupported {
        /// What was asked for.
        operation: String,
        /// Why it cannot be done here.
        reason: String,
    },
    /// A pod file could not be read, parsed or accepted.
    #[error(transparent)]
    Topology(Box<crate::topology::TopologyError>),
    /// A fault could not be injected.
    #[error(transparent)]
    Fault(#[from] crate::health::FaultError),
    /// A collective could not run, or failed before it completed.
    #[error(transparent)]
    Collective(#[from] crate::collectives::CollectiveError),
    /// A barrier request was refused.
    #[error(transparent)]
    Barrier(#[from] crate::barrier::BarrierError),
    /// A message could not be sent.
    #[error(transparent)]
    Transport(#[from] crate::transport::TransportError),
    /// A world snapshot could not be taken or restored.
    #[error(transparent)]
    Snapshot(#[from] crate::persist::SnapshotError),
    /// A checkpoint on disk could not be written, verified or restored.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// A schedule could not be built (for instance, an ambiguous system order).
    #[error("schedule build failed: {0}")]
    Schedule(String),
    /// An optimizer step was refused: params and grads of different
    /// shapes, state built for another shape, or an invalid state.
    #[error(transparent)]
    Optimizer(crate::optimizers::OptimizerError),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory involved.
        path: std::path::PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A program could not be compiled or executed.
    #[error(transparent)]
    Compile(#[from] crate::compiler::CompileError),
    /// A compiled program failed while running.
    #[error(transparent)]
    Exec(#[from] crate::exec::runtime::ExecError),
    /// A device's HBM cannot hold a program's planned buffers or the
    /// optimizer state, or a device has no heap.
    #[error(transparent)]
    Memory(#[from] crate::memory::MemoryError),
    /// A sharded model could not be built or stepped, or a step failed in
    /// flight (naming the device or link and the phase).
    #[error(transparent)]
    Sharding(crate::sharding::ShardingError),
}

/// A sharding error that only passes on another domain's error comes back
/// as that domain's variant (a link cut at launch is a `Collective` error,
/// out of HBM a `Memory` one).
impl From<crate::sharding::ShardingError> for OptimError {
    fn from(error: crate::sharding::ShardingError) -> Self {
        use crate::sharding::ShardingError as S;
        match error {
            S::Fault(e) => OptimError::Fault(e),
            S::Collective(e) => OptimError::Collective(e),
            S::Memory(e) => OptimError::Memory(e),
            S::Exec(e) => OptimError::Exec(e),
            S::Cluster(e) => OptimError::Transport(crate::transport::TransportError::Cluster(e)),
            other => OptimError::Sharding(other),
        }
    }
}

impl From<crate::topology::TopologyError> for OptimError {
    fn from(error: crate::topology::TopologyError) -> Self {
        OptimError::Topology(Box::new(error))
    }
}

/// A wrapped failure of a wrapping optimizer (such as `TPUOptimizer`
/// through the [`crate::Optimizer`] trait) comes back as the error it was.
impl From<crate::optimizers::OptimizerError> for OptimError {
    fn from(error: crate::optimizers::OptimizerError) -> Self {
        match error {
            crate::optimizers::OptimizerError::Backend(source) => {
                match source.downcast::<OptimError>() {
                    Ok(inner) => *inner,
                    Err(source) => {
                        OptimError::Optimizer(crate::optimizers::OptimizerError::Backend(source))
                    }
                }
            }
            other => OptimError::Optimizer(other),
        }
    }
}

impl From<OptimError> for crate::optimizers::OptimizerError {
    fn from(error: OptimError) -> Self {
        match error {
            OptimError::Optimizer(inner) => inner,
            other => crate::optimizers::OptimizerError::Backend(Box::new(other)),
        }
    }
}
