//! The sharded step on a pod split over ranks (`pod::ranks`): each rank
//! holds its devices' state shards and its replicas' gradients, and the
//! step's collectives move data between ranks on their own schedule
//! ([`crate::collectives::ranked`]).
//!
//! * **Reduce-scatter.** Per bucket, each rank fills its replicas' gradient
//!   buffers from the gradient source (only its own replicas are asked
//!   for) and runs the bucket's reduce-scatter over the layout's grid;
//!   each local device keeps its owned shard of the reduced gradient. The
//!   fold order is the grid's, so the bits are the one-process step's.
//! * **Update.** Each rank runs the compiled update on its devices' shards
//!   only (`step::commit_sharded_step`).
//! * **All-gather.** The updated parameter shards go to every rank along
//!   the all-gather schedule, so every rank ends with the whole parameter
//!   vector, as every host of a pod holds its replica's parameters.
//! * **Redundant copies** of state shards whose peer device is on another
//!   rank travel to it as one data frame per owner and slot.
//! * **What the service knows.** A device declared failed is known to rank
//!   0's detector only; the step's launch and each tick's watch take rank
//!   0's list, so every rank fails the step alike.
//!
//! Link accounting and the model of time are unchanged: every rank charges
//! the whole step's schedule to the links (it is part of the scenario
//! every rank holds), so the merged world is the one-process world.

use bevy_ecs::prelude::*;

use super::error::ShardingError;
use super::gradients::GradientSource;
use super::layout::ShardLayout;
use crate::collectives::ReduceOp;
use crate::collectives::ranked::{RankedGrid, local_prefix, prefix_ranges};
use crate::ir::FloatElement;
use crate::memory::ShardSlot;
use crate::topology::DeviceId;
use crate::transport::cluster::{RankContext, data_payload};
use rayon::prelude::*;

/// A marker on a [`ShardSlot`] another rank holds: this rank keeps the
/// entity (so entity ids, heaps and the model's bookkeeping stay the same
/// on every rank) but not the values, which it never reads.
#[derive(Component, Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldElsewhere {
    /// The rank that holds the values.
    pub rank: u32,
}

/// The job's ranks, when the pod is split over more than one.
pub fn context(world: &World) -> Option<RankContext> {
    world
        .get_resource::<RankContext>()
        .filter(|c| c.layout.ranks() > 1)
        .cloned()
}

/// The grid positions of the block of `pos` along the first `prefix`
/// dimensions (in the block's own linear order), and `pos`'s index in it.
pub(super) fn block_of(
    grid: &crate::collectives::ReduceGrid,
    prefix: usize,
    pos: usize,
) -> (Vec<usize>, usize) {
    // The leading dimensions vary fastest in `x + X·(y + Y·z)`: the block
    // is the contiguous run of positions around `pos`.
    let size: usize = grid.dims()[..prefix].iter().product();
    let base = pos - pos % size;
    ((base..base + size).collect(), pos % size)
}

/// The frame tag of a step's collective: the step, the bucket, the phase.
fn tag(step: u64, bucket: usize, phase: u64) -> u64 {
    (step << 24) ^ ((bucket as u64) << 2) ^ phase
}

/// Each grid position's rank, and the replica at each position.
pub(super) fn placement(
    layout: &ShardLayout,
    ctx: &RankContext,
) -> (crate::collectives::ReduceGrid, Vec<u32>) {
    let (grid, _) = layout.grid();
    let rank_of = grid
        .members()
        .iter()
        .map(|&m| ctx.layout.rank_of_device(DeviceId(m as u32)))
        .collect();
    (grid, rank_of)
}

/// A buffer of at least `len` elements of `A` for each of this rank's
/// members (by grid position; `None` for other ranks'), from the
/// context's pool: contents unspecified.
fn member_buffers<A: FloatElement>(
    ctx: &RankContext,
    rank_of: &[u32],
    len: usize,
) -> Vec<Option<Vec<u64>>> {
    let words = (len * std::mem::size_of::<A>()).div_ceil(8);
    let me = ctx.layout.rank();
    rank_of
        .iter()
        .map(|&rank| (rank == me).then(|| ctx.buffers.take(words)))
        .collect()
}

/// The first `len` elements of each kept buffer, as `A`.
fn as_elements<A: FloatElement>(
    kept: &mut [Option<Vec<u64>>],
    len: usize,
) -> Vec<Option<&mut [A]>> {
    kept.iter_mut()
        .map(|b| {
            b.as_mut()
                .map(|words| &mut bytemuck::cast_slice_mut::<u64, A>(words)[..len])
        })
        .collect()
}

