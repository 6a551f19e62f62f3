//! The modeled step of a sharding strategy on a mesh, in closed form (no
//! data, no entities): each bucket's plan ([`crate::sharding::strategy::bucket_plan`])
//! timed pass by pass, placed on one communication stream and one compute
//! stream, with the strategy's HBM by kind.
//!
//! **The optimizer order** ([`StepOrder::Optimizer`]: a step on given
//! gradients, what real runs do). replicated, zero2: compute runs every
//! bucket's forward use, then every bucket's backward use (`use_seconds`
//! each), then the updates. Bucket `b`'s gradient collectives are ready at
//! the end of its backward use; communication runs `G₀, G₁, A₀, G₂, A₁, …`
//! (`G` the gradient collectives, `A` the all-gathers after the update),
//! each update once its gradient shard is in. With zero-length uses and the
//! default mesh the replicated step is
//! [`super::replicated::modeled_step_with_recovery`]'s, to the bit. fsdp runs
//! the pipelined order below either way.
//!
//! **The training order** ([`StepOrder::Training`], what `step_model`
//! uses): one pipelined order for every strategy. The step's `2B` uses run
//! in order: forward `0..B−1`, backward `B−1..0`. After each backward use,
//! its bucket's gradient collectives (reduce-scatter, and the reduction over
//! `data`) run behind the rest of the backward pass; its update runs on the
//! compute stream after the next use (so the backward pass is not held up
//! by a gradient in flight), the last one at the end. fsdp all-gathers a
//! bucket from the shards before each of its uses (gather `s` may start
//! once use `s − prefetch − 1` has freed its bucket, so at most
//! `prefetch + 1` gathered buckets are in flight). replicated and zero2 hold
//! the whole model, so they all-gather each bucket's new parameters into
//! every replica right after its update (after the next bucket's gradient
//! collectives on the stream), behind the rest of the backward pass: in
//! before the next forward needs them, as ZeRO's all-gather ahead of the
//! next forward; the last bucket's is the step's tail, as fsdp's first
//! gather is the next step's head. Per bucket the backward then moves the
//! same bytes under every strategy (fsdp's gather before the backward use,
//! the others' all-gather after the update), and fsdp moves a gather more
//! before each forward use, so on one mesh it is never the faster
//! (`tests/strategy_laws.rs`).
//!
//! Under [`DataReduction::AfterBackward`] (a caller's choice; real runs
//! overlap) each bucket's reduction over `data` waits for the end of the
//! backward pass, and its update for that reduction.
//!
//! Under the redundant policy each update is followed, on the
//! communication stream, by the state copy to the snake-ring successor
//! (`h·α + bytes/β`, `h` the longest route; under fsdp the parameter shard
//! goes with it).
//!
//! A real run places the same stages on the pod's charged links
//! (`timing::schedule`, and `timing::schedule_fsdp` in the fsdp order
//! above), and `tests/modeled.rs` holds the two equal for every strategy.
//!
//! The collectives' costs come from [`cost`], one place. Equal buckets
//! cost the same, and a model has at most two bucket lengths
//! ([`BucketRuns`]); the schedules jump over the runs of equal work once
//! they repeat (`steady_state`), so modeling a 10¹⁸-parameter
//! model costs what modeling a small one does.

use std::collections::BTreeMap;

use serde::Serialize;

use super::replicated::{PodGeometry, replication_routes};
use super::streams::{Streams, Work};
use crate::collectives::{DCN_AXIS, LinkModel, PhaseKind, TorusShape, pass_name};
use crate::ir::DType;
use crate::sharding::bucket_runs::BucketRuns;
use crate::sharding::error::ShardingError;
use crate::sharding::mesh::{Mesh, MeshAxisName, PhysicalAxis, Strategy};
use crate::sharding::model::{RecoveryPolicy, check_recovery_policy};
use crate::sharding::residency::MAX_PREFETCH;
use crate::sharding::strategy::{
    ModelSize, NotFitting, PlanStep, StrategyMemory, bucket_plan_with_experts,
};
use crate::topology::{LinkParams, Topology};

use crate::collectives::cost;

pub(super) use super::options::Uses;
pub use super::options::{DataReduction, Precision, STEADY_STEPS, StepOrder, StrategyOptions};

