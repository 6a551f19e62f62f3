//! One reduce-scatter pass of a split grid: each chunk folded at its
//! owner, in the ring's order, from the members in place and the pieces
//! that land from other ranks.

use std::cell::RefCell;
use std::ops::Range;

use super::{RankedGrid, chunks_of, lines, pieces, shared, take};
use crate::collectives::element::{Element, ReduceOp, combine_in_order};
use crate::transport::ClusterError;
use crate::transport::cluster::{Exchange, RankContext};

thread_local! {
    /// Where other ranks' pieces land, kept between passes (as 8-byte
    /// words, aligned for every element type): a collective's pieces then
    /// land in memory already paged in.
    static STAGING: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Elements folded per block when a chunk has more than two operands.
const FOLD_BLOCK: usize = 2048;

/// A chunk this rank owns in a pass: where the fold lands, and its
/// operands before the owner's own values, in fold order (`None`: from
/// another rank).
struct Fold<'s, T> {
    target: &'s mut [T],
    sources: Vec<Option<&'s [T]>>,
}

/// One piece of a [`Fold`]: folded when its last remote operand lands.
struct Unit {
    fold: usize,
    piece: Range<usize>,
    /// The unit's receives are `first_receive..` (its remote operands in
    /// fold order).
    first_receive: usize,
    /// How many (its operands from other ranks).
    receives: usize,
    /// Of those, how many have not landed.
    waiting: usize,
}

/// What this rank does in one pass, and the receives it posts.
struct Plan<'s, T> {
    folds: Vec<Fold<'s, T>>,
    units: Vec<Unit>,
    sends: Vec<(u32, &'s [u8])>,
    /// `(from, elements)` of every receive, in posting order.
    incoming: Vec<(u32, usize)>,
    /// The unit of every receive.
    unit_of: Vec<usize>,
}

impl<T: Element> RankedGrid<'_, '_, T> {
    /// The reduce-scatter pass along `dim` over the members' `ranges`.
    pub(super) fn reduce_pass(
        &mut self,
        ctx: &RankContext,
        dim: usize,
        ranges: &[Range<usize>],
        first: &[usize],
        op: ReduceOp,
        tag: u64,
    ) -> Result<(), ClusterError> {
        let me = ctx.layout.rank();
        let n = self.grid.dims()[dim];
        let lines = lines(self.grid.dims(), dim);
        let rank_of = self.rank_of;
        let mut chunks = chunks_of(self.local, ranges, first, n);
        let mut plan = Plan {
            folds: Vec::new(),
            units: Vec::new(),
            sends: Vec::new(),
            incoming: Vec::new(),
            unit_of: Vec::new(),
        };
        for line in &lines {
            for c in 0..n {
                plan.add(&mut chunks, line, c, rank_of, me);
            }
        }
        let mut scratch = Vec::new();
        for unit in plan.units.iter().filter(|u| u.waiting == 0) {
            fold_unit(op, &mut plan.folds[unit.fold], unit, &[], &mut scratch);
        }
        if plan.incoming.is_empty() && plan.sends.is_empty() {
            return Ok(());
        }
        let mut staging = STAGING.with(|s| std::mem::take(&mut *s.borrow_mut()));
        let result = exchange_and_fold(ctx, tag, op, plan, &mut staging, &mut scratch);
        STAGING.with(|s| *s.borrow_mut() = staging);
        result
    }
}

