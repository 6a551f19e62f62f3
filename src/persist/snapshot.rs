//! The whole world as one value: capture, verify, restore in place.
//!
//! A [`WorldSnapshot`] holds one column per registered component type
//! (`Vec<(dense id, stored value)>`, sorted by dense id) and one entry per
//! registered resource, each encoded with postcard. Engine entities — those
//! with at least one registered component — get dense ids in entity-index
//! order; restore spawns the same number of entities and hands out dense ids
//! in *their* index order, so capture → restore → capture is byte-identical.
//!
//! Tensors travel beside the columns ([`WorldSnapshot::tensors`], sorted by
//! name; see [`super::persist`]): [`WorldSnapshot::to_bytes`] holds the
//! columns only, and [`WorldSnapshot::sha256_hex`] covers both.
//!
//! Restore is two-phase: every column is decoded and every entity reference
//! checked against the snapshot's entity count **before** the world is
//! touched; only then are the engine's entities despawned, respawned and
//! filled. A corrupt snapshot is an `Err` and the live world is unchanged.

use super::codec::{DenseIds, LoadContext, Persist, StoreContext, StoredTensor};
use super::error::SnapshotError;
use crate::ir::DType;
use bevy_ecs::prelude::*;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::any::TypeId;
use std::marker::PhantomData;

/// Version of the snapshot layout this build writes and reads.
/// (2: tensors moved to a side channel, `tensors.safetensors` on disk;
/// 3: optimizer slots' tensors moved there too.)
pub const FORMAT_VERSION: u32 = 3;

/// One component type's or resource's bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Column {
    /// Registered name (`topology.Device`).
    pub name: String,
    /// postcard bytes.
    pub bytes: Vec<u8>,
}

/// The whole engine world.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorldSnapshot {
    /// [`FORMAT_VERSION`] at capture.
    pub format_version: u32,
    /// The pod's tick at capture.
    pub tick: u64,
    /// Engine entities.
    pub entity_count: u32,
    /// Component columns, in registry (name) order.
    pub components: Vec<Column>,
    /// Resources, in registry (name) order.
    pub resources: Vec<Column>,
    /// The tensor side channel, sorted by name (not part of
    /// [`WorldSnapshot::to_bytes`]; on disk it is the tensor file).
    #[serde(skip)]
    pub tensors: Vec<StoredTensor>,
}

impl WorldSnapshot {
    /// The canonical bytes (postcard).
    pub fn to_bytes(&self) -> Vec<u8> {
        let size: usize = self
            .components
            .iter()
            .chain(&self.resources)
            .map(|c| c.name.len() + c.bytes.len() + 20)
            .sum();
        postcard::to_extend(self, Vec::with_capacity(size + 64)).expect("a snapshot always encodes")
    }

    /// Decodes canonical bytes of a snapshot without tensors.
    pub fn from_bytes(bytes: &[u8]) -> Result<WorldSnapshot, SnapshotError> {
        WorldSnapshot::from_parts(bytes, Vec::new())
    }

    /// Decodes canonical bytes and attaches the tensor side channel, which
    /// must be sorted by name with unique names and consistent lengths.
    pub fn from_parts(
        bytes: &[u8],
        tensors: Vec<StoredTensor>,
    ) -> Result<WorldSnapshot, SnapshotError> {
        check_tensors(&tensors)?;
        let snapshot: WorldSnapshot =
            postcard::from_bytes(bytes).map_err(|source| SnapshotError::Undecodable {
                column: "<world>".into(),
                source,
            })?;
        if snapshot.format_version != FORMAT_VERSION {
            return Err(SnapshotError::UnsupportedVersion {
                found: snapshot.format_version,
                supported: FORMAT_VERSION,
            });
        }
        Ok(WorldSnapshot {
            tensors,
            ..snapshot
        })
    }

    /// SHA-256 of the canonical bytes followed by every tensor (name,
    /// dtype, shape, data), lowercase hex: equal for equal worlds.
    pub fn sha256_hex(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(self.to_bytes());
        for t in &self.tensors {
            hasher.update((t.name.len() as u64).to_le_bytes());
            hasher.update(t.name.as_bytes());
            hasher.update(t.dtype.name().as_bytes());
            hasher.update((t.shape.len() as u64).to_le_bytes());
            for &d in &t.shape {
                hasher.update((d as u64).to_le_bytes());
            }
            hasher.update((t.data.len() as u64).to_le_bytes());
            hasher.update(&*t.data);
        }
        hex(&hasher.finalize())
    }

