//! The closed form of the torus collectives' schedule (module `schedule`):
//! the same rounds and passes, their bytes and durations, without
//! enumerating a transfer. It is exactly the traffic record's link bytes
//! and, within rounding, its [`super::Traffic::timeline`] under one link
//! model, for a length that is a multiple of the group size (tests compare
//! the two on every line kind), and it costs a few operations per pass: a
//! 175e9-parameter model in thousands of buckets on a 6144-chip pod is
//! priced in microseconds per bucket.
//!
//! A pass of part `p` along an axis of `n` chips, in a group of `N`
//! devices whose shards have `s = len / N` elements, with `M` owners left
//! in the device's group before it (`N` over the extents the part has
//! already run), moves `M/n · q` elements per message (`q` = the part's
//! share of a shard; on a bidirectional ring the larger half,
//! `⌈q/2⌉`) in `n − 1` steps of `α + bytes/β`, and `(n−1)·M·q` elements
//! per line over all its links.

use std::collections::BTreeMap;

use serde::Serialize;

use super::multislice::DCN_AXIS;
use super::ring::chunk_range;
use super::schedule::{AxisPlan, LineKind};
use super::torus::TorusShape;
use super::traffic::{LinkModel, PhaseKind};

/// One pass of a collective: a part's ring passes along one axis (or the
/// cross-slice exchange).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PassCost {
    /// Reduce-scatter or all-gather.
    pub kind: PhaseKind,
    /// The torus dimension, or [`DCN_AXIS`].
    pub axis: u32,
    /// Duration.
    pub seconds: f64,
    /// Bytes over every link it uses.
    pub link_bytes: u64,
}

/// Rounds run one after another; the passes of a round at once on disjoint
/// links.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CollectiveCost {
    /// Per round, its passes (by axis).
    pub rounds: Vec<Vec<PassCost>>,
}

impl CollectiveCost {
    /// Duration: every round's slowest pass, summed.
    pub fn seconds(&self) -> f64 {
        self.rounds
            .iter()
            .map(|round| round.iter().map(|p| p.seconds).fold(0.0, f64::max))
            .sum()
    }

    /// Bytes over every link.
    pub fn link_bytes(&self) -> u64 {
        self.passes().map(|p| p.link_bytes).sum()
    }

    /// Every pass, round by round.
    pub fn passes(&self) -> impl Iterator<Item = &PassCost> {
        self.rounds.iter().flatten()
    }

    /// Seconds each axis's links are busy (summed over its passes).
    pub fn axis_seconds(&self) -> BTreeMap<u32, f64> {
        let mut busy = BTreeMap::new();
        for p in self.passes() {
            *busy.entry(p.axis).or_insert(0.0) += p.seconds;
        }
        busy
    }

    /// Bytes over each axis's links.
    pub fn axis_link_bytes(&self) -> BTreeMap<u32, u64> {
        let mut bytes = BTreeMap::new();
        for p in self.passes() {
            *bytes.entry(p.axis).or_insert(0) += p.link_bytes;
        }
        bytes
    }

    /// This collective, then `next`.
    pub fn then(mut self, next: CollectiveCost) -> CollectiveCost {
        self.rounds.extend(next.rounds);
        self
    }

    /// Without passes that move nothing and rounds left empty (the traffic
    /// record has no transfer for them).
    fn pruned(mut self) -> CollectiveCost {
        for round in &mut self.rounds {
            round.retain(|p| p.link_bytes > 0);
        }
        self.rounds.retain(|round| !round.is_empty());
        self
    }
}

