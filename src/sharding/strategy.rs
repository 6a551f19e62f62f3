//! What a sharding strategy costs per device, in HBM, and which collectives
//! it runs per bucket, as data ([`super::mesh`] has the strategies'
//! semantics).
//!
//! Per device, with `P` model elements (`P'` padded: every bucket a
//! multiple of the mesh's `N` devices), `F` devices on `fsdp`, `e` bytes an
//! element, `k` state slots, `b` the largest bucket's padded bytes, each
//! term rounded up to [`crate::memory::ALIGNMENT`] as the heaps place it:
//!
//! | strategy | params | grads | state | in flight |
//! |---|---|---|---|---|
//! | replicated | `P·e` | `P·e` | `k·P'/N·e` | none |
//! | zero2 | `P·e` | `P'/F·e` | `k·P'/F·e` | `b` (the gradient bucket) |
//! | fsdp | `P'/F·e` | `P'/F·e` | `k·P'/F·e` | `(prefetch + 1)·b` gathered, `b` gradient |
//!
//! and under the redundant recovery policy a second copy of the state
//! shard. The replicated figure is `cost_model::replicated`'s.

use std::fmt;

use serde::Serialize;

use super::bucket_runs::BucketRuns;
use super::layout::ShardLayout;
use super::mesh::{Mesh, MeshAxisName, PhysicalAxis, Strategy};
use super::model::RecoveryPolicy;
use super::residency::{ResidencyInput, hbm_bytes_per_device};

/// A model's sizes as the strategies need them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ModelSize {
    /// Model elements.
    pub elements: u64,
    /// The buckets' padded lengths summed (each a multiple of the devices).
    pub padded_elements: u64,
    /// The largest bucket's padded length.
    pub bucket_elements: u64,
    /// Buckets.
    pub buckets: u64,
    /// Bytes of an element.
    pub elem_bytes: u64,
    /// Bytes of an element in a bucket in flight (gathered, or reduced):
    /// what the collectives carry, `elem_bytes` unless a training step
    /// moves the compute type.
    pub wire_bytes: u64,
    /// Optimizer state slots.
    pub slots: u64,
    /// Bytes of a gradient element as the shards hold it.
    pub grad_bytes: u64,
    /// Bytes of one element's state, every slot together.
    pub state_bytes: u64,
    /// Of `elements`, a mixture's expert weights (split over the mesh's
    /// `expert` axis: a device's replica group holds `1/X` of them).
    pub expert_elements: u64,
    /// Of the largest bucket, its expert weights.
    pub expert_bucket_elements: u64,
}

/// A model's mixed precision as the strategy step charges it, bytes per
/// element of each kind (MaxText's `dtype`, `weight_dtype`, `grad_dtype`
/// and `mu_dtype`).
///
/// fsdp gathers its weights cast to the compute type, every strategy
/// reduce-scatters the matmuls' gradients over `fsdp` in it, and
/// replicated and zero2 all-gather their new parameters into a replica of
/// it; when it is narrower than the parameters' type they keep the
/// parameters' shard as a master copy
/// ([`StrategyMemory::master`]). The reduction over
/// `data` (after the backward's accumulation into the gradients' type, as
/// XLA's data-parallel all-reduce optimization runs it), the gradient
/// shards, the state and the update are in their own types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Precision {
    /// The compute type (`dtype`): the buckets in flight.
    pub compute: usize,
    /// The parameters as stored (`weight_dtype`).
    pub params: usize,
    /// The gradient shards and their reduction over `data` (`grad_dtype`).
    pub grads: usize,
    /// Every optimizer-state slot of one element together (Adam's first
    /// moment in `mu_dtype`, its second in the parameters' type).
    pub state: usize,
}

impl Precision {
    /// Every kind in `bytes`-byte elements with `slots` state slots.
    pub fn uniform(bytes: usize, slots: usize) -> Precision {
        Precision {
            compute: bytes,
            params: bytes,
            grads: bytes,
            state: slots * bytes,
        }
    }

