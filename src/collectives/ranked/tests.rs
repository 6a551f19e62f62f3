//! The split collectives against the streamed reduction, on thread ranks.

use super::*;
use crate::transport::cluster::{RankLayout, SharedMailbox, thread_mailboxes};
use proptest::prelude::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(super) fn contexts(ranks: u32) -> Vec<RankContext> {
    let topology = crate::topology::load_preset("v4-128").expect("a preset");
    thread_mailboxes(ranks)
        .into_iter()
        .map(|mailbox| {
            let layout = RankLayout::new(&topology, ranks, mailbox_rank(&mailbox)).expect("fits");
            let mailbox: SharedMailbox = Arc::new(Mutex::new(Box::new(mailbox)));
            RankContext {
                layout,
                mailbox,
                timeout: Duration::from_secs(20),
                buffers: Default::default(),
                segment: Default::default(),
            }
        })
        .collect()
}

fn mailbox_rank(m: &crate::transport::cluster::ThreadMailbox) -> u32 {
    use crate::transport::cluster::Mailbox;
    m.rank()
}

pub(super) fn value(member: usize, i: usize) -> f32 {
    // Values of mixed magnitude, so the fold order shows in the bits.
    let x = ((member * 7919 + i * 104_729) % 1000) as f32;
    (x - 500.0) * 10f32.powi(((member + i) % 7) as i32 - 3)
}

/// A grid of `dims` (or, with `ring`, a ring over its members in an order
/// shuffled by `seed`) and each member's rank among at most `ranks`,
/// spread by `seed`: the cases the proptests draw.
pub(super) fn grid_over_ranks(
    dims: &[usize],
    ring: bool,
    ranks: u32,
    seed: u64,
) -> (ReduceGrid, Vec<u32>, u32) {
    let n: usize = dims.iter().product();
    let grid = if ring {
        let mut order: Vec<usize> = (0..n).collect();
        let mut x = seed | 1;
        for i in (1..n).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
        ReduceGrid::ring(&order)
    } else {
        ReduceGrid::torus(dims)
    };
    let ranks = ranks.min(n as u32);
    let rank_of: Vec<u32> = (0..grid.len())
        .map(|p| ((p as u64 ^ seed) % u64::from(ranks)) as u32)
        .collect();
    (grid, rank_of, ranks)
}

/// A member's grid position and its buffer after each collective.
type Member = (usize, Vec<f32>, Vec<f32>);

