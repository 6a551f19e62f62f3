//! Collectives over per-device buffers that move real data, with the traffic
//! they put on each link and an alpha-beta model of their duration.
//!
//! Operations (the NCCL set, in place):
//!
//! | function | result |
//! |---|---|
//! | [`all_reduce`] | every ring member holds the reduction of all members' buffers |
//! | [`reduce_scatter`] | ring position `i` holds the reduction of chunk `i` ([`chunk_range`]); other elements are unchanged |
//! | [`all_gather`] | every member holds chunk `i` of position `i`'s buffer, for every `i` |
//! | [`broadcast`] | every member holds the root's buffer |
//! | [`torus_all_reduce`] | [`all_reduce`] over every device of a 2D/3D torus, its traffic on every axis at once |
//! | [`multislice_all_reduce`] (and `_reduce_scatter`, `_all_gather`) | over every device of a multislice pod: ICI inside each slice, DCN across (module [`multislice`]) |
//! | [`all_to_all`] (and [`torus_all_to_all`], [`multislice_all_to_all`]) | member `i`'s chunk `j` becomes member `j`'s chunk `i` |
//! | [`ragged_all_to_all`] | member `i` sends `counts[i][j]` elements to member `j`; each output is its receipts in member order |
//!
//! Buffers are indexed by rank (device index); a ring is an ordered list of
//! distinct ranks. The returned traffic treats consecutive members (and the
//! last and the first) as neighbours; for a ring whose members are not all
//! adjacent on the pod's torus, [`Traffic::routed_on`] splits each hop into
//! the links of its dimension-order route ([`TorusShape::snake_ring`] gives
//! a ring over a whole torus whose only long hop is the closing one).
//! Ranks outside the ring are not touched. Every ring
//! member's buffer must have the same length; any length works, including 0
//! and lengths below the ring size (some chunks are then empty).
//!
//! Reduction semantics (wrapping integers, IEEE floats, `Mean` as sum then
//! one division) are described on [`ReduceOp`]; float results
//! agree with [`naive_reduce`] within rounding, integer results exactly, and
//! every rank of an all-reduce ends with bit-identical data.
//!
//! Each function returns the [`Traffic`] the ring schedule puts on the links
//! and [`Traffic::modeled_seconds`] turns it into a duration for a
//! [`LinkModel`]. The torus and multislice collectives' schedule uses every
//! link (module `torus`): rings of 3 or more chips run both ways, half of
//! the data each, and a collective over several axes splits its data into
//! one part per axis, each part running the axes in rotated order, so every
//! round ([`Phase::order`]) has a pass on every axis at once. [`cost`] is
//! that schedule's closed form ([`reduce_scatter_cost`],
//! [`all_gather_cost`], [`all_reduce_cost`], [`dcn_exchange_cost`]), and
//! [`torus_reduce_scatter_traffic_over`] / [`torus_all_gather_traffic_over`]
//! record it over a subset of the axes. A plain [`all_reduce`] over a list
//! of ranks stays a one-way ring (NCCL's).
//!
//! ## Ring conventions and execution
//!
//! A segment of `len` elements splits into `n` chunks ([`chunk_range`]; the
//! first `len % n` are one element longer). In a reduce-scatter, at step `s`
//! position `i` sends its partial of chunk `(i−1−s) mod n` to position
//! `i+1`, so chunk `c` starts at position `c+1` and completes at position
//! `c`; in an all-gather, position `i` forwards chunk `(i−s) mod n`.
//!
//! On the CPU, each chunk's journey around the ring depends on no other
//! chunk, so chunks (cut into [`PIECE_ELEMS`] pieces) run in parallel with
//! rayon once a collective moves at least [`PARALLEL_MIN_BYTES`]; within a
//! piece the ring's steps run back to back on a [`SLICE_ELEMS`] slice held
//! in a stack buffer, the message in flight (NCCL's `recvReduceSend`). Each
//! rank's buffer is read once and written once, nothing is allocated per
//! step, and the arithmetic and its order are those of the step-by-step
//! ring, whose schedule the traffic record follows.

mod all_to_all;
pub mod bench;
pub mod cost;
mod element;
pub mod multislice;
mod ring;
mod schedule;
mod streamed;
mod torus;
mod traffic;

#[cfg(test)]
mod tests;

mod error;
pub mod pod;
pub mod ranked;

