//! A sharded model's device memory: each device's shard of every
//! optimizer-state slot ([`ShardSlot`]) and its replica of the parameters
//! ([`ReplicaParams`]), each resident in **that device's** heap for as long
//! as it exists ([`ShardBlock`]). After a restore [`super::device::rebuild_heaps`]
//! reserves them again, on the devices they name.

use bevy_ecs::prelude::*;
use serde::{Deserialize, Serialize};

use super::device::{mark, release, reserve};
use super::error::MemoryError;
use super::heap::Block;
use crate::ir::Tensor;
use crate::persist::StoredTensorValue;
use crate::persist::{LoadContext, Persist, SnapshotError, StoreContext};
use crate::topology::{DeviceId, DeviceIndex};

/// One device's shard of one optimizer-state slot (optax's `mu`, `nu`, …):
/// the state of the elements that device updates, concatenated over the
/// model's buckets (a flat 1-D tensor).
#[derive(Component, Debug, Clone, PartialEq)]
pub struct ShardSlot {
    /// The device holding it.
    pub device: DeviceId,
    /// The device whose shard this is (itself, or the primary it backs up
    /// when it is a redundant copy).
    pub owner: DeviceId,
    /// optax's field name.
    pub name: String,
    /// Position in the optimizer's slot order.
    pub index: u32,
    /// The shard, flat.
    pub tensor: Tensor,
}

/// The HBM a device spends on the model's parameters: its replica (every
/// data-parallel replica holds all of them), or under a strategy that
/// shards them its shard, or a redundant copy of another device's shard
/// ([`HeldParams`] says which). The values are stored once, in the model.
#[derive(Component, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaParams {
    /// The device.
    pub device: DeviceId,
    /// Bytes of the parameters.
    pub bytes: u64,
}

/// Which parameters a [`ReplicaParams`] on the same entity charges, for
/// the reservation's purpose in an out-of-memory error. Not persisted (the
/// snapshot format predates it; the bytes are in [`ReplicaParams`]): a
/// restored world's parameter blocks are named generically.
#[derive(Component, Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldParams {
    /// Every parameter (replicated and zero2).
    Replica,
    /// The device's own shard (fsdp).
    Shard,
    /// The redundant copy of `owner`'s shard (fsdp, redundant policy).
    CopyOf(DeviceId),
    /// Not parameters: one slot of the optimizer-state shard that `owner`
    /// holds the values of, which this device replicates along a mesh's
    /// data axis (zero2 and fsdp with `data > 1`).
    StateOf(DeviceId),
}

/// What the parameter block of `held` is for, as an out-of-memory error
/// names it.
pub fn params_purpose(held: Option<HeldParams>) -> String {
    match held {
        None | Some(HeldParams::Replica) => "the model's parameters".to_owned(),
        Some(HeldParams::Shard) => "its shard of the model's parameters".to_owned(),
        Some(HeldParams::CopyOf(owner)) => format!("the copy of {owner}'s shard of the parameters"),
        Some(HeldParams::StateOf(owner)) => {
            format!("its replica of {owner}'s optimizer-state shard")
        }
    }
}

/// Where a [`ShardSlot`] or [`ReplicaParams`] is reserved.
#[derive(Component, Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardBlock {
    /// The device entity.
    pub device: Entity,
    /// Offset of the block in its heap.
    pub offset: usize,
}

fn shard_bytes(slot: &ShardSlot) -> usize {
    slot.tensor.len() * slot.tensor.dtype().byte_size()
}

/// What each unreserved sharded-model entity needs: (entity, device, bytes,
/// purpose), replicas first, then slots by device and index.
fn unreserved(world: &mut World) -> Vec<(Entity, DeviceId, usize, String)> {
    let mut q = world
        .query_filtered::<(Entity, &ReplicaParams, Option<&HeldParams>), Without<ShardBlock>>();
    // A device's own parameters before a copy it holds.
    let mut params: Vec<((DeviceId, u8), Entity, usize, String)> = q
        .iter(world)
        .map(|(e, r, held)| {
            // Its parameters, then state replicas, then copies.
            let copy = match held {
                Some(HeldParams::StateOf(_)) => 1u8,
                Some(HeldParams::CopyOf(_)) => 2,
                _ => 0,
            };
            let purpose = params_purpose(held.copied());
            ((r.device, copy), e, r.bytes as usize, purpose)
        })
        .collect();
    params.sort_by_key(|p| (p.0, p.1));
    let mut wanted: Vec<(Entity, DeviceId, usize, String)> = params
        .into_iter()
        .map(|((d, _), e, b, p)| (e, d, b, p))
        .collect();
    let mut q = world.query_filtered::<(Entity, &ShardSlot), Without<ShardBlock>>();
    let mut slots: Vec<(u32, Entity, DeviceId, usize, String)> = q
        .iter(world)
        .map(|(e, s)| {
            let purpose = shard_purpose(s.device, s.owner, &s.name);
            (s.index, e, s.device, shard_bytes(s), purpose)
        })
        .collect();
    slots.sort_by_key(|s| (s.2, s.0, s.1));
    wanted.extend(slots.into_iter().map(|(_, e, d, b, p)| (e, d, b, p)));
    wanted
}

