//! Per-generation TPU hardware figures: the one source of truth.
//!
//! Every figure the engine uses for a chip (HBM, cores, ICI ports and link
//! bandwidth, host packaging) comes from [`TpuGeneration::spec`]. Pod files
//! may override link figures per pod; nothing else in the crate hard-codes
//! them. Each figure names its public source.
//!
//! Units: bytes, bytes per second **per direction** for links, nanoseconds.
//!
//! Sources:
//! - \[v2v3\]: N. P. Jouppi et al., "A Domain-Specific Supercomputer for
//!   Training Deep Neural Networks", CACM 63(7), 2020, Table 3 (4 ICI links per
//!   chip at 496 Gbit/s on v2 and 656 Gbit/s on v3; HBM 16/32 GiB;
//!   700/900 GB/s; 2 TensorCores).
//! - \[v4\]: Cloud TPU v4 documentation, "System architecture" (32 GiB HBM2 at
//!   1200 GB/s, 2 TensorCores, 3D torus, 4096 chips, bisection 24 TB/s) and
//!   N. P. Jouppi et al., "TPU v4: An Optically Reconfigurable Supercomputer",
//!   ISCA 2023 (6 ICI links per chip, 50 GB/s each way).
//! - \[v5e\]: Cloud TPU v5e documentation (16 GB HBM2 at 819 GB/s, 1 TensorCore,
//!   400 GB/s bidirectional ICI per chip over 4 ports, 8 chips per host, 2D
//!   torus of 256 chips, all-reduce 51.2 TB/s, bisection 1.6 TB/s).
//! - \[v5p\]: Cloud TPU v5p documentation (95 GiB HBM2e at 2765 GB/s,
//!   2 TensorCores, 1200 GB/s bidirectional ICI per chip, 3D torus, 4 chips per
//!   host VM, 8960 chips).
//! - \[v6e\]: Cloud TPU v6e documentation (32 GB HBM at 1638 GB/s, 1 TensorCore,
//!   800 GB/s bidirectional ICI per chip over 4 ports, 8 chips per host, 2D
//!   torus of 256 chips, all-reduce 102.4 TB/s, bisection 3.2 TB/s).
//! - \[shapes\]: the slice shapes each generation is sold in, from the Cloud
//!   TPU documentation pages "TPU v2", "TPU v3", "TPU v4", "TPU types and
//!   topologies", "TPU v5e", "TPU v5p" (table of single-slice shapes) and
//!   "TPU v6e"; see [`SliceShapes`] and each generation's `slice_shapes`.
//!   Shapes are compared as sets of extents (`8x4` is `4x8`): which axis is
//!   called x is a naming choice, not a different slice.
//! - \[twist\]: Cloud TPU v4 documentation ("3D mesh and 3D torus": slices
//!   `AxBxC` with `2A=B=C` or `2A=2B=C`, every dimension a multiple of 4,
//!   such as 4x4x8 and 4x8x8, can be twisted tori) and the v5p shape table
//!   (twisted: 4x4x8, 4x8x8, 8x8x16, 8x16x16); N. P. Jouppi et al., ISCA 2023,
//!   section "twisted tori".
//! - \[wrap16\]: J. Austin et al., "How to Scale Your Model" (the JAX
//!   scaling book), "How to Think About TPUs": "TPU v5e only has a
//!   wraparound connection when one axis has size 16"; v6e's 2D slices are
//!   built the same way (\[v6e\]: 256-chip 16x16 torus). A v5e-16 (4x4) is a
//!   mesh.
//! - \[storage\]: checkpoint reads are modeled at 1 GB/s per host
//!   ([`CHECKPOINT_READ_BYTES_PER_S_PER_HOST`]), the order of a Persistent
//!   Disk or Cloud Storage read stream per VM; an assumption, not a TPU
//!   figure.
//! - \[hostcopy\]: a chip's device-to-host copy at 15.75 GB/s
//!   ([`HOST_COPY_BYTES_PER_S_PER_CHIP`]): TPU v4's host interface is PCIe
//!   Gen3 x16 (Cloud TPU v4 documentation), 8 GT/s x 16 lanes with
//!   128b/130b coding, each way. Taken for every generation, an assumption
//!   (later hosts may have faster links; none is published per chip), and
//!   as the copy's whole cost (the host's memory is not the bottleneck).
//! - \[nic\]: DCN bandwidth per host, each way. v5p: 50 Gbit/s per chip
//!   (\[v5p\]) times 4 chips per host; v5e: 6.4 Tbit/s of data-center network
//!   per 256-chip pod (\[v5e\]) over 32 hosts, 200 Gbit/s; v6e is taken as
//!   v5e; v2, v3 and v4 hosts as one 100 Gbit/s NIC (an assumption: not
//!   published per host).
//! - \[ocs\]: N. P. Jouppi et al., ISCA 2023, sections 2 and 7 (and the
//!   Cloud TPU v4 "System architecture" page): a v4 pod is 64 cubes of
//!   4x4x4 chips (one rack each) joined by 48 optical circuit switches;
//!   each cube face carries 16 optical links (96 per cube, 6144 in the
//!   pod), and the 16 links of the two faces of one dimension go to 16
//!   OCSes, so every OCS takes one link from each of the 128 faces it
//!   serves (64 cubes x 2 faces). The OCS (Palomar) has 136 ports, 128 of
//!   them used (approximate: from the paper's description, not verified
//!   against its table here). Reconfiguring the OCSes to swap a cube or
//!   form a slice takes "around 10 seconds" (Gemini technical report, 2023,
//!   "Training Infrastructure"; the ISCA paper gives no single figure). v5p
//!   is built of the same 4x4x4 cubes (8960 chips = 140 cubes); its OCS
//!   count is not published, so the v4 arrangement (16 OCSes per dimension,
//!   two ports per cube) is assumed for it.
//! - Latencies are not published per link. The defaults (1 µs per ICI hop,
//!   10 µs per DCN hop) are orders of magnitude for a SerDes hop plus router
//!   and for a datacenter NIC round; override them in the pod file.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

