//! The record of what device memory really does: every reservation and
//! release made through [`super::device`], with the simulated time, what
//! held the block, and each device's heap at its highest use, taken while
//! the reservation that made it was held.
//!
//! Off until something asks for it ([`enable`] inserts the [`HbmJournal`]
//! resource; a profiler does): a step then pays one resource lookup. A
//! reader drains the events with [`take_events`]; until then at most
//! [`MAX_JOURNAL_EVENTS`] are kept and later ones are counted as dropped.

use std::collections::HashMap;

use bevy_ecs::prelude::*;
use serde::Serialize;

use super::device::{DeviceHeap, device_name};
use super::heap::Block;
use crate::clock::SimClock;

/// Events kept between two reads of the journal; later ones are dropped
/// (and counted) until the next [`take_events`].
pub const MAX_JOURNAL_EVENTS: usize = 1 << 20;

/// What happened to device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HbmEventKind {
    /// A block was reserved.
    Reserve,
    /// A block was released.
    Release,
    /// The device's heap was rebuilt empty (a restore): every block it
    /// held is gone without a release of its own; `bytes` is what it held.
    Rebuild,
}

/// One reservation, release or rebuild on one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HbmEvent {
    /// What happened.
    pub kind: HbmEventKind,
    /// The device (`device 0 (v4)`).
    pub device: String,
    /// What holds (or held) the block: the purpose given when it was
    /// reserved (`the program \`adam_update\``).
    pub holder: String,
    /// Offset of the block in the device's heap.
    pub offset: u64,
    /// Bytes reserved or released.
    pub bytes: u64,
    /// Bytes in use on the device after the event.
    pub used_after: u64,
    /// Simulated time of the event, ns (`None` in a world without a clock).
    pub at_ns: Option<u64>,
}

/// A device's heap at its highest use, as it was right after the
/// reservation that made it (so that reservation is among the blocks).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HbmPeak {
    /// The device.
    pub device: String,
    /// Simulated time, ns.
    pub at_ns: Option<u64>,
    /// The reservation that reached the peak.
    pub holder: String,
    /// Bytes in use.
    pub used_bytes: u64,
    /// Free bytes.
    pub free_bytes: u64,
    /// The largest free block.
    pub largest_free_bytes: u64,
    /// The heap's capacity.
    pub capacity_bytes: u64,
    /// Every block held at that moment, by offset: (holder, offset, bytes).
    /// A block reserved before the journal was enabled is held by
    /// `reserved before recording began`.
    pub blocks: Vec<(String, u64, u64)>,
}

/// The journal: present in a world only while something records.
#[derive(Resource, Debug, Default)]
pub struct HbmJournal {
    events: Vec<HbmEvent>,
    dropped: u64,
    holders: HashMap<(Entity, usize), String>,
    peaks: Vec<(Entity, HbmPeak)>,
}

impl HbmJournal {
    /// Each device's peak so far (in the order devices first peaked).
    pub fn peaks(&self) -> impl Iterator<Item = &HbmPeak> {
        self.peaks.iter().map(|(_, p)| p)
    }

    /// Events dropped because nobody read the journal in time.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    fn push(&mut self, event: HbmEvent) {
        if self.events.len() < MAX_JOURNAL_EVENTS {
            self.events.push(event);
        } else {
            self.dropped += 1;
        }
    }
}

/// Starts recording in `world` (nothing happens if it already does).
pub fn enable(world: &mut World) {
    if !world.contains_resource::<HbmJournal>() {
        world.insert_resource(HbmJournal::default());
    }
}

/// The events recorded since the last call, oldest first.
pub fn take_events(world: &mut World) -> Vec<HbmEvent> {
    world
        .get_resource_mut::<HbmJournal>()
        .map(|mut j| std::mem::take(&mut j.events))
        .unwrap_or_default()
}

fn now_ns(world: &World) -> Option<u64> {
    world.get_resource::<SimClock>().map(|c| c.now_ns)
}

