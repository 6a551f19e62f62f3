//! A collective over one mesh axis, for a caller's own data (a layer's
//! activations, a mixture's routed tokens, a pipeline's microbatches):
//! timed with the same rounds a bucket's collectives are
//! ([`super::strategy`]), the all-to-all and the permute on the axis's
//! torus axes and its share of the slices.

use serde::Serialize;

use super::replicated::PodGeometry;
use super::strategy::{Costing, StrategyOptions, devices_error};
use crate::collectives::{LinkModel, PhaseKind, TorusShape, cost};
use crate::sharding::error::ShardingError;
use crate::sharding::mesh::{Mesh, MeshAxisName, Strategy};
use crate::topology::Topology;

/// One collective's cost over a mesh axis.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct AxisCollective {
    /// Seconds, each round as long as its slowest pass.
    pub seconds: f64,
    /// Bytes over the pod's links.
    pub link_bytes: u64,
}

/// A collective of `kind` over `mesh`'s `axis` on `topology`, `elements`
/// per device as [`crate::sharding::strategy::PlannedCollective`] counts them (the
/// gathered or pre-scatter length), each of `elem_bytes`: the same rounds
/// a bucket's collectives are timed with, for a caller's own data (a
/// transformer's activations under tensor parallelism).
pub fn axis_collective(
    topology: &Topology,
    mesh: &Mesh,
    axis: MeshAxisName,
    kind: crate::sharding::strategy::CollectiveKind,
    elements: usize,
    elem_bytes: usize,
) -> Result<AxisCollective, ShardingError> {
    mesh.check_on(topology)
        .map_err(|e| devices_error(e.to_string()))?;
    let geometry = PodGeometry::of(topology)?;
    let options = StrategyOptions {
        mesh: mesh.clone(),
        ..StrategyOptions::new(Strategy::Fsdp, topology)
    };
    let mut costing = Costing::new(
        topology,
        &options,
        (
            geometry.shape,
            geometry.rail,
            geometry.chips,
            geometry.slices,
        ),
        (elem_bytes, 0, false),
    )?;
    let rounds = costing.collective(kind, axis, (elements, elem_bytes));
    let mut out = AxisCollective::default();
    let mut group = None;
    let mut longest = 0.0f64;
    for r in &rounds {
        if group != Some(r.group) {
            out.seconds += longest;
            longest = 0.0;
            group = Some(r.group);
        }
        longest = longest.max(r.seconds);
        out.link_bytes += r.bytes;
    }
    out.seconds += longest;
    Ok(out)
}

/// The pod's links an axis collective runs on: the slice's torus, its ICI
/// link, and the DCN rail with the chips a host sends for.
struct PodLinks {
    geometry: PodGeometry,
    ici: LinkModel,
    rail: Option<LinkModel>,
    chips_per_host: usize,
}

impl PodLinks {
    /// `topology`'s links, once `mesh` is checked to lay out on it.
    fn of(topology: &Topology, mesh: &Mesh) -> Result<PodLinks, ShardingError> {
        mesh.check_on(topology)
            .map_err(|e| devices_error(e.to_string()))?;
        let geometry = PodGeometry::of(topology)?;
        let link = |latency_ns: f64, bytes_per_s: f64| {
            LinkModel::new(latency_ns * 1e-9, bytes_per_s).map_err(|e| devices_error(e.to_string()))
        };
        let ici = link(topology.ici.latency_ns as f64, topology.ici.bytes_per_s)?;
        let rail = geometry
            .rail
            .map(|r| link(r.latency_ns as f64, r.bytes_per_s))
            .transpose()?;
        let chips_per_host = (topology.chips_per_host() as usize).max(1);
        Ok(PodLinks {
            geometry,
            ici,
            rail,
            chips_per_host,
        })
    }
}

