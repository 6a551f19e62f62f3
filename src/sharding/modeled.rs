//! A sharded step's time and traffic in closed form, without data or
//! entities: for models and pods that do not fit in this machine (a
//! 175e9-parameter model on an 8960-chip v5p pod), and as the check of the
//! traffic-based model the pod's step uses.
//!
//! Over a torus of extents `n₀ × n₁ × n₂`, the reduce-scatter of a bucket
//! of `L` elements (a multiple of the device count) runs one pass per axis
//! `d`: every line of `n_d` devices reduces a segment of
//! `L_d = L / (n₀ ⋯ n_{d−1})` elements in `n_d − 1` steps, each moving a
//! `L_d / n_d`-element chunk between neighbours. A step lasts
//! `α + chunk_bytes / β` on a ring; on a line without wraparound (more
//! than two devices) the ring's closing message crosses all `n_d − 1`
//! links, so the step lasts `(n_d − 1)·α + chunk_bytes / β`. The
//! all-gather mirrors it.
//!
//! On a multislice pod of `S` slices of `C` chips, after the slice's axes
//! each device holds `L / C` elements, and one DCN exchange follows: every
//! host sends each other slice the `L / (C·S)`-element chunk of each of its
//! `h` chips, `h·L/(C·S)·elem` bytes on its own fabric rail, so the pass
//! lasts `α_dcn + h·L/(C·S)·elem / β_rail` (`β_rail` = the host's NIC
//! bandwidth / (S − 1) / oversubscription, [`Topology::fabric_link_params`]).
//!
//! These are the traffic records'
//! [`crate::collectives::Traffic::timeline`] figures for uniform links
//! (`tests/sharding.rs` compares the two), and the update and the
//! overlap are [`super::timing`]'s.

use serde::Serialize;

use super::error::ShardingError;
use super::layout::{ShardLayout, ShardPlan};
use super::timing::{BucketCost, StepPhase, StepTimeline, schedule};
use crate::collectives::{DCN_AXIS, TorusShape};
use crate::ir::DType;
use crate::topology::{DeviceId, Topology};

/// A step computed in closed form.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModeledStep {
    /// The schedule.
    pub timeline: StepTimeline,
    /// Bytes over every link.
    pub link_bytes: u64,
    /// HBM per device: its parameter replica, its state shards, its
    /// gradient buffer.
    pub hbm_bytes_per_device: u64,
    /// Buckets.
    pub buckets: usize,
    /// Devices.
    pub devices: usize,
}

/// One axis pass of `len` elements: (seconds, link bytes).
fn pass(
    n: usize,
    lines: usize,
    len: usize,
    wrap: bool,
    elem: usize,
    alpha: f64,
    beta: f64,
) -> (f64, u64) {
    if n < 2 {
        return (0.0, 0);
    }
    let chunk = (len / n * elem) as u64;
    let routed_back = !(wrap && n >= 3) && n > 2;
    let step = if routed_back {
        (n - 1) as f64 * alpha + chunk as f64 / beta
    } else {
        alpha + chunk as f64 / beta
    };
    let per_step_bytes = if routed_back {
        2 * (n as u64 - 1) * chunk
    } else {
        n as u64 * chunk
    };
    (
        (n - 1) as f64 * step,
        lines as u64 * (n as u64 - 1) * per_step_bytes,
    )
}

