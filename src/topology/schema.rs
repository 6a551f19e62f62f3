//! The pod file format (RON), as written by people.
//!
//! This is the raw, unvalidated form; [`super::resolve()`] turns it into a
//! [`super::Topology`] or a [`super::TopologyError`] that names the field.
//! Every field except `name`, `generation` and `shape` is optional and
//! defaults to the generation's figures in [`crate::hardware`].
//!
//! ```ron
//! Pod(
//!     name: "v5e-16",
//!     generation: "v5e",
//!     shape: "4x4",
//!     // Optional, with their defaults for v5e:
//!     wraparound: [true, true],
//!     twist: "none",
//!     custom: false,
//!     chips_per_host: "2x4",
//!     cores_per_chip: 1,
//!     slices: 1,
//!     ici: (bandwidth_gb_per_s: 50.0, latency_us: 1.0),
//!     dcn: (bandwidth_gb_per_s: 25.0, latency_us: 10.0),
//!     // with `slices` of 2 or more, also the DCN fabric's figures:
//!     // dcn: (host_gb_per_s: 25.0, oversubscription: 1.0, fabric: true),
//!     extra_links: [(a: 0, b: 15, kind: Dcn)],
//!     // v4, v5p and tpu7x only: the slice is made of 4x4x4 cubes joined by
//!     // optical circuit switches, with spare cubes to swap in:
//!     // cubes: (spares: 1, pod_cubes: 64, reconfigure_seconds: 10.0),
//!     heartbeat: (interval_ms: 1000.0, timeout_ms: 10000.0),
//!     tick_ms: 10.0,
//! )
//! ```

use serde::{Deserialize, Serialize};

/// A pod file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename = "Pod", deny_unknown_fields)]
pub struct PodFile {
    /// The pod's name (`"v5e-256"`).
    pub name: String,
    /// One-line description for listings.
    #[serde(default)]
    pub description: Option<String>,
    /// TPU generation: `"v2"`, `"v3"`, `"v4"`, `"v5e"`, `"v5p"`, `"v6e"` or
    /// `"tpu7x"`.
    pub generation: String,
    /// Chips along each torus dimension of one slice: `"16x16"`, `"4x4x4"`.
    pub shape: String,
    /// Identical slices in the pod (multislice), joined by the DCN fabric
    /// (see [`DcnFigures::fabric`]) and any `extra_links`.
    #[serde(default)]
    pub slices: Option<u32>,
    /// Whether each dimension closes into a ring. Default: every dimension the
    /// generation can wrap (v4, v5p and tpu7x: multiples of 4; v5e and v6e:
    /// an axis of 16; v2 and v3: 3 chips or more).
    #[serde(default)]
    pub wraparound: Option<Vec<bool>>,
    /// How the wraparound links close: `"none"` (default), or `"twisted"`
    /// for the twisted torus of the v4 and v5p shapes `k x k x 2k` and
    /// `k x 2k x 2k` (`k` a multiple of 4): each short axis's wraparound
    /// link lands `k` chips further along every long axis (see
    /// [`super::validate::twist_offsets`] and `docs/topology.md`).
    #[serde(default)]
    pub twist: Option<String>,
    /// Accept a slice shape Google Cloud does not offer for the generation
    /// (see [`crate::hardware::SliceShapes`]); the topology then carries a
    /// warning. Without it such a shape is refused.
    #[serde(default)]
    pub custom: Option<bool>,
    /// The block of chips one host drives: `"2x2x1"`. Must divide the shape.
    #[serde(default)]
    pub chips_per_host: Option<String>,
    /// TensorCores per chip.
    #[serde(default)]
    pub cores_per_chip: Option<u32>,
    /// ICI link figures (per direction).
    #[serde(default)]
    pub ici: Option<LinkFigures>,
    /// DCN figures: the default for `Dcn` extra links, and the fabric that
    /// joins the slices of a multislice pod.
    #[serde(default)]
    pub dcn: Option<DcnFigures>,
    /// Links beyond the torus: DCN between hosts or slices, or extra ICI.
    #[serde(default)]
    pub extra_links: Vec<ExtraLink>,
    /// The pod is built of cubes joined by optical circuit switches (v4,
    /// v5p and tpu7x): the slices are sets of cubes, the rest of the pod's cubes
    /// are spares or other jobs'. See [`super::cubes`].
    #[serde(default)]
    pub cubes: Option<CubeOptions>,
    /// Heartbeat timing.
    #[serde(default)]
    pub heartbeat: Option<HeartbeatFigures>,
    /// Simulated time per `Step`, milliseconds: 0.001 to 60000.
    #[serde(default)]
    pub tick_ms: Option<f64>,
}

