//! Execution: the kernels shared by constant folding, the reference
//! interpreter and lowered executables.

pub mod kernels;
pub mod runtime;
