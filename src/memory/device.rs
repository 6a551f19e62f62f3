//! Device HBM as the monitor sees it: every reservation and release goes
//! through here, so a device's [`HbmUsage`] always equals the bytes in use
//! in its [`DeviceHeap`], and a profiler's [`super::journal`] sees them all.
//!
//! Two kinds of reservation share a heap: the optimizer state (one block
//! per [`OptimizerSlot`], held for as long as the slot exists, recorded in
//! its [`ResidentBlock`]) and a step's transient buffers (held for the
//! step). Only the devices an optimizer runs on have a heap, marked by
//! their [`HbmUsage`] (so an idle pod carries no allocator per device).
//! Heaps are not persisted but `HbmUsage` is: [`rebuild_heaps`] recreates
//! the heaps of the marked devices from [`HbmCapacity`] and the resident
//! state after a restore.

use bevy_ecs::prelude::*;

use serde::{Deserialize, Serialize};

use super::ALIGNMENT;
use super::error::{MemoryError, OutOfDeviceMemory};
use super::heap::{Block, Heap};
use super::residency::OptimizerSlot;
use crate::topology::{Device, HbmCapacity};

/// A device's HBM as an allocator: the optimizer state holds its blocks
/// for as long as it exists, an execution its step's buffers for the step.
/// The devices an optimizer runs on have one; reserve and release through
/// this module so the device's [`HbmUsage`] follows.
#[derive(Component, Debug)]
pub struct DeviceHeap(pub Heap);

/// HBM bytes in use on a device: its heap's, set at every reservation and
/// release ([`publish`]). The monitor's memory check reads it; it is 0 on a
/// device that never held anything.
#[derive(Component, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HbmUsage(pub u64);

/// Where an [`OptimizerSlot`]'s tensor resides: its block in a device heap.
#[derive(Component, Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResidentBlock {
    /// The device.
    pub device: Entity,
    /// Offset of the block in the device's heap.
    pub offset: usize,
}

/// The device that holds the optimizer state: the one with id 0.
pub fn state_device(world: &mut World) -> Option<Entity> {
    let mut q = world.query::<(Entity, &Device)>();
    q.iter(world).find(|(_, d)| d.id.0 == 0).map(|(e, _)| e)
}

/// How a device is named in errors and profiles (`device 0 (v4)`).
pub fn device_name(world: &World, device: Entity) -> String {
    match world.get::<Device>(device) {
        Some(d) => format!("{} ({})", d.id, d.generation),
        None => format!("{device}"),
    }
}

/// Reserves `bytes` on `device` for `purpose` (named in the out-of-memory
/// error) and publishes the device's usage. Names are formatted only for
/// an error: this runs on every step.
pub fn reserve(
    world: &mut World,
    device: Entity,
    bytes: usize,
    purpose: std::fmt::Arguments<'_>,
) -> Result<Block, MemoryError> {
    let Some(mut heap) = world.get_mut::<DeviceHeap>(device) else {
        return Err(no_heap(world, device));
    };
    match heap.0.alloc(bytes) {
        Ok(block) => {
            publish(world, device);
            super::journal::record_reserve(world, device, block, purpose);
            Ok(block)
        }
        Err(_) => {
            let (free, largest_free) = (heap.0.free_bytes(), heap.0.largest_free());
            Err(MemoryError::OutOfDeviceMemory(OutOfDeviceMemory {
                device: device_name(world, device),
                purpose: purpose.to_string(),
                requested: bytes as u64,
                free: free as u64,
                largest_free: largest_free as u64,
            }))
        }
    }
}

fn no_heap(world: &World, device: Entity) -> MemoryError {
    MemoryError::NoHeap {
        device: device_name(world, device),
    }
}

