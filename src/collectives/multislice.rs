//! Hierarchical collectives over a multislice pod: ICI inside each slice,
//! DCN across slices, the way JAX/XLA run a collective over several slices.
//!
//! A multislice pod is `S` identical slices of one torus; the slices share
//! no ICI and meet only through their hosts' NICs on the data-center
//! network (the DCN fabric, `topology::DcnFabric`). A reduce-scatter
//! therefore runs in two levels:
//!
//! 1. inside every slice at once, the torus reduce-scatter over ICI, its
//!    parts on every axis at once ([`super::torus_reduce_scatter_traffic`]'s
//!    schedule; the values as [`super::torus_reduce_scatter`]); afterwards each
//!    device holds the slice's partial sum of its shard;
//! 2. across slices over DCN, among the `S` devices that hold the same
//!    shard (a device and its twins, one per slice): each splits its shard
//!    into `S` chunks and sends chunk `k` to its twin in slice `k`, which
//!    folds the `S − 1` partials it receives with its own.
//!
//! An all-gather undoes it (across slices first, then inside each slice,
//! axes in reverse), and an all-reduce is a reduce-scatter and an
//! all-gather. Step 2 is one exchange rather than a ring because the fabric
//! joins every host to its twin in every other slice (a full mesh of
//! rails): all `S − 1` rails run at once and the cross-slice phase pays one
//! latency.
//!
//! **Order and bits.** The slice index is a fourth grid axis after x, y, z
//! (a 2D slice gets a z of extent 1), so device `d = local + C·slice` (`C`
//! chips per slice) sits at grid coordinates `(x, y, z, slice)` and the
//! two levels are exactly the torus reduce-scatter on the grid
//! `[X, Y, Z, S]`: the twin in slice `c` folds its chunk as
//! `p(c+1) + p(c+2) + … + p(c)` (slices mod `S`, left to right), the ring
//! order along axis 3 of [`super::ReduceGrid`]. The data are computed by
//! that torus code on the grid, so the values are its bits; only the
//! traffic record of axis 3 differs from a ring's.
//!
//! **Traffic.** The ICI passes are the slice torus's records, with pod
//! device ids. The cross-slice pass is recorded on the DCN fabric's link
//! entities: one [`Transfer`] per host and destination slice, from the
//! host's NIC device (its first chip, where the fabric meets the host) to
//! the twin host's, carrying the bytes of every chip of the host (they
//! share the host's NICs). Its [`Phase`] has `dim` = [`DCN_AXIS`] and step
//! 0. The hop from a chip to its host's NICs is PCIe, which the engine
//! does not model.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::Serialize;

use super::CollectiveError;
use super::element::{Element, ReduceOp};
use super::ring::chunk_range;
use super::schedule::{AxisPlan, record_schedule};
use super::torus::{
    TorusShape, narrowed_ranges, torus_all_gather_slices, torus_all_reduce_slices,
    torus_reduce_scatter_slices, torus_shard_ranges,
};
use super::traffic::{Phase, PhaseKind, Traffic, Transfer};

/// The [`Phase::dim`] of a cross-slice pass: the slice index is the grid's
/// fourth axis, after x, y and z.
pub const DCN_AXIS: u32 = 3;

/// A multislice pod as its collectives see it: the slice's torus, the
/// slice count, and per chip of a slice the chip whose host NICs it uses.
/// Built only through [`MultisliceShape::new`], which checks it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MultisliceShape {
    slice: TorusShape,
    slices: usize,
    nic: Vec<usize>,
}

