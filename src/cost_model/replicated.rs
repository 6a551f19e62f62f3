//! A sharded step's time and traffic in closed form, without data or
//! entities: for models and pods that do not fit in this machine (a
//! 175e9-parameter model on an 8960-chip v5p pod), and as the check of the
//! traffic-based model the pod's step uses.
//!
//! Over a torus, a bucket's reduce-scatter and all-gather are
//! [`crate::collectives::reduce_scatter_cost`] and
//! [`crate::collectives::all_gather_cost`] over every axis: the closed
//! form of the collectives' link schedule (module
//! [`crate::collectives::cost`]), one part of the bucket per axis, each
//! part running the axes in rotated order so every round keeps every
//! axis's links busy, a ring of 3 or more chips with wraparound sending
//! half of each part each way (`(n−1)/n · V / (2β)` per pass), a line
//! without wraparound (a mesh axis, or a twisted torus's axis) running two
//! ways (`(n−1) · (V/n) / β`). A round lasts its slowest pass.
//!
//! On a multislice pod of `S` slices of `C` chips, after the slice's axes
//! each device holds `L / C` elements, and one DCN exchange follows
//! ([`crate::collectives::dcn_exchange_cost`]): every host sends each other
//! slice the `L / (C·S)`-element chunk of each of its `h` chips,
//! `h·L/(C·S)·elem` bytes on its own fabric rail, so the pass lasts
//! `α_dcn + h·L/(C·S)·elem / β_rail` (`β_rail` = the host's NIC bandwidth
//! / (S − 1) / oversubscription, [`Topology::fabric_link_params`]).
//!
//! Under the redundant recovery policy every device also sends its new
//! state shards of each bucket, `slots · L / N · elem` bytes, to its
//! successor on the snake ring after the bucket's all-gather
//! (`replicate_state`): one message each, routed, so the pass lasts
//! `h·α + bytes / β` for the longest route `h` (one link but where the
//! ring closes over a mesh axis), and each device holds a second copy of
//! its predecessor's shards in HBM. Rollback and spare-cube cost nothing
//! per step; their cost is the recovery's.
//!
//! These are the traffic records'
//! [`crate::collectives::Traffic::timeline`] figures for uniform links
//! (`tests/sharding.rs` and `tests/modeled.rs` compare the two), and the
//! update and the overlap are [`crate::sharding::timing`]'s.

use serde::Serialize;

use crate::collectives::pod::slice_torus;
use crate::collectives::{
    CollectiveCost, LinkModel, PassCost, PhaseKind, TorusShape, all_gather_cost, dcn_exchange_cost,
    reduce_scatter_cost,
};
use crate::ir::DType;
use crate::sharding::error::ShardingError;
use crate::sharding::layout::{ShardLayout, ShardPlan};
use crate::sharding::model::{RecoveryPolicy, check_recovery_policy};
use crate::sharding::timing::{BucketCost, StepPhase, StepTimeline, schedule};
use crate::topology::{DeviceId, LinkParams, Topology};

/// A step computed in closed form.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModeledStep {
    /// The schedule.
    pub timeline: StepTimeline,
    /// Bytes over every link.
    pub link_bytes: u64,
    /// HBM per device: its parameter replica, its state shards (and,
    /// under the redundant policy, its predecessor's copies), its gradient
    /// buffer.
    pub hbm_bytes_per_device: u64,
    /// The recovery policy whose per-step costs are in the figures.
    pub recovery: RecoveryPolicy,
    /// Buckets.
    pub buckets: usize,
    /// Devices.
    pub devices: usize,
}

/// The modeled step of a model with `tensors` (names and shapes) of
/// `dtype` and an optimizer with `slots` state slots, sharded over every
/// device of `topology` in buckets of `bucket_bytes` (on a multislice pod,
/// hierarchically: the slice's axes over ICI, then one DCN exchange),
/// under the default recovery policy (rollback: no per-step cost).
pub fn modeled_step(
    topology: &Topology,
    tensors: &[(String, Vec<usize>)],
    dtype: DType,
    slots: usize,
    bucket_bytes: usize,
) -> Result<ModeledStep, ShardingError> {
    modeled_step_with_recovery(
        topology,
        tensors,
        dtype,
        slots,
        bucket_bytes,
        RecoveryPolicy::Rollback,
    )
}

