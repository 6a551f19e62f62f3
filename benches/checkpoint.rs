//! Snapshot capture, checkpoint save and verified restore: a 70k-entity
//! pod without tensors, and a pod holding 1 GiB of tensor data (constant
//! literals of a program) against the SHA-256 throughput of the same bytes.
//!
//! `cargo bench --bench checkpoint -- --warm-up-time 1 --measurement-time 3`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ndarray::{ArrayD, IxDyn};
use optirs_tpu::Pod;
use optirs_tpu::checkpoint::{SnapshotRegistry, verify_checkpoint, write_checkpoint};
use optirs_tpu::exec::kernels::Tensor;
use optirs_tpu::xla::{DType, GraphBuilder, TensorType};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::time::{Duration, Instant};

/// Constant literals in the tensor pod: 16 × 64 MiB of f32 = 1 GiB.
const LITERALS: usize = 16;
const LITERAL_ELEMENTS: usize = 16 << 20;

/// A v4 slice of 16,384 chips: 16,384 devices + 4,096 hosts + 49,152 links
/// = 69,632 engine entities.
/// Times `iters` saves (capture + write + fsync) of `pod` under `root`,
/// named `c{n}` on; the previous checkpoint is removed untimed, so the disk
/// does not fill with thousands of them during a run.
fn timed_saves(pod: &mut Pod, root: &Path, n: &mut u64, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        *n += 1;
        let _ = std::fs::remove_dir_all(root.join(format!("c{}", *n - 1)));
        let start = Instant::now();
        let snapshot = pod.snapshot().unwrap();
        write_checkpoint(root, &format!("c{n}"), "bench", &snapshot, &mut |_| Ok(())).unwrap();
        total += start.elapsed();
    }
    total
}

fn big_pod() -> Pod {
    let mut pod = Pod::from_ron_str(
        "Pod(name: \"v4-16384\", generation: \"v4\", shape: \"16x32x32\", custom: true)",
        "bench",
    )
    .unwrap();
    pod.run(10);
    pod
}

fn checkpoint(c: &mut Criterion) {
    let mut group = c.benchmark_group("checkpoint");
    group.sample_size(20);
    let mut pod = big_pod();
    let snapshot = pod.snapshot().unwrap();
    println!(
        "world: {} entities, {} bytes",
        snapshot.entity_count,
        snapshot.to_bytes().len()
    );
    group.bench_function("capture/70k-entities", |b| {
        b.iter(|| pod.snapshot().unwrap())
    });
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut n = 0u64;
    // Capture + write + fsync; the previous checkpoint is removed untimed,
    // so the disk does not fill with thousands of them during the run.
    group.bench_function("save/70k-entities", |b| {
        b.iter_custom(|iters| timed_saves(&mut pod, dir.path(), &mut n, iters))
    });
    let saved = dir.path().join(format!("c{n}"));
    group.bench_function("verify/70k-entities", |b| {
        let registry = pod.world().resource::<SnapshotRegistry>();
        b.iter(|| verify_checkpoint(&saved, registry).unwrap())
    });
    group.bench_function("verified_restore/70k-entities", |b| {
        b.iter(|| {
            let (_, snapshot) =
                verify_checkpoint(&saved, pod.world().resource::<SnapshotRegistry>()).unwrap();
            pod.restore_snapshot(&snapshot).unwrap()
        })
    });
    group.finish();
}

/// A v4-16 pod with a program of [`LITERALS`] large f32 constants summed
/// into one output (not compiled: the literals are the tensor data).
fn tensor_pod() -> Pod {
    let mut pod = Pod::from_preset("v4-16").unwrap();
    let mut b = GraphBuilder::new(pod.world_mut(), "weights");
    let mut sum = b.parameter(TensorType::new(DType::F32, [LITERAL_ELEMENTS]));
    for k in 0..LITERALS {
        let values: Vec<f32> = (0..LITERAL_ELEMENTS)
            .map(|i| (i as f32 * 1e-3 + k as f32).sin())
            .collect();
        let w = b.constant(Tensor::F32(
            ArrayD::from_shape_vec(IxDyn(&[LITERAL_ELEMENTS]), values).unwrap(),
        ));
        sum = b.add(sum, w);
    }
    b.output(sum);
    b.finish();
    pod
}

fn checkpoint_tensors(c: &mut Criterion) {
    let mut group = c.benchmark_group("checkpoint-1GiB-tensors");
    group.sample_size(10);
    let mut pod = tensor_pod();
    let snapshot = pod.snapshot().unwrap();
    let bytes = snapshot.tensor_bytes();
    println!(
        "world: {} entities, {} tensors, {bytes} tensor bytes",
        snapshot.entity_count,
        snapshot.tensors.len()
    );
    group.throughput(Throughput::Bytes(bytes));
    group.bench_function("sha256", |b| {
        b.iter(|| {
            let mut hasher = Sha256::new();
            snapshot
                .tensors
                .iter()
                .for_each(|t| hasher.update(&*t.data));
            hasher.finalize()
        })
    });
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    // The disk's own bound: the same bytes written to one file and synced.
    group.bench_function("raw_write_fsync", |b| {
        b.iter(|| {
            use std::io::Write;
            let path = dir.path().join("raw");
            let mut file = std::fs::File::create(&path).unwrap();
            snapshot
                .tensors
                .iter()
                .for_each(|t| file.write_all(&t.data).unwrap());
            file.sync_all().unwrap();
            drop(file);
            std::fs::remove_file(path).unwrap();
        })
    });
    drop(snapshot);
    let mut n = 0u64;
    // Capture + write + fsync; the previous checkpoint is removed untimed.
    group.bench_function("save", |b| {
        b.iter_custom(|iters| timed_saves(&mut pod, dir.path(), &mut n, iters))
    });
    let saved = dir.path().join(format!("c{n}"));
    group.bench_function("verified_restore", |b| {
        b.iter(|| {
            let (_, snapshot) =
                verify_checkpoint(&saved, pod.world().resource::<SnapshotRegistry>()).unwrap();
            pod.restore_snapshot(&snapshot).unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, checkpoint, checkpoint_tensors);
criterion_main!(benches);