/// The reduce-scatter rounds before pruning.
fn scatter_rounds(
    shape: &TorusShape,
    axes: &[usize],
    len: usize,
    elem_bytes: usize,
    ici: &LinkModel,
) -> Vec<Vec<PassCost>> {
    let plan = AxisPlan::new(shape, axes);
    let k = plan.parts();
    if k == 0 {
        return Vec::new();
    }
    let dims = shape.dims();
    let group = plan.group_size(shape);
    let shard = len.div_ceil(group);
    let devices = shape.device_count();
    let parts: Vec<usize> = (0..k).map(|p| plan.part_range(shard, p).len()).collect();
    (0..k)
        .map(|round| {
            let mut passes: Vec<PassCost> = (0..k)
                .map(|p| {
                    let axis = plan.axis(p, round);
                    let n = dims[axis];
                    let done: usize = (0..round).map(|r| dims[plan.axis(p, r)]).product();
                    let owners = group / done;
                    let q = parts[p];
                    let largest = match LineKind::of(shape, axis) {
                        LineKind::Bidirectional => chunk_range(q, 2, 0).len(),
                        _ => q,
                    };
                    let message = (owners / n * largest * elem_bytes) as u64;
                    let seconds = if message > 0 {
                        (n - 1) as f64 * ici.message_seconds(message, 1)
                    } else {
                        0.0
                    };
                    PassCost {
                        kind: PhaseKind::ReduceScatter,
                        axis: axis as u32,
                        seconds,
                        link_bytes: ((devices / n) * (n - 1) * owners * q * elem_bytes) as u64,
                    }
                })
                .collect();
            passes.sort_by_key(|p| p.axis);
            passes
        })
        .collect()
}

/// A reduce-scatter over the axes `axes` of `shape` (every group of
/// devices that differ only along them, all at once) of `len` elements per
/// device, each device then holding `len / N` (`N` = the product of the
/// extents of `axes`): the closed form of
/// [`super::torus_reduce_scatter_traffic_over`]. A `len` that is not a
/// multiple of `N` is priced as the next multiple (the padding a sharded
/// layout adds). Axes outside the shape, repeated or of extent 1 move
/// nothing and are left out, as in the traffic record.
pub fn reduce_scatter_cost(
    shape: &TorusShape,
    axes: &[usize],
    len: usize,
    elem_bytes: usize,
    ici: &LinkModel,
) -> CollectiveCost {
    CollectiveCost {
        rounds: scatter_rounds(shape, axes, len, elem_bytes, ici),
    }
    .pruned()
}

/// The all-gather that undoes [`reduce_scatter_cost`] (`len` = elements
/// each device holds afterwards): its rounds in reverse, the closed form of
/// [`super::torus_all_gather_traffic_over`].
pub fn all_gather_cost(
    shape: &TorusShape,
    axes: &[usize],
    len: usize,
    elem_bytes: usize,
    ici: &LinkModel,
) -> CollectiveCost {
    let mut rounds = scatter_rounds(shape, axes, len, elem_bytes, ici);
    rounds.reverse();
    for pass in rounds.iter_mut().flatten() {
        pass.kind = PhaseKind::AllGather;
    }
    CollectiveCost { rounds }.pruned()
}

/// An all-reduce: [`reduce_scatter_cost`], then [`all_gather_cost`].
pub fn all_reduce_cost(
    shape: &TorusShape,
    axes: &[usize],
    len: usize,
    elem_bytes: usize,
    ici: &LinkModel,
) -> CollectiveCost {
    reduce_scatter_cost(shape, axes, len, elem_bytes, ici)
        .then(all_gather_cost(shape, axes, len, elem_bytes, ici))
}

/// A rail of the DCN fabric as a host uses it when it sends to
/// `destinations` of the pod's `slices − 1` other slices at once: a rail is
/// the host's NIC over every other slice ([`crate::topology::Topology::fabric_link_params`]),
/// and the NIC's bandwidth is shared by the flows it carries, so fewer
/// destinations (an axis holding a factor of the slices, a stage's permute
/// to the next) each get more of it. All the slices is the rail itself.
pub fn rail_for(rail: &LinkModel, slices: usize, destinations: usize) -> LinkModel {
    let share = slices.saturating_sub(1).max(1) as f64 / destinations.max(1) as f64;
    LinkModel::new(
        rail.latency_seconds(),
        rail.bandwidth_bytes_per_second() * share.max(1.0),
    )
    .unwrap_or(*rail)
}

