//! Collectives against a naive reduction, traffic accounting, the model.

use proptest::prelude::*;

use super::bench::{BenchOp, BenchTable, run_nccl_style, run_nccl_style_torus};
use super::*;

/// SplitMix64: a tiny deterministic generator for test data.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

trait TestElement: Element {
    fn random(mix: &mut Mix) -> Self;
    fn to_f64(self) -> f64;
    /// Unit roundoff; 0 for exact types.
    const EPS: f64;
}

impl TestElement for f32 {
    fn random(mix: &mut Mix) -> Self {
        (mix.below(2001) as f32) / 250.0 - 4.0
    }
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    const EPS: f64 = f32::EPSILON as f64;
}

impl TestElement for f64 {
    fn random(mix: &mut Mix) -> Self {
        (mix.below(2001) as f64) / 250.0 - 4.0
    }
    fn to_f64(self) -> f64 {
        self
    }
    const EPS: f64 = f64::EPSILON;
}

impl TestElement for i32 {
    fn random(mix: &mut Mix) -> Self {
        mix.next() as i32
    }
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    const EPS: f64 = 0.0;
}

fn random_buffers<T: TestElement>(mix: &mut Mix, count: usize, len: usize) -> Vec<Vec<T>> {
    (0..count)
        .map(|_| (0..len).map(|_| T::random(mix)).collect())
        .collect()
}

/// Asserts `got[i]` is `expected[i]` within the rounding a reordered
/// reduction of `n` operands can introduce (exactly, for integers and for
/// max/min).
fn assert_close<T: TestElement>(op: ReduceOp, inputs: &[&[T]], expected: &[T], got: &[T]) {
    assert_eq!(expected.len(), got.len());
    let n = inputs.len() as f64;
    for (i, (&e, &g)) in expected.iter().zip(got).enumerate() {
        let exact = T::EPS == 0.0 || matches!(op, ReduceOp::Max | ReduceOp::Min);
        if exact {
            assert_eq!(e, g, "{op:?} element {i}");
            continue;
        }
        let magnitude = match op {
            ReduceOp::Product => e.to_f64().abs(),
            _ => inputs.iter().map(|x| x[i].to_f64().abs()).sum::<f64>(),
        };
        let tolerance = 2.0 * n * T::EPS * magnitude + f64::MIN_POSITIVE;
        assert!(
            (e.to_f64() - g.to_f64()).abs() <= tolerance,
            "{op:?} element {i}: expected {e:?}, got {g:?} (tolerance {tolerance:e})"
        );
    }
}

/// A ring over a random subset of `count` buffers, in random order.
fn random_ring(mix: &mut Mix, count: usize, n: usize) -> Vec<usize> {
    let mut ranks: Vec<usize> = (0..count).collect();
    for i in (1..count).rev() {
        ranks.swap(i, mix.below(i + 1));
    }
    ranks.truncate(n);
    ranks
}

fn check_ring_collectives<T: TestElement>(n: usize, len: usize, seed: u64) {
    let mut mix = Mix(seed);
    let count = n + mix.below(3);
    let ring = random_ring(&mut mix, count, n);
    let inputs: Vec<Vec<T>> = random_buffers(&mut mix, count, len);
    let members: Vec<&[T]> = ring.iter().map(|&r| inputs[r].as_slice()).collect();
    let outsiders: Vec<usize> = (0..count).filter(|r| !ring.contains(r)).collect();

    for op in ReduceOp::ALL {
        let expected = naive_reduce(&members, op);

        let mut buffers = inputs.clone();
        all_reduce(&mut buffers, &ring, op).expect("valid ring");
        for &r in &ring {
            assert_close(op, &members, &expected, &buffers[r]);
            assert_eq!(buffers[r], buffers[ring[0]], "ranks disagree bitwise");
        }
        for &r in &outsiders {
            assert_eq!(
                buffers[r], inputs[r],
                "rank {r} outside the ring was modified"
            );
        }

        let mut buffers = inputs.clone();
        reduce_scatter(&mut buffers, &ring, op).expect("valid ring");
        for (pos, &r) in ring.iter().enumerate() {
            let own = chunk_range(len, n, pos);
            let members_chunk: Vec<&[T]> = members.iter().map(|m| &m[own.clone()]).collect();
            assert_close(
                op,
                &members_chunk,
                &expected[own.clone()],
                &buffers[r][own.clone()],
            );
            for i in (0..len).filter(|i| !own.contains(i)) {
                assert_eq!(
                    buffers[r][i], inputs[r][i],
                    "reduce-scatter touched a foreign chunk"
                );
            }
        }
    }

    let gathered: Vec<T> = (0..n)
        .flat_map(|pos| inputs[ring[pos]][chunk_range(len, n, pos)].to_vec())
        .collect();
    let mut buffers = inputs.clone();
    all_gather(&mut buffers, &ring).expect("valid ring");
    for &r in &ring {
        assert_eq!(buffers[r], gathered);
    }

    let root = ring[mix.below(n)];
    let mut buffers = inputs.clone();
    broadcast(&mut buffers, &ring, root).expect("valid ring");
    for &r in &ring {
        assert_eq!(buffers[r], inputs[root]);
    }
    for &r in &outsiders {
        assert_eq!(buffers[r], inputs[r]);
    }
}

fn check_torus<T: TestElement>(shape: &TorusShape, len: usize, seed: u64) {
    let mut mix = Mix(seed);
    let count = shape.device_count();
    let inputs: Vec<Vec<T>> = random_buffers(&mut mix, count, len);
    let refs: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
    for op in ReduceOp::ALL {
        let expected = naive_reduce(&refs, op);
        let mut buffers = inputs.clone();
        let traffic = torus_all_reduce(&mut buffers, shape, op).expect("valid torus");
        for b in &buffers {
            assert_close(op, &refs, &expected, b);
            assert_eq!(b, &buffers[0], "devices disagree bitwise");
        }
        assert_links_adjacent(shape, &traffic);
    }
}

