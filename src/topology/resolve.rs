//! From pod file text to a validated [`Topology`].
//!
//! Parsing reports the file, line, column and field (through
//! `serde_path_to_error` over ron's deserializer). Validation checks, in this
//! order: name, generation, shape, slices, offered shape (or `custom`),
//! wraparound, twist, host block, cores, link
//! figures, cubes, tick and heartbeat (each within its documented range, the
//! interval at least one tick, the timeout longer than the interval plus the
//! control latency), explicit links, connectivity. The first
//! violation is returned with the field it belongs to; no input panics.

use super::cubes::{CubeLayout, check_layout, resolve_cubes};
use super::error::{Problem, TopologyError};
use super::schema::{DcnFigures, ExtraLink, LinkFigures, LinkKind, PodFile};
use crate::hardware::{HardwareSpec, TpuGeneration, WraparoundRule, twisted_torus_edge};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

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
    /// along axis `b` (all zero: a plain torus; see [`twist_offsets`]).
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

    /// Checks the invariants every method here relies on, for a topology
    /// that did not come through [`resolve`] (one decoded from a snapshot,
    /// whose bytes may be forged with a matching digest): the problem, naming
    /// the field.
    pub fn check_invariants(&self) -> Result<(), String> {
        let spec = self.generation.spec();
        if self.ndims != spec.torus_dims {
            return Err(format!(
                "ndims = {}, but a {} torus has {} dimensions",
                self.ndims, self.generation, spec.torus_dims
            ));
        }
        if let Some(axis) =
            (0..3).find(|&a| self.dims[a] == 0 || (a >= self.ndims && self.dims[a] != 1))
        {
            return Err(format!(
                "dims[{axis}] = {} is not a chip count of the shape",
                self.dims[axis]
            ));
        }
        if self.slices == 0 {
            return Err("slices = 0".into());
        }
        let chips = self.dims.iter().fold(u64::from(self.slices), |n, &d| {
            n.saturating_mul(u64::from(d))
        });
        if chips > MAX_POD_CHIPS {
            return Err(format!("{chips} chips, more than {MAX_POD_CHIPS}"));
        }
        if let Some(axis) = (0..3).find(|&a| {
            self.host_bounds[a] == 0 || !self.dims[a].is_multiple_of(self.host_bounds[a])
        }) {
            return Err(format!(
                "host_bounds[{axis}] = {} does not divide dims[{axis}] = {}",
                self.host_bounds[axis], self.dims[axis]
            ));
        }
        if !(1..=8).contains(&self.cores_per_chip) {
            return Err(format!(
                "cores_per_chip = {} is not between 1 and 8",
                self.cores_per_chip
            ));
        }
        if self.tick_ns == 0 || self.heartbeat_interval_ns == 0 {
            return Err("tick_ns and heartbeat_interval_ns must be at least 1".into());
        }
        if self.heartbeat_timeout_ns <= self.heartbeat_interval_ns {
            return Err("heartbeat_timeout_ns is not after heartbeat_interval_ns".into());
        }
        for axis in 0..3 {
            for other in 0..3 {
                let offset = self.twist[axis][other];
                if offset == 0 {
                    continue;
                }
                if other == axis || offset >= self.dims[other] {
                    return Err(format!(
                        "twist[{axis}][{other}] = {offset} is not a shift along another axis \
                         of the shape"
                    ));
                }
                if !(self.wraparound[axis] && self.dims[axis] >= 3) {
                    return Err(format!(
                        "twist[{axis}] moves a wraparound link that axis {axis} does not have"
                    ));
                }
            }
        }
        if let Some(fabric) = &self.dcn_fabric {
            let sane = fabric.host_bytes_per_s.is_finite()
                && fabric.host_bytes_per_s > 0.0
                && fabric.oversubscription.is_finite()
                && fabric.oversubscription >= 1.0;
            if self.slices < 2 || !sane {
                return Err(format!(
                    "dcn_fabric {fabric:?} needs 2 or more slices, positive host bandwidth \
                     and an oversubscription of at least 1"
                ));
            }
            if self.fabric_link_count() > MAX_FABRIC_LINKS {
                return Err(format!(
                    "the DCN fabric has {} links, more than {MAX_FABRIC_LINKS}",
                    self.fabric_link_count()
                ));
            }
        }
        if let Some(layout) = &self.cubes {
            check_layout(self, layout)?;
        }
        let devices = chips as u32;
        if let Some(link) = self
            .extra_links
            .iter()
            .find(|l| l.a >= devices || l.b >= devices)
        {
            return Err(format!(
                "extra link {} -> {} leaves the pod's {devices} devices",
                link.a, link.b
            ));
        }
        Ok(())
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

/// Parses and validates pod file text. `origin` names the source in errors.
pub fn parse_topology(text: &str, origin: &str) -> Result<Topology, TopologyError> {
    let file = parse_pod_file(text, origin)?;
    resolve(&file, text, origin)
}

/// Parses pod file text without validating it.
pub fn parse_pod_file(text: &str, origin: &str) -> Result<PodFile, TopologyError> {
    let options =
        ron::Options::default().with_default_extension(ron::extensions::Extensions::IMPLICIT_SOME);
    let syntax = |field: String, error: ron::error::SpannedError| TopologyError::Syntax {
        origin: origin.to_string(),
        line: error.position.line,
        column: error.position.col,
        field,
        message: error.code.to_string(),
    };
    let mut de = ron::Deserializer::from_str_with_options(text, &options)
        .map_err(|e| syntax("Pod".to_string(), e))?;
    let parsed: Result<PodFile, _> = serde_path_to_error::deserialize(&mut de);
    match parsed {
        Ok(file) => {
            de.end()
                .map_err(|code| syntax("Pod".into(), de.span_error(code)))?;
            Ok(file)
        }
        Err(error) => {
            let path = error.path().to_string();
            let field = if path == "." || path.is_empty() {
                "Pod".to_string()
            } else {
                path
            };
            Err(syntax(field, de.span_error(error.into_inner())))
        }
    }
}

/// A validation step's result: the problem and the field it belongs to.
type Check<T> = Result<T, (String, Problem)>;

fn invalid(field: impl Into<String>, problem: Problem) -> (String, Problem) {
    (field.into(), problem)
}

/// Validates a parsed pod file. `text` is used only to find line numbers.
pub fn resolve(file: &PodFile, text: &str, origin: &str) -> Result<Topology, TopologyError> {
    resolve_fields(file).map_err(|(field, problem)| TopologyError::Invalid {
        origin: origin.to_string(),
        line: line_of_field(text, &field),
        field,
        problem: Box::new(problem),
    })
}

fn resolve_fields(file: &PodFile) -> Check<Topology> {
    // Reports, figures and checkpoints name the pod; a blank name names nothing.
    if file.name.trim().is_empty() {
        return Err(invalid("name", Problem::EmptyName));
    }
    let generation: TpuGeneration = file.generation.parse().map_err(|_| {
        invalid(
            "generation",
            Problem::UnknownGeneration(file.generation.clone()),
        )
    })?;
    let spec = generation.spec();
    let (dims, ndims) = parse_shape(&file.shape).map_err(|p| invalid("shape", p))?;
    if ndims != spec.torus_dims {
        return Err(invalid(
            "shape",
            Problem::WrongDimensionCount {
                generation: spec.name.to_string(),
                expected: spec.torus_dims,
                got: ndims,
                text: file.shape.clone(),
            },
        ));
    }
    let slices = file.slices.unwrap_or(1);
    if slices == 0 {
        return Err(invalid("slices", bad_number(0, "at least 1")));
    }
    let chips = dims.iter().fold(u64::from(slices), |acc, &d| {
        acc.saturating_mul(u64::from(d))
    });
    if chips > MAX_POD_CHIPS {
        return Err(invalid(
            "shape",
            Problem::TooManyChips {
                chips,
                max: MAX_POD_CHIPS,
            },
        ));
    }
    let mut warnings = Vec::new();
    let offered = spec.slice_shapes.offers(dims);
    match (offered, file.custom.unwrap_or(false)) {
        (false, false) => {
            return Err(invalid(
                "shape",
                Problem::ShapeNotOffered {
                    generation: spec.name.to_string(),
                    shape: file.shape.clone(),
                    offered: spec.slice_shapes.describe(ndims),
                },
            ));
        }
        (false, true) => warnings.push(format!(
            "shape `{}` is not a slice shape Google Cloud offers for {} (offered: {}); \
             loaded because `custom: true`",
            file.shape,
            spec.name,
            spec.slice_shapes.describe(ndims)
        )),
        (true, true) => warnings.push(format!(
            "`custom: true` changes nothing: `{}` is an offered {} shape",
            file.shape, spec.name
        )),
        (true, false) => {}
    }
    let wraparound = resolve_wraparound(file.wraparound.as_deref(), dims, ndims, spec)?;
    let twist = twist_offsets(file.twist.as_deref(), &file.shape, dims, wraparound, spec)?;
    let host_bounds = resolve_host_bounds(file.chips_per_host.as_deref(), dims, ndims, spec)?;
    let cores_per_chip = file.cores_per_chip.unwrap_or(spec.cores_per_chip);
    if !(1..=8).contains(&cores_per_chip) {
        return Err(invalid(
            "cores_per_chip",
            bad_number(cores_per_chip, "between 1 and 8"),
        ));
    }
    let ici_default = LinkParams {
        bytes_per_s: spec.ici_bytes_per_s,
        latency_ns: spec.ici_latency_ns,
    };
    let dcn_default = LinkParams {
        bytes_per_s: spec.dcn_bytes_per_s,
        latency_ns: spec.dcn_latency_ns,
    };
    let ici = link_params(file.ici.as_ref(), ici_default, "ici")?;
    let dcn_file = file.dcn.clone().unwrap_or_default();
    let dcn = override_params(
        dcn_default,
        dcn_file.bandwidth_gb_per_s,
        dcn_file.latency_us,
        "dcn.",
    )?;
    let dcn_fabric = resolve_fabric(&dcn_file, slices, spec)?;
    let cubes = resolve_cubes(file.cubes.as_ref(), spec, &file.shape, dims, slices)?;
    let heartbeat = file.heartbeat.clone().unwrap_or_default();
    let tick_ns = millis_to_ns(
        file.tick_ms,
        DEFAULT_TICK_NS,
        "tick_ms",
        (MIN_TICK_NS, MAX_TICK_NS),
        "between 0.001 and 60000 ms",
    )?;
    let heartbeat_interval_ns = millis_to_ns(
        heartbeat.interval_ms,
        DEFAULT_HEARTBEAT_INTERVAL_NS,
        "heartbeat.interval_ms",
        (1, MAX_HEARTBEAT_INTERVAL_NS),
        "at most 3600000 ms (one hour)",
    )?;
    let heartbeat_timeout_ns = millis_to_ns(
        heartbeat.timeout_ms,
        DEFAULT_HEARTBEAT_TIMEOUT_NS,
        "heartbeat.timeout_ms",
        (1, MAX_HEARTBEAT_TIMEOUT_NS),
        "at most 86400000 ms (one day)",
    )?;
    if heartbeat_interval_ns < tick_ns {
        // Name the figure that was written (both may be defaults' partners).
        let field = if heartbeat.interval_ms.is_some() {
            "heartbeat.interval_ms"
        } else {
            "tick_ms"
        };
        return Err(invalid(
            field,
            Problem::IntervalShorterThanTick {
                interval_ms: heartbeat_interval_ns as f64 / 1e6,
                tick_ms: tick_ns as f64 / 1e6,
            },
        ));
    }
    if heartbeat_timeout_ns <= heartbeat_interval_ns {
        return Err(invalid(
            "heartbeat.timeout_ms",
            Problem::TimeoutNotAfterInterval {
                interval_ms: heartbeat_interval_ns as f64 / 1e6,
                timeout_ms: heartbeat_timeout_ns as f64 / 1e6,
            },
        ));
    }
    // The detector's guarantee (see `crate::health`): a running device whose
    // heartbeats take the control latency plus its jitter is never failed
    // while latency + jitter + interval <= timeout. The pod starts with no
    // jitter, so the control latency alone must leave that room.
    let control_latency_ns = dcn.latency_ns;
    if control_latency_ns.saturating_add(heartbeat_interval_ns) > heartbeat_timeout_ns {
        let field = if file.dcn.as_ref().is_some_and(|d| d.latency_us.is_some()) {
            "dcn.latency_us"
        } else {
            "heartbeat.timeout_ms"
        };
        return Err(invalid(
            field,
            Problem::ControlLatencyExceedsTimeout {
                latency_ms: control_latency_ns as f64 / 1e6,
                interval_ms: heartbeat_interval_ns as f64 / 1e6,
                timeout_ms: heartbeat_timeout_ns as f64 / 1e6,
            },
        ));
    }
    let mut topology = Topology {
        name: file.name.clone(),
        description: file.description.clone().unwrap_or_default(),
        generation,
        dims,
        ndims,
        slices,
        wraparound,
        twist,
        host_bounds,
        cores_per_chip,
        hbm_bytes: spec.hbm_bytes,
        ici,
        dcn,
        dcn_fabric,
        extra_links: Vec::new(),
        cubes,
        heartbeat_interval_ns,
        heartbeat_timeout_ns,
        tick_ns,
        warnings,
    };
    let fabric_links = topology.fabric_link_count();
    if fabric_links > MAX_FABRIC_LINKS {
        return Err(invalid(
            "slices",
            Problem::NoFabric {
                reason: format!(
                    "{slices} slices of {} hosts need {fabric_links} DCN fabric links (every host \
                     to its twin in each other slice), more than {MAX_FABRIC_LINKS}; use fewer, \
                     larger slices, or `dcn: (fabric: false)` and `extra_links`",
                    topology.num_hosts() / slices
                ),
            },
        ));
    }
    topology.extra_links = resolve_extra_links(&topology, &file.extra_links)?;
    check_connected(&topology)?;
    Ok(topology)
}

fn bad_number(value: impl ToString, requirement: &'static str) -> Problem {
    Problem::BadNumber {
        value: value.to_string(),
        requirement,
    }
}

/// Parses `AxB` or `AxBxC`; unused trailing axes become 1.
pub fn parse_shape(text: &str) -> Result<([u32; 3], usize), Problem> {
    let malformed = |reason: String| Problem::MalformedShape {
        text: text.to_string(),
        reason,
    };
    let parts: Vec<&str> = text.trim().split(['x', 'X']).collect();
    if parts.len() > 3 {
        return Err(malformed(format!("{} dimensions; at most 3", parts.len())));
    }
    let mut dims = [1u32; 3];
    for (axis, part) in parts.iter().enumerate() {
        let part = part.trim();
        dims[axis] = part
            .parse::<u32>()
            .map_err(|_| malformed(format!("`{part}` is not a whole number")))?;
        if dims[axis] == 0 {
            return Err(Problem::ZeroDimension {
                text: text.to_string(),
                axis,
            });
        }
    }
    Ok((dims, parts.len()))
}

fn resolve_wraparound(
    given: Option<&[bool]>,
    dims: [u32; 3],
    ndims: usize,
    spec: &HardwareSpec,
) -> Check<[bool; 3]> {
    let Some(given) = given else {
        return Ok([0, 1, 2].map(|axis| axis < ndims && spec.can_wrap(dims[axis])));
    };
    if given.len() != ndims {
        return Err(invalid(
            "wraparound",
            Problem::WrongLength {
                expected: ndims,
                got: given.len(),
            },
        ));
    }
    let mut wraparound = [false; 3];
    for (axis, &wrap) in given.iter().enumerate() {
        if wrap && !spec.can_wrap(dims[axis]) {
            let rule = match spec.wraparound {
                WraparoundRule::MultipleOf(k) => {
                    format!("only dimensions that are a multiple of {k} can wrap")
                }
                WraparoundRule::AnyDimension => {
                    "a ring needs at least 3 chips (2 chips already share their one link)".into()
                }
            };
            return Err(invalid(
                format!("wraparound[{axis}]"),
                Problem::WraparoundNotAllowed {
                    generation: spec.name.to_string(),
                    axis,
                    size: dims[axis],
                    rule,
                },
            ));
        }
        wraparound[axis] = wrap;
    }
    Ok(wraparound)
}

/// The wraparound offsets of a `twist` value.
///
/// `"twisted"` is the twisted torus of Jouppi et al. (ISCA 2023) and of
/// Cámara et al. ("Twisted Torus Topologies for Enhanced Interconnection
/// Networks", IEEE TPDS 2010) for slices `k x k x 2k` and `k x 2k x 2k`:
/// the wraparound link of every short axis (`k` chips) lands `k` chips
/// further along every long axis (`2k` chips), so `(k-1, y, z)` joins
/// `(0, y, z + k mod 2k)` on a 4x4x8. Long axes keep plain rings. Every chip
/// keeps its 6 links; the short rings become one long ring through both
/// halves of the long axis, which shortens paths across the long axis.
pub fn twist_offsets(
    given: Option<&str>,
    shape: &str,
    dims: [u32; 3],
    wraparound: [bool; 3],
    spec: &HardwareSpec,
) -> Check<[[u32; 3]; 3]> {
    let none = [[0; 3]; 3];
    match given.map(str::trim) {
        None | Some("none") => return Ok(none),
        Some("twisted") => {}
        Some(other) => {
            return Err(invalid(
                "twist",
                Problem::UnknownTwist {
                    given: other.to_string(),
                },
            ));
        }
    }
    let refuse = |reason: String| {
        invalid(
            "twist",
            Problem::TwistNotAllowed {
                generation: spec.name.to_string(),
                shape: shape.to_string(),
                reason,
            },
        )
    };
    if !spec.twisted_tori {
        return Err(refuse("only v4 and v5p slices can be twisted".into()));
    }
    let Some(k) = twisted_torus_edge(dims) else {
        return Err(refuse(
            "twisted tori are k x k x 2k or k x 2k x 2k with k a multiple of 4 \
             (4x4x8, 4x8x8, 8x8x16, 8x16x16)"
                .into(),
        ));
    };
    if let Some(axis) = (0..3).find(|&a| !wraparound[a]) {
        return Err(refuse(format!(
            "the twist moves wraparound links, and wraparound[{axis}] is off"
        )));
    }
    let mut twist = none;
    for short in (0..3).filter(|&a| dims[a] == k) {
        for long in (0..3).filter(|&a| dims[a] == 2 * k) {
            twist[short][long] = k;
        }
    }
    Ok(twist)
}

fn resolve_fabric(
    given: &DcnFigures,
    slices: u32,
    spec: &HardwareSpec,
) -> Check<Option<DcnFabric>> {
    let wanted = given.fabric.unwrap_or(slices > 1);
    if wanted && slices < 2 {
        return Err(invalid(
            "dcn.fabric",
            Problem::NoFabric {
                reason: "`fabric: true` needs 2 or more slices; one slice has no slices to join"
                    .into(),
            },
        ));
    }
    if !wanted {
        let figure = [
            ("dcn.host_gb_per_s", given.host_gb_per_s.is_some()),
            ("dcn.oversubscription", given.oversubscription.is_some()),
        ]
        .into_iter()
        .find(|(_, set)| *set);
        if let Some((field, _)) = figure {
            return Err(invalid(
                field,
                Problem::NoFabric {
                    reason: "sets a DCN fabric figure, but the pod has no fabric \
                             (one slice, or `fabric: false`)"
                        .into(),
                },
            ));
        }
        return Ok(None);
    }
    let host_bytes_per_s = match given.host_gb_per_s {
        None => spec.dcn_host_bytes_per_s,
        Some(gb) => {
            let bytes = positive_finite(gb, "dcn.host_gb_per_s")? * 1e9;
            positive_finite(bytes, "dcn.host_gb_per_s")?
        }
    };
    let oversubscription = given.oversubscription.unwrap_or(1.0);
    if !(oversubscription.is_finite() && oversubscription >= 1.0) {
        return Err(invalid(
            "dcn.oversubscription",
            bad_number(oversubscription, "at least 1 (1 = non-blocking) and finite"),
        ));
    }
    Ok(Some(DcnFabric {
        host_bytes_per_s,
        oversubscription,
    }))
}

fn resolve_host_bounds(
    given: Option<&str>,
    dims: [u32; 3],
    ndims: usize,
    spec: &HardwareSpec,
) -> Check<[u32; 3]> {
    let bounds = match given {
        None => spec.chips_per_host_bounds,
        Some(text) => {
            let (bounds, n) = parse_shape(text).map_err(|p| invalid("chips_per_host", p))?;
            if n != ndims {
                return Err(invalid(
                    "chips_per_host",
                    Problem::WrongLength {
                        expected: ndims,
                        got: n,
                    },
                ));
            }
            bounds
        }
    };
    let mut effective = [1u32; 3];
    for axis in 0..3 {
        // A slice smaller than the host block is driven by one host.
        effective[axis] = bounds[axis].min(dims[axis]);
        if !dims[axis].is_multiple_of(effective[axis]) {
            return Err(invalid(
                "chips_per_host",
                Problem::HostBlockDoesNotDivide {
                    axis,
                    bound: bounds[axis],
                    size: dims[axis],
                },
            ));
        }
    }
    Ok(effective)
}

fn positive_finite(value: f64, field: &str) -> Check<f64> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(invalid(field, bad_number(value, "positive and finite")))
    }
}

