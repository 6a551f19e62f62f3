//! Why device memory could not be reserved or released.

use thiserror::Error;

use super::heap::AllocError;

/// A device's HBM cannot hold what was asked of it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "{device}: out of HBM: {purpose} needs {requested} bytes, {free} bytes are free \
     and the largest free block is {largest_free} bytes; free memory on the device or \
     configure more HBM"
)]
pub struct OutOfDeviceMemory {
    /// The device (`device 0 (v4)`).
    pub device: String,
    /// What asked (`the program \`adam_update\``, `the optimizer state \`mu\``).
    pub purpose: String,
    /// Bytes requested.
    pub requested: u64,
    /// Free bytes on the device.
    pub free: u64,
    /// The largest contiguous free block.
    pub largest_free: u64,
}

/// A device-memory operation failed. Nothing was reserved or released.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum MemoryError {
    /// A reservation does not fit.
    #[error(transparent)]
    OutOfDeviceMemory(OutOfDeviceMemory),
    /// The device has no heap: no optimizer runs on it.
    #[error("{device} has no HBM heap: no optimizer state or program runs on it")]
    NoHeap {
        /// The device.
        device: String,
    },
    /// A block could not be released.
    #[error("{device}: {source}")]
    Release {
        /// The device.
        device: String,
        /// What the heap said.
        source: AllocError,
    },
    /// Optimizer state exists but the world has no device 0 to hold it.
    #[error("the optimizer has no device 0 to hold its state")]
    NoStateDevice,
}

impl From<MemoryError> for crate::error::OptimError {
    fn from(error: MemoryError) -> Self {
        crate::error::OptimError::new(crate::error::ErrorKind::Memory, error)
    }
}