fn assert_links_adjacent(shape: &TorusShape, traffic: &Traffic) {
    for t in &traffic.transfers {
        let (a, b) = (shape.coords(t.src), shape.coords(t.dst));
        let differing: Vec<usize> = (0..a.len()).filter(|&d| a[d] != b[d]).collect();
        assert_eq!(differing.len(), 1, "{t:?} joins non-adjacent devices");
        let d = differing[0];
        let extent = shape.dims()[d];
        let step = (b[d] + extent - a[d]) % extent;
        let adjacent = step == 1 || step == extent - 1;
        let wraps = a[d].abs_diff(b[d]) != 1;
        assert!(
            adjacent && (!wraps || shape.wraparound()[d]),
            "{t:?} is not a link"
        );
    }
}

fn ring_case() -> impl Strategy<Value = (usize, usize, u64)> {
    (1usize..=9).prop_flat_map(|n| (Just(n), 0..=3 * n, any::<u64>()))
}

fn torus_case() -> impl Strategy<Value = (TorusShape, usize, u64)> {
    (
        prop::collection::vec((1usize..=4, any::<bool>()), 2..=3),
        any::<u64>(),
    )
        .prop_flat_map(|(dims, seed)| {
            let extents: Vec<usize> = dims.iter().map(|d| d.0).collect();
            let wrap: Vec<bool> = dims.iter().map(|d| d.1).collect();
            let shape = TorusShape::new(&extents, &wrap).expect("extents ≥ 1");
            let count = shape.device_count();
            (Just(shape), 0..=3 * count, Just(seed))
        })
}

proptest! {
    #[test]
    fn ring_collectives_match_naive_f32((n, len, seed) in ring_case()) {
        check_ring_collectives::<f32>(n, len, seed);
    }

    #[test]
    fn ring_collectives_match_naive_f64((n, len, seed) in ring_case()) {
        check_ring_collectives::<f64>(n, len, seed);
    }

    #[test]
    fn ring_collectives_match_naive_i32((n, len, seed) in ring_case()) {
        check_ring_collectives::<i32>(n, len, seed);
    }

    #[test]
    fn torus_all_reduce_matches_naive((shape, len, seed) in torus_case()) {
        check_torus::<f32>(&shape, len, seed);
        check_torus::<f64>(&shape, len, seed);
        check_torus::<i32>(&shape, len, seed);
    }

    #[test]
    fn all_reduce_traffic_is_2_n_minus_1_over_n((n, len, _seed) in ring_case()) {
        let ring: Vec<usize> = (0..n).collect();
        let mut buffers = vec![vec![1.0f32; len]; n];
        let traffic = all_reduce(&mut buffers, &ring, ReduceOp::Sum).unwrap();
        let bytes = (len * 4) as u64;
        // Over all ranks: exactly 2(n−1) buffers' worth.
        prop_assert_eq!(traffic.total_bytes(), 2 * (n as u64 - 1) * bytes);
        let sent = traffic.sent_by();
        let ceil_chunk = (len.div_ceil(n) * 4) as u64;
        for (pos, &rank) in ring.iter().enumerate() {
            let own = chunk_range(len, n, pos).len() + chunk_range(len, n, (pos + 1) % n).len();
            let expected = 2 * bytes - (own * 4) as u64;
            prop_assert_eq!(sent.get(&rank).copied().unwrap_or(0), expected);
            prop_assert!(expected <= 2 * (n as u64 - 1) * ceil_chunk);
        }
        for t in &traffic.transfers {
            prop_assert_eq!(t.dst, (t.src + 1) % n, "not a ring neighbour");
            prop_assert_eq!(t.hops, 1);
        }
        let model = LinkModel::new(1e-6, 45e9).unwrap();
        let closed = model.ring_all_reduce_seconds(n, len, 4);
        let from_traffic = traffic.modeled_seconds(&model);
        prop_assert!((closed - from_traffic).abs() <= 1e-12 * closed.max(1e-30), "{closed} vs {from_traffic}");
    }
}

#[test]
fn even_split_sends_exactly_2_n_minus_1_over_n_per_rank() {
    let n = 8;
    let len = 1024;
    let mut buffers = vec![vec![0i32; len]; n];
    let traffic = all_reduce(&mut buffers, &(0..n).collect::<Vec<_>>(), ReduceOp::Sum).unwrap();
    for (_, sent) in traffic.sent_by() {
        assert_eq!(sent, (2 * (n - 1) * len * 4 / n) as u64);
    }
    assert_eq!(traffic.transfers.len(), 2 * (n - 1) * n);
}

#[test]
fn single_rank_and_empty_buffers_move_nothing() {
    let mut one = vec![vec![3.0f32, 4.0]];
    let traffic = all_reduce(&mut one, &[0], ReduceOp::Mean).unwrap();
    assert_eq!(one[0], [3.0, 4.0]);
    assert!(traffic.transfers.is_empty());
    let mut empty: Vec<Vec<f64>> = vec![Vec::new(); 4];
    let traffic = all_reduce(&mut empty, &[0, 1, 2, 3], ReduceOp::Sum).unwrap();
    assert!(traffic.transfers.is_empty());
    assert_eq!(
        traffic.modeled_seconds(&LinkModel::new(1e-6, 1e9).unwrap()),
        0.0
    );
}

#[test]
fn integer_sum_wraps_and_mean_truncates() {
    let mut buffers = vec![vec![i32::MAX, 7], vec![1, 0], vec![0, 0]];
    all_reduce(&mut buffers, &[0, 1, 2], ReduceOp::Sum).unwrap();
    assert_eq!(buffers[2], [i32::MIN, 7]);
    let mut buffers = vec![vec![7, -7], vec![0, 0]];
    all_reduce(&mut buffers, &[1, 0], ReduceOp::Mean).unwrap();
    assert_eq!(buffers[0], [3, -3]);
}