/// Converts a millisecond figure to whole nanoseconds within `min..=max` ns;
/// `requirement` says the range in milliseconds.
fn millis_to_ns(
    value: Option<f64>,
    default_ns: u64,
    field: &str,
    (min, max): (u64, u64),
    requirement: &'static str,
) -> Check<u64> {
    let Some(ms) = value else {
        return Ok(default_ns);
    };
    let ms = positive_finite(ms, field)?;
    let ns = (ms * 1e6).round();
    if !(min.max(1) as f64..=max as f64).contains(&ns) {
        return Err(invalid(field, bad_number(ms, requirement)));
    }
    Ok(ns as u64)
}

fn link_params(given: Option<&LinkFigures>, default: LinkParams, field: &str) -> Check<LinkParams> {
    let Some(given) = given else {
        return Ok(default);
    };
    override_params(
        default,
        given.bandwidth_gb_per_s,
        given.latency_us,
        &format!("{field}."),
    )
}

fn override_params(
    default: LinkParams,
    bandwidth_gb_per_s: Option<f64>,
    latency_us: Option<f64>,
    prefix: &str,
) -> Check<LinkParams> {
    let mut params = default;
    if let Some(gb) = bandwidth_gb_per_s {
        let field = format!("{prefix}bandwidth_gb_per_s");
        params.bytes_per_s = positive_finite(gb, &field)? * 1e9;
        if !params.bytes_per_s.is_finite() {
            return Err(invalid(field, bad_number(gb, "below 1e300")));
        }
    }
    if let Some(us) = latency_us {
        let field = format!("{prefix}latency_us");
        if !(us.is_finite() && (0.0..=1e9).contains(&us)) {
            return Err(invalid(field, bad_number(us, "between 0 and 1e9 µs")));
        }
        params.latency_ns = (us * 1e3).round() as u64;
    }
    Ok(params)
}

