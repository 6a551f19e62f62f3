//! [`Ring`]: a bounded history that drops its oldest sample when full.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// A ring buffer of at most `capacity` samples, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ring<T> {
    capacity: usize,
    items: VecDeque<T>,
}

impl<T> Ring<T> {
    /// An empty ring holding at most `capacity` (at least 1) samples; it
    /// allocates as it fills (a 4,096-device pod does not reserve every
    /// ring up front).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Ring {
            capacity,
            items: VecDeque::new(),
        }
    }

    /// Appends a sample, dropping the oldest when full.
    pub fn push(&mut self, item: T) {
        if self.items.len() == self.capacity {
            self.items.pop_front();
        }
        self.items.push_back(item);
    }

    /// Samples, oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &T> + ExactSizeIterator {
        self.items.iter()
    }

    /// The newest sample.
    pub fn last(&self) -> Option<&T> {
        self.items.back()
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether no sample is held.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The most samples it holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::Ring;

    #[test]
    fn keeps_the_newest_capacity_samples() {
        let mut ring = Ring::new(3);
        for i in 0..5 {
            ring.push(i);
        }
        assert_eq!(ring.iter().copied().collect::<Vec<_>>(), [2, 3, 4]);
        assert_eq!(ring.last(), Some(&4));
        assert_eq!(ring.len(), 3);
    }
}