    /// The snapshot and its tensors in one buffer, for moving a world
    /// between processes ([`WorldSnapshot::from_wire`] reads it).
    pub fn to_wire(&self) -> Vec<u8> {
        let tensors: Vec<WireTensor<'_>> = self
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), t.dtype, t.shape.as_slice(), &*t.data))
            .collect();
        postcard::to_stdvec(&(self.to_bytes(), tensors)).expect("a snapshot always encodes")
    }

    /// Decodes [`WorldSnapshot::to_wire`]'s bytes (tensors checked as
    /// [`WorldSnapshot::from_parts`] checks them).
    pub fn from_wire(bytes: &[u8]) -> Result<WorldSnapshot, SnapshotError> {
        let (world, tensors): (Vec<u8>, Vec<OwnedWireTensor>) = postcard::from_bytes(bytes)
            .map_err(|source| SnapshotError::Undecodable {
                column: "<world>".into(),
                source,
            })?;
        let tensors = tensors
            .into_iter()
            .map(|(name, dtype, shape, data)| StoredTensor {
                name,
                dtype,
                shape,
                data: data.into(),
            })
            .collect();
        WorldSnapshot::from_parts(&world, tensors)
    }

    /// Bytes of tensor data in the side channel.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.data.len() as u64).sum()
    }
}

/// Names strictly increasing (sorted, unique) and every length consistent.
/// A tensor on the wire: name, type, shape, little-endian data.
type WireTensor<'a> = (&'a str, DType, &'a [usize], &'a [u8]);
type OwnedWireTensor = (String, DType, Vec<usize>, Vec<u8>);

fn check_tensors(tensors: &[StoredTensor]) -> Result<(), SnapshotError> {
    for pair in tensors.windows(2) {
        if pair[0].name >= pair[1].name {
            return Err(SnapshotError::Tensor {
                name: pair[1].name.clone(),
                reason: "tensors are not sorted by name, or a name repeats".into(),
            });
        }
    }
    tensors.iter().try_for_each(StoredTensor::check)
}

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

trait ComponentColumn: Send + Sync {
    fn name(&self) -> &'static str;
    fn type_id(&self) -> TypeId;
    fn entities(&self, world: &mut World) -> Vec<Entity>;
    fn capture(&self, world: &World, ctx: &StoreContext) -> Result<Vec<u8>, SnapshotError>;
    fn stage(&self, bytes: &[u8], ctx: &LoadContext) -> Result<Box<dyn Staged>, SnapshotError>;
    fn inspect(&self, bytes: &[u8]) -> Result<String, SnapshotError>;
    fn merge(&self, parts: &[&[u8]]) -> Result<Vec<u8>, SnapshotError>;
}

trait Staged {
    fn apply(self: Box<Self>, world: &mut World, ctx: &LoadContext) -> Result<(), SnapshotError>;
    /// Rows of a component column (0 for a resource).
    fn rows(&self) -> usize {
        0
    }
    /// Marks the dense ids a component column has a row for.
    fn mark(&self, _seen: &mut [bool]) {}
}

trait ResourceSlot: Send + Sync {
    fn name(&self) -> &'static str;
    fn type_id(&self) -> TypeId;
    fn capture(&self, world: &World, ctx: &StoreContext) -> Result<Vec<u8>, SnapshotError>;
    fn stage(&self, bytes: &[u8], ctx: &LoadContext) -> Result<Box<dyn Staged>, SnapshotError>;
    fn inspect(&self, bytes: &[u8]) -> Result<String, SnapshotError>;
}

/// RON for people: one value per line at the top level.
fn to_ron<S: Serialize>(value: &S) -> String {
    let config = ron::ser::PrettyConfig::default().depth_limit(2);
    ron::ser::to_string_pretty(value, config)
        .unwrap_or_else(|e| format!("<not representable: {e}>"))
}

fn decode<S: serde::de::DeserializeOwned>(name: &str, bytes: &[u8]) -> Result<S, SnapshotError> {
    postcard::from_bytes(bytes).map_err(|source| SnapshotError::Undecodable {
        column: name.to_string(),
        source,
    })
}

