//! The device mesh a training run is laid out on, and the strategy that
//! splits a model over it.
//!
//! A mesh has named axes, as a `jax.sharding.Mesh` does: `data` (replicas
//! that hold the same parameters and reduce their gradients), `fsdp` (the
//! axis parameters, gradients and optimizer state are sharded over),
//! `tensor` (tensors split along one of their dimensions), `expert` (a
//! mixture's experts split over devices, the rest of the model sharded
//! over it as over `fsdp`) and `stage` (pipeline stages, each holding a
//! run of the layers). The last three need a model that declares its
//! splits (its heads, experts and layers: [`crate::step_model`]); flat
//! `--params` tensors take `data` and `fsdp` only. Each axis is made of whole physical
//! axes of the pod: torus dimensions (ICI) or the slices of a multislice
//! pod (DCN), as JAX's `mesh_utils.create_device_mesh` assigns them
//! without splitting a physical axis.
//!
//! **Strategies.** Every strategy shards over the `fsdp` axis and
//! replicates over the `data` axis (HSDP, MaxText's layout). With `F`
//! devices on `fsdp`, `N` on the mesh and a model of `P` elements:
//!
//! * `replicated` (ZeRO-1): parameters and gradients whole on every
//!   device. The state is sharded over the whole mesh (`P/N` per slot):
//!   the all-reduce of a gradient shard over `data` is split into its
//!   reduce-scatter and its all-gather with the update between them, as
//!   weight-update sharding runs it, so with `data = 1` this is the step
//!   `cost_model::replicated` models and the pod runs.
//! * `zero2`: gradients sharded too (`P/F`); each bucket's gradient is
//!   reduce-scattered over `fsdp` as it is produced, so a device holds its
//!   gradient shard plus the bucket in flight; the shard is all-reduced over
//!   `data`, updated (state `P/F` per slot), and the parameters
//!   all-gathered over `fsdp`.
//! * `fsdp` (ZeRO-3): parameters, gradients and state at `P/F`; each
//!   bucket's parameters are all-gathered over `fsdp` before its forward
//!   use and again before its backward use and freed after each, with up
//!   to `prefetch` gathers ahead of the use (`prefetch + 1` gathered
//!   buckets in flight); gradients reduce-scattered over `fsdp`,
//!   all-reduced over `data`, updated; no all-gather after the update.
//!
//! A mesh with `data > 1` is hybrid. The default ([`Mesh::default_for`])
//! is MaxText's `ici_fsdp_parallelism=-1`, `dcn_data_parallelism=-1`:
//! `fsdp` over every chip of a slice (ICI), `data` over the slices (DCN).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::topology::Topology;

pub use super::mesh_error::MeshError;

/// How a model's parameters, gradients and optimizer state are split over
/// the mesh's `fsdp` axis (and replicated over its `data` axis).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// ZeRO stage 1 (the weight-update sharding of Xu et al. 2020): every
    /// device holds every parameter and every gradient; the optimizer state
    /// is sharded.
    #[default]
    Replicated,
    /// ZeRO stage 2: gradients are sharded too, reduce-scattered bucket by
    /// bucket as they are produced.
    Zero2,
    /// ZeRO stage 3 / PyTorch FSDP: parameters, gradients and state are all
    /// sharded; each bucket's parameters are all-gathered before use and
    /// freed after, its gradients reduce-scattered.
    Fsdp,
}

impl Strategy {
    /// Every strategy, least sharded first.
    pub const ALL: [Strategy; 3] = [Strategy::Replicated, Strategy::Zero2, Strategy::Fsdp];

