//! The validated pod description, [`Topology`], and what follows from it:
//! device coordinates, hosts, and the links the pod spawns.

use super::cubes::CubeLayout;
use super::schema::LinkKind;
use crate::hardware::TpuGeneration;
use serde::{Deserialize, Serialize};

/// The most chips a pod may have (16× the largest v5p slice).
pub const MAX_POD_CHIPS: u64 = 1 << 16;

/// The most DCN fabric links a pod may have: the fabric joins every host to
/// its twin in each other slice, `hosts x slices (slices - 1) / 2` links,
/// which grows with the square of the slices.
pub const MAX_FABRIC_LINKS: u64 = 1 << 20;

/// Default heartbeat interval, ns (the coordination service's order).
pub const DEFAULT_HEARTBEAT_INTERVAL_NS: u64 = 1_000_000_000;
/// Default heartbeat timeout, ns (the TF/JAX coordination service uses 10 s).
pub const DEFAULT_HEARTBEAT_TIMEOUT_NS: u64 = 10_000_000_000;
/// Default simulated time per tick, ns.
pub const DEFAULT_TICK_NS: u64 = 10_000_000;

/// Shortest tick, ns (1 µs).
pub const MIN_TICK_NS: u64 = 1_000;
/// Longest tick, ns (one minute): coarser than any heartbeat timeout worth
/// simulating.
pub const MAX_TICK_NS: u64 = 60_000_000_000;
/// Longest heartbeat interval, ns (one hour). The shortest is one tick: a
/// device sends at most one heartbeat per tick.
pub const MAX_HEARTBEAT_INTERVAL_NS: u64 = 3_600_000_000_000;
/// Longest heartbeat timeout, ns (one day).
pub const MAX_HEARTBEAT_TIMEOUT_NS: u64 = 86_400_000_000_000;

/// Bandwidth (per direction) and latency of a link.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinkParams {
    /// Bytes per second in each direction.
    pub bytes_per_s: f64,
    /// One-way latency, nanoseconds.
    pub latency_ns: u64,
}

/// The data-center network that joins the slices of a multislice pod.
///
/// Every host has NICs of `host_bytes_per_s` into a switched fabric; the
/// engine's links join devices, so the fabric is spawned as DCN links from
/// each host's first chip to the first chip of the host at the same place
/// in every other slice (the rails a cross-slice collective uses: each
/// device exchanges with its twin in the other slices). A host's bandwidth
/// is shared evenly by its `slices - 1` rails and divided by the core's
/// oversubscription, so no host sends more than its NICs can.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DcnFabric {
    /// Bandwidth of one host's NICs, bytes per second each way.
    pub host_bytes_per_s: f64,
    /// How many times the fabric's core is oversubscribed (at least 1).
    pub oversubscription: f64,
}

/// A link between two devices, by device id.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinkSpec {
    /// One end.
    pub a: u32,
    /// Other end.
    pub b: u32,
    /// The network.
    pub kind: LinkKind,
    /// The torus axis an ICI link runs along; `None` for explicit links.
    pub axis: Option<u8>,
    /// Whether this link closes a ring (the wraparound hop).
    pub wraps: bool,
    /// Bandwidth and latency.
    pub params: LinkParams,
}