/// An all-to-all over `mesh`'s `axis` on `topology`, `elements` per device
/// (its whole send buffer, `1/n` of it to each of the axis's `n` devices),
/// each of `elem_bytes`: the axis's torus dimensions one after another,
/// each a ring all-to-all
/// ([`crate::collectives::torus_all_to_all_seconds`], the schedule
/// `collectives::torus_all_to_all` runs), then, when the axis spans the
/// slices, one exchange across them over the DCN rails
/// ([`cost::dcn_exchange_cost`], as `collectives::multislice_all_to_all`
/// runs it).
pub fn axis_all_to_all(
    topology: &Topology,
    mesh: &Mesh,
    axis: MeshAxisName,
    elements: usize,
    elem_bytes: usize,
) -> Result<AxisCollective, ShardingError> {
    let PodLinks {
        geometry,
        ici,
        rail,
        chips_per_host,
    } = PodLinks::of(topology, mesh)?;
    let torus = mesh.torus_axes(axis);
    let mut out = AxisCollective::default();
    if !torus.is_empty() {
        let dims: Vec<usize> = torus.iter().map(|&d| geometry.shape.dims()[d]).collect();
        let wrap: Vec<bool> = torus
            .iter()
            .map(|&d| geometry.shape.wraparound()[d])
            .collect();
        let group = TorusShape::new(&dims, &wrap).map_err(|e| devices_error(e.to_string()))?;
        let n = group.device_count().max(1);
        let padded = elements.next_multiple_of(n);
        out.seconds +=
            crate::collectives::torus_all_to_all_seconds(&group, padded, elem_bytes, &ici);
        let groups = (geometry.chips * geometry.slices / n) as u64;
        out.link_bytes += crate::collectives::torus_all_to_all_traffic(&group, padded, elem_bytes)
            .total_bytes()
            * groups;
    }
    if mesh.crosses_slices(axis)
        && let Some(rail) = rail
    {
        let slices = mesh.slices_along(axis, topology);
        let pass = cost::dcn_exchange_cost(
            elements.next_multiple_of(slices),
            slices,
            geometry.chips / chips_per_host,
            chips_per_host,
            elem_bytes,
            &cost::rail_for(&rail, geometry.slices, slices - 1),
            PhaseKind::AllToAll,
        );
        out.seconds += pass.seconds;
        out.link_bytes += pass.link_bytes;
    }
    Ok(out)
}

/// A collective permute over `mesh`'s `axis` on `topology`: every device
/// sends `elements` of `elem_bytes` to its successor along the axis, the
/// last to the first (a pipeline's shift from stage to stage, MaxText's
/// `ppermute` of the loop state). Over the torus one hop on each link, the
/// wrap back across the line's length when the axis has no wraparound
/// (its latency; the bytes run the other direction's links); across the
/// slices every chip of a host at once on the host's rail.
pub fn axis_permute(
    topology: &Topology,
    mesh: &Mesh,
    axis: MeshAxisName,
    elements: usize,
    elem_bytes: usize,
) -> Result<AxisCollective, ShardingError> {
    let PodLinks {
        geometry,
        ici,
        rail,
        chips_per_host,
    } = PodLinks::of(topology, mesh)?;
    let bytes = (elements * elem_bytes) as u64;
    let devices = (geometry.chips * geometry.slices) as u64;
    let mut out = AxisCollective::default();
    let torus = mesh.torus_axes(axis);
    if !torus.is_empty() {
        let hops: usize = torus
            .iter()
            .map(|&d| {
                let n = geometry.shape.dims()[d];
                if geometry.shape.wraparound()[d] {
                    1
                } else {
                    n.saturating_sub(1).max(1)
                }
            })
            .max()
            .unwrap_or(1);
        out.seconds +=
            hops as f64 * ici.latency_seconds() + bytes as f64 / ici.bandwidth_bytes_per_second();
        out.link_bytes += bytes * devices;
    }
    if mesh.crosses_slices(axis)
        && let Some(rail) = rail
    {
        // One destination: the next stage's slice, on the whole NIC.
        let rail = cost::rail_for(&rail, geometry.slices, 1);
        out.seconds += rail.message_seconds(chips_per_host as u64 * bytes, 1);
        out.link_bytes += bytes * devices;
    }
    Ok(out)
}
