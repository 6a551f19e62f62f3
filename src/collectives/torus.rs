//! Torus shapes and the multi-dimensional all-reduce.
//!
//! A torus of shape `[X, Y, Z]` numbers its devices `x + X·(y + Y·z)`. A
//! dimension either wraps around (a true ring of links) or not (a mesh line).
//!
//! **Values.** The all-reduce's values are those of the standard torus
//! algorithm: reduce-scatter along the rings of dimension 0, then along
//! dimension 1 on the shard each device now owns, and so on; then
//! all-gather in reverse order. After dimension `d` a device with
//! coordinate `k` along `d` owns chunk `k` of its previous shard, so all
//! devices of a dimension-`d+1` ring own the same range
//! ([`torus_shard_ranges`]). In process, the data moves in one pass that
//! combines every element in exactly that order (`fused_torus_all_reduce`;
//! the one order every path of the crate shares, [`super::ReduceGrid`]).
//!
//! **Links.** The traffic record is the schedule that keeps every link
//! busy (module `schedule`): the data split in one part per axis, each
//! part running the axes in rotated order so every round has a pass on
//! every axis at once, a ring of 3 or more chips sending half of each part
//! each way, a line without wraparound (a mesh axis, or a twisted torus's
//! axis, whose wraparound link lands in another plane) running two ways
//! (`RingRoute::line_messages`). Every message joins physically adjacent
//! devices. The ownership of ranges is the one above; only the route each
//! part takes differs from the staged algorithm, so for floats the
//! schedule's own association of the same terms would round differently,
//! and for integers the result is the same.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::CollectiveError;
use smallvec::SmallVec;

use super::element::{Element, ReduceOp, accumulate, combine_in_order, divide_all};
use super::ring::{
    Epilogue, SLICE_ELEMS, all_gather_rings, chunk_range, for_each_maybe_parallel, pieces,
    reduce_scatter_rings,
};
use super::schedule::{AxisPlan, record_schedule};
use super::traffic::{PhaseKind, Traffic};

/// The shape of a torus (or mesh) of devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TorusShape {
    dims: Vec<usize>,
    wraparound: Vec<bool>,
}

impl TorusShape {
    /// A torus with extents `dims` (each ≥ 1, at least one dimension) and a
    /// wraparound flag per dimension.
    pub fn new(dims: &[usize], wraparound: &[bool]) -> Result<Self, CollectiveError> {
        let device_count = dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .unwrap_or(0);
        if dims.is_empty() || dims.len() != wraparound.len() || device_count == 0 {
            return Err(CollectiveError::InvalidTorusShape {
                dims: dims.to_vec(),
                wraparound: wraparound.to_vec(),
            });
        }
        Ok(Self {
            dims: dims.to_vec(),
            wraparound: wraparound.to_vec(),
        })
    }

    /// Extents per dimension.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Wraparound per dimension.
    pub fn wraparound(&self) -> &[bool] {
        &self.wraparound
    }

    /// Number of devices, the product of the extents.
    pub fn device_count(&self) -> usize {
        self.dims.iter().product()
    }

    /// Coordinates of device `index`.
    pub fn coords(&self, index: usize) -> Vec<usize> {
        let mut rest = index;
        self.dims
            .iter()
            .map(|&d| {
                let c = rest % d;
                rest /= d;
                c
            })
            .collect()
    }

    /// Index of the device at `coords` (`x + X·(y + Y·z)`), `None` if the
    /// coordinates do not fit the shape.
    pub fn index(&self, coords: &[usize]) -> Option<usize> {
        if coords.len() != self.dims.len() || coords.iter().zip(&self.dims).any(|(c, d)| c >= d) {
            return None;
        }
        Some(
            coords
                .iter()
                .zip(&self.dims)
                .rev()
                .fold(0, |acc, (&c, &d)| acc * d + c),
        )
    }

