//! The device mesh a training run is laid out on, and the strategy that
//! splits a model over it.
//!
//! A mesh has named axes, as a `jax.sharding.Mesh` does: `data` (replicas
//! that hold the same parameters and reduce their gradients), `fsdp` (the
//! axis parameters, gradients and optimizer state are sharded over) and
//! `tensor` (tensors split along one of their dimensions, which only a model
//! that declares its splits can use). Each axis is made of whole physical
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
//!   `sharding::modeled` models and the pod runs.
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
    /// The axis a strategy shards the model over.
    Fsdp,
    /// Tensor parallelism: tensors split along a declared dimension.
    Tensor,
}

impl MeshAxisName {
    /// Every axis name, outermost first (the order a mesh lists them in).
    pub const ALL: [MeshAxisName; 3] =
        [MeshAxisName::Data, MeshAxisName::Fsdp, MeshAxisName::Tensor];

    /// `data`, `fsdp`, `tensor`.
    pub fn name(self) -> &'static str {
        match self {
            MeshAxisName::Data => "data",
            MeshAxisName::Fsdp => "fsdp",
            MeshAxisName::Tensor => "tensor",
        }
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
    /// The axes, in [`MeshAxisName::ALL`] order, each present (size 1 when
    /// unused).
    pub axes: Vec<MeshAxis>,
}

/// A mesh's axis sizes before it is laid out on a pod: what a
/// configuration names (`data=2,fsdp=4` is `{data: 2, fsdp: 4, tensor: 1}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MeshSizes {
    /// Devices along `data`.
    pub data: usize,
    /// Devices along `fsdp`.
    pub fsdp: usize,
    /// Devices along `tensor`.
    pub tensor: usize,
}

impl MeshSizes {
    /// Lays the sizes out on `topology` ([`Mesh::lay_out`]); `tensor`
    /// above 1 is refused, as [`Mesh::parse`] refuses it.
    pub fn lay_out(self, topology: &Topology) -> Result<Mesh, MeshError> {
        if self.tensor > 1 {
            return Err(MeshError::Tensor {
                size: self.tensor,
                pod: pod_shape(topology),
            });
        }
        Mesh::lay_out([self.data, self.fsdp, self.tensor], topology)
    }

    /// Lays the sizes out on `topology` for a model whose tensors declare
    /// their split along `tensor` (a transformer's heads and MLP,
    /// [`crate::step_model`]): `tensor` above 1 is laid out like any axis.
    pub fn lay_out_split(self, topology: &Topology) -> Result<Mesh, MeshError> {
        Mesh::lay_out([self.data, self.fsdp, self.tensor], topology)
    }
}

