//! How one component or resource type is stored in a snapshot.
//!
//! A [`Persist`] type converts to a serializable `Stored` form and back.
//! Entity references are written as **dense ids** (the entity's position in
//! the snapshot's entity order), never as raw `Entity` bits, and read back
//! through the restored world's entities; a reference to an entity the
//! snapshot does not hold is an error, not a dangling id.
//!
//! Bulk tensor data does not belong in a column: it would be re-encoded
//! element by element and could not be read by other tools. A `store`
//! implementation hands it to the **tensor side channel** with
//! [`StoreContext::put_tensor`] (dtype, shape, little-endian row-major
//! bytes), or shares it with [`StoreContext::put_shared_tensor`] (no copy),
//! and keeps only the returned [`TensorRef`]; `load` resolves the
//! reference with [`LoadContext::tensor`]. On disk the tensors become
//! `tensors.safetensors`. Any tensor-bearing component (graph literals,
//! executable constants, device buffers) uses this one path.

use super::error::SnapshotError;
use super::tensor_bytes::TensorBytes;
use crate::ir::DType;
use crate::ir::Tensor;
use bevy_ecs::entity::Entity;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::cell::{Cell, RefCell};
use std::sync::Arc;

/// Entity → dense id, for capture: a table by entity index (live entities
/// have distinct indices), checked against the full entity so a stale
/// reference is reported rather than mapped.
#[derive(Debug, Default)]
pub struct DenseIds {
    by_index: Vec<u32>,
    entities: Vec<Entity>,
}

impl DenseIds {
    /// Dense ids over `entities`, in order.
    pub fn new(entities: &[Entity]) -> DenseIds {
        let len = entities
            .iter()
            .map(|e| e.index_u32() as usize + 1)
            .max()
            .unwrap_or(0);
        let mut by_index = vec![u32::MAX; len];
        for (dense, entity) in entities.iter().enumerate() {
            by_index[entity.index_u32() as usize] = dense as u32;
        }
        DenseIds {
            by_index,
            entities: entities.to_vec(),
        }
    }

    /// The dense id of an entity the snapshot holds.
    pub fn dense(&self, entity: Entity, what: &'static str) -> Result<u32, SnapshotError> {
        match self.by_index.get(entity.index_u32() as usize) {
            Some(&dense) if dense != u32::MAX && self.entities[dense as usize] == entity => {
                Ok(dense)
            }
            _ => Err(SnapshotError::DanglingEntity {
                what,
                entity: format!("{entity}"),
            }),
        }
    }
}

/// A tensor in the side channel: little-endian, row-major (C order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredTensor {
    /// Unique within a snapshot: `column/dense.k` (the `k`-th tensor of the
    /// row with dense id `dense`) or `resource.k`.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Dimensions, major to minor.
    pub shape: Vec<usize>,
    /// `shape.product() * dtype.byte_size()` bytes.
    pub data: TensorBytes,
}

impl StoredTensor {
    /// Checks that the data length matches the dtype and shape.
    pub fn check(&self) -> Result<(), SnapshotError> {
        let expected = self
            .shape
            .iter()
            .try_fold(self.dtype.byte_size(), |n, &d| n.checked_mul(d));
        if expected == Some(self.data.len()) {
            Ok(())
        } else {
            Err(SnapshotError::Tensor {
                name: self.name.clone(),
                reason: format!(
                    "{} bytes do not hold a {}{:?}",
                    self.data.len(),
                    self.dtype,
                    self.shape
                ),
            })
        }
    }
}

/// A column's reference to a tensor of the side channel.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorRef(pub String);

/// Capture context of one column: dense ids for entity references and the
/// tensor side channel. One per column, so columns capture in parallel and
/// tensor names do not depend on which thread ran first.
#[derive(Debug)]
pub struct StoreContext<'a> {
    ids: &'a DenseIds,
    owner: &'static str,
    row: Cell<Option<u32>>,
    next: Cell<u32>,
    tensors: RefCell<Vec<StoredTensor>>,
}

impl<'a> StoreContext<'a> {
    /// A context for the column (or resource) `owner`.
    pub fn new(ids: &'a DenseIds, owner: &'static str) -> StoreContext<'a> {
        StoreContext {
            ids,
            owner,
            row: Cell::new(None),
            next: Cell::new(0),
            tensors: RefCell::new(Vec::new()),
        }
    }

    /// The dense id of an entity the snapshot holds.
    pub fn dense(&self, entity: Entity, what: &'static str) -> Result<u32, SnapshotError> {
        self.ids.dense(entity, what)
    }

    /// Starts the row of dense id `dense`: its tensors are named after it.
    pub(crate) fn start_row(&self, dense: u32) {
        self.row.set(Some(dense));
        self.next.set(0);
    }

    /// Hands a tensor to the side channel and returns its reference.
    /// `data` is little-endian and row-major.
    pub fn put_tensor(
        &self,
        dtype: DType,
        shape: &[usize],
        data: Vec<u8>,
    ) -> Result<TensorRef, SnapshotError> {
        self.put(dtype, shape, data.into())
    }

    /// Hands a shared tensor to the side channel without copying it where
    /// its elements already are the stored bytes (see [`TensorBytes`]).
    pub fn put_shared_tensor(&self, tensor: &Arc<Tensor>) -> Result<TensorRef, SnapshotError> {
        self.put(
            tensor.dtype(),
            tensor.shape(),
            TensorBytes::of_tensor(tensor),
        )
    }

    fn put(
        &self,
        dtype: DType,
        shape: &[usize],
        data: TensorBytes,
    ) -> Result<TensorRef, SnapshotError> {
        let k = self.next.get();
        self.next.set(k + 1);
        let name = match self.row.get() {
            Some(dense) => format!("{}/{dense}.{k}", self.owner),
            None => format!("{}.{k}", self.owner),
        };
        let tensor = StoredTensor {
            name: name.clone(),
            dtype,
            shape: shape.to_vec(),
            data,
        };
        tensor.check()?;
        self.tensors.borrow_mut().push(tensor);
        Ok(TensorRef(name))
    }

    /// The tensors handed over so far.
    pub(crate) fn take_tensors(&self) -> Vec<StoredTensor> {
        self.tensors.take()
    }
}