struct TypedComponent<T>(&'static str, PhantomData<fn() -> T>);

impl<T: Component + Persist> ComponentColumn for TypedComponent<T> {
    fn name(&self) -> &'static str {
        self.0
    }

    fn type_id(&self) -> TypeId {
        TypeId::of::<T>()
    }

    fn entities(&self, world: &mut World) -> Vec<Entity> {
        world
            .query_filtered::<Entity, With<T>>()
            .iter(world)
            .collect()
    }

    fn capture(&self, world: &World, ctx: &StoreContext) -> Result<Vec<u8>, SnapshotError> {
        let mut rows: Vec<(u32, T::Stored)> = Vec::new();
        if let Some(mut query) = world.try_query::<(Entity, &T)>() {
            // Sized once: growing by doubling copied each column ~twice.
            rows.reserve_exact(query.iter(world).size_hint().0);
            for (entity, value) in query.iter(world) {
                let dense = ctx.dense(entity, self.0)?;
                ctx.start_row(dense);
                rows.push((dense, value.store(ctx)?));
            }
        }
        rows.sort_unstable_by_key(|(dense, _)| *dense);
        let estimate = rows.len() * (4 + std::mem::size_of::<T::Stored>()) + 16;
        Ok(postcard::to_extend(&rows, Vec::with_capacity(estimate)).expect("stored values encode"))
    }

    fn stage(
        &self,
        bytes: &[u8],
        checking: &LoadContext,
    ) -> Result<Box<dyn Staged>, SnapshotError> {
        let rows: Vec<(u32, T::Stored)> = decode(self.0, bytes)?;
        let mut previous = None;
        for (dense, stored) in &rows {
            checking.entity(*dense, self.0)?;
            if previous.is_some_and(|p| p >= *dense) {
                return Err(SnapshotError::Corrupt {
                    column: self.0.to_string(),
                    reason: format!("dense id {dense} out of order"),
                });
            }
            previous = Some(*dense);
            T::check(stored, checking)?;
        }
        Ok(Box::new(StagedComponent::<T> { name: self.0, rows }))
    }

    fn inspect(&self, bytes: &[u8]) -> Result<String, SnapshotError> {
        let rows: Vec<(u32, T::Stored)> = decode(self.0, bytes)?;
        Ok(to_ron(&rows))
    }

    fn merge(&self, parts: &[&[u8]]) -> Result<Vec<u8>, SnapshotError> {
        // Rows by dense id; a row several parts hold must be the same bytes.
        let mut rows: Vec<(u32, usize, Vec<u8>, T::Stored)> = Vec::new();
        for (part, bytes) in parts.iter().enumerate() {
            let column: Vec<(u32, T::Stored)> = decode(self.0, bytes)?;
            for (dense, stored) in column {
                let encoded = postcard::to_stdvec(&stored).expect("stored values encode");
                rows.push((dense, part, encoded, stored));
            }
        }
        rows.sort_by_key(|(dense, part, _, _)| (*dense, *part));
        let mut merged: Vec<(u32, T::Stored)> = Vec::with_capacity(rows.len());
        let mut held: Option<(u32, usize, Vec<u8>)> = None;
        for (dense, part, encoded, stored) in rows {
            if let Some((previous, first, bytes)) = &held
                && *previous == dense
            {
                if *bytes != encoded {
                    return Err(SnapshotError::PartsDisagree {
                        column: self.0.to_string(),
                        reason: format!(
                            "parts {first} and {part} hold different rows for entity {dense}"
                        ),
                    });
                }
                continue;
            }
            held = Some((dense, part, encoded));
            merged.push((dense, stored));
        }
        Ok(postcard::to_stdvec(&merged).expect("stored values encode"))
    }
}

struct StagedComponent<T: Persist> {
    name: &'static str,
    rows: Vec<(u32, T::Stored)>,
}

impl<T: Component + Persist> Staged for StagedComponent<T> {
    fn apply(self: Box<Self>, world: &mut World, ctx: &LoadContext) -> Result<(), SnapshotError> {
        let mut batch = Vec::with_capacity(self.rows.len());
        for (dense, stored) in self.rows {
            batch.push((ctx.entity(dense, self.name)?, T::load(stored, ctx)?));
        }
        world.insert_batch(batch);
        Ok(())
    }

