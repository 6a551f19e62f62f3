//! A split grid's reduce-scatter when every member's buffer lies in a
//! segment all ranks share ([`SharedSegment`]): each owner folds the other
//! members' chunks by reading them where they are, on its rank or
//! another's, with no send, receive or copy. The order is the one every
//! path here keeps ([`ReduceGrid::reduce_for`]'s): along each dimension
//! from the position after the owner round to itself, the partial always
//! the left operand, so the bits are one process's.
//!
//! The ranks meet at a fence ([`RankContext::fence`]) before each pass
//! across them: every rank's writes of the pass before (or of the
//! caller's fill) are then visible to all. Within a pass an owner writes
//! only the chunk it owns, which no other rank reads in that pass, and
//! reads only chunks their members do not write in it. The last pass
//! writes each owner's result straight into the caller's buffer (`out`),
//! not the segment. Nothing fences after it: a caller alternates two
//! halves of its part between calls ([`SharedSegment::alternate`]), so the
//! half a call fills was last read before every rank passed the previous
//! call's first fence.
//!
//! [`SharedGrid::all_reduce_in_place`] is the whole all-reduce for members
//! that live in the segment: the same folds, each into the owner's own
//! chunk, then the all-gather's copies from each owner straight into the
//! other members, and a fence at the end instead of alternating halves.
//!
//! [`ReduceGrid::reduce_for`]: crate::collectives::ReduceGrid::reduce_for

use std::ops::Range;

use super::reduce::fold_into;
use super::{chunk_within, lines, narrow, prefix_ranges};
use crate::collectives::element::{Element, ReduceOp, combine_in_order};
use crate::collectives::streamed::ReduceGrid;
use crate::transport::ClusterError;
use crate::transport::cluster::{RankContext, SharedSegment};

/// Where each member's buffer can sit in its rank's part when every
/// member has one: its index among its rank's members (by grid position),
/// and the most members any rank holds — the regions a part needs.
pub fn member_regions(rank_of: &[u32], ranks: u32) -> (Vec<usize>, usize) {
    let mut held = vec![0usize; ranks as usize];
    let slots = rank_of
        .iter()
        .map(|&r| {
            held[r as usize] += 1;
            held[r as usize] - 1
        })
        .collect();
    (slots, held.into_iter().max().unwrap_or(0))
}

/// A split grid's members in shared memory.
pub struct SharedGrid<'a, T> {
    /// The grid (a torus's extents, or a ring).
    pub grid: &'a ReduceGrid,
    /// The rank holding each grid position.
    pub rank_of: &'a [u32],
    /// Where element 0 of each member's buffer is, in this process, by
    /// grid position: a member's elements `i` are at `base[p] + i` over
    /// the range the call works on there (members of one block may share
    /// a base, their ranges disjoint).
    pub base: &'a [*mut T],
    /// Elements in every member's buffer.
    pub len: usize,
}

