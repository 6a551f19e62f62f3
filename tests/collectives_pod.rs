//! Collectives on a pod's devices: real data, traffic charged to the links,
//! completion in simulated time.

use optirs_tpu::Pod;
use optirs_tpu::collectives::pod::CollectiveOutcome;
use optirs_tpu::collectives::{ReduceOp, naive_reduce};
use optirs_tpu::health::Fault;
use optirs_tpu::topology::{DeviceId, Link, LinkTraffic};

fn link_bytes(pod: &mut Pod) -> u64 {
    let world = pod.world_mut();
    world
        .query::<(&Link, &LinkTraffic)>()
        .iter(world)
        .map(|(_, t)| t.bytes_ab + t.bytes_ba)
        .sum()
}

fn inputs<T: Copy>(n: usize, len: usize, f: impl Fn(usize, usize) -> T) -> Vec<Vec<T>> {
    (0..n)
        .map(|r| (0..len).map(|i| f(r, i)).collect())
        .collect()
}

#[test]
fn all_reduce_on_a_2d_torus_moves_real_data_over_the_links() {
    let mut pod = Pod::from_preset("v5e-16").unwrap();
    let original = inputs(16, 1000, |r, i| (r * 1000 + i) as f32 * 0.25);
    let mut buffers = original.clone();
    let before = pod.clock().now_ns;
    let report = pod.all_reduce(&mut buffers, ReduceOp::Sum).unwrap();
    let slices: Vec<&[f32]> = original.iter().map(Vec::as_slice).collect();
    let expected = naive_reduce(&slices, ReduceOp::Sum);
    for buffer in &buffers {
        for (got, want) in buffer.iter().zip(&expected) {
            assert!((got - want).abs() <= want.abs() * 1e-6, "{got} vs {want}");
        }
    }
    assert_eq!(report.bytes, 4000);
    assert_eq!(link_bytes(&mut pod), report.link_bytes);
    // A 4x4 torus all-reduce sends 2(n-1)/n of the buffer per ring per axis.
    assert!(report.link_bytes > 0 && report.links_used > 0);
    assert!(report.modeled_seconds > 0.0);
    assert!(pod.clock().now_ns >= before + (report.modeled_seconds * 1e9) as u64);
    assert!(matches!(
        pod.world().get::<CollectiveOutcome>(report.entity),
        Some(CollectiveOutcome::Completed { .. })
    ));
}

#[test]
fn integer_collectives_are_exact_on_a_3d_mesh() {
    let mut pod = Pod::from_preset("v4-16").unwrap();
    for op in [
        ReduceOp::Sum,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Product,
        ReduceOp::Mean,
    ] {
        let original = inputs(8, 13, |r, i| (r as i32 - 3) * 7 + i as i32);
        let mut buffers = original.clone();
        pod.all_reduce(&mut buffers, op).unwrap();
        let slices: Vec<&[i32]> = original.iter().map(Vec::as_slice).collect();
        let expected = naive_reduce(&slices, op);
        assert!(buffers.iter().all(|b| *b == expected), "{op:?}");
    }
    let mut buffers = inputs(8, 5, |r, i| (r * 10 + i) as f64);
    pod.broadcast(&mut buffers, 3).unwrap();
    assert!(
        buffers
            .iter()
            .all(|b| *b == vec![30.0, 31.0, 32.0, 33.0, 34.0])
    );
    let mut buffers = inputs(8, 3, |r, _| r as i32);
    pod.all_gather(&mut buffers).unwrap();
    let mut buffers = inputs(8, 16, |_, i| i as i32);
    let (_, ring) = pod.reduce_scatter(&mut buffers, ReduceOp::Sum).unwrap();
    assert_eq!(ring.len(), 8);
    // Ring position 0 owns chunk 0 (elements 0..2), summed over 8 ranks.
    assert_eq!(&buffers[ring[0]][..2], &[0, 8]);
}

