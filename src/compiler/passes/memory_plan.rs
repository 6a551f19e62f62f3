//! `memory-plan`: assign every buffer an offset in one device heap.
//!
//! **Buffers** are entities ([`Buffer`]): one per parameter (arguments are
//! donated to the executable) and one per kernel output. Constants live in the
//! executable's constant pool and are not planned. Time step 0 is the program
//! entry; the kernel at position `p` runs at step `p + 1`; declared outputs
//! stay live to the end. A buffer is live from the step that defines it to
//! the last step that reads it, inclusive.
//!
//! **In place**: an output of a loop-fusion kernel takes over an input buffer
//! of the same type whose last reader is that kernel (the loop reads each
//! element before it writes it), so `p' = p - lr * ...` updates `p` in place.
//! Buffers sharing memory this way form one *allocation*.
//!
//! **Placement**: allocations, largest first, go to the best-fitting gap among
//! the already placed allocations whose live ranges overlap theirs (the idea of
//! XLA's `GlobalDecreasingSizeBestFitHeap`). Sizes round up to [`ALIGNMENT`].
//!
//! **Report** ([`MemoryPlan`]): `peak_bytes` (the heap size), `lower_bound_bytes`
//! (the maximum over time of the bytes of live allocations — no placement can
//! do better) and `fragmentation_bytes = peak - lower bound`.
//!
//! Reads kernels and their order; writes [`Buffer`] entities and
//! [`MemoryPlan`]. "Changed" means some buffer was planned. Cost: placed
//! allocations that overlap a newcomer in time are found with a segment tree
//! over time steps, so placement is `O(n log n)` plus the overlaps it must
//! inspect (as in any best-fit heap).
//!
//! **Sizes are checked**: rounding a buffer up to [`ALIGNMENT`], placing it
//! above another and summing live bytes use checked arithmetic; a program
//! whose plan would not fit in `usize` is an error naming the node, never a
//! wrapped small heap.

use bevy_ecs::entity::EntityHashMap;
use bevy_ecs::prelude::*;
use serde::Serialize;

use super::PassOutcome;
use super::fusion::{Kernel, ProgramKernels};
use crate::compiler::CompileError;
use crate::compiler::graph::{Node, ProgramOutputs, ValueType, program_nodes};
use crate::ir::op::Op;

/// The pass name.
pub const NAME: &str = "memory-plan";

pub use crate::memory::ALIGNMENT;

/// A planned buffer holding one value.
#[derive(Component, Debug, Clone)]
pub struct Buffer {
    /// The owning program.
    pub program: Entity,
    /// The node whose value it holds.
    pub value: Entity,
    /// Bytes (aligned).
    pub size: usize,
    /// Offset in the program's heap.
    pub offset: usize,
    /// First step the buffer is live.
    pub start: u32,
    /// Last step the buffer is live (inclusive).
    pub end: u32,
    /// Whether it reuses an input buffer in place.
    pub in_place: bool,
}

/// The memory plan of a program.
#[derive(Component, Debug, Clone, Default, Serialize)]
pub struct MemoryPlan {
    /// Heap bytes the plan needs.
    pub peak_bytes: usize,
    /// Maximum over time of live bytes.
    pub lower_bound_bytes: usize,
    /// `peak_bytes - lower_bound_bytes`.
    pub fragmentation_bytes: usize,
    /// Buffers reusing an input in place.
    #[serde(skip)]
    pub in_place: usize,
    /// The buffer entities.
    #[serde(skip)]
    pub buffers: Vec<Entity>,
}

/// Rounds up to [`ALIGNMENT`]; `None` when the result does not fit in `usize`.
fn aligned(bytes: usize) -> Option<usize> {
    bytes.div_ceil(ALIGNMENT).max(1).checked_mul(ALIGNMENT)
}

struct Value {
    node: Entity,
    size: usize,
    start: u32,
    end: u32,
    alloc: usize,
    in_place: bool,
}

#[derive(Clone)]
struct Allocation {
    size: usize,
    start: u32,
    end: u32,
    offset: usize,
}

/// Placed live ranges, queried by overlap: a segment tree over time steps
/// storing each range at its canonical nodes, with per-subtree counts so a
/// query only descends where something is stored. A query costs
/// `O(log T + hits * log T)` instead of a scan of everything placed.
struct LiveRangeIndex {
    leaves: usize,
    lists: Vec<Vec<u32>>,
    counts: Vec<u32>,
    stamp: Vec<u32>,
    query_id: u32,
}