    /// The name the CLI and the JSON report use.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Replicated => "replicated",
            Strategy::Zero2 => "zero2",
            Strategy::Fsdp => "fsdp",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A strategy name that is not one of [`Strategy::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown strategy `{0}` (expected replicated, zero2 or fsdp){near}",
    near = strategy_near(.0)
)]
pub struct UnknownStrategy(pub String);

/// The did-you-mean for an unknown strategy: ZeRO's stage names mean
/// the strategy that shards as that stage does (`zero3` is fsdp, `zero1`
/// replicated), which a spelling distance would miss.
fn strategy_near(name: &str) -> String {
    let stage = match name.to_ascii_lowercase().replace(['-', '_'], "").as_str() {
        "zero1" => Some("replicated"),
        "zero3" => Some("fsdp"),
        _ => None,
    };
    match stage {
        Some(strategy) => format!("; did you mean `{strategy}`?"),
        None => crate::error::did_you_mean(name, Strategy::ALL.map(Strategy::name)),
    }
}

impl FromStr for Strategy {
    type Err = UnknownStrategy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Strategy::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownStrategy(s.to_string()))
    }
}

/// The name of a mesh axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MeshAxisName {
    /// Data parallelism: replicas of the (sharded) model.
    Data,
    /// Pipeline stages: each holds `layers/stage` of the layers, and the
    /// microbatches pass from stage to stage (MaxText's `stage`).
    Stage,
    /// The axis a strategy shards the model over.
    Fsdp,
    /// Tensor parallelism: tensors split along a declared dimension.
    Tensor,
    /// Expert parallelism: a mixture's experts split over its devices, its
    /// tokens sent to them and back by all-to-alls; every other weight
    /// sharded over it as over `fsdp` (MaxText's `expert`).
    Expert,
}

impl MeshAxisName {
    /// Every axis name, outermost first (the order a mesh lists them in,
    /// MaxText's `mesh_axes` order): the outer axes take the slower links
    /// when a mesh is laid out ([`Mesh::lay_out`]).
    pub const ALL: [MeshAxisName; 5] = [
        MeshAxisName::Data,
        MeshAxisName::Stage,
        MeshAxisName::Fsdp,
        MeshAxisName::Tensor,
        MeshAxisName::Expert,
    ];

    /// `data`, `stage`, `fsdp`, `tensor`, `expert`.
    pub fn name(self) -> &'static str {
        match self {
            MeshAxisName::Data => "data",
            MeshAxisName::Stage => "stage",
            MeshAxisName::Fsdp => "fsdp",
            MeshAxisName::Tensor => "tensor",
            MeshAxisName::Expert => "expert",
        }
    }

    /// Whether a mesh lists the axis when its size is 1: `data`, `fsdp`
    /// and `tensor` always (the form every report has used), `stage` and
    /// `expert` only when used.
    pub fn always_listed(self) -> bool {
        matches!(
            self,
            MeshAxisName::Data | MeshAxisName::Fsdp | MeshAxisName::Tensor
        )
    }

    /// Whether the axis splits a model by what its tensors declare (heads,
    /// experts, layers): flat `--params` tensors cannot use it.
    pub fn needs_declared_splits(self) -> bool {
        matches!(
            self,
            MeshAxisName::Tensor | MeshAxisName::Expert | MeshAxisName::Stage
        )
    }
}

impl fmt::Display for MeshAxisName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A physical axis of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PhysicalAxis {
    /// Torus dimension `d` of a slice (ICI).
    Torus(usize),
    /// The slices of a multislice pod (DCN).
    Slices,
}

/// One named axis of a laid-out mesh.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeshAxis {
    /// Its name.
    pub name: MeshAxisName,
    /// Devices along it.
    pub size: usize,
    /// The physical axes it is made of (empty for a size-1 axis), whose
    /// extents multiply to `size`.
    pub physical: Vec<PhysicalAxis>,
}

/// A mesh laid out on a pod: every named axis, outermost first, with the
/// physical axes behind it; every physical axis of extent above 1 belongs
/// to exactly one named axis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mesh {
    /// The axes, in [`MeshAxisName::ALL`] order: `data`, `fsdp` and
    /// `tensor` always (size 1 when unused), `stage` and `expert` when
    /// above 1 ([`MeshAxisName::always_listed`]).
    pub axes: Vec<MeshAxis>,
}

/// A mesh's axis sizes before it is laid out on a pod: what a
/// configuration names (`data=2,fsdp=4` is `{data: 2, fsdp: 4, tensor: 1}`,
/// `stage` and `expert` 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MeshSizes {
    /// Devices along `data`.
    pub data: usize,
    /// Devices along `fsdp`.
    pub fsdp: usize,
    /// Devices along `tensor`.
    pub tensor: usize,
    /// Devices along `expert`.
    #[serde(default = "one")]
    pub expert: usize,
    /// Devices along `stage`.
    #[serde(default = "one")]
    pub stage: usize,
}

/// A size-1 axis, what a stored mesh without the axis had.
fn one() -> usize {
    1
}

impl MeshSizes {
    /// `data`, `fsdp` and `tensor`, with `expert` and `stage` 1.
    pub fn new(data: usize, fsdp: usize, tensor: usize) -> MeshSizes {
        MeshSizes {
            data,
            fsdp,
            tensor,
            expert: 1,
            stage: 1,
        }
    }

    /// The sizes in [`MeshAxisName::ALL`] order.
    pub fn in_order(self) -> [usize; 5] {
        MeshAxisName::ALL.map(|a| self.of(a))
    }

    /// The size of `axis`.
    pub fn of(self, axis: MeshAxisName) -> usize {
        match axis {
            MeshAxisName::Data => self.data,
            MeshAxisName::Stage => self.stage,
            MeshAxisName::Fsdp => self.fsdp,
            MeshAxisName::Tensor => self.tensor,
            MeshAxisName::Expert => self.expert,
        }
    }

    /// The sizes `in_order` gives.
    pub fn from_order(sizes: [usize; 5]) -> MeshSizes {
        MeshSizes {
            data: sizes[0],
            stage: sizes[1],
            fsdp: sizes[2],
            tensor: sizes[3],
            expert: sizes[4],
        }
    }

    /// Lays the sizes out on `topology` ([`Mesh::lay_out`]) for flat
    /// tensors: an axis that needs declared splits (`tensor`, `expert`,
    /// `stage`) above 1 is refused, as [`Mesh::parse`] refuses it.
    pub fn lay_out(self, topology: &Topology) -> Result<Mesh, MeshError> {
        self.refuse_undeclared_splits(&pod_shape(topology))?;
        Mesh::lay_out(self, topology)
    }

    /// The first axis that splits what a model declares (`tensor`,
    /// `expert`, `stage`) above 1, refused on `pod` for flat tensors.
    pub(super) fn refuse_undeclared_splits(self, pod: &str) -> Result<(), MeshError> {
        match MeshAxisName::ALL
            .into_iter()
            .find(|&axis| axis.needs_declared_splits() && self.of(axis) > 1)
        {
            Some(axis) => Err(MeshError::NeedsModel {
                axis,
                size: self.of(axis),
                pod: pod.to_string(),
            }),
            None => Ok(()),
        }
    }

    /// Lays the sizes out on `topology` for a model whose tensors declare
    /// their splits (a transformer's heads, experts and layers,
    /// [`crate::step_model`]): every axis is laid out.
    pub fn lay_out_split(self, topology: &Topology) -> Result<Mesh, MeshError> {
        Mesh::lay_out_splitting_slices(self, topology)
    }
}

impl Mesh {
    /// The axes' sizes.
    pub fn sizes(&self) -> MeshSizes {
        MeshSizes::from_order(MeshAxisName::ALL.map(|a| self.size(a)))
    }

    /// The axis called `name`.
    pub fn axis(&self, name: MeshAxisName) -> Option<&MeshAxis> {
        self.axes.iter().find(|a| a.name == name)
    }

    /// Devices along `name` (1 if the mesh does not use it).
    pub fn size(&self, name: MeshAxisName) -> usize {
        self.axis(name).map_or(1, |a| a.size)
    }

    /// Devices in the mesh.
    pub fn devices(&self) -> usize {
        self.axes.iter().map(|a| a.size).product()
    }

    /// Devices holding the same slice of every tensor: the mesh without its
    /// `tensor` axis (each holds another slice of every weight) and its
    /// `stage` axis (each holds other layers), over which one shard's state
    /// is kept. The `expert` axis stays in: it shards the rest of the model
    /// as `fsdp` does ([`super::strategy::bucket_plan`]).
    pub fn devices_per_tensor_shard(&self) -> usize {
        self.devices() / (self.size(MeshAxisName::Tensor) * self.size(MeshAxisName::Stage)).max(1)
    }

    /// Devices a bucket's state is sharded over under fsdp and zero2: the
    /// `fsdp` axis with the `expert` axis (the experts' weights are split
    /// over `expert` and sharded over `fsdp`; every other weight is sharded
    /// over both).
    pub fn shard_devices(&self) -> usize {
        (self.size(MeshAxisName::Fsdp) * self.size(MeshAxisName::Expert)).max(1)
    }
}

impl fmt::Display for Mesh {
    /// `data=2,fsdp=64,tensor=1` (with `stage` and `expert` when used),
    /// the form `--mesh` takes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, a) in self.axes.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}={}", a.name, a.size)?;
        }
        Ok(())
    }
}

impl PhysicalAxis {
    /// `axis0` for torus dimension 0, `dcn` for the slices: the suffix the
    /// step's phase keys use ([`crate::collectives::pass_name`]).
    pub fn key(self) -> String {
        match self {
            PhysicalAxis::Torus(d) => format!("axis{d}"),
            PhysicalAxis::Slices => "dcn".into(),
        }
    }
}

impl fmt::Display for PhysicalAxis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key())
    }
}

/// The physical axes of `topology` a mesh is laid out on, with their
/// extents: every torus dimension of extent above 1, then the slices of a
/// multislice pod.
pub fn physical_axes(topology: &Topology) -> Vec<(PhysicalAxis, usize)> {
    let mut axes: Vec<(PhysicalAxis, usize)> = topology.dims[..topology.ndims]
        .iter()
        .enumerate()
        .filter(|&(_, &n)| n > 1)
        .map(|(d, &n)| (PhysicalAxis::Torus(d), n as usize))
        .collect();
    if topology.slices > 1 {
        axes.push((PhysicalAxis::Slices, topology.slices as usize));
    }
    axes
}

/// `v4 4x4x8 (torus axes 4, 4, 8)`, `v5e 4x4, 2 slices (torus axes 4, 4;
/// slices 2)`: the pod's shape as a mesh error names it.
pub fn pod_shape(topology: &Topology) -> String {
    let torus: Vec<String> = topology.dims[..topology.ndims]
        .iter()
        .map(u32::to_string)
        .collect();
    if topology.slices > 1 {
        format!(
            "{} {}, {} slices (torus axes {}; slices {})",
            topology.generation,
            topology.shape_string(),
            topology.slices,
            torus.join(", "),
            topology.slices
        )
    } else {
        format!(
            "{} {} (torus axes {})",
            topology.generation,
            topology.shape_string(),
            torus.join(", ")
        )
    }
}
impl Mesh {
    /// MaxText's default: `fsdp` over every chip of a slice, `data` over
    /// the slices (1 on a one-slice pod).
    pub fn default_for(topology: &Topology) -> Mesh {
        let physical = physical_axes(topology);
        let axis = |name: MeshAxisName, keep: &dyn Fn(PhysicalAxis) -> bool| {
            let physical: Vec<PhysicalAxis> = physical
                .iter()
                .filter(|(p, _)| keep(*p))
                .map(|&(p, _)| p)
                .collect();
            let size = physical_extent(topology, &physical);
            MeshAxis {
                name,
                size,
                physical,
            }
        };
        Mesh {
            axes: vec![
                axis(MeshAxisName::Data, &|p| p == PhysicalAxis::Slices),
                axis(MeshAxisName::Fsdp, &|p| p != PhysicalAxis::Slices),
                axis(MeshAxisName::Tensor, &|_| false),
            ],
        }
    }

    /// The torus dimensions of `name`'s physical axes, ascending.
    pub fn torus_axes(&self, name: MeshAxisName) -> Vec<usize> {
        self.axis(name).map_or_else(Vec::new, |a| {
            a.physical
                .iter()
                .filter_map(|p| match p {
                    PhysicalAxis::Torus(d) => Some(*d),
                    PhysicalAxis::Slices => None,
                })
                .collect()
        })
    }

    /// Whether `name` spans the slices (its collectives cross the DCN).
    pub fn crosses_slices(&self, name: MeshAxisName) -> bool {
        self.axis(name)
            .is_some_and(|a| a.physical.contains(&PhysicalAxis::Slices))
    }

    /// Checks that this mesh is laid out on `topology`: every physical axis
    /// of extent above 1 in exactly one named axis, and each axis's size
    /// the product of its physical axes' extents.
    pub fn check_on(&self, topology: &Topology) -> Result<(), MeshError> {
        // Named only on a refusal: a model's step checks its mesh often.
        let pod = || pod_shape(topology);
        let physical = physical_axes(topology);
        let mut seen: Vec<PhysicalAxis> = Vec::new();
        let mut slice_product = 1usize;
        for a in &self.axes {
            let known = a.physical.iter().all(|p| {
                physical.iter().any(|(q, _)| q == p)
                    && (*p == PhysicalAxis::Slices || !seen.contains(p))
            });
            let torus = self.torus_extent(a.name, topology);
            let factor = a.size / torus.max(1);
            let sized = if a.physical.contains(&PhysicalAxis::Slices) {
                torus > 0 && a.size.is_multiple_of(torus) && factor > 1
            } else {
                torus == a.size
            };
            if !known || !sized {
                return Err(MeshError::NotWholeAxes {
                    axis: a.name,
                    size: a.size,
                    pod: pod(),
                });
            }
            if a.physical.contains(&PhysicalAxis::Slices) {
                slice_product = slice_product.saturating_mul(factor);
            }
            seen.extend(&a.physical);
        }
        seen.sort();
        seen.dedup();
        let slices = topology.slices.max(1) as usize;
        if seen.len() != physical.len()
            || (slices > 1 && slice_product != slices)
            || self.devices() != topology.num_devices() as usize
        {
            return Err(MeshError::Product {
                mesh: self.to_string(),
                product: self.devices() as u128,
                devices: topology.num_devices() as usize,
                pod: pod(),
            });
        }
        Ok(())
    }

    /// The extents of `name`'s torus axes on `topology`, multiplied (1
    /// for an axis with none).
    pub fn torus_extent(&self, name: MeshAxisName, topology: &Topology) -> usize {
        self.torus_axes(name)
            .iter()
            .map(|&d| topology.dims.get(d).map_or(0, |&n| n as usize))
            .product()
    }

    /// The slices along `name`: the factor of the pod's slices it holds
    /// (all of them unless the mesh shares them among axes, as
    /// [`Mesh::lay_out_splitting_slices`] may); 1 if it does not cross
    /// them.
    pub fn slices_along(&self, name: MeshAxisName, topology: &Topology) -> usize {
        if !self.crosses_slices(name) {
            return 1;
        }
        self.size(name) / self.torus_extent(name, topology).max(1)
    }

    /// Whether more than one axis holds a factor of the slices.
    pub fn shares_slices(&self) -> bool {
        self.axes
            .iter()
            .filter(|a| a.physical.contains(&PhysicalAxis::Slices))
            .count()
            > 1
    }
}

/// Extents of `physical` on `topology`, multiplied.
pub(super) fn physical_extent(topology: &Topology, physical: &[PhysicalAxis]) -> usize {
    physical
        .iter()
        .map(|p| match p {
            PhysicalAxis::Torus(d) => topology.dims.get(*d).map_or(0, |&n| n as usize),
            PhysicalAxis::Slices => topology.slices as usize,
        })
        .product()
}

#[cfg(test)]
#[path = "mesh_tests.rs"]
mod tests;
