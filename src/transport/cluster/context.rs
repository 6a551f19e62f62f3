//! [`RankContext`]: a rank's place in the job, for systems that send and
//! receive data frames themselves.

use super::SERVICE_RANK;
use super::exchange::{Exchange, Landed, data_frame_payload};
use super::frame::{DATA_HEADER, Frame, decode, write_data_header};
use super::layout::RankLayout;
use super::mailbox::{Mailbox, SharedMailbox, lock, receive_past_notices};
use super::protocol::{abort_all, broadcast};
use super::shared::SharedSegment;
use crate::transport::error::ClusterError;
use bevy_ecs::prelude::*;
use serde::Serialize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where this process sits in a pod split over ranks, for the systems
/// that move data between ranks themselves (the sharded step's
/// reduce-scatter and all-gather) rather than as messages in the tick.
#[derive(Resource, Clone)]
pub struct RankContext {
    /// Which rank owns which hosts.
    pub layout: RankLayout,
    /// The mailbox every rank of the job shares.
    pub mailbox: SharedMailbox,
    /// The bound on every wait for another rank.
    pub timeout: Duration,
    /// Large buffers kept between a collective's calls (the sharded step's
    /// member buffers, every step): shared by the context's clones and
    /// freed with the last of them.
    pub buffers: ReusableBuffers,
    /// The segment the ranks share when they are on one node
    /// ([`RankContext::with_shared_segment`]), kept between calls.
    pub segment: SegmentSlot,
}

/// The job's shared segment as a rank holds it between collectives:
/// shared by the context's clones, freed (with every rank) with the last.
#[derive(Clone, Default)]
pub struct SegmentSlot(Arc<Mutex<SegmentState>>);

#[derive(Default)]
struct SegmentState {
    segment: Option<SharedSegment>,
    /// The mailbox said the ranks share no memory: asked once.
    unavailable: bool,
}

/// A pool of large buffers (8-byte words, so aligned for every element
/// type) handed out again instead of fresh allocations: a buffer the
/// allocator returned to the kernel would be faulted in and zeroed page by
/// page on its next use, every step.
#[derive(Clone, Default)]
pub struct ReusableBuffers(Arc<Mutex<Vec<Vec<u64>>>>);

/// The most buffers a pool keeps (the largest).
const KEPT_BUFFERS: usize = 64;

impl ReusableBuffers {
    /// A buffer of at least `words` words whose contents are unspecified:
    /// the smallest kept one that is large enough, or a fresh zeroed one
    /// (whose pages are only faulted in where it is written).
    pub fn take(&self, words: usize) -> Vec<u64> {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let best = kept
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= words)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i);
        match best {
            Some(i) => kept.swap_remove(i),
            None => vec![0; words],
        }
    }

    /// Keeps `buffer` for a later [`ReusableBuffers::take`].
    pub fn give(&self, buffer: Vec<u64>) {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        kept.push(buffer);
        if kept.len() > KEPT_BUFFERS {
            let smallest = (0..kept.len()).min_by_key(|&i| kept[i].len()).unwrap_or(0);
            kept.swap_remove(smallest);
        }
    }
}

impl std::fmt::Debug for RankContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankContext")
            .field("rank", &self.layout.rank())
            .field("ranks", &self.layout.ranks())
            .finish()
    }
}

impl RankContext {
    /// A data frame for `tag` with room for `payload_len` bytes of payload,
    /// still to be appended after its header (so a sender copies its data
    /// once), in a buffer the mailbox used before when it has one (no fresh
    /// pages for a collective's frames).
    pub fn data_frame(&self, tag: u64, payload_len: usize) -> Result<Vec<u8>, ClusterError> {
        let mut frame = lock(&self.mailbox)?.spare_buffer(DATA_HEADER + payload_len);
        write_data_header(&mut frame, tag);
        Ok(frame)
    }

    /// Hands a received frame back to the mailbox for reuse.
    pub fn recycle(&self, frame: Vec<u8>) {
        if let Ok(mut mailbox) = lock(&self.mailbox) {
            mailbox.recycle(frame);
        }
    }

    /// Sends a data frame made by [`RankContext::data_frame`] to `to`,
    /// without waiting.
    pub fn send_data(&self, to: u32, frame: Vec<u8>) -> Result<(), ClusterError> {
        lock(&self.mailbox)?.send(to, frame)
    }

    /// The next frame from `from`, which must be the data frame `tag`
    /// (read its bytes with [`data_payload`]). An abort from rank 0 is the
    /// loss it names; no frame within the bound names `from` as lost.
    ///
    /// [`data_payload`]: super::data_payload
    pub fn receive_data(
        &self,
        from: u32,
        tag: u64,
        awaiting: &str,
    ) -> Result<Vec<u8>, ClusterError> {
        let deadline = Instant::now() + self.timeout;
        let mut mailbox = lock(&self.mailbox)?;
        let Some(bytes) = receive_past_notices(&mut **mailbox, from, deadline)? else {
            return Err(self.lost(from, awaiting));
        };
        data_frame_payload(&mut **mailbox, from, tag, &bytes, awaiting)?;
        Ok(bytes)
    }

