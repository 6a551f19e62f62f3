//! One all-gather pass of a split grid: each owned chunk sent once to
//! every other rank on its line, landing in one member's buffer there and
//! copied from it to that rank's other members.

use std::ops::Range;

use super::{RankedGrid, chunks_of, lines, pieces, shared, take};
use crate::collectives::element::Element;
use crate::transport::ClusterError;
use crate::transport::cluster::{Exchange, RankContext};

/// A chunk that lands from another rank in one member's buffer, and the
/// rank's other members that copy it from there.
struct Copies<'s, T> {
    others: Vec<&'s mut [T]>,
}

impl<T: Element> RankedGrid<'_, '_, T> {
    /// The all-gather pass along `dim`, every member's chunk of `wide`
    /// (its range before the reduce-scatter's pass along `dim`) its own.
    pub(super) fn gather_pass(
        &mut self,
        ctx: &RankContext,
        dim: usize,
        wide: &[Range<usize>],
        first: &[usize],
        tag: u64,
    ) -> Result<(), ClusterError> {
        let me = ctx.layout.rank();
        let n = self.grid.dims()[dim];
        let rank_of = self.rank_of;
        let mut chunks = chunks_of(self.local, wide, first, n);
        let mut sends: Vec<(u32, &[u8])> = Vec::new();
        let mut receives: Vec<(u32, &mut [u8])> = Vec::new();
        // Each receive's copies and piece.
        let mut landing: Vec<(usize, Range<usize>)> = Vec::new();
        let mut copies: Vec<Copies<'_, T>> = Vec::new();
        for line in lines(self.grid.dims(), dim) {
            // The other ranks on the line, in line order.
            let mut ranks: Vec<u32> = Vec::new();
            for &p in &line {
                if rank_of[p] != me && !ranks.contains(&rank_of[p]) {
                    ranks.push(rank_of[p]);
                }
            }
            for (c, &owner) in line.iter().enumerate() {
                let source = (rank_of[owner] == me).then(|| shared(take(&mut chunks, owner, c)));
                let mut mine = line
                    .iter()
                    .filter(|&&k| k != owner && rank_of[k] == me)
                    .map(|&k| take(&mut chunks, k, c))
                    .collect::<Vec<_>>()
                    .into_iter();
                if let Some(source) = source {
                    for piece in pieces::<T>(source.len()) {
                        let bytes: &[u8] = bytemuck::cast_slice(&source[piece]);
                        sends.extend(ranks.iter().map(|&r| (r, bytes)));
                    }
                    for target in mine {
                        target.copy_from_slice(source);
                    }
                    continue;
                }
                let Some(first) = mine.next() else {
                    continue;
                };
                let group = copies.len();
                copies.push(Copies {
                    others: mine.collect(),
                });
                let mut rest: &mut [T] = first;
                for piece in pieces::<T>(rest.len()) {
                    let (head, tail) = std::mem::take(&mut rest).split_at_mut(piece.len());
                    rest = tail;
                    receives.push((rank_of[owner], bytemuck::cast_slice_mut(head)));
                    landing.push((group, piece));
                }
            }
        }
        let exchange = Exchange {
            tag,
            sends,
            receives,
        };
        ctx.exchange(exchange, "a collective's data", &mut |index, bytes| {
            let (group, piece) = &landing[index];
            let values: &[T] =
                bytemuck::try_cast_slice(bytes).map_err(|e| ClusterError::Protocol {
                    rank: me,
                    what: format!("a piece that is not whole elements ({e})"),
                })?;
            for other in &mut copies[*group].others {
                other[piece.clone()].copy_from_slice(values);
            }
            Ok(())
        })
    }
}
