//! Traffic records and the alpha-beta time model.
//!
//! Every collective returns a [`Traffic`]: one [`Transfer`] per link
//! traversal, tagged with the [`Phase`] (kind, torus dimension, ring step) it
//! belongs to. The pod charges each record to the channel between `src` and
//! `dst`; those two devices are always physically adjacent. A transfer whose
//! logical route spans several links (a hop of a ring whose members are not
//! all neighbours, such as the closing hop of a snake ring over a mesh,
//! [`Traffic::routed_on`]) appears once per link, each record carrying the
//! route length in `hops`.
//!
//! Transfers of zero bytes (empty chunks when a buffer has fewer elements
//! than ranks) are not recorded.
//!
//! The time model is the classic alpha-beta (Hockney) model: a message of
//! `b` bytes over a route of `h` links takes `h·α + b/β` (cut-through
//! routing, so the bandwidth term is paid once). Within one ring step all
//! transfers run concurrently on distinct links (each direction of a link is
//! its own channel), so a step lasts as long as its slowest transfer; the
//! steps of a pass run one after another. The passes of one
//! [`Phase::order`] on different dimensions (a round of the torus
//! schedule, whose parts run on every axis at once) use disjoint links:
//! each progresses through its own steps from the order's start, and the
//! order ends when the last of them ends.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::CollectiveError;
use super::TorusShape;
use super::ring::broadcast_chunks;

/// What a transfer is part of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum PhaseKind {
    /// Reduce-scatter: partial sums travel around the ring.
    ReduceScatter,
    /// All-gather: reduced chunks travel around the ring.
    AllGather,
    /// Broadcast: chunks flow down the chain from the root.
    Broadcast,
    /// All-to-all: each member's chunks travel to their own destinations.
    AllToAll,
}

/// The step of a collective a transfer belongs to.
///
/// Phases order as the collective executes them: by `order` (the round of
/// the collective), then per pass (`kind`, `dim`) by `step`. Passes of one
/// order on different `dim`s run at once, each through its own steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Phase {
    /// The round of the collective this pass belongs to (0 for a single
    /// ring; a 3D torus all-reduce has rounds 0..6, each with a pass on
    /// every axis).
    pub order: u32,
    /// What the pass does.
    pub kind: PhaseKind,
    /// The torus dimension the ring is laid along (0 for a plain ring).
    pub dim: u32,
    /// The step within the pass, `0..n-1` for a ring of `n` ranks.
    pub step: u32,
}

/// Bytes moved from one device to an adjacent one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Transfer {
    /// Sending device (rank).
    pub src: usize,
    /// Receiving device (rank), adjacent to `src`.
    pub dst: usize,
    /// Payload bytes.
    pub bytes: u64,
    /// Number of links on the logical route this traversal belongs to
    /// (1 for a ring neighbour).
    pub hops: u32,
    /// When it happens.
    pub phase: Phase,
}

/// The traffic of one collective, in execution order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Traffic {
    /// One record per link traversal.
    pub transfers: Vec<Transfer>,
}

impl Traffic {
    /// Total bytes over all links.
    pub fn total_bytes(&self) -> u64 {
        self.transfers.iter().map(|t| t.bytes).sum()
    }

    /// Bytes per directed link `(src, dst)`.
    pub fn per_link(&self) -> BTreeMap<(usize, usize), u64> {
        let mut pairs: Vec<((usize, usize), u64)> = self
            .transfers
            .iter()
            .map(|t| ((t.src, t.dst), t.bytes))
            .collect();
        pairs.sort_unstable_by_key(|&(link, _)| link);
        let mut merged: Vec<((usize, usize), u64)> = Vec::new();
        for (link, bytes) in pairs {
            match merged.last_mut() {
                Some((last, total)) if *last == link => *total += bytes,
                _ => merged.push((link, bytes)),
            }
        }
        merged.into_iter().collect()
    }