    /// Whether the compute type is narrower than the parameters' (ZeRO's
    /// mixed precision: a master copy beside the replica).
    pub fn has_master(&self) -> bool {
        self.compute < self.params
    }
}

impl ModelSize {
    /// These sizes with a model's mixed precision: the compute type in
    /// flight, the parameters, gradients and state each in their own.
    pub fn with_precision(self, precision: Precision) -> ModelSize {
        ModelSize {
            elem_bytes: precision.params as u64,
            wire_bytes: precision.compute as u64,
            grad_bytes: precision.grads as u64,
            state_bytes: precision.state as u64,
            ..self
        }
    }

    /// These sizes with `share` of every bucket a mixture's expert weights
    /// ([`bucket_plan_with_experts`]).
    pub fn with_expert_share(self, share: f64) -> ModelSize {
        let of = |n: u64| (n as f64 * share.clamp(0.0, 1.0)).round() as u64;
        ModelSize {
            expert_elements: of(self.elements),
            expert_bucket_elements: of(self.bucket_elements),
            ..self
        }
    }

    /// Elements a device's replica group holds on `mesh`, of the model and
    /// of its largest bucket: all of them but the experts on other devices
    /// of the `expert` axis.
    pub fn local_elements(&self, mesh: &Mesh) -> (u64, u64) {
        let x = mesh.size(MeshAxisName::Expert).max(1) as u64;
        let local = |all: u64, experts: u64| all - experts + experts.div_ceil(x);
        (
            local(self.elements, self.expert_elements),
            local(self.bucket_elements, self.expert_bucket_elements),
        )
    }

    /// The sizes of the buckets `runs` of `elem_bytes`-byte elements with
    /// `slots` state slots (what [`ModelSize::of`] gives for the layout).
    pub fn of_runs(runs: &BucketRuns, elem_bytes: usize, slots: usize) -> ModelSize {
        ModelSize {
            elements: runs.elements as u64,
            padded_elements: runs.padded_elements() as u64,
            bucket_elements: runs.largest() as u64,
            buckets: runs.buckets() as u64,
            elem_bytes: elem_bytes as u64,
            wire_bytes: elem_bytes as u64,
            slots: slots as u64,
            grad_bytes: elem_bytes as u64,
            state_bytes: (slots * elem_bytes) as u64,
            expert_elements: 0,
            expert_bucket_elements: 0,
        }
    }

    /// The sizes of `layout` with `slots` state slots.
    pub fn of(layout: &ShardLayout, slots: usize) -> ModelSize {
        ModelSize {
            elements: layout.elements as u64,
            padded_elements: layout.buckets.iter().map(|b| b.padded_len as u64).sum(),
            bucket_elements: layout
                .buckets
                .iter()
                .map(|b| b.padded_len as u64)
                .max()
                .unwrap_or(0),
            buckets: layout.buckets.len() as u64,
            elem_bytes: layout.element_bytes() as u64,
            wire_bytes: layout.element_bytes() as u64,
            slots: slots as u64,
            grad_bytes: layout.element_bytes() as u64,
            state_bytes: (slots * layout.element_bytes()) as u64,
            expert_elements: 0,
            expert_bucket_elements: 0,
        }
    }
}

/// Per-device HBM of a strategy, by kind, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StrategyMemory {
    /// Parameters: the whole model, or the `fsdp` shard.
    pub params: u64,
    /// Gradients: the whole model, or the `fsdp` shard.
    pub grads: u64,
    /// Optimizer state: every slot's shard.
    pub state: u64,
    /// The redundant policy's copy of a peer's state shard (under fsdp, and of
    /// its parameter shard, the only other place those values live).
    pub redundant_state: u64,
    /// `fsdp`'s gathered parameter buckets in flight.
    pub gathered_buckets: u64,
    /// The gradient bucket being reduce-scattered (zero2, fsdp).
    pub gradient_bucket: u64,
    /// replicated and zero2 training in a compute type narrower than the
    /// parameters' (ZeRO's mixed precision): the parameters' shard in
    /// their own type, the master copy the update writes; the replica they
    /// compute with is then in the compute type (0 otherwise).
    pub master: u64,
}