pub use all_to_all::{
    all_to_all, multislice_all_to_all, multislice_all_to_all_traffic, ragged_all_to_all,
    ring_all_to_all_seconds, torus_all_to_all, torus_all_to_all_seconds, torus_all_to_all_traffic,
};
pub use cost::{
    CollectiveCost, PassCost, all_gather_cost, all_reduce_cost, dcn_exchange_cost,
    reduce_scatter_cost,
};
pub use element::{Element, ReduceOp, naive_reduce};
pub use error::CollectiveError;
pub use multislice::{
    DCN_AXIS, MultisliceShape, dcn_exchange_traffic, multislice_all_gather,
    multislice_all_gather_traffic, multislice_all_reduce, multislice_reduce_scatter,
    multislice_reduce_scatter_traffic, multislice_shard_ranges,
};
pub use ring::{
    BROADCAST_CHUNK_BYTES, PARALLEL_MIN_BYTES, PIECE_ELEMS, SLICE_ELEMS, broadcast_chunks,
    chunk_range,
};
pub use streamed::ReduceGrid;
pub use torus::{
    TorusShape, torus_all_gather_traffic, torus_all_gather_traffic_over, torus_all_reduce_traffic,
    torus_reduce_scatter_traffic, torus_reduce_scatter_traffic_over, torus_shard_ranges,
};
pub use traffic::{
    LinkModel, PassSummary, Phase, PhaseKind, TimedTransfer, Traffic, Transfer, pass_name,
};

use ring::{Epilogue, RingRoute};

/// Validates `ring` against `buffers` and returns the members' slices in
/// ring order.
fn ring_slices<'a, T, B>(
    buffers: &'a mut [B],
    ring: &[usize],
) -> Result<Vec<&'a mut [T]>, CollectiveError>
where
    B: AsMut<[T]>,
{
    if ring.is_empty() {
        return Err(CollectiveError::EmptyRing);
    }
    let count = buffers.len();
    let mut slots: Vec<Option<&'a mut [T]>> =
        buffers.iter_mut().map(|b| Some(b.as_mut())).collect();
    let mut slices = Vec::with_capacity(ring.len());
    for &rank in ring {
        let slot = slots.get_mut(rank).ok_or(CollectiveError::RankOutOfRange {
            rank,
            buffers: count,
        })?;
        let slice = slot.take().ok_or(CollectiveError::DuplicateRank { rank })?;
        slices.push(slice);
    }
    let expected = slices[0].len();
    if let Some((pos, s)) = slices.iter().enumerate().find(|(_, s)| s.len() != expected) {
        return Err(CollectiveError::LengthMismatch {
            rank: ring[pos],
            len: s.len(),
            first_rank: ring[0],
            expected,
        });
    }
    Ok(slices)
}

/// Ring all-reduce (reduce-scatter, then all-gather) of the ring members'
/// buffers with `op`. `2(n−1)` steps; each rank sends `2(n−1)/n` of its
/// buffer (rounded to whole chunks).
///
/// ```
/// use optirs_tpu::collectives::{all_reduce, ReduceOp};
/// let mut buffers = vec![vec![1.0f32, 2.0, 3.0], vec![10.0, 20.0, 30.0]];
/// let traffic = all_reduce(&mut buffers, &[0, 1], ReduceOp::Sum)?;
/// assert_eq!(buffers[0], [11.0, 22.0, 33.0]);
/// assert_eq!(buffers[0], buffers[1]);
/// assert_eq!(traffic.total_bytes(), 2 * 3 * 4); // 2(n−1)·len·4 bytes over all ranks
/// # Ok::<(), optirs_tpu::collectives::CollectiveError>(())
/// ```
pub fn all_reduce<T: Element, B: AsMut<[T]>>(
    buffers: &mut [B],
    ring: &[usize],
    op: ReduceOp,
) -> Result<Traffic, CollectiveError> {
    ring_reduce(buffers, ring, op, true)
}

/// Ring reduce-scatter: afterwards `buffers[ring[i]][chunk_range(len, n, i)]`
/// holds the reduction of that chunk over all members (divided by `n` for
/// `Mean`); every other element keeps its input value.
pub fn reduce_scatter<T: Element, B: AsMut<[T]>>(
    buffers: &mut [B],
    ring: &[usize],
    op: ReduceOp,
) -> Result<Traffic, CollectiveError> {
    ring_reduce(buffers, ring, op, false)
}

/// Ring reduce-scatter, then (`gather`) the all-gather that completes an
/// all-reduce, in one pass over the ring; the traffic of each phase.
fn ring_reduce<T: Element, B: AsMut<[T]>>(
    buffers: &mut [B],
    ring: &[usize],
    op: ReduceOp,
    gather: bool,
) -> Result<Traffic, CollectiveError> {
    let slices = ring_slices(buffers, ring)?;
    let n = slices.len();
    let len = slices[0].len();
    let epilogue = Epilogue {
        divisor: (op == ReduceOp::Mean).then_some(n),
        gather,
    };
    ring::reduce_scatter_rings(vec![slices], op, epilogue);
    let route = RingRoute::neighbours(ring);
    let mut traffic = Traffic::default();
    route.record_pass(&mut traffic, PhaseKind::ReduceScatter, 0, 0, len, T::BYTES);
    if gather {
        route.record_pass(&mut traffic, PhaseKind::AllGather, 1, 0, len, T::BYTES);
    }
    Ok(traffic)
}