impl LiveRangeIndex {
    fn new(steps: usize, ids: usize) -> Self {
        let leaves = steps.max(1).next_power_of_two();
        LiveRangeIndex {
            leaves,
            lists: vec![Vec::new(); 2 * leaves],
            counts: vec![0; 2 * leaves],
            stamp: vec![0; ids],
            query_id: 0,
        }
    }

    fn insert(&mut self, id: u32, start: usize, end: usize) {
        let mut stack = vec![(1usize, 0usize, self.leaves - 1)];
        while let Some((node, lo, hi)) = stack.pop() {
            if end < lo || hi < start {
                continue;
            }
            self.counts[node] += 1;
            if start <= lo && hi <= end {
                self.lists[node].push(id);
                continue;
            }
            let mid = (lo + hi) / 2;
            stack.push((2 * node, lo, mid));
            stack.push((2 * node + 1, mid + 1, hi));
        }
    }

    /// Every stored range overlapping `[start, end]`, each once.
    fn overlapping(&mut self, start: usize, end: usize, out: &mut Vec<u32>) {
        self.query_id += 1;
        let mut stack = vec![(1usize, 0usize, self.leaves - 1)];
        while let Some((node, lo, hi)) = stack.pop() {
            if end < lo || hi < start || self.counts[node] == 0 {
                continue;
            }
            for &id in &self.lists[node] {
                if self.stamp[id as usize] != self.query_id {
                    self.stamp[id as usize] = self.query_id;
                    out.push(id);
                }
            }
            if lo < hi {
                let mid = (lo + hi) / 2;
                stack.push((2 * node, lo, mid));
                stack.push((2 * node + 1, mid + 1, hi));
            }
        }
    }
}

/// Best fit over liveness: allocations, largest first, take the smallest gap
/// between the placed allocations whose live ranges overlap theirs (or go on
/// top). Returns the offset of each `(size, start, end)`, or `None` when some
/// allocation would end beyond `usize::MAX`.
pub fn best_fit(sizes_and_ranges: &[(usize, u32, u32)]) -> Option<Vec<usize>> {
    let mut order: Vec<usize> = (0..sizes_and_ranges.len()).collect();
    order.sort_by_key(|&i| {
        (
            std::cmp::Reverse(sizes_and_ranges[i].0),
            sizes_and_ranges[i].1,
            i,
        )
    });
    let steps = sizes_and_ranges
        .iter()
        .map(|r| r.2 as usize + 1)
        .max()
        .unwrap_or(1);
    let mut index = LiveRangeIndex::new(steps, sizes_and_ranges.len());
    let mut offsets = vec![0; sizes_and_ranges.len()];
    let mut hits = Vec::new();
    let mut busy: Vec<(usize, usize)> = Vec::new();
    for i in order {
        let (size, start, end) = sizes_and_ranges[i];
        hits.clear();
        index.overlapping(start as usize, end as usize, &mut hits);
        busy.clear();
        // Placed allocations were checked to end within `usize` when placed.
        busy.extend(hits.iter().map(|&j| {
            (
                offsets[j as usize],
                offsets[j as usize] + sizes_and_ranges[j as usize].0,
            )
        }));
        busy.sort_unstable();
        let mut best: Option<(usize, usize)> = None;
        let mut cursor: usize = 0;
        for &(lo, hi) in &busy {
            // `cursor <= lo` here only when the gap is real; a sum beyond
            // `usize` cannot fit below `lo`.
            if cursor.checked_add(size).is_some_and(|top| lo >= top) {
                let gap = lo - cursor;
                if best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, cursor));
                }
            }
            cursor = cursor.max(hi);
        }
        offsets[i] = best.map_or(cursor, |(_, at)| at);
        offsets[i].checked_add(size)?;
        index.insert(i as u32, start as usize, end as usize);
    }
    Some(offsets)
}

/// Maximum over time of the summed sizes of live ranges; `None` when it
/// exceeds `usize::MAX`.
pub fn lower_bound(sizes_and_ranges: &[(usize, u32, u32)]) -> Option<usize> {
    // i128 holds any sum of up to 2^63 sizes below 2^64 exactly.
    let mut events: Vec<(u64, i128)> = Vec::with_capacity(sizes_and_ranges.len() * 2);
    for &(size, start, end) in sizes_and_ranges {
        events.push((u64::from(start), size as i128));
        events.push((u64::from(end) + 1, -(size as i128)));
    }
    events.sort_unstable_by_key(|&(t, d)| (t, d));
    let (mut live, mut max) = (0i128, 0i128);
    for (_, d) in events {
        live += d;
        max = max.max(live);
    }
    usize::try_from(max).ok()
}

