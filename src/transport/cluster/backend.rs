//! [`ClusterBackend`]: the transport backend of one rank, exchanging each
//! tick's due messages with the other ranks in `⌈log₂ R⌉` rounds.
//!
//! The exchange is Bruck's index all-to-all: in round `k` every rank `r`
//! sends rank `r + 2ᵏ` (mod `R`) one frame with the messages it holds
//! whose owner is `d` with bit `k` of `(d − r) mod R` set, and receives
//! one from rank `r − 2ᵏ`. A message for rank `d` so travels the bits of
//! its offset, one hop each, and is at `d` after the last round: every
//! rank sends and receives `⌈log₂ R⌉` frames a tick, rank 0 no more than
//! the others (a star through rank 0 costs it `2(R − 1)`).
//!
//! Every wait is bounded. A rank that waited one bound on its peer tells
//! every rank it is stalled on it, and waits one more: a peer that sent
//! nothing, not even a stall notice of its own, is then named lost, and
//! every rank is told (an alarm each receives whichever rank it waits
//! on). A peer that is stalled itself is stuck behind the lost rank, so
//! its waiters wait for the name instead (at most two bounds more) rather
//! than naming the innocent peer.

use super::frame::{Frame, WireEnvelope, decode, encode, unexpected};
use super::layout::RankLayout;
use super::mailbox::{SharedMailbox, lock};
use super::protocol::{abort_all, send_frame};
use crate::topology::DeviceId;
use crate::transport::error::ClusterError;
use crate::transport::{Envelope, TransportBackend, TransportError};
use bevy_ecs::prelude::*;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The transport backend of one rank: owns its hosts' devices (and rank 0
/// the service); exchanges each tick's due messages with the other ranks
/// (module docs).
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

    /// The envelopes `from` sent at exchange `exchange`. After one bound
    /// without them this rank tells every other that it is stalled on
    /// `from`, and waits a second bound: a `from` that showed no sign of
    /// life by then (no frame, no stall notice of its own) is named lost.
    /// A `from` that is stalled itself waits behind the lost rank, whose
    /// name comes from the rank that finds it: that wait is bounded by two
    /// more bounds, after which `from` is named all the same.
    fn receive_messages(
        &self,
        from: u32,
        exchange: u64,
    ) -> Result<Vec<WireEnvelope>, ClusterError> {
        let me = self.layout.rank();
        let started = Instant::now();
        let (mut notified, mut alive) = (false, false);
        loop {
            let bounds = match (notified, alive) {
                (false, _) => 1,
                (true, false) => 2,
                (true, true) => 4,
            };
            let deadline = started + self.timeout * bounds;
            let bytes = lock(&self.mailbox)?.receive(from, deadline)?;
            let Some(bytes) = bytes else {
                if !notified {
                    notified = true;
                    let notice = encode(&Frame::Stalled {
                        rank: me,
                        waiting_on: from,
                    });
                    let mut mailbox = lock(&self.mailbox)?;
                    for to in (0..self.layout.ranks()).filter(|&r| r != me) {
                        let _ = mailbox.send_alarm(to, notice.clone());
                    }
                    continue;
                }
                lock(&self.mailbox)?.abandon();
                return Err(ClusterError::RankLost {
                    rank: from,
                    hosts: self.layout.describe_hosts(from),
                    reason: format!(
                        "no messages for exchange {exchange} from it within {:.1} s",
                        started.elapsed().as_secs_f64()
                    ),
                });
            };
            match decode(from, &bytes)? {
                Frame::Stalled { rank, .. } => alive |= rank == from,
                Frame::Abort(abort) => {
                    lock(&self.mailbox)?.abandon();
                    return Err(ClusterError::RankLost {
                        rank: abort.rank,
                        hosts: abort.hosts,
                        reason: abort.reason,
                    });
                }
                Frame::Messages {
                    exchange: theirs,
                    envelopes,
                } => {
                    if theirs != exchange {
                        return Err(out_of_step(from, theirs, exchange));
                    }
                    return Ok(envelopes);
                }
                other => return Err(unexpected(from, &other, "a tick's messages")),
            }
        }
    }

    fn exchange(&mut self, into: &mut Vec<Envelope>) -> Result<(), ClusterError> {
        let exchange = self.exchanges;
        self.exchanges += 1;
        let (me, ranks) = (self.layout.rank(), self.layout.ranks());
        let outgoing: Vec<Envelope> = std::mem::take(&mut self.outbox);
        // Each message held, with the rank it last came from.
        let mut held: Vec<(u32, WireEnvelope)> = outgoing
            .into_iter()
            .map(|e| (me, self.wire_of(e)))
            .collect();
        let offset = |wire: &WireEnvelope| (self.layout.owner(wire.to) + ranks - me) % ranks;
        let mut step = 1u32;
        while step < ranks {
            let (to, from) = ((me + step) % ranks, (me + ranks - step) % ranks);
            let (going, staying): (Vec<_>, Vec<_>) =
                held.into_iter().partition(|(_, w)| offset(w) & step != 0);
            let frame = Frame::Messages {
                exchange,
                envelopes: going.into_iter().map(|(_, w)| w).collect(),
            };
            send_frame(&self.mailbox, to, &frame)?;
            let came = self.receive_messages(from, exchange)?;
            held = staying;
            held.extend(came.into_iter().map(|w| (from, w)));
            step = step.saturating_mul(2);
        }
        for (from, wire) in held {
            if self.layout.owner(wire.to) != me {
                return Err(ClusterError::Protocol {
                    rank: from,
                    what: format!(
                        "a message for rank {} left at rank {me} after the exchange",
                        self.layout.owner(wire.to)
                    ),
                });
            }
            into.push(self.envelope_of(from, wire)?);
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
            // Every rank that names a lost rank tells the others (those
            // waiting on it hear the name rather than naming it).
            abort_all(&self.mailbox, &self.layout, &error);
            self.failure = Some(error.clone());
            TransportError::Cluster(error)
        })
    }
}