/// What a span of a bucket does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanKind {
    /// fsdp: the parameters all-gathered (forward or backward).
    Gather {
        /// For the backward use.
        backward: bool,
    },
    /// The bucket used (forward or backward).
    Use {
        /// The backward use.
        backward: bool,
    },
    /// fsdp: the gathered parameters freed (an instant).
    Free {
        /// After the backward use.
        backward: bool,
    },
    /// The gradient's reduce-scatter (and reduction over `data`).
    ReduceScatter,
    /// The gradient's reduction over `data`, after the backward pass
    /// ([`DataReduction::AfterBackward`]).
    DataReduction,
    /// The update of the device's shard.
    Update,
    /// The new parameters all-gathered (replicated, zero2).
    AllGather,
    /// The redundant state copy.
    ReplicateState,
    /// The compute between the forward and the backward pass (a model's
    /// logits and loss; bucket 0).
    Between,
}

/// One span of one bucket, seconds from the step's launch.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BucketSpan {
    /// The bucket.
    pub bucket: u32,
    /// What it does.
    pub kind: SpanKind,
    /// Start.
    pub start_seconds: f64,
    /// End.
    pub end_seconds: f64,
}

/// A byte count as JSON holds it: exact below 2⁶⁴, else the nearest
/// `f64` (a huge model's traffic per step can pass 2⁶⁴ bytes, which JSON
/// readers take as a float anyway).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct WideBytes(pub u128);

impl Serialize for WideBytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match u64::try_from(self.0) {
            Ok(bytes) => s.serialize_u64(bytes),
            Err(_) => s.serialize_f64(self.0 as f64),
        }
    }
}

/// `map`'s byte counts as [`WideBytes`].
pub fn wide_map(map: &BTreeMap<String, u128>) -> BTreeMap<&str, WideBytes> {
    map.iter()
        .map(|(k, &v)| (k.as_str(), WideBytes(v)))
        .collect()
}

fn serialize_wide<S: serde::Serializer>(bytes: &u128, s: S) -> Result<S::Ok, S::Error> {
    WideBytes(*bytes).serialize(s)
}

fn serialize_wide_map<S: serde::Serializer>(
    map: &BTreeMap<String, u128>,
    s: S,
) -> Result<S::Ok, S::Error> {
    wide_map(map).serialize(s)
}

/// An axis's share of a step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct AxisFigures {
    /// Seconds its passes last, summed.
    pub seconds: f64,
    /// Bytes over its links.
    #[serde(serialize_with = "serialize_wide")]
    pub link_bytes: u128,
}

/// A strategy's modeled step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StrategyStep {
    /// The strategy.
    pub strategy: Strategy,
    /// The mesh.
    pub mesh: Mesh,
    /// fsdp's prefetch.
    pub prefetch: usize,
    /// The recovery policy.
    pub recovery: RecoveryPolicy,
    /// Buckets.
    pub buckets: usize,
    /// Devices.
    pub devices: usize,
    /// Launch to the last span's end.
    pub step_seconds: f64,
    /// Time the devices spend updating.
    pub update_seconds: f64,
    /// Parameters each device updates per step (its shard of every bucket).
    pub update_elements: u64,
    /// Time the devices spend using buckets.
    pub use_seconds: f64,
    /// Per phase (`reduce_scatter.axis0`, `all_gather.dcn`, `update`,
    /// `replicate_state`, …): seconds summed over buckets, plus
    /// `exposed_communication` (the step minus the compute).
    pub phases: BTreeMap<String, f64>,
    /// Per phase: bytes over the links.
    #[serde(serialize_with = "serialize_wide_map")]
    pub phase_bytes: BTreeMap<String, u128>,
    /// Per physical axis (`axis0`, `dcn`; `snake_ring` for the state
    /// copies).
    pub axes: BTreeMap<String, AxisFigures>,
    /// Bytes over every link.
    #[serde(serialize_with = "serialize_wide")]
    pub link_bytes: u128,
    /// HBM per device by kind.
    pub memory: StrategyMemory,
    /// HBM per device in all.
    pub hbm_bytes_per_device: u64,
    /// The plan of the largest bucket.
    pub plan: Vec<PlanStep>,
    /// Every bucket's spans, if asked for.
    pub spans: Vec<BucketSpan>,
    /// Iterations of the schedule simulated one by one (the rest of each
    /// run of equal buckets was extrapolated from its steady state): what
    /// modeling cost, whatever the model's size.
    pub schedule_iterations: u64,
}

impl StrategyStep {
    /// Whether a device of `hbm_bytes` holds the step (what does not fit,
    /// by how much, if not).
    pub fn fits(&self, hbm_bytes: u64) -> Result<(), NotFitting> {
        self.memory.fits(hbm_bytes)
    }

