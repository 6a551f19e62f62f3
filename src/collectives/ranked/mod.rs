//! Reduce-scatter and all-gather whose members live on several ranks (the
//! processes of a pod split with `pod::ranks`), bit for bit the in-process
//! collectives: along the grid's dimension 0 first (the rings of a torus,
//! or the one ring), then dimension 1 on the range each member now owns,
//! and so on; the all-gather in reverse.
//!
//! The order of the arithmetic is the ring's, the schedule is not. In a
//! ring, chunk `c` of a line of `n` is folded left to right from position
//! `c+1` round to `c`, each partial combined as `op(partial, own)`. Here
//! each chunk goes straight to its owner instead of round the ring: the
//! owner folds the line's `n` values of it in that same order
//! ([`ReduceGrid::reduce_for`]'s, so the bits are one process's; `tests`
//! checks it on split grids), reading the members on its own rank in
//! place and the others' from where they landed. Each byte that crosses
//! ranks moves once, in one step per dimension, through
//! [`RankContext::exchange`] (nonblocking `MPI_Isend`/`MPI_Irecv` from and
//! into the members' buffers under the `mpi` feature), in pieces of at
//! most [`PIECE_BYTES`], each folded the moment it lands, while it is in
//! cache and the next ones are in flight. The all-gather sends each owned
//! chunk once to every other rank on its line, into one member's buffer
//! there; the rank's other members copy it from that one.
//!
//! Leading dimensions whose lines all stay on one rank move nothing
//! between ranks: the block of members they span on a rank is folded in
//! one sweep (`block`: each member read once, each owner's range written
//! once, in the block's order), and the all-gather's copies within the
//! block are made once at the end. A later dimension whose lines happen
//! to stay on one rank is the same fold, in memory. `Mean` divides once
//! after the last dimension.
//!
//! A caller may hand each member's buffer as a window of it
//! ([`RankedGrid::window`]): the sharded step's all-gather lands straight
//! in the parameters, each of a block's members writing its own part.
//!
//! Ranks on one node may instead keep their members in a segment every
//! rank shares ([`SharedGrid`]): an owner then reads the other members'
//! chunks where they lie, with no message at all, and
//! [`SharedGrid::all_reduce_in_place`] is the whole all-reduce that way.

use std::ops::Range;

use super::element::{Element, ReduceOp};
use super::ring::chunk_range;
use super::streamed::ReduceGrid;
use crate::transport::ClusterError;
use crate::transport::cluster::RankContext;
pub use shared::{SharedGrid, member_regions};

mod block;
mod gather;
mod reduce;
mod shared;
#[cfg(test)]
mod shared_tests;
#[cfg(test)]
mod tests;

/// The most bytes one message of a collective carries. A chunk travels as
/// pieces of this size, so its owner folds each piece as it lands while
/// the next are in flight (NCCL's chunked pipelining), rather than after
/// all of it arrived. Not smaller: over OpenMPI's shared memory each
/// message of this size is one rendezvous and one single copy (CMA), and
/// smaller pieces cost more in handshakes than they save (2 ranks on this
/// machine, 4 MiB per rank, receive-and-fold then send-back in C: 0.50 ms
/// median with 1–2 MiB pieces, 1.55 ms with 256 KiB, 1.9 ms with 64 KiB).
#[cfg(not(test))]
pub const PIECE_BYTES: usize = 1 << 20;
/// Unit tests cut chunks into pieces of a few elements, so their small
/// buffers travel in many pieces too.
#[cfg(test)]
pub const PIECE_BYTES: usize = 12;

/// The range of a `len`-element buffer each grid position owns after a
/// reduce-scatter over `dims` (by grid position `x + X·(y + Y·z)`).
pub fn grid_shard_ranges(dims: &[usize], len: usize) -> Vec<Range<usize>> {
    let mut ranges = vec![0..len; dims.iter().product()];
    for dim in 0..dims.len() {
        narrow(dims, dim, &mut ranges);
    }
    ranges
}