/// Dense id → entity, and tensor references → tensors, for restore. Without
/// entities (when validating before the world is touched) it checks bounds
/// and yields placeholders, and records which tensors were referenced.
#[derive(Debug)]
pub struct LoadContext<'a> {
    entities: Option<&'a [Entity]>,
    count: u32,
    tensors: &'a [StoredTensor],
    referenced: RefCell<Vec<bool>>,
}

impl<'a> LoadContext<'a> {
    /// Maps dense ids to `entities`; `tensors` sorted by name.
    pub fn new(entities: &'a [Entity], tensors: &'a [StoredTensor]) -> LoadContext<'a> {
        LoadContext {
            entities: Some(entities),
            count: entities.len() as u32,
            tensors,
            referenced: RefCell::new(Vec::new()),
        }
    }

    /// Checks dense ids against `count` without real entities; `tensors`
    /// sorted by name.
    pub fn checking(count: u32, tensors: &'a [StoredTensor]) -> LoadContext<'a> {
        LoadContext {
            entities: None,
            count,
            tensors,
            referenced: RefCell::new(vec![false; tensors.len()]),
        }
    }

    /// The entity for a dense id.
    pub fn entity(&self, dense: u32, what: &'static str) -> Result<Entity, SnapshotError> {
        if dense >= self.count {
            return Err(SnapshotError::DanglingDenseId {
                what,
                dense,
                count: self.count,
            });
        }
        Ok(self
            .entities
            .map_or(Entity::PLACEHOLDER, |entities| entities[dense as usize]))
    }

    /// The tensor a column refers to.
    pub fn tensor(
        &self,
        r: &TensorRef,
        what: &'static str,
    ) -> Result<&'a StoredTensor, SnapshotError> {
        let i = self
            .tensors
            .binary_search_by(|t| t.name.as_str().cmp(&r.0))
            .map_err(|_| SnapshotError::MissingTensor {
                what,
                name: r.0.clone(),
            })?;
        if let Some(seen) = self.referenced.borrow_mut().get_mut(i) {
            *seen = true;
        }
        Ok(&self.tensors[i])
    }

    /// The first tensor no column referred to, when checking.
    pub(crate) fn unreferenced(&self) -> Option<&'a StoredTensor> {
        let seen = self.referenced.borrow();
        self.tensors
            .iter()
            .zip(seen.iter())
            .find(|(_, seen)| !**seen)
            .map(|(t, _)| t)
    }
}

/// A type the snapshot can hold.
pub trait Persist: Sized + Send + Sync + 'static {
    /// The serialized form.
    type Stored: Serialize + DeserializeOwned + Clone + Send + Sync + 'static;
    /// Converts to the stored form.
    fn store(&self, ctx: &StoreContext) -> Result<Self::Stored, SnapshotError>;
    /// Converts back; entity references go through `ctx`.
    fn load(stored: Self::Stored, ctx: &LoadContext) -> Result<Self, SnapshotError>;
    /// Checks that `load` would succeed, before the world is touched. The
    /// default loads a copy; types holding bulk data override it to check
    /// without building the value.
    fn check(stored: &Self::Stored, ctx: &LoadContext) -> Result<(), SnapshotError> {
        Self::load(stored.clone(), ctx).map(drop)
    }
}

/// Implements [`Persist`] as the type itself, for types without entity
/// references. Called by path (`crate::persist::persist_as_self!`), so a
/// domain that uses it imports `persist`, not the crate root.
macro_rules! persist_as_self {
    ($($ty:ty),* $(,)?) => {$(
        impl $crate::persist::Persist for $ty {
            type Stored = $ty;
            fn store(
                &self,
                _: &$crate::persist::StoreContext,
            ) -> Result<$ty, $crate::persist::SnapshotError> {
                Ok(self.clone())
            }
            fn load(
                stored: $ty,
                _: &$crate::persist::LoadContext,
            ) -> Result<$ty, $crate::persist::SnapshotError> {
                Ok(stored)
            }
        }
    )*};
}
pub(crate) use persist_as_self;
