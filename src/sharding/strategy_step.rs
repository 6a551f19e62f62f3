//! The collectives of a step under the fsdp strategy, for the links the
//! launch charges and the model of time, composed from the collectives'
//! public traffic records and [`super::timing`].
//!
//! Per bucket, the parameters are sharded, so each device gathers the
//! bucket before its use in the forward pass and again before the backward
//! pass (it freed the gathered buffer in between), then the gradients are
//! reduce-scattered and each device updates its shard; the updated shard
//! stays where it is (no all-gather after the update). With redundant state
//! each device sends its new state shards and its parameter shard to its
//! ring successor. The stages are placed in the order FSDP runs them
//! ([`super::timing::schedule_fsdp`]: every bucket gathered for the
//! forward pass, then in reverse for the backward pass, each followed by
//! its gradient's reduce-scatter), as the closed form
//! (`cost_model::strategy`) places them. The gathers are
//! `all_gather.axisN` phases, both counted under that key.
//!
//! Replicated and zero2 run the replicated step's collectives
//! ([`super::traffic`]); zero2 differs only in what each device holds.

use bevy_ecs::prelude::*;

use super::error::ShardingError;
use super::layout::{ShardLayout, ShardPlan};
use super::mesh::{Mesh, Strategy};
use super::timing::{
    BucketCost, FsdpBucketCost, StepTimeline, pass_durations, schedule, schedule_fsdp,
};
use crate::collectives::pod::{LinkCharge, torus_of};
use crate::collectives::{
    Phase, PhaseKind, Traffic, Transfer, ring_all_gather_traffic, ring_reduce_scatter_traffic,
    torus_all_gather_traffic, torus_reduce_scatter_traffic,
};
use crate::topology::PodTopology;

/// One fsdp bucket length's traffic: the gather (run twice), the
/// reduce-scatter and the redundant copies (empty without them).
#[derive(Debug, Clone, Default)]
pub(super) struct FsdpTraffic {
    /// One all-gather of the bucket's parameters.
    pub gather: Traffic,
    /// The reduce-scatter of its gradients.
    pub reduce_scatter: Traffic,
    /// Each device's new state and parameter shards to its successor.
    pub replicate: Traffic,
}

impl FsdpTraffic {
    /// Every record a bucket puts on the links, in step order.
    fn transfers(&self) -> impl Iterator<Item = &Transfer> {
        self.gather
            .transfers
            .iter()
            .chain(&self.gather.transfers)
            .chain(&self.reduce_scatter.transfers)
            .chain(&self.replicate.transfers)
    }
}

/// Per distinct bucket length (`lengths`), the fsdp step's traffic, and
/// all of it together, each record counted once per bucket of its length.
fn fsdp_step_traffic(
    world: &World,
    layout: &ShardLayout,
    lengths: &[usize],
    slots: usize,
    redundant: bool,
) -> Result<(Traffic, Vec<FsdpTraffic>), ShardingError> {
    let topology = &world.resource::<PodTopology>().0;
    if topology.slices > 1 {
        return Err(ShardingError::ModeledOnly {
            strategy: Strategy::Fsdp,
            place: format!(
                "a multislice pod ({} has {} slices)",
                topology.name, topology.slices
            ),
        });
    }
    let shape = torus_of(topology)?;
    let elem = layout.element_bytes();
    let mut combined = Traffic::default();
    let mut per_length = Vec::with_capacity(lengths.len());
    for &len in lengths {
        let count = layout
            .buckets
            .iter()
            .filter(|b| b.padded_len == len)
            .count() as u64;
        let (gather, reduce_scatter) = match &layout.plan {
            ShardPlan::Torus { .. } => (
                torus_all_gather_traffic(&shape, len, elem, 0),
                torus_reduce_scatter_traffic(&shape, len, elem),
            ),
            ShardPlan::Ring { ring } => {
                let ring: Vec<usize> = ring.iter().map(|d| d.0 as usize).collect();
                (
                    ring_all_gather_traffic(&ring, len, elem).routed_on(&shape),
                    ring_reduce_scatter_traffic(&ring, len, elem).routed_on(&shape),
                )
            }
            ShardPlan::Multislice { .. } => {
                return Err(ShardingError::ModeledOnly {
                    strategy: Strategy::Fsdp,
                    place: "a multislice plan".into(),
                });
            }
        };
        let replicate = if redundant && layout.devices() > 1 {
            let bytes = ((slots + 1) * (len / layout.devices()) * elem) as u64;
            replication(layout, &shape, bytes)
        } else {
            Traffic::default()
        };
        let traffic = FsdpTraffic {
            gather,
            reduce_scatter,
            replicate,
        };
        combined
            .transfers
            .extend(traffic.transfers().map(|t| Transfer {
                bytes: t.bytes * count,
                ..*t
            }));
        per_length.push(traffic);
    }
    Ok((combined, per_length))
}

