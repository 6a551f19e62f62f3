//! Moving byte frames between ranks: the [`Mailbox`] trait and the
//! [`ThreadMailbox`] that joins ranks which are threads of one process.

use super::exchange::{Exchange, Landed, framed_exchange};
use super::shared::{SharedSegment, ThreadSegments, ThreadSharing};
use crate::transport::error::ClusterError;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// Moves byte frames between the ranks of one job.
pub trait Mailbox: Send + std::fmt::Debug {
    /// This rank.
    fn rank(&self) -> u32;
    /// Ranks in the job.
    fn ranks(&self) -> u32;
    /// Sends a frame to `to` without waiting for it to be received.
    fn send(&mut self, to: u32, frame: Vec<u8>) -> Result<(), ClusterError>;
    /// The next frame from `from`, or an alarm
    /// ([`Mailbox::send_alarm`]) from any rank if one came first, waiting
    /// at most until `deadline`; `Ok(None)` if neither came by then.
    fn receive(&mut self, from: u32, deadline: Instant) -> Result<Option<Vec<u8>>, ClusterError>;
    /// Sends `to` an alarm frame (the job stops, and why): its next
    /// receive returns it whichever rank it waits on, so a rank waiting on
    /// a peer that is itself stuck behind a lost rank hears the name at
    /// once rather than naming the peer.
    fn send_alarm(&mut self, to: u32, frame: Vec<u8>) -> Result<(), ClusterError> {
        self.send(to, frame)
    }
    /// An empty buffer of at least `capacity` bytes for a frame: a
    /// mailbox may hand back one it used before (already in memory).
    fn spare_buffer(&mut self, capacity: usize) -> Vec<u8> {
        Vec::with_capacity(capacity)
    }
    /// A received frame the caller is done with, for
    /// [`Mailbox::spare_buffer`] to hand out again.
    fn recycle(&mut self, _buffer: Vec<u8>) {}
    /// Another rank is lost: the job will not end together (an MPI
    /// mailbox then skips `MPI_Finalize`, which would wait for it).
    fn abandon(&mut self) {}
    /// Moves one step of a collective (`cluster::exchange`): every send
    /// and receive of `exchange`, each receive handed to `landed` as it
    /// completes, waiting at most until `deadline`. `Ok(Some(rank))`:
    /// `rank`'s data had not all come (or not all of this rank's had gone
    /// to it) by then. By default, one data frame per send.
    fn exchange<'r>(
        &mut self,
        exchange: Exchange<'_, 'r>,
        deadline: Instant,
        landed: &mut Landed<'r, '_>,
    ) -> Result<Option<u32>, ClusterError> {
        framed_exchange(self, exchange, deadline, landed)
    }
    /// A segment of `bytes` bytes a rank that every rank reads and writes
    /// in place ([`SharedSegment`]), allocated with every other rank (a
    /// collective call: all ranks ask for it at the same point, with the
    /// same size), or `Ok(None)` when the ranks do not share memory (on
    /// several nodes, or a mailbox that moves only frames: the default).
    /// Every rank gets the same answer. An error if the ranks did not all
    /// come by `deadline`.
    fn share_memory(
        &mut self,
        _bytes: usize,
        _deadline: Instant,
    ) -> Result<Option<SharedSegment>, ClusterError> {
        Ok(None)
    }
}

/// A mailbox shared by the backend (each tick) and the host (start-up
/// handshake, final gather).
pub type SharedMailbox = Arc<Mutex<Box<dyn Mailbox>>>;

type Queues = Vec<Vec<VecDeque<Vec<u8>>>>;

/// Ranks that are threads of one process.
#[derive(Debug)]
pub struct ThreadMailbox {
    rank: u32,
    ranks: u32,
    shared: Arc<(Mutex<Queues>, Condvar)>,
    /// Where the ranks allocate shared segments together (`None`: they
    /// move every byte as frames).
    segments: Option<Arc<ThreadSegments>>,
}

/// `ranks` connected thread mailboxes, one per rank, in rank order. They
/// share memory as ranks on one node do: a collective reads the other
/// ranks' members in place ([`Mailbox::share_memory`]).
pub fn thread_mailboxes(ranks: u32) -> Vec<ThreadMailbox> {
    thread_mailboxes_sharing(ranks, ThreadSharing::Memory)
}

