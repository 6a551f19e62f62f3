//! One pod over several processes ("ranks"), each owning a contiguous block
//! of hosts, exchanging each tick's messages once per tick.
//!
//! The multi-controller model of JAX and of the TPU pod itself: one process
//! per block of hosts, each stepping only its own devices, with the
//! coordination service on rank 0 ([`SERVICE_RANK`]). Every rank runs the
//! same `Step` schedule in lockstep. A message stays with its sender's rank
//! until it is due; in [`StepSystems::Transport`] each rank hands the due
//! messages for other ranks' receivers to the [`ClusterBackend`], which
//! exchanges them (one frame from every rank to rank 0, one frame back to
//! every rank) before the tick's delivery. Because delivery happens only in
//! that set, and every message due by now has been handed over by then, a
//! rank's inbox holds exactly what one process's would, in the same order,
//! whatever the latency and however the hosts are split: the pod does not
//! depend on the rank count.
//!
//! The frames travel through a [`Mailbox`]: [`ThreadMailbox`] joins ranks
//! that are threads of one process (tests, and a host that wants the
//! split without MPI); with the `mpi` feature, `MpiMailbox` joins the
//! processes `mpirun` started. Every wait on another rank is bounded in
//! wall time ([`ClusterBackend::timeout`]): a rank that died or hung is
//! named with its hosts, never waited for forever. (The bound is machinery,
//! like the mailbox: it decides when to give up on a real process, never
//! what happens in simulated time.)
//!
//! [`StepSystems::Transport`]: crate::schedule::StepSystems::Transport

