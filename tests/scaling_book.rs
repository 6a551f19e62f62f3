//! The modeled collectives against the JAX scaling book ("How to Scale
//! Your Model", "Sharded matrices"): its closed forms evaluated with our
//! link figures (`src/hardware.rs`), and its measured v5e all-gather.
//! `W_bidi` = 2 × one direction's link bandwidth. Every assertion prints
//! ours, the formula and the error; `cargo test --test scaling_book --
//! --nocapture` prints the table of docs/benchmarks-collectives.md.

use optirs_tpu::TpuGeneration;
use optirs_tpu::collectives::{LinkModel, TorusShape, all_gather_cost, reduce_scatter_cost};

fn ici(generation: TpuGeneration) -> LinkModel {
    let spec = generation.spec();
    LinkModel::new(spec.ici_latency_ns as f64 * 1e-9, spec.ici_bytes_per_s).unwrap()
}

/// Prints a row and asserts `ours` is within `tolerance` of `formula`.
fn row(what: &str, ours: f64, formula: f64, tolerance: f64) {
    let error = ours / formula - 1.0;
    println!(
        "| {what} | {:.1} us | {:.1} us | {:+.1}% |",
        ours * 1e6,
        formula * 1e6,
        error * 100.0
    );
    assert!(
        error.abs() <= tolerance,
        "{what}: ours {ours:e} s, formula {formula:e} s, error {:+.2}%",
        error * 100.0
    );
}

/// bf16[2048, 8192]: 33.5 MB.
const BOOK_ELEMS: usize = 2048 * 8192;

#[test]
fn v5e_8x4_all_gather_over_the_4_chip_axis_without_wraparound() {
    let shape = TorusShape::new(&[8, 4], &[false, false]).unwrap();
    let link = ici(TpuGeneration::V5e);
    let ours = all_gather_cost(&shape, &[1], BOOK_ELEMS, 2, &link).seconds();
    let v = (BOOK_ELEMS * 2) as f64;
    // No wraparound: X − 1 steps of V/X one way.
    let formula = 3.0 * (v / 4.0) / link.bandwidth_bytes_per_second();
    row(
        "v5e 8x4, 34 MB over the 4-chip axis (mesh)",
        ours,
        formula,
        0.10,
    );
    let measured = 680e-6;
    println!(
        "book: measured 680 us, {:.2}x ours; with wraparound (bidirectional) ours would be {:.0} us",
        measured / ours,
        3.0 / 4.0 * v / (2.0 * link.bandwidth_bytes_per_second()) * 1e6
    );
    assert!(
        measured / ours <= 1.5 && measured / ours >= 1.0,
        "measured 680 us vs ours {:.1} us: {:.2}x",
        ours * 1e6,
        measured / ours
    );
}

#[test]
fn v5e_16x16_one_axis_with_wraparound_is_the_bidirectional_ring() {
    let shape = TorusShape::new(&[16, 16], &[true, true]).unwrap();
    let link = ici(TpuGeneration::V5e);
    let v = (BOOK_ELEMS * 2) as f64;
    let w_bidi = 2.0 * link.bandwidth_bytes_per_second();
    let formula = 15.0 / 16.0 * v / w_bidi;
    for axis in [0, 1] {
        let ag = all_gather_cost(&shape, &[axis], BOOK_ELEMS, 2, &link).seconds();
        let rs = reduce_scatter_cost(&shape, &[axis], BOOK_ELEMS, 2, &link).seconds();
        row(
            &format!("v5e 16x16, 34 MB all-gather along axis {axis}"),
            ag,
            formula,
            0.10,
        );
        row(
            &format!("v5e 16x16, 34 MB reduce-scatter along axis {axis}"),
            rs,
            formula,
            0.10,
        );
        // Exact up to the 15 hops' latency.
        let latency = 15.0 * link.latency_seconds();
        assert!(
            (ag - formula - latency).abs() <= 1e-12,
            "{ag} vs {formula} + {latency}"
        );
    }
}

