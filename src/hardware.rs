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
//!   1200 GB/s, 2 TensorCores, 3D torus, 4096 chips, bisection 24 TB/s, peak
//!   "275 teraflops (bf16 or int8)", PCIe Gen3 x16 host interface) and
//!   N. P. Jouppi et al., "TPU v4: An Optically Reconfigurable Supercomputer",
//!   ISCA 2023 (6 ICI links per chip, 50 GB/s each way).
//! - \[v5e\]: Cloud TPU v5e documentation (16 GB HBM2 at 819 GB/s, 1 TensorCore,
//!   int8 393 TOPS, 400 GB/s bidirectional ICI per chip over 4 ports, 8 chips
//!   per host, 2D torus of 256 chips, all-reduce 51.2 TB/s, bisection
//!   1.6 TB/s; VM types: the 8-chip `ct5lp-hightpu-8t` has 384 GB of RAM, of
//!   the host's 512 GiB).
//! - \[v5p\]: Cloud TPU v5p documentation (95 GiB HBM2e at 2765 GB/s,
//!   2 TensorCores, 1200 GB/s bidirectional ICI per chip, 3D torus, 4 chips per
//!   host VM with 448 GB of RAM, 8960 chips).
//! - \[v6e\]: Cloud TPU v6e documentation (32 GB HBM at 1638 GB/s, 1 TensorCore,
//!   int8 1836 TOPS, PCIe Gen5 host interface, 800 GB/s bidirectional ICI per
//!   chip over 4 ports, 8 chips per host, 2D torus of 256 chips, all-reduce
//!   102.4 TB/s, bisection 3.2 TB/s; DRAM per host 1536 GiB, of which the
//!   8-chip VM `ct6e-standard-8t` has 1440 GB).
//! - \[tpu7x\]: Cloud TPU documentation "TPU7x (Ironwood)" and Compute Engine
//!   "TPU machines in accelerator-optimized machine family" (specification
//!   table): 9216 chips per pod; bf16 2307 and fp8 4614 TFLOPS per chip;
//!   192 GiB HBM at 7380 GB/s; 2 TensorCores per chip, one on each of two
//!   chiplets (96 GB of HBM each), which JAX exposes as two devices;
//!   1200 GB/s bidirectional ICI per chip; a 3D torus of 4x4x4 cubes (slices
//!   over 64 chips are whole cubes) scaling to 9216 chips; every VM
//!   (`tpu7x-standard-4t`) has 4 chips, 960 GiB of RAM and 2 NICs of
//!   400 Gbit/s in all; DCN 100 Gbit/s per chip.
//! - \[int8\]: peak int8 ops per chip. v4: 275 TOPS, the bf16 rate (\[v4\]);
//!   v5e 393 TOPS (\[v5e\]); v6e 1836 TOPS (\[v6e\]); v5p 918 TOPS from the
//!   JAX scaling book's table (\[book\], "FLOPs/s/chip (int8)" 9.18e14; the
//!   current Cloud v5p page gives no int8 figure); TPU7x 4614 TOPS,
//!   inferred: the book's table gives 4.61e15, the fp8 figure, and Cloud
//!   publishes fp8 only. v2 and v3: none published (0).
//! - \[fp8\]: TPU7x is the first generation with native fp8 ("Ironwood is our
//!   first TPU generation to offer native 8-bit floating point (FP8)
//!   support", Google Cloud, "A developer's guide to training with Ironwood
//!   TPUs", 2026; Cloud "TPU7x (Ironwood) performance optimizations":
//!   "built-in hardware acceleration for FP8 data types ... 4614 TFLOPS per
//!   chip"). Cloud's comparison table lists v5p and v6e at 459 and 918 fp8
//!   TFLOPS, their bf16 rates: fp8 runs there at the bf16 rate, with no
//!   native fp8 path, so their figure here is 0.
//! - \[shapes\]: the slice shapes each generation is sold in, from the Cloud
//!   TPU documentation pages "TPU v2", "TPU v3", "TPU v4", "TPU types and
//!   topologies", "TPU v5e", "TPU v5p" (table of single-slice shapes),
//!   "TPU v6e" and "TPU7x (Ironwood)"; see [`SliceShapes`] and each
//!   generation's `slice_shapes`. Shapes are compared as sets of extents
//!   (`8x4` is `4x8`): which axis is called x is a naming choice, not a
//!   different slice.
//! - \[xpk\]: TPU7x's shape list: Google's XPK (`AI-Hypercomputer/xpk`,
//!   `src/xpk/core/system_characteristics.py`, 2026-06) offers tpu7x slices
//!   2x2x1, 2x2x2, 2x2x4, 2x4x4 and every AxBxC of dimensions that are
//!   multiples of 4, at most 256, of at most 144 cubes
//!   (`generate_tpu_topologies(max_cubes=144)`); Cloud's page names the
//!   cubes and the 9216-chip limit but its table of shapes could not be
//!   read here. XPK's table is also the source of the accelerator types
//!   (`v5p-896` = 4x4x28, ..., `v5p-17920` = 16x20x28, the 8960-chip pod as
//!   one slice) offered beyond the v5p page's rule of whole cubes up to
//!   16x16x24, and of every accelerator type's shape
//!   (`crate::topology::presets`).
//! - \[twist\]: Cloud TPU v4 documentation ("3D mesh and 3D torus": slices
//!   `AxBxC` with `2A=B=C` or `2A=2B=C`, every dimension a multiple of 4,
//!   such as 4x4x8 and 4x8x8, can be twisted tori) and the v5p shape table
//!   (twisted: 4x4x8, 4x8x8, 8x8x16, 8x16x16); N. P. Jouppi et al., ISCA 2023,
//!   section "twisted tori". No twisted TPU7x slice is documented.
//! - \[book\]: J. Austin et al., "How to Scale Your Model" (the JAX scaling
//!   book), part 2, "How to Think About TPUs" (`jax-ml/scaling-book`,
//!   `tpus.md`, 2026, with the TPU7x rows).
//! - \[wrap16\]: \[book\]: "TPU v5e only has a wraparound connection when
//!   one axis has size 16"; v6e's 2D slices are built the same way
//!   (\[v6e\]: 256-chip 16x16 torus). A v5e-16 (4x4) is a mesh.
//! - \[storage\]: checkpoint reads are modeled at 1 GB/s per host
//!   ([`CHECKPOINT_READ_BYTES_PER_S_PER_HOST`]), the order of a Persistent
//!   Disk or Cloud Storage read stream per VM; an assumption, not a TPU
//!   figure.
//! - \[hostlink\]: a chip's PCIe link to its host, each way
//!   ([`HardwareSpec::host_link_bytes_per_s`]; the device-to-host copy of an
//!   asynchronous checkpoint runs at it, taken as the copy's whole cost: the
//!   host's memory is not the bottleneck). The JAX scaling book
//!   (\[book\]): "PCIe bandwidth is typically around `1.6e10` bytes /
//!   second per TPU (`3.2e10` for TPU v6e)"; an earlier version: "PCIe
//!   bandwidth for TPU v4 is 16GB / second each way". v4: PCIe Gen3 x16
//!   (\[v4\]), 8 GT/s x 16 lanes with 128b/130b coding, 15.75 GB/s, which
//!   v2 and v3 are taken at too (an assumption: not published). v5e and
//!   v5p: 16 GB/s (the book). v6e: 32 GB/s (the book; \[v6e\]: PCIe Gen5).
//!   TPU7x: 16 GB/s, an assumption: the book's general figure, which names
//!   only v6e as faster; \[tpu7x\] says each set of four chips reaches its
//!   host over PCIe and gives no bandwidth.
//! - \[hostdram\]: memory of one host, the VM over the engine's block of
//!   `chips_per_host_bounds` chips, from the machine types (Compute Engine's
//!   "GB" of memory are GiB: its API gives memory in MiB). TPU7x 960 GiB,
//!   v6e 1440, v5p 448, v5e 384 (\[tpu7x\], \[v6e\], \[v5p\], \[v5e\]). v4:
//!   407 GiB (`ct4p-hightpu-4t`; not verified against a Cloud page here).
//!   v2 and v3: 335 GiB, the 96-vCPU TPU VM of a 2021 third-party report
//!   (not verified against a Cloud page).
//! - \[nic\]: DCN bandwidth per host, each way. v5p: 50 Gbit/s per chip
//!   (\[v5p\]) times 4 chips per host; TPU7x: 100 Gbit/s per chip (\[tpu7x\])
//!   times 4, the VM's 400 Gbit/s; v5e: 6.4 Tbit/s of data-center network
//!   per 256-chip pod (\[v5e\]) over 32 hosts, 200 Gbit/s; v6e: 100 Gbit/s
//!   per chip (the Cloud TPU7x page's comparison table: "Data center
//!   network (DCN) bandwidth per chip (Gb/s) | 50 | 100 | 100" for v5p,
//!   v6e, TPU7x) times its 8 chips; v2, v3 and v4 hosts as one 100 Gbit/s
//!   NIC (an assumption: not published per host).
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
//!   is built of the same 4x4x4 cubes (8960 chips = 140 cubes), and so is
//!   TPU7x (9216 chips = 144 cubes, \[tpu7x\]); their OCS counts are not
//!   published, so the v4 arrangement (16 OCSes per dimension, two ports
//!   per cube, 10 s to reconfigure) is assumed for both.
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