/// Releases the block at `offset` on `device`; returns the bytes released.
pub fn release(world: &mut World, device: Entity, offset: usize) -> Result<usize, MemoryError> {
    let Some(mut heap) = world.get_mut::<DeviceHeap>(device) else {
        return Err(no_heap(world, device));
    };
    let before = heap.0.used_bytes();
    if let Err(source) = heap.0.free(offset) {
        return Err(MemoryError::Release {
            device: device_name(world, device),
            source,
        });
    }
    let released = before - heap.0.used_bytes();
    publish(world, device);
    super::journal::record_release(world, device, offset, released);
    Ok(released)
}

/// Sets the device's [`HbmUsage`] to its heap's bytes in use.
pub fn publish(world: &mut World, device: Entity) {
    let Some(used) = world
        .get::<DeviceHeap>(device)
        .map(|h| h.0.used_bytes() as u64)
    else {
        return;
    };
    let mut entity = world.entity_mut(device);
    match entity.get_mut::<HbmUsage>() {
        // Written only on a change, so change detection means a change.
        Some(mut usage) if usage.0 != used => usage.0 = used,
        Some(_) => {}
        None => {
            entity.insert(HbmUsage(used));
        }
    }
}

/// Marks `devices` as holding a heap (an [`HbmUsage`] of 0 where they have
/// none); [`rebuild_heaps`] then gives them one.
pub fn mark(world: &mut World, devices: &[Entity]) {
    for &device in devices {
        if let Ok(mut entity) = world.get_entity_mut(device)
            && !entity.contains::<HbmUsage>()
        {
            entity.insert(HbmUsage(0));
        }
    }
}

/// A state block reserved by [`reserve_state`]: device, block, slot name.
pub type StateReservation = (Entity, Block, String);

/// Reserves every slot that has no block yet on the state device, in slot
/// order. On `Err` the slots reserved by this call are released again.
pub fn reserve_state(world: &mut World) -> Result<Vec<StateReservation>, MemoryError> {
    let mut q = world.query_filtered::<(Entity, &OptimizerSlot), Without<ResidentBlock>>();
    let mut slots: Vec<(u32, Entity, usize, String)> = q
        .iter(world)
        .map(|(e, s)| (s.index, e, tensor_bytes(s), s.name.clone()))
        .collect();
    if slots.is_empty() {
        return Ok(Vec::new());
    }
    slots.sort_by_key(|s| s.0);
    let device = state_device(world).ok_or(MemoryError::NoStateDevice)?;
    let mut done = Vec::with_capacity(slots.len());
    let mut reserved = Vec::with_capacity(slots.len());
    for (_, slot, bytes, name) in slots {
        match reserve(
            world,
            device,
            bytes.max(1),
            format_args!("the optimizer state `{name}`"),
        ) {
            Ok(block) => {
                let resident = ResidentBlock {
                    device,
                    offset: block.offset,
                };
                world.entity_mut(slot).insert(resident);
                done.push(slot);
                reserved.push((device, block, name));
            }
            Err(e) => {
                for slot in done {
                    release_slot(world, slot)?;
                }
                return Err(e);
            }
        }
    }
    Ok(reserved)
}

/// Releases a slot's block (if it has one).
pub fn release_slot(world: &mut World, slot: Entity) -> Result<usize, MemoryError> {
    let Some(block) = world.get::<ResidentBlock>(slot).copied() else {
        return Ok(0);
    };
    world.entity_mut(slot).remove::<ResidentBlock>();
    release(world, block.device, block.offset)
}

/// Bytes the resident state occupies, as reserved (aligned).
pub fn state_bytes(world: &mut World) -> usize {
    resident_state_bytes(&mut world.query_filtered(), world)
}

/// The resident state's slots, for a caller that keeps the query (building
/// one costs more than a small step).
pub type ResidentSlots = QueryState<&'static OptimizerSlot, With<ResidentBlock>>;

/// [`state_bytes`] through a kept query.
pub fn resident_state_bytes(query: &mut ResidentSlots, world: &World) -> usize {
    query
        .iter(world)
        .map(|s| tensor_bytes(s).max(1).next_multiple_of(ALIGNMENT))
        .sum()
}

