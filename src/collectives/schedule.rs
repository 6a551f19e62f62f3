//! The link schedule of a torus reduce-scatter or all-gather over a set of
//! axes: which part of the data runs on which axis in which round, and the
//! transfers that makes. [`super::cost`] is its closed form.
//!
//! **Parts.** The data split into `k` parts, `k` = the axes of extent > 1
//! the collective spans. Part `p` runs the axes in rotated order
//! (`p, p+1, …` mod `k`), so in round `r` axis `(p + r) mod k` carries part
//! `p`: every axis's links carry one part per round, the passes of a round
//! run at once on disjoint links, and a round lasts its slowest pass. The
//! parts are cut from each owner's shard, so every message is an exact
//! number of elements: part `p` is, in every owner's shard of `s`
//! elements, the sub-range [`AxisPlan::part_range`] (`chunk_range(s, k,
//! p)` when the first round's passes cost the same per element; otherwise
//! sized so they do: an 8-chip ring takes `7/8` of its segment's time
//! where a 4-chip ring takes `3/4`, so its first part is smaller).
//!
//! **Passes.** A pass along axis `a` moves, on every line of `a`, the
//! segment its devices hold: per owner still in the device's group, that
//! owner's part. A ring of more than 2 chips with wraparound splits the
//! part once more (`chunk_range(|part|, 2, h)`) and runs half `h = 0`
//! forwards, `h = 1` backwards, in the same `n − 1` steps on opposite link
//! directions (the book's bidirectional ring: `(n−1)/n · V / (2β)`). A line
//! without wraparound runs two ways (`RingRoute::line_messages`, `(n−1) ·
//! (V/n) / β`), and a 2-chip axis, one link pair, its plain 2-ring.
//!
//! **Ownership and values.** Which range a device owns afterwards is fixed
//! by its coordinates ([`super::torus_shard_ranges`]); only the route each
//! part takes depends on the schedule. The values are combined in the one
//! order the crate uses on every path ([`super::ReduceGrid`]), as for the
//! two-way line: this is the schedule of the links, not of the arithmetic.

use std::ops::Range;

use super::ring::{RingRoute, chunk_range};
use super::torus::TorusShape;
use super::traffic::{Phase, PhaseKind, Traffic, Transfer};

/// How the lines of one axis run a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LineKind {
    /// A ring of 3 or more chips with wraparound: half the part each way.
    Bidirectional,
    /// Two chips, one link pair: the plain 2-ring.
    Pair,
    /// A line without wraparound, run two ways.
    TwoWayLine,
}

impl LineKind {
    pub(super) fn of(shape: &TorusShape, axis: usize) -> LineKind {
        let n = shape.dims()[axis];
        if n == 2 {
            LineKind::Pair
        } else if shape.wraparound()[axis] {
            LineKind::Bidirectional
        } else {
            LineKind::TwoWayLine
        }
    }

    /// Directions a part splits into.
    pub(super) fn halves(self) -> usize {
        match self {
            LineKind::Bidirectional => 2,
            _ => 1,
        }
    }
}

/// The axes a collective spans and how its data splits into parts.
#[derive(Debug, Clone)]
pub(super) struct AxisPlan {
    /// Axes of extent > 1, in the caller's order (first occurrence kept).
    pub active: Vec<usize>,
    /// Part `p`'s share of a shard, proportional to the inverse of its
    /// first pass's cost per element.
    weights: Vec<u128>,
}

impl AxisPlan {
    /// The plan over `axes` of `shape`. Axes outside the shape, repeated
    /// or of extent 1 move nothing and are left out.
    pub(super) fn new(shape: &TorusShape, axes: &[usize]) -> AxisPlan {
        let dims = shape.dims();
        let mut active: Vec<usize> = Vec::with_capacity(axes.len());
        for &a in axes {
            if a < dims.len() && dims[a] > 1 && !active.contains(&a) {
                active.push(a);
            }
        }
        // A pass's time per element of segment is (n−1)/n for a
        // bidirectional ring over the two directions, 2(n−1)/n otherwise
        // (in units of one direction's bandwidth, halved): the weight of
        // the part that starts on axis a is n_a / ((n_a − 1)·g_a), scaled
        // to integers by the product of the others' denominators.
        let denominator = |a: usize| -> u128 {
            let g = if LineKind::of(shape, a) == LineKind::Bidirectional {
                1
            } else {
                2
            };
            (dims[a] as u128 - 1) * g
        };
        let weights = active
            .iter()
            .map(|&a| {
                active
                    .iter()
                    .filter(|&&b| b != a)
                    .fold(dims[a] as u128, |w, &b| w * denominator(b))
            })
            .collect();
        AxisPlan { active, weights }
    }

