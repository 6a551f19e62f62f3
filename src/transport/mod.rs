//! Messages over the pod's networks, in simulated time.
//!
//! Two planes, as on a real pod:
//!
//! - **Control** (heartbeats, barrier arrivals) goes from a device's host to
//!   the coordination service over the host network: it takes the pod's DCN
//!   latency plus the device's jitter, and does not use the ICI links (a chip
//!   whose links are all cut still reports in; a killed one does not).
//! - **Data** ([`send_data`]) travels over [`Link`] entities, routed by a
//!   shortest path over links that are up. Each hop is store-and-forward: the
//!   message waits for the link direction to be free, takes `bytes /
//!   bandwidth` to serialize, then the link's latency plus its jitter. Bytes
//!   and messages are charged to every link used, in the direction used.
//!
//! Delivery happens in [`StepSystems::Transport`]: every message due by the
//! current simulated time moves to the [`Inbox`], which later sets of the same
//! tick read (fault detection, barriers). The inbox is cleared at the start of
//! the next delivery, so nothing outlives its tick and a checkpoint taken at
//! the end of a tick holds no half-read messages. (bevy's `Messages` would
//! keep per-reader cursors in system state, outside the world.)
//!
//! **Which process moves the bytes** is behind [`TransportBackend`], held by
//! the [`Network`] resource. Systems only post to [`Transport`]; at delivery
//! the transport hands a message whose receiver this process does not own
//! to the backend, and takes in what the backend received for its own
//! devices. [`InProcess`] (the default) owns every device: one process runs
//! the whole pod. A multi-host backend (MPI, sockets) implements the same
//! four methods; nothing else changes.

pub mod cluster;
mod error;
#[cfg(feature = "mpi")]
pub mod mpi;

use crate::clock::{NextEvent, SimClock};
use crate::persist::{LoadContext, Persist, SnapshotError, StoreContext};
use crate::rng::{SimRng, stream};
use crate::schedule::{Step, StepSystems};
use crate::topology::{Device, DeviceId, DeviceIndex, Link, LinkTraffic};
use bevy_ecs::prelude::*;
use bevy_ecs::schedule::Schedules;
pub use error::{ClusterError, MergePartsError, TransportError};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

/// Whether a link carries traffic, and how much latency jitter it adds.
#[derive(Component, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkState {
    /// `false` once cut.
    pub up: bool,
    /// Extra latency per hop, uniform in `0..=jitter_ns`.
    pub jitter_ns: u64,
}

impl Default for LinkState {
    fn default() -> Self {
        LinkState {
            up: true,
            jitter_ns: 0,
        }
    }
}

/// When each direction of a link is next free (store-and-forward queueing).
#[derive(Component, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkQueue {
    /// `a → b` busy until, ns.
    pub busy_until_ab: u64,
    /// `b → a` busy until, ns.
    pub busy_until_ba: u64,
}

/// What a message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Payload {
    /// A heartbeat, stamped with the device's send time.
    Heartbeat {
        /// Simulated send time, ns.
        sent_ns: u64,
    },
    /// A device reached a barrier.
    BarrierArrival {
        /// The barrier's dense id (its index in the barrier registry).
        barrier: u64,
        /// The barrier generation the device arrived at.
        generation: u64,
    },
    /// Opaque data between two devices.
    Data {
        /// Bytes carried.
        bytes: u64,
    },
}

/// A message in flight or delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// Delivery time, ns.
    pub deliver_at_ns: u64,
    /// The sender's own send count at sending: with the sender, it breaks
    /// ties so delivery order is deterministic, and it does not depend on
    /// which process sent what (each process numbers its own devices'
    /// messages, so a pod split over processes numbers them as one does).
    pub seq: u64,
    /// Sender.
    pub from: DeviceId,
    /// Receiver; `None` is the coordination service.
    pub to: Option<DeviceId>,
    /// Contents.
    pub payload: Payload,
    /// Send time, ns.
    pub sent_at_ns: u64,
    /// Link entities crossed, in order (data plane only).
    pub route: Vec<Entity>,
}

impl Ord for Envelope {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.deliver_at_ns, self.from, self.seq).cmp(&(other.deliver_at_ns, other.from, other.seq))
    }
}

