//! Components of the pod's entities: devices (chips), hosts and links.

use super::model::Topology;
use super::schema::LinkKind;
use crate::hardware::TpuGeneration;
use bevy_ecs::prelude::*;
use serde::{Deserialize, Serialize};

/// A chip's dense id: `slice * chips_per_slice + x + X * (y + Y * z)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeviceId(pub u32);

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "device {}", self.0)
    }
}

/// The dense id as a bare number, so host calls read `pod.kill_device(3)`.
impl From<u32> for DeviceId {
    fn from(id: u32) -> DeviceId {
        DeviceId(id)
    }
}

/// A chip.
#[derive(Component, Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Device {
    /// Dense id.
    pub id: DeviceId,
    /// Chip generation.
    pub generation: TpuGeneration,
    /// TensorCores on the chip.
    pub cores: u32,
}

/// A chip's place in the torus.
#[derive(Component, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TorusCoords {
    /// Which slice of a multislice pod.
    pub slice: u32,
    /// `[x, y, z]` within the slice.
    pub xyz: [u32; 3],
}

/// HBM capacity of a chip, bytes.
#[derive(Component, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HbmCapacity(pub u64);

/// A host machine that drives a block of chips.
#[derive(Component, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    /// Dense host index.
    pub index: u32,
}

/// The host that drives a device (device → host).
#[derive(Component, Debug, Clone, Copy, PartialEq, Eq)]
#[relationship(relationship_target = HostDevices)]
pub struct OnHost(pub Entity);

/// The devices a host drives, kept by bevy from [`OnHost`].
#[derive(Component, Debug, Default, PartialEq, Eq)]
#[relationship_target(relationship = OnHost)]
pub struct HostDevices(Vec<Entity>);

impl HostDevices {
    /// The device entities.
    pub fn devices(&self) -> &[Entity] {
        &self.0
    }
}

/// A bidirectional channel between two devices.
#[derive(Component, Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// One end (a device entity).
    pub a: Entity,
    /// The other end.
    pub b: Entity,
    /// ICI or DCN.
    pub kind: LinkKind,
    /// Torus axis of an ICI link; `None` for explicit links.
    pub axis: Option<u8>,
    /// Whether it is a ring's wraparound hop.
    pub wraps: bool,
    /// Bytes per second in each direction.
    pub bytes_per_s: f64,
    /// One-way latency, ns.
    pub latency_ns: u64,
}

impl Link {
    /// The end that is not `device`, if `device` is an end.
    pub fn other_end(&self, device: Entity) -> Option<Entity> {
        if self.a == device {
            Some(self.b)
        } else if self.b == device {
            Some(self.a)
        } else {
            None
        }
    }
}

/// Bytes and messages a link has carried, per direction (`a → b`, `b → a`).
#[derive(Component, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkTraffic {
    /// Bytes sent from `a` to `b`.
    pub bytes_ab: u64,
    /// Bytes sent from `b` to `a`.
    pub bytes_ba: u64,
    /// Messages in either direction.
    pub messages: u64,
}

/// The pod's validated description, as loaded.
#[derive(Resource, Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodTopology(pub Topology);

/// Device entities by [`DeviceId`], for O(1) lookup.
#[derive(Resource, Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceIndex(pub Vec<Entity>);

impl DeviceIndex {
    /// The entity of a device id.
    pub fn get(&self, id: DeviceId) -> Option<Entity> {
        self.0.get(id.0 as usize).copied()
    }
}
