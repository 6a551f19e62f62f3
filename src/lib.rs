//! optirs-tpu: TPU pod coordination and an XLA-shaped optimizer compiler as a
//! `bevy_ecs` world, on a CPU reference executor.

pub mod error;
pub mod optimizer;
pub mod optimizers;
pub mod schedule;

pub use error::{OptimError, Result};
pub use optimizer::Optimizer;