#[test]
fn broadcast_model_matches_closed_form_on_even_split() {
    let model = LinkModel::new(2e-6, 10e9).unwrap();
    for n in 1..=9 {
        let len = 5 * n;
        let ring: Vec<usize> = (0..n).rev().collect();
        let mut buffers = vec![vec![1i32; len]; n];
        let traffic = broadcast(&mut buffers, &ring, ring[n / 2]).unwrap();
        let closed = model.broadcast_seconds(n, len, 4);
        assert!((traffic.modeled_seconds(&model) - closed).abs() <= 1e-15);
        // Every non-root rank receives the whole buffer exactly once.
        assert_eq!(traffic.total_bytes(), ((n - 1) * len * 4) as u64);
    }
}

#[test]
fn large_broadcasts_pipeline_in_bounded_chunks() {
    let n = 4;
    let len = 6 * BROADCAST_CHUNK_BYTES / 4;
    assert_eq!(broadcast_chunks(n, len, 4), 6);
    assert_eq!(broadcast_chunks(n, 2, 4), 2);
    assert_eq!(broadcast_chunks(n, 0, 4), 0);
    let mut buffers: Vec<Vec<f32>> = (0..n).map(|r| vec![r as f32; len]).collect();
    let traffic = broadcast(&mut buffers, &[0, 1, 2, 3], 2).unwrap();
    assert!(buffers.iter().all(|b| b.iter().all(|&x| x == 2.0)));
    assert!(
        traffic
            .transfers
            .iter()
            .all(|t| t.bytes == BROADCAST_CHUNK_BYTES as u64)
    );
    let steps: std::collections::BTreeSet<u32> =
        traffic.transfers.iter().map(|t| t.phase.step).collect();
    assert_eq!(steps.len(), (n - 1) + (6 - 1));
    let model = LinkModel::new(1e-6, 45e9).unwrap();
    let closed = model.broadcast_seconds(n, len, 4);
    assert!((traffic.modeled_seconds(&model) - closed).abs() <= 1e-12 * closed);
    assert_eq!(traffic.total_bytes(), ((n - 1) * len * 4) as u64);
}

#[test]
fn torus_traffic_on_a_wrapped_torus_matches_the_closed_form() {
    let shape = TorusShape::new(&[4, 2, 3], &[true, true, true]).unwrap();
    let len = 4 * 2 * 3 * 1000;
    let mut buffers = vec![vec![1.0f32; len]; shape.device_count()];
    let traffic = torus_all_reduce(&mut buffers, &shape, ReduceOp::Sum).unwrap();
    assert!(buffers.iter().all(|b| b.iter().all(|&x| x == 24.0)));
    let model = LinkModel::new(1e-6, 45e9).unwrap();
    let expected = all_reduce_cost(&shape, &[0, 1, 2], len, 4, &model).seconds();
    let modeled = traffic.modeled_seconds(&model);
    assert!(
        (modeled - expected).abs() <= 1e-12 * expected,
        "{modeled} vs {expected}"
    );
    // Three rounds each way, a pass on every axis in each.
    let passes = traffic.passes(|_, _| model);
    assert_eq!(passes.len(), 2 * 3 * 3);
    assert!(passes.iter().all(|p| p.order < 6));
    // Every pass of a round starts with the round.
    for p in &passes {
        let first = passes.iter().find(|q| q.order == p.order).unwrap();
        assert_eq!(p.start_seconds, first.start_seconds, "{p:?}");
    }
    // Bandwidth-bound, faster than the axes one after another on one-way
    // rings (for a few elements the rounds' latency, 3 rounds of up to 3
    // steps against 3 + 1 + 2 steps, makes it slower).
    let bandwidth = LinkModel::new(0.0, 45e9).unwrap();
    let mut seg = len;
    let mut one_way = 0.0;
    for &n in shape.dims() {
        one_way += bandwidth.ring_all_reduce_seconds(n, seg, 4);
        seg /= n;
    }
    let ours = traffic.modeled_seconds(&bandwidth);
    assert!(ours < 0.6 * one_way, "{ours} vs {one_way}");
}

#[test]
fn a_slow_link_slows_every_step_it_carries() {
    let mut buffers = vec![vec![1.0f64; 64]; 4];
    let traffic = all_reduce(&mut buffers, &[0, 1, 2, 3], ReduceOp::Sum).unwrap();
    let fast = LinkModel::new(1e-6, 100e9).unwrap();
    let slow = LinkModel::new(10e-6, 1e9).unwrap();
    let uniform = traffic.modeled_seconds(&slow);
    // The 3 → 0 link carries one chunk in each of the 6 steps.
    let mixed =
        traffic.modeled_seconds_by_link(|src, dst| if (src, dst) == (3, 0) { slow } else { fast });
    assert!((mixed - uniform).abs() <= 1e-15, "{mixed} vs {uniform}");
    assert_eq!(traffic.per_link()[&(3, 0)], 6 * 16 * 8);
}

#[test]
fn a_mesh_dimension_runs_two_way_lines_at_a_ring_s_bytes_and_time() {
    let mesh = TorusShape::new(&[4, 2], &[false, false]).unwrap();
    let mut buffers = vec![vec![1i32; 64]; 8];
    let traffic = torus_all_reduce(&mut buffers, &mesh, ReduceOp::Sum).unwrap();
    assert!(buffers.iter().all(|b| b.iter().all(|&x| x == 8)));
    assert_links_adjacent(&mesh, &traffic);
    assert!(
        traffic.transfers.iter().all(|t| t.hops == 1),
        "no routed message"
    );
    // The line's two ends carry what flows each way: as much in as out.
    let links = traffic.per_link();
    assert_eq!(links[&(0, 1)], links[&(1, 0)]);
    assert!(!links.contains_key(&(3, 0)), "no wraparound link");
    let wrapped = TorusShape::new(&[4, 2], &[true, false]).unwrap();
    let mut buffers = vec![vec![1i32; 64]; 8];
    let ring_traffic = torus_all_reduce(&mut buffers, &wrapped, ReduceOp::Sum).unwrap();
    assert_eq!(traffic.total_bytes(), ring_traffic.total_bytes());
    // The ring sends half of its part each way; the line sends it all one
    // way at a time.
    let model = LinkModel::new(0.0, 45e9).unwrap();
    let (line, ring) = (
        traffic.modeled_seconds(&model),
        ring_traffic.modeled_seconds(&model),
    );
    assert!(ring < line, "{ring} vs {line}");
    assert!(links[&(0, 1)] > 0);
}

