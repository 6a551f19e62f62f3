//! The model of a sharded step's time.
//!
//! Per bucket `b`, three stages:
//!
//! * **reduce-scatter**, in rounds (or one ring pass; on a multislice pod,
//!   then one DCN pass across slices): in each round a pass on every
//!   torus axis at once, on disjoint links, the round lasting its slowest
//!   pass: the collective's own transfer schedule ([`Traffic::timeline`])
//!   on the pod's links, alpha-beta per link (`latency + bytes /
//!   bandwidth`);
//! * **update**: the fused kernel on each device's shard, which reads
//!   params, grads and every state slot and writes params and the slots,
//!   `(3 + 2·slots) · shard_len · element_bytes` bytes at the generation's
//!   HBM bandwidth (`hardware.rs`);
//! * **all-gather** of the new parameters, the reduce-scatter's rounds in
//!   reverse;
//! * with redundant state, **replicate_state**: each device sends its new
//!   state shards to its ring successor (one message, routed).
//!
//! Buckets overlap as XLA's latency-hiding scheduler overlaps them: one
//! communication stream (the links are shared by both collectives) runs
//! `RS₀, RS₁, AG₀, RS₂, AG₁, …, AG_{B−1}`, each as soon as the stream is
//! free and (for `AGᵦ`) the update of bucket `b` is done (within a
//! collective, a round's passes start together, each its own span, and the
//! stream is free when the slowest ends); the compute
//! stream runs `U₀, U₁, …`, each once its reduce-scatter has arrived.
//! Exposed communication is the step time minus the update time. The
//! torus is symmetric, so every device has the same spans.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::collectives::{DCN_AXIS, LinkModel, PhaseKind, Traffic, pass_name};

/// A phase of a sharded step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum StepPhase {
    /// Before any work: a participant was lost by the time the step was
    /// to start (at the previous step's end, or during a wait).
    Launch,
    /// Reduce-scatter of the gradients along one axis (ring: axis 0).
    ReduceScatter {
        /// Torus axis.
        axis: u32,
    },
    /// The fused optimizer update on each device's shard.
    Update,
    /// All-gather of the new parameters along one axis.
    AllGather {
        /// Torus axis.
        axis: u32,
    },
    /// Each device sends its updated state shards to the peer that keeps
    /// their redundant copy.
    ReplicateState,
    /// Under fsdp, a bucket's gathered parameters in use (the forward or
    /// backward computation; of no length when the step has no model of
    /// its compute): a marker in the timeline, not a phase with a total.
    Use {
        /// The backward pass's use (the forward's otherwise).
        backward: bool,
    },
    /// Under fsdp, a bucket's gathered parameters freed after its use: an
    /// instant marker.
    Free {
        /// After the backward use (the forward's otherwise).
        backward: bool,
    },
}

impl StepPhase {
    /// `reduce_scatter.axis0`, `update`, `all_gather.axis2`; the
    /// cross-slice passes of a multislice pod (axis [`DCN_AXIS`]) are
    /// `reduce_scatter.dcn` and `all_gather.dcn`.
    pub fn key(&self) -> String {
        match self {
            StepPhase::Launch => "launch".into(),
            StepPhase::ReduceScatter { axis } => pass_name(PhaseKind::ReduceScatter, *axis),
            StepPhase::Update => "update".into(),
            StepPhase::AllGather { axis } => pass_name(PhaseKind::AllGather, *axis),
            StepPhase::ReplicateState => "replicate_state".into(),
            StepPhase::Use { backward } => format!("use.{}", pass_of(*backward)),
            StepPhase::Free { backward } => format!("free.{}", pass_of(*backward)),
        }
    }

    /// Whether this is a marker (a bucket's use or free), which no phase
    /// total counts and no failure is attributed to.
    pub fn is_marker(&self) -> bool {
        matches!(self, StepPhase::Use { .. } | StepPhase::Free { .. })
    }

    /// Whether this is a cross-slice pass over the DCN.
    pub fn is_dcn(&self) -> bool {
        matches!(
            self,
            StepPhase::ReduceScatter { axis: DCN_AXIS } | StepPhase::AllGather { axis: DCN_AXIS }
        )
    }
}

impl std::fmt::Display for StepPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepPhase::ReduceScatter { axis: DCN_AXIS } => {
                write!(f, "the reduce-scatter across slices (DCN)")
            }
            StepPhase::AllGather { axis: DCN_AXIS } => {
                write!(f, "the all-gather across slices (DCN)")
            }
            StepPhase::Launch => write!(f, "the launch"),
            StepPhase::ReduceScatter { axis } => write!(f, "the reduce-scatter along axis {axis}"),
            StepPhase::Update => write!(f, "the update"),
            StepPhase::AllGather { axis } => write!(f, "the all-gather along axis {axis}"),
            StepPhase::ReplicateState => write!(f, "the state replication to peers"),
            StepPhase::Use { backward } => write!(f, "a bucket's {} use", pass_of(*backward)),
            StepPhase::Free { backward } => {
                write!(f, "the free after a bucket's {} use", pass_of(*backward))
            }
        }
    }
}

