//! Snapshot capture, checkpoint save and verified restore.
//!
//! `cargo bench --bench checkpoint`

use criterion::{Criterion, criterion_group, criterion_main};
use optirs_tpu::Pod;
use optirs_tpu::checkpoint::{SnapshotRegistry, verify_checkpoint, write_checkpoint};

/// A v4 slice of 16,384 chips: 16,384 devices + 4,096 hosts + 49,152 links
/// = 69,632 engine entities.
fn big_pod() -> Pod {
    let mut pod = Pod::from_ron_str(
        "Pod(name: \"v4-16384\", generation: \"v4\", shape: \"16x32x32\")",
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
    group.bench_function("save/70k-entities", |b| {
        b.iter(|| {
            n += 1;
            let snapshot = pod.snapshot().unwrap();
            write_checkpoint(
                dir.path(),
                &format!("c{n}"),
                "bench",
                &snapshot,
                &mut |_| Ok(()),
            )
            .unwrap()
        })
    });
    let saved = dir.path().join("c1");
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

criterion_group!(benches, checkpoint);
criterion_main!(benches);