    fn rows(&self) -> usize {
        self.rows.len()
    }

    fn mark(&self, seen: &mut [bool]) {
        for (dense, _) in &self.rows {
            if let Some(seen) = seen.get_mut(*dense as usize) {
                *seen = true;
            }
        }
    }
}

struct TypedResource<R>(&'static str, PhantomData<fn() -> R>);

impl<R: Resource + Persist> ResourceSlot for TypedResource<R> {
    fn name(&self) -> &'static str {
        self.0
    }

    fn type_id(&self) -> TypeId {
        TypeId::of::<R>()
    }

    fn capture(&self, world: &World, ctx: &StoreContext) -> Result<Vec<u8>, SnapshotError> {
        let value = world
            .get_resource::<R>()
            .ok_or(SnapshotError::MissingResource(self.0))?;
        Ok(postcard::to_stdvec(&value.store(ctx)?).expect("stored values encode"))
    }

    fn stage(
        &self,
        bytes: &[u8],
        checking: &LoadContext,
    ) -> Result<Box<dyn Staged>, SnapshotError> {
        let stored: R::Stored = decode(self.0, bytes)?;
        R::check(&stored, checking)?;
        Ok(Box::new(StagedResource::<R> { stored }))
    }

    fn inspect(&self, bytes: &[u8]) -> Result<String, SnapshotError> {
        let stored: R::Stored = decode(self.0, bytes)?;
        Ok(to_ron(&stored))
    }
}

struct StagedResource<R: Persist> {
    stored: R::Stored,
}

impl<R: Resource + Persist> Staged for StagedResource<R> {
    fn apply(self: Box<Self>, world: &mut World, ctx: &LoadContext) -> Result<(), SnapshotError> {
        world.insert_resource(R::load(self.stored, ctx)?);
        Ok(())
    }
}

/// The component types and resources a snapshot holds, by name.
///
/// The engine's registry is `checkpoint::engine_registry` (a layer above); hosts may register
/// their own types before capturing.
#[derive(Resource, Default)]
pub struct SnapshotRegistry {
    components: Vec<Box<dyn ComponentColumn>>,
    resources: Vec<Box<dyn ResourceSlot>>,
}

impl std::fmt::Debug for SnapshotRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotRegistry")
            .field("components", &self.component_names())
            .field("resources", &self.resource_names())
            .finish()
    }
}

impl SnapshotRegistry {
    /// Registers a component type under a stable name.
    pub fn component<T: Component + Persist>(&mut self, name: &'static str) -> &mut Self {
        assert!(
            !self.component_names().contains(&name),
            "component column `{name}` registered twice"
        );
        self.components
            .push(Box::new(TypedComponent::<T>(name, PhantomData)));
        self.components.sort_by_key(|c| c.name());
        self
    }

    /// Registers a resource under a stable name.
    pub fn resource<R: Resource + Persist>(&mut self, name: &'static str) -> &mut Self {
        assert!(
            !self.resource_names().contains(&name),
            "resource `{name}` registered twice"
        );
        self.resources
            .push(Box::new(TypedResource::<R>(name, PhantomData)));
        self.resources.sort_by_key(|r| r.name());
        self
    }