    /// One step of a collective between the ranks ([`Exchange`]), each
    /// receive handed to `landed` as it completes. Bounded by the job's
    /// timeout: the rank whose data did not come is named lost, unless
    /// rank 0 sent an abort meanwhile, which names the rank it lost.
    pub fn exchange<'r>(
        &self,
        exchange: Exchange<'_, 'r>,
        awaiting: &str,
        landed: &mut Landed<'r, '_>,
    ) -> Result<(), ClusterError> {
        if exchange.is_empty() {
            return Ok(());
        }
        let deadline = Instant::now() + self.timeout;
        let mut mailbox = lock(&self.mailbox)?;
        let Some(silent) = mailbox.exchange(exchange, deadline, landed)? else {
            return Ok(());
        };
        Err(self.silent_rank(&mut **mailbox, silent, awaiting))
    }

    /// The error for `silent` not coming within the bound: the rank rank 0
    /// named in an abort it sent meanwhile (`silent` may be stuck behind
    /// it), or else `silent` itself. The mailbox is abandoned either way.
    fn silent_rank(&self, mailbox: &mut dyn Mailbox, silent: u32, awaiting: &str) -> ClusterError {
        if silent != SERVICE_RANK
            && !self.layout.runs_service()
            && let Ok(Some(frame)) = receive_past_notices(mailbox, SERVICE_RANK, Instant::now())
            && let Ok(Frame::Abort(abort)) = decode(SERVICE_RANK, &frame)
        {
            mailbox.abandon();
            return ClusterError::RankLost {
                rank: abort.rank,
                hosts: abort.hosts,
                reason: abort.reason,
            };
        }
        mailbox.abandon();
        self.lost(silent, awaiting)
    }

    /// Runs `use_segment` on the segment every rank shares, with at least
    /// `bytes` bytes a part: allocated with every other rank the first
    /// time, and again (the old one freed) when a call needs more, so
    /// every rank must call this at the same point with the same `bytes`.
    /// `Ok(None)` when the ranks share no memory (on several nodes, or
    /// mailboxes that move only frames): the caller moves its bytes by
    /// [`RankContext::exchange`] instead.
    pub fn with_shared_segment<R>(
        &self,
        bytes: usize,
        use_segment: impl FnOnce(&mut SharedSegment) -> Result<R, ClusterError>,
    ) -> Result<Option<R>, ClusterError> {
        if self.layout.ranks() == 1 {
            return Ok(None);
        }
        let mut state = self.segment.0.lock().unwrap_or_else(|e| e.into_inner());
        if state.unavailable {
            return Ok(None);
        }
        if state.segment.as_ref().is_none_or(|s| s.len() < bytes) {
            // Free the old segment before the new one is allocated (each
            // is a collective over the ranks, taken in the same order).
            state.segment = None;
            let deadline = Instant::now() + self.timeout;
            match lock(&self.mailbox)?.share_memory(bytes, deadline)? {
                Some(segment) => state.segment = Some(segment),
                None => {
                    state.unavailable = true;
                    return Ok(None);
                }
            }
        }
        let segment = state.segment.as_mut().expect("allocated above");
        use_segment(segment).map(Some)
    }

    /// [`SharedSegment::fence`] bounded by the job's timeout: a rank that
    /// does not come is named lost, unless rank 0 sent an abort meanwhile,
    /// which names the rank it lost.
    pub fn fence(&self, segment: &mut SharedSegment, awaiting: &str) -> Result<(), ClusterError> {
        let deadline = Instant::now() + self.timeout;
        let Some(silent) = segment.fence(deadline)? else {
            return Ok(());
        };
        let mut mailbox = lock(&self.mailbox)?;
        Err(self.silent_rank(&mut **mailbox, silent, awaiting))
    }

    fn lost(&self, rank: u32, awaiting: &str) -> ClusterError {
        ClusterError::RankLost {
            rank,
            hosts: self.layout.describe_hosts(rank),
            reason: format!(
                "no {awaiting} from it within {:.1} s",
                self.timeout.as_secs_f64()
            ),
        }
    }

    /// Rank 0's `value` on every rank (postcard-encoded on the way).
    pub fn broadcast_value<V>(&self, value: &V) -> Result<V, ClusterError>
    where
        V: Serialize + serde::de::DeserializeOwned + Clone,
    {
        if self.layout.ranks() == 1 {
            return Ok(value.clone());
        }
        let bytes = if self.layout.runs_service() {
            postcard::to_stdvec(value).expect("values encode")
        } else {
            Vec::new()
        };
        let bytes = broadcast(&self.mailbox, &self.layout, Ok(bytes), self.timeout)?;
        postcard::from_bytes(&bytes).map_err(|e| ClusterError::Protocol {
            rank: SERVICE_RANK,
            what: format!("a broadcast value that does not decode ({e})"),
        })
    }

    /// Rank 0 stops the others after `error` (best effort); on other
    /// ranks nothing to do: rank 0 names the lost rank.
    pub fn abort(&self, error: &ClusterError) {
        if self.layout.runs_service() {
            abort_all(&self.mailbox, &self.layout, error);
        }
    }
}
