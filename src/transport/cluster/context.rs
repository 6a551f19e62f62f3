//! [`RankContext`]: a rank's place in the job, for systems that send and
//! receive data frames themselves.

use super::SERVICE_RANK;
use super::exchange::{Exchange, Landed, data_frame_payload};
use super::frame::{DATA_HEADER, Frame, decode, write_data_header};
use super::layout::RankLayout;
use super::mailbox::{SharedMailbox, lock, receive_past_notices};
use super::protocol::{abort_all, broadcast};
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
        // Did rank 0 stop the job while this rank waited on another?
        if silent != SERVICE_RANK
            && !self.layout.runs_service()
            && let Ok(Some(frame)) =
                receive_past_notices(&mut **mailbox, SERVICE_RANK, Instant::now())
            && let Ok(Frame::Abort(abort)) = decode(SERVICE_RANK, &frame)
        {
            mailbox.abandon();
            return Err(ClusterError::RankLost {
                rank: abort.rank,
                hosts: abort.hosts,
                reason: abort.reason,
            });
        }
        mailbox.abandon();
        Err(self.lost(silent, awaiting))
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
