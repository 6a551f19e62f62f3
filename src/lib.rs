//! optirs-tpu: TPU pod coordination and an XLA-shaped optimizer compiler as a
//! `bevy_ecs` world, on a CPU reference executor.

pub mod collectives;
pub mod coordination;
pub mod error;
pub mod pod_coordination;
pub mod schedule;

pub use error::{OptimError, Result};