proptest! {
    /// Whatever the wraparound, a torus all-reduce moves `2(N−1)/N` of the
    /// buffer per device over single links, with a ring's steps.
    #[test]
    fn lines_move_what_rings_move((shape, len, _seed) in torus_case()) {
        let ring = TorusShape::new(shape.dims(), &vec![true; shape.dims().len()]).unwrap();
        let with_lines = torus_all_reduce_traffic(&shape, len, 4);
        let with_rings = torus_all_reduce_traffic(&ring, len, 4);
        prop_assert!(with_lines.transfers.iter().all(|t| t.hops == 1));
        prop_assert_eq!(with_lines.total_bytes(), with_rings.total_bytes());
        // Bandwidth-bound, a bidirectional ring is never slower than the
        // line it closes (for a few elements the parts' rounding decides).
        let model = LinkModel::new(0.0, 45e9).unwrap();
        let scaled = len * 1000;
        let (a, b) = (
            torus_all_reduce_traffic(&shape, scaled, 4).modeled_seconds(&model),
            torus_all_reduce_traffic(&ring, scaled, 4).modeled_seconds(&model),
        );
        prop_assert!(b <= a * 1.01, "rings {b} vs lines {a}");
        let n = shape.device_count();
        if len % n == 0 {
            // Over all N devices: 2(N−1)/N of the buffer each.
            prop_assert_eq!(with_lines.total_bytes(), 2 * (n as u64 - 1) * len as u64 * 4);
        }
        // One message per directed link per step.
        let mut seen = std::collections::BTreeSet::new();
        for t in &with_lines.transfers {
            prop_assert!(seen.insert((t.phase, t.src, t.dst)), "{:?} twice", t);
        }
    }
}

#[test]
fn invalid_inputs_are_descriptive_errors_and_change_nothing() {
    let mut buffers = vec![vec![1.0f32; 3], vec![2.0; 3], vec![3.0; 2]];
    let before = buffers.clone();
    assert_eq!(
        all_reduce(&mut buffers, &[], ReduceOp::Sum),
        Err(CollectiveError::EmptyRing)
    );
    assert_eq!(
        all_reduce(&mut buffers, &[0, 5], ReduceOp::Sum),
        Err(CollectiveError::RankOutOfRange {
            rank: 5,
            buffers: 3
        })
    );
    assert_eq!(
        all_gather(&mut buffers, &[1, 0, 1]),
        Err(CollectiveError::DuplicateRank { rank: 1 })
    );
    let err = reduce_scatter(&mut buffers, &[0, 1, 2], ReduceOp::Max).unwrap_err();
    assert_eq!(
        err.to_string(),
        "rank 2 has 2 elements but rank 0 has 3: every member's buffer must have the same length"
    );
    assert_eq!(
        broadcast(&mut buffers, &[0, 1], 2),
        Err(CollectiveError::RootNotInRing { root: 2 })
    );
    assert!(matches!(
        TorusShape::new(&[2, 0], &[true, true]),
        Err(CollectiveError::InvalidTorusShape { .. })
    ));
    assert!(TorusShape::new(&[2, 2], &[true]).is_err());
    let shape = TorusShape::new(&[2, 2], &[true, true]).unwrap();
    assert_eq!(
        torus_all_reduce(&mut buffers, &shape, ReduceOp::Sum),
        Err(CollectiveError::BufferCount {
            expected: 4,
            got: 3
        })
    );
    assert!(LinkModel::new(-1.0, 1e9).is_err());
    assert!(LinkModel::new(0.0, 0.0).is_err());
    assert!(LinkModel::new(0.0, f64::NAN).is_err());
    assert_eq!(buffers, before);
}

#[test]
fn large_buffers_take_the_parallel_path_and_stay_exact() {
    let n = 5usize;
    // Several pieces per chunk, with a ragged last piece.
    let len = (PARALLEL_MIN_BYTES / 4 / n).max(PIECE_ELEMS * 2 * n) + 17;
    let inputs: Vec<Vec<i32>> = (0..n)
        .map(|r| {
            (0..len)
                .map(|i| (i as i32).wrapping_mul(31).wrapping_add(r as i32))
                .collect()
        })
        .collect();
    let refs: Vec<&[i32]> = inputs.iter().map(Vec::as_slice).collect();
    let expected = naive_reduce(&refs, ReduceOp::Sum);
    let mut buffers = inputs.clone();
    all_reduce(&mut buffers, &[4, 2, 0, 1, 3], ReduceOp::Sum).unwrap();
    assert!(buffers.iter().all(|b| *b == expected));
    let shape = TorusShape::new(&[5], &[false]).unwrap();
    let mut buffers = inputs.clone();
    torus_all_reduce(&mut buffers, &shape, ReduceOp::Sum).unwrap();
    assert!(buffers.iter().all(|b| *b == expected));
}

#[test]
fn slices_are_accepted_as_buffers() {
    let mut a = [1i32, 2];
    let mut b = [10i32, 20];
    let mut buffers: Vec<&mut [i32]> = vec![&mut a, &mut b];
    all_reduce(&mut buffers, &[0, 1], ReduceOp::Product).unwrap();
    assert_eq!(a, [10, 40]);
    assert_eq!(b, [10, 40]);
}