/// `bytes` as the heaps place them: at least one, rounded up to the
/// alignment.
fn aligned(bytes: u64) -> u64 {
    bytes
        .max(1)
        .saturating_add(crate::memory::ALIGNMENT as u64 - 1)
        / crate::memory::ALIGNMENT as u64
        * crate::memory::ALIGNMENT as u64
}

impl StrategyMemory {
    /// The HBM of `strategy` on `mesh` for `model`, `fsdp` keeping up to
    /// `prefetch + 1` gathered buckets (never more than the model's
    /// buckets), under `recovery`: [`super::residency`]'s figure.
    pub fn of(
        strategy: Strategy,
        mesh: &Mesh,
        model: &ModelSize,
        prefetch: usize,
        recovery: RecoveryPolicy,
    ) -> StrategyMemory {
        // One figure for the world's placement and this model: residency's,
        // on the devices the state is sharded over (every device under
        // replicated, as ZeRO-1 over every replica; the fsdp axis else).
        let devices = mesh.devices_per_tensor_shard().max(1);
        let shard_over = match strategy {
            Strategy::Replicated => devices,
            Strategy::Zero2 | Strategy::Fsdp => mesh.shard_devices(),
        };
        // What a device's replica group holds whole: every element but the
        // experts other devices of the `expert` axis hold.
        let (local, local_bucket) = model.local_elements(mesh);
        let input = ResidencyInput {
            strategy,
            elements: local as usize,
            shard_elements: model.padded_elements as usize / shard_over,
            bucket_elements: local_bucket as usize,
            buckets: model.buckets as usize,
            elem_bytes: model.elem_bytes as usize,
            slots: model.slots as usize,
            prefetch,
            redundant: recovery == RecoveryPolicy::Redundant && devices > 1,
        };
        let by_kind = hbm_bytes_per_device(&input);
        // A bucket in flight in the collectives' type.
        let bucket = |bytes: u64| aligned(local_bucket.saturating_mul(bytes));
        let (held, gradient_bucket) = match strategy {
            Strategy::Replicated => (0, 0),
            Strategy::Zero2 | Strategy::Fsdp => {
                (bucket(model.elem_bytes), bucket(model.wire_bytes))
            }
        };
        let mut memory = StrategyMemory {
            params: by_kind.params,
            grads: by_kind.grads - held,
            state: by_kind.state,
            redundant_state: by_kind.redundant,
            gathered_buckets: input.gathered_buffers() as u64 * bucket(model.wire_bytes),
            gradient_bucket,
            master: 0,
        };
        // The gradient shards and the state in their own types, when a
        // model's precision sets them apart from the parameters'.
        let shard_of = |bytes: u64| aligned((input.shard_elements as u64).saturating_mul(bytes));
        if model.grad_bytes != model.elem_bytes {
            memory.grads = match strategy {
                Strategy::Replicated => aligned(local.saturating_mul(model.grad_bytes)),
                Strategy::Zero2 | Strategy::Fsdp => shard_of(model.grad_bytes),
            };
        }
        if model.state_bytes != model.slots * model.elem_bytes {
            let state = if model.state_bytes == 0 {
                0
            } else {
                shard_of(model.state_bytes)
            };
            if input.redundant {
                memory.redundant_state = memory.redundant_state - memory.state + state;
            }
            memory.state = state;
        }
        let narrower = model.wire_bytes < model.elem_bytes;
        if narrower && strategy != Strategy::Fsdp {
            // ZeRO's mixed precision: a compute-type replica, and the
            // parameters' shard in their own type beside the state (copied
            // with it under the redundant policy: it lives nowhere else).
            let wide = |bytes: u64| aligned(local.saturating_mul(bytes));
            let shard = aligned((input.shard_elements as u64).saturating_mul(model.elem_bytes));
            memory.params = wide(model.wire_bytes);
            if strategy == Strategy::Replicated {
                memory.grads = wide(model.wire_bytes);
            }
            memory.master = shard;
            if input.redundant {
                memory.redundant_state += shard;
            }
        }
        memory
    }