impl Mesh {
    /// The axes' sizes.
    pub fn sizes(&self) -> MeshSizes {
        MeshSizes {
            data: self.size(MeshAxisName::Data),
            fsdp: self.size(MeshAxisName::Fsdp),
            tensor: self.size(MeshAxisName::Tensor),
        }
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
    /// `tensor` axis, over which one tensor-parallel shard's state is kept.
    pub fn devices_per_tensor_shard(&self) -> usize {
        self.devices() / self.size(MeshAxisName::Tensor).max(1)
    }
}

impl fmt::Display for Mesh {
    /// `data=2,fsdp=64,tensor=1`, the form `--mesh` takes.
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

/// Why a `--mesh` text does not give a mesh on a pod. Each names the axis
/// (or entry) and the pod's shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MeshError {
    /// An entry that is not `AXIS=SIZE`.
    #[error("mesh entry `{entry}` is not AXIS=SIZE (as in data=2,fsdp=64) on {pod}")]
    Malformed {
        /// The entry as given.
        entry: String,
        /// The pod's shape.
        pod: String,
    },
    /// An axis name that is not data, fsdp or tensor.
    #[error(
        "mesh axis `{axis}` is unknown on {pod}: the axes are data, fsdp and tensor{}",
        crate::error::did_you_mean(axis, ["data", "fsdp", "tensor"])
    )]
    UnknownAxis {
        /// The name as given.
        axis: String,
        /// The pod's shape.
        pod: String,
    },
    /// An axis given twice.
    #[error(
        "mesh axis {axis} is named twice ({axis}={first} and {axis}={second}) on {pod}: give each axis once"
    )]
    Repeated {
        /// The axis.
        axis: MeshAxisName,
        /// Its first size as given.
        first: String,
        /// Its second size as given.
        second: String,
        /// The pod's shape.
        pod: String,
    },
    /// A size that is 0 or not a whole number (nor -1).
    #[error(
        "mesh axis {axis}={value}: a size is a whole number from 1, or -1 for the rest of {pod}"
    )]
    BadSize {
        /// The axis.
        axis: MeshAxisName,
        /// The size as given.
        value: String,
        /// The pod's shape.
        pod: String,
    },
    /// Two axes asking for the rest.
    #[error("mesh axes {first}=-1 and {second}=-1 on {pod}: at most one axis takes the rest")]
    TwoRests {
        /// The first.
        first: MeshAxisName,
        /// The second.
        second: MeshAxisName,
        /// The pod's shape.
        pod: String,
    },
    /// Sizes that do not multiply to the pod's devices.
    #[error(
        "mesh {mesh} has {product} devices but {pod} has {devices}: the axes' sizes multiply to the device count"
    )]
    Product {
        /// The sizes (the rest shown as -1).
        mesh: String,
        /// Their product.
        product: u128,
        /// The pod's devices.
        devices: usize,
        /// The pod's shape.
        pod: String,
    },
    /// The other axes' product does not divide the pod's devices.
    #[error(
        "mesh {mesh}: the other axes' {product} devices do not divide the {devices} of {pod}, so {axis}=-1 has no whole size"
    )]
    NoRest {
        /// The sizes (the rest shown as -1).
        mesh: String,
        /// The axis asking for the rest.
        axis: MeshAxisName,
        /// The other axes' product.
        product: u128,
        /// The pod's devices.
        devices: usize,
        /// The pod's shape.
        pod: String,
    },
    /// An axis size no set of whole physical axes multiplies to.
    #[error(
        "mesh axis {axis}={size} is not a product of whole axes of {pod}: JAX does not split a physical axis"
    )]
    NotWholeAxes {
        /// The axis.
        axis: MeshAxisName,
        /// Its size.
        size: usize,
        /// The pod's shape.
        pod: String,
    },
    /// Every size is a product of physical axes, but not all at once.
    #[error(
        "mesh {mesh} cannot be laid out on {pod}: each axis is a product of whole physical axes, but no assignment gives every physical axis to exactly one mesh axis"
    )]
    NoLayout {
        /// The sizes.
        mesh: String,
        /// The pod's shape.
        pod: String,
    },
    /// A tensor axis above 1.
    #[error(
        "tensor={size} needs a model that declares how its tensors split; --params gives flat tensors (on {pod})"
    )]
    Tensor {
        /// Its size.
        size: usize,
        /// The pod's shape.
        pod: String,
    },
}

/// A size as `--mesh` gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Size {
    Fixed(usize),
    Rest,
}

impl Mesh {
    /// Parses `data=2,fsdp=64` (any order; an axis left out is 1; one axis
    /// may be -1, the devices the others leave, as MaxText's -1) and lays it
    /// out on `topology` ([`Mesh::lay_out`]). `tensor` above 1 is refused:
    /// flat tensors declare no split.
    pub fn parse(text: &str, topology: &Topology) -> Result<Mesh, MeshError> {
        Mesh::parse_with(text, topology, false)
    }

    /// [`Mesh::parse`] for a model whose tensors declare their split along
    /// `tensor` ([`MeshSizes::lay_out_split`]): `tensor` above 1 is taken.
    pub fn parse_split(text: &str, topology: &Topology) -> Result<Mesh, MeshError> {
        Mesh::parse_with(text, topology, true)
    }

