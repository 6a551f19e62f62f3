//! Figures derived from the entity graph: counts, diameter, bisection and
//! all-reduce bandwidth.
//!
//! Nothing here reads a table of published numbers: every figure is computed
//! from the `Device`, `Host` and `Link` entities in the world, so a pod file
//! with different links (or a link cut at run time) gives different figures.
//!
//! - **Diameter**: the longest shortest path, in hops. When the link entities
//!   are exactly one slice's torus or mesh (no explicit links, none removed),
//!   it has a closed form: the sum over axes of `d - 1` for a mesh axis of `d`
//!   chips and `⌊d / 2⌋` for a wrapped one (a shortest path moves along each
//!   axis independently). Any other graph is searched breadth-first from
//!   every chip (in parallel), which is quadratic in the chips.
//! - **Bisection bandwidth**: the minimum, over axis-aligned cuts that halve
//!   an axis (x, y, z, or the slice index of a multislice pod), of the
//!   bandwidth crossing the cut in one direction. The **DCN bisection** is
//!   the DCN links' share of the slice cut.
//! - **All-reduce bandwidth**: the sum of every link's bandwidth in both
//!   directions — what a bandwidth-optimal all-reduce keeps busy when rings
//!   run both ways along every axis. Google's "all-reduce bandwidth per pod"
//!   is this figure (v5e-256: 512 links × 2 × 50 GB/s = 51.2 TB/s). A twist
//!   moves links but keeps their number, so it leaves this figure alone.
//! - **Mean hops**: the mean shortest-path length over ordered pairs of
//!   distinct chips (closed form on a plain torus, as the diameter).
//! - **All-to-all bandwidth**: an upper bound on what a uniform all-to-all
//!   (every chip sends the same amount to every other) can deliver in total:
//!   the lesser of the link-capacity bound (all-reduce bandwidth / mean hops:
//!   every byte crosses `mean hops` links) and the bisection bound (half the
//!   chips send `N/2 · N/2` pairs' worth across the cut, so the total is at
//!   most `bisection · 4 (N - 1) / N`). This is the figure a twisted torus
//!   improves: shorter paths and a wider cut with the same links.

use super::components::{Device, Host, Link, PodTopology, TorusCoords};
use super::cubes::{Cube, CubeRole, Ocs, OcsCircuit};
use super::model::Topology;
use super::schema::LinkKind;
use bevy_ecs::prelude::*;
use rayon::prelude::*;
use serde::Serialize;
use std::collections::HashMap;

/// Figures of a pod, computed from its entities.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopologyFigures {
    /// Pod name.
    pub name: String,
    /// Chip generation.
    pub generation: String,
    /// Shape of one slice, as written.
    pub shape: String,
    /// Slices.
    pub slices: u32,
    /// Device (chip) entities (`chips` in JSON).
    #[serde(rename = "chips")]
    pub devices: u32,
    /// TensorCores over all chips.
    pub cores: u64,
    /// Host entities.
    pub hosts: u32,
    /// Link entities.
    pub links: u32,
    /// ICI links.
    pub ici_links: u32,
    /// DCN links.
    pub dcn_links: u32,
    /// Longest shortest path between two devices, in hops; `None` when some
    /// device cannot reach another.
    pub diameter_hops: Option<u32>,
    /// Bandwidth across the weakest axis-aligned halving cut, bytes/s, one way.
    pub bisection_bytes_per_s: f64,
    /// The cut that achieves it (`"x"`, `"y"`, `"z"` or `"slice"`).
    pub bisection_cut: Option<String>,
    /// DCN bandwidth across the cut that halves the slices, bytes/s one way
    /// (0 for one slice): what a cross-slice collective phase can use.
    pub dcn_bisection_bytes_per_s: f64,
    /// Sum of all link bandwidth in both directions, bytes/s.
    pub allreduce_bytes_per_s: f64,
    /// Whether the wraparound links are twisted (`twist: "twisted"`).
    pub twisted: bool,
    /// Mean shortest path between two distinct devices, hops; `None` when
    /// disconnected or a single device.
    pub mean_hops: Option<f64>,
    /// Upper bound on a uniform all-to-all's total delivered bandwidth,
    /// bytes/s (see the module docs).
    pub alltoall_bytes_per_s: f64,
    /// HBM over all chips, bytes.
    pub hbm_bytes: u64,
    /// What the pod file was accepted with only a warning (a custom shape).
    pub warnings: Vec<String>,
    /// The cubes and optical circuit switches of a cube-built pod, counted
    /// from their entities; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cubes: Option<CubeFigures>,
}