impl PartialOrd for Envelope {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Messages in flight, ordered by delivery time.
#[derive(Resource, Debug, Default)]
pub struct Transport {
    in_flight: BinaryHeap<Reverse<Envelope>>,
    /// Each sender's next sequence number (absent: 0).
    next_seq: BTreeMap<DeviceId, u64>,
    /// Messages delivered since the pod started.
    pub delivered: u64,
    /// Data messages dropped because a link on their route was cut or the
    /// receiver was killed before delivery.
    pub dropped: u64,
    routes: Option<Adjacency>,
}

impl Transport {
    /// Messages not yet delivered.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The in-flight messages in delivery order (for snapshots and reports).
    pub fn in_flight_sorted(&self) -> Vec<Envelope> {
        let mut all: Vec<Envelope> = self.in_flight.iter().map(|r| r.0.clone()).collect();
        all.sort();
        all
    }

    /// Keeps only what the senders `keep` accepts sent: their messages in
    /// flight and their sequence numbers (a process of a split pod holds
    /// its own devices' sends).
    pub fn retain_senders(&mut self, keep: impl Fn(DeviceId) -> bool) {
        let in_flight = std::mem::take(&mut self.in_flight);
        self.in_flight = in_flight
            .into_iter()
            .filter(|message| keep(message.0.from))
            .collect();
        self.next_seq.retain(|&device, _| keep(device));
    }

    /// Zeroes the delivered and dropped counts (a split pod's counts are
    /// the sum of its processes': a restored whole world's stay with one).
    pub fn clear_counts(&mut self) {
        self.delivered = 0;
        self.dropped = 0;
    }

    /// Forgets the cached routes; call after a link changes state.
    pub fn invalidate_routes(&mut self) {
        self.routes = None;
    }

    /// The sequence number `from`'s next message gets.
    fn peek_seq(&self, from: DeviceId) -> u64 {
        self.next_seq.get(&from).copied().unwrap_or(0)
    }

    fn push(&mut self, mut envelope: Envelope) {
        let next = self.next_seq.entry(envelope.from).or_insert(0);
        envelope.seq = *next;
        *next += 1;
        self.in_flight.push(Reverse(envelope));
    }

    /// Queues a message another process sent, keeping its send order.
    fn push_received(&mut self, envelope: Envelope) {
        self.in_flight.push(Reverse(envelope));
    }

    /// Sends a control message to the coordination service.
    pub fn send_control(
        &mut self,
        from: DeviceId,
        payload: Payload,
        sent_at_ns: u64,
        latency_ns: u64,
    ) {
        self.push(Envelope {
            deliver_at_ns: sent_at_ns + latency_ns,
            seq: 0,
            from,
            to: None,
            payload,
            sent_at_ns,
            route: Vec::new(),
        });
    }
}

/// Moves messages between the processes that together run a pod. Each
/// process owns some devices (and one owns the coordination service); the
/// transport delivers a message locally when this process owns its
/// receiver and hands it to [`TransportBackend::send`] otherwise.
///
/// Contract, for determinism: `receive` returns the messages sent to this
/// process in an order that does not depend on timing (e.g. by sender, then
/// send order); a message received after its delivery time is delivered in
/// the tick it arrives, never dropped.
pub trait TransportBackend: Send + Sync + std::fmt::Debug + 'static {
    /// A short name for reports.
    fn name(&self) -> &str;
    /// Whether this process delivers messages for `to` (`None`: the
    /// coordination service).
    fn owns(&self, to: Option<DeviceId>) -> bool;
    /// Takes a due message for a receiver another process owns.
    fn send(&mut self, envelope: Envelope);
    /// Appends the messages other processes sent to this one since the
    /// last call. Called once per tick by every process, after every due
    /// message went to [`TransportBackend::send`]: a backend may exchange
    /// with the other processes here. An error (a lost process) is kept by
    /// the [`Network`] and ends the run.
    fn receive(&mut self, into: &mut Vec<Envelope>) -> Result<(), TransportError>;
    /// Whether every tick's exchange is a no-op while nothing is due here,
    /// so idle ticks may be skipped (`Pod::run_skipping`). A backend that
    /// talks to other processes every tick must keep the default, `false`.
    fn is_single_process(&self) -> bool {
        false
    }
}

