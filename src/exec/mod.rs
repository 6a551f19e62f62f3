//! Execution: the kernels shared by constant folding, the reference
//! interpreter and lowered executables, the fast runtime and its native loops.

pub use crate::kernels;
mod native;
pub mod runtime;