/// The cross-slice exchange of a multislice collective
/// ([`super::multislice_reduce_scatter_traffic`]'s DCN pass): each device
/// holds `len_per_device` elements (after the slice's reduce-scatter) and
/// every host sends each other slice the `len_per_device / slices`-element
/// chunk of each of its `chips_per_host` chips on its own rail, so the
/// pass lasts `α_rail + chips_per_host · len_per_device / slices · elem /
/// β_rail` and moves that many bytes per host and destination slice
/// (`hosts_per_slice · slices` hosts). An all-gather (`kind`) is the same
/// exchange the other way.
pub fn dcn_exchange_cost(
    len_per_device: usize,
    slices: usize,
    hosts_per_slice: usize,
    chips_per_host: usize,
    elem_bytes: usize,
    rail: &LinkModel,
    kind: PhaseKind,
) -> PassCost {
    let chunk = if slices > 1 {
        (chips_per_host * (len_per_device / slices) * elem_bytes) as u64
    } else {
        0
    };
    let seconds = if chunk > 0 {
        rail.message_seconds(chunk, 1)
    } else {
        0.0
    };
    PassCost {
        kind,
        axis: DCN_AXIS,
        seconds,
        link_bytes: (hosts_per_slice * slices * slices.saturating_sub(1)) as u64 * chunk,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collectives::{
        Traffic, torus_all_gather_traffic_over, torus_reduce_scatter_traffic_over,
    };
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn model() -> LinkModel {
        LinkModel::new(1e-6, 5e10).unwrap()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-30)
    }

    /// The cost's passes and the traffic's, round by round: bytes exactly,
    /// seconds within rounding.
    fn assert_agree(cost: &CollectiveCost, traffic: &Traffic, what: &str) {
        let m = model();
        assert_eq!(cost.link_bytes(), traffic.total_bytes(), "{what}: bytes");
        let (c, t) = (cost.seconds(), traffic.modeled_seconds(&m));
        assert!(close(c, t), "{what}: {c} s closed form vs {t} s traffic");
        let summaries = traffic.passes(|_, _| m);
        let passes: Vec<&PassCost> = cost.passes().collect();
        assert_eq!(passes.len(), summaries.len(), "{what}: pass count");
        for (p, s) in passes.iter().zip(&summaries) {
            assert_eq!(
                (p.axis, p.kind, p.link_bytes),
                (s.dim, s.kind, s.bytes),
                "{what}"
            );
            assert!(close(p.seconds, s.seconds()), "{what}: {p:?} vs {s:?}");
        }
    }

    /// Per order, every pass's step uses each link direction once, and two
    /// passes of one order never share a link direction.
    fn assert_links_disjoint(traffic: &Traffic, what: &str) {
        let mut by_step: BTreeSet<(u32, u32, u32, usize, usize)> = BTreeSet::new();
        let mut by_order: std::collections::BTreeMap<(u32, usize, usize), u32> = Default::default();
        for t in &traffic.transfers {
            let p = t.phase;
            assert!(
                by_step.insert((p.order, p.dim, p.step, t.src, t.dst)),
                "{what}: {t:?} shares its link in its step"
            );
            let dim = *by_order.entry((p.order, t.src, t.dst)).or_insert(p.dim);
            assert_eq!(
                dim, p.dim,
                "{what}: two passes of order {} on one link",
                p.order
            );
        }
    }

    fn check(dims: &[usize], wrap: &[bool], axes: &[usize], shard: usize) {
        let shape = TorusShape::new(dims, wrap).unwrap();
        let group: usize = AxisPlan::new(&shape, axes).group_size(&shape);
        let len = group * shard;
        let what = format!("{dims:?} {wrap:?} axes {axes:?} len {len}");
        let rs = torus_reduce_scatter_traffic_over(&shape, axes, len, 4);
        let ag = torus_all_gather_traffic_over(&shape, axes, len, 4, 0);
        assert_agree(
            &reduce_scatter_cost(&shape, axes, len, 4, &model()),
            &rs,
            &what,
        );
        assert_agree(&all_gather_cost(&shape, axes, len, 4, &model()), &ag, &what);
        assert_links_disjoint(&rs, &what);
        assert_links_disjoint(&ag, &what);
        // Every device sends (N−1)/N of its buffer, whatever the order.
        let devices = shape.device_count() as u64;
        let expected = devices * (group as u64 - 1) * shard as u64 * 4;
        assert_eq!(rs.total_bytes(), expected, "{what}");
        assert_eq!(ag.total_bytes(), expected, "{what}");
    }

    #[test]
    fn the_closed_form_is_the_traffic_record_on_every_line_kind() {
        for &(dims, wrap) in &[
            (&[4usize, 4][..], &[true, true][..]),
            (&[4, 4], &[false, false]),
            (&[4, 4, 8], &[true, true, true]),
            (&[8, 4, 2], &[true, false, false]),
            (&[3, 5, 2], &[true, true, true]),
            (&[16], &[true]),
            (&[2, 2, 2], &[false, false, false]),
        ] {
            let all: Vec<usize> = (0..dims.len()).collect();
            for shard in [0, 1, 3, 7, 64] {
                check(dims, wrap, &all, shard);
                check(dims, wrap, &all[..1], shard);
                check(dims, wrap, &all[all.len() - 1..], shard);
            }
        }
        check(&[4, 4, 8], &[true; 3], &[2, 0], 17);
    }

    #[test]
    fn axes_outside_the_shape_repeated_or_of_extent_one_move_nothing() {
        let shape = TorusShape::new(&[4, 1, 4], &[true, false, true]).unwrap();
        let plain = reduce_scatter_cost(&shape, &[0, 2], 1600, 4, &model());
        assert_eq!(
            plain,
            reduce_scatter_cost(&shape, &[0, 1, 2, 2, 7], 1600, 4, &model())
        );
        assert_eq!(plain.rounds.len(), 2);
        assert!(
            reduce_scatter_cost(&shape, &[1, 9], 1600, 4, &model())
                .rounds
                .is_empty()
        );
    }

    #[test]
    fn a_bidirectional_ring_is_twice_a_one_way_ring_and_a_line_keeps_its_time() {
        // 16 chips with wraparound: 15 steps of V/32 each way.
        let m = LinkModel::new(0.0, 5e10).unwrap();
        let ring = TorusShape::new(&[16], &[true]).unwrap();
        let v = 16 * 1024 * 1024;
        let t = all_gather_cost(&ring, &[0], v, 1, &m).seconds();
        let book = 15.0 / 16.0 * v as f64 / 1e11;
        assert!(close(t, book), "{t} vs {book}");
        // Without wraparound: 15 steps of V/16 one way.
        let line = TorusShape::new(&[16], &[false]).unwrap();
        let t = all_gather_cost(&line, &[0], v, 1, &m).seconds();
        let book = 15.0 * (v / 16) as f64 / 5e10;
        assert!(close(t, book), "{t} vs {book}");
    }

    #[test]
    fn the_dcn_exchange_is_one_message_per_host_and_slice() {
        let rail = LinkModel::new(1e-5, 1e9).unwrap();
        let p = dcn_exchange_cost(800, 4, 2, 8, 4, &rail, PhaseKind::ReduceScatter);
        // 8 chips x 200 elements x 4 B per host and destination.
        let chunk = 8 * 200 * 4;
        assert!(close(p.seconds, 1e-5 + chunk as f64 / 1e9));
        assert_eq!(p.link_bytes, 2 * 4 * 3 * chunk);
        assert_eq!(p.axis, DCN_AXIS);
        let none = dcn_exchange_cost(800, 1, 2, 8, 4, &rail, PhaseKind::AllGather);
        assert_eq!((none.seconds, none.link_bytes), (0.0, 0));
    }

    #[test]
    fn a_175e9_parameter_model_on_6144_chips_is_priced_fast() {
        let shape = TorusShape::new(&[16, 16, 24], &[true; 3]).unwrap();
        let started = std::time::Instant::now();
        let buckets = 175_000_000_000usize / 25_000_000;
        let mut total = 0.0;
        for b in 0..buckets {
            let len = (25_000_000 + b).next_multiple_of(6144);
            total += all_reduce_cost(&shape, &[0, 1, 2], len, 4, &model()).seconds();
        }
        let elapsed = started.elapsed().as_secs_f64();
        assert!(total > 0.0);
        // Debug build, shared machine: well under 50 ms in release.
        assert!(elapsed < 0.5, "{buckets} buckets in {elapsed} s");
    }

    proptest! {
        #[test]
        fn closed_form_and_record_agree(
            dims in proptest::collection::vec(1usize..=5, 1..=3),
            wrap_bits in 0u8..8,
            shard in 0usize..12,
            axes_bits in 1u8..8,
        ) {
            let wrap: Vec<bool> = (0..dims.len()).map(|d| wrap_bits >> d & 1 == 1).collect();
            let axes: Vec<usize> = (0..dims.len()).filter(|d| axes_bits >> d & 1 == 1).collect();
            check(&dims, &wrap, &axes, shard);
        }
    }
}
