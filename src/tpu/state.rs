//! The components a [`super::TPUOptimizer`] keeps in its world: optimizer
//! state as entities (so a world snapshot carries it) and the device heaps
//! it and the executions reserve their bytes in.

use bevy_ecs::prelude::*;
use serde::{Deserialize, Serialize};

use crate::ir::Tensor;
use crate::memory::Heap;
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

/// A device's HBM as an allocator: the optimizer state holds its blocks
/// for as long as it exists, an execution its step's buffers for the step.
/// The devices an optimizer runs on have one; reserve and release through
/// [`super::hbm`] so the monitor's [`crate::monitor::HbmUsage`] follows.
#[derive(Component, Debug)]
pub struct DeviceHeap(pub Heap);

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

crate::persist_as_self!(OptimizerCount);