/// The grid positions of this rank's first block along the first
/// `prefix` dimensions (whose members' ranges after them are disjoint and
/// cover a bucket), and `rank_of` with that block's positions marked
/// `u32::MAX` (the members that need buffers of their own).
fn first_block(
    grid: &crate::collectives::ReduceGrid,
    rank_of: &[u32],
    prefix: usize,
    me: u32,
) -> (Option<std::ops::Range<usize>>, Vec<u32>) {
    let size: usize = grid.dims()[..prefix].iter().product();
    let block = rank_of
        .iter()
        .position(|&r| r == me)
        .map(|p| p - p % size..p - p % size + size);
    let outside = rank_of
        .iter()
        .enumerate()
        .map(|(pos, &r)| match &block {
            Some(b) if b.contains(&pos) => u32::MAX,
            _ => r,
        })
        .collect();
    (block, outside)
}

/// Cuts `region` (a bucket's elements) into the windows of the members
/// at grid positions `members`, their `pre` ranges (disjoint), as those
/// members' buffers, and records where each starts.
pub(super) fn place_windows<'w, A>(
    region: &'w mut [A],
    members: impl IntoIterator<Item = usize>,
    pre: &[std::ops::Range<usize>],
    buffers: &mut [Option<&'w mut [A]>],
    first: &mut [usize],
) {
    let mut order: Vec<usize> = members.into_iter().collect();
    order.sort_by_key(|&pos| pre[pos].start);
    let mut rest: &'w mut [A] = region;
    let mut at = 0;
    for pos in order {
        let range = pre[pos].clone();
        if range.is_empty() {
            buffers[pos] = Some(&mut []);
            first[pos] = range.start;
            continue;
        }
        let tail = std::mem::take(&mut rest).split_at_mut(range.start - at).1;
        let (window, tail) = tail.split_at_mut(range.len());
        buffers[pos] = Some(window);
        first[pos] = range.start;
        rest = tail;
        at = range.end;
    }
}

/// The passes along the first `prefix` dimensions, whose lines stay on
/// one rank: each of this rank's members' `pre` range (`buffers[p]`, whose
/// element 0 is the member's element `first[p]`) gets its block's fold of
/// the bucket at `offset`, streamed from the gradient source (the order of
/// `ReduceGrid` over the block), the members on both cores.
pub(super) fn fold_local_blocks<A: FloatElement>(
    (layout, offset, source): (&ShardLayout, usize, &dyn GradientSource<A>),
    (grid, prefix, pre): (
        &crate::collectives::ReduceGrid,
        usize,
        &[std::ops::Range<usize>],
    ),
    buffers: &mut [Option<&mut [A]>],
    first: &[usize],
) {
    let elements = layout.elements;
    buffers
        .par_iter_mut()
        .enumerate()
        .filter_map(|(pos, b)| b.as_mut().map(|b| (pos, b)))
        .for_each(|(pos, buf)| {
            let range = pre[pos].clone();
            let start = range.start;
            let (block_grid, owner) = block_of(grid, prefix, pos);
            let mut fill = |member: usize, at: usize, out: &mut [A]| {
                let device = grid.members()[block_grid[member]];
                let replica = layout
                    .replica_of(DeviceId(device as u32))
                    .expect("the grid's members are the participants");
                let from = offset + start + at;
                let real = elements.saturating_sub(from).min(out.len());
                source.fill(replica, from, &mut out[..real]);
                out[real..].fill(A::ZERO);
            };
            let block = crate::collectives::ReduceGrid::torus(&grid.dims()[..prefix]);
            let at = range.start - first[pos]..range.end - first[pos];
            block.reduce_for(owner, ReduceOp::Sum, &mut buf[at], &mut fill);
        });
}

/// Returns the members' buffers to the context's pool.
fn give_back(ctx: &RankContext, kept: Vec<Option<Vec<u64>>>) {
    for buffer in kept.into_iter().flatten() {
        ctx.buffers.give(buffer);
    }
}