/// Each device's redundant-copy message on the snake ring the model's
/// layout uses ([`ShardLayout::peers`]): (longest route in links, links
/// summed over one slice's messages).
pub(super) fn replication_routes(shape: &TorusShape) -> (u32, u64) {
    let ring = shape.snake_ring();
    if ring.len() < 2 {
        return (0, 0);
    }
    let mut longest = 0u32;
    let mut links = 0u64;
    for (at, &device) in ring.iter().enumerate() {
        // A message to a neighbour is one record; a longer route one per link.
        let hops = shape.path(device, ring[(at + 1) % ring.len()]).len().max(1);
        longest = longest.max(hops as u32);
        links += hops as u64;
    }
    (longest, links)
}

/// [`modeled_step`] under `recovery`: the redundant policy's copies cost
/// HBM and a `replicate_state` pass per bucket (module docs); a policy the
/// pod cannot apply (spare-cube without spare cubes) is the error building
/// the real model gives.
pub fn modeled_step_with_recovery(
    topology: &Topology,
    tensors: &[(String, Vec<usize>)],
    dtype: DType,
    slots: usize,
    bucket_bytes: usize,
    recovery: RecoveryPolicy,
) -> Result<ModeledStep, ShardingError> {
    check_recovery_policy(topology, recovery)?;
    let geometry = StepGeometry::of(topology, tensors, dtype, bucket_bytes)?;
    let layout = &geometry.layout;
    let devices = geometry.devices;
    let elem = dtype.byte_size();
    let redundant = recovery == RecoveryPolicy::Redundant && devices > 1;
    let costs = BucketCosts::of(topology, &geometry, slots, elem, redundant)?;
    let mut lengths: Vec<usize> = layout.buckets.iter().map(|b| b.padded_len).collect();
    lengths.sort_unstable();
    lengths.dedup();
    let (costs, bytes_per_length): (Vec<BucketCost>, Vec<u64>) =
        lengths.iter().map(|&len| costs.bucket(len)).unzip();
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
    let copies = if redundant { 2 } else { 1 };
    let hbm = 2 * align(layout.elements * elem)
        + copies * slots as u64 * align(layout.shard_elements() * elem);
    Ok(ModeledStep {
        timeline: schedule(&per_bucket),
        link_bytes,
        hbm_bytes_per_device: hbm,
        recovery,
        buckets: layout.buckets.len(),
        devices,
    })
}

/// The pod as the modeled step lays the model out: the slice's rings and
/// lines as the collectives lay them (padded to three axes on a
/// multislice pod, whose DCN pass runs on `rail`), and the layout.
pub(super) struct StepGeometry {
    pub(super) shape: TorusShape,
    pub(super) rail: Option<LinkParams>,
    pub(super) chips: usize,
    pub(super) slices: usize,
    pub(super) devices: usize,
    pub(super) layout: ShardLayout,
}

/// The pod as the collectives lay it out: the slice's torus (padded to 3
/// axes on a multislice pod), the DCN rail, and the devices per slice.
pub(super) struct PodGeometry {
    pub(super) shape: TorusShape,
    pub(super) rail: Option<LinkParams>,
    pub(super) chips: usize,
    pub(super) slices: usize,
    dims: Vec<usize>,
    wrap: Vec<bool>,
}

impl PodGeometry {
    pub(super) fn of(topology: &Topology) -> Result<PodGeometry, ShardingError> {
        let slices = topology.slices as usize;
        // The slice's rings and lines as the collectives lay them.
        let slice = slice_torus(topology).map_err(|e| ShardingError::Devices {
            reason: e.to_string(),
        })?;
        let mut dims = slice.dims().to_vec();
        let mut wrap = slice.wraparound().to_vec();
        // A multislice pod: the slice padded to 3 axes, then the DCN pass.
        let rail = if slices > 1 {
            let fabric = topology.dcn_fabric.ok_or_else(|| ShardingError::Devices {
                reason: format!(
                    "{} has {slices} slices but no DCN fabric: a sharded step across slices \
                     reduces over the fabric",
                    topology.name
                ),
            })?;
            dims.resize(3, 1);
            wrap.resize(3, false);
            Some(topology.fabric_link_params(&fabric))
        } else {
            None
        };
        let shape = TorusShape::new(&dims, &wrap).map_err(|e| ShardingError::Devices {
            reason: e.to_string(),
        })?;
        Ok(PodGeometry {
            chips: shape.device_count(),
            shape,
            rail,
            slices,
            dims,
            wrap,
        })
    }
}