    /// The links a message from device `from` to device `to` crosses under
    /// dimension-order routing: dimension 0 first, then 1, …; along a
    /// wraparound dimension the shorter way round (ties go up). Empty when
    /// `from == to` or either index is out of range.
    pub fn path(&self, from: usize, to: usize) -> Vec<(usize, usize)> {
        let count = self.device_count();
        if from >= count || to >= count {
            return Vec::new();
        }
        let target = self.coords(to);
        let mut at = self.coords(from);
        let mut current = from;
        let mut links = Vec::new();
        for dim in 0..self.dims.len() {
            let n = self.dims[dim];
            let up = (target[dim] + n - at[dim]) % n;
            let down = (at[dim] + n - target[dim]) % n;
            let step_up = if self.wraparound[dim] {
                up <= down
            } else {
                target[dim] > at[dim]
            };
            let moves = if self.wraparound[dim] {
                up.min(down)
            } else {
                at[dim].abs_diff(target[dim])
            };
            for _ in 0..moves {
                at[dim] = if step_up {
                    (at[dim] + 1) % n
                } else {
                    (at[dim] + n - 1) % n
                };
                let next = self.index(&at).unwrap_or(current);
                links.push((current, next));
                current = next;
            }
        }
        links
    }

    /// A ring over every device in which consecutive devices are adjacent
    /// (a boustrophedon: dimension 0 back and forth, each layer of the next
    /// dimension reversed). Only the closing hop, from the last device back
    /// to device 0, may span several links; [`Traffic::routed_on`] routes it.
    pub fn snake_ring(&self) -> Vec<usize> {
        let mut order: Vec<Vec<usize>> = vec![Vec::new()];
        for &n in &self.dims {
            let mut next = Vec::with_capacity(order.len() * n);
            for k in 0..n {
                let layer: Box<dyn Iterator<Item = &Vec<usize>>> = if k % 2 == 0 {
                    Box::new(order.iter())
                } else {
                    Box::new(order.iter().rev())
                };
                next.extend(layer.map(|c| {
                    let mut c = c.clone();
                    c.push(k);
                    c
                }));
            }
            order = next;
        }
        order.iter().filter_map(|c| self.index(c)).collect()
    }

    /// Distance between consecutive devices along dimension `dim`.
    fn stride(&self, dim: usize) -> usize {
        self.dims[..dim].iter().product()
    }

    /// After a reduce-scatter pass along `dim`, each device's range (indexed
    /// by device) becomes its coordinate's chunk of that range.
    pub(super) fn narrow(&self, dim: usize, ranges: &mut [Range<usize>]) {
        let n = self.dims[dim];
        let stride = self.stride(dim);
        for (dev, range) in ranges.iter_mut().enumerate() {
            let sub = chunk_range(range.len(), n, (dev / stride) % n);
            *range = range.start + sub.start..range.start + sub.end;
        }
    }

    /// The lines (device lists in coordinate order) along dimension `dim`.
    pub(super) fn lines(&self, dim: usize) -> Vec<Vec<usize>> {
        let n = self.dims[dim];
        let stride = self.stride(dim);
        (0..self.device_count())
            .filter(|&i| (i / stride).is_multiple_of(n))
            .map(|base| (0..n).map(|k| base + k * stride).collect())
            .collect()
    }
}

/// Takes the sub-slices `ranges[dev]` of each device's buffer and groups
/// them by line, in ring order.
fn line_slices<'a, T>(
    slots: &mut [Option<&'a mut [T]>],
    lines: &[Vec<usize>],
    ranges: &[Range<usize>],
) -> Vec<Vec<&'a mut [T]>> {
    // Each device's whole buffer is split off its current range, used, and
    // the remainder returned to its slot.
    lines
        .iter()
        .map(|line| {
            line.iter()
                .filter_map(|&dev| {
                    let buffer = slots[dev].take()?;
                    let range = ranges[dev].clone();
                    let (_, tail) = buffer.split_at_mut(range.start);
                    let (mid, _) = tail.split_at_mut(range.len());
                    Some(mid)
                })
                .collect()
        })
        .collect()
}