    /// Exposed communication, seconds.
    pub fn exposed_communication(&self) -> f64 {
        self.phases
            .get("exposed_communication")
            .copied()
            .unwrap_or(0.0)
    }
}

/// One timed pass of a stage: its phase and axis (indices into the
/// step's key tables), seconds and link bytes (over the whole pod).
/// Consecutive passes of one `group` (a round of the collective's
/// schedule) run at once on disjoint links.
#[derive(Debug, Clone, Copy)]
pub(super) struct Round {
    pub(super) group: u64,
    pub(super) phase: usize,
    pub(super) axis: usize,
    pub(super) seconds: f64,
    pub(super) bytes: u64,
}

/// A bucket length's stages.
#[derive(Debug, Clone, Default)]
pub(super) struct LengthCost {
    /// fsdp: a gather of the bucket's parameters.
    pub(super) gather: Vec<Round>,
    /// The gradient's collectives, before the update.
    pub(super) gradient: Vec<Round>,
    /// Its reduction over `data` when that waits for the backward pass.
    pub(super) data_gradient: Vec<Round>,
    /// The new parameters' all-gathers (replicated, zero2): over `data`
    /// then over `fsdp`.
    pub(super) all_gather: Vec<Round>,
    /// Of them, the all-gather over `data` (replicated on a mesh with a
    /// data axis: its state is sharded across it).
    pub(super) all_gather_data: Vec<Round>,
    /// Of them, the all-gather over `fsdp`.
    pub(super) all_gather_fsdp: Vec<Round>,
    /// The redundant state copy.
    pub(super) replicate: Vec<Round>,
    pub(super) update: f64,
    /// Elements each device updates.
    pub(super) shard: usize,
}

/// Interned keys, so the schedule adds into vectors.
#[derive(Default)]
pub(super) struct Keys(pub(super) Vec<String>);

impl Keys {
    fn id(&mut self, key: String) -> usize {
        self.0.iter().position(|k| *k == key).unwrap_or_else(|| {
            self.0.push(key);
            self.0.len() - 1
        })
    }
}

/// The pod's figures a bucket's costs need.
pub(super) struct Costing<'a> {
    pub(super) mesh: &'a Mesh,
    pub(super) shape: TorusShape,
    pub(super) ici: LinkModel,
    pub(super) rail: Option<LinkModel>,
    pub(super) slices: usize,
    pub(super) chips: usize,
    pub(super) chips_per_host: usize,
    /// Bytes per element of each kind: the compute type's (fsdp's
    /// gathers, the gradients' reduce-scatter over fsdp), the parameters',
    /// the gradients' (their reduction over data) and the state's.
    pub(super) precision: Precision,
    pub(super) slots: usize,
    pub(super) redundant: bool,
    pub(super) defer_data: bool,
    pub(super) replication_hops: u32,
    pub(super) replication_links: u64,
    pub(super) hbm_per_s: f64,
    pub(super) phases: Keys,
    pub(super) axes: Keys,
    /// [`Costing::pass_ids`]' cache: (kind, physical axis) to (phase, axis).
    pub(super) pass_keys: Vec<((PhaseKind, u32), (usize, usize))>,
    /// The next round's group number.
    pub(super) next_group: u64,
}

impl<'a> Costing<'a> {
    /// The figures of `topology` and `options` a bucket's costs need, on
    /// the pod laid out as `(shape, rail, chips, slices)`, for elements of
    /// `elem` bytes, `slots` state slots and whether the redundant copies
    /// are kept.
    pub(super) fn new(
        topology: &Topology,
        options: &'a StrategyOptions,
        (shape, rail, chips, slices): (TorusShape, Option<LinkParams>, usize, usize),
        (store, slots, redundant): (usize, usize, bool),
    ) -> Result<Costing<'a>, ShardingError> {
        let rail = rail
            .map(|p| LinkModel::new(p.latency_ns as f64 * 1e-9, p.bytes_per_s))
            .transpose()
            .map_err(|e| devices_error(e.to_string()))?;
        let (replication_hops, replication_links) = if redundant {
            let (hops, links) = replication_routes(&shape);
            (hops, links * slices as u64)
        } else {
            (0, 0)
        };
        let ici = LinkModel::new(
            topology.ici.latency_ns as f64 * 1e-9,
            topology.ici.bytes_per_s,
        )
        .map_err(|e| devices_error(e.to_string()))?;
        Ok(Costing {
            mesh: &options.mesh,
            shape,
            ici,
            rail,
            slices,
            chips,
            chips_per_host: topology.chips_per_host() as usize,
            precision: options
                .precision
                .unwrap_or(Precision::uniform(store, slots)),
            slots,
            redundant,
            defer_data: options.data_reduction == DataReduction::AfterBackward,
            replication_hops,
            replication_links,
            hbm_per_s: topology.generation.spec().hbm_bytes_per_s,
            phases: Keys::default(),
            axes: Keys::default(),
            pass_keys: Vec::new(),
            next_group: 0,
        })
    }
}

