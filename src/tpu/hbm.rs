//! The seed's path to device HBM accounting, now [`crate::memory::device`].

pub use crate::memory::device::*;
