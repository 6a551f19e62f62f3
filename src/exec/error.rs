//! The errors of a run of the fast runtime ([`crate::exec::runtime`], which
//! re-exports them as `exec::runtime::{ExecError, KernelFailure, LoopError}`).

use crate::ir::{BinaryOp, KernelError, Op, UnaryOp};

/// An execution failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// The arguments do not match the program's parameters.
    #[error("{0}")]
    Arguments(String),
    /// The executable was given another number of arguments than it has
    /// parameters.
    #[error("{0}")]
    ArgumentCount(#[from] crate::compiler::ArgumentCount),
    /// A kernel could not run.
    #[error("kernel `{kernel}`: {source}")]
    Kernel {
        /// The kernel's name (`fusion.0`).
        kernel: String,
        /// What went wrong.
        #[source]
        source: KernelFailure,
    },
    /// A custom call failed or has no handler.
    #[error("custom call `{target}`: {source}")]
    CustomCall {
        /// The call target.
        target: String,
        /// What went wrong.
        #[source]
        source: CustomCallError,
    },
}

/// Why a custom call failed ([`ExecError::CustomCall`]): the handler knows
/// no such target, refused its operands, or the work it ran failed (that
/// error kept whole, so the chain reaches it).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CustomCallError {
    /// No handler knows the target.
    #[error("no handler for target `{0}`")]
    NoHandler(String),
    /// The handler refused the call: the operands or the target do not fit
    /// it (the reason is the handler's own description).
    #[error("{0}")]
    Refused(String),
    /// The handler returned a tensor of another type than the call's.
    #[error("returned {returned}, expected {expected}")]
    WrongType {
        /// The returned tensor's type.
        returned: String,
        /// The call's type.
        expected: String,
    },
    /// The work the handler ran failed.
    #[error("{0}")]
    Failed(#[source] std::sync::Arc<dyn std::error::Error + Send + Sync>),
}

impl CustomCallError {
    /// The failure of the work a handler ran, kept as the source.
    pub fn failed(error: impl std::error::Error + Send + Sync + 'static) -> CustomCallError {
        CustomCallError::Failed(std::sync::Arc::new(error))
    }
}

/// Two failures are the same when they say the same (the failed work's
/// error is compared by its message: errors need not be comparable).
impl PartialEq for CustomCallError {
    fn eq(&self, other: &CustomCallError) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
            && self.to_string() == other.to_string()
    }
}

impl Eq for CustomCallError {}

/// Why a kernel could not run ([`ExecError::Kernel`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KernelFailure {
    /// A shared kernel refused its operands (whole tensors or a scalar
    /// prelude).
    #[error(transparent)]
    Eval(#[from] KernelError),
    /// A prelude instruction reads a value computed by the loop, which the
    /// prelude runs before.
    #[error("a prelude value reads the loop")]
    PreludeReadsLoop,
    /// A fused loop's output buffer has a type that does not parse.
    #[error("buffer type `{0}`")]
    BufferType(String),
    /// The chunk interpreter could not run a body instruction.
    #[error(transparent)]
    Loop(#[from] LoopError),
}

/// A body instruction the chunk interpreter cannot run on its operands
/// (the op boxed: the interpreter returns this once per instruction per
/// chunk).
/// Fused-loop planning only stages what the interpreter runs, so these
/// mean a plan and the interpreter disagree.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoopError {
    /// The op is not defined for these operand types.
    #[error("{0} cannot run on these operand types")]
    Operands(Box<Op>),
    /// The op cannot write over one of its operands for these types.
    #[error("{0} cannot run in place on these operand types")]
    InPlaceOperands(Box<Op>),
    /// A unary op `i32` has no meaning for.
    #[error("{0:?} is not defined for i32")]
    I32Unary(UnaryOp),
    /// A binary op `pred` has no meaning for.
    #[error("{0:?} is not defined for pred")]
    PredBinary(BinaryOp),
    /// `not` of a float.
    #[error("not is defined for pred and i32")]
    FloatNot,
    /// `and` or `or` of floats.
    #[error("and/or are defined for pred and i32")]
    FloatLogic,
    /// A folded multiply-add without its three operands.
    #[error("a folded multiply needs three operands")]
    ProductArity,
    /// A folded multiply-add of two scalars.
    #[error("a folded multiply needs a chunk operand")]
    ProductScalars,
    /// A folded multiply-add over mixed or non-float types.
    #[error("a folded multiply needs floats of one type")]
    ProductTypes,
    /// A folded multiply-add with neither an output nor a register to
    /// write.
    #[error("no destination")]
    NoDestination,
}

impl From<ExecError> for crate::error::OptimError {
    fn from(error: ExecError) -> Self {
        crate::error::OptimError::new(crate::error::ErrorKind::Exec, error)
    }
}