/// One process runs the whole pod: it owns every device and the service.
#[derive(Debug, Default, Clone, Copy)]
pub struct InProcess;

impl TransportBackend for InProcess {
    fn name(&self) -> &str {
        "in-process"
    }

    fn owns(&self, _: Option<DeviceId>) -> bool {
        true
    }

    fn is_single_process(&self) -> bool {
        true
    }

    fn send(&mut self, envelope: Envelope) {
        // Never called: every receiver is local. Deliver nothing rather
        // than panic if a caller does.
        drop(envelope);
    }

    fn receive(&mut self, _: &mut Vec<Envelope>) -> Result<(), TransportError> {
        Ok(())
    }
}

/// The backend that moves this process's messages to the others. Not part
/// of a snapshot: it is the machinery, not the world's state.
#[derive(Resource, Debug)]
pub struct Network {
    backend: Box<dyn TransportBackend>,
    /// Messages handed to the backend.
    pub sent: u64,
    /// Messages taken from the backend.
    pub received: u64,
    /// The first error of the backend (a lost process), if any.
    failure: Option<TransportError>,
}

impl Default for Network {
    fn default() -> Self {
        Network::new(Box::new(InProcess))
    }
}

impl Network {
    /// A network over `backend`.
    pub fn new(backend: Box<dyn TransportBackend>) -> Network {
        Network {
            backend,
            sent: 0,
            received: 0,
            failure: None,
        }
    }

    /// The first error the backend returned: once set, the pod's
    /// processes cannot go on together.
    pub fn failure(&self) -> Option<&TransportError> {
        self.failure.as_ref()
    }

    /// Records that the pod's processes cannot go on together (the first
    /// such error is kept), for work outside the transport that moves
    /// data between them (the sharded step's collectives).
    pub fn fail(&mut self, error: TransportError) {
        self.failure.get_or_insert(error);
    }

    /// The backend.
    pub fn backend(&self) -> &dyn TransportBackend {
        self.backend.as_ref()
    }
}

/// Messages delivered in the current tick.
#[derive(Resource, Debug, Default)]
pub struct Inbox {
    /// Delivered envelopes, in delivery order.
    pub messages: Vec<Envelope>,
}

/// The last data deliveries, for hosts to read (bounded).
#[derive(Resource, Debug, Default)]
pub struct DeliveryLog {
    /// Most recent data deliveries, oldest first.
    pub recent: VecDeque<Envelope>,
}

/// How many data deliveries [`DeliveryLog`] keeps.
pub const DELIVERY_LOG_CAPACITY: usize = 4096;

#[derive(Debug, Clone)]
struct Adjacency {
    neighbours: Vec<Vec<(u32, Entity)>>,
}

fn build_adjacency(world: &mut World) -> Adjacency {
    let n = world.resource::<DeviceIndex>().0.len();
    let mut neighbours = vec![Vec::new(); n];
    let mut ids = world.query::<&Device>();
    let mut links = world.query::<(Entity, &Link, &LinkState)>();
    let mut edges: Vec<(u32, u32, Entity)> = Vec::new();
    for (entity, link, state) in links.iter(world) {
        if !state.up {
            continue;
        }
        if let (Ok(a), Ok(b)) = (ids.get(world, link.a), ids.get(world, link.b)) {
            edges.push((a.id.0, b.id.0, entity));
        }
    }
    edges.sort_by_key(|&(a, b, _)| (a, b));
    for (a, b, entity) in edges {
        neighbours[a as usize].push((b, entity));
        neighbours[b as usize].push((a, entity));
    }
    Adjacency { neighbours }
}

/// The shortest route (fewest hops) from `from` to `to`, as link entities.
fn route(adjacency: &Adjacency, from: u32, to: u32) -> Option<Vec<(u32, u32, Entity)>> {
    let n = adjacency.neighbours.len();
    let mut previous: Vec<Option<(u32, Entity)>> = vec![None; n];
    let mut seen = vec![false; n];
    let mut queue = VecDeque::from([from]);
    seen[from as usize] = true;
    while let Some(v) = queue.pop_front() {
        if v == to {
            break;
        }
        for &(w, link) in &adjacency.neighbours[v as usize] {
            if !seen[w as usize] {
                seen[w as usize] = true;
                previous[w as usize] = Some((v, link));
                queue.push_back(w);
            }
        }
    }
    if !seen[to as usize] {
        return None;
    }
    let mut hops = Vec::new();
    let mut at = to;
    while at != from {
        let (prev, link) = previous[at as usize]?;
        hops.push((prev, at, link));
        at = prev;
    }
    hops.reverse();
    Some(hops)
}

