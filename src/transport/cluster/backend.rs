//! [`ClusterBackend`]: the transport backend of one rank, exchanging each
//! tick's due messages through rank 0.

use super::SERVICE_RANK;
use super::frame::{Frame, WireEnvelope, unexpected};
use super::layout::RankLayout;
use super::mailbox::SharedMailbox;
use super::protocol::{abort_all, receive_frame, send_frame};
use crate::topology::DeviceId;
use crate::transport::error::ClusterError;
use crate::transport::{Envelope, TransportBackend, TransportError};
use bevy_ecs::prelude::*;
use std::collections::HashMap;
use std::time::Duration;

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