const GIB: u64 = 1 << 30;
const GB: f64 = 1e9;

/// Bytes per second one host reads a checkpoint at (\[storage\]).
pub const CHECKPOINT_READ_BYTES_PER_S_PER_HOST: f64 = GB;

/// Bytes per second one chip copies its share of a checkpoint from HBM to
/// its host's memory at (\[hostcopy\]): what an asynchronous checkpoint
/// blocks training for.
pub const HOST_COPY_BYTES_PER_S_PER_CHIP: f64 = 15.75 * GB;

/// Seconds to write or to read back a checkpoint of `bytes` on a pod of
/// `hosts` hosts: every host streams its share at
/// [`CHECKPOINT_READ_BYTES_PER_S_PER_HOST`] (writes are taken as fast as
/// reads). The one checkpoint cost: `goodput`, `train` and the rollback
/// read all call it, so the two commands charge a checkpoint the same.
/// `hosts` is at least 1 (a pod has a host); 0 is taken as 1.
pub fn checkpoint_io_seconds(bytes: f64, hosts: u32) -> f64 {
    bytes / (f64::from(hosts.max(1)) * CHECKPOINT_READ_BYTES_PER_S_PER_HOST)
}

/// The optical circuit switches of a cube-built generation (\[ocs\]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OcsSpec {
    /// Chips along each edge of a cube (4: a cube is 4x4x4 = 64 chips).
    pub cube_edge: u32,
    /// Cubes in a full pod.
    pub pod_cubes: u32,
    /// OCSes per torus dimension: one per link position on a cube face
    /// (`cube_edge²`, 16), so a pod has `3 x 16 = 48`.
    pub ocs_per_dimension: u32,
    /// Ports of one OCS in use: two per cube (its `+` and `-` face of the
    /// OCS's dimension).
    pub ports_per_ocs: u32,
    /// Seconds to reconfigure the OCSes: swap a failed cube for a spare.
    pub reconfigure_seconds: f64,
}

impl OcsSpec {
    /// OCSes in a pod.
    pub fn ocs_count(&self) -> u32 {
        3 * self.ocs_per_dimension
    }

    /// Chips in one cube.
    pub fn chips_per_cube(&self) -> u32 {
        self.cube_edge.pow(3)
    }
}

