//! The passes along a grid's leading dimensions whose lines all stay on
//! one rank, fused: a rank's block of members (the sub-grid those
//! dimensions span) is folded in one sweep, each member's buffer read once
//! and each owner's range written once, in [`ReduceGrid::reduce_for`]'s
//! order for the block (so the bits are the per-dimension passes'); and
//! the all-gather's copies within the block are made once, after the
//! passes across ranks, each member's range copied straight to the
//! block's other members.
//!
//! [`ReduceGrid::reduce_for`]: crate::collectives::ReduceGrid::reduce_for

use super::{RankedGrid, prefix_ranges};
use crate::collectives::element::{Element, ReduceOp, accumulate, combine_in_order};
use std::ops::Range;

/// Elements folded at a time: the owner's own values of a piece are kept
/// aside (its range is overwritten before the fold reads it), and the
/// partials of the inner dimensions stay in cache.
const FOLD_PIECE: usize = 2048;

/// Each local buffer cut at its block's ranges (`ranges` by grid
/// position): entry `[p][j]` is member `p`'s elements over the range of
/// the `j`-th member of `p`'s block (empty for other ranks' members).
fn block_parts<'s, T>(
    local: &'s mut [Option<&mut [T]>],
    ranges: &[Range<usize>],
    first: &[usize],
    size: usize,
) -> Vec<Vec<Option<&'s mut [T]>>> {
    local
        .iter_mut()
        .enumerate()
        .map(|(p, slot)| {
            let Some(buf) = slot else {
                return Vec::new();
            };
            let base = p - p % size;
            let mut order: Vec<usize> = (0..size).collect();
            order.sort_by_key(|&j| ranges[base + j].start);
            let mut parts: Vec<Option<&'s mut [T]>> = (0..size).map(|_| None).collect();
            let mut rest: &'s mut [T] = &mut buf[..];
            let mut at = first[p];
            for j in order {
                let range = &ranges[base + j];
                if range.is_empty() {
                    // An empty range may start inside a neighbour's.
                    parts[j] = Some(&mut []);
                    continue;
                }
                let skip = range.start - at;
                let tail = std::mem::take(&mut rest).split_at_mut(skip).1;
                let (part, tail) = tail.split_at_mut(range.len());
                parts[j] = Some(part);
                rest = tail;
                at = range.end;
            }
            parts
        })
        .collect()
}

impl<T: Element> RankedGrid<'_, '_, T> {
    /// The reduce-scatter's passes along dimensions `0..block`, whose
    /// lines stay on one rank, as one fold of each block: afterwards member
    /// `p` holds its block's partial over `prefix_ranges(dims, len,
    /// block)[p]` (summed, not divided for `Mean`).
    pub(super) fn fold_blocks(&mut self, block: usize, op: ReduceOp, first: &[usize], len: usize) {
        let dims = self.grid.dims();
        let sub = &dims[..block];
        let size: usize = sub.iter().product();
        let ranges = prefix_ranges(dims, len, block);
        let mut parts = block_parts(self.local, &ranges, first, size);
        let mut own = vec![T::ZERO; FOLD_PIECE];
        let mut scratch: Vec<Vec<T>> = (0..block).map(|_| vec![T::ZERO; FOLD_PIECE]).collect();
        for q in 0..parts.len() {
            if parts[q].is_empty() {
                continue;
            }
            let (base, j) = (q - q % size, q % size);
            let Some(target) = parts[q][j].take() else {
                continue;
            };
            let sources: Vec<&[T]> = (0..size)
                .map(|m| match parts[base + m][j].take() {
                    Some(part) if m != j => &*part,
                    _ => &[][..],
                })
                .collect();
            fold_block(sub, j, op, target, &sources, &mut own, &mut scratch);
        }
    }

    /// The all-gather's passes along dimensions `0..block`: each member
    /// of a block copies every other member's `prefix_ranges(dims, len,
    /// block)` range from it.
    pub(super) fn copy_blocks(&mut self, block: usize, first: &[usize], len: usize) {
        let dims = self.grid.dims();
        let size: usize = dims[..block].iter().product();
        let ranges = prefix_ranges(dims, len, block);
        let mut parts = block_parts(self.local, &ranges, first, size);
        for q in 0..parts.len() {
            if parts[q].is_empty() {
                continue;
            }
            let (base, j) = (q - q % size, q % size);
            let Some(source) = parts[q][j].take() else {
                continue;
            };
            let source: &[T] = source;
            for m in (0..size).filter(|&m| m != j) {
                if let Some(target) = parts[base + m][j].take() {
                    target.copy_from_slice(source);
                }
            }
        }
    }
}

/// Owner `owner`'s fold over the block `dims` (`sources` by block
/// position; the owner's own values are `target`'s), in pieces.
fn fold_block<T: Element>(
    dims: &[usize],
    owner: usize,
    op: ReduceOp,
    target: &mut [T],
    sources: &[&[T]],
    own: &mut [T],
    scratch: &mut [Vec<T>],
) {
    let owner_coords = coords(dims, owner);
    let mut at = owner_coords.clone();
    let mut start = 0;
    while start < target.len() {
        let end = (start + FOLD_PIECE).min(target.len());
        let own = &mut own[..end - start];
        own.copy_from_slice(&target[start..end]);
        let pieces: Vec<&[T]> = sources
            .iter()
            .enumerate()
            .map(|(m, s)| if m == owner { &*own } else { &s[start..end] })
            .collect();
        level(
            dims,
            dims.len(),
            &owner_coords,
            &mut at,
            op,
            &mut target[start..end],
            scratch,
            &pieces,
        );
        start = end;
    }
}

/// `ReduceGrid`'s level `level` (dimensions `0..level` folded, the rest
/// at `at[level..]`) into `dst`: along each dimension from the position
/// after the owner's round to it, the partial always the left operand.
#[allow(clippy::too_many_arguments)]
fn level<T: Element>(
    dims: &[usize],
    level_: usize,
    owner: &[usize],
    at: &mut [usize],
    op: ReduceOp,
    dst: &mut [T],
    scratch: &mut [Vec<T>],
    pieces: &[&[T]],
) {
    let dim = level_ - 1;
    let n = dims[dim];
    if dim == 0 {
        let mut member = |j: usize| {
            at[0] = (owner[0] + j) % n;
            pieces[linear(dims, at)]
        };
        let head = member(1);
        let rest: Vec<&[T]> = (2..=n).map(&mut member).collect();
        combine_in_order(op, dst, head, &rest);
        at[0] = owner[0];
        return;
    }
    let len = dst.len();
    for j in 1..=n {
        at[dim] = (owner[dim] + j) % n;
        if j == 1 {
            level(dims, dim, owner, at, op, dst, scratch, pieces);
        } else {
            let (below, here) = scratch.split_at_mut(dim);
            let tmp = &mut here[0][..len];
            level(dims, dim, owner, at, op, tmp, below, pieces);
            accumulate(op, dst, tmp);
        }
    }
    at[dim] = owner[dim];
}

fn coords(dims: &[usize], mut index: usize) -> Vec<usize> {
    dims.iter()
        .map(|&d| {
            let c = index % d;
            index /= d;
            c
        })
        .collect()
}

fn linear(dims: &[usize], at: &[usize]) -> usize {
    at.iter()
        .zip(dims)
        .rev()
        .fold(0, |acc, (&c, &d)| acc * d + c)
}
