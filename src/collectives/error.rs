//! Why a collective could not run, or failed before it completed.

use thiserror::Error;

use super::pod::CollectiveKind;
use crate::topology::DeviceId;

/// Why a collective could not run. Nothing is modified when one is returned.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum CollectiveError {
    /// The ring has no members.
    #[error("the ring is empty: a collective needs at least one rank")]
    EmptyRing,
    /// A ring member is not a valid buffer index.
    #[error("ring member {rank} is out of range: there are {buffers} buffers (ranks 0..{buffers})")]
    RankOutOfRange {
        /// The offending rank.
        rank: usize,
        /// Number of buffers passed.
        buffers: usize,
    },
    /// A rank appears twice in the ring.
    #[error("rank {rank} appears more than once in the ring")]
    DuplicateRank {
        /// The repeated rank.
        rank: usize,
    },
    /// Ring members' buffers differ in length.
    #[error(
        "rank {rank} has {len} elements but rank {first_rank} has {expected}: every member's buffer must have the same length"
    )]
    LengthMismatch {
        /// The rank whose buffer differs.
        rank: usize,
        /// Its length.
        len: usize,
        /// The first member.
        first_rank: usize,
        /// The first member's length.
        expected: usize,
    },
    /// The broadcast root is not a ring member.
    #[error("broadcast root {root} is not a member of the ring")]
    RootNotInRing {
        /// The requested root.
        root: usize,
    },
    /// A torus shape with no dimension, a zero extent, an overflowing device
    /// count, or a wraparound list of another length.
    #[error(
        "invalid torus shape {dims:?} with wraparound {wraparound:?}: give one extent ≥ 1 and one wraparound flag per dimension"
    )]
    InvalidTorusShape {
        /// Extents given.
        dims: Vec<usize>,
        /// Wraparound flags given.
        wraparound: Vec<bool>,
    },
    /// The number of buffers does not match the torus.
    #[error("the torus has {expected} devices but {got} buffers were passed")]
    BufferCount {
        /// Devices in the torus.
        expected: usize,
        /// Buffers passed.
        got: usize,
    },
    /// A link model with a negative or non-finite latency, or a bandwidth
    /// that is not positive and finite.
    #[error(
        "invalid link model: latency {latency_seconds} s must be finite and ≥ 0, bandwidth {bandwidth_bytes_per_second} B/s finite and > 0"
    )]
    InvalidLinkModel {
        /// Latency given.
        latency_seconds: f64,
        /// Bandwidth given.
        bandwidth_bytes_per_second: f64,
    },
    /// An all-to-all's buffers do not split into equal chunks.
    #[error(
        "an all-to-all splits each buffer into one equal chunk per member: {len} elements do \
         not split into {members}"
    )]
    Indivisible {
        /// The buffers' length.
        len: usize,
        /// The members.
        members: usize,
    },
    /// A ragged all-to-all's counts do not describe its inputs.
    #[error("ragged all-to-all: member {member}'s send counts: {reason}")]
    RaggedCounts {
        /// The ring position whose counts are wrong.
        member: usize,
        /// What is wrong.
        reason: String,
    },
    /// A benchmark was asked for zero ranks.
    #[error("a benchmark needs at least one rank")]
    NoRanks,
    /// The pod has several slices joined by DCN links, not one torus: a
    /// collective on one torus (a ring over every device, a broadcast)
    /// cannot span it.
    #[error(
        "`{pod}` has {slices} slices joined by DCN links, not one torus: {what} is not built \
         across slices; all-reduce, reduce-scatter and all-gather run hierarchically (ICI \
         inside each slice, DCN across)"
    )]
    AcrossSlices {
        /// The pod.
        pod: String,
        /// Its slice count.
        slices: u32,
        /// What was asked for.
        what: String,
    },
    /// A multislice pod without the DCN fabric (`dcn: (fabric: false)`):
    /// its slices are joined only by hand-listed links, which a
    /// hierarchical collective cannot use as rails.
    #[error(
        "`{pod}` has {slices} slices but no DCN fabric (`dcn: (fabric: false)`): hierarchical \
         collectives exchange between every host and its twins over the fabric; turn the \
         fabric on, or run collectives per slice"
    )]
    NoFabric {
        /// The pod.
        pod: String,
        /// Its slice count.
        slices: u32,
    },
    /// A multislice shape that cannot be: no slice, one slice, more than 3
    /// slice dimensions, or a NIC map that does not fit the slice.
    #[error("invalid multislice shape: slices of {dims:?} x {slices}: {reason}")]
    InvalidMultislice {
        /// The slice's extents.
        dims: Vec<usize>,
        /// Slices.
        slices: usize,
        /// What is wrong.
        reason: String,
    },
    /// A pod-wide collective takes one buffer per device.
    #[error(
        "collective: {pod} has {devices} devices but {buffers} buffers were passed \
         (one per device, by id)"
    )]
    DeviceBuffers {
        /// The pod.
        pod: String,
        /// Its devices.
        devices: usize,
        /// Buffers passed.
        buffers: usize,
    },
    /// A participant is not running or was declared failed.
    #[error(
        "collective: {device} is not running or has failed ({down} devices down); \
         exclude it or roll back before launching collectives"
    )]
    DeviceDown {
        /// The lowest such device.
        device: DeviceId,
        /// How many are down.
        down: usize,
    },
    /// The schedule needs a link the pod does not have.
    #[error("collective: no link joins device {src} and device {dst}")]
    NoLink {
        /// Sending device.
        src: usize,
        /// Receiving device.
        dst: usize,
    },
    /// The schedule needs a link that is cut.
    #[error("collective: the link between device {src} and device {dst} is cut")]
    LinkCut {
        /// Sending device.
        src: usize,
        /// Receiving device.
        dst: usize,
    },
    /// A participant was declared failed, or killed, before the collective
    /// completed.
    #[error(
        "collective {kind:?} failed at t={:.3} s: participant {device} failed",
        *at_ns as f64 * 1e-9
    )]
    ParticipantFailed {
        /// Which collective.
        kind: CollectiveKind,
        /// When, ns.
        at_ns: u64,
        /// The failed participant.
        device: DeviceId,
    },
    /// A wait passed the collective's completion time and it is still
    /// pending: the collective system is not running on this world.
    #[error(
        "collective {kind:?} is still pending at t={:.3} s, past its completion at t={:.3} s; \
         the collective system did not run",
        *now_ns as f64 * 1e-9,
        *completes_at_ns as f64 * 1e-9
    )]
    Stalled {
        /// Which collective.
        kind: CollectiveKind,
        /// When it was to complete, ns.
        completes_at_ns: u64,
        /// When the wait gave up, ns.
        now_ns: u64,
    },
    /// The collective's entity is gone (the world was restored since).
    #[error("collective entity no longer exists (the world was restored)")]
    Vanished,
}

impl From<CollectiveError> for crate::error::OptimError {
    fn from(error: CollectiveError) -> Self {
        crate::error::OptimError::new(crate::error::ErrorKind::Collective, error)
    }
}
