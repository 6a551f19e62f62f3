#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod error;
pub mod hardware;
pub mod pod;
pub mod schedule;
pub mod topology;

pub use error::{OptimError, Result};
pub use hardware::TpuGeneration;
pub use pod::Pod;
