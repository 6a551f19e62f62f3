#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod barrier;
pub mod checkpoint;
pub mod clock;
pub mod clock_sync;
pub mod collectives;
pub mod compiler;
pub mod coordination;
pub mod error;
pub mod exec;
pub mod fault_tolerance;
pub mod hardware;
pub mod health;
pub mod ir;
pub mod kernels;
pub mod load_balance;
pub mod memory;
pub mod monitor;
pub mod optimizer;
pub mod optimizers;
pub mod persist;
pub mod pod;
pub mod pod_coordination;
pub mod profile;
pub mod rng;
pub mod schedule;
pub mod svg;
pub mod topology;
pub mod tpu;
pub mod transport;
pub mod xla;

pub use error::{OptimError, Result};
pub use hardware::TpuGeneration;
pub use optimizer::Optimizer;
pub use pod::Pod;
pub use tpu::{TPUConfig, TPUOptimizer, TPUVersion};