/// A validated pod description: everything needed to spawn the world.
///
/// Device ids are dense: `slice * chips_per_slice + x + X * (y + Y * z)`,
/// x fastest, the order libtpu enumerates chips.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    /// Pod name.
    pub name: String,
    /// One-line description.
    pub description: String,
    /// Chip generation.
    pub generation: TpuGeneration,
    /// Chips along x, y, z of one slice (unused axes are 1).
    pub dims: [u32; 3],
    /// Dimensions as written (2 or 3).
    pub ndims: usize,
    /// Number of identical slices.
    pub slices: u32,
    /// Whether each axis closes into a ring.
    pub wraparound: [bool; 3],
    /// How far each axis's wraparound link moves along the other axes:
    /// axis `a`'s link from the last chip lands `twist[a][b]` chips further
    /// along axis `b` (all zero: a plain torus; see
    /// [`twist_offsets`](super::validate::twist_offsets)).
    pub twist: [[u32; 3]; 3],
    /// Chips one host drives along each axis.
    pub host_bounds: [u32; 3],
    /// TensorCores per chip.
    pub cores_per_chip: u32,
    /// HBM per chip, bytes.
    pub hbm_bytes: u64,
    /// Torus link figures.
    pub ici: LinkParams,
    /// Default DCN link figures (explicit links; the latency of every DCN hop).
    pub dcn: LinkParams,
    /// The fabric joining the slices; `None` for one slice or `fabric: false`.
    pub dcn_fabric: Option<DcnFabric>,
    /// Links beyond the torus.
    pub extra_links: Vec<LinkSpec>,
    /// The cubes and optical circuit switches of a cube-built pod; `None`
    /// unless the pod file has `cubes` (see [`super::cubes`]).
    #[serde(default)]
    pub cubes: Option<CubeLayout>,
    /// Heartbeat interval, ns.
    pub heartbeat_interval_ns: u64,
    /// Silence before a device is failed, ns.
    pub heartbeat_timeout_ns: u64,
    /// Simulated time per tick, ns.
    pub tick_ns: u64,
    /// What was accepted only with a warning (a custom shape), in the order
    /// found. Kept with the topology so every report can show them.
    pub warnings: Vec<String>,
}

impl Topology {
    /// Chips in one slice.
    pub fn chips_per_slice(&self) -> u32 {
        self.dims.iter().product()
    }

    /// Chips (devices) in the pod.
    pub fn num_devices(&self) -> u32 {
        self.chips_per_slice() * self.slices
    }

    /// Whether any wraparound link is twisted.
    pub fn is_twisted(&self) -> bool {
        self.twist.iter().flatten().any(|&offset| offset != 0)
    }

    /// Hosts along each axis of one slice.
    pub fn hosts_per_axis(&self) -> [u32; 3] {
        [0, 1, 2].map(|axis| self.dims[axis] / self.host_bounds[axis])
    }

    /// Chips each host drives: its `host_bounds` block (the bounds divide
    /// the slice's dims, so every host drives as many).
    pub fn chips_per_host(&self) -> u32 {
        self.host_bounds.iter().product()
    }

    /// Hosts in the pod.
    pub fn num_hosts(&self) -> u32 {
        self.hosts_per_axis().iter().product::<u32>() * self.slices
    }

    /// `(slice, [x, y, z])` of a device id.
    pub fn coords(&self, device: u32) -> (u32, [u32; 3]) {
        let per_slice = self.chips_per_slice();
        let slice = device / per_slice;
        let local = device % per_slice;
        let [dx, dy, _] = self.dims;
        (slice, [local % dx, (local / dx) % dy, local / (dx * dy)])
    }

    /// The device id at `(slice, [x, y, z])`.
    pub fn device_at(&self, slice: u32, [x, y, z]: [u32; 3]) -> u32 {
        let [dx, dy, _] = self.dims;
        slice * self.chips_per_slice() + x + dx * (y + dy * z)
    }

    /// The host index that drives a device.
    pub fn host_of(&self, device: u32) -> u32 {
        let (slice, c) = self.coords(device);
        let [hx, hy, hz] = self.hosts_per_axis();
        let [bx, by, bz] = self.host_bounds;
        slice * hx * hy * hz + c[0] / bx + hx * (c[1] / by + hy * (c[2] / bz))
    }

    /// The first chip of host `host` (its index within the slice) of `slice`:
    /// where the host's NICs meet the DCN fabric.
    pub fn host_leader(&self, slice: u32, host: u32) -> u32 {
        let [hx, hy, _] = self.hosts_per_axis();
        let block = [host % hx, (host / hx) % hy, host / (hx * hy)];
        let xyz = [0, 1, 2].map(|axis| block[axis] * self.host_bounds[axis]);
        self.device_at(slice, xyz)
    }