#[test]
fn nccl_style_rows_have_the_documented_keys_and_no_wrong_elements() {
    let model = LinkModel::new(1e-6, 45e9).unwrap();
    for op in BenchOp::ALL {
        let rows = run_nccl_style(op, 4, &[0, 12, 4096], model).unwrap();
        assert_eq!(rows.len(), 3);
        for row in &rows {
            assert_eq!(row.wrong, 0, "{row:?}");
            assert_eq!(row.op, op.name());
        }
        assert_eq!(rows[0].modeled_seconds, 0.0);
        assert!(rows[2].modeled_seconds > 0.0);
        let json = serde_json::to_value(&rows[2]).unwrap();
        let mut keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "algbw_gbps",
                "busbw_gbps",
                "bytes",
                "floor_seconds",
                "measured_seconds",
                "modeled_busbw_gbps",
                "modeled_seconds",
                "op",
                "ratio_to_floor",
                "wrong"
            ]
        );
        let table = BenchTable(&rows).to_string();
        assert!(table.contains(op.name()));
        assert!(table.lines().count() >= 5);
    }
    assert_eq!(
        run_nccl_style(BenchOp::AllReduce, 0, &[4], model),
        Err(CollectiveError::NoRanks)
    );
    assert_eq!("all-reduce".parse::<BenchOp>(), Ok(BenchOp::AllReduce));
    assert!("allreduce2".parse::<BenchOp>().is_err());
    assert_eq!(BenchOp::AllReduce.bus_factor(8), 1.75);
    assert_eq!(BenchOp::AllGather.bus_factor(8), 0.875);
    assert_eq!(BenchOp::Broadcast.bus_factor(8), 1.0);
}

#[test]
fn combining_in_order_is_bitwise_a_copy_and_sequential_accumulation() {
    use super::element::{accumulate, combine_in_order};
    let mut mix = Mix(11);
    let xs: Vec<Vec<f32>> = (0..21)
        .map(|_| (0..333).map(|_| f32::random(&mut mix) * 1e3).collect())
        .collect();
    for op in ReduceOp::ALL {
        for count in 0..xs.len() {
            let mut sequential = xs[0].clone();
            for x in &xs[1..=count] {
                accumulate(op, &mut sequential, x);
            }
            let rest: Vec<&[f32]> = xs[1..=count].iter().map(Vec::as_slice).collect();
            let mut combined = vec![0.0; 333];
            combine_in_order(op, &mut combined, &xs[0], &rest);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&sequential),
                bits(&combined),
                "{op:?}, {count} operands"
            );
        }
    }
}

/// The AVX2 build of the combining loops (selected at run time) gives the
/// bits of the portable one, on the values where vector lowerings could
/// differ: NaNs, signed zeros, infinities, subnormals, and a length whose
/// tail runs scalar.
#[test]
fn wide_combining_loops_match_the_portable_loop_bit_for_bit() {
    use super::element::{accumulate, accumulate_portable, combine_in_order};
    let special = [
        f32::NAN,
        -f32::NAN,
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MIN_POSITIVE / 4.0,
        -1.5,
    ];
    let mut mix = Mix(5);
    let xs: Vec<Vec<f32>> = (0..12)
        .map(|_| {
            (0..1003)
                .map(|i| {
                    if i % 3 == 0 {
                        special[(mix.next() % 8) as usize]
                    } else {
                        f32::random(&mut mix)
                    }
                })
                .collect()
        })
        .collect();
    // IEEE 754 (and Rust) leave the sign and payload of a NaN result open,
    // and x86 takes them from whichever operand the instruction names
    // first: a NaN is compared as a NaN, every other value by its bits.
    let bits = |v: &[f32]| {
        v.iter()
            .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
            .collect::<Vec<_>>()
    };
    for op in ReduceOp::ALL {
        let mut portable = xs[0].clone();
        let mut wide = xs[0].clone();
        for x in &xs[1..] {
            accumulate_portable(op, &mut portable, x);
            accumulate(op, &mut wide, x);
        }
        assert_eq!(bits(&portable), bits(&wide), "{op:?}: accumulate");
        let rest: Vec<&[f32]> = xs[1..].iter().map(Vec::as_slice).collect();
        let mut combined = vec![0.0; 1003];
        combine_in_order(op, &mut combined, &xs[0], &rest);
        assert_eq!(bits(&portable), bits(&combined), "{op:?}: combine_in_order");
    }
}

#[test]
fn records_come_in_phase_order_and_order_does_not_change_the_model() {
    let shape = TorusShape::new(&[3, 4, 2], &[true, false, true]).unwrap();
    let mut buffers = vec![vec![1i32; 50]; shape.device_count()];
    let traffic = torus_all_reduce(&mut buffers, &shape, ReduceOp::Sum).unwrap();
    assert!(traffic.transfers.is_sorted_by_key(|t| t.phase));
    let model = LinkModel::new(3e-6, 20e9).unwrap();
    let mut shuffled = traffic.clone();
    shuffled.transfers.reverse();
    let mut mix = Mix(3);
    for i in (1..shuffled.transfers.len()).rev() {
        shuffled.transfers.swap(i, mix.below(i + 1));
    }
    assert_eq!(
        shuffled.modeled_seconds(&model),
        traffic.modeled_seconds(&model)
    );
    assert_eq!(shuffled.per_link(), traffic.per_link());
    let per_link_total: u64 = traffic.per_link().values().sum();
    assert_eq!(per_link_total, traffic.total_bytes());
}

