//! Reduce-scatter and all-gather whose members live on several ranks (the
//! processes of a pod split with `pod::ranks`), on the same schedule as
//! the in-process collectives: along the grid's dimension 0 first (the
//! rings of a torus, or the one ring), then dimension 1 on the range each
//! member now owns, and so on; the all-gather in reverse.
//!
//! Each ring step moves chunk `(k−1−s) mod n` from position `k` to `k+1`
//! (reduce-scatter) or chunk `(k−s) mod n` (all-gather), as
//! [`super::reduce_scatter`] and [`super::all_gather`] do. A hop between
//! two members on one rank is a copy in memory; a hop to another rank's
//! member is a data frame through the job's mailbox (point-to-point
//! `MPI_Isend`/`MPI_Improbe` under the `mpi` feature). Per ring step a
//! rank sends one frame to each rank it has hops to, with every such
//! chunk of that step (all lines of the dimension) in line order, then
//! receives one frame from each rank with hops to it: every send is posted
//! before any receive, so no step can deadlock, and every receive is
//! bounded by the job's rank timeout.
//!
//! The arithmetic is the ring's: the partial in flight is combined as
//! `op(partial, own)`, so chunk `c` of a line is folded left to right
//! from position `c+1` round to `c`, and `Mean` divides once after the last
//! dimension. That is [`ReduceGrid::reduce_for`]'s order, so the owner's
//! range holds the bits one process computes (`tests` checks it on split
//! grids against the streamed reduction).

use std::ops::Range;

use super::element::{Element, ReduceOp};
use super::ring::chunk_range;
use super::streamed::ReduceGrid;
use crate::transport::ClusterError;
use crate::transport::cluster::{RankContext, data_payload};

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
        let sub = chunk_range(range.len(), n, (pos / stride) % n);
        *range = range.start + sub.start..range.start + sub.end;
    }
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
/// holds the member). Every buffer has one length.
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
}

/// One hop of a ring step: the member at `from` hands range `range` of
/// its buffer to the member at `to`.
struct Hop {
    from: usize,
    to: usize,
    range: Range<usize>,
}

/// What a step does at the receiving member.
#[derive(Clone, Copy)]
enum Land {
    /// `own = op(partial, own)`.
    Combine(ReduceOp),
    /// `own = incoming`.
    Copy,
}