/// Each participant's `bytes` to its redundant peer, routed on the slice.
fn replication(
    layout: &ShardLayout,
    shape: &crate::collectives::TorusShape,
    bytes: u64,
) -> Traffic {
    let phase = Phase {
        order: 0,
        kind: PhaseKind::Broadcast,
        dim: 0,
        step: 0,
    };
    Traffic {
        transfers: (0..layout.devices())
            .zip(layout.peers())
            .map(|(r, peer)| Transfer {
                src: layout.participants[r].0 as usize,
                dst: layout.participants[peer].0 as usize,
                bytes,
                hops: 1,
                phase,
            })
            .collect(),
    }
    .routed_on(shape)
}

/// Each distinct bucket length's modeled fsdp stages, timed on the charged
/// links: one gather (run before each use), the reduce-scatter, the copies
/// after the update; the update at HBM bandwidth, as every strategy's.
/// [`super::timing::schedule_fsdp`] places them.
fn fsdp_bucket_costs(
    layout: &ShardLayout,
    lengths: &[usize],
    per_length: &[FsdpTraffic],
    charge: &LinkCharge,
    slots: usize,
    hbm_per_s: f64,
) -> Vec<FsdpBucketCost> {
    let elem = layout.element_bytes();
    let link = |s, d| charge.model(s, d);
    lengths
        .iter()
        .zip(per_length)
        .map(|(&len, traffic)| {
            let shard = len / layout.shards();
            FsdpBucketCost {
                gather: pass_durations(&traffic.gather, link),
                gradient: pass_durations(&traffic.reduce_scatter, link),
                update: ((3 + 2 * slots) * shard * elem) as f64 / hbm_per_s,
                replicate: pass_durations(&traffic.replicate, link),
            }
        })
        .collect()
}

/// Each bucket length's traffic, by the strategy's collectives.
pub(super) enum PerLength {
    /// Reduce-scatter, then all-gather (replicated and zero2).
    Replicated(Vec<(crate::collectives::Traffic, crate::collectives::Traffic)>),
    /// Gather twice, reduce-scatter, no gather after the update.
    Fsdp(Vec<FsdpTraffic>),
}

impl PerLength {
    /// The step's traffic under `strategy`, all of it together and per
    /// distinct bucket length (`(slots, redundant)` size the copies); on a
    /// `mesh` (one other than the default, or replicating the state along
    /// its data axis) stage by stage from the bucket's plan
    /// ([`super::mesh_traffic`]).
    pub(super) fn of(
        world: &World,
        (strategy, mesh): (Strategy, Option<&Mesh>),
        layout: &ShardLayout,
        lengths: &[usize],
        (slots, redundant): (usize, bool),
    ) -> Result<(Traffic, PerLength), ShardingError> {
        if let Some(mesh) = mesh {
            return super::mesh_traffic::mesh_step_traffic(
                world,
                (strategy, mesh),
                layout,
                lengths,
                (slots, redundant),
            );
        }
        Ok(match strategy {
            Strategy::Replicated | Strategy::Zero2 => {
                let (combined, per_length) =
                    super::traffic::step_traffic(world, layout, lengths, slots, redundant)?;
                (combined, PerLength::Replicated(per_length))
            }
            Strategy::Fsdp => {
                let (combined, per_length) =
                    fsdp_step_traffic(world, layout, lengths, slots, redundant)?;
                (combined, PerLength::Fsdp(per_length))
            }
        })
    }

    /// The step's schedule on the charged links: every bucket's stages
    /// (`of_bucket[b]` its length's), placed as the strategy runs them;
    /// `(slots, hbm_per_s, prefetch)` size the update and fsdp's gathers.
    pub(super) fn timeline(
        &self,
        layout: &ShardLayout,
        lengths: &[usize],
        of_bucket: &[usize],
        charge: &crate::collectives::pod::LinkCharge,
        (slots, hbm_per_s, prefetch): (usize, f64, usize),
    ) -> StepTimeline {
        match self {
            PerLength::Replicated(per_length) => {
                let costs = super::traffic::bucket_costs(
                    layout, lengths, per_length, charge, slots, hbm_per_s,
                );
                let bucket_costs: Vec<&BucketCost> = of_bucket.iter().map(|&p| &costs[p]).collect();
                schedule(&bucket_costs)
            }
            PerLength::Fsdp(per_length) => {
                let costs =
                    fsdp_bucket_costs(layout, lengths, per_length, charge, slots, hbm_per_s);
                let bucket_costs: Vec<&FsdpBucketCost> =
                    of_bucket.iter().map(|&p| &costs[p]).collect();
                schedule_fsdp(&bucket_costs, prefetch)
            }
        }
    }
}