#[test]
fn snake_rings_visit_every_device_through_links() {
    for (dims, wrap) in [
        (vec![4], vec![false]),
        (vec![3, 4], vec![false, false]),
        (vec![4, 4, 4], vec![true, true, true]),
        (vec![2, 3, 5], vec![false, true, false]),
    ] {
        let shape = TorusShape::new(&dims, &wrap).unwrap();
        let ring = shape.snake_ring();
        let mut sorted = ring.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..shape.device_count()).collect::<Vec<_>>());
        for pair in ring.windows(2) {
            assert_eq!(shape.path(pair[0], pair[1]).len(), 1, "{dims:?}: {pair:?}");
        }
        let mut buffers = vec![vec![1.0f64; 3 * ring.len()]; ring.len()];
        let traffic = all_reduce(&mut buffers, &ring, ReduceOp::Sum)
            .unwrap()
            .routed_on(&shape);
        assert_links_adjacent(&shape, &traffic);
        assert!(
            buffers
                .iter()
                .all(|b| b.iter().all(|&x| x == ring.len() as f64))
        );
    }
}

#[test]
fn dimension_order_routes_take_the_short_way_round() {
    let torus = TorusShape::new(&[8, 4], &[true, false]).unwrap();
    // (7, 0) → (1, 3): two hops up across the wrap, then three along y.
    let from = torus.index(&[7, 0]).unwrap();
    let to = torus.index(&[1, 3]).unwrap();
    let path = torus.path(from, to);
    let visited: Vec<Vec<usize>> = path.iter().map(|&(_, b)| torus.coords(b)).collect();
    assert_eq!(
        visited,
        [vec![0, 0], vec![1, 0], vec![1, 1], vec![1, 2], vec![1, 3]]
    );
    assert!(torus.path(3, 3).is_empty());
    assert!(torus.path(0, 99).is_empty());
    assert_eq!(torus.index(&[8, 0]), None);
    // A ring in arbitrary order: every record lands on a link.
    let ring = [0, 27, 5, 14, 31, 8];
    let mut buffers = vec![vec![2i32; 12]; 32];
    let logical = all_reduce(&mut buffers, &ring, ReduceOp::Product).unwrap();
    let routed = logical.routed_on(&torus);
    assert_links_adjacent(&torus, &routed);
    assert!(routed.total_bytes() > logical.total_bytes());
    assert!(routed.transfers.is_sorted_by_key(|t| t.phase));
    assert_eq!(buffers[27], vec![64; 12]);
}

#[test]
fn nccl_style_on_a_torus_checks_every_op() {
    let shape = TorusShape::new(&[2, 3, 2], &[false, true, false]).unwrap();
    let model = LinkModel::new(1e-6, 45e9).unwrap();
    for op in BenchOp::ALL {
        let rows = run_nccl_style_torus(op, &shape, &[0, 44, 4800], model).unwrap();
        for row in &rows {
            assert_eq!(row.wrong, 0, "{row:?}");
        }
        assert!(rows[2].modeled_seconds > 0.0);
    }
}

#[test]
fn count_wrong_sees_a_corrupted_element() {
    use super::bench::{bench_inputs, count_wrong, run_op};
    let ring = [2, 0, 1];
    for op in BenchOp::ALL {
        // An all-to-all needs one equal chunk per rank; the others take
        // uneven chunks too.
        let len = if op == BenchOp::AllToAll { 9 } else { 10 };
        let inputs = bench_inputs(3, len);
        let mut outputs = inputs.clone();
        run_op(op, &mut outputs, &ring).unwrap();
        assert_eq!(count_wrong(op, &inputs, &outputs, &ring), 0, "{op}");
        // Position 0 (rank 2) owns chunk 0 in every op, element 0 included.
        outputs[2][0] += 1.0;
        assert_eq!(count_wrong(op, &inputs, &outputs, &ring), 1, "{op}");
    }
}

#[test]
fn timeline_runs_steps_back_to_back_and_ends_at_the_modeled_time() {
    let shape = TorusShape::new(&[4, 3], &[false, true]).unwrap();
    let mut buffers = vec![vec![1.0f32; 100]; 12];
    let traffic = torus_all_reduce(&mut buffers, &shape, ReduceOp::Mean).unwrap();
    let model = LinkModel::new(2e-6, 10e9).unwrap();
    let timeline = traffic.timeline(|_, _| model);
    assert_eq!(timeline.len(), traffic.transfers.len());
    let last = timeline.iter().map(|t| t.end_seconds).fold(0.0, f64::max);
    let modeled = traffic.modeled_seconds(&model);
    assert!(
        (last - modeled).abs() <= 1e-12 * modeled,
        "{last} vs {modeled}"
    );
    let end_of = |keep: &dyn Fn(&TimedTransfer) -> bool| {
        timeline
            .iter()
            .filter(|t| keep(t))
            .map(|t| t.end_seconds)
            .fold(0.0, f64::max)
    };
    for pair in timeline.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let (pa, pb) = (a.transfer.phase, b.transfer.phase);
        if pa == pb {
            assert_eq!(a.start_seconds, b.start_seconds);
        } else if (pa.order, pa.dim) == (pb.order, pb.dim) {
            // The pass's next step starts once every transfer of this one
            // arrived.
            assert_eq!(b.start_seconds, end_of(&|t| t.transfer.phase == pa));
        } else if pa.order == pb.order {
            // Another axis's pass of the same round starts with the round.
            let first = timeline.iter().find(|t| t.transfer.phase.order == pa.order);
            assert_eq!(Some(b.start_seconds), first.map(|t| t.start_seconds));
        } else {
            // The next round starts once every pass of this one ended.
            assert_eq!(
                b.start_seconds,
                end_of(&|t| t.transfer.phase.order == pa.order)
            );
        }
    }
    assert!(buffers.iter().all(|b| b.iter().all(|&x| x == 1.0)));
}

fn multislice_case() -> impl Strategy<Value = (MultisliceShape, usize, u64)> {
    (
        prop::collection::vec((1usize..=3, any::<bool>()), 1..=3),
        2usize..=4,
        1usize..=4,
        any::<u64>(),
    )
        .prop_flat_map(|(dims, slices, block, seed)| {
            let extents: Vec<usize> = dims.iter().map(|d| d.0).collect();
            let wrap: Vec<bool> = dims.iter().map(|d| d.1).collect();
            let slice = TorusShape::new(&extents, &wrap).expect("extents ≥ 1");
            // Hosts of `block` consecutive chips; the first is the NIC chip.
            let nic = (0..slice.device_count()).map(|i| i - i % block).collect();
            let shape = MultisliceShape::new(&slice, slices, nic).expect("a valid NIC map");
            let count = shape.device_count();
            (Just(shape), 0..=2 * count, Just(seed))
        })
}