impl MultisliceShape {
    /// `slices` (≥ 2) copies of `slice` (1 to 3 dimensions; padded to 3
    /// with extent-1 axes). `nic[i]` is the chip of slice index `i` whose
    /// host NICs `i` uses: a chip of the slice that is its own NIC chip.
    pub fn new(
        slice: &TorusShape,
        slices: usize,
        nic: Vec<usize>,
    ) -> Result<MultisliceShape, CollectiveError> {
        let count = slice.device_count();
        let ndims = slice.dims().len();
        let invalid = || CollectiveError::InvalidMultislice {
            dims: slice.dims().to_vec(),
            slices,
            reason: if ndims > 3 {
                "a slice has at most 3 dimensions".into()
            } else if slices < 2 {
                "a multislice pod has 2 or more slices".into()
            } else {
                format!(
                    "the NIC map must name, for each of the {count} chips, a chip of the slice that is its own NIC chip"
                )
            },
        };
        let nic_ok = nic.len() == count && nic.iter().all(|&h| h < count && nic[h] == h);
        if ndims > 3 || slices < 2 || !nic_ok || count.checked_mul(slices).is_none() {
            return Err(invalid());
        }
        let mut dims = slice.dims().to_vec();
        let mut wrap = slice.wraparound().to_vec();
        dims.resize(3, 1);
        wrap.resize(3, false);
        Ok(MultisliceShape {
            slice: TorusShape::new(&dims, &wrap)?,
            slices,
            nic,
        })
    }

    /// One slice's torus (3 dimensions).
    pub fn slice(&self) -> &TorusShape {
        &self.slice
    }

    /// Number of slices.
    pub fn slices(&self) -> usize {
        self.slices
    }

    /// Chips per slice.
    pub fn chips_per_slice(&self) -> usize {
        self.slice.device_count()
    }

    /// Devices in the pod.
    pub fn device_count(&self) -> usize {
        self.chips_per_slice() * self.slices
    }

    /// The reduction grid `[X, Y, Z, S]` (slice axis last, a ring: every
    /// slice reaches every other over the fabric).
    pub fn grid(&self) -> TorusShape {
        let mut dims = self.slice.dims().to_vec();
        let mut wrap = self.slice.wraparound().to_vec();
        dims.push(self.slices);
        wrap.push(true);
        TorusShape::new(&dims, &wrap).expect("checked in new")
    }

    /// The device whose host NICs `device` uses.
    pub fn nic_of(&self, device: usize) -> usize {
        let c = self.chips_per_slice();
        (device / c) * c + self.nic[device % c]
    }
}

/// The range of a `len`-element buffer each device owns after
/// [`multislice_reduce_scatter`] (indexed by device id): its chunk of the
/// grid `[X, Y, Z, S]`, [`torus_shard_ranges`] on [`MultisliceShape::grid`].
pub fn multislice_shard_ranges(shape: &MultisliceShape, len: usize) -> Vec<Range<usize>> {
    torus_shard_ranges(&shape.grid(), len)
}

fn grid_slices<'a, T, B: AsMut<[T]>>(
    buffers: &'a mut [B],
    shape: &MultisliceShape,
) -> Result<Vec<&'a mut [T]>, CollectiveError> {
    super::torus_slices(buffers, &shape.grid())
}

/// Hierarchical all-reduce (module docs): reduce-scatter inside every
/// slice over ICI, across slices over DCN, then all-gather back. Every
/// device ends with the same bits, those of [`super::torus_all_reduce`]
/// on [`MultisliceShape::grid`].
///
/// ```
/// use optirs_tpu::collectives::{
///     DCN_AXIS, MultisliceShape, ReduceOp, TorusShape, multislice_all_reduce,
/// };
/// // Two slices of a 2-chip line, one host per slice (its NIC chip is 0).
/// let slice = TorusShape::new(&[2], &[false])?;
/// let shape = MultisliceShape::new(&slice, 2, vec![0, 0])?;
/// let mut buffers = vec![vec![1.0f32; 4], vec![2.0; 4], vec![3.0; 4], vec![4.0; 4]];
/// let traffic = multislice_all_reduce(&mut buffers, &shape, ReduceOp::Sum)?;
/// assert!(buffers.iter().all(|b| b == &[10.0; 4]));
/// // The DCN passes run between the two hosts' NIC chips, devices 0 and 2.
/// let dcn = traffic.transfers.iter().filter(|t| t.phase.dim == DCN_AXIS);
/// assert!(dcn.clone().all(|t| matches!((t.src, t.dst), (0, 2) | (2, 0))));
/// assert_eq!(dcn.map(|t| t.bytes).sum::<u64>(), 4 * 4 * 2); // 2 chips x 1 element x 4 B, x 2 ways x 2 passes
/// # Ok::<(), optirs_tpu::collectives::CollectiveError>(())
/// ```
pub fn multislice_all_reduce<T: Element, B: AsMut<[T]>>(
    buffers: &mut [B],
    shape: &MultisliceShape,
    op: ReduceOp,
) -> Result<Traffic, CollectiveError> {
    let slices = grid_slices(buffers, shape)?;
    let len = slices.first().map_or(0, |s| s.len());
    torus_all_reduce_slices(slices, &shape.grid(), op);
    let mut traffic = Traffic::default();
    let next = record_reduce_scatter(&mut traffic, shape, len, T::BYTES, 0);
    record_all_gather(&mut traffic, shape, len, T::BYTES, next);
    Ok(traffic)
}