/// With every replica holding the reduced gradient already, this rank's
/// devices' shards of bucket `b`, taken from it with no traffic.
fn take_reduced_shards<A: FloatElement>(
    layout: &ShardLayout,
    b: usize,
    source: &dyn GradientSource<A>,
    ctx: &RankContext,
    reduced: &mut [A],
) {
    let elements = layout.elements;
    for (r, &device) in layout.participants.iter().enumerate() {
        if ctx.layout.is_local(device) {
            let range = layout.shard_range(r, b);
            let real = elements.saturating_sub(range.start).min(range.len());
            let out = &mut reduced[range.clone()];
            source.fill(0, range.start, &mut out[..real]);
            out[real..].fill(A::ZERO);
        }
    }
}

/// After bucket `b`'s reduce-scatter: each of this rank's members owns the
/// shard the layout gives it (else the layout and the schedule disagree,
/// an error), and a member that folded in a buffer of its own (not in
/// `reduced`) copies its owned range there.
pub(super) fn keep_owned_shards<A: FloatElement>(
    layout: &ShardLayout,
    b: usize,
    (grid, rank_of, me): (&crate::collectives::ReduceGrid, &[u32], u32),
    (owned, buffers): (&[std::ops::Range<usize>], &[Option<&mut [A]>]),
    reduced: &mut [A],
) -> Result<(), ShardingError> {
    let offset = layout.buckets[b].offset;
    for (pos, &member) in grid.members().iter().enumerate() {
        if rank_of[pos] != me {
            continue;
        }
        let r = layout
            .replica_of(DeviceId(member as u32))
            .expect("the grid's members are the participants");
        let shard = layout.shard_range(r, b);
        let mine = owned[pos].start + offset..owned[pos].end + offset;
        if mine != shard {
            return Err(ShardingError::InvalidState {
                reason: format!(
                    "the reduce-scatter left {} with elements {mine:?}, but the layout gives it \
                     {shard:?}",
                    layout.participants[r]
                ),
            });
        }
        if let Some(values) = &buffers[pos] {
            reduced[shard].copy_from_slice(&values[owned[pos].clone()]);
        }
    }
    Ok(())
}

/// The reduced gradient of this rank's shards (other shards are left as
/// they are), reduce-scattered bucket by bucket across the ranks.
pub fn reduce_gradients<A: FloatElement>(
    layout: &ShardLayout,
    buffer: Option<Vec<A>>,
    source: &dyn GradientSource<A>,
    op: ReduceOp,
    ctx: &RankContext,
    step: u64,
) -> Result<Vec<A>, ShardingError> {
    let mut reduced = buffer.unwrap_or_else(|| vec![A::ZERO; layout.padded_elements()]);
    let (grid, rank_of) = placement(layout, ctx);
    let me = ctx.layout.rank();
    if !source.is_reduced()
        && super::ranked_shared::reduce_in_shared_memory(layout, &mut reduced, source, op, ctx)?
    {
        return Ok(reduced);
    }
    let prefix = local_prefix(grid.dims(), &rank_of);
    let (block, outside) = first_block(&grid, &rank_of, prefix, me);
    for (b, bucket) in layout.buckets.iter().enumerate() {
        let pre = prefix_ranges(grid.dims(), bucket.padded_len, prefix);
        if source.is_reduced() {
            take_reduced_shards(layout, b, source, ctx, &mut reduced);
            continue;
        }
        // Leading dimensions whose lines stay on one rank are folded here,
        // streamed from the source into each member's range after them
        // (the order of ReduceGrid over that block); only the rest of the
        // schedule crosses ranks. The first block's members fold straight
        // in `reduced` (their ranges are disjoint and cover the bucket, and
        // each owner's shard is where `reduced` keeps it; the rest of a
        // range, sent to other ranks, lands on shards this rank does not
        // hold). Other members' buffers are the context's, kept from the
        // last bucket and step: each member writes its range before
        // reading it.
        let len = bucket.padded_len;
        let mut kept = member_buffers::<A>(ctx, &outside, len);
        let result = (|| -> Result<Vec<std::ops::Range<usize>>, ShardingError> {
            let mut buffers = as_elements::<A>(&mut kept, len);
            let mut first = vec![0; grid.len()];
            let region = &mut reduced[bucket.offset..bucket.offset + len];
            place_windows(
                region,
                block.clone().into_iter().flatten(),
                &pre,
                &mut buffers,
                &mut first,
            );
            fold_local_blocks(
                (layout, bucket.offset, source),
                (&grid, prefix, &pre),
                &mut buffers,
                &first,
            );
            Ok(RankedGrid {
                grid: &grid,
                rank_of: &rank_of,
                local: &mut buffers,
                tag: tag(step, b, 0),
                window: Some((len, &first)),
            }
            .reduce_scatter_from(ctx, op, prefix)?)
        })();
        let result = result.and_then(|owned| {
            let buffers = as_elements::<A>(&mut kept, len);
            let placed = (&grid, &rank_of[..], me);
            keep_owned_shards(layout, b, placed, (&owned, &buffers), &mut reduced)
        });
        give_back(ctx, kept);
        result?;
    }
    Ok(reduced)
}

