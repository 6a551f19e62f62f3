//! Cube failures and spare-cube swaps in a cube-built pod
//! ([`crate::topology::cubes`]).
//!
//! A chip the detector declares failed fails its cube ([`mark_failed_cubes`],
//! in the same tick): the cube is the optical circuit switches' unit of
//! replacement, so its 63 healthy chips leave the slice with it.
//! [`swap_in_spares`] is the reconfiguration: each failed cube of a slice is
//! replaced by a spare, the OCS circuits of its faces are re-pointed to the
//! spare's, and the slice's positions it held are now the spare's healthy
//! chips (running, heard from now, not excluded). The failed cube is
//! retired. The torus (ids, coordinates, links) keeps its shape; the time
//! the switches take is [`crate::topology::CubeLayout::reconfigure_ns`],
//! which the caller waits for (the sharded model's recovery does).
//!
//! Spare cubes have no device entities until swapped in, so they are
//! assumed healthy while they wait.

use bevy_ecs::prelude::*;
use serde::{Deserialize, Serialize};

use super::{
    ControlJitter, DeviceState, Excluded, FaultError, Health, Heartbeat, InjectedFault, LastHeard,
};
use crate::topology::{Cube, CubeRole, Device, DeviceId, DeviceIndex, InCube, Link, OcsCircuit};
use crate::transport::LinkState;

/// A failed chip fails its cube: every cube with a chip whose health just
/// became failed is marked failed at that time.
pub fn mark_failed_cubes(
    devices: Query<(&Health, &InCube), Changed<Health>>,
    mut cubes: Query<&mut Cube>,
) {
    for (health, in_cube) in &devices {
        let Health::Failed { detected_at_ns } = *health else {
            continue;
        };
        for mut cube in &mut cubes {
            if cube.index == in_cube.cube && cube.failed_at_ns.is_none() {
                cube.failed_at_ns = Some(detected_at_ns);
            }
        }
    }
}

/// One cube swapped for a spare.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CubeSwap {
    /// The failed cube, now retired.
    pub failed: u32,
    /// The spare, now in the failed cube's place.
    pub spare: u32,
    /// The slice.
    pub slice: u32,
    /// The place in the slice's grid of cubes.
    pub position: [u32; 3],
    /// The slice's devices (positions) now backed by the spare's chips.
    pub devices: Vec<DeviceId>,
}

/// The cubes behind `devices`, sorted and without repeats; an error for a
/// device with no cube (a pod not built of cubes).
pub fn cubes_of(world: &World, devices: &[DeviceId]) -> Result<Vec<u32>, FaultError> {
    let index = world.resource::<DeviceIndex>();
    let mut cubes = Vec::with_capacity(devices.len());
    for &device in devices {
        let entity = index.get(device).ok_or(FaultError::UnknownDevice(device))?;
        let in_cube = world
            .get::<InCube>(entity)
            .ok_or(FaultError::NotCubeBuilt(device))?;
        cubes.push(in_cube.cube);
    }
    cubes.sort_unstable();
    cubes.dedup();
    Ok(cubes)
}

/// The spare cubes, in index order.
pub fn spare_cubes(world: &mut World) -> Vec<u32> {
    let mut q = world.query::<&Cube>();
    let mut spares: Vec<u32> = q
        .iter(world)
        .filter(|c| c.role == CubeRole::Spare && c.failed_at_ns.is_none())
        .map(|c| c.index)
        .collect();
    spares.sort_unstable();
    spares
}

/// The spare to take for each of `failed` (the lowest-numbered first), or
/// the error naming the cubes and the spares there are. Changes nothing.
pub fn plan_swaps(world: &mut World, failed: &[u32]) -> Result<Vec<(u32, u32)>, FaultError> {
    let spares = spare_cubes(world);
    if spares.len() < failed.len() {
        return Err(FaultError::NoSpareCube {
            failed: failed.to_vec(),
            spares: spares.len() as u32,
        });
    }
    let mut q = world.query::<&Cube>();
    for &cube in failed {
        let in_slice = q
            .iter(world)
            .any(|c| c.index == cube && matches!(c.role, CubeRole::Slice { .. }));
        if !in_slice {
            return Err(FaultError::CubeNotInSlice { cube });
        }
    }
    Ok(failed.iter().copied().zip(spares).collect())
}

/// Swaps every cube of `failed` for a spare (module docs) at `now_ns`. On
/// `Err` (too few spares, a cube not in a slice) nothing changed.
pub fn swap_in_spares(
    world: &mut World,
    failed: &[u32],
    now_ns: u64,
) -> Result<Vec<CubeSwap>, FaultError> {
    let plan = plan_swaps(world, failed)?;
    Ok(plan
        .into_iter()
        .map(|(failed, spare)| swap_one(world, failed, spare, now_ns))
        .collect())
}

fn swap_one(world: &mut World, failed: u32, spare: u32, now_ns: u64) -> CubeSwap {
    let mut slot = None;
    let mut q = world.query::<&mut Cube>();
    for mut cube in q.iter_mut(world) {
        if cube.index == failed {
            if let CubeRole::Slice { slice, position } = cube.role {
                slot = Some((slice, position));
            }
            cube.role = CubeRole::Retired;
            cube.failed_at_ns.get_or_insert(now_ns);
        }
    }
    let (slice, position) = slot.expect("plan_swaps checked the cube is in a slice");
    for mut cube in q.iter_mut(world) {
        if cube.index == spare {
            cube.role = CubeRole::Slice { slice, position };
        }
    }
    let mut devices = world.query::<(Entity, &Device, &InCube)>();
    let mut moved: Vec<(Entity, DeviceId)> = devices
        .iter(world)
        .filter(|(_, _, c)| c.cube == failed)
        .map(|(e, d, _)| (e, d.id))
        .collect();
    moved.sort_by_key(|m| m.1);
    for &(entity, _) in &moved {
        fresh_chip(world, entity, spare, now_ns);
    }
    let swapped: std::collections::HashSet<Entity> = moved.iter().map(|m| m.0).collect();
    let mut links = world.query::<(&Link, Option<&mut OcsCircuit>, Option<&mut LinkState>)>();
    for (link, circuit, state) in links.iter_mut(world) {
        if let Some(mut circuit) = circuit {
            if circuit.cube_a == failed {
                circuit.cube_a = spare;
            }
            if circuit.cube_b == failed {
                circuit.cube_b = spare;
            }
        }
        // The spare's own links and its new circuits are fresh.
        if (swapped.contains(&link.a) || swapped.contains(&link.b))
            && let Some(mut state) = state
            && !state.up
        {
            state.up = true;
        }
    }
    CubeSwap {
        failed,
        spare,
        slice,
        position,
        devices: moved.into_iter().map(|m| m.1).collect(),
    }
}

/// The place `entity` is now backed by the spare's chip: running, healthy,
/// heard from at `now_ns`, no fault, not excluded.
fn fresh_chip(world: &mut World, entity: Entity, spare: u32, now_ns: u64) {
    let mut e = world.entity_mut(entity);
    if let Some(mut c) = e.get_mut::<InCube>() {
        c.cube = spare;
    }
    if e.contains::<DeviceState>() {
        e.insert((
            DeviceState::Running,
            Health::Healthy,
            LastHeard { sent_ns: now_ns },
            InjectedFault::default(),
            ControlJitter::default(),
        ));
    }
    if let Some(mut heartbeat) = e.get_mut::<Heartbeat>()
        && heartbeat.next_due_ns < now_ns
    {
        heartbeat.next_due_ns = now_ns;
    }
    e.remove::<Excluded>();
}