    /// Every kind with its bytes, in the order the report lists them.
    pub fn kinds(&self) -> [(&'static str, u64); 7] {
        [
            ("params", self.params),
            ("grads", self.grads),
            ("state", self.state),
            ("master", self.master),
            ("redundant_state", self.redundant_state),
            ("gathered_buckets", self.gathered_buckets),
            ("gradient_bucket", self.gradient_bucket),
        ]
    }

    /// Bytes in all.
    pub fn total(&self) -> u64 {
        self.kinds()
            .iter()
            .fold(0u64, |sum, &(_, b)| sum.saturating_add(b))
    }

    /// Whether a device of `hbm_bytes` holds it; if not, what it holds and
    /// by how much it is over.
    pub fn fits(&self, hbm_bytes: u64) -> Result<(), NotFitting> {
        let total = self.total();
        if total <= hbm_bytes {
            return Ok(());
        }
        Err(NotFitting {
            kinds: self.kinds().into_iter().filter(|&(_, b)| b > 0).collect(),
            total_bytes: total,
            hbm_bytes,
        })
    }
}

/// A strategy's HBM over a device's: the kinds it holds and the excess.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
pub struct NotFitting {
    /// The kinds held, bytes each (zero kinds left out).
    pub kinds: Vec<(&'static str, u64)>,
    /// Their sum.
    pub total_bytes: u64,
    /// The device's HBM.
    pub hbm_bytes: u64,
}

impl NotFitting {
    /// Bytes over the device's HBM.
    pub fn excess_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(self.hbm_bytes)
    }
}

impl fmt::Display for NotFitting {
    /// `params 350.0 GB + grads 350.0 GB + state 1.4 GB = 701.4 GB of
    /// 95 GiB: 599.4 GB over`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .kinds
            .iter()
            .map(|(k, b)| format!("{k} {}", crate::units::bytes(*b)))
            .collect();
        write!(
            f,
            "{} = {} of {}: {} over",
            parts.join(" + "),
            crate::units::bytes(self.total_bytes),
            crate::units::bytes(self.hbm_bytes),
            crate::units::bytes(self.excess_bytes())
        )
    }
}

/// A collective a bucket's plan runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveKind {
    /// Each device ends with the reduced `1/n` of `elements`.
    ReduceScatter,
    /// Each device ends with all `elements`, from `1/n` each.
    AllGather,
    /// Each device ends with the reduced `elements`.
    AllReduce,
}

/// What a planned collective moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    /// fsdp: the bucket's parameters for its forward use.
    ParamsForward,
    /// fsdp: the bucket's parameters again, for its backward use.
    ParamsBackward,
    /// The bucket's gradients.
    Gradients,
    /// The updated parameters, back to every replica.
    NewParams,
}

/// One collective of a bucket's plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedCollective {
    /// Which collective.
    pub kind: CollectiveKind,
    /// What it moves.
    pub purpose: Purpose,
    /// The mesh axis it runs over.
    pub axis: MeshAxisName,
    /// That axis's physical axes (torus axes in order, then the slices).
    pub physical: Vec<PhysicalAxis>,
    /// Devices along the axis.
    pub devices: usize,
    /// Elements each device holds before a reduce-scatter, after an
    /// all-gather, and before and after an all-reduce.
    pub elements: u64,
}

impl PlannedCollective {
    /// Elements each device sends: `(n − 1)/n` of `elements` for a
    /// reduce-scatter or an all-gather, twice that for an all-reduce.
    pub fn sent_per_device(&self) -> u64 {
        let n = self.devices.max(1) as u64;
        let one = self.elements / n * (n - 1);
        match self.kind {
            CollectiveKind::AllReduce => 2 * one,
            _ => one,
        }
    }
}

/// One step of a bucket's plan, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanStep {
    /// A collective.
    Collective(PlannedCollective),
    /// The fused update of each device's shard of `elements`.
    Update {
        /// Elements each device updates.
        elements: u64,
    },
    /// The redundant policy: each device's new state shards (`elements`
    /// in all slots) to its snake-ring successor.
    ReplicateState {
        /// Elements each device sends.
        elements: u64,
    },
}