impl<T: Element> SharedGrid<'_, T> {
    /// [`RankedGrid::reduce_scatter_from`] over shared memory: the passes
    /// along dimensions `0..first_dim` are done (each member's
    /// `prefix_ranges(dims, len, first_dim)[p]` holds its partial, written
    /// by its rank before the call); afterwards each of this rank's
    /// members' `out[p]` holds the reduction over its owned range
    /// (`grid_shard_ranges(dims, len)[p]`), which is returned by position.
    ///
    /// # Safety
    /// For every member `p`, `base[p]` plus its prefix range must be
    /// memory of `segment` that stays allocated through the call, that no
    /// two members' ranges share, and that nothing but this call on every
    /// rank (all of them call it alike) reads or writes until it returns.
    ///
    /// [`RankedGrid::reduce_scatter_from`]: super::RankedGrid::reduce_scatter_from
    pub unsafe fn reduce_scatter_from(
        &self,
        ctx: &RankContext,
        segment: &mut SharedSegment,
        op: ReduceOp,
        first_dim: usize,
        out: &mut [Option<&mut [T]>],
    ) -> Result<Vec<Range<usize>>, ClusterError> {
        let dims = self.grid.dims().to_vec();
        let me = ctx.layout.rank();
        self.check(me, out)?;
        let mut ranges = prefix_ranges(&dims, self.len, first_dim);
        let passes: Vec<usize> = (first_dim.min(dims.len())..dims.len())
            .filter(|&d| dims[d] > 1)
            .collect();
        let mut scratch = Vec::new();
        // The caller's fill visible to every rank (and, with no pass, the
        // previous call's reads over before the next fills).
        ctx.fence(segment, "arrival at the shared reduce-scatter's fence")?;
        for dim in first_dim.min(dims.len())..dims.len() {
            if let Some(&last) = passes.last()
                && dims[dim] > 1
            {
                if dim != passes[0] {
                    ctx.fence(segment, "arrival at the shared reduce-scatter's fence")?;
                }
                let into = (dim == last).then_some(&mut *out);
                // SAFETY: the caller's contract, and the pass's (module docs).
                unsafe { self.pass(dim, &ranges, me, op, into, &mut scratch) };
            }
            narrow(&dims, dim, &mut ranges);
        }
        for (pos, slot) in out.iter_mut().enumerate() {
            let Some(out) = slot else { continue };
            if passes.is_empty() {
                // SAFETY: the member's own range, as the contract gives it.
                out.copy_from_slice(unsafe { self.read(pos, &ranges[pos]) });
            }
            if op == ReduceOp::Mean {
                for v in out.iter_mut() {
                    *v = v.div_count(self.grid.len());
                }
            }
        }
        Ok(ranges)
    }

    /// All-reduce with every member's whole buffer in the segment, in
    /// place: the reduce-scatter's passes fold each owner's chunk where it
    /// lies (as [`SharedGrid::reduce_scatter_from`] does, bit for bit
    /// [`ReduceGrid::reduce_for`]'s), then the all-gather's passes, in
    /// reverse, copy each line's owned chunks into its other members. A
    /// fence before every pass, and one at the end, so the caller may
    /// write its members again as soon as this returns. Afterwards every
    /// member's `0..len` holds the reduction of every member's values.
    ///
    /// Each crossing byte is read once where it lies and written once
    /// where it is due: no send, no receive, no staging copy.
    ///
    /// # Safety
    /// For every member `p`, `base[p]..base[p] + len` must be memory of
    /// `segment` that stays allocated through the call, that no two
    /// members share, and that nothing but this call on every rank (all of
    /// them call it alike) reads or writes until it returns.
    pub unsafe fn all_reduce_in_place(
        &self,
        ctx: &RankContext,
        segment: &mut SharedSegment,
        op: ReduceOp,
    ) -> Result<(), ClusterError> {
        const AWAITING: &str = "arrival at the shared all-reduce's fence";
        let dims = self.grid.dims().to_vec();
        let me = ctx.layout.rank();
        let n = self.grid.len();
        self.check_members(me)?;
        let mut ranges = vec![0..self.len; n];
        // Each dimension's ranges before its pass narrowed them: the
        // all-gather's pass along it fills them back.
        let mut wider = Vec::with_capacity(dims.len());
        let mut scratch = Vec::new();
        for (dim, &extent) in dims.iter().enumerate() {
            wider.push(ranges.clone());
            if extent > 1 {
                ctx.fence(segment, AWAITING)?;
                // SAFETY: the caller's contract, and the pass's (module docs).
                unsafe { self.pass(dim, &ranges, me, op, None, &mut scratch) };
            }
            narrow(&dims, dim, &mut ranges);
        }
        if op == ReduceOp::Mean {
            for pos in (0..n).filter(|&p| self.rank_of[p] == me) {
                // SAFETY: the member's owned range, which only its rank
                // writes, and no rank reads before the next fence.
                let owned = unsafe { self.write(pos, &ranges[pos]) };
                for v in owned {
                    *v = v.div_count(n);
                }
            }
        }
        for dim in (0..dims.len()).rev() {
            if dims[dim] > 1 {
                ctx.fence(segment, AWAITING)?;
                // SAFETY: as above, the ranks fenced since the last pass.
                unsafe { self.gather_pass(dim, &wider[dim], me) };
            }
        }
        ctx.fence(segment, AWAITING)
    }

    /// The all-gather's pass along `dim`: each of this rank's members
    /// copies, over its `ranges` entry, every other line member's own
    /// chunk from that member into itself. A member writes only the chunks
    /// it does not own, and each is read only from the member that owns
    /// it, which does not write it in this pass.
    ///
    /// # Safety
    /// As [`SharedGrid::all_reduce_in_place`]'s, the ranks fenced since
    /// the last pass.
    unsafe fn gather_pass(&self, dim: usize, ranges: &[Range<usize>], me: u32) {
        let n = self.grid.dims()[dim];
        for line in lines(self.grid.dims(), dim) {
            let range = &ranges[line[0]];
            for (own, &member) in line.iter().enumerate() {
                if self.rank_of[member] != me {
                    continue;
                }
                for (c, &owner) in line.iter().enumerate().filter(|&(c, _)| c != own) {
                    let chunk = chunk_within(range, n, c);
                    // SAFETY: the owner's own chunk, which no rank writes in
                    // this pass, into the member's copy of it, which only
                    // this rank writes and no rank reads in this pass.
                    unsafe { self.write(member, &chunk) }
                        .copy_from_slice(unsafe { self.read(owner, &chunk) });
                }
            }
        }
    }

    /// Member `pos`'s elements over `range`, to write in place.
    ///
    /// # Safety
    /// As [`SharedGrid::read`]'s, and no other slice of them lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn write(&self, pos: usize, range: &Range<usize>) -> &mut [T] {
        unsafe { std::slice::from_raw_parts_mut(self.base[pos].add(range.start), range.len()) }
    }

    /// Refuses members whose ranks or bases do not fit the grid.
    fn check_members(&self, me: u32) -> Result<(), ClusterError> {
        let n = self.grid.len();
        if self.rank_of.len() == n && self.base.len() == n {
            return Ok(());
        }
        Err(ClusterError::Protocol {
            rank: me,
            what: format!(
                "a shared collective over {n} members given {} ranks and {} bases",
                self.rank_of.len(),
                self.base.len()
            ),
        })
    }

    /// Refuses a call whose members or outputs do not fit the grid.
    fn check(&self, me: u32, out: &[Option<&mut [T]>]) -> Result<(), ClusterError> {
        self.check_members(me)?;
        let n = self.grid.len();
        let owned = super::grid_shard_ranges(self.grid.dims(), self.len);
        let wrong = (out.len() != n)
            .then(|| {
                format!(
                    "a shared collective over {n} members given {} outputs",
                    out.len()
                )
            })
            .or_else(|| {
                (0..n).find_map(|p| {
                    let expected = (self.rank_of[p] == me).then(|| owned[p].len());
                    let given = out[p].as_ref().map(|o| o.len());
                    (expected != given).then(|| {
                        format!(
                            "member {p}'s output holds {given:?} elements where {expected:?} \
                             were due"
                        )
                    })
                })
            });
        match wrong {
            Some(what) => Err(ClusterError::Protocol { rank: me, what }),
            None => Ok(()),
        }
    }

    /// Member `pos`'s elements over `range`, read in place.
    ///
    /// # Safety
    /// As [`SharedGrid::reduce_scatter_from`]'s, and no rank writes them
    /// while the slice lives.
    unsafe fn read(&self, pos: usize, range: &Range<usize>) -> &[T] {
        unsafe { std::slice::from_raw_parts(self.base[pos].add(range.start), range.len()) }
    }

    /// The pass along `dim`: every chunk this rank owns folded from the
    /// line's members in place, into the owner's chunk, or into `out` on
    /// the last pass.
    ///
    /// # Safety
    /// As [`SharedGrid::reduce_scatter_from`]'s, the ranks fenced since
    /// the last pass.
    unsafe fn pass(
        &self,
        dim: usize,
        ranges: &[Range<usize>],
        me: u32,
        op: ReduceOp,
        mut out: Option<&mut [Option<&mut [T]>]>,
        scratch: &mut Vec<T>,
    ) {
        let n = self.grid.dims()[dim];
        for line in lines(self.grid.dims(), dim) {
            // Every member of a line has the same range in this pass.
            let range = &ranges[line[0]];
            for (c, &owner) in line.iter().enumerate() {
                if self.rank_of[owner] != me {
                    continue;
                }
                let chunk = chunk_within(range, n, c);
                // SAFETY: chunk `c` of the line's other members, which only
                // this owner reads in this pass and no one writes.
                let sources: Vec<&[T]> = (1..n)
                    .map(|j| unsafe { self.read(line[(c + j) % n], &chunk) })
                    .collect();
                match out.as_mut().and_then(|o| o[owner].as_deref_mut()) {
                    Some(target) => {
                        // SAFETY: the owner's own chunk, which no other rank
                        // reads or writes in this pass.
                        let own = unsafe { self.read(owner, &chunk) };
                        let mut rest = sources[1..].to_vec();
                        rest.push(own);
                        combine_in_order(op, target, sources[0], &rest);
                    }
                    None => {
                        // SAFETY: as above; the owner's chunk is written by
                        // this rank alone, and no slice of it is live.
                        let target = unsafe { self.write(owner, &chunk) };
                        fold_into(op, target, &sources, scratch);
                    }
                }
            }
        }
    }
}