/// PCIe Gen3 x16, each way: 8 GT/s x 16 lanes, 128b/130b coding
/// (\[hostlink\]).
const PCIE_GEN3_X16: f64 = 15.75 * GB;

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

/// The OCS assumed for TPU7x (\[ocs\]: the v4 arrangement over 144 cubes;
/// Google publishes the cubes, not the switches).
pub const TPU7X_OCS: OcsSpec = OcsSpec {
    cube_edge: 4,
    pod_cubes: 144,
    ocs_per_dimension: 16,
    ports_per_ocs: 288,
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
    /// TPU7x, Ironwood (2025): `"tpu7x"` in pod files, as Google Cloud
    /// names it. JAX sees each chip as two devices; the engine models one
    /// device per chip (see [`HardwareSpec::cores_per_chip`]).
    Tpu7x,
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
    /// The shapes listed beyond the cube rule (XPK's larger v5p types) are
    /// counted, with the first and last, rather than all named.
    pub fn describe(&self, ndims: usize) -> String {
        let name = |shape: &[u32; 3]| {
            shape[..ndims]
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join("x")
        };
        let edge = self.cube_edge.unwrap_or(u32::MAX);
        let (small, beyond): (Vec<&[u32; 3]>, Vec<&[u32; 3]>) = self
            .listed
            .iter()
            .partition(|shape| self.cube_edge.is_none() || shape.iter().any(|&d| d < edge));
        let mut text = small.into_iter().map(name).collect::<Vec<_>>().join(", ");
        if let Some(edge) = self.cube_edge {
            text += &format!(
                ", and any AxBxC of whole {edge}x{edge}x{edge} cubes (every dimension a multiple \
                 of {edge}, at most {}) up to {} chips",
                self.max_dimension, self.largest_slice_chips
            );
        }
        if let (Some(first), Some(last)) = (beyond.first(), beyond.last()) {
            text += &format!(
                ", and {} accelerator types beyond that rule ({} … {})",
                beyond.len(),
                name(first),
                name(last)
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
    /// TensorCores per chip. The engine models one device per chip, which
    /// JAX also does for v4 and v5p (a megacore of two cores) but not for
    /// v2, v3 and TPU7x: JAX sees each core of those as a device of its
    /// own, so a JAX device count there is `cores_per_chip` (2) times the
    /// chip count (TPU7x: two chiplets of one TensorCore and 96 GB of HBM
    /// each, \[tpu7x\]).
    pub cores_per_chip: u32,
    /// Peak bf16 throughput per chip, FLOP/s.
    pub peak_bf16_flops: f64,
    /// Peak int8 throughput per chip, operations per second (\[int8\]); 0
    /// where none is published (v2, v3).
    pub peak_int8_ops: f64,
    /// Peak fp8 throughput per chip, FLOP/s (\[fp8\]); 0 where the chip has
    /// no native fp8 (every generation before TPU7x).
    pub peak_fp8_flops: f64,
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
    /// Each chip's host link (PCIe), bytes per second each way
    /// (\[hostlink\]): what a chip copies HBM to host memory at, as an
    /// asynchronous checkpoint does.
    pub host_link_bytes_per_s: f64,
    /// Memory of one host (the VM over `chips_per_host_bounds`), bytes
    /// (\[hostdram\]).
    pub host_dram_bytes: u64,
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

mod shapes;
use shapes::{TWO_D_256, V5P_LISTED};

static V2: HardwareSpec = HardwareSpec {
    name: "v2",
    hbm_bytes: 16 * GIB,
    hbm_bytes_per_s: 700.0 * GB,
    cores_per_chip: 2,
    peak_bf16_flops: 45e12,
    peak_int8_ops: 0.0,
    peak_fp8_flops: 0.0,
    torus_dims: 2,
    ici_ports: 4,
    ici_bytes_per_s: 496e9 / 8.0,
    ici_latency_ns: 1_000,
    dcn_bytes_per_s: 12.5 * GB,
    dcn_latency_ns: 10_000,
    dcn_host_bytes_per_s: 12.5 * GB,
    host_link_bytes_per_s: PCIE_GEN3_X16,
    host_dram_bytes: 335 * GIB,
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
    peak_int8_ops: 0.0,
    peak_fp8_flops: 0.0,
    torus_dims: 2,
    ici_ports: 4,
    ici_bytes_per_s: 656e9 / 8.0,
    ici_latency_ns: 1_000,
    dcn_bytes_per_s: 12.5 * GB,
    dcn_latency_ns: 10_000,
    dcn_host_bytes_per_s: 12.5 * GB,
    host_link_bytes_per_s: PCIE_GEN3_X16,
    host_dram_bytes: 335 * GIB,
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
    peak_int8_ops: 275e12,
    peak_fp8_flops: 0.0,
    torus_dims: 3,
    ici_ports: 6,
    ici_bytes_per_s: 50.0 * GB,
    ici_latency_ns: 1_000,
    dcn_bytes_per_s: 12.5 * GB,
    dcn_latency_ns: 10_000,
    dcn_host_bytes_per_s: 12.5 * GB,
    host_link_bytes_per_s: PCIE_GEN3_X16,
    host_dram_bytes: 407 * GIB,
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
    peak_int8_ops: 393e12,
    peak_fp8_flops: 0.0,
    torus_dims: 2,
    ici_ports: 4,
    // 400 GB/s bidirectional per chip over 4 ports.
    ici_bytes_per_s: 400.0 * GB / 4.0 / 2.0,
    ici_latency_ns: 1_000,
    // 2 x 100 Gbit/s NICs per 8-chip host.
    dcn_bytes_per_s: 25.0 * GB,
    dcn_latency_ns: 10_000,
    dcn_host_bytes_per_s: 25.0 * GB,
    host_link_bytes_per_s: 16.0 * GB,
    host_dram_bytes: 384 * GIB,
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
    peak_int8_ops: 918e12,
    peak_fp8_flops: 0.0,
    torus_dims: 3,
    ici_ports: 6,
    // 1200 GB/s bidirectional per chip over 6 ports.
    ici_bytes_per_s: 1200.0 * GB / 6.0 / 2.0,
    ici_latency_ns: 1_000,
    // 50 Gbit/s DCN per chip.
    dcn_bytes_per_s: 50e9 / 8.0,
    dcn_latency_ns: 10_000,
    dcn_host_bytes_per_s: 4.0 * 50e9 / 8.0,
    host_link_bytes_per_s: 16.0 * GB,
    host_dram_bytes: 448 * GIB,
    chips_per_host_bounds: [2, 2, 1],
    wraparound: WraparoundRule::MultipleOf(4),
    max_pod_chips: 8960,
    // "TPU v5p": the table's shapes below a cube (2x2x1, 2x2x2, 2x4x4; 2x2x4
    // is v5p-32) and cube-built shapes up to the largest, 16x16x24 (6144
    // chips; the table lists "most but not all" of them), plus the
    // accelerator types XPK lists beyond that rule (\[xpk\], up to
    // v5p-17920, 16x20x28). Multislice goes beyond: 18,432 chips.
    slice_shapes: SliceShapes {
        listed: V5P_LISTED,
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
    peak_int8_ops: 1836e12,
    peak_fp8_flops: 0.0,
    torus_dims: 2,
    ici_ports: 4,
    // 800 GB/s bidirectional per chip over 4 ports.
    ici_bytes_per_s: 800.0 * GB / 4.0 / 2.0,
    ici_latency_ns: 1_000,
    // 100 Gbit/s per chip (\[nic\]).
    dcn_bytes_per_s: 100e9 / 8.0,
    dcn_latency_ns: 10_000,
    dcn_host_bytes_per_s: 8.0 * 100e9 / 8.0,
    host_link_bytes_per_s: 32.0 * GB,
    host_dram_bytes: 1440 * GIB,
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

/// TPU7x (Ironwood), \[tpu7x\]. One device entity per chip: JAX sees each
/// chip as two devices, one per chiplet, so a JAX device count is twice
/// the chip count (see [`HardwareSpec::cores_per_chip`]). Uncalibrated: no
/// published TPU7x run fits the step model's MXU efficiency yet.
static TPU7X: HardwareSpec = HardwareSpec {
    name: "tpu7x",
    hbm_bytes: 192 * GIB,
    hbm_bytes_per_s: 7380.0 * GB,
    cores_per_chip: 2,
    peak_bf16_flops: 2307e12,
    peak_int8_ops: 4614e12,
    peak_fp8_flops: 4614e12,
    torus_dims: 3,
    ici_ports: 6,
    // Derived: 1200 GB/s bidirectional per chip over 6 ports, 100 GB/s per
    // link each way (the book lists 90 GB/s one way, as for v5p).
    ici_bytes_per_s: 1200.0 * GB / 6.0 / 2.0,
    ici_latency_ns: 1_000,
    // 100 Gbit/s DCN per chip; 4 chips, 400 Gbit/s, per VM.
    dcn_bytes_per_s: 100e9 / 8.0,
    dcn_latency_ns: 10_000,
    dcn_host_bytes_per_s: 4.0 * 100e9 / 8.0,
    host_link_bytes_per_s: 16.0 * GB,
    host_dram_bytes: 960 * GIB,
    chips_per_host_bounds: [2, 2, 1],
    wraparound: WraparoundRule::MultipleOf(4),
    max_pod_chips: 9216,
    // \[xpk\]: 1x1x1 (tpu7x-2), 2x2x1, 2x2x2, 2x2x4, 2x4x4 and any AxBxC of
    // whole cubes, every dimension at most 256, up to 144 cubes (the pod,
    // 9216 chips).
    slice_shapes: SliceShapes {
        listed: &[[1, 1, 1], [2, 2, 1], [2, 2, 2], [2, 2, 4], [2, 4, 4]],
        cube_edge: Some(4),
        max_dimension: 256,
        largest_slice_chips: 9216,
    },
    twisted_tori: false,
    ocs: Some(TPU7X_OCS),
};

impl TpuGeneration {
    /// Every generation, oldest first.
    pub const ALL: [TpuGeneration; 7] = [
        TpuGeneration::V2,
        TpuGeneration::V3,
        TpuGeneration::V4,
        TpuGeneration::V5e,
        TpuGeneration::V5p,
        TpuGeneration::V6e,
        TpuGeneration::Tpu7x,
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
            TpuGeneration::Tpu7x => &TPU7X,
        }
    }

    /// Short name as written in pod files (`"v4"`).
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// Every generation's name, oldest first, comma-separated (for error
    /// messages: `v2, v3, ..., tpu7x`).
    pub fn names() -> String {
        TpuGeneration::ALL.map(TpuGeneration::name).join(", ")
    }

    /// The names of the generations whose pods are built of cubes joined by
    /// optical circuit switches, as prose (`v4, v5p and tpu7x`).
    pub fn cube_built_names() -> String {
        let names: Vec<&str> = TpuGeneration::ALL
            .into_iter()
            .filter(|g| g.spec().ocs.is_some())
            .map(TpuGeneration::name)
            .collect();
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => names.concat(),
        }
    }
}

impl fmt::Display for TpuGeneration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error for a generation name that is not one of [`TpuGeneration::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown TPU generation `{0}` (known: {known})", known = TpuGeneration::names())]
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
mod tests;
