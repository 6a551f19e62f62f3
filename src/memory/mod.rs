//! Device memory: a best-fit heap with real `free` and neighbour coalescing.

pub mod heap;

pub use heap::{AllocError, Block, Heap};