    fn parse_with(text: &str, topology: &Topology, split: bool) -> Result<Mesh, MeshError> {
        let pod = pod_shape(topology);
        let mut given: [Option<(Size, String)>; 3] = [None, None, None];
        for entry in text.split(',') {
            let entry = entry.trim();
            let Some((name, value)) = entry.split_once('=') else {
                return Err(MeshError::Malformed {
                    entry: entry.to_string(),
                    pod,
                });
            };
            let (name, value) = (name.trim(), value.trim());
            let Some(at) = MeshAxisName::ALL.iter().position(|a| a.name() == name) else {
                return Err(MeshError::UnknownAxis {
                    axis: name.to_string(),
                    pod,
                });
            };
            let axis = MeshAxisName::ALL[at];
            if let Some((_, first)) = &given[at] {
                return Err(MeshError::Repeated {
                    axis,
                    first: first.clone(),
                    second: value.to_string(),
                    pod,
                });
            }
            let size = match value {
                "-1" => Size::Rest,
                _ => match value.parse::<usize>() {
                    Ok(n) if n > 0 && value.bytes().all(|b| b.is_ascii_digit()) => Size::Fixed(n),
                    _ => {
                        return Err(MeshError::BadSize {
                            axis,
                            value: value.to_string(),
                            pod,
                        });
                    }
                },
            };
            given[at] = Some((size, value.to_string()));
        }
        let sizes = given.map(|g| g.map_or(Size::Fixed(1), |(s, _)| s));
        let shown = show_sizes(&sizes);
        if let Size::Fixed(n) = sizes[2]
            && n > 1
            && !split
        {
            return Err(MeshError::Tensor { size: n, pod });
        }
        let rests: Vec<usize> = (0..3).filter(|&i| sizes[i] == Size::Rest).collect();
        if let [first, second, ..] = rests[..] {
            return Err(MeshError::TwoRests {
                first: MeshAxisName::ALL[first],
                second: MeshAxisName::ALL[second],
                pod,
            });
        }
        let devices = topology.num_devices() as usize;
        let product: u128 = sizes
            .iter()
            .map(|s| match s {
                Size::Fixed(n) => *n as u128,
                Size::Rest => 1,
            })
            .product();
        let mut resolved = [0usize; 3];
        for (i, s) in sizes.iter().enumerate() {
            resolved[i] = match s {
                Size::Fixed(n) => *n,
                Size::Rest => {
                    if product == 0 || !(devices as u128).is_multiple_of(product) {
                        return Err(MeshError::NoRest {
                            mesh: shown,
                            axis: MeshAxisName::ALL[i],
                            product,
                            devices,
                            pod,
                        });
                    }
                    (devices as u128 / product) as usize
                }
            };
        }
        if rests.is_empty() && product != devices as u128 {
            return Err(MeshError::Product {
                mesh: shown,
                product,
                devices,
                pod,
            });
        }
        if resolved[2] > 1 && !split {
            return Err(MeshError::Tensor {
                size: resolved[2],
                pod,
            });
        }
        Mesh::lay_out(resolved, topology)
    }

    /// Lays out a mesh of `sizes` (data, fsdp, tensor) on `topology`: every
    /// physical axis of extent above 1 ([`physical_axes`]) goes to exactly
    /// one named axis, the extents of each multiplying to its size. Of the
    /// assignments that do, the slices go to `data` if they can, then
    /// `data` takes the outermost torus axes (the highest dimension
    /// index), as `create_hybrid_device_mesh` puts DCN outermost.
    pub fn lay_out(sizes: [usize; 3], topology: &Topology) -> Result<Mesh, MeshError> {
        let pod = pod_shape(topology);
        let devices = topology.num_devices() as usize;
        let product: u128 = sizes.iter().map(|&n| n as u128).product();
        let shown = show_sizes(&sizes.map(Size::Fixed));
        if product != devices as u128 {
            return Err(MeshError::Product {
                mesh: shown,
                product,
                devices,
                pod,
            });
        }
        // Preference order: the slices, then the torus axes outermost first.
        let mut phys = physical_axes(topology);
        phys.reverse();
        phys.sort_by_key(|&(p, _)| p != PhysicalAxis::Slices);
        let m = phys.len();
        let mut best: Option<Vec<usize>> = None;
        let mut choice = vec![0usize; m];
        for code in 0..3usize.pow(m as u32) {
            let mut c = code;
            for slot in choice.iter_mut() {
                *slot = c % 3;
                c /= 3;
            }
            let fits = (0..3).all(|axis| {
                let made: usize = (0..m)
                    .filter(|&i| choice[i] == axis)
                    .map(|i| phys[i].1)
                    .product();
                made == sizes[axis]
            });
            // Rank: data 2, fsdp 1, tensor 0, compared in preference order.
            let rank: Vec<usize> = choice.iter().map(|&a| 2 - a).collect();
            if fits
                && best
                    .as_ref()
                    .is_none_or(|b| rank > b.iter().map(|&a| 2 - a).collect())
            {
                best = Some(choice.clone());
            }
        }
        let Some(best) = best else {
            for (axis, &size) in MeshAxisName::ALL.iter().zip(&sizes) {
                if !subset_product(&phys, size) {
                    return Err(MeshError::NotWholeAxes {
                        axis: *axis,
                        size,
                        pod,
                    });
                }
            }
            return Err(MeshError::NoLayout { mesh: shown, pod });
        };
        let axes = MeshAxisName::ALL
            .iter()
            .enumerate()
            .map(|(a, &name)| {
                let mut physical: Vec<PhysicalAxis> = (0..m)
                    .filter(|&i| best[i] == a)
                    .map(|i| phys[i].0)
                    .collect();
                physical.sort();
                MeshAxis {
                    name,
                    size: sizes[a],
                    physical,
                }
            })
            .collect();
        Ok(Mesh { axes })
    }

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
        let pod = pod_shape(topology);
        let mut seen: Vec<PhysicalAxis> = Vec::new();
        for a in &self.axes {
            let known = a
                .physical
                .iter()
                .all(|p| physical_axes(topology).iter().any(|(q, _)| q == p) && !seen.contains(p));
            if !known || physical_extent(topology, &a.physical) != a.size {
                return Err(MeshError::NotWholeAxes {
                    axis: a.name,
                    size: a.size,
                    pod,
                });
            }
            seen.extend(&a.physical);
        }
        if seen.len() != physical_axes(topology).len()
            || self.devices() != topology.num_devices() as usize
        {
            return Err(MeshError::Product {
                mesh: self.to_string(),
                product: self.devices() as u128,
                devices: topology.num_devices() as usize,
                pod,
            });
        }
        Ok(())
    }
}

