//! The vocabulary every layer above shares: element types ([`DType`]),
//! tensor types (`f32[8,128]`), the op set of the compiler's graphs, and
//! [`Tensor`], the typed dense array the kernels, the executor and the
//! checkpoints hold.
//!
//! The element traits ([`Element`] ⊃ [`ReduceElement`] ⊃ [`FloatElement`])
//! map Rust types onto it. Nothing here imports another module of the
//! crate: the compiler, the kernels, the executor, the collectives and the
//! checkpoints all speak this one vocabulary, so there is one `DType`, one
//! element trait family and one tensor.

pub mod element;
mod kernel_error;
pub mod op;
pub mod tensor;
pub mod types;

pub use element::{Element, FloatElement, ReduceElement};
pub use op::{BinaryOp, CompareDir, ConvAttrs, DotDims, Op, Padding, ReduceKind, UnaryOp};
pub use tensor::{KernelError, KernelResult, Tensor};
pub use types::{DType, TensorType};
