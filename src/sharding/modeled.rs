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
//! all-gather mirrors it. These are the traffic records'
//! [`crate::collectives::Traffic::timeline`] figures for uniform links
//! (`tests/sharding.rs` compares the two), and the update and the
//! overlap are [`super::timing`]'s.

use serde::Serialize;

use super::error::ShardingError;
use super::layout::{ShardLayout, ShardPlan};
use super::timing::{BucketCost, StepPhase, StepTimeline, schedule};
use crate::collectives::TorusShape;
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
/// device of `topology`'s slice in buckets of `bucket_bytes`.
pub fn modeled_step(
    topology: &Topology,
    tensors: &[(String, Vec<usize>)],
    dtype: DType,
    slots: usize,
    bucket_bytes: usize,
) -> Result<ModeledStep, ShardingError> {
    if topology.slices != 1 {
        return Err(ShardingError::Devices {
            reason: format!(
                "{} has {} slices; a sharded step spans one slice's torus",
                topology.name, topology.slices
            ),
        });
    }
    let n = topology.ndims;
    let dims: Vec<usize> = topology.dims[..n].iter().map(|&d| d as usize).collect();
    let wrap: Vec<bool> = (0..n)
        .map(|a| topology.wraparound[a] && topology.dims[a] >= 3)
        .collect();
    let shape = TorusShape::new(&dims, &wrap).map_err(|e| ShardingError::Devices {
        reason: e.to_string(),
    })?;
    let devices = shape.device_count();
    let layout = ShardLayout::new(
        dtype,
        tensors,
        bucket_bytes,
        (0..devices as u32).map(DeviceId).collect(),
        ShardPlan::Torus {
            dims: dims.clone(),
            wraparound: wrap.clone(),
        },
    )?;
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
        let mut rs = Vec::with_capacity(n);
        let mut bytes = 0u64;
        let mut segment = len;
        for d in 0..n {
            let (seconds, moved) = pass(
                dims[d],
                devices / dims[d],
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
