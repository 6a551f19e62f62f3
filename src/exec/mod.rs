//! Execution: the kernels shared by constant folding, the reference
//! interpreter and lowered executables, the fast runtime and its native loops.

mod error;
mod interpreter;
pub mod loop_plan;
pub use crate::kernels;
mod native;
pub mod runtime;
pub mod update_graph;