/// How many leading dimensions of `dims` have every line on one rank
/// (`rank_of` by grid position): their passes move nothing between ranks,
/// so a caller can fold them locally (a streamed [`ReduceGrid`] over the
/// block) and run the ranked schedule from there
/// ([`RankedGrid::reduce_scatter_from`]).
pub fn local_prefix(dims: &[usize], rank_of: &[u32]) -> usize {
    (0..dims.len())
        .find(|&dim| {
            lines(dims, dim)
                .iter()
                .any(|line| line.iter().any(|&p| rank_of[p] != rank_of[line[0]]))
        })
        .unwrap_or(dims.len())
}

/// Each position's range after the passes of dimensions `0..first_dim`.
pub fn prefix_ranges(dims: &[usize], len: usize, first_dim: usize) -> Vec<Range<usize>> {
    let mut ranges = vec![0..len; dims.iter().product()];
    for dim in 0..first_dim.min(dims.len()) {
        narrow(dims, dim, &mut ranges);
    }
    ranges
}

/// After a pass along `dim`, each position keeps its coordinate's chunk.
fn narrow(dims: &[usize], dim: usize, ranges: &mut [Range<usize>]) {
    let n = dims[dim];
    let stride: usize = dims[..dim].iter().product();
    for (pos, range) in ranges.iter_mut().enumerate() {
        *range = chunk_within(range, n, (pos / stride) % n);
    }
}

/// Chunk `c` of `range` cut into a line's `n` chunks, as elements of the
/// whole buffer.
fn chunk_within(range: &Range<usize>, n: usize, c: usize) -> Range<usize> {
    let sub = chunk_range(range.len(), n, c);
    range.start + sub.start..range.start + sub.end
}

/// The lines along `dim`: grid positions in coordinate order.
fn lines(dims: &[usize], dim: usize) -> Vec<Vec<usize>> {
    let n = dims[dim];
    let stride: usize = dims[..dim].iter().product();
    let count: usize = dims.iter().product();
    (0..count)
        .filter(|&i| (i / stride).is_multiple_of(n))
        .map(|base| (0..n).map(|k| base + k * stride).collect())
        .collect()
}

/// The members of a collective over ranks: the grid, each position's
/// rank, and this rank's buffers by position (`None` where another rank
/// holds the member). Every member's buffer has one length; a caller may
/// pass each as a window of it ([`RankedGrid::window`]).
pub struct RankedGrid<'a, 'b, T> {
    /// The grid (a torus's extents, or a ring).
    pub grid: &'a ReduceGrid,
    /// The rank holding each grid position.
    pub rank_of: &'a [u32],
    /// This rank's members' buffers, indexed by grid position.
    pub local: &'a mut [Option<&'b mut [T]>],
    /// Tells this collective's frames from any other's: the same on every
    /// rank for the same call (say, step and bucket), different between
    /// calls.
    pub tag: u64,
    /// `None`: every local buffer is its member's whole buffer. Otherwise
    /// `(len, first)`: every member's buffer has `len` elements and the
    /// local buffer at grid position `p` holds elements `first[p]..` of
    /// it, which must take in every element the call touches there (for
    /// the `_from` forms, `prefix_ranges(dims, len, first_dim)[p]`). The
    /// windows of different members may then be disjoint parts of one
    /// caller's array, written in place.
    pub window: Option<(usize, &'a [usize])>,
}