    /// Figures of one DCN fabric link (see [`DcnFabric`]).
    pub fn fabric_link_params(&self, fabric: &DcnFabric) -> LinkParams {
        let rails = f64::from(self.slices.saturating_sub(1).max(1));
        LinkParams {
            bytes_per_s: fabric.host_bytes_per_s / rails / fabric.oversubscription,
            latency_ns: self.dcn.latency_ns,
        }
    }

    /// Links the DCN fabric spawns (see [`DcnFabric`]); 0 without a fabric.
    pub fn fabric_link_count(&self) -> u64 {
        if self.dcn_fabric.is_none() {
            return 0;
        }
        let hosts: u64 = self
            .hosts_per_axis()
            .iter()
            .map(|&h| u64::from(h))
            .product();
        let slices = u64::from(self.slices);
        hosts.saturating_mul(slices.saturating_mul(slices.saturating_sub(1)) / 2)
    }

    fn fabric_links(&self) -> Vec<LinkSpec> {
        let Some(fabric) = &self.dcn_fabric else {
            return Vec::new();
        };
        let params = self.fabric_link_params(fabric);
        let hosts: u32 = self.hosts_per_axis().iter().product();
        let mut links = Vec::new();
        for host in 0..hosts {
            for a in 0..self.slices {
                for b in a + 1..self.slices {
                    links.push(LinkSpec {
                        a: self.host_leader(a, host),
                        b: self.host_leader(b, host),
                        kind: LinkKind::Dcn,
                        axis: None,
                        wraps: false,
                        params,
                    });
                }
            }
        }
        links
    }

    /// The torus links of every slice, then the DCN fabric's, then the
    /// explicit links.
    ///
    /// Along an axis of size `n` there are `n - 1` links per row, plus the
    /// wraparound link when the axis wraps (`n >= 3`); a twisted wraparound
    /// link also moves along the other axes by [`Topology::twist`].
    pub fn links(&self) -> Vec<LinkSpec> {
        let mut links = Vec::with_capacity(self.torus_link_count() + self.extra_links.len());
        for device in 0..self.num_devices() {
            let (slice, c) = self.coords(device);
            for axis in 0..3 {
                let size = self.dims[axis];
                if size < 2 {
                    continue;
                }
                let mut next = c;
                let wraps = c[axis] + 1 == size;
                if wraps {
                    if !(self.wraparound[axis] && size >= 3) {
                        continue;
                    }
                    next[axis] = 0;
                    for ((coord, offset), size) in
                        next.iter_mut().zip(self.twist[axis]).zip(self.dims)
                    {
                        *coord = (*coord + offset) % size;
                    }
                } else {
                    next[axis] += 1;
                }
                links.push(LinkSpec {
                    a: device,
                    b: self.device_at(slice, next),
                    kind: LinkKind::Ici,
                    axis: Some(axis as u8),
                    wraps,
                    params: self.ici,
                });
            }
        }
        links.extend(self.fabric_links());
        links.extend_from_slice(&self.extra_links);
        links
    }

    fn torus_link_count(&self) -> usize {
        let per_slice: u64 = (0..3)
            .map(|axis| {
                let size = u64::from(self.dims[axis]);
                let rows = u64::from(self.chips_per_slice()) / size;
                let per_row = match size {
                    0 | 1 => 0,
                    n if self.wraparound[axis] && n >= 3 => n,
                    n => n - 1,
                };
                rows * per_row
            })
            .sum();
        (per_slice * u64::from(self.slices)) as usize
    }

    /// Shape as written: `16x16` or `4x4x4`.
    pub fn shape_string(&self) -> String {
        self.dims[..self.ndims]
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join("x")
    }
}