#[test]
fn one_device_and_short_buffers_work() {
    let mut pod = Pod::from_ron_str(
        "Pod(name: \"one\", generation: \"v5e\", shape: \"1x1\")",
        "one",
    )
    .unwrap();
    let mut buffers = vec![vec![1.5f32, 2.5]];
    let report = pod.all_reduce(&mut buffers, ReduceOp::Sum).unwrap();
    assert_eq!(buffers[0], vec![1.5, 2.5]);
    assert_eq!(report.link_bytes, 0);
    let mut pod = Pod::from_preset("v5e-16").unwrap();
    let mut buffers = inputs(16, 3, |r, _| r as i32);
    pod.all_reduce(&mut buffers, ReduceOp::Sum).unwrap();
    assert!(buffers.iter().all(|b| *b == vec![120, 120, 120]));
}

#[test]
fn dead_devices_and_cut_links_refuse_a_launch_and_change_nothing() {
    let mut pod = Pod::from_preset("v5e-16").unwrap();
    pod.kill_device(5).unwrap();
    let mut buffers = inputs(16, 4, |r, _| r as f32);
    let error = pod
        .all_reduce(&mut buffers, ReduceOp::Sum)
        .unwrap_err()
        .to_string();
    assert!(error.contains("device 5"), "{error}");

    let mut pod = Pod::from_preset("v5e-16").unwrap();
    pod.inject(Fault::CutLink(DeviceId(0), DeviceId(1)))
        .unwrap();
    let mut buffers = inputs(16, 64, |r, _| r as f32);
    let error = pod
        .all_reduce(&mut buffers, ReduceOp::Sum)
        .unwrap_err()
        .to_string();
    assert!(error.contains("cut"), "{error}");
    assert_eq!(link_bytes(&mut pod), 0, "no counter moved");

    let error = pod
        .all_reduce(&mut vec![vec![0f32]; 3], ReduceOp::Sum)
        .unwrap_err()
        .to_string();
    assert!(error.contains("16 devices but 3 buffers"), "{error}");
}

#[test]
fn a_participant_that_fails_mid_collective_fails_it() {
    // Slow links: 100 MB at 0.1 MB/s per hop takes far longer than the
    // heartbeat timeout.
    let mut pod = Pod::from_ron_str(
        "Pod(name: \"slow\", generation: \"v5e\", shape: \"4x4\", ici: (bandwidth_gb_per_s: 0.0001))",
        "slow",
    )
    .unwrap();
    let mut buffers = inputs(16, 25_000_000 / 16, |r, _| r as f32);
    let report = pod.launch_all_reduce(&mut buffers, ReduceOp::Sum).unwrap();
    pod.kill_device(9).unwrap();
    let error = pod.wait_for_collective(&report).unwrap_err().to_string();
    assert!(error.contains("device 9"), "{error}");
    assert!(pod.clock().now_ns < report.completes_at_ns);
}

#[test]
fn reduce_scatter_and_all_gather_return_the_same_chunk_order() {
    use optirs_tpu::collectives::chunk_range;
    let mut pod = Pod::from_preset("v5e-16").unwrap();
    let (n, len) = (16, 37);
    let original = inputs(n, len, |r, i| (r * 100 + i) as i32);
    let mut buffers = original.clone();
    let (_, ring) = pod.reduce_scatter(&mut buffers, ReduceOp::Sum).unwrap();
    let (_, gather_ring) = pod.all_gather(&mut buffers).unwrap();
    assert_eq!(ring, gather_ring, "one order for both");
    assert_ne!(
        ring,
        (0..n).collect::<Vec<_>>(),
        "the snake ring is not device order"
    );
    // Reduce-scatter then all-gather in the same order is an all-reduce.
    let slices: Vec<&[i32]> = original.iter().map(Vec::as_slice).collect();
    let expected = naive_reduce(&slices, ReduceOp::Sum);
    assert!(buffers.iter().all(|b| *b == expected));
    // All-gather alone: position i's chunk i, from device ring[i].
    let mut buffers = original.clone();
    let (_, ring) = pod.all_gather(&mut buffers).unwrap();
    for (i, &device) in ring.iter().enumerate() {
        let chunk = chunk_range(len, n, i);
        for b in &buffers {
            assert_eq!(b[chunk.clone()], original[device][chunk.clone()]);
        }
    }
}