impl<T: Element> RankedGrid<'_, '_, T> {
    /// The members' buffer length and where each local buffer starts in
    /// its member's buffer.
    fn check(&self, ctx: &RankContext) -> Result<(usize, Vec<usize>), ClusterError> {
        let n = self.grid.len();
        let me = ctx.layout.rank();
        let protocol = |what: String| ClusterError::Protocol { rank: me, what };
        if self.rank_of.len() != n || self.local.len() != n {
            return Err(protocol(format!(
                "a collective over {n} members given {} ranks and {} buffer slots",
                self.rank_of.len(),
                self.local.len()
            )));
        }
        let mut len = None;
        for (pos, slot) in self.local.iter().enumerate() {
            let held = slot.is_some();
            if held != (self.rank_of[pos] == me) {
                return Err(protocol(format!(
                    "member {pos} is on rank {}, but this rank {} its buffer",
                    self.rank_of[pos],
                    if held { "holds" } else { "lacks" }
                )));
            }
            if let (Some(buf), None) = (slot, self.window) {
                if len.is_some_and(|l| l != buf.len()) {
                    return Err(protocol(format!(
                        "members' buffers differ in length: {} elements at position {pos}, {} \
                         before it",
                        buf.len(),
                        len.unwrap_or(0)
                    )));
                }
                len = Some(buf.len());
            }
        }
        match self.window {
            None => Ok((len.unwrap_or(0), vec![0; n])),
            Some((len, first)) => {
                if first.len() != n {
                    return Err(protocol(format!(
                        "a collective over {n} members given {} window starts",
                        first.len()
                    )));
                }
                Ok((len, first.to_vec()))
            }
        }
    }

    /// Refuses a local buffer that does not hold all of its `ranges` entry.
    fn covers(
        &self,
        ctx: &RankContext,
        ranges: &[Range<usize>],
        first: &[usize],
    ) -> Result<(), ClusterError> {
        for (pos, slot) in self.local.iter().enumerate() {
            let Some(buf) = slot else { continue };
            let (start, range) = (first[pos], &ranges[pos]);
            if range.start < start || range.end > start + buf.len() {
                return Err(ClusterError::Protocol {
                    rank: ctx.layout.rank(),
                    what: format!(
                        "member {pos}'s buffer holds elements {start}..{} but the collective \
                         works on {range:?}",
                        start + buf.len()
                    ),
                });
            }
        }
        Ok(())
    }

    /// Reduce-scatter with `op` (module docs). Afterwards the buffer of the
    /// member at grid position `p` holds, over
    /// `grid_shard_ranges(dims, len)[p]`, the reduction of every member's
    /// values there, bit for bit [`ReduceGrid::reduce_for`]'s; what the
    /// rest of each buffer holds is unspecified. Returns the owned ranges.
    pub fn reduce_scatter(
        &mut self,
        ctx: &RankContext,
        op: ReduceOp,
    ) -> Result<Vec<Range<usize>>, ClusterError> {
        self.reduce_scatter_from(ctx, op, 0)
    }

    /// [`RankedGrid::reduce_scatter`] whose passes along dimensions
    /// `0..first_dim` the caller has done already: each member's
    /// `prefix_ranges(dims, len, first_dim)[p]` holds its partial (summed,
    /// not yet divided for `Mean`), as those passes leave it.
    pub fn reduce_scatter_from(
        &mut self,
        ctx: &RankContext,
        op: ReduceOp,
        first_dim: usize,
    ) -> Result<Vec<Range<usize>>, ClusterError> {
        let (len, first) = self.check(ctx)?;
        let dims = self.grid.dims().to_vec();
        let mut ranges = prefix_ranges(&dims, len, first_dim);
        self.covers(ctx, &ranges, &first)?;
        let mut dim = first_dim.min(dims.len());
        // Leading dimensions whose lines all stay on this rank's blocks:
        // one fold of each block, every member read once and every owner
        // written once, in place of a pass per dimension.
        let block = local_prefix(&dims, self.rank_of);
        if dim == 0 && block >= 2 {
            self.fold_blocks(block, op, &first, len);
            ranges = prefix_ranges(&dims, len, block);
            dim = block;
        }
        for dim in dim..dims.len() {
            if dims[dim] > 1 {
                let tag = frame_tag(self.tag, dim as u64);
                self.reduce_pass(ctx, dim, &ranges, &first, op, tag)?;
            }
            narrow(&dims, dim, &mut ranges);
        }
        if op == ReduceOp::Mean {
            let count = self.grid.len();
            for (pos, slot) in self.local.iter_mut().enumerate() {
                if let Some(buf) = slot {
                    let range = &ranges[pos];
                    for v in &mut buf[range.start - first[pos]..range.end - first[pos]] {
                        *v = v.div_count(count);
                    }
                }
            }
        }
        Ok(ranges)
    }

