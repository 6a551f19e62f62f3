//! How one component or resource type is stored in a snapshot.
//!
//! A [`Persist`] type converts to a serializable `Stored` form and back.
//! Entity references are written as **dense ids** (the entity's position in
//! the snapshot's entity order), never as raw `Entity` bits, and read back
//! through the restored world's entities; a reference to an entity the
//! snapshot does not hold is an error, not a dangling id.

use super::error::SnapshotError;
use bevy_ecs::entity::Entity;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Entity → dense id, for capture: a table indexed by entity index (live
/// entities have distinct indices), checked against the full entity so a
/// stale reference is reported rather than mapped.
#[derive(Debug, Default)]
pub struct StoreContext {
    by_index: Vec<u32>,
    entities: Vec<Entity>,
}

impl StoreContext {
    /// A context over `entities`, in dense order.
    pub fn new(entities: &[Entity]) -> StoreContext {
        let len = entities
            .iter()
            .map(|e| e.index_u32() as usize + 1)
            .max()
            .unwrap_or(0);
        let mut by_index = vec![u32::MAX; len];
        for (dense, entity) in entities.iter().enumerate() {
            by_index[entity.index_u32() as usize] = dense as u32;
        }
        StoreContext {
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

/// Dense id → entity, for restore. Without entities (when validating before
/// the world is touched) it checks bounds and yields placeholders.
#[derive(Debug)]
pub struct LoadContext<'a> {
    entities: Option<&'a [Entity]>,
    count: u32,
}

impl<'a> LoadContext<'a> {
    /// Maps dense ids to `entities`.
    pub fn new(entities: &'a [Entity]) -> LoadContext<'a> {
        LoadContext {
            entities: Some(entities),
            count: entities.len() as u32,
        }
    }

    /// Checks dense ids against `count` without real entities.
    pub fn checking(count: u32) -> LoadContext<'static> {
        LoadContext {
            entities: None,
            count,
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
}

/// A type the snapshot can hold.
pub trait Persist: Sized + Send + Sync + 'static {
    /// The serialized form.
    type Stored: Serialize + DeserializeOwned + Clone + Send + Sync + 'static;
    /// Converts to the stored form.
    fn store(&self, ctx: &StoreContext) -> Result<Self::Stored, SnapshotError>;
    /// Converts back; entity references go through `ctx`.
    fn load(stored: Self::Stored, ctx: &LoadContext) -> Result<Self, SnapshotError>;
}

/// Implements [`Persist`] as the type itself, for types without entity
/// references.
#[macro_export]
macro_rules! persist_as_self {
    ($($ty:ty),* $(,)?) => {$(
        impl $crate::checkpoint::Persist for $ty {
            type Stored = $ty;
            fn store(
                &self,
                _: &$crate::checkpoint::StoreContext,
            ) -> Result<$ty, $crate::checkpoint::SnapshotError> {
                Ok(self.clone())
            }
            fn load(
                stored: $ty,
                _: &$crate::checkpoint::LoadContext,
            ) -> Result<$ty, $crate::checkpoint::SnapshotError> {
                Ok(stored)
            }
        }
    )*};
}