use super::error::ClusterError;
use super::{Envelope, StoredEnvelope, TransportBackend, TransportError};
use crate::topology::{DeviceId, Topology};
use bevy_ecs::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The rank that runs the coordination service (heartbeat detection,
/// barriers, monitoring) and collects the others' frames.
pub const SERVICE_RANK: u32 = 0;

/// How long a rank waits for another before it names it lost, unless the
/// host sets another bound: long enough for a loaded machine to page in a
/// big world, short enough that a dead job ends within a minute.
pub const DEFAULT_RANK_TIMEOUT: Duration = Duration::from_secs(30);

/// Which rank owns which hosts: contiguous blocks, sizes differing by at
/// most one (rank `r` owns hosts `r·H/R .. (r+1)·H/R`).
#[derive(Resource, Debug, Clone, PartialEq, Eq)]
pub struct RankLayout {
    ranks: u32,
    rank: u32,
    /// First host of each rank, and the host count at the end.
    host_starts: Vec<u32>,
    /// The host of each device id.
    device_hosts: Vec<u32>,
}

impl RankLayout {
    /// The layout of `topology` over `ranks` ranks, seen from `rank`.
    pub fn new(topology: &Topology, ranks: u32, rank: u32) -> Result<RankLayout, ClusterError> {
        let hosts = topology.num_hosts();
        if ranks == 0 || ranks > hosts {
            return Err(ClusterError::TooManyRanks { ranks, hosts });
        }
        if rank >= ranks {
            return Err(ClusterError::NoSuchRank { rank, ranks });
        }
        let host_starts = (0..=ranks)
            .map(|r| (u64::from(r) * u64::from(hosts) / u64::from(ranks)) as u32)
            .collect();
        let device_hosts = (0..topology.num_devices())
            .map(|d| topology.host_of(d))
            .collect();
        Ok(RankLayout {
            ranks,
            rank,
            host_starts,
            device_hosts,
        })
    }

    /// Ranks in the job.
    pub fn ranks(&self) -> u32 {
        self.ranks
    }

    /// This process's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Whether this rank runs the coordination service.
    pub fn runs_service(&self) -> bool {
        self.rank == SERVICE_RANK
    }

    /// The hosts `rank` owns.
    pub fn hosts(&self, rank: u32) -> std::ops::Range<u32> {
        let r = rank.min(self.ranks - 1) as usize;
        self.host_starts[r]..self.host_starts[r + 1]
    }

    /// `hosts 4..=7` of a rank, for errors.
    pub fn describe_hosts(&self, rank: u32) -> String {
        let hosts = self.hosts(rank);
        format!("{}..={}", hosts.start, hosts.end.saturating_sub(1))
    }

    /// The rank that owns host `host`.
    pub fn rank_of_host(&self, host: u32) -> u32 {
        (self.host_starts.partition_point(|&start| start <= host) as u32).saturating_sub(1)
    }

    /// The rank that owns device `device` (rank 0 for an unknown id).
    pub fn rank_of_device(&self, device: DeviceId) -> u32 {
        self.device_hosts
            .get(device.0 as usize)
            .map_or(SERVICE_RANK, |&h| self.rank_of_host(h))
    }

    /// The rank that delivers a message for `to` (`None`: the service).
    pub fn owner(&self, to: Option<DeviceId>) -> u32 {
        to.map_or(SERVICE_RANK, |d| self.rank_of_device(d))
    }

    /// Whether this rank runs `device`.
    pub fn is_local(&self, device: DeviceId) -> bool {
        self.rank_of_device(device) == self.rank
    }

    /// The device ids this rank runs, in order.
    pub fn local_devices(&self) -> Vec<DeviceId> {
        (0..self.device_hosts.len() as u32)
            .map(DeviceId)
            .filter(|&d| self.is_local(d))
            .collect()
    }
}

/// Moves byte frames between the ranks of one job.
pub trait Mailbox: Send + std::fmt::Debug {
    /// This rank.
    fn rank(&self) -> u32;
    /// Ranks in the job.
    fn ranks(&self) -> u32;
    /// Sends a frame to `to` without waiting for it to be received.
    fn send(&mut self, to: u32, frame: Vec<u8>) -> Result<(), ClusterError>;
    /// The next frame from `from`, waiting at most until `deadline`;
    /// `Ok(None)` if none came by then.
    fn receive(&mut self, from: u32, deadline: Instant) -> Result<Option<Vec<u8>>, ClusterError>;
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
}

/// `ranks` connected thread mailboxes, one per rank, in rank order.
pub fn thread_mailboxes(ranks: u32) -> Vec<ThreadMailbox> {
    let n = ranks as usize;
    let shared = Arc::new((
        Mutex::new(vec![vec![VecDeque::new(); n]; n]),
        Condvar::new(),
    ));
    (0..ranks)
        .map(|rank| ThreadMailbox {
            rank,
            ranks,
            shared: Arc::clone(&shared),
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
        let (queues, ready) = &*self.shared;
        let mut queues = queues
            .lock()
            .map_err(|_| ClusterError::Transport("a rank thread panicked".into()))?;
        queues
            .get_mut(to as usize)
            .ok_or(ClusterError::NoSuchRank {
                rank: to,
                ranks: self.ranks,
            })?[self.rank as usize]
            .push_back(frame);
        ready.notify_all();
        Ok(())
    }

    fn receive(&mut self, from: u32, deadline: Instant) -> Result<Option<Vec<u8>>, ClusterError> {
        let (queues, ready) = &*self.shared;
        fn poisoned<T>(_: T) -> ClusterError {
            ClusterError::Transport("a rank thread panicked".into())
        }
        let mut queues = queues.lock().map_err(poisoned)?;
        loop {
            if let Some(frame) = queues[self.rank as usize]
                .get_mut(from as usize)
                .and_then(VecDeque::pop_front)
            {
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

/// An envelope on the wire is a [`StoredEnvelope`] whose route holds link
/// numbers (links in entity order, the same on every rank: each spawns the
/// whole topology) where a snapshot's holds dense ids.
type WireEnvelope = StoredEnvelope;

/// What ranks say to each other.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Frame {
    /// A rank's start-up description, compared by rank 0.
    Hello {
        /// Digest of what must be equal on every rank.
        digest: String,
        /// What the digest covers, for the error.
        description: String,
    },
    /// Rank 0's answer: go, or the difference.
    Welcome(Result<(), String>),
    /// A tick's messages at exchange `exchange`: a rank's due messages
    /// for other ranks (to rank 0), or rank 0's delivery to a rank.
    Messages {
        exchange: u64,
        envelopes: Vec<WireEnvelope>,
    },
    /// Rank 0 stops the job: a rank was lost or broke the protocol.
    Abort(ClusterAbort),
    /// A rank's part of the world at the end.
    Part(Vec<u8>),
    /// Rank 0's verdict on the merged world.
    Done(Result<(), String>),
}

/// Why rank 0 stopped the job (sent to every rank still there).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ClusterAbort {
    rank: u32,
    hosts: String,
    reason: String,
}

fn encode(frame: &Frame) -> Vec<u8> {
    postcard::to_stdvec(frame).expect("frames encode")
}

fn decode(rank: u32, bytes: &[u8]) -> Result<Frame, ClusterError> {
    if bytes.first() == Some(&DATA_MARK) {
        return Err(ClusterError::Protocol {
            rank,
            what: "a data frame where a control frame was due".into(),
        });
    }
    postcard::from_bytes(bytes).map_err(|e| ClusterError::Protocol {
        rank,
        what: format!("a frame that does not decode ({e}): another build of optirs-tpu?"),
    })
}

/// The first byte of a data frame. Control frames are postcard enums
/// whose first byte is their (small) variant index, so the two never meet.
const DATA_MARK: u8 = 0xFF;

/// Bytes before a data frame's payload: the mark, padding, the tag. Sixteen
/// keep the payload as aligned as the frame's allocation.
const DATA_HEADER: usize = 16;

fn write_data_header(frame: &mut Vec<u8>, tag: u64) {
    frame.clear();
    frame.push(DATA_MARK);
    frame.extend_from_slice(&[0; 7]);
    frame.extend_from_slice(&tag.to_le_bytes());
}

/// The payload of a data frame (what follows its header).
pub fn data_payload(frame: &[u8]) -> &[u8] {
    &frame[DATA_HEADER.min(frame.len())..]
}

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
    pub fn receive_data(
        &self,
        from: u32,
        tag: u64,
        awaiting: &str,
    ) -> Result<Vec<u8>, ClusterError> {
        let deadline = Instant::now() + self.timeout;
        let mut mailbox = lock(&self.mailbox)?;
        let Some(bytes) = mailbox.receive(from, deadline)? else {
            return Err(ClusterError::RankLost {
                rank: from,
                hosts: self.layout.describe_hosts(from),
                reason: format!(
                    "no {awaiting} from it within {:.1} s",
                    self.timeout.as_secs_f64()
                ),
            });
        };
        if bytes.first() != Some(&DATA_MARK) || bytes.len() < DATA_HEADER {
            return Err(match decode(from, &bytes)? {
                Frame::Abort(abort) => {
                    mailbox.abandon();
                    ClusterError::RankLost {
                        rank: abort.rank,
                        hosts: abort.hosts,
                        reason: abort.reason,
                    }
                }
                frame => unexpected(from, &frame, awaiting),
            });
        }
        let theirs = u64::from_le_bytes(bytes[8..16].try_into().expect("eight bytes"));
        if theirs != tag {
            return Err(ClusterError::Protocol {
                rank: from,
                what: format!(
                    "data frame {theirs:#x} where {awaiting} ({tag:#x}) was due: the ranks are \
                     out of step"
                ),
            });
        }
        Ok(bytes)
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

/// Sends `frame` to `to` through the shared mailbox.
fn send_frame(mailbox: &SharedMailbox, to: u32, frame: &Frame) -> Result<(), ClusterError> {
    lock(mailbox)?.send(to, encode(frame))
}

/// The next frame from `from`, or [`ClusterError::RankLost`] after
/// `timeout` (naming `from` and its hosts, and what was awaited).
fn receive_frame(
    mailbox: &SharedMailbox,
    layout: &RankLayout,
    from: u32,
    timeout: Duration,
    awaiting: &str,
) -> Result<Frame, ClusterError> {
    let deadline = Instant::now() + timeout;
    let mut mailbox = lock(mailbox)?;
    match mailbox.receive(from, deadline)? {
        Some(bytes) => match decode(from, &bytes)? {
            Frame::Abort(abort) => {
                mailbox.abandon();
                Err(ClusterError::RankLost {
                    rank: abort.rank,
                    hosts: abort.hosts,
                    reason: abort.reason,
                })
            }
            frame => Ok(frame),
        },
        None => Err(ClusterError::RankLost {
            rank: from,
            hosts: layout.describe_hosts(from),
            reason: format!(
                "no {awaiting} from it within {:.1} s",
                timeout.as_secs_f64()
            ),
        }),
    }
}

fn lock(
    mailbox: &SharedMailbox,
) -> Result<std::sync::MutexGuard<'_, Box<dyn Mailbox>>, ClusterError> {
    mailbox
        .lock()
        .map_err(|_| ClusterError::Transport("the mailbox lock was poisoned".into()))
}

/// Rank 0 tells every other rank (best effort) that the job stops.
fn abort_all(mailbox: &SharedMailbox, layout: &RankLayout, error: &ClusterError) {
    let (rank, hosts, reason) = match error {
        ClusterError::RankLost {
            rank,
            hosts,
            reason,
        } => (*rank, hosts.clone(), reason.clone()),
        other => (
            layout.rank(),
            layout.describe_hosts(layout.rank()),
            other.to_string(),
        ),
    };
    let frame = Frame::Abort(ClusterAbort {
        rank,
        hosts,
        reason,
    });
    for to in 0..layout.ranks() {
        if to != layout.rank() && to != rank {
            let _ = send_frame(mailbox, to, &frame);
        }
    }
}

/// Start-up check: every rank sends rank 0 a digest of what must agree
/// (pod, binary version, run); rank 0 compares and answers all. Any
/// difference is an error on every rank, naming the ranks and what each has.
pub fn handshake(
    mailbox: &SharedMailbox,
    layout: &RankLayout,
    digest: &str,
    description: &str,
    timeout: Duration,
) -> Result<(), ClusterError> {
    if layout.ranks() == 1 {
        return Ok(());
    }
    if !layout.runs_service() {
        send_frame(
            mailbox,
            SERVICE_RANK,
            &Frame::Hello {
                digest: digest.into(),
                description: description.into(),
            },
        )?;
        return match receive_frame(
            mailbox,
            layout,
            SERVICE_RANK,
            timeout * 2,
            "start-up answer",
        )? {
            Frame::Welcome(Ok(())) => Ok(()),
            Frame::Welcome(Err(difference)) => Err(ClusterError::Mismatch(difference)),
            other => Err(unexpected(SERVICE_RANK, &other, "its start-up answer")),
        };
    }
    let mut differences = Vec::new();
    let mut lost = None;
    for rank in 1..layout.ranks() {
        match receive_frame(mailbox, layout, rank, timeout, "start-up description") {
            Ok(Frame::Hello {
                digest: theirs,
                description: what,
            }) => {
                if theirs != digest {
                    differences.push(format!(
                        "rank {rank} has {what} (digest {}), rank 0 has {description} (digest {})",
                        short(&theirs),
                        short(digest)
                    ));
                }
            }
            Ok(other) => differences.push(unexpected(rank, &other, "its description").to_string()),
            Err(error) => {
                lost = Some(error);
                break;
            }
        }
    }
    if let Some(error) = lost {
        abort_all(mailbox, layout, &error);
        return Err(error);
    }
    let verdict = if differences.is_empty() {
        Ok(())
    } else {
        Err(differences.join("; "))
    };
    for rank in 1..layout.ranks() {
        send_frame(mailbox, rank, &Frame::Welcome(verdict.clone()))?;
    }
    verdict.map_err(ClusterError::Mismatch)
}

fn short(digest: &str) -> &str {
    &digest[..digest.len().min(12)]
}

fn unexpected(rank: u32, frame: &Frame, expected: &str) -> ClusterError {
    let kind = match frame {
        Frame::Hello { .. } => "a start-up description",
        Frame::Welcome(_) => "a start-up answer",
        Frame::Messages { .. } => "a tick's messages",
        Frame::Abort(_) => "an abort",
        Frame::Part(_) => "its part of the world",
        Frame::Done(_) => "a verdict",
    };
    ClusterError::Protocol {
        rank,
        what: format!("{kind} where {expected} was due"),
    }
}

/// Rank 0 sends every rank the same bytes (or why it has none); every
/// rank returns them (rank 0 its own). An `Err` from rank 0 is a
/// [`ClusterError::Coordinator`] on every rank.
pub fn broadcast(
    mailbox: &SharedMailbox,
    layout: &RankLayout,
    bytes: Result<Vec<u8>, String>,
    timeout: Duration,
) -> Result<Vec<u8>, ClusterError> {
    if layout.runs_service() {
        let frame = match &bytes {
            Ok(bytes) => Frame::Part(bytes.clone()),
            Err(reason) => Frame::Done(Err(reason.clone())),
        };
        for rank in 1..layout.ranks() {
            send_frame(mailbox, rank, &frame)?;
        }
        return bytes.map_err(ClusterError::Coordinator);
    }
    match receive_frame(mailbox, layout, SERVICE_RANK, timeout * 2, "broadcast")? {
        Frame::Part(bytes) => Ok(bytes),
        Frame::Done(Err(reason)) => Err(ClusterError::Coordinator(reason)),
        other => Err(unexpected(SERVICE_RANK, &other, "a broadcast")),
    }
}

/// Every rank sends rank 0 its part of the world; rank 0 gets them all
/// (its own first), the others `None`. Then rank 0 must [`finish`].
pub fn gather_parts(
    mailbox: &SharedMailbox,
    layout: &RankLayout,
    own: Vec<u8>,
    timeout: Duration,
) -> Result<Option<Vec<Vec<u8>>>, ClusterError> {
    if !layout.runs_service() {
        send_frame(mailbox, SERVICE_RANK, &Frame::Part(own))?;
        return Ok(None);
    }
    let mut parts = vec![own];
    for rank in 1..layout.ranks() {
        match receive_frame(mailbox, layout, rank, timeout, "part of the world")? {
            Frame::Part(bytes) => parts.push(bytes),
            other => return Err(unexpected(rank, &other, "its part of the world")),
        }
    }
    Ok(Some(parts))
}

/// Rank 0 tells every rank whether the merged world was accepted; the
/// others wait for it, so every rank ends with the same verdict.
pub fn finish(
    mailbox: &SharedMailbox,
    layout: &RankLayout,
    verdict: Result<(), String>,
    timeout: Duration,
) -> Result<(), ClusterError> {
    if layout.ranks() == 1 {
        return verdict.map_err(ClusterError::Coordinator);
    }
    if layout.runs_service() {
        for rank in 1..layout.ranks() {
            send_frame(mailbox, rank, &Frame::Done(verdict.clone()))?;
        }
        return verdict.map_err(ClusterError::Coordinator);
    }
    match receive_frame(mailbox, layout, SERVICE_RANK, timeout * 2, "final verdict")? {
        Frame::Done(verdict) => verdict.map_err(ClusterError::Coordinator),
        other => Err(unexpected(SERVICE_RANK, &other, "the final verdict")),
    }
}

/// The transport backend of one rank: owns its hosts' devices (and rank 0
/// the service); exchanges each tick's due messages through rank 0.
pub struct ClusterBackend {
    layout: RankLayout,
    mailbox: SharedMailbox,
    timeout: Duration,
    /// Links in entity order; a route travels as indices into it.
    links: Vec<Entity>,
    link_numbers: HashMap<Entity, u32>,
    outbox: Vec<Envelope>,
    exchanges: u64,
    failure: Option<ClusterError>,
}

impl std::fmt::Debug for ClusterBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterBackend")
            .field("rank", &self.layout.rank())
            .field("ranks", &self.layout.ranks())
            .field("exchanges", &self.exchanges)
            .finish()
    }
}

impl ClusterBackend {
    /// The backend of `layout`'s rank over `mailbox`, with the pod's link
    /// entities (any order: they are sorted here).
    pub fn new(
        layout: RankLayout,
        mailbox: SharedMailbox,
        mut links: Vec<Entity>,
        timeout: Duration,
    ) -> ClusterBackend {
        links.sort_unstable_by_key(|e| e.index_u32());
        let link_numbers = links
            .iter()
            .enumerate()
            .map(|(i, &e)| (e, i as u32))
            .collect();
        ClusterBackend {
            layout,
            mailbox,
            timeout,
            links,
            link_numbers,
            outbox: Vec::new(),
            exchanges: 0,
            failure: None,
        }
    }

    /// The bound on every wait for another rank.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn wire_of(&self, envelope: Envelope) -> WireEnvelope {
        WireEnvelope {
            deliver_at_ns: envelope.deliver_at_ns,
            seq: envelope.seq,
            from: envelope.from,
            to: envelope.to,
            payload: envelope.payload,
            sent_at_ns: envelope.sent_at_ns,
            route: envelope
                .route
                .iter()
                .map(|link| self.link_numbers.get(link).copied().unwrap_or(u32::MAX))
                .collect(),
        }
    }

    fn envelope_of(&self, rank: u32, wire: WireEnvelope) -> Result<Envelope, ClusterError> {
        let route = wire
            .route
            .iter()
            .map(|&n| {
                self.links
                    .get(n as usize)
                    .copied()
                    .ok_or(ClusterError::Protocol {
                        rank,
                        what: format!(
                            "a message routed over link {n}, which this pod does not have"
                        ),
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Envelope {
            deliver_at_ns: wire.deliver_at_ns,
            seq: wire.seq,
            from: wire.from,
            to: wire.to,
            payload: wire.payload,
            sent_at_ns: wire.sent_at_ns,
            route,
        })
    }

    /// The envelopes `from` sent at exchange `exchange`, waiting at most
    /// `timeout`.
    fn receive_messages(
        &self,
        from: u32,
        timeout: Duration,
        exchange: u64,
    ) -> Result<Vec<WireEnvelope>, ClusterError> {
        let awaiting = format!("messages for exchange {exchange}");
        let frame = receive_frame(&self.mailbox, &self.layout, from, timeout, &awaiting)?;
        let Frame::Messages {
            exchange: theirs,
            envelopes,
        } = frame
        else {
            return Err(unexpected(from, &frame, "a tick's messages"));
        };
        if theirs != exchange {
            return Err(out_of_step(from, theirs, exchange));
        }
        Ok(envelopes)
    }

    fn exchange(&mut self, into: &mut Vec<Envelope>) -> Result<(), ClusterError> {
        let exchange = self.exchanges;
        self.exchanges += 1;
        let outgoing: Vec<Envelope> = std::mem::take(&mut self.outbox);
        if !self.layout.runs_service() {
            let envelopes = outgoing.into_iter().map(|e| self.wire_of(e)).collect();
            let frame = Frame::Messages {
                exchange,
                envelopes,
            };
            send_frame(&self.mailbox, SERVICE_RANK, &frame)?;
            // Rank 0 itself waits up to one bound for a lost rank before it
            // tells everyone; wait for it twice as long, so a lost rank is
            // named by rank 0 and not mistaken for rank 0.
            let delivered = self.receive_messages(SERVICE_RANK, self.timeout * 2, exchange)?;
            for wire in delivered {
                into.push(self.envelope_of(SERVICE_RANK, wire)?);
            }
            return Ok(());
        }
        let mut replies: Vec<Vec<WireEnvelope>> = vec![Vec::new(); self.layout.ranks() as usize];
        let outgoing = outgoing
            .into_iter()
            .map(|e| (SERVICE_RANK, self.wire_of(e)));
        let mut arrived: Vec<(u32, WireEnvelope)> = outgoing.collect();
        for rank in 1..self.layout.ranks() {
            let envelopes = self.receive_messages(rank, self.timeout, exchange)?;
            arrived.extend(envelopes.into_iter().map(|wire| (rank, wire)));
        }
        for (from, wire) in arrived {
            match self.layout.owner(wire.to) {
                SERVICE_RANK => into.push(self.envelope_of(from, wire)?),
                rank => replies[rank as usize].push(wire),
            }
        }
        for (rank, envelopes) in replies.into_iter().enumerate().skip(1) {
            send_frame(
                &self.mailbox,
                rank as u32,
                &Frame::Messages {
                    exchange,
                    envelopes,
                },
            )?;
        }
        Ok(())
    }
}

fn out_of_step(rank: u32, theirs: u64, ours: u64) -> ClusterError {
    ClusterError::Protocol {
        rank,
        what: format!("exchange {theirs} while this rank is at {ours}: the ranks are out of step"),
    }
}

impl TransportBackend for ClusterBackend {
    fn name(&self) -> &str {
        "cluster"
    }

    fn owns(&self, to: Option<DeviceId>) -> bool {
        self.layout.owner(to) == self.layout.rank()
    }

    fn send(&mut self, envelope: Envelope) {
        self.outbox.push(envelope);
    }

    fn receive(&mut self, into: &mut Vec<Envelope>) -> Result<(), TransportError> {
        if let Some(failure) = &self.failure {
            return Err(TransportError::Cluster(failure.clone()));
        }
        if self.layout.ranks() == 1 {
            self.outbox.clear();
            return Ok(());
        }
        self.exchange(into).map_err(|error| {
            if self.layout.runs_service() {
                abort_all(&self.mailbox, &self.layout, &error);
            }
            self.failure = Some(error.clone());
            TransportError::Cluster(error)
        })
    }
}