/// Multi-dimensional all-reduce over `slices` (one per device, indexed by
/// device, all of equal length). Validation is the caller's.
///
/// The values are those of the staged algorithm (reduce-scatter along each
/// dimension on the narrowed ranges, then all-gather in reverse), in its
/// order of combination, and the traffic is that schedule's; the data moves
/// in one pass ([`fused_torus_all_reduce`]).
pub(crate) fn torus_all_reduce_slices<T: Element>(
    slices: Vec<&mut [T]>,
    shape: &TorusShape,
    op: ReduceOp,
) -> Traffic {
    let len = slices.first().map_or(0, |s| s.len());
    fused_torus_all_reduce(slices, shape, op);
    torus_all_reduce_traffic(shape, len, T::BYTES)
}

/// The traffic of a torus all-reduce of `len` elements, without moving
/// data: [`torus_reduce_scatter_traffic`] (one order per round, at most
/// one per dimension), then [`torus_all_gather_traffic`] from order `dims`.
pub fn torus_all_reduce_traffic(shape: &TorusShape, len: usize, elem_bytes: usize) -> Traffic {
    let plan = AxisPlan::all(shape);
    let mut traffic = Traffic::default();
    record_schedule(
        &mut traffic,
        shape,
        &plan,
        len,
        elem_bytes,
        PhaseKind::ReduceScatter,
        0,
    );
    record_schedule(
        &mut traffic,
        shape,
        &plan,
        len,
        elem_bytes,
        PhaseKind::AllGather,
        shape.dims.len() as u32,
    );
    traffic
}

/// The torus all-reduce's data in one pass over every buffer: each owner's
/// final range ([`torus_shard_ranges`]) is reduced slice by slice from
/// every device's input, in the staged schedule's order ([`fold_level`]),
/// and the result written to every device. The staged passes read every
/// buffer once and then re-read and re-write the narrowed ranges along each
/// further dimension and on the way back (on a 4×2 torus 1.5 reads and
/// 1.25 writes of every buffer); this reads each once and writes each once,
/// the shared-memory floor.
fn fused_torus_all_reduce<T: Element>(slices: Vec<&mut [T]>, shape: &TorusShape, op: ReduceOp) {
    let len = slices.first().map_or(0, |s| s.len());
    let count = shape.device_count();
    let owners = torus_shard_ranges(shape, len);
    let mut by_start: Vec<usize> = (0..count).collect();
    by_start.sort_by_key(|&o| (owners[o].start, owners[o].end));
    debug_assert_eq!(owners.iter().map(|r| r.len()).sum::<usize>(), len);
    let mut rests = slices;
    let mut tasks = Vec::with_capacity(count);
    for &o in &by_start {
        let take = owners[o].len();
        let views: Vec<&mut [T]> = rests
            .iter_mut()
            .map(|rest| {
                let (head, tail) = std::mem::take(rest).split_at_mut(take);
                *rest = tail;
                head
            })
            .collect();
        tasks.extend(pieces(o, views));
    }
    let divisor = (op == ReduceOp::Mean).then_some(count);
    for_each_maybe_parallel(tasks, len * count * T::BYTES, |(owner, mut views)| {
        reduce_for_owner(shape, op, divisor, owner, &mut views);
    });
}

/// Reduces `views` (one piece of `owner`'s final range, per device) and
/// writes the result to every device, [`SLICE_ELEMS`] at a time.
fn reduce_for_owner<T: Element>(
    shape: &TorusShape,
    op: ReduceOp,
    divisor: Option<usize>,
    owner: usize,
    views: &mut [&mut [T]],
) {
    let len = views.first().map_or(0, |v| v.len());
    let top = shape.dims.len() - 1;
    // One slice of scratch per dimension: the partial of that level.
    let mut scratch = vec![T::ZERO; shape.dims.len() * SLICE_ELEMS];
    let mut start = 0;
    while start < len {
        let end = (start + SLICE_ELEMS).min(len);
        fold_level(shape, op, top, owner, views, start..end, &mut scratch);
        let acc = &mut scratch[top * SLICE_ELEMS..][..end - start];
        if let Some(divisor) = divisor {
            divide_all(acc, divisor);
        }
        for view in views.iter_mut() {
            view[start..end].copy_from_slice(acc);
        }
        start = end;
    }
}