/// Extents of `physical` on `topology`, multiplied.
fn physical_extent(topology: &Topology, physical: &[PhysicalAxis]) -> usize {
    physical
        .iter()
        .map(|p| match p {
            PhysicalAxis::Torus(d) => topology.dims.get(*d).map_or(0, |&n| n as usize),
            PhysicalAxis::Slices => topology.slices as usize,
        })
        .product()
}

/// Whether some of `phys`'s extents multiply to `size`.
fn subset_product(phys: &[(PhysicalAxis, usize)], size: usize) -> bool {
    (0..1usize << phys.len()).any(|mask| {
        (0..phys.len())
            .filter(|i| mask >> i & 1 == 1)
            .map(|i| phys[i].1)
            .product::<usize>()
            == size
    })
}

/// `data=2,fsdp=-1,tensor=1`.
fn show_sizes(sizes: &[Size; 3]) -> String {
    MeshAxisName::ALL
        .iter()
        .zip(sizes)
        .map(|(a, s)| match s {
            Size::Fixed(n) => format!("{a}={n}"),
            Size::Rest => format!("{a}=-1"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategies_round_trip_through_their_names() {
        for s in Strategy::ALL {
            assert_eq!(s.name().parse::<Strategy>(), Ok(s));
            assert_eq!(s.to_string(), s.name());
        }
        let err = "zero3".parse::<Strategy>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown strategy `zero3` (expected replicated, zero2 or fsdp); did you mean `fsdp`?"
        );
        let err = "fsd".parse::<Strategy>().unwrap_err();
        assert!(err.to_string().ends_with("did you mean `fsdp`?"), "{err}");
        assert_eq!(Strategy::default(), Strategy::Replicated);
    }

    #[test]
    fn a_mesh_prints_as_the_flag_takes_it() {
        let mesh = Mesh {
            axes: vec![
                MeshAxis {
                    name: MeshAxisName::Data,
                    size: 2,
                    physical: vec![PhysicalAxis::Slices],
                },
                MeshAxis {
                    name: MeshAxisName::Fsdp,
                    size: 16,
                    physical: vec![PhysicalAxis::Torus(0), PhysicalAxis::Torus(1)],
                },
                MeshAxis {
                    name: MeshAxisName::Tensor,
                    size: 1,
                    physical: vec![],
                },
            ],
        };
        assert_eq!(mesh.to_string(), "data=2,fsdp=16,tensor=1");
        assert_eq!(mesh.devices(), 32);
        assert_eq!(mesh.size(MeshAxisName::Fsdp), 16);
    }

    use crate::topology::{load_preset, parse_topology};
    use proptest::prelude::{Just, prop_assert, prop_assert_eq, prop_oneof, proptest};

    fn pod(shape: &str) -> Topology {
        parse_topology(
            &format!("Pod(name: \"p\", generation: \"v4\", shape: \"{shape}\")"),
            "p.ron",
        )
        .unwrap()
    }

    fn multislice(shape: &str, slices: u32) -> Topology {
        parse_topology(
            &format!(
                "Pod(name: \"m\", generation: \"v5e\", shape: \"{shape}\", slices: {slices}, \
                 dcn: (latency_us: 10.0, host_gb_per_s: 25.0, oversubscription: 1.0))"
            ),
            "m.ron",
        )
        .unwrap()
    }

    #[test]
    fn the_default_mesh_is_fsdp_over_a_slice_and_data_over_slices() {
        let v4 = pod("4x4x8");
        let mesh = Mesh::default_for(&v4);
        assert_eq!(mesh.to_string(), "data=1,fsdp=128,tensor=1");
        assert_eq!(
            mesh.axis(MeshAxisName::Fsdp).unwrap().physical,
            [
                PhysicalAxis::Torus(0),
                PhysicalAxis::Torus(1),
                PhysicalAxis::Torus(2)
            ]
        );
        let two = multislice("4x4", 2);
        let mesh = Mesh::default_for(&two);
        assert_eq!(mesh.to_string(), "data=2,fsdp=16,tensor=1");
        assert_eq!(
            mesh.axis(MeshAxisName::Data).unwrap().physical,
            [PhysicalAxis::Slices]
        );
        assert!(mesh.crosses_slices(MeshAxisName::Data));
        assert_eq!(mesh.torus_axes(MeshAxisName::Fsdp), [0, 1]);
        assert_eq!(Mesh::parse("fsdp=-1,data=2", &two), Ok(mesh.clone()));
        mesh.check_on(&two).unwrap();
    }

    #[test]
    fn data_takes_the_slices_then_the_outermost_torus_axes() {
        let v4 = pod("4x4x8");
        let mesh = Mesh::parse("data=8,fsdp=16", &v4).unwrap();
        assert_eq!(
            mesh.axis(MeshAxisName::Data).unwrap().physical,
            [PhysicalAxis::Torus(2)]
        );
        let mesh = Mesh::parse("data=4,fsdp=-1", &v4).unwrap();
        assert_eq!(
            mesh.axis(MeshAxisName::Data).unwrap().physical,
            [PhysicalAxis::Torus(1)]
        );
        assert_eq!(mesh.size(MeshAxisName::Fsdp), 32);
        let mesh = Mesh::parse("data=32,fsdp=-1", &v4).unwrap();
        assert_eq!(
            mesh.axis(MeshAxisName::Data).unwrap().physical,
            [PhysicalAxis::Torus(1), PhysicalAxis::Torus(2)]
        );
        let two = multislice("4x4", 2);
        let mesh = Mesh::parse("data=8,fsdp=4", &two).unwrap();
        assert_eq!(
            mesh.axis(MeshAxisName::Data).unwrap().physical,
            [PhysicalAxis::Torus(1), PhysicalAxis::Slices]
        );
        let mesh = Mesh::parse("data=4,fsdp=8", &two).unwrap();
        assert_eq!(
            mesh.axis(MeshAxisName::Data).unwrap().physical,
            [PhysicalAxis::Torus(1)]
        );
        assert!(mesh.crosses_slices(MeshAxisName::Fsdp));
    }

    #[test]
    fn bad_mesh_text_is_a_typed_error_naming_the_axis_and_the_pod() {
        let v4 = pod("4x4x8");
        let err = |text: &str| Mesh::parse(text, &v4).unwrap_err();
        assert_eq!(
            err("data=2,fsdp=64").to_string(),
            "mesh axis data=2 is not a product of whole axes of v4 4x4x8 (torus axes 4, 4, 8): \
             JAX does not split a physical axis"
        );
        assert!(matches!(err("model=2"), MeshError::UnknownAxis { .. }));
        assert!(err("model=2").to_string().contains("`model`"));
        let twice = err("data=4,fsdp=8,data=4");
        assert!(matches!(
            twice,
            MeshError::Repeated {
                axis: MeshAxisName::Data,
                ..
            }
        ));
        assert!(twice.to_string().contains("v4 4x4x8"), "{twice}");
        for bad in [
            "data=0",
            "data=x",
            "data=NaN",
            "data=1.5",
            "data=+4",
            "data=-2",
            "data=99999999999999999999999",
        ] {
            assert!(
                matches!(
                    err(bad),
                    MeshError::BadSize {
                        axis: MeshAxisName::Data,
                        ..
                    }
                ),
                "{bad}"
            );
        }
        assert!(matches!(err("data"), MeshError::Malformed { .. }));
        assert!(matches!(err(""), MeshError::Malformed { .. }));
        assert!(matches!(err("data=-1,fsdp=-1"), MeshError::TwoRests { .. }));
        let product = err("data=4,fsdp=4");
        assert!(
            matches!(
                product,
                MeshError::Product {
                    product: 16,
                    devices: 128,
                    ..
                }
            ),
            "{product}"
        );
        assert!(matches!(err("data=3,fsdp=-1"), MeshError::NoRest { .. }));
        let tensor = err("tensor=4,fsdp=32");
        assert_eq!(
            tensor.to_string(),
            "tensor=4 needs a model that declares how its tensors split; --params gives flat \
             tensors (on v4 4x4x8 (torus axes 4, 4, 8))"
        );
        assert!(Mesh::parse("tensor=-1,fsdp=128", &v4).is_ok());
        assert!(matches!(
            err("tensor=-1,fsdp=32"),
            MeshError::Tensor { size: 4, .. }
        ));
        let two = multislice("4x4", 2);
        let e = Mesh::parse("data=3", &two).unwrap_err().to_string();
        assert!(
            e.contains("v5e 4x4, 2 slices (torus axes 4, 4; slices 2)"),
            "{e}"
        );
    }

    #[test]
    fn a_mesh_the_pod_does_not_have_is_refused_by_check_on() {
        let v4 = pod("4x4x8");
        let mut mesh = Mesh::default_for(&v4);
        mesh.check_on(&v4).unwrap();
        mesh.axes[1].physical.pop();
        assert!(mesh.check_on(&v4).is_err());
        assert!(
            Mesh::default_for(&load_preset("v5e-16").unwrap())
                .check_on(&v4)
                .is_err()
        );
    }

    /// The sizes of a mesh made by giving each physical axis to an axis.
    fn sizes_of(phys: &[(PhysicalAxis, usize)], choice: &[usize]) -> [usize; 3] {
        let mut sizes = [1usize; 3];
        for (&(_, n), &a) in phys.iter().zip(choice) {
            sizes[a] *= n;
        }
        sizes
    }

    proptest! {
        #[test]
        fn a_laid_out_mesh_covers_each_physical_axis_once_and_round_trips(
            dims in proptest::collection::vec(prop_oneof![Just(1u32), Just(2), Just(4), Just(8)], 3),
            slices in prop_oneof![Just(1u32), Just(2), Just(4)],
            choice in proptest::collection::vec(0usize..2, 4),
        ) {
            let shape = format!("{}x{}x{}", dims[0], dims[1], dims[2]);
            let topology = if slices > 1 {
                parse_topology(
                    &format!(
                        "Pod(name: \"m\", generation: \"v4\", shape: \"{shape}\", slices: {slices}, \
                         dcn: (latency_us: 10.0, host_gb_per_s: 25.0, oversubscription: 1.0))"
                    ),
                    "m.ron",
                )
            } else {
                parse_topology(&format!("Pod(name: \"p\", generation: \"v4\", shape: \"{shape}\")"), "p.ron")
            };
            let Ok(topology) = topology else { return Ok(()) };
            let phys = physical_axes(&topology);
            let sizes = sizes_of(&phys, &choice[..phys.len()]);
            let mesh = Mesh::lay_out(sizes, &topology).unwrap();
            prop_assert!(mesh.check_on(&topology).is_ok());
            let mut covered: Vec<PhysicalAxis> = mesh.axes.iter().flat_map(|a| a.physical.clone()).collect();
            covered.sort();
            let mut all: Vec<PhysicalAxis> = phys.iter().map(|&(p, _)| p).collect();
            all.sort();
            prop_assert_eq!(covered, all);
            for a in &mesh.axes {
                prop_assert_eq!(physical_extent(&topology, &a.physical), a.size);
            }
            prop_assert_eq!(mesh.devices(), topology.num_devices() as usize);
            prop_assert_eq!(Mesh::parse(&mesh.to_string(), &topology), Ok(mesh.clone()));
        }
    }
}
