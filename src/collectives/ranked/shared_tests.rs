//! The reduce-scatter over shared memory against the streamed reduction,
//! on thread ranks that share their memory as ranks on one node do.

use super::tests::{contexts, grid_over_ranks, value};
use super::*;
use crate::transport::cluster::SharedSegment;
use proptest::prelude::*;
use std::time::Duration;

/// What `body` returns on each rank, by grid position, after every
/// member's buffer was filled with its input in a region of its rank's
/// part of a shared segment (`base`, by position) over thread ranks.
fn on_shared_ranks<B>(
    grid: &ReduceGrid,
    rank_of: &[u32],
    ranks: u32,
    len: usize,
    body: B,
) -> Vec<Vec<f32>>
where
    B: Fn(&RankContext, &mut SharedSegment, &SharedGrid<'_, f32>) -> Vec<(usize, Vec<f32>)> + Sync,
{
    let n = grid.len();
    let (slot, most) = member_regions(rank_of, ranks);
    let results: Vec<Vec<(usize, Vec<f32>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = contexts(ranks)
            .into_iter()
            .map(|ctx| {
                let (slot, body) = (&slot, &body);
                s.spawn(move || {
                    let me = ctx.layout.rank();
                    ctx.with_shared_segment(most * len * 4, |segment| {
                        let base: Vec<*mut f32> = (0..n)
                            .map(|p| {
                                let part = segment.part(rank_of[p]).expect("a part");
                                // SAFETY: the region is within the part.
                                unsafe { part.cast::<f32>().add(slot[p] * len) }
                            })
                            .collect();
                        for p in (0..n).filter(|&p| rank_of[p] == me) {
                            for i in 0..len {
                                // SAFETY: this rank's region, before the
                                // collective's first fence.
                                unsafe { *base[p].add(i) = value(grid.members()[p], i) };
                            }
                        }
                        let shared = SharedGrid {
                            grid,
                            rank_of,
                            base: &base,
                            len,
                        };
                        Ok(body(&ctx, segment, &shared))
                    })
                    .expect("the shared collective")
                    .expect("thread ranks share memory")
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    });
    let mut by_position = vec![Vec::new(); n];
    for (p, values) in results.into_iter().flatten() {
        by_position[p] = values;
    }
    by_position
}

/// Every member's owned range after the shared reduce-scatter, by grid
/// position.
fn run_shared(
    grid: &ReduceGrid,
    rank_of: &[u32],
    ranks: u32,
    len: usize,
    op: ReduceOp,
) -> Vec<Vec<f32>> {
    let owned = grid_shard_ranges(grid.dims(), len);
    on_shared_ranks(grid, rank_of, ranks, len, |ctx, segment, shared| {
        let me = ctx.layout.rank();
        let mut out: Vec<Option<Vec<f32>>> = (0..grid.len())
            .map(|p| (rank_of[p] == me).then(|| vec![0f32; owned[p].len()]))
            .collect();
        let mut outs: Vec<Option<&mut [f32]>> = out.iter_mut().map(|o| o.as_deref_mut()).collect();
        // SAFETY: every member's own region of its rank's part, touched by
        // nothing else during the call.
        unsafe { shared.reduce_scatter_from(ctx, segment, op, 0, &mut outs) }
            .expect("the shared reduce-scatter");
        out.into_iter()
            .enumerate()
            .filter_map(|(p, o)| Some((p, o?)))
            .collect()
    })
}

/// Every member's whole buffer after the shared all-reduce in place, by
/// grid position.
fn run_shared_all_reduce(
    grid: &ReduceGrid,
    rank_of: &[u32],
    ranks: u32,
    len: usize,
    op: ReduceOp,
) -> Vec<Vec<f32>> {
    on_shared_ranks(grid, rank_of, ranks, len, |ctx, segment, shared| {
        // SAFETY: every member's own region of its rank's part, touched by
        // nothing else during the call.
        unsafe { shared.all_reduce_in_place(ctx, segment, op) }.expect("the shared all-reduce");
        let me = ctx.layout.rank();
        (0..grid.len())
            .filter(|&p| rank_of[p] == me)
            // SAFETY: the call fenced after its last write; no rank writes
            // the segment again in this test.
            .map(|p| {
                (
                    p,
                    unsafe { std::slice::from_raw_parts(shared.base[p], len) }.to_vec(),
                )
            })
            .collect()
    })
}

/// The reduction one process computes for the whole buffer: every owner's
/// range reduced in the canonical order.
fn one_process_all_reduce(grid: &ReduceGrid, len: usize, op: ReduceOp) -> Vec<f32> {
    let mut whole = vec![0f32; len];
    for (owner, range) in grid_shard_ranges(grid.dims(), len).into_iter().enumerate() {
        let start = range.start;
        grid.reduce_for(owner, op, &mut whole[range], &mut |member, offset, buf| {
            for (j, v) in buf.iter_mut().enumerate() {
                *v = value(member, start + offset + j);
            }
        });
    }
    whole
}

/// A grid of up to 3 dimensions of 1–4 (or a ring of as many), split
/// over 2–4 ranks in any way (`grid_over_ranks`), a length, and an op.
fn split_grids() -> impl Strategy<Value = (ReduceGrid, Vec<u32>, u32, usize, ReduceOp)> {
    (
        prop::collection::vec(1usize..=4, 1..=3),
        any::<bool>(),
        0usize..70,
        2u32..=4,
        any::<u64>(),
        any::<bool>(),
    )
        .prop_filter("more than one member", |(dims, ..)| {
            dims.iter().product::<usize>() > 1
        })
        .prop_map(|(dims, ring, len, ranks, seed, mean)| {
            let (grid, rank_of, ranks) = grid_over_ranks(&dims, ring, ranks, seed);
            let op = if mean { ReduceOp::Mean } else { ReduceOp::Sum };
            (grid, rank_of, ranks, len, op)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Split over ranks in any way, each owner's range read in place from
    /// the other members holds the bits of the streamed reduction.
    #[test]
    fn the_shared_reduce_scatter_matches_the_streamed_reduction(
        (grid, rank_of, ranks, len, op) in split_grids(),
    ) {
        let got = run_shared(&grid, &rank_of, ranks, len, op);
        let ranges = grid_shard_ranges(grid.dims(), len);
        for p in 0..grid.len() {
            let range = ranges[p].clone();
            let mut expected = vec![0f32; range.len()];
            grid.reduce_for(p, op, &mut expected, &mut |member, offset, buf| {
                for (j, v) in buf.iter_mut().enumerate() {
                    *v = value(member, range.start + offset + j);
                }
            });
            let got: Vec<u32> = got[p].iter().map(|v| v.to_bits()).collect();
            let want: Vec<u32> = expected.iter().map(|v| v.to_bits()).collect();
            prop_assert_eq!(got, want, "owner {} of {:?}", p, grid.dims());
        }
    }

    /// Split over ranks in any way, the all-reduce in place leaves every
    /// member holding, bit for bit, what one process reduces.
    #[test]
    fn the_shared_all_reduce_in_place_matches_one_process(
        (grid, rank_of, ranks, len, op) in split_grids(),
    ) {
        let want: Vec<u32> = one_process_all_reduce(&grid, len, op)
            .iter()
            .map(|v| v.to_bits())
            .collect();
        for (p, got) in run_shared_all_reduce(&grid, &rank_of, ranks, len, op)
            .into_iter()
            .enumerate()
        {
            let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
            prop_assert_eq!(&got, &want, "member {} of {:?}", p, grid.dims());
        }
    }
}

#[test]
fn a_rank_missing_from_a_fence_is_named_within_the_bound() {
    let mut ctxs = contexts(2);
    let silent = ctxs.remove(1);
    let ctx = RankContext {
        timeout: Duration::from_millis(200),
        ..ctxs.remove(0)
    };
    // Both ranks allocate the segment (a collective); then rank 1 stops.
    let error = std::thread::scope(|s| {
        s.spawn(|| {
            silent
                .with_shared_segment(64, |_| Ok(()))
                .expect("allocated")
        });
        ctx.with_shared_segment(64, |segment| {
            let started = std::time::Instant::now();
            let error = ctx
                .fence(segment, "a test's fence")
                .expect_err("rank 1 never comes");
            assert!(started.elapsed() < Duration::from_secs(5));
            Ok(error)
        })
    });
    let error = error
        .expect("allocated")
        .expect("thread ranks share memory");
    assert!(
        matches!(error, ClusterError::RankLost { rank: 1, .. }),
        "{error}"
    );
}

#[test]
fn thread_ranks_that_move_frames_share_no_segment() {
    use crate::transport::cluster::{RankLayout, SharedMailbox, thread_mailboxes_messages_only};
    use std::sync::{Arc, Mutex};
    let topology = crate::topology::load_preset("v4-16").expect("a preset");
    for (rank, mailbox) in thread_mailboxes_messages_only(2).into_iter().enumerate() {
        let mailbox: SharedMailbox = Arc::new(Mutex::new(Box::new(mailbox)));
        let ctx = RankContext {
            layout: RankLayout::new(&topology, 2, rank as u32).expect("fits"),
            mailbox,
            timeout: Duration::from_secs(1),
            buffers: Default::default(),
            segment: Default::default(),
        };
        assert!(
            ctx.with_shared_segment(64, |_| Ok(()))
                .expect("no error")
                .is_none()
        );
    }
}
