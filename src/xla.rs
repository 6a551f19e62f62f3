//! The seed's path to the compiler and the profiler: `optirs_tpu::xla::*`
//! is [`crate::compiler`], and `xla::backend::*` is [`crate::profile`].
//! New code imports those modules directly.

pub use crate::compiler::*;

/// The seed's path to the pod-wide profiler ([`crate::profile`]).
pub mod backend {
    pub use crate::profile::{profiling_integration, schedule_timing, system_timer};
}
