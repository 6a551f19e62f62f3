//! Spawning a [`Topology`] into a world: hosts, then devices, then links.

use super::components::*;
use super::model::Topology;
use bevy_ecs::prelude::*;

/// Spawns hosts, devices and links (and, for a cube-built pod, its cubes
/// and optical circuit switches: [`super::cubes`]) for `topology` and inserts the
/// [`PodTopology`] and [`DeviceIndex`] resources.
///
/// Spawning is batched: v4-8192 (4096 chips, 12,288 links) spawns in a few
/// milliseconds. Entities are spawned in id order, so the same topology
/// always produces the same world.
pub fn spawn_topology(world: &mut World, topology: &Topology) {
    let hosts: Vec<Entity> = world
        .spawn_batch((0..topology.num_hosts()).map(|index| Host { index }))
        .collect();
    let generation = topology.generation;
    let devices: Vec<Entity> = world
        .spawn_batch((0..topology.num_devices()).map(|id| {
            let (slice, xyz) = topology.coords(id);
            (
                Device {
                    id: DeviceId(id),
                    generation,
                    cores: topology.cores_per_chip,
                },
                TorusCoords { slice, xyz },
                HbmCapacity(topology.hbm_bytes),
                OnHost(hosts[topology.host_of(id) as usize]),
            )
        }))
        .collect();
    let links = topology.links();
    let specs = topology.cubes.is_some().then(|| links.clone());
    let link_entities: Vec<Entity> = world
        .spawn_batch(links.into_iter().map(|spec| {
            (
                Link {
                    a: devices[spec.a as usize],
                    b: devices[spec.b as usize],
                    kind: spec.kind,
                    axis: spec.axis,
                    wraps: spec.wraps,
                    bytes_per_s: spec.params.bytes_per_s,
                    latency_ns: spec.params.latency_ns,
                },
                LinkTraffic::default(),
            )
        }))
        .collect();
    if let Some(specs) = specs {
        let links: Vec<(Entity, _)> = link_entities.into_iter().zip(specs).collect();
        super::cubes::spawn_cubes(world, topology, &devices, &links);
    }
    world.insert_resource(DeviceIndex(devices));
    world.insert_resource(PodTopology(topology.clone()));
}
