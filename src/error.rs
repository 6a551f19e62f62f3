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
    /// An optimizer step was given params and grads of different shapes.
    #[error(
        "params have shape {params:?} but grads have shape {grads:?}; they must match element for element"
    )]
    ShapeMismatch {
        /// Shape of the parameters.
        params: Vec<usize>,
        /// Shape of the gradients.
        grads: Vec<usize>,
    },
    /// An optimizer's state (moments, accumulators) was built for another shape.
    #[error(
        "{optimizer}: its state has shape {state:?} but the params have shape {params:?}; \
         call reset() to start over with the new shape, or use one optimizer per tensor"
    )]
    StateShapeMismatch {
        /// The optimizer's stable name (`adam`, `sgd`, ...).
        optimizer: String,
        /// Shape the state was built for.
        state: Vec<usize>,
        /// Shape of the params passed to this step.
        params: Vec<usize>,
    },
    /// Optimizer state handed to `set_state` does not fit the optimizer.
    #[error("{optimizer}: invalid state: {reason}")]
    InvalidState {
        /// The optimizer's stable name.
        optimizer: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory involved.
        path: std::path::PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
}