fn bits<T: TestElement>(v: &[T]) -> Vec<u64> {
    v.iter().map(|x| x.to_f64().to_bits()).collect()
}

/// The hierarchical collectives against the naive reduction, the grid fold
/// of [`ReduceGrid`] (bitwise), and each other (bitwise).
fn check_multislice<T: TestElement>(shape: &MultisliceShape, len: usize, seed: u64) {
    let mut mix = Mix(seed);
    let n = shape.device_count();
    let inputs: Vec<Vec<T>> = random_buffers(&mut mix, n, len);
    let refs: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
    let ranges = multislice_shard_ranges(shape, len);
    let grid = ReduceGrid::torus(shape.grid().dims());
    for op in ReduceOp::ALL {
        let expected = naive_reduce(&refs, op);
        let mut reduced = inputs.clone();
        let ar = multislice_all_reduce(&mut reduced, shape, op).expect("valid");
        for b in &reduced {
            assert_close(op, &refs, &expected, b);
            assert_eq!(bits(b), bits(&reduced[0]), "devices disagree bitwise");
        }
        let mut scattered = inputs.clone();
        let rs = multislice_reduce_scatter(&mut scattered, shape, op).expect("valid");
        assert_eq!(rs, multislice_reduce_scatter_traffic(shape, len, T::BYTES));
        let mut both = rs.clone();
        both.transfers
            .extend(multislice_all_gather_traffic(shape, len, T::BYTES, 4).transfers);
        assert_eq!(ar, both, "all-reduce = reduce-scatter + all-gather");
        for (d, range) in ranges.iter().enumerate() {
            let mut folded = vec![T::ZERO; range.len()];
            let start = range.start;
            grid.reduce_for(d, op, &mut folded, &mut |rank, off, buf: &mut [T]| {
                buf.copy_from_slice(&inputs[rank][start + off..start + off + buf.len()]);
            });
            assert_eq!(
                bits(&folded),
                bits(&scattered[d][range.clone()]),
                "{op:?} {d}"
            );
            assert_eq!(
                bits(&folded),
                bits(&reduced[d][range.clone()]),
                "{op:?} {d}"
            );
        }
        // The all-gather of the scattered shards completes the all-reduce.
        let ag = multislice_all_gather(&mut scattered, shape).expect("valid");
        assert_eq!(ag, multislice_all_gather_traffic(shape, len, T::BYTES, 0));
        for b in &scattered {
            assert_eq!(
                bits(b),
                bits(&reduced[0]),
                "{op:?}: gathered != all-reduced"
            );
        }
    }
    check_multislice_traffic(shape, len, T::BYTES);
}