    /// Registered component names, sorted.
    pub fn component_names(&self) -> Vec<&'static str> {
        self.components.iter().map(|c| c.name()).collect()
    }

    /// Registered resource names, sorted.
    pub fn resource_names(&self) -> Vec<&'static str> {
        self.resources.iter().map(|r| r.name()).collect()
    }

    /// Whether a Rust type is registered (as a component or a resource).
    pub fn contains_type(&self, type_id: TypeId) -> bool {
        self.components.iter().any(|c| c.type_id() == type_id)
            || self.resources.iter().any(|r| r.type_id() == type_id)
    }

    /// The engine entities of `world`, in index order.
    fn engine_entities(&self, world: &mut World) -> Vec<Entity> {
        // A table by entity index (live entities have distinct indices):
        // linear, where sorting every column's entities was not.
        let mut by_index: Vec<Option<Entity>> = Vec::new();
        for column in &self.components {
            for entity in column.entities(world) {
                let i = entity.index_u32() as usize;
                if i >= by_index.len() {
                    by_index.resize(i + 1, None);
                }
                by_index[i] = Some(entity);
            }
        }
        by_index.into_iter().flatten().collect()
    }

    /// Captures every registered component and resource of `world`.
    pub fn capture(&self, world: &mut World, tick: u64) -> Result<WorldSnapshot, SnapshotError> {
        let entities = self.engine_entities(world);
        let ids = DenseIds::new(&entities);
        let world: &World = world;
        // Columns are independent: capture them on every core, each with
        // its own context so tensor names do not depend on thread timing.
        let captured = self
            .components
            .par_iter()
            .map(|column| {
                let ctx = StoreContext::new(&ids, column.name());
                let bytes = column.capture(world, &ctx)?;
                let column = Column {
                    name: column.name().to_string(),
                    bytes,
                };
                Ok((column, ctx.take_tensors()))
            })
            .collect::<Result<Vec<_>, SnapshotError>>()?;
        let mut tensors = Vec::new();
        let mut components = Vec::with_capacity(captured.len());
        for (column, column_tensors) in captured {
            components.push(column);
            tensors.extend(column_tensors);
        }
        let mut resources = Vec::with_capacity(self.resources.len());
        for slot in &self.resources {
            let ctx = StoreContext::new(&ids, slot.name());
            resources.push(Column {
                name: slot.name().to_string(),
                bytes: slot.capture(world, &ctx)?,
            });
            tensors.extend(ctx.take_tensors());
        }
        tensors.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        Ok(WorldSnapshot {
            format_version: FORMAT_VERSION,
            tick,
            entity_count: entities.len() as u32,
            components,
            resources,
            tensors,
        })
    }

    /// Decodes and checks every column of `snapshot` without touching a world.
    pub fn verify(&self, snapshot: &WorldSnapshot) -> Result<(), SnapshotError> {
        self.stage(snapshot).map(|_| ())
    }

    fn stage(&self, snapshot: &WorldSnapshot) -> Result<Vec<Box<dyn Staged>>, SnapshotError> {
        if snapshot.format_version != FORMAT_VERSION {
            return Err(SnapshotError::UnsupportedVersion {
                found: snapshot.format_version,
                supported: FORMAT_VERSION,
            });
        }
        check_tensors(&snapshot.tensors)?;
        let checking = LoadContext::checking(snapshot.entity_count, &snapshot.tensors);
        let mut staged = Vec::new();
        let names = |columns: &[Column]| columns.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
        check_columns(&self.component_names(), &names(&snapshot.components))?;
        check_columns(&self.resource_names(), &names(&snapshot.resources))?;
        for (codec, column) in self.components.iter().zip(&snapshot.components) {
            staged.push(codec.stage(&column.bytes, &checking)?);
        }
        check_entity_count(snapshot.entity_count, &staged)?;
        for (slot, column) in self.resources.iter().zip(&snapshot.resources) {
            staged.push(slot.stage(&column.bytes, &checking)?);
        }
        if let Some(tensor) = checking.unreferenced() {
            return Err(SnapshotError::Tensor {
                name: tensor.name.clone(),
                reason: "no column refers to it".into(),
            });
        }
        Ok(staged)
    }

    /// The snapshot as RON, column by column, for people to read. Entity
    /// references appear as dense ids (the row numbers of other columns).
    pub fn inspect(&self, snapshot: &WorldSnapshot) -> Result<String, SnapshotError> {
        self.stage(snapshot)?;
        let mut text = format!(
            "// world snapshot: format {}, tick {}, {} entities (rows are (dense id, value))\n",
            snapshot.format_version, snapshot.tick, snapshot.entity_count
        );
        for (codec, column) in self.components.iter().zip(&snapshot.components) {
            text += &format!(
                "\n// component {}\n{}\n",
                column.name,
                codec.inspect(&column.bytes)?
            );
        }
        for (slot, column) in self.resources.iter().zip(&snapshot.resources) {
            text += &format!(
                "\n// resource {}\n{}\n",
                column.name,
                slot.inspect(&column.bytes)?
            );
        }
        Ok(text)
    }

    /// Decodes one resource of a snapshot without restoring anything.
    pub fn decode_resource<R: Resource + Persist>(
        &self,
        snapshot: &WorldSnapshot,
        name: &str,
    ) -> Result<R, SnapshotError> {
        let column = snapshot
            .resources
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| SnapshotError::ColumnMismatch {
                problem: "lacks the",
                column: name.to_string(),
            })?;
        let stored: R::Stored = decode(&column.name, &column.bytes)?;
        let checking = LoadContext::checking(snapshot.entity_count, &snapshot.tensors);
        R::check(&stored, &checking)?;
        R::load(stored, &checking)
    }

    /// Merges one component column from several parts of a world: the
    /// union of their rows by dense id, where a row more than one part
    /// holds must be identical in all of them.
    pub fn merge_component(&self, name: &str, parts: &[&[u8]]) -> Result<Vec<u8>, SnapshotError> {
        let column = self
            .components
            .iter()
            .find(|c| c.name() == name)
            .ok_or_else(|| SnapshotError::ColumnMismatch {
                problem: "has an unregistered",
                column: name.to_string(),
            })?;
        column.merge(parts)
    }

    /// Decodes one component column of a snapshot in its stored form, with
    /// every dense id checked, without restoring anything: what a restore
    /// needs to check before the world is touched.
    pub fn decode_component<T: Component + Persist>(
        &self,
        snapshot: &WorldSnapshot,
        name: &str,
    ) -> Result<Vec<(u32, T::Stored)>, SnapshotError> {
        let column = snapshot
            .components
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| SnapshotError::ColumnMismatch {
                problem: "lacks the",
                column: name.to_string(),
            })?;
        let rows: Vec<(u32, T::Stored)> = decode(&column.name, &column.bytes)?;
        let checking = LoadContext::checking(snapshot.entity_count, &snapshot.tensors);
        for (dense, _) in &rows {
            checking.entity(*dense, "a row")?;
        }
        Ok(rows)
    }

    /// Replaces the engine's entities and resources in `world` with the
    /// snapshot's. Everything is decoded and checked first: on `Err` the
    /// world is untouched.
    pub fn restore(
        &self,
        world: &mut World,
        snapshot: &WorldSnapshot,
    ) -> Result<(), SnapshotError> {
        let staged = self.stage(snapshot)?;
        for entity in self.engine_entities(world) {
            world.despawn(entity);
        }
        let mut entities: Vec<Entity> = (0..snapshot.entity_count)
            .map(|_| world.spawn_empty().id())
            .collect();
        entities.sort_unstable_by_key(|e| e.index_u32());
        let ctx = LoadContext::new(&entities, &snapshot.tensors);
        for column in staged {
            column.apply(world, &ctx)?;
        }
        Ok(())
    }
}

