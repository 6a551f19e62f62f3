//! Cube-built pods: 4x4x4 cubes joined by optical circuit switches (OCS).
//!
//! A TPU v4 pod is 64 cubes of 4x4x4 chips (v5p: 140); inside a cube the
//! chips are wired directly, and every link that leaves a cube face goes
//! through an OCS (\[ocs\] in [`crate::hardware`]). A slice is a set of
//! cubes the OCSes wire into a torus, so the links between two cubes and
//! the wraparound links (which close each ring across the slice's outer
//! faces) are OCS circuits. Cubes the slices do not use are spares (kept
//! free to replace a failed cube) or belong to other jobs.
//!
//! With `cubes: (spares: N)` in the pod file ([`CubeOptions`]) the pod is
//! spawned with one [`Cube`] entity per cube of the whole pod, one [`Ocs`]
//! entity per switch, an [`InCube`] on every device (which cube's chip
//! backs it) and an [`OcsCircuit`] on every link that crosses a cube face.
//!
//! **Devices are places in the slice.** A device entity (its [`DeviceId`],
//! torus coordinates, host and links) is a position of the slice's torus,
//! as JAX numbers a slice's devices by their coordinates. The chip that
//! fills the position is named by its [`InCube`]. When a cube fails and a
//! spare is swapped in ([`crate::health::cubes`]), the OCSes re-point the
//! circuits of the failed cube's faces to the spare's, so the same
//! positions (ids, coordinates, links) are now the spare's chips: the torus
//! keeps its shape, degree and wiring, and only `InCube` and the circuits'
//! cubes change.
//!
//! OCS numbering: the switches of axis `a` are `16a .. 16a + 15`; the link
//! at face position `(u, v)` (the chip's two other coordinates within its
//! cube) goes to switch `16a + u + 4v`, which therefore takes exactly one
//! link from the `+` and one from the `-` face of every cube: 128 ports for
//! 64 cubes.
//!
//! [`DeviceId`]: super::DeviceId

use super::error::{InvariantError, Problem};
use super::model::{LinkSpec, Topology};
use super::schema::{CubeOptions, LinkKind};
use crate::hardware::HardwareSpec;
use bevy_ecs::prelude::*;
use serde::{Deserialize, Serialize};

/// Longest OCS reconfiguration a pod file may ask for, seconds (an hour).
pub const MAX_RECONFIGURE_SECONDS: f64 = 3600.0;

/// How a cube-built pod is laid out (validated; part of [`Topology`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CubeLayout {
    /// Chips along a cube's edge (4).
    pub edge: u32,
    /// Cubes in the whole pod.
    pub pod_cubes: u32,
    /// Cubes kept free to replace a failed one.
    pub spares: u32,
    /// OCSes per torus axis (one per face position, `edge²`).
    pub ocs_per_axis: u32,
    /// Time to swap a cube, ns.
    pub reconfigure_ns: u64,
}

/// What a cube of the pod is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CubeRole {
    /// Part of a slice, at `position` (in cubes) of slice `slice`.
    Slice {
        /// The slice.
        slice: u32,
        /// Position in the slice's grid of cubes, `[x, y, z]`.
        position: [u32; 3],
    },
    /// Free, healthy, kept to replace a failed cube.
    Spare,
    /// Swapped out of its slice after a failure; out of service until
    /// repaired.
    Retired,
    /// Not this pod file's: the rest of the pod, used by other jobs.
    Unallocated,
}

/// A cube of the pod (one entity per cube).
#[derive(Component, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cube {
    /// Dense index in the pod: the slices' cubes first, then the spares,
    /// then the unallocated ones.
    pub index: u32,
    /// What it is used for.
    pub role: CubeRole,
    /// When a chip of it was declared failed, ns; a failed chip fails its
    /// cube (the cube is the OCS's unit of replacement).
    pub failed_at_ns: Option<u64>,
}

/// An optical circuit switch (one entity per switch).
#[derive(Component, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ocs {
    /// Dense index, `16 * axis + u + 4 * v`.
    pub index: u32,
    /// The torus axis whose face links it switches.
    pub axis: u8,
    /// The face position `(u, v)` of its links on every cube.
    pub face_position: [u32; 2],
    /// Ports in use: two per cube of the pod.
    pub ports: u32,
}

/// The chip behind a device: which cube and where in it.
#[derive(Component, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InCube {
    /// The cube's index.
    pub cube: u32,
    /// The chip's coordinates within the cube.
    pub chip: [u32; 3],
}

/// A link that crosses a cube face: an OCS circuit from a port of
/// `cube_a`'s face to one of `cube_b`'s (the link's `a` and `b` ends).
#[derive(Component, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OcsCircuit {
    /// The switch (an [`Ocs::index`]).
    pub ocs: u32,
    /// The cube of the link's `a` end.
    pub cube_a: u32,
    /// The cube of the link's `b` end.
    pub cube_b: u32,
}

impl CubeLayout {
    /// Chips in one cube.
    pub fn chips_per_cube(&self) -> u32 {
        self.edge.pow(3)
    }