impl StepGeometry {
    pub(super) fn of(
        topology: &Topology,
        tensors: &[(String, Vec<usize>)],
        dtype: DType,
        bucket_bytes: usize,
    ) -> Result<StepGeometry, ShardingError> {
        let PodGeometry {
            shape,
            rail,
            chips,
            slices,
            dims,
            wrap,
        } = PodGeometry::of(topology)?;
        let devices = chips * slices;
        let plan = if rail.is_some() {
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
        Ok(StepGeometry {
            shape,
            rail,
            chips,
            slices,
            devices,
            layout,
        })
    }
}

/// What one bucket's passes cost on a [`StepGeometry`]: the links' and
/// HBM's figures, and the redundant copies' routes.
struct BucketCosts<'a> {
    geometry: &'a StepGeometry,
    slots: usize,
    elem: usize,
    ici: LinkModel,
    rail: Option<LinkModel>,
    hbm_per_s: f64,
    /// Chips behind each host NIC (every host drives one block).
    chips_per_host: usize,
    redundant: bool,
    replication_hops: u32,
    replication_links: u64,
}

/// A link's figures as the collectives' model.
fn link_model(latency_ns: u64, bytes_per_s: f64) -> Result<LinkModel, ShardingError> {
    LinkModel::new(latency_ns as f64 * 1e-9, bytes_per_s).map_err(|e| ShardingError::Devices {
        reason: e.to_string(),
    })
}

/// A collective's rounds as the step's passes, dropping what takes no time.
fn step_rounds(cost: &CollectiveCost) -> Vec<Vec<(StepPhase, f64)>> {
    cost.rounds
        .iter()
        .map(|round| {
            round
                .iter()
                .filter(|p| p.seconds > 0.0)
                .map(step_pass)
                .collect::<Vec<_>>()
        })
        .filter(|round| !round.is_empty())
        .collect()
}

fn step_pass(p: &PassCost) -> (StepPhase, f64) {
    let phase = match p.kind {
        PhaseKind::AllGather => StepPhase::AllGather { axis: p.axis },
        _ => StepPhase::ReduceScatter { axis: p.axis },
    };
    (phase, p.seconds)
}

