//! A collective's bytes between ranks, moved once: [`Mailbox::exchange`]
//! sends slices of the members' own buffers and receives straight into
//! the caller's buffers, handing each receive to the caller as it lands so
//! it can fold or copy it while the rest is still in flight.
//!
//! A mailbox that moves only whole frames (the [`ThreadMailbox`] of tests)
//! uses [`framed_exchange`]: each send becomes one data frame, each
//! receive is one frame checked against the collective's tag and length.
//! The MPI mailbox posts every receive and send at once, nonblocking, and
//! polls them to the deadline (`transport::mpi`).
//!
//! [`ThreadMailbox`]: super::ThreadMailbox

use super::frame::{DATA_HEADER, DATA_MARK, Frame, decode, unexpected, write_data_header};
use super::mailbox::Mailbox;
use crate::transport::error::ClusterError;
use std::time::Instant;

/// What the caller does with receive `index` once its bytes are all
/// there: they stay valid (and unchanged) until the exchange returns.
pub type Landed<'r, 'f> = dyn FnMut(usize, &'r [u8]) -> Result<(), ClusterError> + 'f;

/// The sends and receives of one step of a collective on one rank.
/// Between two ranks, the `i`-th send of one to the other matches the
/// `i`-th receive the other posts from it (both sides list them in the
/// collective's canonical order), and every receive's length is the
/// matching send's.
pub struct Exchange<'s, 'r> {
    /// Tells this step's data from any other's (the same on every rank).
    pub tag: u64,
    /// `(to, bytes)`: bytes of this rank's members for another rank.
    pub sends: Vec<(u32, &'s [u8])>,
    /// `(from, buffer)`: where another rank's bytes land, sized to them.
    pub receives: Vec<(u32, &'r mut [u8])>,
}

impl Exchange<'_, '_> {
    /// Whether this rank has nothing to send or receive in this step.
    pub fn is_empty(&self) -> bool {
        self.sends.is_empty() && self.receives.is_empty()
    }
}

/// [`Mailbox::exchange`] over whole frames: every send as a data frame
/// (the bytes copied once into it), then every receive in order, its
/// frame's payload copied into the caller's buffer. `Ok(Some(rank))` if
/// `rank`'s frame did not come by `deadline`.
pub fn framed_exchange<'r, M: Mailbox + ?Sized>(
    mailbox: &mut M,
    exchange: Exchange<'_, 'r>,
    deadline: Instant,
    landed: &mut Landed<'r, '_>,
) -> Result<Option<u32>, ClusterError> {
    let tag = exchange.tag;
    for (to, bytes) in exchange.sends {
        let mut frame = mailbox.spare_buffer(DATA_HEADER + bytes.len());
        write_data_header(&mut frame, tag);
        frame.extend_from_slice(bytes);
        mailbox.send(to, frame)?;
    }
    for (index, (from, buffer)) in exchange.receives.into_iter().enumerate() {
        let Some(frame) = super::mailbox::receive_past_notices(mailbox, from, deadline)? else {
            return Ok(Some(from));
        };
        let payload = data_frame_payload(mailbox, from, tag, &frame, "a collective's data")?;
        if payload.len() != buffer.len() {
            return Err(ClusterError::Protocol {
                rank: from,
                what: format!(
                    "{} bytes of a collective's data where {} were due",
                    payload.len(),
                    buffer.len()
                ),
            });
        }
        buffer.copy_from_slice(payload);
        mailbox.recycle(frame);
        landed(index, buffer)?;
    }
    Ok(None)
}

/// The payload of `frame` from `from`, which must be the data frame
/// `tag`: an abort in its place is the loss it names (and the mailbox is
/// abandoned), anything else is out of step.
pub(super) fn data_frame_payload<'f, M: Mailbox + ?Sized>(
    mailbox: &mut M,
    from: u32,
    tag: u64,
    frame: &'f [u8],
    awaiting: &str,
) -> Result<&'f [u8], ClusterError> {
    if frame.first() != Some(&DATA_MARK) || frame.len() < DATA_HEADER {
        return Err(match decode(from, frame)? {
            Frame::Abort(abort) => {
                mailbox.abandon();
                ClusterError::RankLost {
                    rank: abort.rank,
                    hosts: abort.hosts,
                    reason: abort.reason,
                }
            }
            other => unexpected(from, &other, awaiting),
        });
    }
    let theirs = u64::from_le_bytes(frame[8..16].try_into().expect("eight bytes"));
    if theirs != tag {
        return Err(ClusterError::Protocol {
            rank: from,
            what: format!(
                "data frame {theirs:#x} where {awaiting} ({tag:#x}) was due: the ranks are out \
                 of step"
            ),
        });
    }
    Ok(&frame[DATA_HEADER..])
}
