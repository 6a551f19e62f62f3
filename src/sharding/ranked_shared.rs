//! The split step's reduce-scatter when every rank is on one node: the
//! members' bucket buffers are the ranks' shared segment
//! ([`RankContext::with_shared_segment`]), so an owner folds the other
//! ranks' members' chunks by reading them where their ranks wrote them —
//! no message, no copy (`collectives::ranked::SharedGrid`). The fold
//! order, and so every bit, is the message path's and one process's.
//!
//! Each rank's part of the segment holds two halves (consecutive buckets
//! alternate between them, [`SharedSegment::alternate`]), each with one
//! bucket-long region per block of the rank's members along the leading
//! dimensions whose lines stay on the rank: the block's members fold into
//! their windows of it (their ranges there are disjoint), streamed from
//! the gradient source as on the message path. The last pass across ranks
//! writes each owner's shard straight into the reduced gradient.
//!
//! [`SharedSegment::alternate`]: crate::transport::cluster::SharedSegment::alternate

use super::error::ShardingError;
use super::gradients::GradientSource;
use super::layout::ShardLayout;
use super::ranked::{fold_local_blocks, keep_owned_shards, place_windows, placement};
use crate::collectives::ranked::{
    SharedGrid, grid_shard_ranges, local_prefix, member_regions, prefix_ranges,
};
use crate::collectives::{ReduceGrid, ReduceOp};
use crate::ir::FloatElement;
use crate::transport::ClusterError;
use crate::transport::cluster::{RankContext, SharedSegment};

/// Where each grid position's block lies in its rank's half of the
/// segment: the block's index among its rank's blocks, by block (blocks
/// are the runs of `size` positions, each on one rank), and the most
/// blocks a rank holds.
fn block_slots(rank_of: &[u32], size: usize, ranks: u32) -> (Vec<usize>, usize) {
    let block_ranks: Vec<u32> = rank_of.iter().step_by(size.max(1)).copied().collect();
    member_regions(&block_ranks, ranks)
}

/// How the buckets sit in the segment (module docs).
struct Placement {
    grid: ReduceGrid,
    rank_of: Vec<u32>,
    /// The leading dimensions folded on each rank, and their block's size.
    prefix: usize,
    size: usize,
    /// Each block's region index in its rank's half.
    slot: Vec<usize>,
    /// Elements a region holds (the longest bucket's).
    longest: usize,
    /// Bytes of one half of a rank's part.
    half_bytes: usize,
}

impl Placement {
    /// The step's buckets of `A` in the segment, for this rank.
    fn of<A>(layout: &ShardLayout, ctx: &RankContext) -> Placement {
        let (grid, rank_of) = placement(layout, ctx);
        let prefix = local_prefix(grid.dims(), &rank_of);
        let size: usize = grid.dims()[..prefix].iter().product();
        let (slot, most) = block_slots(&rank_of, size, ctx.layout.ranks());
        let longest = layout.buckets.iter().map(|b| b.padded_len).max();
        let longest = longest.unwrap_or(0);
        // At least one region a half: the all-gather's.
        let half_bytes = (most.max(1) * longest * std::mem::size_of::<A>()).next_multiple_of(64);
        Placement {
            grid,
            rank_of,
            prefix,
            size,
            slot,
            longest,
            half_bytes,
        }
    }
}

/// Reduce-scatters every bucket of the step through the ranks' shared
/// segment into `reduced` (this rank's shards; the rest is left as it
/// was). `Ok(false)` if the ranks share no memory (nothing done: the
/// caller moves the bytes by messages).
pub(super) fn reduce_in_shared_memory<A: FloatElement>(
    layout: &ShardLayout,
    reduced: &mut [A],
    source: &dyn GradientSource<A>,
    op: ReduceOp,
    ctx: &RankContext,
) -> Result<bool, ShardingError> {
    let placed = Placement::of::<A>(layout, ctx);
    let outcome = ctx.with_shared_segment(2 * placed.half_bytes, |segment| {
        Ok((0..layout.buckets.len()).try_for_each(|b| {
            reduce_bucket(layout, b, (reduced, source, op), ctx, segment, &placed)
        }))
    })?;
    match outcome {
        Some(result) => result.map(|()| true),
        None => Ok(false),
    }
}

