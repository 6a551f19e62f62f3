//! The links a sharded step uses: each bucket's reduce-scatter and
//! all-gather on the model's plan (torus, multislice or a ring of
//! survivors), and the redundant policy's state copies, as the
//! [`Traffic`] the launch charges to the links, and what each bucket's
//! passes then cost on the charged links.

use std::collections::BTreeMap;

use bevy_ecs::prelude::*;

use super::error::ShardingError;
use super::layout::{ShardLayout, ShardPlan};
use super::timing::{BucketCost, pass_durations};
use crate::collectives::pod::{LinkCharge, multislice_of, torus_of};
use crate::collectives::{
    Traffic, multislice_all_gather_traffic, multislice_reduce_scatter_traffic,
    ring_all_gather_traffic, ring_reduce_scatter_traffic, torus_all_gather_traffic,
    torus_reduce_scatter_traffic,
};
use crate::topology::PodTopology;

/// Per distinct bucket length (`lengths`), the reduce-scatter's and the
/// all-gather's traffic (with the redundant copies after the all-gather),
/// and all of it together, each record counted once per bucket of its
/// length.
pub(super) fn step_traffic(
    world: &World,
    layout: &ShardLayout,
    lengths: &[usize],
    slots: usize,
    redundant: bool,
) -> Result<(Traffic, Vec<(Traffic, Traffic)>), ShardingError> {
    let elem = layout.element_bytes();
    let mut combined = Traffic::default();
    let mut per_length = Vec::with_capacity(lengths.len());
    for &len in lengths {
        let count = layout
            .buckets
            .iter()
            .filter(|b| b.padded_len == len)
            .count() as u64;
        let (rs, mut ag) = bucket_traffic(&layout.plan, world, len, elem)?;
        if redundant && layout.devices() > 1 {
            let bytes = (slots * (len / layout.devices()) * elem) as u64;
            ag.transfers
                .extend(replication_traffic(world, layout, bytes)?.transfers);
        }
        for t in rs.transfers.iter().chain(&ag.transfers) {
            let mut t = *t;
            t.bytes *= count;
            combined.transfers.push(t);
        }
        per_length.push((rs, ag));
    }
    Ok((combined, per_length))
}

/// The traffic of one bucket's reduce-scatter and all-gather.
fn bucket_traffic(
    plan: &ShardPlan,
    world: &World,
    padded_len: usize,
    elem: usize,
) -> Result<(Traffic, Traffic), ShardingError> {
    match plan {
        ShardPlan::Torus { .. } => {
            let shape = torus_of(&world.resource::<PodTopology>().0)?;
            let ndims = shape.dims().len() as u32;
            Ok((
                torus_reduce_scatter_traffic(&shape, padded_len, elem),
                torus_all_gather_traffic(&shape, padded_len, elem, ndims),
            ))
        }
        ShardPlan::Multislice { .. } => {
            let shape = multislice_of(&world.resource::<PodTopology>().0)?;
            Ok((
                multislice_reduce_scatter_traffic(&shape, padded_len, elem),
                multislice_all_gather_traffic(&shape, padded_len, elem, 4),
            ))
        }
        ShardPlan::Ring { ring } => {
            let topology = &world.resource::<PodTopology>().0;
            if topology.slices > 1 {
                return Err(ShardingError::Devices {
                    reason: format!(
                        "the model was re-sharded onto a ring of {} survivors across the {} \
                         slices of {}: a step across slices runs hierarchically over every \
                         device, and a ring of survivors across slices is not built",
                        ring.len(),
                        topology.slices,
                        topology.name
                    ),
                });
            }
            let shape = torus_of(topology)?;
            let ring: Vec<usize> = ring.iter().map(|d| d.0 as usize).collect();
            let mut ag = ring_all_gather_traffic(&ring, padded_len, elem).routed_on(&shape);
            for t in &mut ag.transfers {
                t.phase.order += 1;
            }
            Ok((
                ring_reduce_scatter_traffic(&ring, padded_len, elem).routed_on(&shape),
                ag,
            ))
        }
    }
}