    /// Bytes sent by each device (first hop of every route and every relay).
    pub fn sent_by(&self) -> BTreeMap<usize, u64> {
        let mut map = BTreeMap::new();
        for t in &self.transfers {
            *map.entry(t.src).or_insert(0) += t.bytes;
        }
        map
    }

    /// The same traffic with every transfer between non-adjacent devices of
    /// `shape` replaced by one record per link of its dimension-order route
    /// ([`TorusShape::path`]), each carrying the route length in `hops`.
    /// Use it for rings whose members are not all neighbours (an arbitrary
    /// rank order, or the closing hop of [`TorusShape::snake_ring`] on a
    /// mesh). Records already split into routes are kept.
    pub fn routed_on(&self, shape: &TorusShape) -> Traffic {
        let mut transfers = Vec::with_capacity(self.transfers.len());
        for t in &self.transfers {
            let path = if t.hops == 1 {
                shape.path(t.src, t.dst)
            } else {
                Vec::new()
            };
            if path.len() <= 1 {
                transfers.push(*t);
                continue;
            }
            let hops = u32::try_from(path.len()).unwrap_or(u32::MAX);
            transfers.extend(path.into_iter().map(|(src, dst)| Transfer {
                src,
                dst,
                hops,
                ..*t
            }));
        }
        Traffic { transfers }
    }

    /// Modeled duration with one model for every link: per order, the
    /// longest of its passes (each the sum over its steps of the slowest
    /// transfer in the step, `hops·α + bytes/β`), summed over orders.
    pub fn modeled_seconds(&self, model: &LinkModel) -> f64 {
        self.modeled_seconds_by_link(|_, _| *model)
    }

    /// Modeled duration with a model per directed link `(src, dst)` (ICI and
    /// DCN links differ, say). Each record costs `hops·α + bytes/β` of its
    /// own link, which is exact for single-link hops and for routes whose
    /// links share one model (a multi-link route only occurs along one
    /// torus dimension).
    pub fn modeled_seconds_by_link(&self, link: impl Fn(usize, usize) -> LinkModel) -> f64 {
        let time = |t: &Transfer| link(t.src, t.dst).message_seconds(t.bytes, t.hops);
        // The collectives record in phase order; a record built by hand may
        // not be, and is sorted first.
        if self.transfers.is_sorted_by_key(|t| t.phase) {
            longest_per_order(self.transfers.iter().map(|t| (t.phase, time(t))))
        } else {
            let mut timed: Vec<(Phase, f64)> =
                self.transfers.iter().map(|t| (t.phase, time(t))).collect();
            timed.sort_by_key(|&(phase, _)| phase);
            longest_per_order(timed.into_iter())
        }
    }
}

/// One pass of a collective (its transfers of one [`Phase::order`] and
/// dimension) in the alpha-beta model: what a report or a trace shows per
/// phase. Passes of one order run side by side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PassSummary {
    /// [`Phase::order`].
    pub order: u32,
    /// What the pass does.
    pub kind: PhaseKind,
    /// The torus dimension, or [`super::DCN_AXIS`] for the cross-slice pass.
    pub dim: u32,
    /// `reduce_scatter.axis0`, …, `reduce_scatter.dcn`, `all_gather.dcn`.
    pub name: String,
    /// Bytes over all links.
    pub bytes: u64,
    /// From the pass's first transfer's start to its last transfer's end.
    pub start_seconds: f64,
    /// Its end.
    pub end_seconds: f64,
}

impl PassSummary {
    /// Whether this is the cross-slice pass over the DCN fabric.
    pub fn is_dcn(&self) -> bool {
        self.dim == super::DCN_AXIS
    }

    /// Modeled duration.
    pub fn seconds(&self) -> f64 {
        self.end_seconds - self.start_seconds
    }
}