    /// OCSes in the pod.
    pub fn ocs_count(&self) -> u32 {
        3 * self.ocs_per_axis
    }

    /// The reconfiguration time, seconds.
    pub fn reconfigure_seconds(&self) -> f64 {
        self.reconfigure_ns as f64 * 1e-9
    }
}

impl Topology {
    /// Cubes along each axis of one slice (`None` unless cube-built).
    pub fn cube_grid(&self) -> Option<[u32; 3]> {
        let cubes = self.cubes.as_ref()?;
        Some(self.dims.map(|d| d / cubes.edge))
    }

    /// Cubes one slice is made of (0 unless cube-built).
    pub fn cubes_per_slice(&self) -> u32 {
        self.cube_grid().map_or(0, |g| g.iter().product())
    }

    /// Cubes the slices use.
    pub fn slice_cubes(&self) -> u32 {
        self.cubes_per_slice() * self.slices
    }

    /// The cube a device's position belongs to before any swap, and the
    /// chip's coordinates in it.
    pub fn home_cube(&self, device: u32) -> Option<InCube> {
        let cubes = self.cubes.as_ref()?;
        let grid = self.cube_grid()?;
        let (slice, xyz) = self.coords(device);
        let [cx, cy, cz] = xyz.map(|c| c / cubes.edge);
        Some(InCube {
            cube: slice * self.cubes_per_slice() + cx + grid[0] * (cy + grid[1] * cz),
            chip: xyz.map(|c| c % cubes.edge),
        })
    }

    /// The role a cube has when the pod is spawned.
    pub fn initial_cube_role(&self, cube: u32) -> CubeRole {
        let (Some(layout), Some(grid)) = (self.cubes.as_ref(), self.cube_grid()) else {
            return CubeRole::Unallocated;
        };
        let per_slice = self.cubes_per_slice();
        if cube < self.slice_cubes() {
            let local = cube % per_slice;
            CubeRole::Slice {
                slice: cube / per_slice,
                position: [
                    local % grid[0],
                    (local / grid[0]) % grid[1],
                    local / (grid[0] * grid[1]),
                ],
            }
        } else if cube < self.slice_cubes() + layout.spares {
            CubeRole::Spare
        } else {
            CubeRole::Unallocated
        }
    }

    /// The OCS circuit a torus link runs over: `Some` for an ICI link along
    /// an axis that crosses a cube face (between two cubes, or a
    /// wraparound), `None` for a link inside a cube, a DCN link or an
    /// explicit link.
    pub fn ocs_circuit(&self, link: &LinkSpec) -> Option<OcsCircuit> {
        let layout = self.cubes.as_ref()?;
        let axis = usize::from(link.axis?);
        if link.kind != LinkKind::Ici || axis > 2 {
            return None;
        }
        let (a, b) = (self.home_cube(link.a)?, self.home_cube(link.b)?);
        if a.cube == b.cube && !link.wraps {
            return None;
        }
        let others: Vec<u32> = (0..3).filter(|&o| o != axis).map(|o| a.chip[o]).collect();
        Some(OcsCircuit {
            ocs: axis as u32 * layout.ocs_per_axis + others[0] + layout.edge * others[1],
            cube_a: a.cube,
            cube_b: b.cube,
        })
    }
}

/// Checks a `cubes` block against the generation and the slices: the
/// field at fault and the problem.
pub(super) fn resolve_cubes(
    given: Option<&CubeOptions>,
    spec: &HardwareSpec,
    shape: &str,
    dims: [u32; 3],
    slices: u32,
) -> Result<Option<CubeLayout>, (String, Problem)> {
    let Some(given) = given else {
        return Ok(None);
    };
    let refuse = |field: &str, reason: String| Err((field.to_string(), Problem::Cubes { reason }));
    let Some(ocs) = spec.ocs else {
        return refuse(
            "cubes",
            format!(
                "{} pods are not built of cubes; only {} slices are sets of 4x4x4 cubes \
                 joined by optical circuit switches",
                spec.name,
                crate::hardware::TpuGeneration::cube_built_names()
            ),
        );
    };
    let edge = ocs.cube_edge;
    if let Some(axis) = (0..3).find(|&a| !dims[a].is_multiple_of(edge)) {
        return refuse(
            "cubes",
            format!(
                "slice `{shape}` is not made of whole {edge}x{edge}x{edge} cubes (dimension \
                 {axis} is {} chips, not a multiple of {edge}); smaller slices are wired inside \
                 one cube, without optical circuit switches",
                dims[axis]
            ),
        );
    }
    let pod_cubes = given.pod_cubes.unwrap_or(ocs.pod_cubes);
    if pod_cubes == 0 || pod_cubes > ocs.pod_cubes {
        return refuse(
            "cubes.pod_cubes",
            format!(
                "{pod_cubes} cubes; a {} pod has 1 to {} cubes",
                spec.name, ocs.pod_cubes
            ),
        );
    }
    let per_slice = u64::from(dims.iter().map(|d| d / edge).product::<u32>());
    let used = per_slice * u64::from(slices);
    if used > u64::from(pod_cubes) {
        return refuse(
            if slices > 1 { "slices" } else { "shape" },
            format!(
                "{slices} slice(s) of `{shape}` use {used} cubes ({per_slice} each), more than \
                 the pod's {pod_cubes}"
            ),
        );
    }
    let spares = given.spares.unwrap_or(0);
    if used + u64::from(spares) > u64::from(pod_cubes) {
        return refuse(
            "cubes.spares",
            format!(
                "{spares} spare cube(s) and the slices' {used} are more than the pod's \
                 {pod_cubes} cubes; at most {} spares fit",
                u64::from(pod_cubes) - used
            ),
        );
    }
    let seconds = given.reconfigure_seconds.unwrap_or(ocs.reconfigure_seconds);
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= MAX_RECONFIGURE_SECONDS) {
        return refuse(
            "cubes.reconfigure_seconds",
            format!("{seconds} s; the OCS reconfiguration takes more than 0 and at most 3600 s"),
        );
    }
    Ok(Some(CubeLayout {
        edge,
        pod_cubes,
        spares,
        ocs_per_axis: ocs.ocs_per_dimension,
        reconfigure_ns: (seconds * 1e9).round() as u64,
    }))
}