fn pass_of(backward: bool) -> &'static str {
    if backward { "backward" } else { "forward" }
}

/// One phase of one bucket in time, seconds from the step's launch.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Span {
    /// The bucket.
    pub bucket: usize,
    /// The phase.
    pub phase: StepPhase,
    /// Start.
    pub start_seconds: f64,
    /// End.
    pub end_seconds: f64,
}

/// A step's modeled schedule.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StepTimeline {
    /// Every bucket's phases, in start order per stream.
    pub spans: Vec<Span>,
    /// Launch to the last all-gather's end.
    pub step_seconds: f64,
    /// Time the devices spend updating.
    pub update_seconds: f64,
    /// Per phase (`StepPhase::key`): seconds summed over buckets, plus
    /// `exposed_communication`.
    pub phases: BTreeMap<String, f64>,
}

impl StepTimeline {
    /// The phase in progress `seconds` after launch (the latest-starting
    /// span that covers it; the last phase once the step is over).
    pub fn phase_at(&self, seconds: f64) -> StepPhase {
        self.spans
            .iter()
            .filter(|s| !s.phase.is_marker())
            .filter(|s| s.start_seconds <= seconds && seconds <= s.end_seconds)
            .max_by(|a, b| a.start_seconds.total_cmp(&b.start_seconds))
            .or_else(|| self.spans.iter().rev().find(|s| !s.phase.is_marker()))
            .map_or(StepPhase::Update, |s| s.phase)
    }
}

/// One bucket's collectives placed in time: per round, its passes' phases
/// and durations (the passes of a round run at once), rounds in order.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketCost {
    /// Reduce-scatter rounds.
    pub reduce_scatter: Vec<Vec<(StepPhase, f64)>>,
    /// Update seconds.
    pub update: f64,
    /// All-gather rounds.
    pub all_gather: Vec<Vec<(StepPhase, f64)>>,
}

/// Durations of a collective's passes, by round ([`crate::collectives::Phase::order`])
/// in execution order and within a round by axis: each pass lasts from its
/// first transfer's start to its last transfer's end.
pub fn pass_durations(
    traffic: &Traffic,
    link: impl Fn(usize, usize) -> LinkModel,
) -> Vec<Vec<(StepPhase, f64)>> {
    // (order, kind, dim), phase, start, end; sorted as the timeline.
    type PassSpan = ((u32, PhaseKind, u32), StepPhase, f64, f64);
    let mut passes: Vec<PassSpan> = Vec::new();
    for t in traffic.timeline(link) {
        let p = t.transfer.phase;
        let phase = match p.kind {
            PhaseKind::AllGather => StepPhase::AllGather { axis: p.dim },
            PhaseKind::Broadcast => StepPhase::ReplicateState,
            _ => StepPhase::ReduceScatter { axis: p.dim },
        };
        let key = (p.order, p.kind, p.dim);
        match passes.iter_mut().rev().find(|q| q.0 == key) {
            Some(q) => {
                q.2 = q.2.min(t.start_seconds);
                q.3 = q.3.max(t.end_seconds);
            }
            None => passes.push((key, phase, t.start_seconds, t.end_seconds)),
        }
    }
    passes.sort_by_key(|q| q.0);
    let mut rounds: Vec<(u32, Vec<(StepPhase, f64)>)> = Vec::new();
    for ((order, _, _), phase, start, end) in passes {
        match rounds.last_mut() {
            Some((o, round)) if *o == order => round.push((phase, end - start)),
            _ => rounds.push((order, vec![(phase, end - start)])),
        }
    }
    rounds.into_iter().map(|(_, round)| round).collect()
}

/// The communication and compute streams of a step being placed.
struct Streams {
    spans: Vec<Span>,
    /// Seconds per phase: a handful of phases, searched linearly.
    totals: Vec<(StepPhase, f64)>,
    comm_free: f64,
    compute_free: f64,
    update_seconds: f64,
}

impl Streams {
    fn new(capacity: usize) -> Streams {
        Streams {
            spans: Vec::with_capacity(capacity),
            totals: Vec::new(),
            comm_free: 0.0,
            compute_free: 0.0,
            update_seconds: 0.0,
        }
    }

    fn push(&mut self, bucket: usize, phase: StepPhase, start: f64, end: f64) {
        match self.totals.iter_mut().find(|(p, _)| *p == phase) {
            Some((_, total)) => *total += end - start,
            None => self.totals.push((phase, end - start)),
        }
        self.spans.push(Span {
            bucket,
            phase,
            start_seconds: start,
            end_seconds: end,
        });
    }

    /// A marker at `at` (no total).
    fn mark(&mut self, bucket: usize, phase: StepPhase, at: f64) {
        self.spans.push(Span {
            bucket,
            phase,
            start_seconds: at,
            end_seconds: at,
        });
    }

