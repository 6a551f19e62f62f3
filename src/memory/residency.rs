//! Optimizer state resident in device memory, as entities (so a world
//! snapshot carries it): one [`OptimizerSlot`] per state tensor and the
//! [`OptimizerCount`]. While a slot exists its bytes are reserved in a
//! device heap ([`super::device`]); the tensors themselves go to the
//! checkpoint's tensor file.

use bevy_ecs::prelude::*;
use serde::{Deserialize, Serialize};

use crate::ir::Tensor;
use crate::persist::StoredTensorValue;
use crate::persist::{LoadContext, Persist, SnapshotError, StoreContext};

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

/// [`OptimizerSlot`] as stored: its tensor in the checkpoint's tensor file
/// (inline when tiny), like graph literals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredSlot {
    name: String,
    index: u32,
    tensor: StoredTensorValue,
}

impl StoredSlot {
    /// The slot's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The slot's position in the optimizer's slot order.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Bytes the slot's tensor occupies once restored (what its heap block
    /// must hold), read from the stored form without building the tensor.
    pub fn tensor_bytes(&self, ctx: &LoadContext) -> Result<usize, SnapshotError> {
        self.tensor.byte_len(ctx, "OptimizerSlot")
    }
}

impl Persist for OptimizerSlot {
    type Stored = StoredSlot;

    fn store(&self, ctx: &StoreContext) -> Result<StoredSlot, SnapshotError> {
        Ok(StoredSlot {
            name: self.name.clone(),
            index: self.index,
            tensor: crate::persist::store_tensor(&self.tensor, ctx)?,
        })
    }

    fn load(s: StoredSlot, ctx: &LoadContext) -> Result<OptimizerSlot, SnapshotError> {
        Ok(OptimizerSlot {
            name: s.name,
            index: s.index,
            tensor: crate::persist::load_tensor(s.tensor, ctx, "OptimizerSlot")?,
        })
    }

    fn check(s: &StoredSlot, ctx: &LoadContext) -> Result<(), SnapshotError> {
        crate::persist::check_tensor(&s.tensor, ctx, "OptimizerSlot")
    }
}

crate::persist::persist_as_self!(OptimizerCount);
