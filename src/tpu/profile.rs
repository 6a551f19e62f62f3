//! [`TpuProfile`]: what a [`super::TPUOptimizer`] compiled, ran and reserved.
//!
//! Times are wall-clock (profiling only; nothing in the engine's schedules
//! reads them). The memory timeline is empty until a step has run: it
//! records reservations that happened, never planned ones.

use std::collections::VecDeque;
use std::sync::Arc;

use serde::Serialize;

/// Events kept in the memory timeline (the oldest are dropped first).
pub const MEMORY_TIMELINE_CAPACITY: usize = 1024;

/// Compiled-program cache counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    /// Lookups that found a compiled program.
    pub hits: u64,
    /// Lookups that compiled.
    pub misses: u64,
    /// Programs dropped to stay within capacity.
    pub evictions: u64,
    /// Programs cached now.
    pub entries: usize,
    /// The most programs kept.
    pub capacity: usize,
}

/// Reserve or release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryEventKind {
    /// A program's planned bytes were reserved.
    Reserve,
    /// They were released.
    Release,
}

/// One HBM reservation or release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemoryEvent {
    /// Reserve or release.
    pub kind: MemoryEventKind,
    /// The device (`device 0 (v4)`), shared by its events.
    pub device: Arc<str>,
    /// Bytes reserved or released.
    pub bytes: u64,
    /// Offset of the block in the device heap.
    pub offset: u64,
    /// Bytes in use on the device after the event.
    pub used_after: u64,
}

/// The device heap while a reservation was held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HbmSnapshot {
    /// The device.
    pub device: String,
    /// The program holding the reservation.
    pub program: String,
    /// Its reservation.
    pub reserved_bytes: u64,
    /// Bytes in use on the device.
    pub used_bytes: u64,
    /// Free bytes.
    pub free_bytes: u64,
    /// The largest free block.
    pub largest_free_bytes: u64,
    /// Heap capacity.
    pub capacity_bytes: u64,
}

/// Device memory activity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MemoryProfile {
    /// Reservations made.
    pub reservations: u64,
    /// Reservations released.
    pub releases: u64,
    /// The heap at the highest use seen, taken while the reservation was held.
    pub peak: Option<HbmSnapshot>,
    /// The last [`MEMORY_TIMELINE_CAPACITY`] events, oldest first.
    pub timeline: VecDeque<MemoryEvent>,
}

impl MemoryProfile {
    pub(crate) fn record(&mut self, event: MemoryEvent) {
        match event.kind {
            MemoryEventKind::Reserve => self.reservations += 1,
            MemoryEventKind::Release => self.releases += 1,
        }
        if self.timeline.len() == MEMORY_TIMELINE_CAPACITY {
            self.timeline.pop_front();
        }
        self.timeline.push_back(event);
    }
}

/// Compile, execute, cache and memory figures of a TPU optimizer.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TpuProfile {
    /// Programs compiled.
    pub compiles: u64,
    /// Total compile time, seconds.
    pub compile_seconds: f64,
    /// The last compile, seconds.
    pub last_compile_seconds: f64,
    /// Name of the last program compiled.
    pub last_program: String,
    /// Kernels of the last program compiled.
    pub last_kernels: usize,
    /// Steps executed.
    pub executions: u64,
    /// Total execution time, seconds.
    pub execute_seconds: f64,
    /// The last execution, seconds.
    pub last_execute_seconds: f64,
    /// Bytes the executions read and wrote (parameters and results).
    pub bytes_moved: u64,
    /// Cache counters.
    pub cache: CacheStats,
    /// HBM reservations.
    pub memory: MemoryProfile,
}

impl TpuProfile {
    /// The profile as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("the profile serializes")
    }
}