/// `reduce_scatter.axis0`, `all_gather.dcn`, `broadcast.axis0`.
pub fn pass_name(kind: PhaseKind, dim: u32) -> String {
    let kind = match kind {
        PhaseKind::ReduceScatter => "reduce_scatter",
        PhaseKind::AllGather => "all_gather",
        PhaseKind::Broadcast => "broadcast",
        PhaseKind::AllToAll => "all_to_all",
    };
    if dim == super::DCN_AXIS {
        format!("{kind}.dcn")
    } else {
        format!("{kind}.axis{dim}")
    }
}

impl Traffic {
    /// Every pass in order (by order, then dimension), with its bytes and
    /// its span on [`Traffic::timeline`] under `link`'s model.
    pub fn passes(&self, link: impl Fn(usize, usize) -> LinkModel) -> Vec<PassSummary> {
        let mut passes: Vec<PassSummary> = Vec::new();
        for t in self.timeline(link) {
            let phase = t.transfer.phase;
            match passes.last_mut() {
                Some(p) if (p.order, p.kind, p.dim) == (phase.order, phase.kind, phase.dim) => {
                    p.bytes += t.transfer.bytes;
                    p.start_seconds = p.start_seconds.min(t.start_seconds);
                    p.end_seconds = p.end_seconds.max(t.end_seconds);
                }
                _ => passes.push(PassSummary {
                    order: phase.order,
                    kind: phase.kind,
                    dim: phase.dim,
                    name: pass_name(phase.kind, phase.dim),
                    bytes: t.transfer.bytes,
                    start_seconds: t.start_seconds,
                    end_seconds: t.end_seconds,
                }),
            }
        }
        passes
    }
}

/// A transfer placed in time by the alpha-beta model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TimedTransfer {
    /// The transfer.
    pub transfer: Transfer,
    /// When its step starts, seconds from the start of the collective.
    pub start_seconds: f64,
    /// When it has fully arrived: `start + hops·α + bytes/β`.
    pub end_seconds: f64,
}

impl Traffic {
    /// Every transfer with its start and end under `link`'s model: a step
    /// of a pass starts when the pass's previous step's slowest transfer
    /// has arrived (the ring's data dependency), all transfers of a step
    /// start together, every pass of an order starts when the previous
    /// order has ended, and an order ends with its longest pass. The last
    /// end is [`Traffic::modeled_seconds_by_link`]. A pod can use it to let
    /// a collective progress over simulated ticks, or to draw it on a
    /// trace.
    pub fn timeline(&self, link: impl Fn(usize, usize) -> LinkModel) -> Vec<TimedTransfer> {
        let mut ordered: Vec<&Transfer> = self.transfers.iter().collect();
        // Stable: records of one phase keep their order.
        ordered.sort_by_key(|t| t.phase);
        let mut timeline = Vec::with_capacity(ordered.len());
        let mut clock = Clock::default();
        for t in ordered {
            let start = clock.step_start(t.phase);
            let end = start + link(t.src, t.dst).message_seconds(t.bytes, t.hops);
            clock.arrive(end);
            timeline.push(TimedTransfer {
                transfer: *t,
                start_seconds: start,
                end_seconds: end,
            });
        }
        timeline
    }
}

/// The schedule's clock over records sorted by phase: orders one after
/// another, the passes (`kind`, `dim`) of an order side by side, the steps
/// of a pass one after another.
#[derive(Default)]
struct Clock {
    phase: Option<Phase>,
    /// When the current order started.
    order_start: f64,
    /// The latest end so far (the current order's end once it is over).
    order_end: f64,
    /// The current pass's latest end.
    pass_end: f64,
    /// The current step's start.
    step_start: f64,
}

impl Clock {
    /// The start of `phase`'s step (phases come in sorted order).
    fn step_start(&mut self, phase: Phase) -> f64 {
        match self.phase {
            Some(p) if p == phase => {}
            Some(p) if (p.order, p.kind, p.dim) == (phase.order, phase.kind, phase.dim) => {
                self.step_start = self.pass_end;
            }
            Some(p) if p.order == phase.order => {
                self.step_start = self.order_start;
                self.pass_end = self.order_start;
            }
            _ => {
                self.order_start = self.order_end;
                self.step_start = self.order_start;
                self.pass_end = self.order_start;
            }
        }
        self.phase = Some(phase);
        self.step_start
    }