impl Costing<'_> {
    /// The rounds of a collective of `kind` over mesh axis `axis`,
    /// `len` elements per device as [`crate::sharding::strategy::PlannedCollective`]
    /// counts them, each of `elem` bytes.
    pub(super) fn collective(
        &mut self,
        kind: crate::sharding::strategy::CollectiveKind,
        axis: MeshAxisName,
        (len, elem): (usize, usize),
    ) -> Vec<Round> {
        use crate::sharding::strategy::CollectiveKind as K;
        let torus = self.mesh.torus_axes(axis);
        let dcn = self.mesh.crosses_slices(axis);
        let torus_extent: usize = torus.iter().map(|&d| self.shape.dims()[d]).product();
        // Each of the collective's rounds is one group of concurrent passes;
        // a DCN exchange is a group of its own.
        let mut groups: Vec<Vec<cost::PassCost>> = Vec::new();
        let ring = |k: PhaseKind, s: &Self| match k {
            PhaseKind::AllGather => cost::all_gather_cost(&s.shape, &torus, len, elem, &s.ici),
            _ => cost::reduce_scatter_cost(&s.shape, &torus, len, elem, &s.ici),
        };
        let hosts_per_slice = self.chips / self.chips_per_host.max(1);
        // The slices along the axis: all of them, or its factor when the
        // mesh shares them among axes.
        let slices = self.mesh.size(axis) / torus_extent.max(1);
        let exchange = |k: PhaseKind, s: &Self| {
            s.rail.map(|rail| {
                vec![cost::dcn_exchange_cost(
                    len / torus_extent.max(1),
                    slices,
                    hosts_per_slice,
                    s.chips_per_host,
                    elem,
                    &cost::rail_for(&rail, s.slices, slices - 1),
                    k,
                )]
            })
        };
        let reduce = |groups: &mut Vec<Vec<cost::PassCost>>| {
            groups.extend(ring(PhaseKind::ReduceScatter, self).rounds);
            if dcn {
                groups.extend(exchange(PhaseKind::ReduceScatter, self));
            }
        };
        let gather = |groups: &mut Vec<Vec<cost::PassCost>>, s: &Self| {
            if dcn {
                groups.extend(exchange(PhaseKind::AllGather, s));
            }
            groups.extend(ring(PhaseKind::AllGather, s).rounds);
        };
        match kind {
            K::ReduceScatter => reduce(&mut groups),
            K::AllGather => gather(&mut groups, self),
            K::AllReduce if !dcn => groups
                .extend(cost::all_reduce_cost(&self.shape, &torus, len, elem, &self.ici).rounds),
            K::AllReduce => {
                reduce(&mut groups);
                gather(&mut groups, self);
            }
        }
        let mut rounds = Vec::new();
        for passes in groups {
            let group = self.next_group;
            self.next_group += 1;
            for p in passes.into_iter().filter(|p| p.seconds > 0.0) {
                let bytes = if p.axis == DCN_AXIS {
                    p.link_bytes
                } else {
                    p.link_bytes * self.slices as u64
                };
                let (phase, axis) = self.pass_ids(p.kind, p.axis);
                rounds.push(Round {
                    group,
                    phase,
                    axis,
                    seconds: p.seconds,
                    bytes,
                });
            }
        }
        rounds
    }

    /// The interned phase and axis keys of a pass of `kind` on physical
    /// axis `dim` (`all_gather.axis0`, `axis0`), named once per step: a
    /// step costs thousands of passes over a handful of keys.
    fn pass_ids(&mut self, kind: PhaseKind, dim: u32) -> (usize, usize) {
        if let Some(&(_, ids)) = self.pass_keys.iter().find(|(k, _)| *k == (kind, dim)) {
            return ids;
        }
        let axis_key = if dim == DCN_AXIS {
            PhysicalAxis::Slices.key()
        } else {
            PhysicalAxis::Torus(dim as usize).key()
        };
        let ids = (self.phases.id(pass_name(kind, dim)), self.axes.id(axis_key));
        self.pass_keys.push(((kind, dim), ids));
        ids
    }

    /// A bucket of `len` padded elements under `strategy`, `expert_share`
    /// of them a mixture's expert weights.
    fn length(&mut self, strategy: Strategy, len: usize, expert_share: f64) -> LengthCost {
        let mut out = LengthCost::default();
        let mut shard = 0usize;
        let mut updated = false;
        let experts = (len as f64 * expert_share).round() as u64;
        let plan = bucket_plan_with_experts(
            strategy,
            self.mesh,
            (len as u64, experts),
            self.slots as u64,
            false,
        );
        for step in plan {
            match step {
                PlanStep::Collective(c) => {
                    use crate::sharding::strategy::Purpose as P;
                    // Weights and their gradients in the compute type; the
                    // reduction over data in the parameters' own.
                    let elem = match (c.purpose, c.axis) {
                        (P::Gradients, MeshAxisName::Data) => self.precision.grads,
                        _ => self.precision.compute,
                    };
                    let rounds = self.collective(c.kind, c.axis, (c.elements as usize, elem));
                    match c.purpose {
                        P::ParamsForward => out.gather.extend(rounds),
                        P::ParamsBackward => {}
                        P::Gradients if self.defer_data && c.axis == MeshAxisName::Data => {
                            out.data_gradient.extend(rounds)
                        }
                        P::Gradients => out.gradient.extend(rounds),
                        P::NewParams => {
                            if c.axis == MeshAxisName::Data {
                                out.all_gather_data.extend(rounds.iter().copied());
                            } else {
                                out.all_gather_fsdp.extend(rounds.iter().copied());
                            }
                            out.all_gather.extend(rounds)
                        }
                    }
                }
                PlanStep::Update { elements } => {
                    shard = elements as usize;
                    updated = true;
                    // It reads the parameter, the gradient and the state
                    // and writes the parameter and the state.
                    let p = &self.precision;
                    let per_element = 2 * p.params + p.grads + 2 * p.state;
                    out.update = (per_element * shard) as f64 / self.hbm_per_s;
                }
                PlanStep::ReplicateState { .. } => {}
            }
        }
        debug_assert!(updated);
        out.shard = shard;
        if self.redundant {
            // Under fsdp (and under ZeRO's mixed precision, its master
            // copy) the parameter shard lives nowhere else: it is copied
            // with the state (`sharding::residency`).
            let p = &self.precision;
            let params_copied = strategy == Strategy::Fsdp || p.has_master();
            let copy = ((p.state + usize::from(params_copied) * p.params) * shard) as u64;
            let alpha = self.ici.latency_seconds();
            let group = self.next_group;
            self.next_group += 1;
            out.replicate.push(Round {
                group,
                phase: self.phases.id("replicate_state".into()),
                axis: self.axes.id("snake_ring".into()),
                seconds: f64::from(self.replication_hops) * alpha
                    + copy as f64 / self.ici.bandwidth_bytes_per_second(),
                bytes: copy * self.replication_links,
            });
        }
        out
    }
}