/// Sends `bytes` from one device to another over the links, starting now.
/// Returns the simulated delivery time.
pub fn send_data(
    world: &mut World,
    from: DeviceId,
    to: DeviceId,
    bytes: u64,
) -> Result<u64, TransportError> {
    let devices = world.resource::<DeviceIndex>().0.len() as u32;
    for device in [from, to] {
        if device.0 >= devices {
            return Err(TransportError::UnknownDevice(device));
        }
    }
    if world.resource::<Transport>().routes.is_none() {
        let adjacency = build_adjacency(world);
        world.resource_mut::<Transport>().routes = Some(adjacency);
    }
    let hops = {
        let transport = world.resource::<Transport>();
        let adjacency = transport.routes.as_ref().expect("built above");
        route(adjacency, from.0, to.0).ok_or(TransportError::NoRoute { from, to })?
    };
    let now = world.resource::<SimClock>().now_ns;
    let index = world.resource::<DeviceIndex>().clone();
    let rng = *world.resource::<SimRng>();
    let seq = world.resource::<Transport>().peek_seq(from);
    let mut t = now;
    let mut used = Vec::with_capacity(hops.len());
    for (hop, (a, _, link_entity)) in hops.into_iter().enumerate() {
        let jitter_max = world
            .get::<LinkState>(link_entity)
            .map_or(0, |s| s.jitter_ns);
        let jitter = rng.up_to(
            jitter_max,
            stream::LINK_HOP,
            [u64::from(from.0) << 32 | hop as u64, seq],
        );
        let link = *world
            .get::<Link>(link_entity)
            .expect("routes hold live links");
        let forward = index.get(DeviceId(a)) == Some(link.a);
        let serialize_ns = (bytes as f64 / link.bytes_per_s * 1e9).ceil() as u64;
        let mut queue = world
            .get_mut::<LinkQueue>(link_entity)
            .expect("links have queues");
        let busy = if forward {
            &mut queue.busy_until_ab
        } else {
            &mut queue.busy_until_ba
        };
        let start = t.max(*busy);
        *busy = start + serialize_ns;
        t = start + serialize_ns + link.latency_ns + jitter;
        let mut traffic = world
            .get_mut::<LinkTraffic>(link_entity)
            .expect("links have traffic counters");
        if forward {
            traffic.bytes_ab += bytes;
        } else {
            traffic.bytes_ba += bytes;
        }
        traffic.messages += 1;
        used.push(link_entity);
    }
    world.resource_mut::<Transport>().push(Envelope {
        deliver_at_ns: t,
        seq: 0,
        from,
        to: Some(to),
        payload: Payload::Data { bytes },
        sent_at_ns: now,
        route: used,
    });
    Ok(t)
}