    fn arrive(&mut self, end: f64) {
        self.pass_end = self.pass_end.max(end);
        self.order_end = self.order_end.max(end);
    }
}

/// The end of the last order, over `(phase, seconds)` sorted by phase.
fn longest_per_order(timed: impl Iterator<Item = (Phase, f64)>) -> f64 {
    let mut clock = Clock::default();
    for (phase, seconds) in timed {
        let start = clock.step_start(phase);
        clock.arrive(start + seconds);
    }
    clock.order_end
}

/// Latency and bandwidth of one direction of a link.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinkModel {
    latency_seconds: f64,
    bandwidth_bytes_per_second: f64,
}

impl LinkModel {
    /// A link with latency α (seconds, ≥ 0) and bandwidth β per direction
    /// (bytes per second, > 0). Both must be finite.
    pub fn new(
        latency_seconds: f64,
        bandwidth_bytes_per_second: f64,
    ) -> Result<Self, CollectiveError> {
        let latency_ok = latency_seconds.is_finite() && latency_seconds >= 0.0;
        let bandwidth_ok =
            bandwidth_bytes_per_second.is_finite() && bandwidth_bytes_per_second > 0.0;
        if !(latency_ok && bandwidth_ok) {
            return Err(CollectiveError::InvalidLinkModel {
                latency_seconds,
                bandwidth_bytes_per_second,
            });
        }
        Ok(Self {
            latency_seconds,
            bandwidth_bytes_per_second,
        })
    }

    /// α, seconds.
    pub fn latency_seconds(&self) -> f64 {
        self.latency_seconds
    }

    /// β, bytes per second per direction.
    pub fn bandwidth_bytes_per_second(&self) -> f64 {
        self.bandwidth_bytes_per_second
    }

    /// `hops·α + bytes/β`.
    pub fn message_seconds(&self, bytes: u64, hops: u32) -> f64 {
        f64::from(hops) * self.latency_seconds + bytes as f64 / self.bandwidth_bytes_per_second
    }

    /// Closed form of a ring all-reduce of `len` elements of `elem_bytes`
    /// bytes over `n` ranks whose ring hops are all single links:
    /// `2(n−1)·(α + ⌈len/n⌉·elem_bytes/β)`; zero when nothing moves.
    pub fn ring_all_reduce_seconds(&self, n: usize, len: usize, elem_bytes: usize) -> f64 {
        self.ring_pass_seconds(n, len, elem_bytes) * 2.0
    }

    /// One ring pass (a reduce-scatter or an all-gather):
    /// `(n−1)·(α + ⌈len/n⌉·elem_bytes/β)`.
    pub fn ring_pass_seconds(&self, n: usize, len: usize, elem_bytes: usize) -> f64 {
        if n <= 1 || len == 0 {
            return 0.0;
        }
        let chunk_bytes = len.div_ceil(n) * elem_bytes;
        (n - 1) as f64 * self.message_seconds(chunk_bytes as u64, 1)
    }

    /// A chain broadcast over `n` ranks pipelined in `k` =
    /// [`broadcast_chunks`] chunks: the last chunk leaves the root at step
    /// `k−1` and needs `n−2` more, `(n−1)+(k−1)` steps of
    /// `α + ⌈len/k⌉·elem_bytes/β`. As `k` grows this approaches
    /// `bytes/β`, the bound nccl-tests' broadcast busbw is measured against.
    pub fn broadcast_seconds(&self, n: usize, len: usize, elem_bytes: usize) -> f64 {
        let chunks = broadcast_chunks(n, len, elem_bytes);
        if n <= 1 || chunks == 0 {
            return 0.0;
        }
        let chunk_bytes = len.div_ceil(chunks) * elem_bytes;
        (n - 1 + chunks - 1) as f64 * self.message_seconds(chunk_bytes as u64, 1)
    }
}