pub(super) fn devices_error(reason: impl Into<String>) -> ShardingError {
    ShardingError::Devices {
        reason: reason.into(),
    }
}

/// Each use's and the between-pass compute's seconds: finite, from 0.
fn check_uses(options: &StrategyOptions) -> Result<(), ShardingError> {
    let uses = [
        ("a bucket's forward use", options.use_seconds),
        ("a bucket's backward use", options.backward()),
        ("the compute between the passes", options.between_seconds),
    ];
    for (what, seconds) in uses {
        if !(seconds.is_finite() && seconds >= 0.0) {
            return Err(devices_error(format!(
                "{what} lasts {seconds} s: it must be a finite number of seconds from 0"
            )));
        }
    }
    Ok(())
}

/// The options the modeled step refuses before any work: a recovery
/// policy the pod cannot keep, a mesh it does not lay out, a use that is
/// not a finite duration, a prefetch past [`MAX_PREFETCH`].
fn check_options(topology: &Topology, options: &StrategyOptions) -> Result<(), ShardingError> {
    check_recovery_policy(topology, options.recovery)?;
    options
        .mesh
        .check_on(topology)
        .map_err(|e| devices_error(e.to_string()))?;
    check_uses(options)?;
    if options.prefetch > MAX_PREFETCH {
        return Err(ShardingError::Prefetch {
            prefetch: options.prefetch,
            max: MAX_PREFETCH,
        });
    }
    Ok(())
}