/// Plans the buffers of `program`.
pub fn run(world: &mut World, program: Entity) -> Result<PassOutcome, CompileError> {
    if let Some(old) = world.entity_mut(program).take::<MemoryPlan>() {
        for b in old.buffers {
            world.despawn(b);
        }
    }
    let kernels = world
        .get::<ProgramKernels>(program)
        .map(|k| k.0.clone())
        .unwrap_or_default();
    let (mut values, value_of) = live_values(world, program, &kernels)?;
    let in_place = reuse_in_place(world, &kernels, &value_of, &mut values);
    let (mut allocs, alloc_index) = allocations(&values);
    let ranges: Vec<(usize, u32, u32)> = allocs.iter().map(|a| (a.size, a.start, a.end)).collect();
    let overflow = || {
        let largest = values.iter().max_by_key(|v| v.size).map(|v| v.node);
        largest.map_or_else(
            || CompileError::Arguments("memory plan overflows usize".into()),
            |node| too_large(world, node),
        )
    };
    let offsets = best_fit(&ranges).ok_or_else(overflow)?;
    for (a, off) in allocs.iter_mut().zip(offsets) {
        a.offset = off;
    }
    // `best_fit` checked every `offset + size`.
    let peak = allocs.iter().map(|a| a.offset + a.size).max().unwrap_or(0);
    let bound = lower_bound(&ranges).ok_or_else(overflow)?;
    let buffers = spawn_buffers(world, program, &values, &allocs, &alloc_index);
    world.entity_mut(program).insert(MemoryPlan {
        peak_bytes: peak,
        lower_bound_bytes: bound,
        fragmentation_bytes: peak - bound,
        in_place,
        buffers,
    });
    Ok(PassOutcome::changed(!values.is_empty()))
}

/// The value's bytes rounded up to the alignment, or an error naming it.
fn value_size(world: &World, e: Entity) -> Result<usize, CompileError> {
    let bytes = world.get::<ValueType>(e).map_or(Some(0), |t| {
        t.0.element_count().checked_mul(t.0.dtype.byte_size())
    });
    bytes.and_then(aligned).ok_or_else(|| too_large(world, e))
}

/// Every value the program holds (parameters, then each kernel's outputs
/// in order) with its live range in kernel steps, and each value's index
/// by node. Parameters live from step 0, program outputs to the end.
fn live_values(
    world: &World,
    program: Entity,
    kernels: &[Entity],
) -> Result<(Vec<Value>, EntityHashMap<usize>), CompileError> {
    let end = kernels.len() as u32 + 1;
    let mut values: Vec<Value> = Vec::new();
    let mut value_of: EntityHashMap<usize> = EntityHashMap::default();
    for e in program_nodes(world, program) {
        if matches!(
            world.get::<Node>(e).map(|n| &n.op),
            Some(Op::Parameter { .. })
        ) {
            value_of.insert(e, values.len());
            values.push(Value {
                node: e,
                size: value_size(world, e)?,
                start: 0,
                end: 0,
                alloc: values.len(),
                in_place: false,
            });
        }
    }
    for (p, &k) in kernels.iter().enumerate() {
        let t = p as u32 + 1;
        let kernel = world.get::<Kernel>(k).expect("kernel");
        for &x in &kernel.inputs {
            if let Some(&v) = value_of.get(&x) {
                values[v].end = values[v].end.max(t);
            }
        }
        for &o in &kernel.outputs {
            value_of.insert(o, values.len());
            values.push(Value {
                node: o,
                size: value_size(world, o)?,
                start: t,
                end: t,
                alloc: values.len(),
                in_place: false,
            });
        }
    }
    for o in world
        .get::<ProgramOutputs>(program)
        .map(|o| o.0.clone())
        .unwrap_or_default()
    {
        if let Some(&v) = value_of.get(&o) {
            values[v].end = end;
        }
    }
    Ok((values, value_of))
}

/// Allocations: groups of values sharing memory (a value reused in place
/// joins its root's), and each value's allocation by node.
fn allocations(values: &[Value]) -> (Vec<Allocation>, EntityHashMap<usize>) {
    let mut allocs: Vec<Allocation> = Vec::new();
    let mut alloc_index: EntityHashMap<usize> = EntityHashMap::default();
    for i in 0..values.len() {
        let root = values[i].alloc;
        let a = if root == i {
            allocs.push(Allocation {
                size: values[i].size,
                start: values[i].start,
                end: values[i].end,
                offset: 0,
            });
            allocs.len() - 1
        } else {
            let a = alloc_index[&values[root].node];
            allocs[a].size = allocs[a].size.max(values[i].size);
            allocs[a].end = allocs[a].end.max(values[i].end);
            a
        };
        alloc_index.insert(values[i].node, a);
    }
    (allocs, alloc_index)
}