/// After the update: every bucket's parameter shards, all-gathered from
/// their devices' ranks into `params` on every rank.
pub fn gather_params<A: FloatElement>(
    layout: &ShardLayout,
    params: &mut [A],
    ctx: &RankContext,
    step: u64,
) -> Result<(), ShardingError> {
    if super::ranked_shared::gather_in_shared_memory(layout, params, ctx)? {
        return Ok(());
    }
    let (grid, rank_of) = placement(layout, ctx);
    let me = ctx.layout.rank();
    let prefix = local_prefix(grid.dims(), &rank_of);
    // The first block of this rank's members along the local dimensions:
    // their ranges after those dimensions are disjoint and cover the
    // bucket, so they gather straight into `params` (each its window of
    // it, holding its own updated shard already). Members of other blocks
    // on this rank gather into buffers of the context's.
    let (block, outside) = first_block(&grid, &rank_of, prefix, me);
    for (b, bucket) in layout.buckets.iter().enumerate() {
        let whole = bucket.offset..bucket.offset + bucket.padded_len;
        let owned = crate::collectives::ranked::grid_shard_ranges(grid.dims(), bucket.padded_len);
        let pre = prefix_ranges(grid.dims(), bucket.padded_len, prefix);
        let mut kept = member_buffers::<A>(ctx, &outside, bucket.padded_len);
        let mut buffers = as_elements::<A>(&mut kept, bucket.padded_len);
        for (pos, buf) in buffers.iter_mut().enumerate() {
            if let Some(buf) = buf {
                let r = owned[pos].clone();
                buf[r.clone()].copy_from_slice(&params[whole.start + r.start..whole.start + r.end]);
            }
        }
        let mut first = vec![0; grid.len()];
        place_windows(
            &mut params[whole],
            block.clone().into_iter().flatten(),
            &pre,
            &mut buffers,
            &mut first,
        );
        let gathered = RankedGrid {
            grid: &grid,
            rank_of: &rank_of,
            local: &mut buffers,
            tag: tag(step, b, 1),
            window: Some((bucket.padded_len, &first)),
        }
        .all_gather_from(ctx, prefix);
        drop(buffers);
        give_back(ctx, kept);
        gathered?;
    }
    Ok(())
}

/// Sends each local primary state shard whose redundant copy lives on
/// another rank, and writes the copies this rank holds from their owners'
/// frames (local owners' copies are written by the caller).
pub fn refresh_remote_copies<A: FloatElement>(
    world: &mut World,
    ctx: &RankContext,
    step: u64,
) -> Result<(), ShardingError> {
    let me = ctx.layout.rank();
    let mut q = world.query::<(Entity, &ShardSlot)>();
    let mut pairs: Vec<(DeviceId, u32, DeviceId, Entity)> = q
        .iter(world)
        .filter(|(_, s)| s.owner != s.device)
        .map(|(e, s)| (s.owner, s.index, s.device, e))
        .collect();
    pairs.sort();
    let mut primaries = std::collections::BTreeMap::new();
    for (e, s) in q.iter(world) {
        if s.owner == s.device {
            primaries.insert((s.owner, s.index), e);
        }
    }
    for &(owner, index, holder, _) in &pairs {
        let (from, to) = (
            ctx.layout.rank_of_device(owner),
            ctx.layout.rank_of_device(holder),
        );
        if from == me && to != me {
            let primary = primaries.get(&(owner, index)).copied().ok_or_else(|| {
                ShardingError::InvalidState {
                    reason: format!("{owner} has no shard of slot {index}"),
                }
            })?;
            let slot = world.get::<ShardSlot>(primary).expect("queried");
            let values: &[u8] = bytemuck::cast_slice(super::model::flat_of::<A>(&slot.tensor)?);
            let mut frame = ctx.data_frame(copy_tag(step, owner, index), values.len())?;
            frame.extend_from_slice(values);
            ctx.send_data(to, frame)?;
        }
    }
    for &(owner, index, holder, copy) in &pairs {
        let (from, to) = (
            ctx.layout.rank_of_device(owner),
            ctx.layout.rank_of_device(holder),
        );
        if to == me && from != me {
            let frame = ctx.receive_data(from, copy_tag(step, owner, index), "a state copy")?;
            let payload = data_payload(&frame);
            let mut slot = world.get_mut::<ShardSlot>(copy).expect("queried");
            let values = super::model::flat_of_mut::<A>(&mut slot.tensor)?;
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(values);
            if bytes.len() != payload.len() {
                return Err(crate::transport::ClusterError::Protocol {
                    rank: from,
                    what: format!(
                        "{} bytes of {owner}'s state copy where {} were due",
                        payload.len(),
                        bytes.len()
                    ),
                }
                .into());
            }
            bytes.copy_from_slice(payload);
            ctx.recycle(frame);
        }
    }
    Ok(())
}

