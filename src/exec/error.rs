//! The error of a run of the fast runtime ([`crate::exec::runtime`], which
//! re-exports it as `exec::runtime::ExecError`).

/// An execution failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// The arguments do not match the program's parameters.
    #[error("{0}")]
    Arguments(String),
    /// A kernel could not run.
    #[error("kernel `{kernel}`: {message}")]
    Kernel {
        /// The kernel's name (`fusion.0`).
        kernel: String,
        /// What went wrong.
        message: String,
    },
    /// A custom call failed or has no handler.
    #[error("custom call `{target}`: {message}")]
    CustomCall {
        /// The call target.
        target: String,
        /// What went wrong.
        message: String,
    },
}

impl From<ExecError> for crate::error::OptimError {
    fn from(error: ExecError) -> Self {
        crate::error::OptimError::new(crate::error::ErrorKind::Exec, error)
    }
}