    /// The plan over every axis of `shape`, in dimension order.
    pub(super) fn all(shape: &TorusShape) -> AxisPlan {
        let axes: Vec<usize> = (0..shape.dims().len()).collect();
        AxisPlan::new(shape, &axes)
    }

    /// Parts (and rounds) of the schedule.
    pub(super) fn parts(&self) -> usize {
        self.active.len()
    }

    /// The axis part `part` runs in round `round` (of the reduce-scatter).
    pub(super) fn axis(&self, part: usize, round: usize) -> usize {
        self.active[(part + round) % self.active.len()]
    }

    /// Devices of one group (the product of the active extents).
    pub(super) fn group_size(&self, shape: &TorusShape) -> usize {
        self.active.iter().map(|&a| shape.dims()[a]).product()
    }

    /// Part `part`'s sub-range of a shard of `s` elements.
    pub(super) fn part_range(&self, s: usize, part: usize) -> Range<usize> {
        let k = self.weights.len();
        if self.weights.iter().all(|&w| w == self.weights[0]) {
            return chunk_range(s, k, part);
        }
        let total: u128 = self.weights.iter().sum();
        let boundary = |p: usize| -> usize {
            let before: u128 = self.weights[..p].iter().sum();
            // before ≤ total, so the quotient is at most s.
            (s as u128 * before / total) as usize
        };
        boundary(part)..boundary(part + 1)
    }

    /// Each device's range of a `len`-element buffer after the
    /// reduce-scatter: narrowed along the active axes in order (for every
    /// axis of a torus in dimension order, [`super::torus_shard_ranges`]).
    pub(super) fn shard_ranges(&self, shape: &TorusShape, len: usize) -> Vec<Range<usize>> {
        let mut ranges: Vec<Range<usize>> = vec![0..len; shape.device_count()];
        for &a in &self.active {
            shape.narrow(a, &mut ranges);
        }
        ranges
    }
}

/// Records the schedule's passes of `kind` (a reduce-scatter, or the
/// all-gather that undoes it: the rounds reversed) from order
/// `first_order`, one order per round; returns the next free order.
pub(super) fn record_schedule(
    traffic: &mut Traffic,
    shape: &TorusShape,
    plan: &AxisPlan,
    len: usize,
    elem: usize,
    kind: PhaseKind,
    first_order: u32,
) -> u32 {
    let k = plan.parts();
    if k == 0 {
        return first_order;
    }
    let owners = plan.shard_ranges(shape, len);
    // Part sizes per distinct shard length (at most two when lengths are
    // near-equal).
    let mut sizes_of: Vec<(usize, Vec<usize>)> = Vec::new();
    let sizes: Vec<usize> = owners
        .iter()
        .map(|r| {
            let s = r.len();
            match sizes_of.iter().position(|(len, _)| *len == s) {
                Some(i) => i,
                None => {
                    sizes_of.push((s, (0..k).map(|p| plan.part_range(s, p).len()).collect()));
                    sizes_of.len() - 1
                }
            }
        })
        .collect();
    let part_len = |owner: usize, part: usize| sizes_of[sizes[owner]].1[part];
    for round in 0..k {
        let rs_round = match kind {
            PhaseKind::AllGather => k - 1 - round,
            _ => round,
        };
        let order = first_order + round as u32;
        let mut passes: Vec<(usize, usize)> = (0..k).map(|p| (plan.axis(p, rs_round), p)).collect();
        passes.sort_unstable();
        for (axis, part) in passes {
            let pass = Pass {
                shape,
                plan,
                part,
                round: rs_round,
                axis,
            };
            pass.record(traffic, &part_len, elem, kind, order);
        }
    }
    first_order + k as u32
}