/// The modeled step of a model with `tensors` (names and shapes) of
/// `dtype` and an optimizer with `slots` state slots, sharded over every
/// device of `topology` in buckets of `bucket_bytes` (on a multislice pod,
/// hierarchically: the slice's axes over ICI, then one DCN exchange).
pub fn modeled_step(
    topology: &Topology,
    tensors: &[(String, Vec<usize>)],
    dtype: DType,
    slots: usize,
    bucket_bytes: usize,
) -> Result<ModeledStep, ShardingError> {
    let n = topology.ndims;
    let slices = topology.slices as usize;
    let mut dims: Vec<usize> = topology.dims[..n].iter().map(|&d| d as usize).collect();
    let mut wrap: Vec<bool> = (0..n)
        .map(|a| topology.wraparound[a] && topology.dims[a] >= 3 && topology.twist[a] == [0; 3])
        .collect();
    // A multislice pod: the slice padded to 3 axes, then the DCN pass.
    let dcn = if slices > 1 {
        let fabric = topology.dcn_fabric.ok_or_else(|| ShardingError::Devices {
            reason: format!(
                "{} has {slices} slices but no DCN fabric: a sharded step across slices \
                 reduces over the fabric",
                topology.name
            ),
        })?;
        dims.resize(3, 1);
        wrap.resize(3, false);
        Some((fabric, topology.fabric_link_params(&fabric)))
    } else {
        None
    };
    let shape = TorusShape::new(&dims, &wrap).map_err(|e| ShardingError::Devices {
        reason: e.to_string(),
    })?;
    let chips = shape.device_count();
    let devices = chips * slices;
    let plan = if dcn.is_some() {
        ShardPlan::Multislice {
            dims: dims.clone(),
            wraparound: wrap.clone(),
            slices,
        }
    } else {
        ShardPlan::Torus {
            dims: dims.clone(),
            wraparound: wrap.clone(),
        }
    };
    let layout = ShardLayout::new(
        dtype,
        tensors,
        bucket_bytes,
        (0..devices as u32).map(DeviceId).collect(),
        plan,
    )?;
    // Chips behind each host NIC (every host drives one block).
    let chips_per_host = (0..topology.chips_per_slice())
        .filter(|&d| topology.host_of(d) == 0)
        .count();
    let elem = dtype.byte_size();
    let (alpha, beta) = (
        topology.ici.latency_ns as f64 * 1e-9,
        topology.ici.bytes_per_s,
    );
    let hbm_per_s = topology.generation.spec().hbm_bytes_per_s;
    let mut lengths: Vec<usize> = layout.buckets.iter().map(|b| b.padded_len).collect();
    lengths.sort_unstable();
    lengths.dedup();
    let mut costs = Vec::with_capacity(lengths.len());
    let mut bytes_per_length = Vec::with_capacity(lengths.len());
    for &len in &lengths {
        let mut rs = Vec::with_capacity(4);
        let mut bytes = 0u64;
        let mut segment = len;
        for d in 0..dims.len() {
            let (seconds, moved) = pass(
                dims[d],
                chips / dims[d] * slices,
                segment,
                wrap[d],
                elem,
                alpha,
                beta,
            );
            rs.push((StepPhase::ReduceScatter { axis: d as u32 }, seconds));
            bytes += 2 * moved;
            segment /= dims[d];
        }
        if let Some((_, rail)) = dcn {
            // One exchange: every host sends each other slice the chunk of
            // each of its chips, `segment / slices` elements, on its own rail.
            let chunk = (chips_per_host * (segment / slices) * elem) as u64;
            let seconds = rail.latency_ns as f64 * 1e-9 + chunk as f64 / rail.bytes_per_s;
            rs.push((StepPhase::ReduceScatter { axis: DCN_AXIS }, seconds));
            let hosts = (chips / chips_per_host.max(1) * slices) as u64;
            bytes += 2 * hosts * (slices as u64 - 1) * chunk;
        }
        let ag: Vec<(StepPhase, f64)> = rs
            .iter()
            .rev()
            .map(|&(p, s)| match p {
                StepPhase::ReduceScatter { axis } => (StepPhase::AllGather { axis }, s),
                other => (other, s),
            })
            .filter(|&(_, s)| s > 0.0)
            .collect();
        let rs = rs.into_iter().filter(|&(_, s)| s > 0.0).collect();
        let shard = len / devices;
        costs.push(BucketCost {
            reduce_scatter: rs,
            update: ((3 + 2 * slots) * shard * elem) as f64 / hbm_per_s,
            all_gather: ag,
        });
        bytes_per_length.push(bytes);
    }
    let per_bucket: Vec<&BucketCost> = layout
        .buckets
        .iter()
        .map(|b| &costs[lengths.binary_search(&b.padded_len).unwrap_or(0)])
        .collect();
    let link_bytes = layout
        .buckets
        .iter()
        .map(|b| bytes_per_length[lengths.binary_search(&b.padded_len).unwrap_or(0)])
        .sum();
    let align = |b: usize| (b.max(1)).next_multiple_of(crate::memory::ALIGNMENT) as u64;
    let hbm =
        2 * align(layout.elements * elem) + slots as u64 * align(layout.shard_elements() * elem);
    Ok(ModeledStep {
        timeline: schedule(&per_bucket),
        link_bytes,
        hbm_bytes_per_device: hbm,
        buckets: layout.buckets.len(),
        devices,
    })
}