/// A cube-built pod's cubes and switches, counted from the entities.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CubeFigures {
    /// Cube entities (the whole pod's).
    pub pod_cubes: u32,
    /// Cubes in the slices.
    pub slice_cubes: u32,
    /// Healthy spare cubes.
    pub spare_cubes: u32,
    /// Cubes swapped out after a failure.
    pub retired_cubes: u32,
    /// Cubes with a failed chip.
    pub failed_cubes: u32,
    /// Optical circuit switch entities.
    pub ocs: u32,
    /// Links that run over a switch (cross a cube face).
    pub ocs_links: u32,
    /// Time to swap a cube, seconds.
    pub reconfigure_seconds: f64,
}

fn cube_figures(world: &mut World, topology: &Topology) -> Option<CubeFigures> {
    let layout = topology.cubes?;
    let mut cubes = world.query::<&Cube>();
    let mut figures = CubeFigures {
        pod_cubes: 0,
        slice_cubes: 0,
        spare_cubes: 0,
        retired_cubes: 0,
        failed_cubes: 0,
        ocs: world.query::<&Ocs>().iter(world).count() as u32,
        ocs_links: world.query::<&OcsCircuit>().iter(world).count() as u32,
        reconfigure_seconds: layout.reconfigure_seconds(),
    };
    for cube in cubes.iter(world) {
        figures.pod_cubes += 1;
        figures.failed_cubes += u32::from(cube.failed_at_ns.is_some());
        match cube.role {
            CubeRole::Slice { .. } => figures.slice_cubes += 1,
            CubeRole::Spare if cube.failed_at_ns.is_none() => figures.spare_cubes += 1,
            CubeRole::Retired => figures.retired_cubes += 1,
            _ => {}
        }
    }
    Some(figures)
}

/// The devices in `world`: each entity's dense index, its `[x, y, z,
/// slice]` by index, and the TensorCores of all of them.
struct DeviceCensus {
    index: HashMap<Entity, u32>,
    coords: Vec<[u32; 4]>,
    cores: u64,
}

fn census_devices(world: &mut World) -> DeviceCensus {
    let mut device_query = world.query::<(Entity, &Device, &TorusCoords)>();
    let mut index: HashMap<Entity, u32> = HashMap::new();
    let mut coords: Vec<[u32; 4]> = Vec::new();
    let mut cores = 0u64;
    for (entity, device, place) in device_query.iter(world) {
        index.insert(entity, coords.len() as u32);
        let [x, y, z] = place.xyz;
        coords.push([x, y, z, place.slice]);
        cores += u64::from(device.cores);
    }
    DeviceCensus {
        index,
        coords,
        cores,
    }
}

/// The links in `world`: every edge between known devices (and the DCN
/// ones again), the counts by kind, and the all-reduce bandwidth (twice
/// every link's).
struct LinkCensus {
    edges: Vec<(u32, u32, f64)>,
    dcn_edges: Vec<(u32, u32, f64)>,
    ici_links: u32,
    dcn_links: u32,
    allreduce: f64,
}

fn census_links(world: &mut World, index: &HashMap<Entity, u32>) -> LinkCensus {
    let mut link_query = world.query::<&Link>();
    let mut edges: Vec<(u32, u32, f64)> = Vec::new();
    let mut dcn_edges: Vec<(u32, u32, f64)> = Vec::new();
    let (mut ici_links, mut dcn_links) = (0u32, 0u32);
    let mut allreduce = 0.0f64;
    for link in link_query.iter(world) {
        match link.kind {
            LinkKind::Ici => ici_links += 1,
            LinkKind::Dcn => dcn_links += 1,
        }
        allreduce += 2.0 * link.bytes_per_s;
        if let (Some(&a), Some(&b)) = (index.get(&link.a), index.get(&link.b)) {
            edges.push((a, b, link.bytes_per_s));
            if link.kind == LinkKind::Dcn {
                dcn_edges.push((a, b, link.bytes_per_s));
            }
        }
    }
    LinkCensus {
        edges,
        dcn_edges,
        ici_links,
        dcn_links,
        allreduce,
    }
}