/// Gives every marked device (one with an [`HbmUsage`], and the state
/// device if there is state) a fresh heap of its [`HbmCapacity`], reserves
/// the resident optimizer state (and every sharded model's shards and
/// parameter replicas, [`super::shards`]) again and publishes the devices' usage:
/// what a restored world needs, since heaps are not persisted.
pub fn rebuild_heaps(world: &mut World) -> Result<(), MemoryError> {
    let mut slots = world.query_filtered::<(), With<OptimizerSlot>>();
    if slots.iter(world).next().is_some()
        && let Some(device) = state_device(world)
    {
        mark(world, &[device]);
    }
    super::shards::mark_shard_devices(world);
    let mut q = world.query_filtered::<(Entity, &HbmCapacity), With<HbmUsage>>();
    let devices: Vec<(Entity, u64)> = q.iter(world).map(|(e, c)| (e, c.0)).collect();
    for &(device, capacity) in &devices {
        let bytes = usize::try_from(capacity).unwrap_or(usize::MAX);
        if world.get::<DeviceHeap>(device).is_some() {
            super::journal::record_rebuild(world, device);
        }
        world
            .entity_mut(device)
            .insert(DeviceHeap(Heap::new(bytes, ALIGNMENT)));
    }
    let mut q = world.query_filtered::<Entity, With<ResidentBlock>>();
    let stale: Vec<Entity> = q.iter(world).collect();
    for slot in stale {
        world.entity_mut(slot).remove::<ResidentBlock>();
    }
    super::shards::forget_shard_blocks(world);
    reserve_state(world)?;
    super::shards::reserve_shards(world)?;
    for (device, _) in devices {
        publish(world, device);
    }
    Ok(())
}

/// Checks, without a world, that [`rebuild_heaps`] would succeed for a
/// world whose state device is `device` (its name and [`HbmCapacity`]) and
/// whose optimizer state is `slots` (index, bytes, name): the same
/// reservations in the same order on a fresh heap. A restore runs this
/// before it replaces the world, so state that no longer fits is refused
/// with the world unchanged.
pub fn check_rebuild(
    device: Option<(String, u64)>,
    slots: &mut [(u32, usize, String)],
) -> Result<(), MemoryError> {
    if slots.is_empty() {
        return Ok(());
    }
    let (device, capacity) = device.ok_or(MemoryError::NoStateDevice)?;
    slots.sort_by_key(|s| s.0);
    let needs: Vec<(usize, String)> = slots
        .iter()
        .map(|(_, bytes, name)| (*bytes, format!("the optimizer state `{name}`")))
        .collect();
    check_fits(&device, capacity, &needs)
}

/// Checks, without a world, that a fresh heap of `capacity` bytes on
/// `device` (its name) holds `needs` (`(bytes, purpose)`) reserved in
/// order, as a rebuild reserves them; the out-of-memory error names the
/// device, the bytes and what asked.
pub fn check_fits(
    device: &str,
    capacity: u64,
    needs: &[(usize, String)],
) -> Result<(), MemoryError> {
    let mut heap = Heap::new(usize::try_from(capacity).unwrap_or(usize::MAX), ALIGNMENT);
    for (bytes, purpose) in needs {
        if heap.alloc((*bytes).max(1)).is_err() {
            return Err(MemoryError::OutOfDeviceMemory(OutOfDeviceMemory {
                device: device.to_owned(),
                purpose: purpose.clone(),
                requested: *bytes as u64,
                free: heap.free_bytes() as u64,
                largest_free: heap.largest_free() as u64,
            }));
        }
    }
    Ok(())
}

/// Bytes of a slot's tensor.
fn tensor_bytes(slot: &OptimizerSlot) -> usize {
    slot.tensor.len() * slot.tensor.dtype().byte_size()
}