impl<T: Element> RankedGrid<'_, '_, T> {
    fn check(&self, ctx: &RankContext) -> Result<usize, ClusterError> {
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
            if let Some(buf) = slot {
                if len.is_some_and(|l| l != buf.len()) {
                    return Err(protocol("members' buffers differ in length".into()));
                }
                len = Some(buf.len());
            }
        }
        let len = len.unwrap_or(0);
        Ok(len)
    }

    /// Runs one ring step's hops: local ones in memory, the rest as one
    /// frame per destination rank.
    fn step(
        &mut self,
        ctx: &RankContext,
        hops: &[Hop],
        land: Land,
        tag: u64,
    ) -> Result<(), ClusterError> {
        let me = ctx.layout.rank();
        let ranks = ctx.layout.ranks() as usize;
        let size = std::mem::size_of::<T>();
        // Each destination's frame, sized once (one copy of each chunk).
        // (A rank with hops to another sends it a frame even when every
        // chunk is empty: the receiver waits for one from each.)
        let mut outgoing_bytes: Vec<Option<usize>> = vec![None; ranks];
        let mut incoming: Vec<bool> = vec![false; ranks];
        for hop in hops {
            let (src, dst) = (self.rank_of[hop.from], self.rank_of[hop.to]);
            if src == me && dst != me {
                *outgoing_bytes[dst as usize].get_or_insert(0) += hop.range.len() * size;
            } else if dst == me && src != me {
                incoming[src as usize] = true;
            }
        }
        let mut outgoing: Vec<Option<Vec<u8>>> = vec![None; ranks];
        for (dst, bytes) in outgoing_bytes.into_iter().enumerate() {
            if let Some(bytes) = bytes {
                outgoing[dst] = Some(ctx.data_frame(tag, bytes)?);
            }
        }
        for hop in hops {
            let (src, dst) = (self.rank_of[hop.from], self.rank_of[hop.to]);
            if src == me && dst != me {
                let buf = self.local[hop.from].as_deref().expect("checked: local");
                let bytes: &[u8] = bytemuck::cast_slice(&buf[hop.range.clone()]);
                outgoing[dst as usize]
                    .as_mut()
                    .expect("sized above")
                    .extend_from_slice(bytes);
            }
        }
        for (to, frame) in outgoing.into_iter().enumerate() {
            if let Some(frame) = frame {
                ctx.send_data(to as u32, frame)?;
            }
        }
        for hop in hops {
            if self.rank_of[hop.from] == me && self.rank_of[hop.to] == me {
                let (from, to) = pair(self.local, hop.from, hop.to);
                let r = hop.range.clone();
                land_into(land, &mut to[r.clone()], &from[r]);
            }
        }
        for src in (0..ranks).filter(|&r| incoming[r]) {
            let frame = ctx.receive_data(src as u32, tag, "a collective's data")?;
            let payload = data_payload(&frame);
            let values: std::borrow::Cow<'_, [T]> = match bytemuck::try_cast_slice(payload) {
                Ok(values) => values.into(),
                Err(_) => {
                    // A misaligned (or ragged) payload: copy it out.
                    let size = std::mem::size_of::<T>();
                    let mut values = vec![T::ZERO; payload.len() / size];
                    let whole = values.len() * size;
                    bytemuck::cast_slice_mut::<T, u8>(&mut values)
                        .copy_from_slice(&payload[..whole]);
                    values.into()
                }
            };
            let mut at = 0;
            for hop in hops {
                if self.rank_of[hop.from] as usize != src || self.rank_of[hop.to] != me {
                    continue;
                }
                let len = hop.range.len();
                let part = values
                    .get(at..at + len)
                    .ok_or_else(|| ClusterError::Protocol {
                        rank: src as u32,
                        what: format!("{} elements where more were due", values.len()),
                    })?;
                let to = self.local[hop.to].as_deref_mut().expect("checked: local");
                land_into(land, &mut to[hop.range.clone()], part);
                at += len;
            }
            if at != values.len() {
                return Err(ClusterError::Protocol {
                    rank: src as u32,
                    what: format!("{} elements where {at} were due", values.len()),
                });
            }
            drop(values);
            ctx.recycle(frame);
        }
        Ok(())
    }

    /// Reduce-scatter with `op` (module docs). Afterwards the buffer of the
    /// member at grid position `p` holds, over
    /// `grid_shard_ranges(dims, len)[p]`, the reduction of every member's
    /// values there, bit for bit [`ReduceGrid::reduce_for`]'s; elsewhere
    /// partial sums. Returns the owned ranges.
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
        let len = self.check(ctx)?;
        let dims = self.grid.dims().to_vec();
        let mut ranges = prefix_ranges(&dims, len, first_dim);
        let mut round = 0u64;
        for dim in first_dim.min(dims.len())..dims.len() {
            let n = dims[dim];
            let lines = lines(&dims, dim);
            for s in 0..n.saturating_sub(1) {
                let hops = ring_hops(&lines, &ranges, n, |k| (k + 2 * n - 1 - s) % n);
                self.step(ctx, &hops, Land::Combine(op), frame_tag(self.tag, round))?;
                round += 1;
            }
            narrow(&dims, dim, &mut ranges);
        }
        if op == ReduceOp::Mean {
            let count = self.grid.len();
            for (pos, slot) in self.local.iter_mut().enumerate() {
                if let Some(buf) = slot {
                    for v in &mut buf[ranges[pos].clone()] {
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
        let len = self.check(ctx)?;
        let dims = self.grid.dims().to_vec();
        // The ranges before each dimension's reduce-scatter narrowed them.
        let mut wider = Vec::with_capacity(dims.len());
        let mut ranges = vec![0..len; self.grid.len()];
        for dim in 0..dims.len() {
            wider.push(ranges.clone());
            narrow(&dims, dim, &mut ranges);
        }
        let mut round = 1 << 15;
        for dim in (first_dim.min(dims.len())..dims.len()).rev() {
            let n = dims[dim];
            let lines = lines(&dims, dim);
            for s in 0..n.saturating_sub(1) {
                let hops = ring_hops(&lines, &wider[dim], n, |k| (k + n - s % n) % n);
                self.step(ctx, &hops, Land::Copy, frame_tag(self.tag, round))?;
                round += 1;
            }
        }
        Ok(())
    }
}

/// Every line's hops of one ring step: position `k` sends `chunk(k)` of
/// its range to `k+1`.
fn ring_hops(
    lines: &[Vec<usize>],
    ranges: &[Range<usize>],
    n: usize,
    chunk: impl Fn(usize) -> usize,
) -> Vec<Hop> {
    let mut hops = Vec::with_capacity(lines.len() * n);
    for line in lines {
        for k in 0..n {
            let (from, to) = (line[k], line[(k + 1) % n]);
            let range = &ranges[from];
            let sub = chunk_range(range.len(), n, chunk(k));
            hops.push(Hop {
                from,
                to,
                range: range.start + sub.start..range.start + sub.end,
            });
        }
    }
    hops
}

/// The tag of one round's frames.
fn frame_tag(tag: u64, round: u64) -> u64 {
    tag.wrapping_mul(1 << 16).wrapping_add(round)
}

/// Two distinct members' buffers at once.
fn pair<'s, T>(
    local: &'s mut [Option<&mut [T]>],
    from: usize,
    to: usize,
) -> (&'s [T], &'s mut [T]) {
    debug_assert_ne!(from, to);
    if from < to {
        let (left, right) = local.split_at_mut(to);
        (
            left[from].as_deref().expect("checked: local"),
            right[0].as_deref_mut().expect("checked: local"),
        )
    } else {
        let (left, right) = local.split_at_mut(from);
        (
            right[0].as_deref().expect("checked: local"),
            left[to].as_deref_mut().expect("checked: local"),
        )
    }
}

fn land_into<T: Element>(land: Land, own: &mut [T], incoming: &[T]) {
    let op = match land {
        Land::Copy => {
            own.copy_from_slice(incoming);
            return;
        }
        Land::Combine(op) => op,
    };
    let f: fn(T, T) -> T = match op {
        ReduceOp::Sum | ReduceOp::Mean => T::add,
        ReduceOp::Product => T::mul,
        ReduceOp::Max => T::max,
        ReduceOp::Min => T::min,
    };
    for (o, &p) in own.iter_mut().zip(incoming) {
        *o = f(p, *o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::cluster::{RankLayout, SharedMailbox, thread_mailboxes};
    use proptest::prelude::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    fn contexts(ranks: u32) -> Vec<RankContext> {
        let topology = crate::topology::load_preset("v4-128").expect("a preset");
        thread_mailboxes(ranks)
            .into_iter()
            .map(|mailbox| {
                let layout =
                    RankLayout::new(&topology, ranks, mailbox_rank(&mailbox)).expect("fits");
                let mailbox: SharedMailbox = Arc::new(Mutex::new(Box::new(mailbox)));
                RankContext {
                    layout,
                    mailbox,
                    timeout: Duration::from_secs(20),
                }
            })
            .collect()
    }

    fn mailbox_rank(m: &crate::transport::cluster::ThreadMailbox) -> u32 {
        use crate::transport::cluster::Mailbox;
        m.rank()
    }

    fn value(member: usize, i: usize) -> f32 {
        // Values of mixed magnitude, so the fold order shows in the bits.
        let x = ((member * 7919 + i * 104_729) % 1000) as f32;
        (x - 500.0) * 10f32.powi(((member + i) % 7) as i32 - 3)
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
                                (rank_of[p] == me).then(|| {
                                    (0..len).map(|i| value(grid.members()[p], i)).collect()
                                })
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
            let n: usize = dims.iter().product();
            let grid = if ring {
                // A ring over the members in a shuffled order.
                let mut order: Vec<usize> = (0..n).collect();
                let mut x = seed | 1;
                for i in (1..n).rev() {
                    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                    order.swap(i, (x % (i as u64 + 1)) as usize);
                }
                ReduceGrid::ring(&order)
            } else {
                ReduceGrid::torus(&dims)
            };
            let ranks = ranks.min(n as u32);
            let rank_of: Vec<u32> = (0..grid.len())
                .map(|p| ((p as u64 ^ seed) % u64::from(ranks)) as u32)
                .collect();
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
        }
        .reduce_scatter(&ctx, ReduceOp::Sum)
        .expect_err("rank 1 never answers");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(
            matches!(error, ClusterError::RankLost { rank: 1, .. }),
            "{error}"
        );
    }
}
