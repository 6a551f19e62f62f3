//! Where a [`TPUOptimizer`] keeps its devices and state: its own world or a
//! pod's ([`Place`]), the device entities it sets up there, the optimizer
//! state entities it creates on the first step of a shape, drops on a
//! reset, and captures and restores with a world snapshot
//! ([`tpu_registry`]). The components themselves are in [`super::state`].

use bevy_ecs::prelude::*;
use ndarray::{ArrayD, IxDyn};

use crate::error::{OptimError, Result};
use crate::exec::runtime::Element;
use crate::memory::ALIGNMENT;
use crate::memory::HbmUsage;
use crate::memory::Heap;
use crate::optimizers::OptimizerError;
use crate::optimizers::{FloatElement, Optimizer};
use crate::persist::{SnapshotRegistry, WorldSnapshot};
use crate::pod::Pod;
use crate::topology::{Device, DeviceId, HbmCapacity};

use super::{TPUConfig, TPUOptimizer};
use crate::memory::device as hbm;
use crate::memory::{DeviceHeap, OptimizerCount, OptimizerSlot};

/// The components of a TPU optimizer's world that a snapshot carries.
pub fn tpu_registry() -> SnapshotRegistry {
    let mut registry = SnapshotRegistry::default();
    registry
        .component::<Device>("topology.Device")
        .component::<HbmCapacity>("topology.HbmCapacity")
        .component::<OptimizerSlot>("tpu.OptimizerSlot")
        .component::<OptimizerCount>("tpu.OptimizerCount");
    registry
}

/// Where an optimizer's devices and state live.
pub(super) enum Place {
    /// A world of its own with one device entity per chip.
    Own(World),
    /// The devices of a pod, monitored by the pod's `Step` schedule.
    Pod(Pod),
}

impl Place {
    pub(super) fn world(&self) -> &World {
        match self {
            Place::Own(world) => world,
            Place::Pod(pod) => pod.world(),
        }
    }

    pub(super) fn world_mut(&mut self) -> &mut World {
        match self {
            Place::Own(world) => world,
            Place::Pod(pod) => pod.world_mut(),
        }
    }
}

/// The world of an optimizer of its own: one device entity per chip of
/// `config` (`chips` of them), each with its HBM heap.
pub(super) fn own_devices(config: &TPUConfig, chips: usize) -> Result<(World, Vec<Entity>)> {
    let spec = config.tpu_version.spec();
    let hbm = config.hbm_bytes.unwrap_or(spec.hbm_bytes);
    let capacity = usize::try_from(hbm).map_err(|_| {
        OptimError::invalid_config(format!("hbm_bytes = {hbm} does not fit this host"))
    })?;
    let mut world = World::new();
    let devices = (0..chips as u32)
        .map(|id| {
            world
                .spawn((
                    Device {
                        id: DeviceId(id),
                        generation: config.tpu_version,
                        cores: spec.cores_per_chip,
                    },
                    HbmCapacity(hbm),
                    DeviceHeap(Heap::new(capacity, ALIGNMENT)),
                    HbmUsage(0),
                ))
                .id()
        })
        .collect();
    Ok((world, devices))
}

/// The first `chips` devices of `pod` for an optimizer configured with
/// `config`: checked against the pod, given `config.hbm_bytes` if set,
/// marked as the optimizer's and with their heaps rebuilt around any state
/// already there.
pub(super) fn pod_devices(config: &TPUConfig, chips: usize, pod: &mut Pod) -> Result<Vec<Entity>> {
    let topology = pod.topology();
    if topology.generation != config.tpu_version {
        return Err(OptimError::invalid_config(format!(
            "the optimizer is configured for {}, but {} is a {} pod",
            config.tpu_version, topology.name, topology.generation
        )));
    }
    if chips > topology.num_devices() as usize {
        return Err(OptimError::invalid_config(format!(
            "num_cores = {} needs {chips} chips, but {} has {}",
            config.num_cores,
            topology.name,
            topology.num_devices()
        )));
    }
    let devices: Vec<Entity> = (0..chips as u32)
        .map(|id| pod.device_entity(id))
        .collect::<Result<_>>()?;
    let world = pod.world_mut();
    if let Some(bytes) = config.hbm_bytes {
        for &device in &devices {
            world.entity_mut(device).insert(HbmCapacity(bytes));
        }
    }
    hbm::mark(world, &devices);
    hbm::rebuild_heaps(world)?;
    Ok(devices)
}

