//! [`Heap`]: a best-fit allocator over one contiguous address range.
//!
//! Free blocks are indexed by offset (to find neighbours) and by
//! `(size, offset)` (to find the best fit), so `alloc` and `free` are
//! `O(log n)`. Freeing merges the block with free neighbours on both sides,
//! so after every allocation is freed the heap is one free block again.
//! Freeing an address twice, or an address that was never returned by
//! `alloc`, is an error, not undefined behaviour. Every size and offset is
//! computed with checked arithmetic: a request whose aligned size does not
//! fit in `usize` is [`AllocError::TooLarge`], never a wrapped small size.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// An allocated range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Block {
    /// First byte.
    pub offset: usize,
    /// Length in bytes (a multiple of the heap's alignment).
    pub size: usize,
}

impl Block {
    /// One past the last byte (saturating: a block the heap handed out
    /// always ends within its capacity).
    pub fn end(&self) -> usize {
        self.offset.saturating_add(self.size)
    }

    /// Whether two blocks share a byte.
    pub fn overlaps(&self, other: &Block) -> bool {
        self.offset < other.end() && other.offset < self.end()
    }
}

/// Allocation failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// No free block is large enough.
    #[error(
        "out of memory: {requested} bytes requested, largest free block is {largest_free} bytes ({free_total} free in total)"
    )]
    OutOfMemory {
        /// Aligned request.
        requested: usize,
        /// Largest free block.
        largest_free: usize,
        /// All free bytes (fragmented).
        free_total: usize,
    },
    /// The block at this offset was already freed.
    #[error("double free of offset {offset}")]
    DoubleFree {
        /// The offset.
        offset: usize,
    },
    /// No allocation starts at this offset.
    #[error("free of offset {offset}, which was never allocated")]
    UnknownFree {
        /// The offset.
        offset: usize,
    },
    /// Zero-byte requests are rejected.
    #[error("zero-byte allocation")]
    ZeroSize,
    /// The request rounded up to the alignment does not fit in `usize`.
    #[error(
        "allocation of {requested} bytes is too large: rounded up to {alignment}-byte alignment it overflows the address space"
    )]
    TooLarge {
        /// The request as given.
        requested: usize,
        /// The heap's alignment.
        alignment: usize,
    },
}

/// A best-fit heap.
#[derive(Debug, Clone)]
pub struct Heap {
    capacity: usize,
    alignment: usize,
    free_by_offset: BTreeMap<usize, usize>,
    free_by_size: BTreeSet<(usize, usize)>,
    allocated: HashMap<usize, usize>,
}

impl Heap {
    /// A heap of `capacity` bytes handing out multiples of `alignment` (≥ 1).
    pub fn new(capacity: usize, alignment: usize) -> Heap {
        let alignment = alignment.max(1);
        let capacity = capacity / alignment * alignment;
        let mut heap = Heap {
            capacity,
            alignment,
            free_by_offset: BTreeMap::new(),
            free_by_size: BTreeSet::new(),
            allocated: HashMap::new(),
        };
        if capacity > 0 {
            heap.insert_free(0, capacity);
        }
        heap
    }

    fn insert_free(&mut self, offset: usize, size: usize) {
        self.free_by_offset.insert(offset, size);
        self.free_by_size.insert((size, offset));
    }

    fn remove_free(&mut self, offset: usize, size: usize) {
        self.free_by_offset.remove(&offset);
        self.free_by_size.remove(&(size, offset));
    }

    /// Allocates the smallest free block that fits (lowest offset on ties).
    pub fn alloc(&mut self, size: usize) -> Result<Block, AllocError> {
        if size == 0 {
            return Err(AllocError::ZeroSize);
        }
        let requested = size;
        let size = size
            .div_ceil(self.alignment)
            .checked_mul(self.alignment)
            .ok_or(AllocError::TooLarge {
                requested,
                alignment: self.alignment,
            })?;
        let Some(&(free_size, offset)) = self.free_by_size.range((size, 0)..).next() else {
            return Err(AllocError::OutOfMemory {
                requested: size,
                largest_free: self.largest_free(),
                free_total: self.free_bytes(),
            });
        };
        self.remove_free(offset, free_size);
        if free_size > size {
            // Within a free block of the heap: cannot overflow.
            self.insert_free(offset + size, free_size - size);
        }
        self.allocated.insert(offset, size);
        Ok(Block { offset, size })
    }