/// Writes to `scratch[dim·SLICE_ELEMS..]` what device `m` holds on `range`
/// after the staged reduce-scatter along dimensions `0..=dim`: along its
/// dimension-`dim` line, the partial of the member after `m` (level
/// `dim − 1`, or its input for dimension 0), combined with each next
/// member's in ring order and `m`'s own last, as `reduce_one_chunk` does
/// for the chunk `m` owns.
fn fold_level<T: Element>(
    shape: &TorusShape,
    op: ReduceOp,
    dim: usize,
    m: usize,
    views: &[&mut [T]],
    range: Range<usize>,
    scratch: &mut [T],
) {
    let n = shape.dims[dim];
    let stride = shape.stride(dim);
    let position = (m / stride) % n;
    let base = m - position * stride;
    // The member `k` places after `m` along the line (`k = n` is `m`).
    let member = |k: usize| base + ((position + k) % n) * stride;
    let width = range.len();
    let (lower, level) = scratch.split_at_mut(dim * SLICE_ELEMS);
    let acc = &mut level[..width];
    if dim == 0 {
        let at = |k: usize| &views[member(k)][range.clone()];
        let rest: SmallVec<[&[T]; 16]> = (2..=n).map(at).collect();
        combine_in_order(op, acc, at(1), &rest);
        return;
    }
    let below = (dim - 1) * SLICE_ELEMS;
    fold_level(shape, op, dim - 1, member(1), views, range.clone(), lower);
    acc.copy_from_slice(&lower[below..below + width]);
    for k in 2..=n {
        fold_level(shape, op, dim - 1, member(k), views, range.clone(), lower);
        accumulate(op, acc, &lower[below..below + width]);
    }
}

/// The range of a `len`-element buffer each device owns after
/// [`super::torus_reduce_scatter`] (indexed by device): chunk `x` of dimension 0,
/// then chunk `y` of that along dimension 1, and so on. When `len` is a
/// multiple of the device count every range has `len / devices` elements.
pub fn torus_shard_ranges(shape: &TorusShape, len: usize) -> Vec<Range<usize>> {
    let mut ranges: Vec<Range<usize>> = vec![0..len; shape.device_count()];
    for dim in 0..shape.dims.len() {
        shape.narrow(dim, &mut ranges);
    }
    ranges
}

/// Reduce-scatter over `slices` (one per device, equally long) along every
/// dimension in turn: the first half of [`torus_all_reduce_slices`], with
/// `Mean`'s division after the last dimension. Afterwards device `d` holds
/// the reduction over every device of `torus_shard_ranges(shape, len)[d]`.
pub(crate) fn torus_reduce_scatter_slices<T: Element>(
    mut slices: Vec<&mut [T]>,
    shape: &TorusShape,
    op: ReduceOp,
) -> Traffic {
    let len = slices.first().map_or(0, |s| s.len());
    let device_count = shape.device_count();
    let ndims = shape.dims.len();
    let mut ranges: Vec<Range<usize>> = vec![0..len; device_count];
    for dim in 0..ndims {
        let lines = shape.lines(dim);
        let epilogue = Epilogue {
            divisor: (dim + 1 == ndims && op == ReduceOp::Mean).then_some(device_count),
            gather: false,
        };
        let mut slots: Vec<Option<&mut [T]>> = slices.iter_mut().map(|s| Some(&mut **s)).collect();
        reduce_scatter_rings(line_slices(&mut slots, &lines, &ranges), op, epilogue);
        shape.narrow(dim, &mut ranges);
    }
    torus_reduce_scatter_traffic(shape, len, T::BYTES)
}