/// One part's pass along one axis.
struct Pass<'a> {
    shape: &'a TorusShape,
    plan: &'a AxisPlan,
    part: usize,
    /// The reduce-scatter round it is in.
    round: usize,
    axis: usize,
}

impl Pass<'_> {
    /// Per line of the axis (in [`TorusShape::lines`] order) and chunk
    /// (the owners whose coordinate along the axis is `c`), the bytes of
    /// each direction's message.
    fn chunk_bytes(
        &self,
        part_len: &impl Fn(usize, usize) -> usize,
        elem: usize,
        halves: usize,
    ) -> Vec<Vec<[u64; 2]>> {
        let shape = self.shape;
        let dims = shape.dims();
        let count = shape.device_count();
        let done: Vec<usize> = (0..self.round)
            .map(|r| self.plan.axis(self.part, r))
            .collect();
        // Axes the group still spans after this pass: an owner and a
        // device meet in one key when they agree on every other axis.
        let free: Vec<usize> = self
            .plan
            .active
            .iter()
            .copied()
            .filter(|&a| a != self.axis && !done.contains(&a))
            .collect();
        let stride = |d: usize| -> usize { dims[..d].iter().product() };
        let key = |device: usize| -> usize {
            free.iter()
                .map(|&d| (device / stride(d)) % dims[d] * stride(d))
                .fold(device, |k, off| k - off)
        };
        let mut sums = vec![[0u64; 2]; count];
        for owner in 0..count {
            let q = part_len(owner, self.part);
            let slot = &mut sums[key(owner)];
            for (h, sum) in slot.iter_mut().enumerate().take(halves) {
                let share = if halves == 2 {
                    chunk_range(q, 2, h).len()
                } else {
                    q
                };
                *sum += (share * elem) as u64;
            }
        }
        let n = dims[self.axis];
        let axis_stride = stride(self.axis);
        shape
            .lines(self.axis)
            .iter()
            .map(|line| {
                let base = key(line[0]);
                (0..n).map(|c| sums[base + c * axis_stride]).collect()
            })
            .collect()
    }

    fn record(
        &self,
        traffic: &mut Traffic,
        part_len: &impl Fn(usize, usize) -> usize,
        elem: usize,
        kind: PhaseKind,
        order: u32,
    ) {
        let line_kind = LineKind::of(self.shape, self.axis);
        let halves = line_kind.halves();
        let bytes = self.chunk_bytes(part_len, elem, halves);
        let lines = self.shape.lines(self.axis);
        let n = self.shape.dims()[self.axis];
        let gather = kind == PhaseKind::AllGather;
        for s in 0..n - 1 {
            let phase = Phase {
                order,
                kind,
                dim: self.axis as u32,
                step: s as u32,
            };
            let mut push = |src: usize, dst: usize, bytes: u64| {
                if bytes > 0 {
                    traffic.transfers.push(Transfer {
                        src,
                        dst,
                        bytes,
                        hops: 1,
                        phase,
                    });
                }
            };
            for (line, chunks) in lines.iter().zip(&bytes) {
                match line_kind {
                    LineKind::TwoWayLine => {
                        for (from, to, c) in RingRoute::line_messages(n, s, kind) {
                            push(line[from], line[to], chunks[c][0]);
                        }
                    }
                    LineKind::Pair | LineKind::Bidirectional => {
                        for i in 0..n {
                            // Forwards as a ring (module `ring`).
                            let c = if gather {
                                (i + n - s) % n
                            } else {
                                (i + 2 * n - 1 - s) % n
                            };
                            push(line[i], line[(i + 1) % n], chunks[c][0]);
                        }
                        if halves == 2 {
                            for i in 0..n {
                                // The mirror image: chunk c leaves c + 1
                                // (gather: c) and travels backwards.
                                let c = if gather { (i + s) % n } else { (i + 1 + s) % n };
                                push(line[i], line[(i + n - 1) % n], chunks[c][1]);
                            }
                        }
                    }
                }
            }
        }
    }
}