/// Reserves every [`ShardSlot`] and [`ReplicaParams`] without a block on
/// its own device (giving the device a heap mark first). On `Err` (a
/// device out of HBM: the error names it, the bytes and what asked) the
/// blocks reserved by this call are released again.
pub fn reserve_shards(world: &mut World) -> Result<Vec<(Entity, Block)>, MemoryError> {
    let wanted = unreserved(world);
    let index = world
        .get_resource::<DeviceIndex>()
        .cloned()
        .unwrap_or_default();
    let mut done: Vec<(Entity, Block)> = Vec::with_capacity(wanted.len());
    for (entity, device, bytes, purpose) in wanted {
        let Some(device_entity) = index.get(device) else {
            release_blocks(world, &done)?;
            return Err(MemoryError::NoHeap {
                device: device.to_string(),
            });
        };
        match reserve(
            world,
            device_entity,
            bytes.max(1),
            format_args!("{purpose}"),
        ) {
            Ok(block) => {
                world.entity_mut(entity).insert(ShardBlock {
                    device: device_entity,
                    offset: block.offset,
                });
                done.push((entity, block));
            }
            Err(e) => {
                release_blocks(world, &done)?;
                return Err(e);
            }
        }
    }
    Ok(done)
}

fn release_blocks(world: &mut World, done: &[(Entity, Block)]) -> Result<(), MemoryError> {
    for &(entity, _) in done {
        release_shard(world, entity)?;
    }
    Ok(())
}

/// Releases one entity's block (if it has one); the bytes released.
pub fn release_shard(world: &mut World, entity: Entity) -> Result<usize, MemoryError> {
    let Some(block) = world.get::<ShardBlock>(entity).copied() else {
        return Ok(0);
    };
    world.entity_mut(entity).remove::<ShardBlock>();
    release(world, block.device, block.offset)
}

/// The devices that hold sharded-model memory, so a rebuild gives them heaps.
pub fn mark_shard_devices(world: &mut World) {
    let Some(index) = world.get_resource::<DeviceIndex>().cloned() else {
        return;
    };
    let mut q = world.query::<&ShardSlot>();
    let mut devices: Vec<DeviceId> = q.iter(world).map(|s| s.device).collect();
    let mut q = world.query::<&ReplicaParams>();
    devices.extend(q.iter(world).map(|r| r.device));
    devices.sort();
    devices.dedup();
    let entities: Vec<Entity> = devices.into_iter().filter_map(|d| index.get(d)).collect();
    mark(world, &entities);
}

/// Removes every block record (a rebuilt heap holds none of them yet).
pub fn forget_shard_blocks(world: &mut World) {
    let mut q = world.query_filtered::<Entity, With<ShardBlock>>();
    let stale: Vec<Entity> = q.iter(world).collect();
    for e in stale {
        world.entity_mut(e).remove::<ShardBlock>();
    }
}

/// What [`reserve_shards`] reserves for a slot: its purpose, as named in
/// an out-of-memory error.
pub fn shard_purpose(device: DeviceId, owner: DeviceId, name: &str) -> String {
    if owner == device {
        format!("its shard of the optimizer state `{name}`")
    } else {
        format!("the copy of {owner}'s shard of `{name}`")
    }
}

/// [`ShardSlot`] as stored: its tensor in the checkpoint's tensor file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredShardSlot {
    device: DeviceId,
    owner: DeviceId,
    name: String,
    index: u32,
    tensor: StoredTensorValue,
}

impl StoredShardSlot {
    /// The device holding the shard.
    pub fn device(&self) -> DeviceId {
        self.device
    }

    /// The device whose shard it is.
    pub fn owner(&self) -> DeviceId {
        self.owner
    }

    /// The slot's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The slot's position in the optimizer's slot order.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Bytes of the shard once restored, read without building it.
    pub fn tensor_bytes(&self, ctx: &LoadContext) -> Result<usize, SnapshotError> {
        self.tensor.byte_len(ctx, "ShardSlot")
    }
}

impl Persist for ShardSlot {
    type Stored = StoredShardSlot;

    fn store(&self, ctx: &StoreContext) -> Result<StoredShardSlot, SnapshotError> {
        Ok(StoredShardSlot {
            device: self.device,
            owner: self.owner,
            name: self.name.clone(),
            index: self.index,
            tensor: crate::persist::store_tensor(&self.tensor, ctx)?,
        })
    }

    fn load(s: StoredShardSlot, ctx: &LoadContext) -> Result<ShardSlot, SnapshotError> {
        Ok(ShardSlot {
            device: s.device,
            owner: s.owner,
            name: s.name,
            index: s.index,
            tensor: crate::persist::load_tensor(s.tensor, ctx, "ShardSlot")?,
        })
    }

    fn check(s: &StoredShardSlot, ctx: &LoadContext) -> Result<(), SnapshotError> {
        crate::persist::check_tensor(&s.tensor, ctx, "ShardSlot")
    }
}

crate::persist::persist_as_self!(ReplicaParams);