/// `ranks` connected thread mailboxes that move every byte between ranks
/// as frames, as ranks on several nodes do.
pub fn thread_mailboxes_messages_only(ranks: u32) -> Vec<ThreadMailbox> {
    thread_mailboxes_sharing(ranks, ThreadSharing::MessagesOnly)
}

/// `ranks` connected thread mailboxes, sharing memory or not.
pub fn thread_mailboxes_sharing(ranks: u32, sharing: ThreadSharing) -> Vec<ThreadMailbox> {
    let n = ranks as usize;
    let segments = (sharing == ThreadSharing::Memory).then(|| Arc::new(ThreadSegments::new(ranks)));
    // Each rank's queues by sender, and one more for alarms.
    let shared = Arc::new((
        Mutex::new(vec![vec![VecDeque::new(); n + 1]; n]),
        Condvar::new(),
    ));
    (0..ranks)
        .map(|rank| ThreadMailbox {
            rank,
            ranks,
            shared: Arc::clone(&shared),
            segments: segments.clone(),
        })
        .collect()
}

impl Mailbox for ThreadMailbox {
    fn rank(&self) -> u32 {
        self.rank
    }

    fn ranks(&self) -> u32 {
        self.ranks
    }

    fn send(&mut self, to: u32, frame: Vec<u8>) -> Result<(), ClusterError> {
        self.push(to, self.rank as usize, frame)
    }

    fn send_alarm(&mut self, to: u32, frame: Vec<u8>) -> Result<(), ClusterError> {
        self.push(to, self.ranks as usize, frame)
    }

    fn share_memory(
        &mut self,
        bytes: usize,
        deadline: Instant,
    ) -> Result<Option<SharedSegment>, ClusterError> {
        let Some(segments) = &self.segments else {
            return Ok(None);
        };
        match segments.allocate(self.rank, self.ranks, bytes, deadline)? {
            Some(segment) => Ok(Some(segment)),
            None => Err(ClusterError::Transport(format!(
                "rank {}: not every rank came to allocate a shared segment within the bound",
                self.rank
            ))),
        }
    }

    fn receive(&mut self, from: u32, deadline: Instant) -> Result<Option<Vec<u8>>, ClusterError> {
        let (queues, ready) = &*self.shared;
        fn poisoned<T>(_: T) -> ClusterError {
            ClusterError::Transport("a rank thread panicked".into())
        }
        let mut queues = queues.lock().map_err(poisoned)?;
        let alarms = self.ranks as usize;
        loop {
            let mine = &mut queues[self.rank as usize];
            let next = mine.get_mut(from as usize).and_then(VecDeque::pop_front);
            if let Some(frame) = next.or_else(|| mine[alarms].pop_front()) {
                return Ok(Some(frame));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            queues = ready
                .wait_timeout(queues, deadline - now)
                .map_err(poisoned)?
                .0;
        }
    }
}

impl ThreadMailbox {
    /// Queues `frame` at `to` under sender slot `slot`.
    fn push(&mut self, to: u32, slot: usize, frame: Vec<u8>) -> Result<(), ClusterError> {
        let (queues, ready) = &*self.shared;
        let mut queues = queues
            .lock()
            .map_err(|_| ClusterError::Transport("a rank thread panicked".into()))?;
        queues
            .get_mut(to as usize)
            .ok_or(ClusterError::NoSuchRank {
                rank: to,
                ranks: self.ranks,
            })?[slot]
            .push_back(frame);
        ready.notify_all();
        Ok(())
    }
}

/// [`Mailbox::receive`], passing over stall notices (they matter only to
/// the tick exchange, which reads them itself).
pub(super) fn receive_past_notices<M: Mailbox + ?Sized>(
    mailbox: &mut M,
    from: u32,
    deadline: Instant,
) -> Result<Option<Vec<u8>>, ClusterError> {
    loop {
        match mailbox.receive(from, deadline)? {
            Some(bytes) if super::frame::is_stall_notice(&bytes) => continue,
            other => return Ok(other),
        }
    }
}

pub(super) fn lock(
    mailbox: &SharedMailbox,
) -> Result<std::sync::MutexGuard<'_, Box<dyn Mailbox>>, ClusterError> {
    mailbox
        .lock()
        .map_err(|_| ClusterError::Transport("the mailbox lock was poisoned".into()))
}