/// Ring all-gather: position `i` contributes `chunk_range(len, n, i)` of its
/// buffer; afterwards every member holds all chunks. Elements outside a
/// member's own chunk are overwritten (the in-place form of
/// `ncclAllGather`).
pub fn all_gather<T: Element, B: AsMut<[T]>>(
    buffers: &mut [B],
    ring: &[usize],
) -> Result<Traffic, CollectiveError> {
    let slices = ring_slices(buffers, ring)?;
    let len = slices[0].len();
    ring::all_gather_rings(vec![slices]);
    Ok(ring_all_gather_traffic(ring, len, T::BYTES))
}

/// Broadcast of rank `root`'s buffer to every ring member, down the chain
/// `root, next, …` (the closing hop back to the root is unused), pipelined
/// in [`broadcast_chunks`] chunks of at most [`BROADCAST_CHUNK_BYTES`]:
/// `(n−1)+(k−1)` steps for `k` chunks.
pub fn broadcast<T: Element, B: AsMut<[T]>>(
    buffers: &mut [B],
    ring: &[usize],
    root: usize,
) -> Result<Traffic, CollectiveError> {
    let slices = ring_slices(buffers, ring)?;
    let len = slices[0].len();
    let root_pos = ring
        .iter()
        .position(|&r| r == root)
        .ok_or(CollectiveError::RootNotInRing { root })?;
    ring::broadcast_ring(slices, root_pos);
    let mut traffic = Traffic::default();
    RingRoute::neighbours(ring).record_broadcast(&mut traffic, root_pos, len, T::BYTES);
    Ok(traffic)
}

/// All-reduce over every device of a torus, with the values of the
/// standard torus algorithm: reduce-scatter along dimension 0's rings,
/// then along dimension 1 on the shard each device now owns, …, then
/// all-gather in reverse order. `buffers[i]` belongs to the device with
/// index `i = x + X·(y + Y·z)`.
///
/// The traffic is [`torus_all_reduce_traffic`]'s schedule: one part of the
/// buffer per axis, every axis busy in every round, rings run both ways.
/// Every message joins adjacent devices (`hops` = 1): a dimension without
/// wraparound (a mesh axis, a twisted torus's axis) runs each line two
/// ways, partials flowing from both ends to each chunk's owner;
/// `2(N−1)/N` of the buffer per device in all. The values are combined in
/// the ring's order on every dimension (module `torus`).
pub fn torus_all_reduce<T: Element, B: AsMut<[T]>>(
    buffers: &mut [B],
    shape: &TorusShape,
    op: ReduceOp,
) -> Result<Traffic, CollectiveError> {
    let slices = torus_slices(buffers, shape)?;
    Ok(torus::torus_all_reduce_slices(slices, shape, op))
}

/// Every device's buffer of a torus collective, by device index: one per
/// device, all of one length.
fn torus_slices<'a, T, B: AsMut<[T]>>(
    buffers: &'a mut [B],
    shape: &TorusShape,
) -> Result<Vec<&'a mut [T]>, CollectiveError> {
    let expected = shape.device_count();
    if buffers.len() != expected {
        return Err(CollectiveError::BufferCount {
            expected,
            got: buffers.len(),
        });
    }
    let all: Vec<usize> = (0..expected).collect();
    ring_slices(buffers, &all)
}

/// Reduce-scatter over every device of a torus, dimension by dimension
/// (the first half of [`torus_all_reduce`], with `Mean`'s division after
/// the last dimension): afterwards `buffers[d][torus_shard_ranges(shape,
/// len)[d]]` holds the reduction over every device of that range, in the
/// same order [`torus_all_reduce`] reduces it (its values equal the
/// all-reduce's there, bit for bit); other elements hold partial sums.
pub fn torus_reduce_scatter<T: Element, B: AsMut<[T]>>(
    buffers: &mut [B],
    shape: &TorusShape,
    op: ReduceOp,
) -> Result<Traffic, CollectiveError> {
    let slices = torus_slices(buffers, shape)?;
    Ok(torus::torus_reduce_scatter_slices(slices, shape, op))
}

/// The traffic of a ring reduce-scatter of a `len`-element buffer over
/// `ring` (what [`reduce_scatter`] records), without moving data.
pub fn ring_reduce_scatter_traffic(ring: &[usize], len: usize, elem_bytes: usize) -> Traffic {
    ring_pass_traffic(ring, PhaseKind::ReduceScatter, len, elem_bytes)
}

/// The traffic of a ring all-gather of a `len`-element buffer over `ring`
/// (what [`all_gather`] records), without moving data: for callers whose
/// members share one copy of the gathered values.
pub fn ring_all_gather_traffic(ring: &[usize], len: usize, elem_bytes: usize) -> Traffic {
    ring_pass_traffic(ring, PhaseKind::AllGather, len, elem_bytes)
}

/// One pass of `kind` over `ring` (pass 0, dimension 0).
fn ring_pass_traffic(ring: &[usize], kind: PhaseKind, len: usize, elem_bytes: usize) -> Traffic {
    let mut traffic = Traffic::default();
    RingRoute::neighbours(ring).record_pass(&mut traffic, kind, 0, 0, len, elem_bytes);
    traffic
}
