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

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

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
#[error("unknown strategy `{0}` (expected replicated, zero2 or fsdp)")]
pub struct UnknownStrategy(pub String);

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

impl Mesh {
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
            "unknown strategy `zero3` (expected replicated, zero2 or fsdp)"
        );
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
}
