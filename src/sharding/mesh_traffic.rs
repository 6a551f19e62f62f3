//! A step's traffic on a mesh, stage by stage from each bucket's plan
//! ([`super::strategy::bucket_plan`], the closed form's plan too): for a
//! model on a mesh other than the pod's default, or whose state is
//! replicated along the data axis (zero2 and fsdp with `data > 1`, hybrid
//! sharding across slices). A collective over a mesh axis runs on every
//! group of devices that differ only along it, at once: over its torus
//! axes as the torus schedule runs them on the plan's grid, and over the
//! slices as the cross-slice exchange on the hosts' NICs (an axis of both
//! reduce-scatters over ICI first and gathers over DCN first, as a
//! multislice collective does). An all-reduce is a reduce-scatter then an
//! all-gather. Each stage's collectives run one after another: a later
//! collective's rounds come after the earlier one's.

use bevy_ecs::prelude::*;

use super::error::ShardingError;
use super::layout::ShardLayout;
use super::mesh::{Mesh, PhysicalAxis, Strategy};
use super::strategy::{CollectiveKind, PlanStep, PlannedCollective, Purpose, bucket_plan};
use super::strategy_step::{FsdpTraffic, PerLength};
use crate::collectives::pod::multislice_of;
use crate::collectives::{
    MultisliceShape, PhaseKind, TorusShape, Traffic, dcn_exchange_traffic,
    torus_all_gather_traffic_over, torus_reduce_scatter_traffic_over,
};
use crate::topology::PodTopology;

/// A bucket length's traffic by stage.
#[derive(Debug, Clone, Default)]
struct Stages {
    /// fsdp: one gather of the parameters (run before each use).
    gather: Traffic,
    /// The gradient's collectives.
    gradient: Traffic,
    /// replicated, zero2: the new parameters' all-gathers.
    all_gather: Traffic,
}

/// The step's traffic on `mesh` under `strategy`, all of it together and
/// per distinct bucket length (`(slots, redundant)` size the state copies
/// of the redundant policy).
pub(super) fn mesh_step_traffic(
    world: &World,
    (strategy, mesh): (Strategy, &Mesh),
    layout: &ShardLayout,
    lengths: &[usize],
    (slots, redundant): (usize, bool),
) -> Result<(Traffic, PerLength), ShardingError> {
    let elem = layout.element_bytes();
    let grid = layout
        .plan
        .grid_shape()
        .ok_or_else(|| ShardingError::MeshNotBuilt {
            mesh: mesh.to_string(),
            reason: "a ring of survivors has no mesh axes".into(),
        })?;
    let topology = &world.resource::<PodTopology>().0;
    let slices = (topology.slices > 1)
        .then(|| multislice_of(topology))
        .transpose()?;
    let collective = |c: &PlannedCollective| collective_traffic(&grid, slices.as_ref(), c, elem);
    // (A mirrored layout never has them: `install_model` refuses it.)
    let copies = redundant && layout.devices() > 1;
    let mut combined = Traffic::default();
    let mut replicated = Vec::new();
    let mut fsdp = Vec::new();
    for &len in lengths {
        let count = layout
            .buckets
            .iter()
            .filter(|b| b.padded_len == len)
            .count() as u64;
        let mut stages = Stages::default();
        for step in bucket_plan(strategy, mesh, len as u64, slots as u64, false) {
            let PlanStep::Collective(c) = step else {
                continue;
            };
            let traffic = collective(&c)?;
            match c.purpose {
                Purpose::ParamsForward => append(&mut stages.gather, traffic),
                // The backward gather is the forward one again.
                Purpose::ParamsBackward => {}
                Purpose::Gradients => append(&mut stages.gradient, traffic),
                Purpose::NewParams => append(&mut stages.all_gather, traffic),
            }
        }
        let shard = len / layout.shards();
        let copied = slots + usize::from(strategy == Strategy::Fsdp);
        let replicate = if copies {
            let bytes = (copied * shard * elem) as u64;
            super::traffic::replication_traffic(world, layout, bytes)?
        } else {
            Traffic::default()
        };
        let gathers = if strategy == Strategy::Fsdp { 2 } else { 1 };
        for _ in 0..gathers {
            add_counted(&mut combined, &stages.gather, count);
        }
        add_counted(&mut combined, &stages.gradient, count);
        add_counted(&mut combined, &stages.all_gather, count);
        add_counted(&mut combined, &replicate, count);
        match strategy {
            Strategy::Fsdp => fsdp.push(FsdpTraffic {
                gather: stages.gather,
                reduce_scatter: stages.gradient,
                replicate,
            }),
            Strategy::Replicated | Strategy::Zero2 => {
                let mut all_gather = stages.all_gather;
                all_gather.transfers.extend(replicate.transfers);
                replicated.push((stages.gradient, all_gather));
            }
        }
    }
    let per_length = match strategy {
        Strategy::Fsdp => PerLength::Fsdp(fsdp),
        Strategy::Replicated | Strategy::Zero2 => PerLength::Replicated(replicated),
    };
    Ok((combined, per_length))
}

/// One planned collective's traffic on the plan's `grid` (and the pod's
/// slices, if it has several): over its torus axes by the torus schedule,
/// over the slices by the cross-slice exchange (module docs).
fn collective_traffic(
    grid: &TorusShape,
    slices: Option<&MultisliceShape>,
    c: &PlannedCollective,
    elem: usize,
) -> Result<Traffic, ShardingError> {
    let torus: Vec<usize> = c
        .physical
        .iter()
        .filter_map(|p| match p {
            PhysicalAxis::Torus(d) => Some(*d),
            PhysicalAxis::Slices => None,
        })
        .collect();
    let extent: usize = torus.iter().map(|&d| grid.dims()[d]).product();
    let len = c.elements as usize;
    let dcn = |kind: PhaseKind| match slices {
        Some(shape) if c.physical.contains(&PhysicalAxis::Slices) => {
            dcn_exchange_traffic(shape, len / extent.max(1), elem, kind, 0)
        }
        _ => Traffic::default(),
    };
    let reduce = || {
        let mut t = torus_reduce_scatter_traffic_over(grid, &torus, len, elem);
        append(&mut t, dcn(PhaseKind::ReduceScatter));
        t
    };
    let gather = || {
        let mut t = dcn(PhaseKind::AllGather);
        append(
            &mut t,
            torus_all_gather_traffic_over(grid, &torus, len, elem, 0),
        );
        t
    };
    Ok(match c.kind {
        CollectiveKind::ReduceScatter => reduce(),
        CollectiveKind::AllGather => gather(),
        CollectiveKind::AllReduce => {
            let mut t = reduce();
            append(&mut t, gather());
            t
        }
    })
}

/// `later`'s records after `traffic`'s: its phase orders moved past the
/// last one there.
fn append(traffic: &mut Traffic, later: Traffic) {
    let next = traffic
        .transfers
        .iter()
        .map(|t| t.phase.order + 1)
        .max()
        .unwrap_or(0);
    traffic
        .transfers
        .extend(later.transfers.into_iter().map(|mut t| {
            t.phase.order += next;
            t
        }));
}

/// `traffic`'s records into `combined`, each counted `count` times.
fn add_counted(combined: &mut Traffic, traffic: &Traffic, count: u64) {
    combined.transfers.extend(
        traffic
            .transfers
            .iter()
            .map(|t| crate::collectives::Transfer {
                bytes: t.bytes * count,
                ..*t
            }),
    );
}