/// Moves every message due by now into the [`Inbox`]: local receivers'
/// from the queue, other processes' to the backend, and what the backend
/// received for this process. The inbox is in delivery order (time, then
/// sender, then the sender's send order), wherever a message came from.
pub fn deliver_messages(
    clock: Res<SimClock>,
    mut transport: ResMut<Transport>,
    mut network: ResMut<Network>,
    mut inbox: ResMut<Inbox>,
    mut log: ResMut<DeliveryLog>,
    links: Query<&LinkState>,
) {
    inbox.messages.clear();
    let now = clock.now_ns;
    let mut remote = false;
    while transport
        .in_flight
        .peek()
        .is_some_and(|next| next.0.deliver_at_ns <= now)
    {
        let Reverse(envelope) = transport.in_flight.pop().expect("peeked");
        if !envelope.route.is_empty() {
            let intact = envelope
                .route
                .iter()
                .all(|&link| links.get(link).is_ok_and(|state| state.up));
            if !intact {
                transport.dropped += 1;
                continue;
            }
        }
        if !network.backend.owns(envelope.to) {
            network.backend.send(envelope);
            network.sent += 1;
            continue;
        }
        inbox.messages.push(envelope);
    }
    let mut received = Vec::new();
    if let Err(error) = network.backend.receive(&mut received)
        && network.failure.is_none()
    {
        network.failure = Some(error);
    }
    network.received += received.len() as u64;
    for envelope in received {
        remote = true;
        if envelope.deliver_at_ns <= now {
            inbox.messages.push(envelope);
        } else {
            transport.push_received(envelope);
        }
    }
    if remote {
        inbox.messages.sort();
    }
    for envelope in &inbox.messages {
        if !envelope.route.is_empty() {
            if log.recent.len() == DELIVERY_LOG_CAPACITY {
                log.recent.pop_front();
            }
            log.recent.push_back(envelope.clone());
        }
    }
    transport.delivered += inbox.messages.len() as u64;
}

/// Installs the transport: resources, link state on every link, and
/// [`deliver_messages`] in [`StepSystems::Transport`].
pub fn install(world: &mut World) {
    world.init_resource::<Transport>();
    world.init_resource::<Network>();
    world.init_resource::<Inbox>();
    world.init_resource::<DeliveryLog>();
    let links: Vec<Entity> = world
        .query_filtered::<Entity, With<Link>>()
        .iter(world)
        .collect();
    for link in links {
        world
            .entity_mut(link)
            .insert((LinkState::default(), LinkQueue::default()));
    }
    world
        .resource_mut::<Schedules>()
        .add_systems(Step, deliver_messages.in_set(StepSystems::Transport));
}

/// An [`Envelope`] with its route as dense entity ids, for snapshots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredEnvelope {
    deliver_at_ns: u64,
    seq: u64,
    from: DeviceId,
    to: Option<DeviceId>,
    payload: Payload,
    sent_at_ns: u64,
    route: Vec<u32>,
}

impl Persist for Envelope {
    type Stored = StoredEnvelope;

    fn store(&self, ctx: &StoreContext) -> Result<StoredEnvelope, SnapshotError> {
        Ok(StoredEnvelope {
            deliver_at_ns: self.deliver_at_ns,
            seq: self.seq,
            from: self.from,
            to: self.to,
            payload: self.payload,
            sent_at_ns: self.sent_at_ns,
            route: self
                .route
                .iter()
                .map(|&link| ctx.dense(link, "Envelope.route"))
                .collect::<Result<_, _>>()?,
        })
    }

    fn load(stored: StoredEnvelope, ctx: &LoadContext) -> Result<Envelope, SnapshotError> {
        Ok(Envelope {
            deliver_at_ns: stored.deliver_at_ns,
            seq: stored.seq,
            from: stored.from,
            to: stored.to,
            payload: stored.payload,
            sent_at_ns: stored.sent_at_ns,
            route: stored
                .route
                .into_iter()
                .map(|dense| ctx.entity(dense, "Envelope.route"))
                .collect::<Result<_, _>>()?,
        })
    }
}

fn store_all(
    envelopes: &[Envelope],
    ctx: &StoreContext,
) -> Result<Vec<StoredEnvelope>, SnapshotError> {
    envelopes.iter().map(|e| e.store(ctx)).collect()
}

fn load_all(
    stored: Vec<StoredEnvelope>,
    ctx: &LoadContext,
) -> Result<Vec<Envelope>, SnapshotError> {
    stored.into_iter().map(|s| Envelope::load(s, ctx)).collect()
}

/// [`Transport`]'s persistent state: in-flight messages in delivery order
/// and the counters. Cached routes are rebuilt on demand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredTransport {
    in_flight: Vec<StoredEnvelope>,
    /// Senders' next sequence numbers, by device id (those that sent).
    next_seq: Vec<(DeviceId, u64)>,
    delivered: u64,
    dropped: u64,
}

impl Persist for Transport {
    type Stored = StoredTransport;

    fn store(&self, ctx: &StoreContext) -> Result<StoredTransport, SnapshotError> {
        Ok(StoredTransport {
            in_flight: store_all(&self.in_flight_sorted(), ctx)?,
            next_seq: self.next_seq.iter().map(|(&d, &n)| (d, n)).collect(),
            delivered: self.delivered,
            dropped: self.dropped,
        })
    }