/// Every engine entity has at least one component, so the entity count is
/// at most the component rows and every dense id below it has a row: a
/// forged count is refused before anything is allocated for it.
fn check_entity_count(count: u32, staged: &[Box<dyn Staged>]) -> Result<(), SnapshotError> {
    let corrupt = |reason: String| SnapshotError::Corrupt {
        column: "<world>".into(),
        reason,
    };
    let rows: usize = staged.iter().map(|s| s.rows()).sum();
    if count as usize > rows {
        return Err(corrupt(format!(
            "the entity count is {count}, but the component columns hold {rows} rows (every \
             entity has at least one)"
        )));
    }
    let mut seen = vec![false; count as usize];
    for column in staged {
        column.mark(&mut seen);
    }
    match seen.iter().position(|s| !s) {
        Some(dense) => Err(corrupt(format!(
            "dense entity {dense} has no component (the entity count is {count})"
        ))),
        None => Ok(()),
    }
}

fn check_columns(expected: &[&'static str], found: &[String]) -> Result<(), SnapshotError> {
    for name in expected {
        if !found.iter().any(|f| f == name) {
            return Err(SnapshotError::ColumnMismatch {
                problem: "lacks the",
                column: name.to_string(),
            });
        }
    }
    for name in found {
        if !expected.contains(&name.as_str()) {
            return Err(SnapshotError::ColumnMismatch {
                problem: "has an unknown",
                column: name.clone(),
            });
        }
    }
    if expected.len() != found.len() || expected.iter().zip(found).any(|(e, f)| e != f) {
        return Err(SnapshotError::ColumnMismatch {
            problem: "has out-of-order or repeated",
            column: found.join(","),
        });
    }
    Ok(())
}
