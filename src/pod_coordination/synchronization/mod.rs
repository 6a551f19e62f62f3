//! Keeping the pod's devices in step: clocks.

pub mod clocks;