/// The modeled step of `tensors` (names and shapes) of `dtype` with an
/// optimizer of `slots` state slots, in buckets of `bucket_bytes`, under
/// `options` (module docs). The mesh must be laid out on `topology`; a
/// recovery policy the pod cannot apply is the error a real model gives.
pub fn modeled_strategy_step(
    topology: &Topology,
    tensors: &[(String, Vec<usize>)],
    dtype: DType,
    slots: usize,
    bucket_bytes: usize,
    options: &StrategyOptions,
) -> Result<StrategyStep, ShardingError> {
    check_options(topology, options)?;
    // The pod as the replicated closed form lays it out: the slice's
    // rings and lines, the DCN rail; the buckets over every device.
    let PodGeometry {
        shape,
        rail,
        chips,
        slices,
        ..
    } = PodGeometry::of(topology)?;
    let devices = chips * slices;
    let runs = BucketRuns::of_tensors(tensors, dtype, bucket_bytes, devices)?;
    let redundant = options.recovery == RecoveryPolicy::Redundant && devices > 1;
    let mut costing = Costing::new(
        topology,
        options,
        (shape, rail, chips, slices),
        (dtype.byte_size(), slots, redundant),
    )?;
    let costs: Vec<LengthCost> = runs
        .runs
        .iter()
        .map(|&(len, _)| costing.length(options.strategy, len, options.expert_share))
        .collect();
    let mut streams = Streams::new(
        costing.phases.0.len(),
        costing.axes.0.len(),
        options.record_spans,
    );
    let uses = Uses {
        forward: options.use_seconds,
        backward: options.backward(),
        between: options.between_seconds,
    };
    let work = Work {
        costs: &costs,
        runs: &runs,
    };
    let period = schedule(&mut streams, options, work, uses);
    let model = ModelSize::of_runs(&runs, dtype.byte_size(), slots)
        .with_precision(
            options
                .precision
                .unwrap_or(Precision::uniform(dtype.byte_size(), slots)),
        )
        .with_expert_share(options.expert_share);
    let memory = StrategyMemory::of(
        options.strategy,
        &options.mesh,
        &model,
        options.prefetch,
        options.recovery,
    );
    let step_seconds = period;
    let (phases, phase_bytes, axes) = streams.totals(&costing, runs.buckets() > 0, step_seconds);
    Ok(StrategyStep {
        strategy: options.strategy,
        mesh: options.mesh.clone(),
        prefetch: options.prefetch,
        recovery: options.recovery,
        buckets: runs.buckets(),
        devices,
        step_seconds,
        update_seconds: streams.update_seconds,
        update_elements: runs
            .runs
            .iter()
            .zip(&costs)
            .map(|(&(_, count), c)| count as u64 * c.shard as u64)
            .sum(),
        use_seconds: streams.use_total,
        phases,
        phase_bytes,
        axes,
        link_bytes: streams.axis_bytes.iter().sum(),
        hbm_bytes_per_device: memory.total(),
        memory,
        plan: bucket_plan_with_experts(
            options.strategy,
            &options.mesh,
            (
                runs.largest() as u64,
                (runs.largest() as f64 * options.expert_share).round() as u64,
            ),
            slots as u64,
            redundant,
        ),
        spans: streams.spans,
        schedule_iterations: streams.steady.simulated,
    })
}

/// Places the step on `streams` in `options`' order: the step's length
/// (the training order's is the steady state's, [`STEADY_STEPS`]).
fn schedule(streams: &mut Streams, options: &StrategyOptions, work: Work, uses: Uses) -> f64 {
    let fsdp = (options.prefetch.saturating_add(1), true);
    streams.skip_empty = options.order == StepOrder::Training;
    match (options.strategy, options.order) {
        (Strategy::Replicated | Strategy::Zero2, StepOrder::Optimizer) => {
            streams.after_update(work, uses);
            streams.comm_free.max(streams.compute_free)
        }
        (Strategy::Replicated | Strategy::Zero2, StepOrder::Training) => {
            streams.pipelined(work, uses, (1, false), STEADY_STEPS)
        }
        (Strategy::Fsdp, StepOrder::Optimizer) => streams.pipelined(work, uses, fsdp, 1),
        (Strategy::Fsdp, StepOrder::Training) => streams.pipelined(work, uses, fsdp, STEADY_STEPS),
    }
}

pub use super::axis_costs::{AxisCollective, axis_all_to_all, axis_collective, axis_permute};

#[cfg(test)]
#[path = "strategy_tests.rs"]
mod tests;