/// The OCS of TPU v4 (\[ocs\]).
pub const V4_OCS: OcsSpec = OcsSpec {
    cube_edge: 4,
    pod_cubes: 64,
    ocs_per_dimension: 16,
    ports_per_ocs: 128,
    reconfigure_seconds: 10.0,
};

/// The OCS assumed for TPU v5p (\[ocs\]: the v4 arrangement over 140 cubes).
pub const V5P_OCS: OcsSpec = OcsSpec {
    cube_edge: 4,
    pod_cubes: 140,
    ocs_per_dimension: 16,
    ports_per_ocs: 280,
    reconfigure_seconds: 10.0,
};

/// A TPU generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TpuGeneration {
    /// TPU v2 (2017).
    V2,
    /// TPU v3 (2018).
    V3,
    /// TPU v4 (2021).
    V4,
    /// TPU v5e (2023).
    V5e,
    /// TPU v5p (2023).
    V5p,
    /// TPU v6e, Trillium (2024).
    V6e,
}

/// How the generation's interconnect may close its rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WraparoundRule {
    /// Any dimension of 3 or more chips may wrap around (a torus).
    AnyDimension,
    /// A dimension may wrap around only when its size is a multiple of this
    /// (the optical circuit switches close rings per 4-chip cube face).
    MultipleOf(u32),
    /// A dimension wraps around only when it has exactly this many chips
    /// (v5e and v6e: only a full 16-chip axis closes its ring, \[wrap16\]).
    OnlySize(u32),
}

/// The slice shapes a generation is offered in (\[shapes\]): a list, plus
/// for the cube-built generations (v4, v5p) every shape made of whole
/// 4x4x4 cubes up to the largest slice.
#[derive(Debug, Clone, PartialEq)]
pub struct SliceShapes {
    /// Shapes offered as listed, as `[x, y, z]` (unused axes 1).
    pub listed: &'static [[u32; 3]],
    /// Every dimension a multiple of this many chips (a cube's edge) is
    /// offered too, up to `largest_slice_chips`; `None` when only the list
    /// is offered.
    pub cube_edge: Option<u32>,
    /// Longest dimension of a cube-built slice, chips.
    pub max_dimension: u32,
    /// Chips in the largest single slice.
    pub largest_slice_chips: u32,
}

impl SliceShapes {
    /// Whether a slice of `dims` chips is offered (in any axis order).
    pub fn offers(&self, dims: [u32; 3]) -> bool {
        let wanted = sorted(dims);
        if self.listed.iter().any(|&shape| sorted(shape) == wanted) {
            return true;
        }
        let chips: u64 = dims.iter().map(|&d| u64::from(d)).product();
        self.cube_edge.is_some_and(|edge| {
            dims.iter()
                .all(|&d| d.is_multiple_of(edge) && d <= self.max_dimension)
                && chips <= u64::from(self.largest_slice_chips)
        })
    }

    /// The offered shapes for an error message: `1x1, 2x2, ..., 16x16` or
    /// the list plus the cube rule.
    pub fn describe(&self, ndims: usize) -> String {
        let mut text = self
            .listed
            .iter()
            .map(|shape| {
                shape[..ndims]
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join("x")
            })
            .collect::<Vec<_>>()
            .join(", ");
        if let Some(edge) = self.cube_edge {
            text += &format!(
                ", and any AxBxC of whole {edge}x{edge}x{edge} cubes (every dimension a multiple \
                 of {edge}, at most {}) up to {} chips",
                self.max_dimension, self.largest_slice_chips
            );
        }
        text
    }
}

fn sorted(mut dims: [u32; 3]) -> [u32; 3] {
    dims.sort_unstable();
    dims
}

/// Whether a slice of `dims` is one of the twisted-torus shapes of
/// \[twist\]: extents `k, k, 2k` or `k, 2k, 2k` (any order), `k` a multiple
/// of 4. Returns `k`.
pub fn twisted_torus_edge(dims: [u32; 3]) -> Option<u32> {
    let [a, b, c] = sorted(dims);
    let k = a;
    let fits = k >= 4 && k.is_multiple_of(4) && c == 2 * k && (b == k || b == 2 * k);
    fits.then_some(k)
}