fn kind_name(kind: LinkKind) -> &'static str {
    match kind {
        LinkKind::Ici => "ICI",
        LinkKind::Dcn => "DCN",
    }
}

fn resolve_extra_links(topology: &Topology, given: &[ExtraLink]) -> Check<Vec<LinkSpec>> {
    let devices = topology.num_devices();
    let mut seen: HashMap<(u32, u32, LinkKind), String> = HashMap::new();
    for link in topology.links() {
        let key = (link.a.min(link.b), link.a.max(link.b), link.kind);
        let source = match link.kind {
            LinkKind::Ici => "a torus link",
            LinkKind::Dcn => "a DCN fabric link",
        };
        seen.insert(key, source.to_string());
    }
    let mut resolved = Vec::with_capacity(given.len());
    for (i, link) in given.iter().enumerate() {
        let field = format!("extra_links[{i}]");
        for device in [link.a, link.b] {
            if device >= devices {
                return Err(invalid(field, Problem::UnknownDevice { device, devices }));
            }
        }
        if link.a == link.b {
            return Err(invalid(field, Problem::SelfLink { device: link.a }));
        }
        let key = (link.a.min(link.b), link.a.max(link.b), link.kind);
        if let Some(previous) = seen.get(&key) {
            return Err(invalid(
                field,
                Problem::DuplicateLink {
                    a: key.0,
                    b: key.1,
                    kind: kind_name(link.kind),
                    previous: previous.clone(),
                },
            ));
        }
        seen.insert(key, format!("extra_links[{i}]"));
        let default = match link.kind {
            LinkKind::Ici => topology.ici,
            LinkKind::Dcn => topology.dcn,
        };
        let params = override_params(
            default,
            link.bandwidth_gb_per_s,
            link.latency_us,
            &format!("{field}."),
        )?;
        resolved.push(LinkSpec {
            a: link.a,
            b: link.b,
            kind: link.kind,
            axis: None,
            wraps: false,
            params,
        });
    }
    Ok(resolved)
}