/// Bucket `b`'s reduce-scatter in the segment.
fn reduce_bucket<A: FloatElement>(
    layout: &ShardLayout,
    b: usize,
    (reduced, source, op): (&mut [A], &dyn GradientSource<A>, ReduceOp),
    ctx: &RankContext,
    segment: &mut SharedSegment,
    placed: &Placement,
) -> Result<(), ShardingError> {
    let Placement {
        grid,
        rank_of,
        prefix,
        size,
        ..
    } = placed;
    let me = ctx.layout.rank();
    let bucket = &layout.buckets[b];
    let len = bucket.padded_len;
    let n = grid.len();
    let base = member_bases::<A>(segment, placed)?;
    let pre = prefix_ranges(grid.dims(), len, *prefix);
    let mut buffers: Vec<Option<&mut [A]>> = (0..n).map(|_| None).collect();
    let mut first = vec![0; n];
    for start in (0..n).step_by((*size).max(1)) {
        if rank_of[start] == me {
            // SAFETY: this rank's region for the block, in the half this
            // call fills: allocated for the segment's life (the segment
            // outlives the call), and no other rank reads or writes that
            // half until every rank passed the collective's first fence
            // (`SharedSegment::alternate`). The windows cut from it end
            // before that fence.
            let region = unsafe { std::slice::from_raw_parts_mut(base[start], len) };
            place_windows(region, start..start + size, &pre, &mut buffers, &mut first);
        }
    }
    fold_local_blocks(
        (layout, bucket.offset, source),
        (grid, *prefix, &pre),
        &mut buffers,
        &first,
    );
    drop(buffers);
    let owned = grid_shard_ranges(grid.dims(), len);
    let mut out: Vec<Option<&mut [A]>> = (0..n).map(|_| None).collect();
    let mine = (0..n).filter(|&p| rank_of[p] == me);
    let region = &mut reduced[bucket.offset..bucket.offset + len];
    place_windows(region, mine, &owned, &mut out, &mut vec![0; n]);
    let shared = SharedGrid {
        grid,
        rank_of,
        base: &base,
        len,
    };
    // SAFETY: each member's prefix range lies in its block's region of
    // its rank's half of the segment (`member_bases`), the block's
    // members' ranges disjoint; every rank runs this call alike on the
    // half it alternated to, and touches it otherwise only before its
    // first fence (the fill above) — the contract.
    let result = unsafe { shared.reduce_scatter_from(ctx, segment, op, *prefix, &mut out) }?;
    drop(out);
    let none: Vec<Option<&mut [A]>> = (0..n).map(|_| None).collect();
    keep_owned_shards(layout, b, (grid, rank_of, me), (&result, &none), reduced)
}

/// Where element 0 of each member's buffer is: its block's region in its
/// rank's part, in the half this call alternates to.
fn member_bases<A>(
    segment: &mut SharedSegment,
    placed: &Placement,
) -> Result<Vec<*mut A>, ShardingError> {
    let half = segment.alternate();
    let region_bytes = placed.longest * std::mem::size_of::<A>();
    (0..placed.grid.len())
        .map(|pos| {
            let rank = placed.rank_of[pos];
            let part = segment
                .part(rank)
                .ok_or_else(|| ShardingError::InvalidState {
                    reason: format!("the shared segment has no part for rank {rank}"),
                })?;
            let at =
                half * placed.half_bytes + placed.slot[pos / placed.size.max(1)] * region_bytes;
            // SAFETY: `at` plus a region is within the part, which holds
            // two halves of `half_bytes` (`reduce_in_shared_memory` asked
            // for them), each of the rank's blocks' regions.
            Ok(unsafe { part.add(at) }.cast::<A>())
        })
        .collect()
}

/// After the update: every bucket's parameter shards from every rank into
/// `params`, through the ranks' shared segment. Each rank copies its
/// members' shards into its part (at their places in the bucket), the
/// ranks fence, and each copies the other ranks' shards from their parts:
/// two copies of every shard, no message. `Ok(false)` if the ranks share
/// no memory (nothing done).
pub(super) fn gather_in_shared_memory<A: FloatElement>(
    layout: &ShardLayout,
    params: &mut [A],
    ctx: &RankContext,
) -> Result<bool, ShardingError> {
    let placed = Placement::of::<A>(layout, ctx);
    let me = ctx.layout.rank();
    let outcome = ctx.with_shared_segment(2 * placed.half_bytes, |segment| {
        for bucket in &layout.buckets {
            let len = bucket.padded_len;
            let owned = grid_shard_ranges(placed.grid.dims(), len);
            let half = segment.alternate();
            let region = |segment: &SharedSegment, rank: u32| {
                let part = segment.part(rank).ok_or_else(|| ClusterError::Protocol {
                    rank,
                    what: "no part in the shared segment".into(),
                })?;
                // SAFETY: a half holds at least one bucket-long region.
                Ok::<_, ClusterError>(unsafe { part.add(half * placed.half_bytes) }.cast::<A>())
            };
            let whole = &mut params[bucket.offset..bucket.offset + len];
            let mine = region(segment, me)?;
            for (pos, range) in owned.iter().enumerate() {
                if placed.rank_of[pos] == me {
                    // SAFETY: this rank's region in the half this call
                    // fills, which no other rank touches before the fence
                    // below (`SharedSegment::alternate`); `range` is
                    // within the bucket, which the region holds.
                    let into = unsafe {
                        std::slice::from_raw_parts_mut(mine.add(range.start), range.len())
                    };
                    into.copy_from_slice(&whole[range.clone()]);
                }
            }
            ctx.fence(segment, "arrival at the shared all-gather's fence")?;
            for (pos, range) in owned.iter().enumerate() {
                let rank = placed.rank_of[pos];
                if rank != me {
                    let from = region(segment, rank)?;
                    // SAFETY: the owner's rank wrote these before the fence
                    // and writes that half again only after the next call's
                    // first fence, which this rank reaches after this read.
                    let shard =
                        unsafe { std::slice::from_raw_parts(from.add(range.start), range.len()) };
                    whole[range.clone()].copy_from_slice(shard);
                }
            }
        }
        Ok(())
    })?;
    Ok(outcome.is_some())
}