/// Figures of one chip generation. See the module docs for sources.
#[derive(Debug, Clone, PartialEq)]
pub struct HardwareSpec {
    /// Short name, as in pod files (`"v5e"`).
    pub name: &'static str,
    /// HBM capacity per chip, bytes.
    pub hbm_bytes: u64,
    /// HBM bandwidth per chip, bytes per second.
    pub hbm_bytes_per_s: f64,
    /// TensorCores per chip.
    pub cores_per_chip: u32,
    /// Peak bf16 throughput per chip, FLOP/s.
    pub peak_bf16_flops: f64,
    /// Dimensions of the ICI torus (2 or 3).
    pub torus_dims: usize,
    /// ICI ports per chip (2 per torus dimension).
    pub ici_ports: u32,
    /// ICI bandwidth per link, bytes per second in each direction.
    pub ici_bytes_per_s: f64,
    /// ICI latency per hop, nanoseconds.
    pub ici_latency_ns: u64,
    /// DCN bandwidth per link, bytes per second in each direction.
    pub dcn_bytes_per_s: f64,
    /// DCN latency per hop, nanoseconds.
    pub dcn_latency_ns: u64,
    /// DCN bandwidth of one host's NICs, bytes per second each way (\[nic\]).
    pub dcn_host_bytes_per_s: f64,
    /// Chips attached to one host, as a block of the slice (`x, y, z`).
    pub chips_per_host_bounds: [u32; 3],
    /// When a dimension may wrap around.
    pub wraparound: WraparoundRule,
    /// Chips in the largest pod of this generation.
    pub max_pod_chips: u32,
    /// The slice shapes Google Cloud offers.
    pub slice_shapes: SliceShapes,
    /// Whether slices of the twisted-torus shapes may be twisted (\[twist\]).
    pub twisted_tori: bool,
    /// The optical circuit switches joining the pod's cubes; `None` for a
    /// generation not built of cubes (\[ocs\]).
    pub ocs: Option<OcsSpec>,
}

impl HardwareSpec {
    /// Chips attached to one host.
    pub fn chips_per_host(&self) -> u32 {
        self.chips_per_host_bounds.iter().product()
    }

    /// Whether a dimension of `size` chips may wrap around into a ring.
    pub fn can_wrap(&self, size: u32) -> bool {
        match self.wraparound {
            WraparoundRule::AnyDimension => size >= 3,
            WraparoundRule::MultipleOf(k) => size >= k && size.is_multiple_of(k),
            WraparoundRule::OnlySize(k) => size >= 3 && size == k,
        }
    }
}

/// The 2D slices of v5e and v6e (\[shapes\]).
const TWO_D_256: &[[u32; 3]] = &[
    [1, 1, 1],
    [2, 2, 1],
    [2, 4, 1],
    [4, 4, 1],
    [4, 8, 1],
    [8, 8, 1],
    [8, 16, 1],
    [16, 16, 1],
];

static V2: HardwareSpec = HardwareSpec {
    name: "v2",
    hbm_bytes: 16 * GIB,
    hbm_bytes_per_s: 700.0 * GB,
    cores_per_chip: 2,
    peak_bf16_flops: 45e12,
    torus_dims: 2,
    ici_ports: 4,
    ici_bytes_per_s: 496e9 / 8.0,
    ici_latency_ns: 1_000,
    dcn_bytes_per_s: 12.5 * GB,
    dcn_latency_ns: 10_000,
    dcn_host_bytes_per_s: 12.5 * GB,
    chips_per_host_bounds: [2, 2, 1],
    wraparound: WraparoundRule::AnyDimension,
    max_pod_chips: 256,
    // "TPU v2": v2-8, v2-32, v2-128, v2-256, v2-512 (4 to 256 chips).
    slice_shapes: SliceShapes {
        listed: &[[2, 2, 1], [4, 4, 1], [8, 8, 1], [8, 16, 1], [16, 16, 1]],
        cube_edge: None,
        max_dimension: 16,
        largest_slice_chips: 256,
    },
    twisted_tori: false,
    ocs: None,
};

