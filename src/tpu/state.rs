//! The components a [`super::TPUOptimizer`] keeps in its world: optimizer
//! state as entities (so a world snapshot carries it) and the device heaps
//! it and the executions reserve their bytes in.

use bevy_ecs::prelude::*;
use ndarray::{ArrayD, IxDyn};
use serde::{Deserialize, Serialize};

use crate::checkpoint::{LoadContext, Persist, SnapshotError, StoreContext};
use crate::exec::kernels::Tensor;
use crate::memory::Heap;
use crate::xla::persist::StoredTensorValue;
use crate::xla::{DType, TensorType};

/// One per-element state tensor of the optimizer (optax's name: `mu`, `nu`,
/// `trace`, `sum_of_squares`), in slot order.
#[derive(Component, Debug, Clone, PartialEq)]
pub struct OptimizerSlot {
    /// optax's field name.
    pub name: String,
    /// Position in the optimizer's slot order.
    pub index: u32,
    /// The tensor, in standard layout.
    pub tensor: Tensor,
}

/// The optimizer's step count (optax's `int32` counter) and the shape its
/// state was built for.
#[derive(Component, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OptimizerCount {
    /// Steps taken.
    pub count: i32,
    /// Shape of the params the state belongs to.
    pub shape: Vec<usize>,
}

/// A device's HBM as an allocator: the optimizer state holds its blocks
/// for as long as it exists, an execution its step's buffers for the step.
/// The devices an optimizer runs on have one; reserve and release through
/// [`super::hbm`] so the monitor's [`crate::monitor::HbmUsage`] follows.
#[derive(Component, Debug)]
pub struct DeviceHeap(pub Heap);

/// The serialized form of a tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredTensor {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub dims: Vec<usize>,
    /// Elements in row-major order, as the dtype's little-endian bytes.
    pub bytes: Vec<u8>,
}

/// The one place that turns a tensor into stored bytes and back; tensors
/// are inline in the snapshot for now and can move to a binary tensor file
/// without touching the components.
pub fn store_tensor(t: &Tensor) -> StoredTensor {
    let mut bytes = Vec::with_capacity(t.len() * t.dtype().byte_size());
    match t {
        Tensor::Pred(a) => a.iter().for_each(|&v| bytes.push(u8::from(v))),
        Tensor::I32(a) => a.iter().for_each(|v| bytes.extend(v.to_le_bytes())),
        Tensor::F32(a) => a.iter().for_each(|v| bytes.extend(v.to_le_bytes())),
        Tensor::F64(a) => a.iter().for_each(|v| bytes.extend(v.to_le_bytes())),
    }
    StoredTensor {
        dtype: t.dtype(),
        dims: t.shape().to_vec(),
        bytes,
    }
}

/// Inverse of [`store_tensor`]; rejects a byte count that does not fit the type.
pub fn load_tensor(s: &StoredTensor) -> Result<Tensor, String> {
    let ty = TensorType::new(s.dtype, s.dims.clone());
    let n = ty.element_count();
    if s.bytes.len() != n.saturating_mul(s.dtype.byte_size()) {
        return Err(format!(
            "{ty} needs {} bytes, the snapshot holds {}",
            n.saturating_mul(s.dtype.byte_size()),
            s.bytes.len()
        ));
    }
    let dim = IxDyn(&s.dims);
    let shape_err = |e: ndarray::ShapeError| e.to_string();
    Ok(match s.dtype {
        DType::Pred => Tensor::Pred(
            ArrayD::from_shape_vec(dim, s.bytes.iter().map(|&b| b != 0).collect())
                .map_err(shape_err)?,
        ),
        DType::I32 => Tensor::I32(
            ArrayD::from_shape_vec(
                dim,
                s.bytes
                    .chunks_exact(4)
                    .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")))
                    .collect(),
            )
            .map_err(shape_err)?,
        ),
        DType::F32 => Tensor::F32(
            ArrayD::from_shape_vec(
                dim,
                s.bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                    .collect(),
            )
            .map_err(shape_err)?,
        ),
        DType::F64 => Tensor::F64(
            ArrayD::from_shape_vec(
                dim,
                s.bytes
                    .chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                    .collect(),
            )
            .map_err(shape_err)?,
        ),
    })
}

/// [`OptimizerSlot`] as stored: its tensor in the checkpoint's tensor file
/// (inline when tiny), like graph literals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredSlot {
    name: String,
    index: u32,
    tensor: StoredTensorValue,
}

impl Persist for OptimizerSlot {
    type Stored = StoredSlot;

    fn store(&self, ctx: &StoreContext) -> Result<StoredSlot, SnapshotError> {
        Ok(StoredSlot {
            name: self.name.clone(),
            index: self.index,
            tensor: crate::xla::persist::store_tensor(&self.tensor, ctx)?,
        })
    }

    fn load(s: StoredSlot, ctx: &LoadContext) -> Result<OptimizerSlot, SnapshotError> {
        Ok(OptimizerSlot {
            name: s.name,
            index: s.index,
            tensor: crate::xla::persist::load_tensor(s.tensor, ctx, "OptimizerSlot")?,
        })
    }

    fn check(s: &StoredSlot, ctx: &LoadContext) -> Result<(), SnapshotError> {
        crate::xla::persist::check_tensor(&s.tensor, ctx, "OptimizerSlot")
    }
}

crate::persist_as_self!(OptimizerCount);