impl<'s, T: Element> Plan<'s, T> {
    /// Chunk `c` of `line`: folded here if this rank owns it (its remote
    /// operands to receive), sent to its owner from this rank's members
    /// otherwise. Both sides list a pair of ranks' pieces in the same
    /// order: by line, chunk, piece, then operand in fold order.
    fn add(
        &mut self,
        chunks: &mut [Vec<Option<&'s mut [T]>>],
        line: &[usize],
        c: usize,
        rank_of: &[u32],
        me: u32,
    ) {
        let n = line.len();
        let owner = line[c];
        let order: Vec<usize> = (1..n).map(|j| line[(c + j) % n]).collect();
        let sources: Vec<Option<&'s [T]>> = order
            .iter()
            .map(|&k| (rank_of[k] == me).then(|| shared(take(chunks, k, c))))
            .collect();
        if rank_of[owner] != me {
            // Every member of a line has the same range: any of this
            // rank's gives the chunk's length (and with none, nothing goes).
            let len = sources.iter().flatten().map(|s| s.len()).next();
            let len = len.unwrap_or(0);
            for piece in pieces::<T>(len) {
                for source in sources.iter().flatten() {
                    let bytes: &'s [u8] = bytemuck::cast_slice(&source[piece.clone()]);
                    self.sends.push((rank_of[owner], bytes));
                }
            }
            return;
        }
        let target = take(chunks, owner, c);
        for piece in pieces::<T>(target.len()) {
            let unit = self.units.len();
            let first_receive = self.incoming.len();
            for (&k, source) in order.iter().zip(&sources) {
                if source.is_none() {
                    self.incoming.push((rank_of[k], piece.len()));
                    self.unit_of.push(unit);
                }
            }
            let receives = self.incoming.len() - first_receive;
            self.units.push(Unit {
                fold: self.folds.len(),
                piece,
                first_receive,
                receives,
                waiting: receives,
            });
        }
        self.folds.push(Fold { target, sources });
    }
}

/// Posts the pass's sends and receives and folds each unit as its last
/// piece lands.
fn exchange_and_fold<T: Element>(
    ctx: &RankContext,
    tag: u64,
    op: ReduceOp,
    plan: Plan<'_, T>,
    staging: &mut Vec<u64>,
    scratch: &mut Vec<T>,
) -> Result<(), ClusterError> {
    let Plan {
        mut folds,
        mut units,
        sends,
        incoming,
        unit_of,
    } = plan;
    let size = std::mem::size_of::<T>();
    let total: usize = incoming.iter().map(|&(_, len)| len * size).sum();
    if staging.len() * 8 < total {
        staging.resize(total.div_ceil(8), 0);
    }
    let mut free: &mut [u8] = &mut bytemuck::cast_slice_mut::<u64, u8>(staging)[..total];
    let mut receives = Vec::with_capacity(incoming.len());
    for &(from, len) in &incoming {
        let (buffer, rest) = std::mem::take(&mut free).split_at_mut(len * size);
        free = rest;
        receives.push((from, buffer));
    }
    let mut landed: Vec<Option<&[T]>> = vec![None; incoming.len()];
    let exchange = Exchange {
        tag,
        sends,
        receives,
    };
    ctx.exchange(exchange, "a collective's data", &mut |index, bytes| {
        let values: &[T] = bytemuck::try_cast_slice(bytes).map_err(|e| ClusterError::Protocol {
            rank: incoming[index].0,
            what: format!("a piece that is not whole elements ({e})"),
        })?;
        landed[index] = Some(values);
        let unit = &mut units[unit_of[index]];
        unit.waiting -= 1;
        if unit.waiting == 0 {
            let remote = unit.first_receive..unit.first_receive + unit.receives;
            let operands: Vec<&[T]> = landed[remote].iter().flatten().copied().collect();
            fold_unit(op, &mut folds[unit.fold], unit, &operands, scratch);
        }
        Ok(())
    })
}

/// Folds one unit: `target = op(…op(s₁, s₂)…, target)` over its piece,
/// the operands in fold order, `remote` standing in for the `None` ones.
fn fold_unit<T: Element>(
    op: ReduceOp,
    fold: &mut Fold<'_, T>,
    unit: &Unit,
    remote: &[&[T]],
    scratch: &mut Vec<T>,
) {
    let piece = unit.piece.clone();
    let mut remote = remote.iter();
    let operands: Vec<&[T]> = fold
        .sources
        .iter()
        .map(|s| match s {
            Some(local) => &local[piece.clone()],
            None => remote.next().copied().unwrap_or(&[]),
        })
        .collect();
    fold_into(op, &mut fold.target[piece], &operands, scratch);
}

/// `own[i] = op(…op(op(xs[0][i], xs[1][i]), …), own[i])`: the ring's fold
/// with the owner's value last, the partial always the left operand.
pub(super) fn fold_into<T: Element>(
    op: ReduceOp,
    own: &mut [T],
    xs: &[&[T]],
    scratch: &mut Vec<T>,
) {
    match xs {
        [] => {}
        [x] => land(op, own, x),
        [first, rest @ ..] => {
            scratch.resize(FOLD_BLOCK.min(own.len()), T::ZERO);
            let mut start = 0;
            while start < own.len() {
                let end = (start + FOLD_BLOCK).min(own.len());
                let acc = &mut scratch[..end - start];
                let rest: Vec<&[T]> = rest.iter().map(|x| &x[start..end]).collect();
                combine_in_order(op, acc, &first[start..end], &rest);
                land(op, &mut own[start..end], acc);
                start = end;
            }
        }
    }
}

/// `own[i] = op(partial[i], own[i])`. The `match` sits outside the loops,
/// so each is a plain element-wise loop the compiler inlines and
/// vectorizes (a call through a function pointer per element would not).
fn land<T: Element>(op: ReduceOp, own: &mut [T], partial: &[T]) {
    macro_rules! each {
        ($f:expr) => {
            for (o, &p) in own.iter_mut().zip(partial) {
                *o = $f(p, *o);
            }
        };
    }
    match op {
        ReduceOp::Sum | ReduceOp::Mean => each!(T::add),
        ReduceOp::Product => each!(T::mul),
        ReduceOp::Max => each!(T::max),
        ReduceOp::Min => each!(T::min),
    }
}