/// Hierarchical reduce-scatter: afterwards
/// `buffers[d][multislice_shard_ranges(shape, len)[d]]` holds the reduction
/// over every device of the pod (divided by the device count for `Mean`),
/// bit for bit [`multislice_all_reduce`]'s there; other elements hold
/// partial sums.
pub fn multislice_reduce_scatter<T: Element, B: AsMut<[T]>>(
    buffers: &mut [B],
    shape: &MultisliceShape,
    op: ReduceOp,
) -> Result<Traffic, CollectiveError> {
    let slices = grid_slices(buffers, shape)?;
    let len = slices.first().map_or(0, |s| s.len());
    torus_reduce_scatter_slices(slices, &shape.grid(), op);
    let mut traffic = Traffic::default();
    record_reduce_scatter(&mut traffic, shape, len, T::BYTES, 0);
    Ok(traffic)
}

/// Hierarchical all-gather: device `d` contributes
/// `multislice_shard_ranges(shape, len)[d]` of its buffer; afterwards every
/// device holds every range (across slices first, then inside each slice).
/// Elements outside a device's own range are overwritten.
pub fn multislice_all_gather<T: Element, B: AsMut<[T]>>(
    buffers: &mut [B],
    shape: &MultisliceShape,
) -> Result<Traffic, CollectiveError> {
    let slices = grid_slices(buffers, shape)?;
    let len = slices.first().map_or(0, |s| s.len());
    torus_all_gather_slices(slices, &shape.grid());
    let mut traffic = Traffic::default();
    record_all_gather(&mut traffic, shape, len, T::BYTES, 0);
    Ok(traffic)
}

/// The traffic of [`multislice_reduce_scatter`] of `len` elements, without
/// moving data: the slice's rounds over ICI (orders 0..3 at most, the
/// torus schedule's), then the DCN pass at order 3.
pub fn multislice_reduce_scatter_traffic(
    shape: &MultisliceShape,
    len: usize,
    elem_bytes: usize,
) -> Traffic {
    let mut traffic = Traffic::default();
    record_reduce_scatter(&mut traffic, shape, len, elem_bytes, 0);
    traffic
}

/// The traffic of the all-gather that undoes a multislice reduce-scatter
/// of `len` elements: the DCN pass at `first_order`, then the slice's
/// rounds over ICI in reverse.
pub fn multislice_all_gather_traffic(
    shape: &MultisliceShape,
    len: usize,
    elem_bytes: usize,
    first_order: u32,
) -> Traffic {
    let mut traffic = Traffic::default();
    record_all_gather(&mut traffic, shape, len, elem_bytes, first_order);
    traffic
}

