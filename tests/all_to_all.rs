//! All-to-all on real buffers: a transpose of the members × chunks matrix
//! on every layout (ring, torus, slices over DCN), held against a naive
//! transpose; its relay schedule's time against the closed form, and the
//! JAX scaling book's ratio to an all-gather.

use optirs_tpu::collectives::{
    CollectiveError, DCN_AXIS, LinkModel, MultisliceShape, PhaseKind, TorusShape, all_to_all,
    multislice_all_to_all, ragged_all_to_all, ring_all_to_all_seconds, torus_all_gather_traffic,
    torus_all_to_all, torus_all_to_all_seconds,
};
use proptest::prelude::*;

/// Member `i`'s chunk `j` of the output is member `j`'s chunk `i`.
fn naive_transpose<T: Copy>(inputs: &[Vec<T>]) -> Vec<Vec<T>> {
    let n = inputs.len();
    let chunk = inputs.first().map_or(0, |b| b.len() / n.max(1));
    (0..n)
        .map(|i| {
            (0..n)
                .flat_map(|j| inputs[j][i * chunk..(i + 1) * chunk].iter().copied())
                .collect()
        })
        .collect()
}

fn buffers(n: usize, len: usize) -> Vec<Vec<i32>> {
    (0..n)
        .map(|r| (0..len).map(|e| (r * 1_000_003 + e) as i32).collect())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Ring all-to-all is the transpose, twice is the identity, and every
    /// chunk crosses as many links as its shorter way round.
    #[test]
    fn ring_all_to_all_is_the_transpose(n in 1usize..9, chunk in 0usize..6) {
        let inputs = buffers(n, n * chunk);
        let mut out = inputs.clone();
        let ring: Vec<usize> = (0..n).collect();
        let traffic = all_to_all(&mut out, &ring).unwrap();
        prop_assert_eq!(&out, &naive_transpose(&inputs));
        let hops: usize = (0..n)
            .flat_map(|i| (0..n).map(move |j| ((j + n - i) % n).min((i + n - j) % n)))
            .sum();
        prop_assert_eq!(traffic.total_bytes(), (hops * chunk * 4) as u64);
        all_to_all(&mut out, &ring).unwrap();
        prop_assert_eq!(out, inputs);
    }

    /// Ragged: each output is its receipts in member order, the counts'
    /// bytes on the links.
    #[test]
    fn ragged_all_to_all_delivers_every_segment(
        counts in (1usize..6).prop_flat_map(|n| proptest::collection::vec(
            proptest::collection::vec(0usize..4, n), n)),
    ) {
        let n = counts.len();
        let inputs: Vec<Vec<f64>> = counts
            .iter()
            .enumerate()
            .map(|(i, row)| (0..row.iter().sum::<usize>()).map(|e| (i * 100 + e) as f64).collect())
            .collect();
        let ring: Vec<usize> = (0..n).collect();
        let (outputs, traffic) = ragged_all_to_all(&inputs, &ring, &counts).unwrap();
        for j in 0..n {
            let mut expected = Vec::new();
            for i in 0..n {
                let start: usize = counts[i][..j].iter().sum();
                expected.extend_from_slice(&inputs[i][start..start + counts[i][j]]);
            }
            prop_assert_eq!(&outputs[j], &expected);
        }
        let moved: usize = (0..n)
            .flat_map(|i| (0..n).map(move |j| (i, j)))
            .map(|(i, j)| counts[i][j] * ((j + n - i) % n).min((i + n - j) % n))
            .sum();
        prop_assert_eq!(traffic.total_bytes(), (moved * 8) as u64);
    }

    /// A torus, with or without wraparound: the transpose over device ids,
    /// its modeled time the closed form's.
    #[test]
    fn torus_all_to_all_is_the_transpose_at_the_closed_forms_time(
        dims in proptest::collection::vec(1usize..5, 1..4),
        wrap in proptest::collection::vec(any::<bool>(), 3),
        chunk in 1usize..4,
    ) {
        let shape = TorusShape::new(&dims, &wrap[..dims.len()]).unwrap();
        let count = shape.device_count();
        let inputs = buffers(count, count * chunk);
        let mut out = inputs.clone();
        let traffic = torus_all_to_all(&mut out, &shape).unwrap();
        prop_assert_eq!(&out, &naive_transpose(&inputs));
        let model = LinkModel::new(1e-6, 1e9).unwrap();
        let modeled = traffic.modeled_seconds(&model);
        let closed = torus_all_to_all_seconds(&shape, count * chunk, 4, &model);
        prop_assert!((modeled - closed).abs() <= 1e-12 + 1e-9 * closed, "{} vs {}", modeled, closed);
        prop_assert!(traffic.transfers.iter().all(|t| t.phase.kind == PhaseKind::AllToAll && t.hops == 1));
    }
}