impl<O, A> TPUOptimizer<O, A>
where
    O: Optimizer<A, IxDyn>,
    A: FloatElement + Element,
{
    /// The steps the state has taken (0 without state).
    pub(super) fn stored_count(&mut self) -> i32 {
        self.counts
            .iter(self.place.world())
            .next()
            .map_or(0, |(_, c)| c.count)
    }

    /// Makes sure the state exists for `shape`; returns the next count.
    pub(super) fn prepare_state(&mut self, shape: &[usize]) -> Result<i32> {
        let rule_slots = self.base.update_rule().map_or(&[][..], |r| r.slot_names());
        // The stored shape is copied only when it differs (every step reads
        // this).
        let existing = self
            .counts
            .iter(self.place.world())
            .next()
            .map(|(e, c)| (e, c.count, (c.shape != shape).then(|| c.shape.clone())));
        if let Some((e, count, other_shape)) = existing {
            if let Some(state) = other_shape {
                if !rule_slots.is_empty() {
                    return Err(OptimError::from(OptimizerError::StateShapeMismatch {
                        optimizer: self.base.name().to_owned(),
                        state,
                        params: shape.to_vec(),
                    }));
                }
                // No per-element state: any shape, like the base optimizer.
                if let Some(mut stored) = self.place.world_mut().get_mut::<OptimizerCount>(e) {
                    stored.shape = shape.to_vec();
                }
            }
            return Ok(count.saturating_add(1));
        }
        let initial = self
            .base
            .update_rule()
            .map(|r| r.initial_slot_values())
            .unwrap_or_default();
        let world = self.place.world_mut();
        let mut spawned = Vec::with_capacity(rule_slots.len());
        for (i, name) in rule_slots.iter().enumerate() {
            let value = initial.get(i).copied().unwrap_or_else(A::zero);
            let slot = world.spawn(OptimizerSlot {
                name: (*name).to_owned(),
                index: i as u32,
                tensor: A::into_tensor(ArrayD::from_elem(IxDyn(shape), value)),
            });
            spawned.push(slot.id());
        }
        // The state is resident from now until it is dropped; a state that
        // does not fit is never created.
        let reserved = match hbm::reserve_state(world) {
            Ok(reserved) => reserved,
            Err(e) => {
                for slot in spawned {
                    world.despawn(slot);
                }
                return Err(e.into());
            }
        };
        for (device, block, name) in reserved {
            self.record_reserve(device, block, &format!("state `{name}`"));
        }
        self.place.world_mut().spawn(OptimizerCount {
            count: 0,
            shape: shape.to_vec(),
        });
        Ok(1)
    }

    /// [`TPUOptimizer::reset_state`]: despawns the state entities, releasing
    /// their HBM, and resets the base.
    pub(super) fn drop_state(&mut self) {
        let world = self.place.world_mut();
        let entities: Vec<Entity> = world
            .query_filtered::<Entity, Or<(With<OptimizerSlot>, With<OptimizerCount>)>>()
            .iter(world)
            .collect();
        for e in entities {
            // A block that cannot be released was never this heap's: the
            // heap is rebuilt from the remaining state instead.
            if hbm::release_slot(world, e).is_err() {
                world.entity_mut(e).remove::<hbm::ResidentBlock>();
            }
            world.despawn(e);
        }
        self.base.reset();
    }

    /// [`TPUOptimizer::snapshot`]: the optimizer's own world, or the pod's.
    pub(super) fn capture(&mut self) -> Result<WorldSnapshot> {
        let tick = u64::try_from(self.step_count()).unwrap_or(0);
        match &mut self.place {
            Place::Own(world) => Ok(tpu_registry().capture(world, tick)?),
            Place::Pod(pod) => pod.snapshot(),
        }
    }

    /// [`TPUOptimizer::restore`]: the world restored, the optimizer's devices
    /// found again and their heaps rebuilt.
    pub(super) fn restore_world(&mut self, snapshot: &WorldSnapshot) -> Result<()> {
        match &mut self.place {
            Place::Own(world) => tpu_registry().restore(world, snapshot)?,
            Place::Pod(pod) => pod.restore_snapshot(snapshot)?,
        }
        self.find_devices()
    }

    /// Whether the world was restored under the optimizer since it last
    /// found its devices: a restore despawns every engine entity, so a held
    /// device entity without its `Device` was restored away (a despawned
    /// entity's id is never handed out again with the same generation).
    fn devices_restored_away(&self) -> bool {
        let world = self.place.world();
        self.devices
            .iter()
            .any(|&e| world.get::<Device>(e).is_none())
    }

    /// Before a step: if the pod's world was restored by anything other than
    /// [`TPUOptimizer::restore`] (a `FaultToleranceManager` rollback, say),
    /// the devices are found again exactly as that restore finds them, so
    /// both ways leave the same working state.
    pub(super) fn adopt_restored_world(&mut self) -> Result<()> {
        if self.devices_restored_away() {
            self.find_devices()?;
        }
        Ok(())
    }

    /// The entity of the optimizer's device `id`, found again by id if the
    /// world was restored under the optimizer.
    pub(super) fn device_entity_by_id(&self, id: u32) -> Option<Entity> {
        let world = self.place.world();
        let keep = self.devices.len() as u32;
        let by_id = |e: &Entity| world.get::<Device>(*e).is_some_and(|d| d.id.0 == id);
        if let Some(&e) = self.devices.iter().find(|e| by_id(e)) {
            return Some(e);
        }
        if id >= keep || !self.devices_restored_away() {
            return None;
        }
        let mut q = world.try_query::<(Entity, &Device)>()?;
        q.iter(world).find(|(_, d)| d.id.0 == id).map(|(e, _)| e)
    }

    /// The optimizer's devices found again after a restore (by id: on a pod
    /// its first chips), marked as holding a heap, and their heaps rebuilt.
    fn find_devices(&mut self) -> Result<()> {
        // On a pod the optimizer keeps to its first chips.
        let keep = match self.place {
            Place::Own(_) => usize::MAX,
            Place::Pod(_) => self.devices.len(),
        };
        let world = self.place.world_mut();
        let mut q = world.query::<(Entity, &Device)>();
        let mut found: Vec<(u32, Entity)> = q.iter(world).map(|(e, d)| (d.id.0, e)).collect();
        found.sort();
        found.truncate(keep);
        self.devices = found.into_iter().map(|(_, e)| e).collect();
        self.device_labels.clear();
        // The snapshot may predate the optimizer's use of its devices.
        hbm::mark(world, &self.devices);
        Ok(hbm::rebuild_heaps(world)?)
    }
}
