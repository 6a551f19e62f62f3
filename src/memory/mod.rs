//! Device memory, in one home: the best-fit [`Heap`] with real `free` and
//! neighbour coalescing; each device's HBM heap and its [`HbmUsage`]
//! ([`device`]); the optimizer state resident there ([`residency`]) and a
//! sharded model's per-device shards ([`shards`]); the record of every
//! reservation and release a profiler reads ([`journal`]); the
//! [`ALIGNMENT`] every buffer offset and size keeps (the compiler's memory
//! plan and the device heaps agree on it); and fresh output buffers that do
//! not pay a page fault per 4 KiB ([`output_buffer`]).

pub mod buffers;
pub mod device;
pub mod error;
pub mod heap;
pub mod journal;
pub mod residency;
pub mod shards;
pub mod stream;

pub use buffers::output_buffer;
pub use device::{DeviceHeap, HbmUsage, ResidentBlock};
pub use error::{MemoryError, OutOfDeviceMemory};
pub use heap::{AllocError, Block, Heap};
pub use residency::{OptimizerCount, OptimizerSlot, StoredSlot};
pub use shards::{HeldParams, ReplicaParams, ShardBlock, ShardSlot, params_purpose};

/// Buffer offsets and sizes are multiples of this many bytes.
pub const ALIGNMENT: usize = 64;
