//! Reduce-scatter without the per-rank buffers: one owner's reduced chunk
//! computed piece by piece from a source that produces any rank's values
//! on demand, in exactly the order the ring and torus reduce-scatters
//! combine them (so the bits are theirs; `tests` compares the two).
//!
//! A data-parallel step over `N` replicas would otherwise hold `N` copies
//! of every gradient bucket at once. Here each owner folds its ranks'
//! values into a few [`PIECE_ELEMS`]-element scratch buffers: memory stays
//! at one reduced copy, and the source (a host's gradients, or a seeded
//! generator) is asked for each value once.
//!
//! The order: members are laid out on a grid `dims` (a torus's extents, or
//! `[n]` for a ring), member `x + X·(y + Y·z)` at coordinates `(x, y, z)`.
//! The owner at `(a, b, c)` folds along dimension 0 first, starting after
//! itself: for every `(y, z)`, `v(y, z) = g(a+1, y, z) + g(a+2, y, z) + … +
//! g(a, y, z)` (indices mod X, left to right), then along dimension 1 the
//! same way from `b+1`, then dimension 2 from `c+1`; `Mean` divides the
//! final sum once by the member count. That is [`super::torus_reduce_scatter`]'s
//! order for the owner's range and, for one dimension,
//! [`super::reduce_scatter`]'s for ring position `a`.

use super::element::{Element, ReduceOp, accumulate};
use super::ring::PIECE_ELEMS;

/// The members of a streamed reduce-scatter and the grid they reduce on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReduceGrid {
    dims: Vec<usize>,
    members: Vec<usize>,
}

impl ReduceGrid {
    /// A torus of extents `dims` whose member at linear index `i` is rank `i`.
    pub fn torus(dims: &[usize]) -> ReduceGrid {
        let n: usize = dims.iter().product();
        ReduceGrid {
            dims: dims.to_vec(),
            members: (0..n).collect(),
        }
    }

    /// A ring: position `i` is rank `ring[i]`.
    pub fn ring(ring: &[usize]) -> ReduceGrid {
        ReduceGrid {
            dims: vec![ring.len()],
            members: ring.to_vec(),
        }
    }

    /// Extents of the grid's dimensions (`[n]` for a ring).
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Members (ranks) in grid order.
    pub fn members(&self) -> &[usize] {
        &self.members
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the grid has no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    fn coords(&self, mut index: usize) -> Vec<usize> {
        self.dims
            .iter()
            .map(|&d| {
                let c = index % d;
                index /= d;
                c
            })
            .collect()
    }

    fn linear(&self, coords: &[usize]) -> usize {
        coords
            .iter()
            .zip(&self.dims)
            .rev()
            .fold(0, |acc, (&c, &d)| acc * d + c)
    }

    /// Fills `out` with the reduction, over every member, of the values
    /// `fill(rank, offset, buf)` produces (`buf` receives the rank's values
    /// for elements `offset..offset + buf.len()` of `out`), in the order of
    /// the module docs for the member at grid position `owner`.
    pub fn reduce_for<T: Element>(
        &self,
        owner: usize,
        op: ReduceOp,
        out: &mut [T],
        fill: &mut dyn FnMut(usize, usize, &mut [T]),
    ) {
        let owner_coords = self.coords(owner);
        let levels = self.dims.len();
        let piece = PIECE_ELEMS.min(out.len()).max(1);
        // One temporary per level below the top: member j > 1 of a fold is
        // computed there and added; member 1 is computed in place.
        let mut scratch: Vec<Vec<T>> = (0..levels).map(|_| vec![T::ZERO; piece]).collect();
        let mut coords = owner_coords.clone();
        let mut start = 0;
        while start < out.len() {
            let len = piece.min(out.len() - start);
            let dst = &mut out[start..start + len];
            self.level(
                levels,
                &owner_coords,
                &mut coords,
                op,
                start,
                dst,
                &mut scratch,
                fill,
            );
            if op == ReduceOp::Mean {
                for v in dst.iter_mut() {
                    *v = v.div_count(self.members.len());
                }
            }
            start += len;
        }
    }

    /// Computes level `level` (dimensions `0..level` folded) for the
    /// coordinates in `coords[level..]` into `dst`, with `scratch[..level]`
    /// for the levels below.
    #[allow(clippy::too_many_arguments)]
    fn level<T: Element>(
        &self,
        level: usize,
        owner: &[usize],
        coords: &mut [usize],
        op: ReduceOp,
        start: usize,
        dst: &mut [T],
        scratch: &mut [Vec<T>],
        fill: &mut dyn FnMut(usize, usize, &mut [T]),
    ) {
        if level == 0 {
            let rank = self.members[self.linear(coords)];
            fill(rank, start, dst);
            return;
        }
        let dim = level - 1;
        let n = self.dims[dim];
        let len = dst.len();
        for j in 1..=n {
            coords[dim] = (owner[dim] + j) % n;
            if j == 1 {
                self.level(dim, owner, coords, op, start, dst, scratch, fill);
            } else {
                let (below, at) = scratch.split_at_mut(dim);
                let tmp = &mut at[0][..len];
                self.level(dim, owner, coords, op, start, tmp, below, fill);
                accumulate(op, dst, tmp);
            }
        }
        coords[dim] = owner[dim];
    }
}
