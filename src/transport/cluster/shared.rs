//! Memory every rank of a job reads and writes in place, when the ranks
//! share one node: a collective's data plane with no copies.
//!
//! A [`SharedSegment`] is allocated by every rank together
//! ([`Mailbox::share_memory`], a collective call), each rank contributing
//! one *part*; every rank sees every part. With the `mpi` feature the parts
//! are an MPI-3 shared-memory window (`MPI_Win_allocate_shared` over the
//! node's ranks, `MPI_Win_shared_query` for the others' bases); thread ranks
//! share the process's heap. Ranks on several nodes get no segment, and the
//! collectives move their bytes by messages as before.
//!
//! Nothing here orders the ranks' accesses but [`SharedSegment::fence`]:
//! `MPI_Win_sync` and a barrier (`MPI_Ibarrier`, polled to a deadline, so a
//! lost rank is named rather than waited for), or a mutex and condition
//! variable between threads. A caller lets every rank write only what no
//! other rank reads or writes between two fences.
//!
//! [`Mailbox::share_memory`]: super::Mailbox::share_memory

use crate::transport::error::ClusterError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// Bytes at the start of every part before the caller's: the part's fence
/// count (how many fences its rank has reached), read only to name the
/// rank that did not come when a fence times out. A cache line, so the
/// caller's bytes stay aligned for every element type.
pub const PART_HEADER: usize = 64;

/// What a mailbox hands out for memory every rank shares.
pub trait SharedMemory: Send + std::fmt::Debug {
    /// Rank `rank`'s part in this process's address space (its first byte,
    /// aligned to 64 bytes, and its length, header included), or `None`
    /// for a rank the segment does not have.
    fn part(&self, rank: u32) -> Option<(*mut u8, usize)>;
    /// Makes this rank's writes to the segment visible to every rank, and
    /// the others' to this one, once every rank has called it as often:
    /// `Ok(false)` if they had not by `deadline`.
    fn barrier(&mut self, deadline: Instant) -> Result<bool, ClusterError>;
}

/// A segment every rank of the job shares (module docs): each rank's part
/// and the fences between the phases that use it.
#[derive(Debug)]
pub struct SharedSegment {
    memory: Box<dyn SharedMemory>,
    rank: u32,
    ranks: u32,
    /// The caller's bytes in every part (the smallest part's).
    len: usize,
    fences: u64,
    /// Calls of [`SharedSegment::alternate`] so far.
    uses: u64,
}

// SAFETY: the segment's raw parts are only read and written through
// `SharedSegment::part`'s callers, who order their accesses with fences;
// the handle itself moves between threads only with its owner.
unsafe impl Send for SharedSegment {}

impl SharedSegment {
    /// The segment over `memory`, which has a part for each of `ranks`
    /// ranks, of at least `PART_HEADER` bytes and aligned to 8.
    pub fn new(memory: Box<dyn SharedMemory>, rank: u32, ranks: u32) -> Result<Self, ClusterError> {
        let mut len = usize::MAX;
        for r in 0..ranks {
            let Some((base, bytes)) = memory.part(r) else {
                return Err(ClusterError::Transport(format!(
                    "the shared segment has no part for rank {r} of {ranks}"
                )));
            };
            if !(base as usize).is_multiple_of(8) || bytes < PART_HEADER {
                return Err(ClusterError::Transport(format!(
                    "rank {r}'s part of the shared segment ({bytes} bytes at {base:p}) is not \
                     aligned or too small for its header"
                )));
            }
            len = len.min(bytes - PART_HEADER);
        }
        let segment = SharedSegment {
            memory,
            rank,
            ranks,
            len: if ranks == 0 { 0 } else { len },
            fences: 0,
            uses: 0,
        };
        segment.fence_count(rank).store(0, Ordering::Release);
        Ok(segment)
    }

    /// The caller's bytes in each part.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the parts hold no bytes of the caller's.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first of rank `rank`'s [`SharedSegment::len`] bytes, aligned to
    /// 64 bytes (`None`: no such rank). Reading or writing through it is the
    /// caller's to order with [`SharedSegment::fence`].
    pub fn part(&self, rank: u32) -> Option<*mut u8> {
        let (base, _) = self.memory.part(rank)?;
        // SAFETY: every part holds its header (checked in `new`).
        Some(unsafe { base.add(PART_HEADER) })
    }

    /// Which half of its part a collective call uses: consecutive calls
    /// alternate (every rank alike, as every rank makes the same calls),
    /// so a call fills the half the previous call did not, which other
    /// ranks may still be reading until they reach this call's first fence.
    pub fn alternate(&mut self) -> usize {
        self.uses += 1;
        (self.uses % 2) as usize
    }

    /// Rank `rank`'s fence count, in its part's header.
    fn fence_count(&self, rank: u32) -> &AtomicU64 {
        let (base, _) = self.memory.part(rank).expect("checked in new");
        // SAFETY: the header is 8-aligned (checked in `new`), lives as long
        // as the segment, and is only ever accessed atomically.
        unsafe { AtomicU64::from_ptr(base.cast()) }
    }

    /// Every rank's writes so far visible to every rank, once all of them
    /// got here. `Ok(Some(rank))`: not every rank came by `deadline`, and
    /// `rank` is the one furthest behind (the lowest fence count).
    pub fn fence(&mut self, deadline: Instant) -> Result<Option<u32>, ClusterError> {
        self.fences += 1;
        self.fence_count(self.rank)
            .store(self.fences, Ordering::Release);
        if self.memory.barrier(deadline)? {
            return Ok(None);
        }
        let behind = (0..self.ranks)
            .filter(|&r| r != self.rank)
            .min_by_key(|&r| self.fence_count(r).load(Ordering::Acquire));
        Ok(Some(behind.unwrap_or(self.rank)))
    }
}