/// Per link, the reduce-scatter's traffic is the schedule: per slice the
/// slice torus's own reduce-scatter, plus one DCN record per host NIC pair
/// carrying chunk `k` of every twin's shard to slice `k`.
fn check_multislice_traffic(shape: &MultisliceShape, len: usize, elem: usize) {
    let traffic = multislice_reduce_scatter_traffic(shape, len, elem);
    let chips = shape.chips_per_slice();
    let slices = shape.slices();
    let slice = shape.slice();
    let mut want_ici = std::collections::BTreeMap::new();
    for s in 0..slices {
        for ((a, b), bytes) in torus_reduce_scatter_traffic(slice, len, elem).per_link() {
            want_ici.insert((a + s * chips, b + s * chips), bytes);
        }
    }
    let own = torus_shard_ranges(slice, len);
    let mut want_dcn = std::collections::BTreeMap::new();
    for d in 0..shape.device_count() {
        let (s, local) = (d / chips, d % chips);
        for k in (0..slices).filter(|&k| k != s) {
            let bytes = (chunk_range(own[local].len(), slices, k).len() * elem) as u64;
            if bytes > 0 {
                *want_dcn
                    .entry((shape.nic_of(d), shape.nic_of(k * chips + local)))
                    .or_insert(0) += bytes;
            }
        }
    }
    let (dcn, ici): (Vec<Transfer>, Vec<Transfer>) = traffic
        .transfers
        .iter()
        .partition(|t| t.phase.dim == DCN_AXIS);
    // Passes partition the records and run back to back.
    let ici_model = LinkModel::new(1e-6, 4e10).unwrap();
    let dcn_model = LinkModel::new(1e-5, 1e10).unwrap();
    let link = |s: usize, d: usize| {
        if s / chips == d / chips {
            ici_model
        } else {
            dcn_model
        }
    };
    let passes = traffic.passes(link);
    assert_eq!(
        passes.iter().map(|p| p.bytes).sum::<u64>(),
        traffic.total_bytes()
    );
    // Rounds one after another, each as long as its longest pass.
    let mut rounds: std::collections::BTreeMap<u32, f64> = Default::default();
    for pass in &passes {
        let longest = rounds.entry(pass.order).or_insert(0.0);
        *longest = longest.max(pass.seconds());
    }
    let total: f64 = rounds.values().sum();
    let modeled = traffic.modeled_seconds_by_link(link);
    assert!(
        (total - modeled).abs() <= 1e-12 * modeled.max(1.0),
        "{total} vs {modeled}"
    );
    assert!(
        passes
            .windows(2)
            .filter(|w| w[0].order != w[1].order)
            .all(|w| w[0].end_seconds <= w[1].start_seconds + 1e-15)
    );
    assert!(passes.iter().all(|p| p.is_dcn() == (p.dim == DCN_AXIS)));
    assert_eq!(Traffic { transfers: ici }.per_link(), want_ici);
    assert_eq!(
        Traffic {
            transfers: dcn.clone()
        }
        .per_link(),
        want_dcn
    );
    for t in &dcn {
        assert_eq!((t.phase.step, t.hops, t.phase.order), (0, 1, 3), "{t:?}");
        assert_ne!(t.src / chips, t.dst / chips, "a DCN record crosses slices");
        assert_eq!(t.src % chips, t.dst % chips, "between twin hosts");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn multislice_collectives_are_the_grid_fold((shape, len, seed) in multislice_case()) {
        check_multislice::<f32>(&shape, len, seed);
        check_multislice::<f64>(&shape, len, seed);
        check_multislice::<i32>(&shape, len, seed);
    }
}

#[test]
fn the_dcn_pass_is_one_exchange_at_rail_bandwidth() {
    // 2 slices of a 4-chip ring, hosts of 2 chips: after the slice's
    // reduce-scatter each chip holds len/4; it sends half to its twin.
    let slice = TorusShape::new(&[4], &[true]).unwrap();
    let shape = MultisliceShape::new(&slice, 2, vec![0, 0, 2, 2]).unwrap();
    let len = 8000;
    let traffic = multislice_reduce_scatter_traffic(&shape, len, 4);
    let ici = LinkModel::new(1e-6, 50e9).unwrap();
    let dcn = LinkModel::new(10e-6, 25e9).unwrap();
    let link = |s: usize, d: usize| if s / 4 == d / 4 { ici } else { dcn };
    let passes = traffic.passes(link);
    let last = passes.last().unwrap();
    assert_eq!(last.name, "reduce_scatter.dcn");
    assert!(last.is_dcn());
    // Per host: 2 chips x 1000 elements x 4 bytes, each way, on each rail.
    assert_eq!(last.bytes, 2 * 2 * 2 * 1000 * 4);
    let closed = 10e-6 + (2 * 1000 * 4) as f64 / 25e9;
    assert!((last.seconds() - closed).abs() < 1e-15, "{last:?}");
    // The slice's 4-ring sends half of the buffer each way: 3 steps of 1000 elements.
    let ring = 3.0 * ici.message_seconds(1000 * 4, 1);
    assert!(
        (passes[0].seconds() - ring).abs() < 1e-15,
        "{:?}",
        passes[0]
    );
    let total = traffic.modeled_seconds_by_link(link);
    assert!((total - (ring + closed)).abs() < 1e-12);
}

#[test]
fn invalid_multislice_shapes_are_descriptive_errors() {
    let slice = TorusShape::new(&[2, 2], &[false, false]).unwrap();
    for (slices, nic) in [
        (1, vec![0, 0, 0, 0]),
        (2, vec![0, 0, 0]),
        (2, vec![1, 0, 0, 0]),
        (2, vec![0, 0, 0, 9]),
    ] {
        let e = MultisliceShape::new(&slice, slices, nic.clone()).unwrap_err();
        assert!(
            matches!(e, CollectiveError::InvalidMultislice { .. }),
            "{slices} {nic:?}: {e}"
        );
    }
    let shape = MultisliceShape::new(&slice, 2, vec![0, 0, 0, 0]).unwrap();
    let mut short = vec![vec![0f32; 3]; 7];
    assert_eq!(
        multislice_all_reduce(&mut short, &shape, ReduceOp::Sum),
        Err(CollectiveError::BufferCount {
            expected: 8,
            got: 7
        })
    );
    let mut ragged = vec![vec![0f32; 3]; 8];
    ragged[5].push(1.0);
    assert!(matches!(
        multislice_reduce_scatter(&mut ragged, &shape, ReduceOp::Sum),
        Err(CollectiveError::LengthMismatch { rank: 5, .. })
    ));
}

/// The fused torus all-reduce against the staged passes it replaced (the
/// torus reduce-scatter, then the all-gather that undoes it): the same
/// values bit for bit, for every op and element type.
fn check_fused_matches_staged<T: TestElement + PartialEq + std::fmt::Debug>(
    shape: &TorusShape,
    len: usize,
    seed: u64,
) {
    let mut mix = Mix(seed);
    let inputs: Vec<Vec<T>> = random_buffers(&mut mix, shape.device_count(), len);
    for op in ReduceOp::ALL {
        let mut fused = inputs.clone();
        torus::torus_all_reduce_slices(
            fused.iter_mut().map(Vec::as_mut_slice).collect(),
            shape,
            op,
        );
        let mut staged = inputs.clone();
        torus::torus_reduce_scatter_slices(
            staged.iter_mut().map(Vec::as_mut_slice).collect(),
            shape,
            op,
        );
        torus::torus_all_gather_slices(staged.iter_mut().map(Vec::as_mut_slice).collect(), shape);
        assert_eq!(
            fused,
            staged,
            "{op:?} on {:?}, {len} elements",
            shape.dims()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn fused_torus_all_reduce_matches_the_staged_passes(
        (shape, len, seed) in torus_case(),
        long in prop::option::weighted(0.25, 0usize..5000),
    ) {
        let len = long.unwrap_or(len);
        check_fused_matches_staged::<f32>(&shape, len, seed);
        check_fused_matches_staged::<f64>(&shape, len, seed);
        check_fused_matches_staged::<i32>(&shape, len, seed);
    }
}

/// Large enough for several slices and pieces per owner and for the
/// parallel path (over `PARALLEL_MIN_BYTES`), on the bench's 4×2 torus and
/// a 3D one.
#[test]
fn fused_torus_all_reduce_matches_the_staged_passes_in_parallel() {
    for (dims, wrap) in [
        (vec![4, 2], vec![true, false]),
        (vec![2, 3, 2], vec![true, true, false]),
    ] {
        let shape = TorusShape::new(&dims, &wrap).unwrap();
        let len = 150_001;
        check_fused_matches_staged::<f32>(&shape, len, 7);
    }
}