/// Each replica's state shards to its redundant peer, routed on the torus
/// (on a multislice pod, on the peer's slice: peers share a slice).
pub(super) fn replication_traffic(
    world: &World,
    layout: &ShardLayout,
    bytes: u64,
) -> Result<Traffic, ShardingError> {
    let topology = &world.resource::<PodTopology>().0;
    let (shape, chips) = if topology.slices > 1 {
        let shape = multislice_of(topology)?;
        let chips = shape.chips_per_slice();
        (shape.slice().clone(), chips)
    } else {
        let shape = torus_of(topology)?;
        let chips = shape.device_count();
        (shape, chips)
    };
    let phase = crate::collectives::Phase {
        order: u32::MAX,
        kind: crate::collectives::PhaseKind::Broadcast,
        dim: 0,
        step: 0,
    };
    let transfers = (0..layout.devices())
        .zip(layout.peers())
        .map(|(r, peer)| crate::collectives::Transfer {
            src: layout.participants[r].0 as usize,
            dst: layout.participants[peer].0 as usize,
            bytes,
            hops: 1,
            phase,
        })
        .collect::<Vec<_>>();
    // Route within the slice: shift to slice-local ids and back.
    let mut routed = Traffic::default();
    for t in transfers {
        let base = t.src / chips * chips;
        let local = crate::collectives::Transfer {
            src: t.src - base,
            dst: t.dst.wrapping_sub(base),
            ..t
        };
        routed.transfers.extend(
            Traffic {
                transfers: vec![local],
            }
            .routed_on(&shape)
            .transfers
            .into_iter()
            .map(|r| crate::collectives::Transfer {
                src: r.src + base,
                dst: r.dst.wrapping_add(base),
                ..r
            }),
        );
    }
    Ok(routed)
}

/// Each distinct bucket length's modeled cost: its passes timed on the
/// charged links, its update at HBM bandwidth.
pub(super) fn bucket_costs(
    layout: &ShardLayout,
    lengths: &[usize],
    per_length: &[(Traffic, Traffic)],
    charge: &LinkCharge,
    slots: usize,
    hbm_per_s: f64,
) -> Vec<BucketCost> {
    let elem = layout.element_bytes();
    lengths
        .iter()
        .zip(per_length)
        .map(|(&len, (rs, ag))| {
            let shard = len / layout.shards();
            let bytes = ((3 + 2 * slots) * shard * elem) as f64;
            BucketCost {
                reduce_scatter: pass_durations(rs, |s, d| charge.model(s, d)),
                update: bytes / hbm_per_s,
                all_gather: pass_durations(ag, |s, d| charge.model(s, d)),
            }
        })
        .collect()
}

/// A step's traffic by the phase its records belong to ([`super::timing::StepPhase::key`]
/// names; the redundant copies, broadcast records, are `replicate_state`).
pub(super) fn bytes_by_phase(traffic: &Traffic) -> BTreeMap<String, u64> {
    use crate::collectives::PhaseKind;
    let mut by_kind: BTreeMap<(PhaseKind, u32), u64> = BTreeMap::new();
    for t in &traffic.transfers {
        *by_kind.entry((t.phase.kind, t.phase.dim)).or_insert(0) += t.bytes;
    }
    let mut bytes = BTreeMap::new();
    for ((kind, dim), b) in by_kind {
        let key = match kind {
            PhaseKind::ReduceScatter => super::timing::StepPhase::ReduceScatter { axis: dim }.key(),
            PhaseKind::AllGather => super::timing::StepPhase::AllGather { axis: dim }.key(),
            _ => super::timing::StepPhase::ReplicateState.key(),
        };
        *bytes.entry(key).or_insert(0) += b;
    }
    bytes
}
