//! The frames ranks exchange: control frames (postcard-encoded [`Frame`]s)
//! and data frames (a mark, a tag and raw payload).

use crate::transport::StoredEnvelope;
use crate::transport::error::ClusterError;
use serde::{Deserialize, Serialize};

/// An envelope on the wire is a [`StoredEnvelope`] whose route holds link
/// numbers (links in entity order, the same on every rank: each spawns the
/// whole topology) where a snapshot's holds dense ids.
pub(super) type WireEnvelope = StoredEnvelope;

/// What ranks say to each other.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) enum Frame {
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
    /// An alarm: rank `rank` is alive but has waited a bound on rank
    /// `waiting_on` in the tick's exchange. A rank waiting on `rank`
    /// then knows not to name it lost (it is stuck behind the lost rank).
    Stalled { rank: u32, waiting_on: u32 },
}

/// Why rank 0 stopped the job (sent to every rank still there).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct ClusterAbort {
    pub(super) rank: u32,
    pub(super) hosts: String,
    pub(super) reason: String,
}

pub(super) fn encode(frame: &Frame) -> Vec<u8> {
    postcard::to_stdvec(frame).expect("frames encode")
}

pub(super) fn decode(rank: u32, bytes: &[u8]) -> Result<Frame, ClusterError> {
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
pub(super) const DATA_MARK: u8 = 0xFF;

/// Bytes before a data frame's payload: the mark, padding, the tag. Sixteen
/// keep the payload as aligned as the frame's allocation.
pub(super) const DATA_HEADER: usize = 16;

pub(super) fn write_data_header(frame: &mut Vec<u8>, tag: u64) {
    frame.clear();
    frame.push(DATA_MARK);
    frame.extend_from_slice(&[0; 7]);
    frame.extend_from_slice(&tag.to_le_bytes());
}

/// The payload of a data frame (what follows its header).
pub fn data_payload(frame: &[u8]) -> &[u8] {
    &frame[DATA_HEADER.min(frame.len())..]
}

pub(super) fn unexpected(rank: u32, frame: &Frame, expected: &str) -> ClusterError {
    let kind = match frame {
        Frame::Hello { .. } => "a start-up description",
        Frame::Welcome(_) => "a start-up answer",
        Frame::Messages { .. } => "a tick's messages",
        Frame::Abort(_) => "an abort",
        Frame::Part(_) => "its part of the world",
        Frame::Done(_) => "a verdict",
        Frame::Stalled { .. } => "a stall notice",
    };
    ClusterError::Protocol {
        rank,
        what: format!("{kind} where {expected} was due"),
    }
}

/// Whether `bytes` is a [`Frame::Stalled`] notice (which every receive but
/// the tick exchange's passes over).
pub(super) fn is_stall_notice(bytes: &[u8]) -> bool {
    bytes.first() != Some(&DATA_MARK)
        && matches!(postcard::from_bytes(bytes), Ok(Frame::Stalled { .. }))
}
