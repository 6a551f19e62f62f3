//! The protocol every rank takes part in with rank 0: the start-up
//! handshake, broadcast (down a binomial tree), the final gather and
//! verdict, and the abort.

use super::SERVICE_RANK;
use super::frame::{ClusterAbort, Frame, decode, encode, unexpected};
use super::layout::RankLayout;
use super::mailbox::{SharedMailbox, lock};
use crate::transport::error::ClusterError;
use std::time::{Duration, Instant};

/// Sends `frame` to `to` through the shared mailbox.
pub(super) fn send_frame(
    mailbox: &SharedMailbox,
    to: u32,
    frame: &Frame,
) -> Result<(), ClusterError> {
    lock(mailbox)?.send(to, encode(frame))
}

/// The next frame from `from`, or [`ClusterError::RankLost`] after
/// `timeout` (naming `from` and its hosts, and what was awaited).
pub(super) fn receive_frame(
    mailbox: &SharedMailbox,
    layout: &RankLayout,
    from: u32,
    timeout: Duration,
    awaiting: &str,
) -> Result<Frame, ClusterError> {
    let deadline = Instant::now() + timeout;
    let mut mailbox = lock(mailbox)?;
    match super::mailbox::receive_past_notices(&mut **mailbox, from, deadline)? {
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

/// Tells every other rank but the lost one (best effort, as an alarm
/// each receives whichever rank it waits on) that the job stops.
pub(super) fn abort_all(mailbox: &SharedMailbox, layout: &RankLayout, error: &ClusterError) {
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
    let Ok(mut mailbox) = lock(mailbox) else {
        return;
    };
    for to in 0..layout.ranks() {
        if to != layout.rank() && to != rank {
            let _ = mailbox.send_alarm(to, encode(&frame));
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

/// Rank 0 sends every rank the same bytes (or why it has none); every
/// rank returns them (rank 0 its own). An `Err` from rank 0 is a
/// [`ClusterError::Coordinator`] on every rank.
///
/// The bytes go down a binomial tree rooted at rank 0, not a star: rank
/// `r` receives from `r` with its highest set bit cleared and passes them
/// on to `r + 2^j` for every `2^j > r` below `R`, so every rank sends and
/// receives at most `⌈log₂ R⌉` frames and the last rank has them after
/// `⌈log₂ R⌉` hops (rank 0 sent `R − 1` frames with the star). A rank
/// `d` hops down waits `(1 + d)` bounds for its parent, so a lost rank's
/// children name it before anyone below them gives up on a live parent;
/// the rank that names it sends the alarm on to every other rank
/// (the alarm every wait here listens for), and each of them returns the
/// same loss.
pub fn broadcast(
    mailbox: &SharedMailbox,
    layout: &RankLayout,
    bytes: Result<Vec<u8>, String>,
    timeout: Duration,
) -> Result<Vec<u8>, ClusterError> {
    let (rank, ranks) = (layout.rank(), layout.ranks());
    let frame = if layout.runs_service() {
        match &bytes {
            Ok(bytes) => Frame::Part(bytes.clone()),
            Err(reason) => Frame::Done(Err(reason.clone())),
        }
    } else {
        let parent = tree_parent(rank);
        let hops = rank.count_ones();
        match receive_frame(mailbox, layout, parent, timeout * (1 + hops), "broadcast") {
            Ok(frame) => frame,
            Err(error) => {
                abort_all(mailbox, layout, &error);
                return Err(error);
            }
        }
    };
    for child in tree_children(rank, ranks) {
        send_frame(mailbox, child, &frame)?;
    }
    match frame {
        Frame::Part(bytes) => Ok(bytes),
        Frame::Done(Err(reason)) => Err(ClusterError::Coordinator(reason)),
        other => Err(unexpected(tree_parent(rank), &other, "a broadcast")),
    }
}

/// The rank `rank` receives a broadcast from: `rank` with its highest set
/// bit cleared (rank 0 has none).
fn tree_parent(rank: u32) -> u32 {
    match rank {
        0 => 0,
        r => r & !(1 << (31 - r.leading_zeros())),
    }
}

/// The ranks `rank` passes a broadcast on to among `ranks`: `rank + 2^j`
/// for every power of two above `rank`.
fn tree_children(rank: u32, ranks: u32) -> impl Iterator<Item = u32> {
    let first = u64::from(rank + 1).next_power_of_two();
    std::iter::successors(Some(first), |step| Some(step * 2))
        .map(move |step| u64::from(rank) + step)
        .take_while(move |&child| child < u64::from(ranks))
        .map(|child| child as u32)
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

#[cfg(test)]
mod tree_tests {
    use super::{tree_children, tree_parent};

    /// Every rank but 0 has one parent, below it, whose children list it;
    /// no rank sends or waits more than `⌈log₂ R⌉` hops.
    #[test]
    fn the_broadcast_tree_reaches_every_rank_once() {
        for ranks in 1u32..=70 {
            let mut reached = vec![0u32; ranks as usize];
            for r in 0..ranks {
                for c in tree_children(r, ranks) {
                    assert!(c > r && c < ranks);
                    assert_eq!(tree_parent(c), r, "{c} of {ranks}");
                    reached[c as usize] += 1;
                }
            }
            assert!(reached[1..].iter().all(|&n| n == 1), "{ranks}: {reached:?}");
            let rounds = ranks.next_power_of_two().trailing_zeros();
            for r in 0..ranks {
                assert!(r.count_ones() <= rounds);
                assert!(tree_children(r, ranks).count() as u32 <= rounds);
            }
        }
        assert_eq!(tree_children(0, 8).collect::<Vec<_>>(), [1, 2, 4]);
        assert_eq!(tree_children(1, 8).collect::<Vec<_>>(), [3, 5]);
        assert_eq!(tree_children(2, 8).collect::<Vec<_>>(), [6]);
        assert_eq!(tree_children(4, 8).count(), 0);
        assert_eq!(tree_parent(6), 2);
    }
}