/// Union-find over every link; reports the first device not joined to 0.
fn check_connected(topology: &Topology) -> Check<()> {
    let n = topology.num_devices() as usize;
    let mut parent: Vec<u32> = (0..n as u32).collect();
    fn find(parent: &mut [u32], mut x: u32) -> u32 {
        while parent[x as usize] != x {
            let grand = parent[parent[x as usize] as usize];
            parent[x as usize] = grand;
            x = grand;
        }
        x
    }
    for link in topology.links() {
        let (ra, rb) = (find(&mut parent, link.a), find(&mut parent, link.b));
        if ra != rb {
            parent[ra.max(rb) as usize] = ra.min(rb);
        }
    }
    let root = find(&mut parent, 0);
    let unreachable: Vec<u32> = (0..n as u32)
        .filter(|&d| find(&mut parent, d) != root)
        .collect();
    match unreachable.first() {
        None => Ok(()),
        Some(&first) => Err(invalid(
            "extra_links",
            Problem::Disconnected {
                unreachable: first,
                count: unreachable.len() as u32,
            },
        )),
    }
}

/// The 1-based line of a field's first appearance in `text`, best effort.
///
/// `extra_links[2].a` is found by its top-level key `extra_links`.
fn line_of_field(text: &str, field: &str) -> Option<usize> {
    let key = field.split(['.', '[']).next().filter(|k| !k.is_empty())?;
    text.lines()
        .position(|line| {
            let line = line.trim_start();
            !line.starts_with("//")
                && line
                    .strip_prefix(key)
                    .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
        .map(|i| i + 1)
}