static V3: HardwareSpec = HardwareSpec {
    name: "v3",
    hbm_bytes: 32 * GIB,
    hbm_bytes_per_s: 900.0 * GB,
    cores_per_chip: 2,
    peak_bf16_flops: 123e12,
    torus_dims: 2,
    ici_ports: 4,
    ici_bytes_per_s: 656e9 / 8.0,
    ici_latency_ns: 1_000,
    dcn_bytes_per_s: 12.5 * GB,
    dcn_latency_ns: 10_000,
    dcn_host_bytes_per_s: 12.5 * GB,
    chips_per_host_bounds: [2, 2, 1],
    wraparound: WraparoundRule::AnyDimension,
    max_pod_chips: 1024,
    // "TPU v3": v3-8 to v3-2048 (4 to 1024 chips).
    slice_shapes: SliceShapes {
        listed: &[
            [2, 2, 1],
            [4, 4, 1],
            [4, 8, 1],
            [8, 8, 1],
            [8, 16, 1],
            [16, 16, 1],
            [16, 32, 1],
            [32, 32, 1],
        ],
        cube_edge: None,
        max_dimension: 32,
        largest_slice_chips: 1024,
    },
    twisted_tori: false,
    ocs: None,
};

static V4: HardwareSpec = HardwareSpec {
    name: "v4",
    hbm_bytes: 32 * GIB,
    hbm_bytes_per_s: 1200.0 * GB,
    cores_per_chip: 2,
    peak_bf16_flops: 275e12,
    torus_dims: 3,
    ici_ports: 6,
    ici_bytes_per_s: 50.0 * GB,
    ici_latency_ns: 1_000,
    dcn_bytes_per_s: 12.5 * GB,
    dcn_latency_ns: 10_000,
    dcn_host_bytes_per_s: 12.5 * GB,
    chips_per_host_bounds: [2, 2, 1],
    wraparound: WraparoundRule::MultipleOf(4),
    max_pod_chips: 4096,
    // "TPU types and topologies": AxBxC with A, B, C all <= 4 or all
    // multiples of 4; the smallest slice is 2x2x1 (v4-8); the pod is
    // 16x16x16.
    slice_shapes: SliceShapes {
        listed: &[[2, 2, 1], [2, 2, 2], [2, 2, 4], [2, 4, 4]],
        cube_edge: Some(4),
        max_dimension: 16,
        largest_slice_chips: 4096,
    },
    twisted_tori: true,
    ocs: Some(V4_OCS),
};

static V5E: HardwareSpec = HardwareSpec {
    name: "v5e",
    hbm_bytes: 16 * GIB,
    hbm_bytes_per_s: 819.0 * GB,
    cores_per_chip: 1,
    peak_bf16_flops: 197e12,
    torus_dims: 2,
    ici_ports: 4,
    // 400 GB/s bidirectional per chip over 4 ports.
    ici_bytes_per_s: 400.0 * GB / 4.0 / 2.0,
    ici_latency_ns: 1_000,
    // 2 x 100 Gbit/s NICs per 8-chip host.
    dcn_bytes_per_s: 25.0 * GB,
    dcn_latency_ns: 10_000,
    dcn_host_bytes_per_s: 25.0 * GB,
    chips_per_host_bounds: [2, 4, 1],
    wraparound: WraparoundRule::OnlySize(16),
    max_pod_chips: 256,
    // "TPU v5e": 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16.
    slice_shapes: SliceShapes {
        listed: TWO_D_256,
        cube_edge: None,
        max_dimension: 16,
        largest_slice_chips: 256,
    },
    twisted_tori: false,
    ocs: None,
};

