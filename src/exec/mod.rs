//! Execution: the kernels shared by constant folding, the reference
//! interpreter and lowered executables, the fast runtime and its native loops.

pub mod kernels;
mod native;
pub mod runtime;