/// Runs the reduce-scatter and the all-gather over `ranks` thread ranks;
/// returns every member's buffer after each, by grid position.
fn run(
    grid: &ReduceGrid,
    rank_of: &[u32],
    ranks: u32,
    len: usize,
    op: ReduceOp,
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let n = grid.len();
    let results: Vec<Vec<Member>> = std::thread::scope(|s| {
        let handles: Vec<_> = contexts(ranks)
            .into_iter()
            .map(|ctx| {
                s.spawn(move || {
                    let me = ctx.layout.rank();
                    let mut buffers: Vec<Option<Vec<f32>>> = (0..n)
                        .map(|p| {
                            (rank_of[p] == me)
                                .then(|| (0..len).map(|i| value(grid.members()[p], i)).collect())
                        })
                        .collect();
                    let mut local: Vec<Option<&mut [f32]>> = buffers
                        .iter_mut()
                        .map(|b| b.as_mut().map(|v| v.as_mut_slice()))
                        .collect();
                    let mut ranked = RankedGrid {
                        grid,
                        rank_of,
                        local: &mut local,
                        tag: 7,
                        window: None,
                    };
                    ranked.reduce_scatter(&ctx, op).expect("reduce-scatter");
                    let after_rs: Vec<Option<Vec<f32>>> = buffers.clone();
                    let mut local: Vec<Option<&mut [f32]>> = buffers
                        .iter_mut()
                        .map(|b| b.as_mut().map(|v| v.as_mut_slice()))
                        .collect();
                    RankedGrid {
                        grid,
                        rank_of,
                        local: &mut local,
                        tag: 8,
                        window: None,
                    }
                    .all_gather(&ctx)
                    .expect("all-gather");
                    buffers
                        .into_iter()
                        .zip(after_rs)
                        .enumerate()
                        .filter_map(|(p, (b, rs))| Some((p, rs?, b?)))
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    });
    let mut rs = vec![Vec::new(); n];
    let mut ag = vec![Vec::new(); n];
    for (p, a, b) in results.into_iter().flatten() {
        rs[p] = a;
        ag[p] = b;
    }
    (rs, ag)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Split over ranks in any way, the owners' ranges hold the bits
    /// of the streamed reduction, and the all-gather gives every member
    /// every owner's range.
    #[test]
    fn split_grid_matches_streamed_reduction(
        dims in prop::collection::vec(1usize..=4, 1..=3),
        ring in any::<bool>(),
        len in 0usize..70,
        ranks in 1u32..=4,
        seed in any::<u64>(),
        mean in any::<bool>(),
    ) {
        let (grid, rank_of, ranks) = grid_over_ranks(&dims, ring, ranks, seed);
        let op = if mean { ReduceOp::Mean } else { ReduceOp::Sum };
        let (rs, ag) = run(&grid, &rank_of, ranks, len, op);
        let ranges = grid_shard_ranges(grid.dims(), len);
        let mut whole = vec![0f32; len];
        for p in 0..grid.len() {
            let range = ranges[p].clone();
            let mut expected = vec![0f32; range.len()];
            grid.reduce_for(p, op, &mut expected, &mut |member, offset, buf| {
                for (j, v) in buf.iter_mut().enumerate() {
                    *v = value(member, range.start + offset + j);
                }
            });
            let got: Vec<u32> = rs[p][range.clone()].iter().map(|v| v.to_bits()).collect();
            let want: Vec<u32> = expected.iter().map(|v| v.to_bits()).collect();
            prop_assert_eq!(got, want, "owner {} of {:?}", p, grid.dims());
            whole[range].copy_from_slice(&rs[p][ranges[p].clone()]);
        }
        for (p, buffer) in ag.iter().enumerate() {
            let got: Vec<u32> = buffer.iter().map(|v| v.to_bits()).collect();
            let want: Vec<u32> = whole.iter().map(|v| v.to_bits()).collect();
            prop_assert_eq!(got, want, "member {} after the all-gather", p);
        }
    }
}

#[test]
fn the_local_prefix_is_the_leading_dimensions_within_ranks() {
    let by = |f: fn(usize) -> u32| -> Vec<u32> { (0..8).map(f).collect() };
    // 2x2x2, position x + 2(y + 2z).
    assert_eq!(local_prefix(&[2, 2, 2], &by(|p| (p / 4) as u32)), 2);
    assert_eq!(local_prefix(&[2, 2, 2], &by(|p| (p / 2 % 2) as u32)), 1);
    assert_eq!(local_prefix(&[2, 2, 2], &by(|p| (p % 2) as u32)), 0);
    assert_eq!(local_prefix(&[2, 2, 2], &by(|_| 0)), 3);
    let block = grid_shard_ranges(&[2, 2], 8);
    let twice: Vec<_> = block.iter().chain(&block).cloned().collect();
    assert_eq!(prefix_ranges(&[2, 2, 2], 8, 2), twice);
}

#[test]
fn a_silent_rank_is_named_within_the_bound() {
    let grid = ReduceGrid::torus(&[2]);
    let mut ctxs = contexts(2);
    let ctx = ctxs.remove(0);
    let ctx = RankContext {
        timeout: Duration::from_millis(100),
        ..ctx
    };
    let mut mine = vec![1.0f32; 4];
    let mut local: Vec<Option<&mut [f32]>> = vec![Some(&mut mine), None];
    let started = std::time::Instant::now();
    let error = RankedGrid {
        grid: &grid,
        rank_of: &[0, 1],
        local: &mut local,
        tag: 1,
        window: None,
    }
    .reduce_scatter(&ctx, ReduceOp::Sum)
    .expect_err("rank 1 never answers");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        matches!(error, ClusterError::RankLost { rank: 1, .. }),
        "{error}"
    );
}