static V5P: HardwareSpec = HardwareSpec {
    name: "v5p",
    hbm_bytes: 95 * GIB,
    hbm_bytes_per_s: 2765.0 * GB,
    cores_per_chip: 2,
    peak_bf16_flops: 459e12,
    torus_dims: 3,
    ici_ports: 6,
    // 1200 GB/s bidirectional per chip over 6 ports.
    ici_bytes_per_s: 1200.0 * GB / 6.0 / 2.0,
    ici_latency_ns: 1_000,
    // 50 Gbit/s DCN per chip.
    dcn_bytes_per_s: 50e9 / 8.0,
    dcn_latency_ns: 10_000,
    dcn_host_bytes_per_s: 4.0 * 50e9 / 8.0,
    chips_per_host_bounds: [2, 2, 1],
    wraparound: WraparoundRule::MultipleOf(4),
    max_pod_chips: 8960,
    // "TPU v5p": the table's shapes below a cube (2x2x1, 2x2x2, 2x4x4; 2x2x4
    // is v5p-32) and cube-built shapes up to the largest, 16x16x24 (6144
    // chips; the table lists "most but not all" of them). Multislice goes
    // beyond: 18,432 chips.
    slice_shapes: SliceShapes {
        listed: &[[2, 2, 1], [2, 2, 2], [2, 2, 4], [2, 4, 4]],
        cube_edge: Some(4),
        max_dimension: 24,
        largest_slice_chips: 6144,
    },
    twisted_tori: true,
    ocs: Some(V5P_OCS),
};

static V6E: HardwareSpec = HardwareSpec {
    name: "v6e",
    hbm_bytes: 32 * GIB,
    hbm_bytes_per_s: 1638.0 * GB,
    cores_per_chip: 1,
    peak_bf16_flops: 918e12,
    torus_dims: 2,
    ici_ports: 4,
    // 800 GB/s bidirectional per chip over 4 ports.
    ici_bytes_per_s: 800.0 * GB / 4.0 / 2.0,
    ici_latency_ns: 1_000,
    dcn_bytes_per_s: 25.0 * GB,
    dcn_latency_ns: 10_000,
    dcn_host_bytes_per_s: 25.0 * GB,
    chips_per_host_bounds: [2, 4, 1],
    wraparound: WraparoundRule::OnlySize(16),
    max_pod_chips: 256,
    // "TPU v6e": the same 2D shapes as v5e, 1x1 to 16x16.
    slice_shapes: SliceShapes {
        listed: TWO_D_256,
        cube_edge: None,
        max_dimension: 16,
        largest_slice_chips: 256,
    },
    twisted_tori: false,
    ocs: None,
};

impl TpuGeneration {
    /// Every generation, oldest first.
    pub const ALL: [TpuGeneration; 6] = [
        TpuGeneration::V2,
        TpuGeneration::V3,
        TpuGeneration::V4,
        TpuGeneration::V5e,
        TpuGeneration::V5p,
        TpuGeneration::V6e,
    ];

    /// The generation's hardware figures.
    pub fn spec(self) -> &'static HardwareSpec {
        match self {
            TpuGeneration::V2 => &V2,
            TpuGeneration::V3 => &V3,
            TpuGeneration::V4 => &V4,
            TpuGeneration::V5e => &V5E,
            TpuGeneration::V5p => &V5P,
            TpuGeneration::V6e => &V6E,
        }
    }

    /// Short name as written in pod files (`"v4"`).
    pub fn name(self) -> &'static str {
        self.spec().name
    }
}