/// The diameter and the sum of all pairs' hop counts: in closed form for a
/// plain one-slice torus whose links are all there, else by search.
fn hop_figures(
    topology: &Topology,
    edges: &[(u32, u32, f64)],
    n: usize,
) -> (Option<u32>, Option<u64>) {
    let graph = Csr::new(n, edges);
    let plain_torus = topology.slices == 1
        && !topology.is_twisted()
        && topology.extra_links.is_empty()
        && edges.len() == topology.links().len()
        && n == topology.num_devices() as usize;
    if plain_torus {
        (
            Some(torus_diameter(topology.dims, topology.wraparound)),
            Some(torus_distance_sum(topology.dims, topology.wraparound)),
        )
    } else {
        distances(&graph).unzip()
    }
}

/// DCN bandwidth across the cut between the first and the second half of
/// the slices.
fn dcn_bisection(coords: &[[u32; 4]], dcn_edges: &[(u32, u32, f64)], slices: u32) -> f64 {
    let slice_cut = slices / 2;
    dcn_edges
        .iter()
        .filter(|&&(a, b, _)| {
            (coords[a as usize][3] < slice_cut) != (coords[b as usize][3] < slice_cut)
        })
        .map(|&(_, _, bandwidth)| bandwidth)
        // Not `sum()`: an empty f64 sum is -0.0, which `--json` printed
        // for every one-slice pod.
        .fold(0.0, |total, bandwidth| total + bandwidth)
}

/// All-to-all bandwidth: bounded by the links' capacity over the mean hop
/// count and, when the bisection is a real cut, by the bisection.
fn alltoall_bound(
    mean_hops: Option<f64>,
    allreduce: f64,
    bisection_bytes_per_s: f64,
    has_cut: bool,
    n: usize,
) -> f64 {
    match mean_hops {
        Some(hops) => {
            let capacity_bound = allreduce / hops;
            let cut_bound = bisection_bytes_per_s * 4.0 * (n as f64 - 1.0) / n as f64;
            if has_cut {
                capacity_bound.min(cut_bound)
            } else {
                capacity_bound
            }
        }
        None => 0.0,
    }
}

/// Computes [`TopologyFigures`] from the devices, hosts and links in `world`.
pub fn compute_figures(world: &mut World) -> TopologyFigures {
    let topology = world.resource::<PodTopology>().0.clone();
    let DeviceCensus {
        index,
        coords,
        cores,
    } = census_devices(world);
    let hosts = world.query::<&Host>().iter(world).count() as u32;
    let LinkCensus {
        edges,
        dcn_edges,
        ici_links,
        dcn_links,
        allreduce,
    } = census_links(world, &index);
    let n = coords.len();
    let (diameter_hops, distance_sum) = hop_figures(&topology, &edges, n);
    let pairs = (n as f64) * (n as f64 - 1.0);
    let mean_hops = distance_sum.filter(|_| n > 1).map(|sum| sum as f64 / pairs);
    let sizes = [
        topology.dims[0],
        topology.dims[1],
        topology.dims[2],
        topology.slices,
    ];
    let (bisection_bytes_per_s, bisection_cut) = bisection(&coords, &edges, sizes);
    let dcn_bisection_bytes_per_s = dcn_bisection(&coords, &dcn_edges, topology.slices);
    let alltoall_bytes_per_s = alltoall_bound(
        mean_hops,
        allreduce,
        bisection_bytes_per_s,
        bisection_cut.is_some(),
        n,
    );
    TopologyFigures {
        name: topology.name.clone(),
        generation: topology.generation.to_string(),
        shape: topology.shape_string(),
        slices: topology.slices,
        devices: n as u32,
        cores,
        hosts,
        links: ici_links + dcn_links,
        ici_links,
        dcn_links,
        diameter_hops,
        bisection_bytes_per_s,
        bisection_cut,
        dcn_bisection_bytes_per_s,
        allreduce_bytes_per_s: allreduce,
        twisted: topology.is_twisted(),
        mean_hops,
        alltoall_bytes_per_s,
        hbm_bytes: topology.hbm_bytes * n as u64,
        warnings: topology.warnings.clone(),
        cubes: cube_figures(world, &topology),
    }
}

/// Undirected adjacency in compressed sparse rows.
struct Csr {
    offsets: Vec<u32>,
    targets: Vec<u32>,
}