    /// `rounds` on the communication stream once it is free and `ready`
    /// has passed (a round's passes start together): the end.
    fn passes(&mut self, bucket: usize, rounds: &[Vec<(StepPhase, f64)>], ready: f64) -> f64 {
        let mut at = self.comm_free.max(ready);
        for round in rounds {
            let mut longest = 0.0f64;
            for &(phase, seconds) in round {
                self.push(bucket, phase, at, at + seconds);
                longest = longest.max(seconds);
            }
            at += longest;
        }
        self.comm_free = at;
        at
    }

    fn update(&mut self, bucket: usize, seconds: f64, ready: f64) -> f64 {
        let start = self.compute_free.max(ready);
        self.push(bucket, StepPhase::Update, start, start + seconds);
        self.compute_free = start + seconds;
        self.update_seconds += seconds;
        start + seconds
    }

    fn finish(self) -> StepTimeline {
        let step_seconds = self.comm_free.max(self.compute_free);
        let mut phases: BTreeMap<String, f64> =
            self.totals.iter().map(|(p, s)| (p.key(), *s)).collect();
        phases.insert(
            "exposed_communication".into(),
            (step_seconds - self.update_seconds).max(0.0),
        );
        StepTimeline {
            spans: self.spans,
            step_seconds,
            update_seconds: self.update_seconds,
            phases,
        }
    }
}

/// Places every bucket's stages on the two streams (module docs).
pub fn schedule(costs: &[&BucketCost]) -> StepTimeline {
    let b = costs.len();
    let mut streams = Streams::new(b * 8);
    // Communication order RS0, RS1, AG0, RS2, AG1, …; each update as soon
    // as its reduce-scatter is in.
    let mut update_end = vec![0.0f64; b];
    for k in 0..=b {
        if k < b {
            let rs_end = streams.passes(k, &costs[k].reduce_scatter, 0.0);
            update_end[k] = streams.update(k, costs[k].update, rs_end);
        }
        if k >= 1 {
            let j = k - 1;
            streams.passes(j, &costs[j].all_gather, update_end[j]);
        }
    }
    streams.finish()
}

/// One fsdp bucket's stages: the gather of its parameters (run before each
/// of its two uses), its gradient's collectives, its update and, with
/// redundant state, the copy after the update.
#[derive(Debug, Clone, PartialEq)]
pub struct FsdpBucketCost {
    /// One all-gather of the bucket's parameters, by round.
    pub gather: Vec<Vec<(StepPhase, f64)>>,
    /// The gradient's reduce-scatter, by round.
    pub gradient: Vec<Vec<(StepPhase, f64)>>,
    /// Update seconds.
    pub update: f64,
    /// The redundant copies after the update, by round.
    pub replicate: Vec<Vec<(StepPhase, f64)>>,
}

/// Places an fsdp step's stages on the two streams in the order FSDP runs
/// them (`cost_model::strategy`'s module docs, whose closed form this
/// is for the pod's charged links, with uses of no length): the `2B`
/// uses forward `0..B−1`, then backward `B−1..0`; gather `s` starts once
/// use `s − prefetch − 1` freed its bucket; a backward use's bucket is
/// reduce-scattered after it, and updated on the compute stream after the
/// next use (the last at the end).
pub fn schedule_fsdp(costs: &[&FsdpBucketCost], prefetch: usize) -> StepTimeline {
    let b = costs.len();
    let uses = 2 * b;
    let bucket_of = |s: usize| if s < b { s } else { uses - 1 - s };
    let window = prefetch.saturating_add(1);
    let mut streams = Streams::new(b * 12);
    let mut used = vec![0.0f64; uses];
    let mut gathered_end = vec![0.0f64; uses];
    for (s, end) in gathered_end.iter_mut().enumerate().take(window) {
        let k = bucket_of(s);
        *end = streams.passes(k, &costs[k].gather, 0.0);
    }
    let mut pending: Option<(usize, f64)> = None;
    for s in 0..uses {
        let k = bucket_of(s);
        // A use of no length: the compute stream reaches its gather's end.
        streams.compute_free = streams.compute_free.max(gathered_end[s]);
        used[s] = streams.compute_free;
        let backward = s >= b;
        streams.mark(k, StepPhase::Use { backward }, used[s]);
        streams.mark(k, StepPhase::Free { backward }, used[s]);
        if let Some((j, ready)) = pending.take() {
            let end = streams.update(j, costs[j].update, ready);
            streams.passes(j, &costs[j].replicate, end);
        }
        if s + window < uses {
            let g = bucket_of(s + window);
            gathered_end[s + window] = streams.passes(g, &costs[g].gather, used[s]).max(used[s]);
        }
        if s >= b {
            let in_at = streams.passes(k, &costs[k].gradient, used[s]);
            pending = Some((k, in_at));
        }
    }
    if let Some((j, ready)) = pending {
        let end = streams.update(j, costs[j].update, ready);
        streams.passes(j, &costs[j].replicate, end);
    }
    streams.finish()
}
