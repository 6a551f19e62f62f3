//! Why an optimizer refused a step. Nothing changed when one is returned:
//! the state advances only on `Ok`.

use thiserror::Error;

/// Result alias of the optimizers: they return the crate's one error type
/// ([`OptimError`](crate::error::OptimError), kind `Optimizer`, holding an
/// [`OptimizerError`]), so generic code over [`crate::Optimizer`] returns
/// what `step` returns, unchanged, and a wrapping optimizer
/// (`TPUOptimizer`) passes on its compile, memory or execution errors as
/// they are.
pub type Result<T, E = crate::error::OptimError> = std::result::Result<T, E>;

/// An optimizer step or state change was refused.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum OptimizerError {
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
    /// No optimizer has this name.
    #[error("unknown optimizer `{name}` (known: {known})")]
    Unknown {
        /// The name asked for.
        name: String,
        /// The names there are.
        known: String,
    },
}

impl From<OptimizerError> for crate::error::OptimError {
    fn from(error: OptimizerError) -> Self {
        crate::error::OptimError::new(crate::error::ErrorKind::Optimizer, error)
    }
}