    /// Frees the allocation starting at `offset`, merging with free neighbours.
    pub fn free(&mut self, offset: usize) -> Result<(), AllocError> {
        let Some(size) = self.allocated.remove(&offset) else {
            let in_free = self
                .free_by_offset
                .range(..=offset)
                .next_back()
                .is_some_and(|(&o, &s)| offset < o + s);
            return Err(if in_free {
                AllocError::DoubleFree { offset }
            } else {
                AllocError::UnknownFree { offset }
            });
        };
        let (mut start, mut len) = (offset, size);
        if let Some((&prev, &prev_size)) = self.free_by_offset.range(..offset).next_back()
            && prev + prev_size == offset
        {
            self.remove_free(prev, prev_size);
            start = prev;
            len += prev_size;
        }
        if let Some(&next_size) = self.free_by_offset.get(&(offset + size)) {
            self.remove_free(offset + size, next_size);
            len += next_size;
        }
        self.insert_free(start, len);
        Ok(())
    }

    /// Heap size in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes currently allocated.
    pub fn used_bytes(&self) -> usize {
        self.allocated.values().sum()
    }

    /// Bytes currently free.
    pub fn free_bytes(&self) -> usize {
        self.capacity - self.used_bytes()
    }

    /// The largest free block.
    pub fn largest_free(&self) -> usize {
        self.free_by_size.iter().next_back().map_or(0, |&(s, _)| s)
    }

    /// Free blocks, by offset.
    pub fn free_blocks(&self) -> Vec<Block> {
        self.free_by_offset
            .iter()
            .map(|(&offset, &size)| Block { offset, size })
            .collect()
    }

    /// Live allocations, by offset.
    pub fn allocations(&self) -> Vec<Block> {
        let mut v: Vec<Block> = self
            .allocated
            .iter()
            .map(|(&offset, &size)| Block { offset, size })
            .collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_free_and_coalesce() {
        let mut h = Heap::new(1024, 64);
        let a = h.alloc(100).unwrap();
        let b = h.alloc(64).unwrap();
        let c = h.alloc(256).unwrap();
        assert_eq!((a.size, b.offset, c.offset), (128, 128, 192));
        h.free(b.offset).unwrap();
        // The 64-byte hole is the best fit for a 64-byte request.
        assert_eq!(h.alloc(10).unwrap().offset, 128);
        h.free(128).unwrap();
        h.free(a.offset).unwrap();
        h.free(c.offset).unwrap();
        assert_eq!(
            h.free_blocks(),
            vec![Block {
                offset: 0,
                size: 1024
            }]
        );
    }

    #[test]
    fn rejects_double_unknown_and_oversized() {
        let mut h = Heap::new(256, 64);
        let a = h.alloc(64).unwrap();
        h.free(a.offset).unwrap();
        assert_eq!(h.free(a.offset), Err(AllocError::DoubleFree { offset: 0 }));
        let _b = h.alloc(64).unwrap();
        assert_eq!(h.free(999), Err(AllocError::UnknownFree { offset: 999 }));
        assert_eq!(h.free(32), Err(AllocError::UnknownFree { offset: 32 }));
        assert!(matches!(h.alloc(1000), Err(AllocError::OutOfMemory { .. })));
        assert_eq!(h.alloc(0), Err(AllocError::ZeroSize));
    }

    #[test]
    fn a_request_whose_aligned_size_overflows_is_an_error() {
        let mut h = Heap::new(1 << 20, 64);
        for size in [usize::MAX - 10, usize::MAX, usize::MAX - 62] {
            assert_eq!(
                h.alloc(size),
                Err(AllocError::TooLarge {
                    requested: size,
                    alignment: 64
                }),
                "{size}"
            );
        }
        // Largest aligned size that fits: too large for this heap, not a wrap.
        assert!(matches!(
            h.alloc(usize::MAX - 63),
            Err(AllocError::OutOfMemory { .. })
        ));
        assert!(h.allocations().is_empty());
        assert_eq!(h.free_bytes(), 1 << 20);
    }
}