    fn load(stored: StoredTransport, ctx: &LoadContext) -> Result<Transport, SnapshotError> {
        Ok(Transport {
            in_flight: load_all(stored.in_flight, ctx)?
                .into_iter()
                .map(Reverse)
                .collect(),
            next_seq: stored.next_seq.into_iter().collect(),
            delivered: stored.delivered,
            dropped: stored.dropped,
            routes: None,
        })
    }
}

impl Persist for Inbox {
    type Stored = Vec<StoredEnvelope>;

    fn store(&self, ctx: &StoreContext) -> Result<Self::Stored, SnapshotError> {
        store_all(&self.messages, ctx)
    }

    fn load(stored: Self::Stored, ctx: &LoadContext) -> Result<Inbox, SnapshotError> {
        Ok(Inbox {
            messages: load_all(stored, ctx)?,
        })
    }
}

impl Persist for DeliveryLog {
    type Stored = Vec<StoredEnvelope>;

    fn store(&self, ctx: &StoreContext) -> Result<Self::Stored, SnapshotError> {
        self.recent.iter().map(|e| e.store(ctx)).collect()
    }

    fn load(stored: Self::Stored, ctx: &LoadContext) -> Result<DeliveryLog, SnapshotError> {
        Ok(DeliveryLog {
            recent: load_all(stored, ctx)?.into(),
        })
    }
}

impl StoredEnvelope {
    /// Delivery order: time, sender, the sender's sequence.
    fn order(&self) -> (u64, DeviceId, u64) {
        (self.deliver_at_ns, self.from, self.seq)
    }
}

/// The envelopes of several processes' parts of one list (an inbox, a
/// delivery log) as one process holds it: all of them in delivery order,
/// the newest `keep` if it is bounded.
pub fn merge_envelope_parts(
    parts: Vec<Vec<StoredEnvelope>>,
    keep: Option<usize>,
) -> Vec<StoredEnvelope> {
    let mut all: Vec<StoredEnvelope> = parts.into_iter().flatten().collect();
    all.sort_by_key(StoredEnvelope::order);
    if let Some(keep) = keep
        && all.len() > keep
    {
        all.drain(..all.len() - keep);
    }
    all
}

/// The transport of a pod split over processes as one process holds it:
/// every message in flight (each process holds those its devices sent),
/// every sender's sequence (each sender is one process's) and the counts
/// summed. A sender two parts claim is an error naming it.
pub fn merge_transport_parts(
    parts: Vec<StoredTransport>,
) -> Result<StoredTransport, MergePartsError> {
    let mut next_seq: BTreeMap<DeviceId, u64> = BTreeMap::new();
    let mut in_flight = Vec::new();
    let (mut delivered, mut dropped) = (0, 0);
    for (part, stored) in parts.into_iter().enumerate() {
        for (device, seq) in stored.next_seq {
            if next_seq.insert(device, seq).is_some() {
                return Err(MergePartsError::SenderInTwoParts { device, part });
            }
        }
        in_flight.push(stored.in_flight);
        delivered += stored.delivered;
        dropped += stored.dropped;
    }
    Ok(StoredTransport {
        in_flight: merge_envelope_parts(in_flight, None),
        next_seq: next_seq.into_iter().collect(),
        delivered,
        dropped,
    })
}

/// The earliest time [`deliver_messages`] changes the world: the next
/// message's delivery time. Unknown while the inbox holds the last tick's
/// messages (the next tick clears it) or when the backend exchanges with
/// other processes every tick.
pub fn next_event(world: &World) -> NextEvent {
    let single = world
        .get_resource::<Network>()
        .is_some_and(|n| n.backend.is_single_process());
    let inbox_empty = world
        .get_resource::<Inbox>()
        .is_some_and(|i| i.messages.is_empty());
    match world.get_resource::<Transport>() {
        Some(transport) if single && inbox_empty => {
            NextEvent::at(transport.in_flight.peek().map(|next| next.0.deliver_at_ns))
        }
        _ => NextEvent::Unknown,
    }
}