/// Heap figures of `device`: (used, free, largest free, capacity).
fn heap_figures(world: &World, device: Entity) -> Option<(u64, u64, u64, u64)> {
    let heap = &world.get::<DeviceHeap>(device)?.0;
    Some((
        heap.used_bytes() as u64,
        heap.free_bytes() as u64,
        heap.largest_free() as u64,
        heap.capacity() as u64,
    ))
}

/// Records a reservation just made (the block is held), and the device's
/// heap if this is its highest use so far.
pub(super) fn record_reserve(
    world: &mut World,
    device: Entity,
    block: Block,
    purpose: std::fmt::Arguments<'_>,
) {
    if !world.contains_resource::<HbmJournal>() {
        return;
    }
    let Some((used, free, largest_free, capacity)) = heap_figures(world, device) else {
        return;
    };
    let name = device_name(world, device);
    let at_ns = now_ns(world);
    let holder = purpose.to_string();
    let blocks = world
        .get::<DeviceHeap>(device)
        .map(|h| h.0.allocations())
        .unwrap_or_default();
    let mut journal = world.resource_mut::<HbmJournal>();
    journal
        .holders
        .insert((device, block.offset), holder.clone());
    let is_peak = journal
        .peaks
        .iter()
        .find(|(d, _)| *d == device)
        .is_none_or(|(_, p)| used > p.used_bytes);
    if is_peak {
        let mut blocks: Vec<(String, u64, u64)> = blocks
            .iter()
            .map(|b| {
                let holder = journal
                    .holders
                    .get(&(device, b.offset))
                    .cloned()
                    .unwrap_or_else(|| "reserved before recording began".to_string());
                (holder, b.offset as u64, b.size as u64)
            })
            .collect();
        blocks.sort_by_key(|b| b.1);
        let peak = HbmPeak {
            device: name.clone(),
            at_ns,
            holder: holder.clone(),
            used_bytes: used,
            free_bytes: free,
            largest_free_bytes: largest_free,
            capacity_bytes: capacity,
            blocks,
        };
        match journal.peaks.iter_mut().find(|(d, _)| *d == device) {
            Some((_, p)) => *p = peak,
            None => journal.peaks.push((device, peak)),
        }
    }
    journal.push(HbmEvent {
        kind: HbmEventKind::Reserve,
        device: name,
        holder,
        offset: block.offset as u64,
        bytes: block.size as u64,
        used_after: used,
        at_ns,
    });
}

/// Records a release just made.
pub(super) fn record_release(world: &mut World, device: Entity, offset: usize, bytes: usize) {
    if !world.contains_resource::<HbmJournal>() {
        return;
    }
    let used = heap_figures(world, device).map_or(0, |f| f.0);
    let name = device_name(world, device);
    let at_ns = now_ns(world);
    let mut journal = world.resource_mut::<HbmJournal>();
    let holder = journal
        .holders
        .remove(&(device, offset))
        .unwrap_or_else(|| "reserved before recording began".to_string());
    journal.push(HbmEvent {
        kind: HbmEventKind::Release,
        device: name,
        holder,
        offset: offset as u64,
        bytes: bytes as u64,
        used_after: used,
        at_ns,
    });
}

/// Records that `device`'s heap is about to be replaced by an empty one.
pub(super) fn record_rebuild(world: &mut World, device: Entity) {
    if !world.contains_resource::<HbmJournal>() {
        return;
    }
    let held = heap_figures(world, device).map_or(0, |f| f.0);
    let name = device_name(world, device);
    let at_ns = now_ns(world);
    let mut journal = world.resource_mut::<HbmJournal>();
    journal.holders.retain(|(d, _), _| *d != device);
    journal.push(HbmEvent {
        kind: HbmEventKind::Rebuild,
        device: name,
        holder: String::new(),
        offset: 0,
        bytes: held,
        used_after: 0,
        at_ns,
    });
}