impl Csr {
    fn new(n: usize, edges: &[(u32, u32, f64)]) -> Csr {
        let mut degree = vec![0u32; n + 1];
        for &(a, b, _) in edges {
            degree[a as usize] += 1;
            degree[b as usize] += 1;
        }
        let mut offsets = vec![0u32; n + 1];
        for i in 0..n {
            offsets[i + 1] = offsets[i] + degree[i];
        }
        let mut fill = offsets.clone();
        let mut targets = vec![0u32; offsets[n] as usize];
        for &(a, b, _) in edges {
            targets[fill[a as usize] as usize] = b;
            fill[a as usize] += 1;
            targets[fill[b as usize] as usize] = a;
            fill[b as usize] += 1;
        }
        Csr { offsets, targets }
    }

    fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    fn neighbours(&self, v: u32) -> &[u32] {
        &self.targets[self.offsets[v as usize] as usize..self.offsets[v as usize + 1] as usize]
    }

    /// Eccentricity of `source` and the sum of its distances to every
    /// vertex, or `None` if some vertex is unreachable.
    fn eccentricity(&self, source: u32) -> Option<(u32, u64)> {
        let mut distance = vec![u32::MAX; self.len()];
        let mut frontier = vec![source];
        distance[source as usize] = 0;
        let (mut depth, mut reached, mut sum) = (0u32, 1usize, 0u64);
        while !frontier.is_empty() {
            let mut next = Vec::new();
            for &v in &frontier {
                for &w in self.neighbours(v) {
                    if distance[w as usize] == u32::MAX {
                        distance[w as usize] = depth + 1;
                        next.push(w);
                    }
                }
            }
            reached += next.len();
            if !next.is_empty() {
                depth += 1;
                sum += u64::from(depth) * next.len() as u64;
            }
            frontier = next;
        }
        (reached == self.len()).then_some((depth, sum))
    }
}

/// The diameter of one slice's torus or mesh: per axis, `d - 1` hops when
/// the axis is a line and `⌊d / 2⌋` when it closes into a ring (a ring needs
/// 3 chips; see [`super::Topology::links`]).
pub fn torus_diameter(dims: [u32; 3], wraparound: [bool; 3]) -> u32 {
    (0..3)
        .map(|axis| {
            let d = dims[axis].max(1);
            if wraparound[axis] && d >= 3 {
                d / 2
            } else {
                d - 1
            }
        })
        .sum()
}

/// The sum of shortest-path lengths over ordered pairs of one slice's
/// plain torus or mesh: a path moves along each axis independently, so each
/// axis of `d` chips adds its own pair sum (`d (d² - 1) / 3` for a line,
/// `d Σ min(j, d - j)` for a ring) once per pair of rows across the others.
pub fn torus_distance_sum(dims: [u32; 3], wraparound: [bool; 3]) -> u64 {
    let chips: u64 = dims.iter().map(|&d| u64::from(d.max(1))).product();
    (0..3)
        .map(|axis| {
            let d = u64::from(dims[axis].max(1));
            let axis_sum = if wraparound[axis] && d >= 3 {
                d * (0..d).map(|j| j.min(d - j)).sum::<u64>()
            } else {
                d * (d * d - 1) / 3
            };
            let rows = chips / d;
            rows * rows * axis_sum
        })
        .sum()
}

/// The diameter and the sum of all shortest paths of any graph: a
/// breadth-first search from every vertex.
fn distances(graph: &Csr) -> Option<(u32, u64)> {
    if graph.len() == 0 {
        return Some((0, 0));
    }
    (0..graph.len() as u32)
        .into_par_iter()
        .map(|source| graph.eccentricity(source))
        .try_reduce(|| (0, 0), |a, b| Some((a.0.max(b.0), a.1 + b.1)))
}

fn bisection(
    coords: &[[u32; 4]],
    edges: &[(u32, u32, f64)],
    sizes: [u32; 4],
) -> (f64, Option<String>) {
    const AXES: [&str; 4] = ["x", "y", "z", "slice"];
    let mut best: Option<(f64, usize)> = None;
    for axis in 0..4 {
        if sizes[axis] < 2 {
            continue;
        }
        let cut = sizes[axis] / 2;
        let crossing: f64 = edges
            .iter()
            .filter(|&&(a, b, _)| {
                (coords[a as usize][axis] < cut) != (coords[b as usize][axis] < cut)
            })
            .map(|&(_, _, bandwidth)| bandwidth)
            .sum();
        if best.is_none_or(|(value, _)| crossing < value) {
            best = Some((crossing, axis));
        }
    }
    match best {
        Some((value, axis)) => (value, Some(AXES[axis].to_string())),
        None => (0.0, None),
    }
}