/// The traffic of a reduce-scatter (`kind` [`PhaseKind::ReduceScatter`])
/// or all-gather across the slices alone, `len` elements per device (each
/// device with its twins in the other slices, over the DCN), at phase
/// order `order`, without moving data: the exchange a multislice
/// reduce-scatter or all-gather runs after (before) its slice rounds. A
/// reduce-scatter then an all-gather at the next order is the all-reduce
/// of a data axis over the slices.
pub fn dcn_exchange_traffic(
    shape: &MultisliceShape,
    len: usize,
    elem_bytes: usize,
    kind: PhaseKind,
    order: u32,
) -> Traffic {
    let ranges = vec![0..len; shape.grid().device_count()];
    let mut traffic = Traffic::default();
    record_exchange(&mut traffic, shape, &ranges, kind, order, elem_bytes);
    traffic
}

/// Records the reduce-scatter's passes from `order` (the slice's rounds,
/// one order each, of [`super::torus_reduce_scatter_traffic`]'s schedule,
/// then the exchange at `order + 3`); returns the next order, `order + 4`.
fn record_reduce_scatter(
    traffic: &mut Traffic,
    shape: &MultisliceShape,
    len: usize,
    elem: usize,
    order: u32,
) -> u32 {
    let grid = shape.grid();
    let plan = AxisPlan::new(&grid, &[0, 1, 2]);
    // At most 3 rounds (one per axis of extent > 1), then the exchange at 3.
    record_schedule(
        traffic,
        &grid,
        &plan,
        len,
        elem,
        PhaseKind::ReduceScatter,
        order,
    );
    let ranges = narrowed_ranges(&grid, len, 3);
    record_exchange(
        traffic,
        shape,
        &ranges,
        PhaseKind::ReduceScatter,
        order + 3,
        elem,
    );
    order + 4
}

/// Records the all-gather's passes from `order` (the exchange, then the
/// slice's rounds in reverse from `order + 1`); returns `order + 4`.
fn record_all_gather(
    traffic: &mut Traffic,
    shape: &MultisliceShape,
    len: usize,
    elem: usize,
    order: u32,
) -> u32 {
    let grid = shape.grid();
    let ranges = narrowed_ranges(&grid, len, 3);
    record_exchange(traffic, shape, &ranges, PhaseKind::AllGather, order, elem);
    let plan = AxisPlan::new(&grid, &[0, 1, 2]);
    record_schedule(
        traffic,
        &grid,
        &plan,
        len,
        elem,
        PhaseKind::AllGather,
        order + 1,
    );
    order + 4
}

/// The cross-slice exchange on the fabric: every device's range (after the
/// slice's reduce-scatter) splits into `S` chunks; in a reduce-scatter it
/// sends chunk `k` to its twin in slice `k`, in an all-gather its own
/// chunk (its slice's) to every twin; in an all-to-all, like a
/// reduce-scatter, chunk `k` to slice `k`. Bytes are summed per host NIC
/// pair.
pub(super) fn record_exchange(
    traffic: &mut Traffic,
    shape: &MultisliceShape,
    ranges: &[Range<usize>],
    kind: PhaseKind,
    order: u32,
    elem: usize,
) {
    let s_count = shape.slices();
    let chips = shape.chips_per_slice();
    let mut bytes: BTreeMap<(usize, usize), u64> = BTreeMap::new();
    for (device, range) in ranges.iter().enumerate() {
        let (slice, local) = (device / chips, device % chips);
        for to in (0..s_count).filter(|&k| k != slice) {
            let chunk = match kind {
                PhaseKind::AllGather => slice,
                _ => to,
            };
            let moved = (chunk_range(range.len(), s_count, chunk).len() * elem) as u64;
            if moved > 0 {
                let key = (shape.nic_of(device), shape.nic_of(to * chips + local));
                *bytes.entry(key).or_insert(0) += moved;
            }
        }
    }
    let phase = Phase {
        order,
        kind,
        dim: DCN_AXIS,
        step: 0,
    };
    traffic
        .transfers
        .extend(bytes.into_iter().map(|((src, dst), bytes)| Transfer {
            src,
            dst,
            bytes,
            hops: 1,
            phase,
        }));
}
