//! optirs-tpu: TPU pod coordination and an XLA-shaped optimizer compiler as a
//! `bevy_ecs` world, on a CPU reference executor.

pub mod error;
pub mod exec;
pub mod memory;
pub mod schedule;
pub mod xla;

pub use error::{OptimError, Result};