    /// All-gather (module docs): each member's
    /// `grid_shard_ranges(dims, len)[p]` goes to every member, so every
    /// buffer ends with every owner's range.
    pub fn all_gather(&mut self, ctx: &RankContext) -> Result<(), ClusterError> {
        self.all_gather_from(ctx, 0)
    }

    /// [`RankedGrid::all_gather`] without the passes along dimensions
    /// `0..first_dim` (the last ones it would run): afterwards each member
    /// holds `prefix_ranges(dims, len, first_dim)[p]`, which a caller whose
    /// blocks along those dimensions are on one rank can assemble itself.
    pub fn all_gather_from(
        &mut self,
        ctx: &RankContext,
        first_dim: usize,
    ) -> Result<(), ClusterError> {
        let (len, first) = self.check(ctx)?;
        let dims = self.grid.dims().to_vec();
        // The ranges before each dimension's reduce-scatter narrowed them.
        let mut wider = Vec::with_capacity(dims.len() + 1);
        let mut ranges = vec![0..len; self.grid.len()];
        for dim in 0..dims.len() {
            wider.push(ranges.clone());
            narrow(&dims, dim, &mut ranges);
        }
        wider.push(ranges);
        let first_dim = first_dim.min(dims.len());
        self.covers(ctx, &wider[first_dim], &first)?;
        // Leading dimensions within this rank's blocks: each member copies
        // its block's other ranges once, after the passes across ranks.
        let block = local_prefix(&dims, self.rank_of);
        let last = if first_dim == 0 && block >= 2 {
            block
        } else {
            first_dim
        };
        for dim in (last..dims.len()).rev() {
            if dims[dim] > 1 {
                let tag = frame_tag(self.tag, (1 << 15) + dim as u64);
                self.gather_pass(ctx, dim, &wider[dim], &first, tag)?;
            }
        }
        if last > first_dim {
            self.copy_blocks(block, &first, len);
        }
        Ok(())
    }
}

/// The tag of one pass's data.
fn frame_tag(tag: u64, round: u64) -> u64 {
    tag.wrapping_mul(1 << 16).wrapping_add(round)
}

/// Each local member's `range` split into a line's `n` chunks, by grid
/// position (empty for members on other ranks): every chunk a disjoint
/// borrow, so one pass can send some, fold into others and read the rest.
fn chunks_of<'s, T>(
    local: &'s mut [Option<&mut [T]>],
    ranges: &[Range<usize>],
    first: &[usize],
    n: usize,
) -> Vec<Vec<Option<&'s mut [T]>>> {
    local
        .iter_mut()
        .zip(ranges)
        .zip(first)
        .map(|((slot, range), &first)| match slot {
            Some(buf) => {
                let mut rest: &'s mut [T] = &mut buf[range.start - first..range.end - first];
                (0..n)
                    .map(|c| {
                        let size = chunk_range(range.len(), n, c).len();
                        let (chunk, tail) = std::mem::take(&mut rest).split_at_mut(size);
                        rest = tail;
                        Some(chunk)
                    })
                    .collect()
            }
            None => Vec::new(),
        })
        .collect()
}

/// The pieces a chunk of `len` elements of `T` travels in (none if empty).
fn pieces<T>(len: usize) -> impl Iterator<Item = Range<usize>> {
    let bytes = len * std::mem::size_of::<T>();
    let count = bytes.div_ceil(PIECE_BYTES);
    (0..count).map(move |p| chunk_range(len, count, p))
}

/// A chunk this rank holds, taken for one use (each is used once a pass).
fn take<'s, T>(chunks: &mut [Vec<Option<&'s mut [T]>>], pos: usize, c: usize) -> &'s mut [T] {
    chunks[pos][c]
        .take()
        .expect("each chunk is taken once per pass")
}

/// A chunk that is only read from now on.
fn shared<T>(chunk: &mut [T]) -> &[T] {
    chunk
}