/// The invariants of a [`CubeLayout`] in a topology that did not come
/// through the loader (a decoded snapshot).
pub(super) fn check_layout(topology: &Topology, layout: &CubeLayout) -> Result<(), InvariantError> {
    let whole = layout.edge >= 1 && topology.dims.iter().all(|d| d.is_multiple_of(layout.edge));
    let fits =
        u64::from(topology.slice_cubes()) + u64::from(layout.spares) <= u64::from(layout.pod_cubes);
    if !whole || !fits || layout.ocs_per_axis != layout.edge.pow(2) {
        return Err(InvariantError::CubesDoNotFit {
            layout: *layout,
            dims: topology.dims,
            slices: topology.slices,
        });
    }
    Ok(())
}

/// Spawns the pod's cubes and switches, and tags the devices and the
/// OCS-routed links (`devices` and `links` in the order the topology
/// spawned them). Nothing for a pod not built of cubes.
pub(super) fn spawn_cubes(
    world: &mut World,
    topology: &Topology,
    devices: &[Entity],
    links: &[(Entity, LinkSpec)],
) {
    let Some(layout) = topology.cubes else {
        return;
    };
    world.spawn_batch((0..layout.pod_cubes).map(|index| Cube {
        index,
        role: topology.initial_cube_role(index),
        failed_at_ns: None,
    }));
    world.spawn_batch((0..layout.ocs_count()).map(|index| {
        let face = index % layout.ocs_per_axis;
        Ocs {
            index,
            axis: (index / layout.ocs_per_axis) as u8,
            face_position: [face % layout.edge, face / layout.edge],
            ports: 2 * layout.pod_cubes,
        }
    }));
    for (id, &entity) in devices.iter().enumerate() {
        if let Some(home) = topology.home_cube(id as u32) {
            world.entity_mut(entity).insert(home);
        }
    }
    for (entity, spec) in links {
        if let Some(circuit) = topology.ocs_circuit(spec) {
            world.entity_mut(*entity).insert(circuit);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::topology::parse_topology;

    #[test]
    fn face_links_go_to_the_switch_of_their_face_position() {
        let t = parse_topology(
            "Pod(name: \"t\", generation: \"v4\", shape: \"4x4x8\", cubes: (spares: 1))",
            "t.ron",
        )
        .unwrap();
        let links = t.links();
        let find = |axis: u8, from: [u32; 3]| {
            let a = t.device_at(0, from);
            let link = links
                .iter()
                .find(|l| l.axis == Some(axis) && l.a == a)
                .unwrap();
            t.ocs_circuit(link)
        };
        // The x wraparound of (3, 1, 6): face position (y, z mod 4) = (1, 2).
        let wrap = find(0, [3, 1, 6]).unwrap();
        assert_eq!((wrap.ocs, wrap.cube_a, wrap.cube_b), (1 + 4 * 2, 1, 1));
        // z from plane 3 to plane 4 crosses from cube 0 to cube 1 on switch
        // 32 + x + 4y.
        let z = find(2, [2, 3, 3]).unwrap();
        assert_eq!((z.ocs, z.cube_a, z.cube_b), (32 + 2 + 4 * 3, 0, 1));
        assert_eq!(find(0, [1, 1, 1]), None, "inside a cube");
    }

    #[test]
    fn a_forged_layout_that_does_not_fit_is_refused() {
        let mut t = parse_topology(
            "Pod(name: \"t\", generation: \"v4\", shape: \"4x4x8\", cubes: (spares: 1))",
            "t.ron",
        )
        .unwrap();
        assert!(t.check_invariants().is_ok());
        if let Some(cubes) = t.cubes.as_mut() {
            cubes.spares = 63;
        }
        assert!(
            t.check_invariants()
                .unwrap_err()
                .to_string()
                .contains("do not fit")
        );
    }
}