fn copy_tag(step: u64, owner: DeviceId, index: u32) -> u64 {
    (step << 24) ^ (u64::from(owner.0) << 8) ^ (u64::from(index) << 2) ^ 2
}

/// Marks the state shards other ranks hold as [`HeldElsewhere`] and drops
/// their values here (after a model was installed alike on every rank:
/// at start, on a restore, after a recovery's re-shard).
pub fn hold_own_shards(world: &mut World, layout: &crate::transport::cluster::RankLayout) {
    let slots: Vec<(Entity, DeviceId)> = world
        .query_filtered::<(Entity, &ShardSlot), Without<HeldElsewhere>>()
        .iter(world)
        .map(|(e, s)| (e, s.device))
        .collect();
    for (entity, device) in slots {
        if layout.is_local(device) {
            continue;
        }
        let mut entity = world.entity_mut(entity);
        let mut slot = entity.get_mut::<ShardSlot>().expect("queried");
        let dtype = slot.tensor.dtype();
        slot.tensor = crate::ir::Tensor::zeros(&crate::ir::TensorType::new(dtype, [0]));
        entity.insert(HeldElsewhere {
            rank: layout.rank_of_device(device),
        });
    }
}

/// Every rank's state shards (primaries and redundant copies) on every
/// rank, each rank's own values sent once to each other rank: what a
/// redundant recovery reads to rebuild the state a lost device held.
pub fn all_slots<A: FloatElement>(
    world: &mut World,
    ctx: &RankContext,
    step: u64,
) -> Result<Vec<ShardSlot>, ShardingError> {
    let me = ctx.layout.rank();
    let held: Vec<ShardSlot> = world
        .query_filtered::<&ShardSlot, Without<HeldElsewhere>>()
        .iter(world)
        .cloned()
        .collect();
    let wire: Vec<(u32, u32, String, u32, Vec<u8>)> = held
        .iter()
        .map(|s| {
            let values =
                super::model::flat_of::<A>(&s.tensor).map(|v| bytemuck::cast_slice(v).to_vec());
            values.map(|v| (s.device.0, s.owner.0, s.name.clone(), s.index, v))
        })
        .collect::<Result<_, _>>()?;
    let encoded = postcard::to_stdvec(&wire).expect("slots encode");
    let tag = (step << 24) ^ 3;
    for to in (0..ctx.layout.ranks()).filter(|&r| r != me) {
        let mut frame = ctx.data_frame(tag, encoded.len())?;
        frame.extend_from_slice(&encoded);
        ctx.send_data(to, frame)?;
    }
    let mut all = held;
    for from in (0..ctx.layout.ranks()).filter(|&r| r != me) {
        let frame = ctx.receive_data(from, tag, "the state shards for a recovery")?;
        let theirs: Vec<(u32, u32, String, u32, Vec<u8>)> =
            postcard::from_bytes(data_payload(&frame)).map_err(|e| {
                crate::transport::ClusterError::Protocol {
                    rank: from,
                    what: format!("state shards that do not decode ({e})"),
                }
            })?;
        for (device, owner, name, index, bytes) in theirs {
            let mut values = vec![A::ZERO; bytes.len() / std::mem::size_of::<A>()];
            bytemuck::cast_slice_mut::<A, u8>(&mut values).copy_from_slice(&bytes);
            all.push(ShardSlot {
                device: DeviceId(device),
                owner: DeviceId(owner),
                name,
                index,
                tensor: super::model::flat_tensor(values),
            });
        }
        ctx.recycle(frame);
    }
    Ok(all)
}