/// All-gather over `slices` (one per device, equally long) that undoes
/// [`torus_reduce_scatter_slices`]: device `d` contributes
/// `torus_shard_ranges(shape, len)[d]`, the rings of the last dimension
/// gather first, then the others in reverse order; afterwards every device
/// holds every range. Validation is the caller's.
pub(crate) fn torus_all_gather_slices<T: Element>(mut slices: Vec<&mut [T]>, shape: &TorusShape) {
    let len = slices.first().map_or(0, |s| s.len());
    let ndims = shape.dims.len();
    for dim in (0..ndims).rev() {
        let ranges = narrowed_ranges(shape, len, dim);
        let lines = shape.lines(dim);
        let mut slots: Vec<Option<&mut [T]>> = slices.iter_mut().map(|s| Some(&mut **s)).collect();
        all_gather_rings(line_slices(&mut slots, &lines, &ranges));
    }
}

/// Each device's range of a `len`-element buffer once the first `dims`
/// dimensions are reduce-scattered.
pub(super) fn narrowed_ranges(shape: &TorusShape, len: usize, dims: usize) -> Vec<Range<usize>> {
    let mut ranges: Vec<Range<usize>> = vec![0..len; shape.device_count()];
    for dim in 0..dims {
        shape.narrow(dim, &mut ranges);
    }
    ranges
}

/// The traffic [`super::torus_reduce_scatter`] records for `len` elements,
/// without moving data: every axis in dimension order
/// ([`torus_reduce_scatter_traffic_over`]).
pub fn torus_reduce_scatter_traffic(shape: &TorusShape, len: usize, elem_bytes: usize) -> Traffic {
    let axes: Vec<usize> = (0..shape.dims.len()).collect();
    torus_reduce_scatter_traffic_over(shape, &axes, len, elem_bytes)
}

/// The traffic of a reduce-scatter of `len` elements per device over the
/// axes `axes` of `shape` (every group of devices that differ only along
/// them), without moving data: one order per round, the passes of a round
/// on different axes at once (module `schedule`). Afterwards a device owns
/// its range narrowed along `axes` in the order given. Axes outside the
/// shape, repeated or of extent 1 move nothing and are left out.
pub fn torus_reduce_scatter_traffic_over(
    shape: &TorusShape,
    axes: &[usize],
    len: usize,
    elem_bytes: usize,
) -> Traffic {
    let mut traffic = Traffic::default();
    record_schedule(
        &mut traffic,
        shape,
        &AxisPlan::new(shape, axes),
        len,
        elem_bytes,
        PhaseKind::ReduceScatter,
        0,
    );
    traffic
}

/// The traffic of the all-gather that undoes a torus reduce-scatter of
/// `len` elements: the reduce-scatter's rounds in reverse, each pass
/// moving the segment it reduced, with phase orders from `first_order`
/// (so a caller can place it after the reduce-scatter).
pub fn torus_all_gather_traffic(
    shape: &TorusShape,
    len: usize,
    elem_bytes: usize,
    first_order: u32,
) -> Traffic {
    let axes: Vec<usize> = (0..shape.dims.len()).collect();
    torus_all_gather_traffic_over(shape, &axes, len, elem_bytes, first_order)
}

/// [`torus_all_gather_traffic`] over the axes `axes` (as
/// [`torus_reduce_scatter_traffic_over`]).
pub fn torus_all_gather_traffic_over(
    shape: &TorusShape,
    axes: &[usize],
    len: usize,
    elem_bytes: usize,
    first_order: u32,
) -> Traffic {
    let mut traffic = Traffic::default();
    record_schedule(
        &mut traffic,
        shape,
        &AxisPlan::new(shape, axes),
        len,
        elem_bytes,
        PhaseKind::AllGather,
        first_order,
    );
    traffic
}