/// Whether thread ranks share their memory ([`super::thread_mailboxes`]
/// does; [`super::thread_mailboxes_messages_only`] gives mailboxes that move
/// every byte as frames, the data plane of ranks on several nodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadSharing {
    /// Collectives read each other's members in place.
    Memory,
    /// Collectives send and receive frames.
    MessagesOnly,
}

/// One rank's part of a segment of thread ranks: heap words, freed when
/// the last rank holding the segment lets go.
#[derive(Debug)]
struct ThreadPart {
    words: *mut u64,
    len: usize,
}

// SAFETY: the part is plain memory that every thread of the job may read
// and write; the segment's users order their accesses with fences.
unsafe impl Send for ThreadPart {}
unsafe impl Sync for ThreadPart {}

impl ThreadPart {
    fn new(bytes: usize) -> ThreadPart {
        let words = Box::leak(vec![0u64; bytes.div_ceil(8)].into_boxed_slice());
        ThreadPart {
            len: words.len(),
            words: words.as_mut_ptr(),
        }
    }
}

impl Drop for ThreadPart {
    fn drop(&mut self) {
        // SAFETY: leaked from a boxed slice of `len` words in `new`, and
        // dropped once, when no segment refers to it.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.words, self.len)) });
    }
}

/// Where thread ranks meet: every rank brings a value, and all leave with
/// every rank's, once the last came (or alone, at a deadline).
#[derive(Debug)]
pub(super) struct Rendezvous<V> {
    state: Mutex<Meeting<V>>,
    ready: Condvar,
}

#[derive(Debug)]
struct Meeting<V> {
    generation: u64,
    brought: Vec<Option<V>>,
    /// The last completed meeting's values, by rank.
    last: Vec<V>,
}

impl<V: Clone> Rendezvous<V> {
    pub(super) fn new(ranks: u32) -> Rendezvous<V> {
        Rendezvous {
            state: Mutex::new(Meeting {
                generation: 0,
                brought: (0..ranks).map(|_| None).collect(),
                last: Vec::new(),
            }),
            ready: Condvar::new(),
        }
    }

    /// Every rank's value once all brought theirs; `None` at `deadline`.
    pub(super) fn meet(
        &self,
        rank: u32,
        value: V,
        deadline: Instant,
    ) -> Result<Option<Vec<V>>, ClusterError> {
        fn poisoned<T>(_: T) -> ClusterError {
            ClusterError::Transport("a rank thread panicked".into())
        }
        let mut state = self.state.lock().map_err(poisoned)?;
        let generation = state.generation;
        state.brought[rank as usize] = Some(value);
        if state.brought.iter().all(Option::is_some) {
            let brought: Vec<V> = state.brought.iter_mut().filter_map(Option::take).collect();
            state.last = brought;
            state.generation += 1;
            self.ready.notify_all();
            return Ok(Some(state.last.clone()));
        }
        loop {
            let now = Instant::now();
            if state.generation != generation {
                // `last` stays until the next meeting completes, which
                // needs this rank.
                return Ok(Some(state.last.clone()));
            }
            if now >= deadline {
                state.brought[rank as usize] = None;
                return Ok(None);
            }
            state = self
                .ready
                .wait_timeout(state, deadline - now)
                .map_err(poisoned)?
                .0;
        }
    }
}

/// A segment of thread ranks: every rank's part, and the rendezvous that
/// is its barrier (a mutex's release and acquire order the threads'
/// accesses).
#[derive(Debug)]
struct ThreadMemory {
    rank: u32,
    parts: Vec<Arc<ThreadPart>>,
    barrier: Arc<Rendezvous<()>>,
}

impl SharedMemory for ThreadMemory {
    fn part(&self, rank: u32) -> Option<(*mut u8, usize)> {
        let part = self.parts.get(rank as usize)?;
        Some((part.words.cast(), part.len * 8))
    }

    fn barrier(&mut self, deadline: Instant) -> Result<bool, ClusterError> {
        Ok(self.barrier.meet(self.rank, (), deadline)?.is_some())
    }
}

/// What thread ranks bring to a segment's allocation: their part, and a
/// barrier (rank 0's is the one all use).
type Contribution = (Arc<ThreadPart>, Arc<Rendezvous<()>>);

/// The allocation rendezvous of a job's thread ranks.
#[derive(Debug)]
pub(super) struct ThreadSegments(Rendezvous<Contribution>);

impl ThreadSegments {
    pub(super) fn new(ranks: u32) -> ThreadSegments {
        ThreadSegments(Rendezvous::new(ranks))
    }

    /// This rank's view of a new segment of `bytes` bytes a part (with
    /// every other rank: a collective call); `None` if not every rank
    /// came by `deadline`.
    pub(super) fn allocate(
        &self,
        rank: u32,
        ranks: u32,
        bytes: usize,
        deadline: Instant,
    ) -> Result<Option<SharedSegment>, ClusterError> {
        let mine = Arc::new(ThreadPart::new(PART_HEADER + bytes));
        let barrier = Arc::new(Rendezvous::new(ranks));
        let Some(all) = self.0.meet(rank, (mine, barrier), deadline)? else {
            return Ok(None);
        };
        let memory = ThreadMemory {
            rank,
            barrier: Arc::clone(&all[0].1),
            parts: all.into_iter().map(|(part, _)| part).collect(),
        };
        SharedSegment::new(Box::new(memory), rank, ranks).map(Some)
    }
}