#[test]
fn several_axes_at_once_divide_the_time_by_the_axis_count() {
    let cases: [(&str, TpuGeneration, &[usize]); 4] = [
        ("v4 4x4x4", TpuGeneration::V4, &[4, 4, 4]),
        ("v5p 4x4x8", TpuGeneration::V5p, &[4, 4, 8]),
        ("v5p 16x16x24", TpuGeneration::V5p, &[16, 16, 24]),
        ("v5e 16x16", TpuGeneration::V5e, &[16, 16]),
    ];
    for (name, generation, dims) in cases {
        let shape = TorusShape::new(dims, &vec![true; dims.len()]).unwrap();
        let link = ici(generation);
        let axes: Vec<usize> = (0..dims.len()).collect();
        let group = shape.device_count();
        // 4 GiB of bf16, a multiple of the group.
        let len = (2usize << 30).next_multiple_of(group);
        let v = (len * 2) as f64;
        let formula = v / (2.0 * link.bandwidth_bytes_per_second() * dims.len() as f64);
        let ag = all_gather_cost(&shape, &axes, len, 2, &link).seconds();
        let rs = reduce_scatter_cost(&shape, &axes, len, 2, &link).seconds();
        row(
            &format!("{name}, 4.3 GB all-gather over every axis"),
            ag,
            formula,
            0.10,
        );
        row(
            &format!("{name}, 4.3 GB reduce-scatter over every axis"),
            rs,
            formula,
            0.10,
        );
    }
}

#[test]
fn a_small_array_is_latency_bound() {
    // 4 chips with wraparound, 4 KB: the bandwidth term is 30 ns.
    let shape = TorusShape::new(&[4], &[true]).unwrap();
    let link = ici(TpuGeneration::V5e);
    let ours = all_gather_cost(&shape, &[0], 2048, 2, &link).seconds();
    // Our bidirectional ring runs X − 1 = 3 steps (each half goes all the
    // way round); the book's counts X/2 = 2 hops of ~1 us (each shard both
    // ways half round), 2 us.
    let v = 4096.0;
    let formula =
        3.0 * link.latency_seconds() + 0.75 * v / (2.0 * link.bandwidth_bytes_per_second());
    row(
        "v5e 4-ring, 4 KB all-gather (latency-bound)",
        ours,
        formula,
        0.01,
    );
    let book = 2e-6;
    println!(
        "book: 2 hops ~ 2 us; ours {:.2} us, {:.2}x",
        ours * 1e6,
        ours / book
    );
    assert!(ours / book <= 1.6, "ours {ours:e} s vs the book's 2 us");
}

/// `topology`'s all-reduce bandwidth (every link, both directions) and the
/// step model agree: for a buffer of `V` bytes on each of `N` devices, an
/// all-reduce moves `2·V·(N−1)` bytes over the links, so the figure
/// implies the floor `2·V·(N−1) / all_reduce_bandwidth`. On a pod whose
/// every axis of 3 or more chips wraps, the modeled all-reduce is that
/// floor within 12% (the uneven shapes are the farthest: v5p-256, 4x4x8,
/// +9.5%; tpu7x-512, 4x8x8, +11.7%); on a mesh (a line per axis, or a 2-chip axis) it is
/// above it by what the lines cost (docs/topology.md).
#[test]
fn the_topology_all_reduce_figure_is_the_modeled_all_reduce_floor() {
    use optirs_tpu::Pod;
    use optirs_tpu::collectives::all_reduce_cost;
    use optirs_tpu::collectives::pod::slice_torus;
    use optirs_tpu::topology::PRESETS;
    for (name, _) in PRESETS {
        let mut pod = Pod::from_preset(name).unwrap();
        let topology = pod.topology().clone();
        let figures = pod.figures();
        let shape = slice_torus(&topology).unwrap();
        let link = LinkModel::new(
            topology.ici.latency_ns as f64 * 1e-9,
            topology.ici.bytes_per_s,
        )
        .unwrap();
        let n = shape.device_count();
        let axes: Vec<usize> = (0..shape.dims().len()).collect();
        // 1 GiB of f32 per device: bandwidth-bound.
        let len = (256usize << 20).next_multiple_of(n);
        let v = (len * 4) as f64;
        let ours = all_reduce_cost(&shape, &axes, len, 4, &link).seconds();
        let floor = 2.0 * v * (n as f64 - 1.0) / figures.allreduce_bytes_per_s;
        let ratio = ours / floor;
        let torus = shape
            .dims()
            .iter()
            .zip(shape.wraparound())
            .all(|(&d, &w)| d >= 3 && w);
        println!(
            "{name} {:?} wrap {:?}: modeled {:.3} ms, topology floor {:.3} ms, ratio {ratio:.3}",
            shape.dims(),
            shape.wraparound(),
            ours * 1e3,
            floor * 1e3
        );
        if torus {
            assert!(
                (ratio - 1.0).abs() <= 0.12,
                "{name}: modeled {ours:e} s, floor {floor:e} s, error {:+.2}%",
                (ratio - 1.0) * 100.0
            );
        } else {
            // A line of n chips takes (n−1)·V/n one way where its links in
            // both directions could carry it in V/2: up to 2(n−1)/n above.
            assert!(
                (1.0..=2.0).contains(&ratio),
                "{name}: modeled {ours:e} s, floor {floor:e} s, ratio {ratio:.3}"
            );
        }
    }
}