/// f32 and i32 alike; a length that does not split is refused, the
/// buffers untouched.
#[test]
fn an_indivisible_buffer_is_refused_and_left_as_it_was() {
    let mut floats = vec![vec![1.0f32, 2.0], vec![3.0, 4.0]];
    all_to_all(&mut floats, &[1, 0]).unwrap();
    // Ring order [1, 0]: position 0 is rank 1, so rank 1 gets its own
    // chunk 0 and rank 0's chunk 0; rank 0 the two chunks 1.
    assert_eq!(floats, [vec![4.0, 2.0], vec![3.0, 1.0]]);
    let mut ints = vec![vec![1, 2, 3], vec![4, 5, 6]];
    let err = all_to_all(&mut ints, &[0, 1]).unwrap_err();
    assert!(
        matches!(err, CollectiveError::Indivisible { len: 3, members: 2 }),
        "{err}"
    );
    assert_eq!(ints, [vec![1, 2, 3], vec![4, 5, 6]]);
    let err = ragged_all_to_all(&[vec![1.0f32]], &[0], &[vec![2]]).unwrap_err();
    assert!(err.to_string().contains("summing to 2"), "{err}");
}

/// On a bidirectional ring the busiest link carries Σ_{d≤n/2} d chunks:
/// the relay's time is the closed form's, and about a quarter of an
/// all-gather of the same buffer (the JAX scaling book), tending to it.
#[test]
fn a_ring_all_to_all_costs_about_a_quarter_of_an_all_gather() {
    let model = LinkModel::new(0.0, 1e9).unwrap();
    for (n, low, high) in [(16usize, 0.25, 0.31), (64, 0.25, 0.27)] {
        let shape = TorusShape::new(&[n], &[true]).unwrap();
        let len = n * 1024;
        let mut bufs = buffers(n, len);
        let traffic = torus_all_to_all(&mut bufs, &shape).unwrap();
        let all_to_all = traffic.modeled_seconds(&model);
        let chunk_bytes = (len / n * 4) as u64;
        let closed = ring_all_to_all_seconds(n, true, chunk_bytes, &model);
        assert!(
            (all_to_all - closed).abs() <= 1e-9 * closed,
            "{all_to_all} vs {closed}"
        );
        // An all-gather whose shard is the same buffer: n·len gathered.
        let gather = torus_all_gather_traffic(&shape, n * len, 4, 0).modeled_seconds(&model);
        let ratio = all_to_all / gather;
        println!("n = {n}: all-to-all / all-gather = {ratio:.4}");
        assert!(low < ratio && ratio < high, "n = {n}: {ratio}");
    }
}

/// Across slices: the transpose over every device of the pod; the slices'
/// axes over ICI, then one DCN pass of one transfer per host pair and
/// destination slice, each carrying its host's chips' chunks bound there.
#[test]
fn a_multislice_all_to_all_crosses_the_dcn_once() {
    let slice = TorusShape::new(&[2, 2], &[false, false]).unwrap();
    let slices = 3;
    // Two hosts a slice: chips 0, 1 use chip 0's NICs, chips 2, 3 chip 2's.
    let shape = MultisliceShape::new(&slice, slices, vec![0, 0, 2, 2]).unwrap();
    let count = shape.device_count();
    let chunk = 5;
    let inputs: Vec<Vec<f32>> = (0..count)
        .map(|r| (0..count * chunk).map(|e| (r * 1000 + e) as f32).collect())
        .collect();
    let mut out = inputs.clone();
    let traffic = multislice_all_to_all(&mut out, &shape).unwrap();
    assert_eq!(out, naive_transpose(&inputs));
    let dcn: Vec<_> = traffic
        .transfers
        .iter()
        .filter(|t| t.phase.dim == DCN_AXIS)
        .collect();
    // 2 hosts a slice × 3 slices × 2 other slices.
    assert_eq!(dcn.len(), 2 * slices * (slices - 1));
    // Per host and destination slice: 2 chips × 4 chunks (the destination
    // slice's devices) × 5 elements × 4 bytes.
    assert!(
        dcn.iter().all(|t| t.bytes == 2 * 4 * chunk as u64 * 4),
        "{dcn:?}"
    );
    assert!(
        dcn.iter()
            .all(|t| t.src % 4 == t.dst % 4 && t.src / 4 != t.dst / 4)
    );
}