/// One [`Buffer`] entity per value, at its allocation's offset.
fn spawn_buffers(
    world: &mut World,
    program: Entity,
    values: &[Value],
    allocs: &[Allocation],
    alloc_index: &EntityHashMap<usize>,
) -> Vec<Entity> {
    let mut buffers = Vec::with_capacity(values.len());
    for v in values {
        let a = &allocs[alloc_index[&v.node]];
        buffers.push(
            world
                .spawn(Buffer {
                    program,
                    value: v.node,
                    size: v.size,
                    offset: a.offset,
                    start: v.start,
                    end: v.end,
                    in_place: v.in_place,
                })
                .id(),
        );
    }
    buffers
}

/// The error for a value (or a plan) whose bytes do not fit in `usize`.
fn too_large(world: &World, node: Entity) -> CompileError {
    CompileError::InvalidNode {
        node: crate::compiler::graph::node_label(world, node),
        message: format!(
            "its buffer is too large to plan: its bytes, rounded up to {ALIGNMENT}-byte \
             alignment and placed in one heap, overflow the address space"
        ),
    }
}

/// Lets outputs of loop-fusion kernels take over dead inputs of the same type.
fn reuse_in_place(
    world: &World,
    kernels: &[Entity],
    value_of: &EntityHashMap<usize>,
    values: &mut [Value],
) -> usize {
    let mut donated = vec![false; values.len()];
    let mut count = 0;
    for (p, &k) in kernels.iter().enumerate() {
        let t = p as u32 + 1;
        let kernel = world.get::<Kernel>(k).expect("kernel");
        if !kernel.fused {
            continue;
        }
        for &o in &kernel.outputs {
            let Some(ot) = world.get::<ValueType>(o) else {
                continue;
            };
            let donor = kernel
                .inputs
                .iter()
                .filter_map(|x| value_of.get(x).copied())
                .find(|&v| {
                    !donated[v]
                        && values[v].end == t
                        && world
                            .get::<ValueType>(values[v].node)
                            .is_some_and(|it| it.0 == ot.0)
                });
            if let Some(v) = donor {
                donated[v] = true;
                let o_index = value_of[&o];
                values[o_index].alloc = values[v].alloc;
                values[o_index].in_place = true;
                count += 1;
            }
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_matches_a_plain_scan_and_never_overlaps() {
        // Pseudo-random ranges; compare against the definition.
        let mut state = 7u64;
        let mut next = |m: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % m
        };
        let r: Vec<(usize, u32, u32)> = (0..300)
            .map(|_| {
                let s = next(50) as u32;
                (64 * (1 + next(8) as usize), s, s + next(10) as u32)
            })
            .collect();
        let off = best_fit(&r).unwrap();
        for i in 0..r.len() {
            for j in i + 1..r.len() {
                let time = r[i].1 <= r[j].2 && r[j].1 <= r[i].2;
                let mem = off[i] < off[j] + r[j].0 && off[j] < off[i] + r[i].0;
                assert!(!(time && mem), "{i} and {j} overlap");
            }
        }
        let peak = (0..r.len()).map(|i| off[i] + r[i].0).max().unwrap();
        assert!(peak >= lower_bound(&r).unwrap());
    }

    #[test]
    fn best_fit_reuses_dead_space_and_never_overlaps_live_ranges() {
        // a [0,1], b [0,3], c [2,3] same size as a: c reuses a's space.
        let r = [(64, 0, 1), (128, 0, 3), (64, 2, 3)];
        let off = best_fit(&r).unwrap();
        assert_eq!(off[2], off[0]);
        assert_eq!(lower_bound(&r), Some(192));
        assert_eq!(off.iter().zip(&r).map(|(o, s)| o + s.0).max().unwrap(), 192);
    }

    #[test]
    fn sizes_that_overflow_are_errors_not_wraps() {
        assert_eq!(aligned(usize::MAX - 10), None);
        assert_eq!(aligned(1), Some(ALIGNMENT));
        let max_aligned = usize::MAX / ALIGNMENT * ALIGNMENT;
        assert_eq!(aligned(max_aligned), Some(max_aligned));
        // Two live buffers whose sum overflows: no placement, no bound.
        let r = [(max_aligned, 0, 1), (max_aligned, 0, 1)];
        assert_eq!(best_fit(&r), None);
        assert_eq!(lower_bound(&r), None);
        // Not live together: they share the space.
        let r = [(max_aligned, 0, 1), (max_aligned, 2, 3)];
        assert_eq!(best_fit(&r), Some(vec![0, 0]));
        assert_eq!(lower_bound(&r), Some(max_aligned));
    }
}