impl fmt::Display for TpuGeneration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error for a generation name that is not one of [`TpuGeneration::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown TPU generation `{0}` (known: v2, v3, v4, v5e, v5p, v6e)")]
pub struct UnknownGeneration(pub String);

impl FromStr for TpuGeneration {
    type Err = UnknownGeneration;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        TpuGeneration::ALL
            .into_iter()
            .find(|g| g.name() == lower)
            .ok_or_else(|| UnknownGeneration(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_costs_its_bytes_over_every_hosts_stream() {
        // 12 GB over 4 hosts at 1 GB/s each: 3 s.
        assert_eq!(checkpoint_io_seconds(12e9, 4), 3.0);
        assert_eq!(checkpoint_io_seconds(12e9, 0), 12.0);
        assert_eq!(checkpoint_io_seconds(0.0, 4), 0.0);
    }

    #[test]
    fn names_round_trip() {
        for generation in TpuGeneration::ALL {
            assert_eq!(generation.name().parse::<TpuGeneration>(), Ok(generation));
        }
        assert_eq!("V5E".parse::<TpuGeneration>(), Ok(TpuGeneration::V5e));
        assert!("v7".parse::<TpuGeneration>().is_err());
    }

    #[test]
    fn port_counts_match_torus_dimensions() {
        for generation in TpuGeneration::ALL {
            let spec = generation.spec();
            assert_eq!(spec.ici_ports as usize, 2 * spec.torus_dims, "{generation}");
        }
    }

    #[test]
    fn offered_shapes_follow_the_cloud_lists() {
        let v5p = &TpuGeneration::V5p.spec().slice_shapes;
        assert!(v5p.offers([16, 16, 24]) && v5p.offers([24, 16, 16]));
        assert!(v5p.offers([2, 2, 1]) && v5p.offers([4, 4, 8]));
        assert!(
            !v5p.offers([16, 20, 28]),
            "8960 chips is the pod, not a slice"
        );
        assert!(!v5p.offers([4, 4, 6]) && !v5p.offers([16, 16, 28]));
        let v4 = &TpuGeneration::V4.spec().slice_shapes;
        assert!(v4.offers([8, 8, 12]) && v4.offers([16, 16, 16]) && v4.offers([2, 2, 1]));
        assert!(!v4.offers([16, 16, 24]) && !v4.offers([3, 4, 4]) && !v4.offers([1, 1, 1]));
        let v5e = &TpuGeneration::V5e.spec().slice_shapes;
        assert!(v5e.offers([16, 16, 1]) && v5e.offers([4, 2, 1]) && v5e.offers([1, 1, 1]));
        assert!(!v5e.offers([3, 5, 1]) && !v5e.offers([4, 1, 1]) && !v5e.offers([16, 32, 1]));
        for generation in TpuGeneration::ALL {
            let shapes = &generation.spec().slice_shapes;
            assert!(shapes.largest_slice_chips <= generation.spec().max_pod_chips);
            for shape in shapes.listed {
                assert!(shape.iter().product::<u32>() <= shapes.largest_slice_chips);
            }
        }
    }

    #[test]
    fn twisted_shapes_are_k_k_2k_and_k_2k_2k() {
        assert_eq!(twisted_torus_edge([4, 4, 8]), Some(4));
        assert_eq!(twisted_torus_edge([8, 4, 8]), Some(4));
        assert_eq!(twisted_torus_edge([8, 8, 16]), Some(8));
        assert_eq!(twisted_torus_edge([4, 4, 4]), None);
        assert_eq!(twisted_torus_edge([4, 8, 16]), None);
        assert_eq!(twisted_torus_edge([2, 2, 4]), None);
    }

    #[test]
    fn ocs_figures_match_the_v4_paper() {
        let ocs = TpuGeneration::V4.spec().ocs.expect("v4 is built of cubes");
        assert_eq!(ocs.ocs_count(), 48);
        assert_eq!(ocs.pod_cubes * ocs.chips_per_cube(), 4096);
        // 6 faces x 16 links per cube, 6144 optical links in the pod.
        assert_eq!(6 * ocs.cube_edge.pow(2) * ocs.pod_cubes, 6144);
        assert_eq!(ocs.ports_per_ocs, 2 * ocs.pod_cubes);
        for generation in TpuGeneration::ALL {
            let spec = generation.spec();
            if let Some(ocs) = spec.ocs {
                assert_eq!(spec.slice_shapes.cube_edge, Some(ocs.cube_edge));
                assert!(ocs.pod_cubes * ocs.chips_per_cube() >= spec.max_pod_chips);
            }
        }
    }

    #[test]
    fn v4_wraps_only_multiples_of_four() {
        let v4 = TpuGeneration::V4.spec();
        assert!(v4.can_wrap(4) && v4.can_wrap(16));
        assert!(!v4.can_wrap(2) && !v4.can_wrap(6));
        // v5e and v6e close a ring only along a full 16-chip axis.
        for generation in [TpuGeneration::V5e, TpuGeneration::V6e] {
            let spec = generation.spec();
            assert!(spec.can_wrap(16));
            assert!(!spec.can_wrap(2) && !spec.can_wrap(4) && !spec.can_wrap(8));
            assert!(!spec.can_wrap(32));
        }
        let v3 = TpuGeneration::V3.spec();
        assert!(v3.can_wrap(3) && !v3.can_wrap(2));
    }
}