/// The plan of a bucket of `len` padded elements (a multiple of the mesh's
/// devices) under `strategy` on `mesh` (module docs of [`super::mesh`]):
/// collectives over size-1 axes are left out; `redundant` adds the state
/// copy of `slots` slots.
pub fn bucket_plan(
    strategy: Strategy,
    mesh: &Mesh,
    len: u64,
    slots: u64,
    redundant: bool,
) -> Vec<PlanStep> {
    bucket_plan_with_experts(strategy, mesh, (len, 0), slots, redundant)
}

/// [`bucket_plan`] for a bucket of `len` elements of which `experts` are a
/// mixture's expert weights, split over the mesh's `expert` axis `X`
/// (MaxText's `exp` on `expert`) and sharded over `fsdp` `F`; the rest is
/// sharded over `fsdp` and `expert` together (MaxText's `embed` on both).
/// A device's replica group then holds `local = rest + experts/X` of the
/// bucket (its experts and all the rest): the collectives over `fsdp` move
/// `local`, and the rest's extra sharding over `expert` is a collective of
/// its `rest/F` over `expert` (gathered before, reduce-scattered after:
/// together the hierarchical form of one collective over `fsdp × expert`).
/// Every strategy keeps its state at `len/(F·X)` a device. With `X = 1` (or
/// no experts) this is [`bucket_plan`]'s plan, collective for collective.
pub fn bucket_plan_with_experts(
    strategy: Strategy,
    mesh: &Mesh,
    (len, experts): (u64, u64),
    slots: u64,
    redundant: bool,
) -> Vec<PlanStep> {
    let fsdp = mesh.size(MeshAxisName::Fsdp).max(1) as u64;
    let x = mesh.size(MeshAxisName::Expert).max(1) as u64;
    let experts = experts.min(len);
    let rest = len - experts;
    let local = rest + experts.div_ceil(x);
    let rest_f = rest.div_ceil(fsdp);
    let shard = len / mesh.shard_devices() as u64;
    let devices = mesh.devices_per_tensor_shard().max(1) as u64;
    let on = |kind, purpose, axis: MeshAxisName, elements| {
        mesh.axis(axis).filter(|a| a.size > 1).map(|a| {
            PlanStep::Collective(PlannedCollective {
                kind,
                purpose,
                axis,
                physical: a.physical.clone(),
                devices: a.size,
                elements,
            })
        })
    };
    use CollectiveKind::{AllGather, AllReduce, ReduceScatter};
    use MeshAxisName::{Data, Expert, Fsdp};
    use Purpose::{Gradients, NewParams, ParamsBackward, ParamsForward};
    // The rest's sharding over `expert` (nothing without the axis).
    let rest_over_expert = |kind, purpose| on(kind, purpose, Expert, rest_f).filter(|_| rest > 0);
    let (steps, shard): (Vec<Option<PlanStep>>, u64) = match strategy {
        Strategy::Replicated => (
            vec![
                on(ReduceScatter, Gradients, Fsdp, local),
                rest_over_expert(ReduceScatter, Gradients),
                on(ReduceScatter, Gradients, Data, shard),
                Some(PlanStep::Update {
                    elements: len / devices,
                }),
                on(AllGather, NewParams, Data, shard),
                rest_over_expert(AllGather, NewParams),
                on(AllGather, NewParams, Fsdp, local),
            ],
            len / devices,
        ),
        Strategy::Zero2 => (
            vec![
                on(ReduceScatter, Gradients, Fsdp, local),
                rest_over_expert(ReduceScatter, Gradients),
                on(AllReduce, Gradients, Data, shard),
                Some(PlanStep::Update { elements: shard }),
                rest_over_expert(AllGather, NewParams),
                on(AllGather, NewParams, Fsdp, local),
            ],
            shard,
        ),
        Strategy::Fsdp => (
            vec![
                rest_over_expert(AllGather, ParamsForward),
                on(AllGather, ParamsForward, Fsdp, local),
                rest_over_expert(AllGather, ParamsBackward),
                on(AllGather, ParamsBackward, Fsdp, local),
                on(ReduceScatter, Gradients, Fsdp, local),
                rest_over_expert(ReduceScatter, Gradients),
                on(AllReduce, Gradients, Data, shard),
                Some(PlanStep::Update { elements: shard }),
            ],
            shard,
        ),
    };
    let mut steps: Vec<PlanStep> = steps.into_iter().flatten().collect();
    if redundant && devices > 1 {
        steps.push(PlanStep::ReplicateState {
            elements: slots * shard,
        });
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::parse_topology;

    fn v5p() -> crate::topology::Topology {
        parse_topology(
            "Pod(name: \"v5p-12288\", generation: \"v5p\", shape: \"16x16x24\")",
            "v5p.ron",
        )
        .unwrap()
    }

    fn model(params: u64, buckets: u64, devices: u64) -> ModelSize {
        let bucket = (params / buckets).next_multiple_of(devices);
        ModelSize {
            elements: params,
            padded_elements: bucket * buckets,
            bucket_elements: bucket,
            buckets,
            elem_bytes: 4,
            wire_bytes: 4,
            slots: 2,
            grad_bytes: 4,
            state_bytes: 8,
            expert_elements: 0,
            expert_bucket_elements: 0,
        }
    }

    #[test]
    fn each_strategy_holds_its_closed_form() {
        let topology = v5p();
        let mesh = Mesh::default_for(&topology);
        let n = 6144u64;
        let m = model(7_000_000_000, 1000, n);
        let a = |b: u64| b.next_multiple_of(64);
        let of = |s, p, r| StrategyMemory::of(s, &mesh, &m, p, r);
        let rep = of(Strategy::Replicated, 1, RecoveryPolicy::Rollback);
        assert_eq!(rep.params, 28_000_000_000);
        assert_eq!(rep.grads, 28_000_000_000);
        assert_eq!(rep.state, 2 * a(m.padded_elements / n * 4));
        assert_eq!(rep.gathered_buckets + rep.gradient_bucket, 0);
        let z2 = of(Strategy::Zero2, 1, RecoveryPolicy::Rollback);
        assert_eq!(z2.params, rep.params);
        assert_eq!(z2.grads, a(m.padded_elements / n * 4));
        assert_eq!(z2.gradient_bucket, a(m.bucket_elements * 4));
        let fsdp = of(Strategy::Fsdp, 3, RecoveryPolicy::Redundant);
        assert_eq!(fsdp.params, z2.grads);
        assert_eq!(fsdp.gathered_buckets, 4 * a(m.bucket_elements * 4));
        // The copy of the predecessor's state and parameter shards.
        assert_eq!(fsdp.redundant_state, fsdp.state + fsdp.params);
        assert_eq!(
            fsdp.total(),
            2 * fsdp.params
                + fsdp.grads
                + 2 * fsdp.state
                + fsdp.gathered_buckets
                + fsdp.gradient_bucket
        );
        // Prefetch beyond the model's buckets holds no more.
        let huge = of(Strategy::Fsdp, usize::MAX, RecoveryPolicy::Rollback);
        assert_eq!(huge.gathered_buckets, 1000 * a(m.bucket_elements * 4));
        assert_eq!(
            of(Strategy::Fsdp, 0, RecoveryPolicy::Rollback).gathered_buckets,
            a(m.bucket_elements * 4)
        );
    }

    #[test]
    fn what_does_not_fit_is_named_with_the_excess() {
        let topology = v5p();
        let mesh = Mesh::default_for(&topology);
        let m = model(175_000_000_000, 7000, 6144);
        let rep = StrategyMemory::of(Strategy::Replicated, &mesh, &m, 1, RecoveryPolicy::Rollback);
        let err = rep.fits(topology.hbm_bytes).unwrap_err();
        assert_eq!(err.hbm_bytes, 95 << 30);
        assert_eq!(err.excess_bytes(), rep.total() - (95 << 30));
        let text = err.to_string();
        assert_eq!(
            text,
            "params 651.93 GiB + grads 651.93 GiB + state 217.36 MiB = 1.27 TiB of 95.00 GiB: 1.18 TiB over"
        );
        let fsdp = StrategyMemory::of(Strategy::Fsdp, &mesh, &m, 1, RecoveryPolicy::Rollback);
        assert_eq!(fsdp.fits(topology.hbm_bytes), Ok(()));
    }

    #[test]
    fn plans_run_the_strategy_s_collectives_in_order() {
        let topology = parse_topology(
            "Pod(name: \"m\", generation: \"v5e\", shape: \"4x4\", slices: 2, \
             dcn: (latency_us: 10.0, host_gb_per_s: 25.0, oversubscription: 1.0))",
            "m.ron",
        )
        .unwrap();
        let mesh = Mesh::default_for(&topology);
        let kinds = |s| -> Vec<(CollectiveKind, MeshAxisName, u64)> {
            bucket_plan(s, &mesh, 3200, 2, false)
                .into_iter()
                .filter_map(|p| match p {
                    PlanStep::Collective(c) => Some((c.kind, c.axis, c.elements)),
                    _ => None,
                })
                .collect()
        };
        use CollectiveKind::*;
        use MeshAxisName::*;
        assert_eq!(
            kinds(Strategy::Replicated),
            [
                (ReduceScatter, Fsdp, 3200),
                (ReduceScatter, Data, 200),
                (AllGather, Data, 200),
                (AllGather, Fsdp, 3200)
            ]
        );
        assert_eq!(
            kinds(Strategy::Zero2),
            [
                (ReduceScatter, Fsdp, 3200),
                (AllReduce, Data, 200),
                (AllGather, Fsdp, 3200)
            ]
        );
        assert_eq!(
            kinds(Strategy::Fsdp),
            [
                (AllGather, Fsdp, 3200),
                (AllGather, Fsdp, 3200),
                (ReduceScatter, Fsdp, 3200),
                (AllReduce, Data, 200)
            ]
        );
        let fsdp = bucket_plan(Strategy::Fsdp, &mesh, 3200, 2, true);
        assert_eq!(fsdp[4], PlanStep::Update { elements: 200 });
        assert_eq!(fsdp[5], PlanStep::ReplicateState { elements: 400 });
        let PlanStep::Collective(rs) = &fsdp[2] else {
            panic!()
        };
        assert_eq!(rs.sent_per_device(), 3000);
        assert_eq!(
            rs.physical,
            [PhysicalAxis::Torus(0), PhysicalAxis::Torus(1)]
        );
        assert_eq!(
            bucket_plan(Strategy::Replicated, &mesh, 3200, 2, false)[2],
            PlanStep::Update { elements: 100 }
        );
    }

    proptest::proptest! {
        #[test]
        fn more_sharding_never_holds_more_params_and_grads(
            params in 1u64..1_000_000_000_000,
            buckets in 1u64..10_000,
            prefetch in 0usize..8,
            hbm in 1u64..1_000_000_000_000,
        ) {
            let topology = v5p();
            let mesh = Mesh::default_for(&topology);
            let m = model(params, buckets.min(params), 6144);
            let of = |s| StrategyMemory::of(s, &mesh, &m, prefetch, RecoveryPolicy::Rollback);
            let (rep, z2, fsdp) = (of(Strategy::Replicated), of(Strategy::Zero2), of(Strategy::Fsdp));
            proptest::prop_assert!(fsdp.params + fsdp.grads <= z2.params + z2.grads);
            proptest::prop_assert!(z2.params + z2.grads <= rep.params + rep.grads);
            for s in [rep, z2, fsdp] {
                let kinds: u64 = s.kinds().iter().map(|k| k.1).sum();
                proptest::prop_assert_eq!(s.total(), kinds);
                match s.fits(hbm) {
                    Ok(()) => proptest::prop_assert!(s.total() <= hbm),
                    Err(e) => {
                        proptest::prop_assert!(s.total() > hbm);
                        proptest::prop_assert_eq!(e.excess_bytes(), s.total() - hbm);
                    }
                }
            }
        }
    }
}
