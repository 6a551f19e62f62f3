//! [`DeviceHistory`]: every device's samples in one bounded, slot-major ring.
//!
//! Each sample time is a slot holding one [`DeviceSample`] per device
//! (indexed by device id); when `capacity` slots are held the oldest slot is
//! overwritten. One contiguous buffer instead of a ring per device: sampling
//! a 4,096-device pod writes 229 KB sequentially instead of touching 4,096
//! separate allocations (`docs/benchmarks-monitor.md` has the figures).

use super::DeviceSample;
use bevy_ecs::prelude::*;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A broken invariant of a [`DeviceHistory`] that was not built by its own
/// methods (one decoded from a snapshot), naming the field.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum HistoryError {
    /// A ring of no slots.
    #[error("capacity = 0")]
    ZeroCapacity,
    /// More slots held than the ring has.
    #[error("len = {len} exceeds capacity = {capacity}")]
    LenExceedsCapacity {
        /// Slots held.
        len: usize,
        /// Slots in the ring.
        capacity: usize,
    },
    /// The oldest slot is not where a ring that filled this way keeps it.
    #[error("head = {head} with len = {len} and capacity = {capacity}")]
    Head {
        /// Physical index of the oldest slot.
        head: usize,
        /// Slots held.
        len: usize,
        /// Slots in the ring.
        capacity: usize,
    },
    /// The samples are not one per device per slot held.
    #[error("{samples} samples for {len} slots of {devices} devices")]
    Samples {
        /// Samples recorded.
        samples: usize,
        /// Slots held.
        len: usize,
        /// Devices per slot.
        devices: usize,
    },
}

/// The sample history of every device.
#[derive(Resource, Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceHistory {
    devices: usize,
    capacity: usize,
    /// Physical index of the oldest slot.
    head: usize,
    /// Slots held.
    len: usize,
    /// Slot-major samples; grows to `capacity × devices` as slots fill.
    samples: Vec<DeviceSample>,
}

impl DeviceHistory {
    /// An empty history of `devices` devices holding at most `capacity`
    /// (at least 1) slots.
    pub fn new(devices: usize, capacity: usize) -> Self {
        DeviceHistory {
            devices,
            capacity: capacity.max(1),
            head: 0,
            len: 0,
            samples: Vec::new(),
        }
    }

    /// Checks the ring's invariants, for a history that was not built by
    /// [`DeviceHistory::new`] and [`DeviceHistory::push_slot`] (one decoded
    /// from a snapshot): the problem, naming the field.
    pub fn check_invariants(&self) -> Result<(), HistoryError> {
        if self.capacity == 0 {
            return Err(HistoryError::ZeroCapacity);
        }
        if self.len > self.capacity {
            return Err(HistoryError::LenExceedsCapacity {
                len: self.len,
                capacity: self.capacity,
            });
        }
        if self.head >= self.capacity || (self.len < self.capacity && self.head != 0) {
            return Err(HistoryError::Head {
                head: self.head,
                len: self.len,
                capacity: self.capacity,
            });
        }
        if self.len.checked_mul(self.devices) != Some(self.samples.len()) {
            return Err(HistoryError::Samples {
                samples: self.samples.len(),
                len: self.len,
                devices: self.devices,
            });
        }
        Ok(())
    }

    /// Devices per slot.
    pub fn devices(&self) -> usize {
        self.devices
    }

    /// Slots held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no slot is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most slots it holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn slot(&self, physical: usize) -> &[DeviceSample] {
        &self.samples[physical * self.devices..(physical + 1) * self.devices]
    }

    /// Starts a new slot, dropping the oldest when full, and returns it to
    /// fill (index = device id).
    pub fn push_slot(&mut self) -> &mut [DeviceSample] {
        let physical = if self.len < self.capacity {
            self.len += 1;
            let need = self.len * self.devices;
            if self.samples.len() < need {
                self.samples.resize(need, DeviceSample::default());
            }
            self.len - 1
        } else {
            let oldest = self.head;
            self.head = (self.head + 1) % self.capacity;
            oldest
        };
        let n = self.devices;
        &mut self.samples[physical * n..(physical + 1) * n]
    }

    /// Slots, oldest first.
    pub fn slots(&self) -> impl DoubleEndedIterator<Item = &[DeviceSample]> {
        (0..self.len).map(move |i| self.slot((self.head + i) % self.capacity))
    }

    /// One device's samples, oldest first.
    pub fn device(&self, id: usize) -> impl DoubleEndedIterator<Item = &DeviceSample> {
        self.slots().filter_map(move |slot| slot.get(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_slots_per_device() {
        let mut history = DeviceHistory::new(2, 3);
        for t in 0..5u64 {
            let slot = history.push_slot();
            slot[0].at_ns = t;
            slot[1].at_ns = 10 + t;
        }
        assert_eq!(history.len(), 3);
        let zero: Vec<u64> = history.device(0).map(|s| s.at_ns).collect();
        let one: Vec<u64> = history.device(1).map(|s| s.at_ns).collect();
        assert_eq!((zero, one), (vec![2, 3, 4], vec![12, 13, 14]));
    }
}
