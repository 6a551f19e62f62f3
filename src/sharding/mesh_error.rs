//! Why a `--mesh` text does not give a mesh on a pod.

use super::mesh::MeshAxisName;

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
    /// An axis name that is not one of [`MeshAxisName::ALL`].
    #[error(
        "mesh axis `{axis}` is unknown on {pod}: the axes are data, stage, fsdp, tensor and expert{}",
        crate::error::did_you_mean(axis, MeshAxisName::ALL.map(MeshAxisName::name))
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
    /// An axis that splits what a model declares (`tensor`, `expert`,
    /// `stage`) above 1, for flat tensors.
    #[error(
        "{axis}={size} needs a model that declares how its tensors split (its heads, experts \
         and layers: --model); --params gives flat tensors (on {pod})"
    )]
    NeedsModel {
        /// The axis.
        axis: MeshAxisName,
        /// Its size.
        size: usize,
        /// The pod's shape.
        pod: String,
    },
}
