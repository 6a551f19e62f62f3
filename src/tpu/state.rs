//! The seed's path to the optimizer state components, now in [`crate::memory`].

pub use crate::memory::{DeviceHeap, OptimizerCount, OptimizerSlot, StoredSlot};