impl<'a> BucketCosts<'a> {
    fn of(
        topology: &Topology,
        geometry: &'a StepGeometry,
        slots: usize,
        elem: usize,
        redundant: bool,
    ) -> Result<BucketCosts<'a>, ShardingError> {
        let chips_per_host = topology.chips_per_host() as usize;
        let (replication_hops, replication_links) = if redundant {
            let (hops, links) = replication_routes(&geometry.shape);
            (hops, links * geometry.slices as u64)
        } else {
            (0, 0)
        };
        let rail = geometry
            .rail
            .map(|r| link_model(r.latency_ns, r.bytes_per_s))
            .transpose()?;
        Ok(BucketCosts {
            geometry,
            slots,
            elem,
            ici: link_model(topology.ici.latency_ns, topology.ici.bytes_per_s)?,
            rail,
            hbm_per_s: topology.generation.spec().hbm_bytes_per_s,
            chips_per_host,
            redundant,
            replication_hops,
            replication_links,
        })
    }

    /// A bucket of `len` padded elements: its passes and link bytes.
    fn bucket(&self, len: usize) -> (BucketCost, u64) {
        let StepGeometry {
            shape,
            chips,
            slices,
            devices,
            ..
        } = self.geometry;
        let (chips, slices, elem) = (*chips, *slices, self.elem);
        let axes: Vec<usize> = (0..shape.dims().len()).collect();
        // Every slice at once over ICI: the slice's traffic, once per slice.
        let mut rs = reduce_scatter_cost(shape, &axes, len, elem, &self.ici);
        let mut ag = all_gather_cost(shape, &axes, len, elem, &self.ici);
        for pass in rs.rounds.iter_mut().chain(&mut ag.rounds).flatten() {
            pass.link_bytes *= slices as u64;
        }
        if let Some(rail) = &self.rail {
            let hosts = chips / self.chips_per_host.max(1);
            let exchange = |kind| {
                dcn_exchange_cost(
                    len / chips,
                    slices,
                    hosts,
                    self.chips_per_host,
                    elem,
                    rail,
                    kind,
                )
            };
            rs.rounds.push(vec![exchange(PhaseKind::ReduceScatter)]);
            ag.rounds.insert(0, vec![exchange(PhaseKind::AllGather)]);
        }
        let mut bytes = rs.link_bytes() + ag.link_bytes();
        let mut ag_rounds = step_rounds(&ag);
        let shard = len / devices;
        if self.redundant {
            // After the bucket's all-gather, on the same stream.
            let copy = (self.slots * shard * elem) as u64;
            ag_rounds.push(vec![(
                StepPhase::ReplicateState,
                f64::from(self.replication_hops) * self.ici.latency_seconds()
                    + copy as f64 / self.ici.bandwidth_bytes_per_second(),
            )]);
            bytes += copy * self.replication_links;
        }
        let cost = BucketCost {
            reduce_scatter: step_rounds(&rs),
            update: ((3 + 2 * self.slots) * shard * elem) as f64 / self.hbm_per_s,
            all_gather: ag_rounds,
        };
        (cost, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{load_preset, parse_topology};

    fn adam(topology: &Topology, params: usize, recovery: RecoveryPolicy) -> ModeledStep {
        let tensors = vec![("w".to_string(), vec![params])];
        modeled_step_with_recovery(topology, &tensors, DType::F32, 2, 1 << 20, recovery).unwrap()
    }

    #[test]
    fn redundant_copies_cost_a_second_state_copy_and_a_replication_pass() {
        let topology = load_preset("v5e-16").unwrap();
        let rollback = adam(&topology, 160_000, RecoveryPolicy::Rollback);
        let redundant = adam(&topology, 160_000, RecoveryPolicy::Redundant);
        // Two slots of 10,000 elements per device (one bucket of 640 KB).
        assert_eq!(
            redundant.hbm_bytes_per_device - rollback.hbm_bytes_per_device,
            2 * 40_000
        );
        let replicate = redundant.timeline.phases["replicate_state"];
        // The v5e-16 is a 4x4 mesh: the snake ring closes over the 3 links
        // of axis 1, the longest route, 3α + 80 KB / β.
        let ici = &topology.ici;
        let expected = 3.0 * ici.latency_ns as f64 * 1e-9 + 80_000.0 / ici.bytes_per_s;
        assert!(
            (replicate - expected).abs() <= 1e-15,
            "{replicate} vs {expected}"
        );
        // 16 messages of 80 KB: 15 of one link, the closing one of 3.
        assert_eq!(redundant.link_bytes - rollback.link_bytes, 18 * 80_000);
        assert!(
            (redundant.timeline.step_seconds - rollback.timeline.step_seconds - replicate).abs()
                <= 1e-15
        );
        assert!(!rollback.timeline.phases.contains_key("replicate_state"));
        assert_eq!(
            adam(&topology, 160_000, RecoveryPolicy::Redundant).recovery,
            RecoveryPolicy::Redundant
        );
    }

    #[test]
    fn spare_cube_without_spares_is_the_error_a_real_model_gives() {
        let topology = load_preset("v5e-16").unwrap();
        let tensors = vec![("w".to_string(), vec![1000])];
        let err = modeled_step_with_recovery(
            &topology,
            &tensors,
            DType::F32,
            2,
            1 << 20,
            RecoveryPolicy::SpareCube,
        )
        .unwrap_err();
        assert!(matches!(err, ShardingError::NoSpareCubes { .. }), "{err}");
        let cubes = parse_topology(
            "Pod(name: \"c\", generation: \"v4\", shape: \"4x4x8\", cubes: (spares: 1))",
            "c.ron",
        )
        .unwrap();
        let spare = adam(&cubes, 1 << 14, RecoveryPolicy::SpareCube);
        assert_eq!(
            spare,
            ModeledStep {
                recovery: RecoveryPolicy::SpareCube,
                ..adam(&cubes, 1 << 14, RecoveryPolicy::Rollback)
            }
        );
    }

    #[test]
    fn a_twisted_axis_runs_two_way_lines_at_the_plain_torus_s_bytes() {
        let plain = parse_topology(
            "Pod(name: \"p\", generation: \"v4\", shape: \"4x4x8\")",
            "p.ron",
        )
        .unwrap();
        let twisted = parse_topology(
            "Pod(name: \"t\", generation: \"v4\", shape: \"4x4x8\", twist: \"twisted\")",
            "t.ron",
        )
        .unwrap();
        let params = 128 * 1000;
        let (p, t) = (
            adam(&plain, params, RecoveryPolicy::Rollback),
            adam(&twisted, params, RecoveryPolicy::Rollback),
        );
        // 2(N−1)/N of the model per device: 2 · 127 · 512 KB over all links.
        assert_eq!(t.link_bytes, 2 * 127 * params as u64 * 4);
        assert_eq!(t.link_bytes, p.link_bytes);
        // The plain torus's rings send half of each part each way; the
        // twisted axes' lines all of it one way at a time.
        assert!(t.timeline.step_seconds > p.timeline.step_seconds);
        // A mesh line costs what a ring does too.
        let mesh = parse_topology(
            "Pod(name: \"m\", generation: \"v4\", shape: \"4x4x8\", wraparound: [false, false, false])",
            "m.ron",
        )
        .unwrap();
        assert_eq!(
            adam(&mesh, params, RecoveryPolicy::Rollback).link_bytes,
            p.link_bytes
        );
    }
}