/// Bandwidth and latency of a link; either may be left to its default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkFigures {
    /// Gigabytes (1e9 bytes) per second in each direction.
    #[serde(default)]
    pub bandwidth_gb_per_s: Option<f64>,
    /// One-way latency, microseconds.
    #[serde(default)]
    pub latency_us: Option<f64>,
}

/// The data-center network: explicit `Dcn` links' defaults and the fabric.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DcnFigures {
    /// Default bandwidth of a `Dcn` extra link, GB/s each way.
    #[serde(default)]
    pub bandwidth_gb_per_s: Option<f64>,
    /// One-way latency of a DCN hop (extra links and fabric), microseconds;
    /// also the control network's latency.
    #[serde(default)]
    pub latency_us: Option<f64>,
    /// Bandwidth of one host's NICs into the fabric, GB/s each way.
    #[serde(default)]
    pub host_gb_per_s: Option<f64>,
    /// How many times the fabric's core is oversubscribed (1 = non-blocking):
    /// each fabric link gets the host bandwidth divided by this.
    #[serde(default)]
    pub oversubscription: Option<f64>,
    /// Whether the slices are joined by the fabric: every host to the host
    /// at the same place in each other slice. Default: on when `slices` is 2
    /// or more; asking for it with one slice is an error.
    #[serde(default)]
    pub fabric: Option<bool>,
}

/// Which network a link belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LinkKind {
    /// Inter-chip interconnect (the torus).
    Ici,
    /// Data-center network (between hosts and slices).
    Dcn,
}

/// One explicit link between two devices, by device id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtraLink {
    /// One end (device id).
    pub a: u32,
    /// The other end (device id).
    pub b: u32,
    /// The network.
    pub kind: LinkKind,
    /// Overrides the kind's bandwidth, GB/s per direction.
    #[serde(default)]
    pub bandwidth_gb_per_s: Option<f64>,
    /// Overrides the kind's latency, microseconds.
    #[serde(default)]
    pub latency_us: Option<f64>,
}

/// The cubes of a cube-built pod (`cubes: (...)`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CubeOptions {
    /// Healthy cubes kept free to replace a failed one (default 0).
    #[serde(default)]
    pub spares: Option<u32>,
    /// Cubes in the whole pod (default: the generation's full pod, 64 for
    /// v4, 140 for v5p, 144 for tpu7x); the slices and spares must fit in
    /// it.
    #[serde(default)]
    pub pod_cubes: Option<u32>,
    /// Seconds the optical circuit switches take to swap a cube (default
    /// from [`crate::hardware::OcsSpec::reconfigure_seconds`], 10 s).
    #[serde(default)]
    pub reconfigure_seconds: Option<f64>,
}

/// Heartbeat interval and failure timeout.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatFigures {
    /// Time between heartbeats of one device, milliseconds: at least one
    /// tick, at most 3600000 (one hour).
    #[serde(default)]
    pub interval_ms: Option<f64>,
    /// Silence after which a device is declared failed, milliseconds: at
    /// least the interval plus the DCN (control) latency, at most 86400000
    /// (one day).
    #[serde(default)]
    pub timeout_ms: Option<f64>,
}
