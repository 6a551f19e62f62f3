//! Checkpoints on disk: atomic commit, verification before restore, bit
//! flips, truncation, crashes at every write point, retention, replication,
//! rollback and recovery.

use optirs_tpu::Pod;
use optirs_tpu::barrier::BarrierSpec;
use optirs_tpu::checkpoint::{
    MANIFEST, SnapshotRegistry, TENSOR_FILE, WORLD_FILE, WritePoint, list_checkpoints,
    verify_checkpoint, write_checkpoint,
};
use optirs_tpu::clock::SimDuration;
use optirs_tpu::error::ErrorKind;
use optirs_tpu::exec::kernels::Tensor;
use optirs_tpu::fault_tolerance::{RecoveryPolicy, checkpoint_name};
use optirs_tpu::health::Fault;
use optirs_tpu::schedule::Compile;
use optirs_tpu::topology::DeviceId;
use optirs_tpu::xla::{DType, GraphBuilder, TensorType};

#[path = "common/checkpoint.rs"]
mod checkpoint_helpers;
use checkpoint_helpers::{manager, verify};

fn pod_with_history() -> Pod {
    let mut pod = Pod::from_preset("v4-16").unwrap();
    pod.schedule_fault(SimDuration::from_secs(1), Fault::KillDevice(DeviceId(2)));
    let id = pod
        .create_barrier(BarrierSpec::named("b").auto_arrive())
        .unwrap();
    pod.wait_for_barrier(id).unwrap();
    pod.run(50);
    // A compiled program whose constants go to the tensor file: an f32
    // weight (element i is i / 8) and a pred mask (every third element).
    let ty = TensorType::new(DType::F32, [8, 16]);
    let n = ty.element_count();
    let ramp: Vec<f64> = (0..n).map(|i| i as f64 / 8.0).collect();
    let mask: Vec<f64> = (0..n).map(|i| f64::from(i % 3 == 0)).collect();
    let mut b = GraphBuilder::new(pod.world_mut(), "weights");
    let x = b.parameter(ty.clone());
    let w = b.constant(Tensor::from_f64s(&ty, &ramp).unwrap());
    let m = b.constant(Tensor::from_f64s(&TensorType::new(DType::Pred, [8, 16]), &mask).unwrap());
    let xw = b.mul(x, w);
    let y = b.select(m, xw, x);
    b.output(y);
    b.finish();
    pod.world_mut().run_schedule(Compile);
    pod
}

#[test]
fn save_verify_restore_round_trip_through_disk() {
    let dir = tempfile::tempdir().unwrap();
    let ft = manager(vec![dir.path().into()], 5, RecoveryPolicy::RollBack);
    let mut pod = pod_with_history();
    let saved_sha = pod.world_sha256().unwrap();
    let info = ft.create_checkpoint(&mut pod).unwrap();
    assert_eq!(info.name, checkpoint_name(pod.clock().tick));
    let manifest = std::fs::read_to_string(info.paths[0].join(MANIFEST)).unwrap();
    assert!(
        manifest.contains("world.bin") && manifest.contains("sha256"),
        "{manifest}"
    );
    pod.run(500);
    assert_ne!(pod.world_sha256().unwrap(), saved_sha);
    ft.restore_checkpoint(&mut pod, &info.name).unwrap();
    assert_eq!(pod.world_sha256().unwrap(), saved_sha);
    pod.run(5); // the schedules keep running after an in-place restore
}

#[test]
fn every_bit_of_the_manifest_matters() {
    let dir = tempfile::tempdir().unwrap();
    let ft = manager(vec![dir.path().into()], 5, RecoveryPolicy::RollBack);
    let mut pod = pod_with_history();
    let info = ft.create_checkpoint(&mut pod).unwrap();
    let path = info.paths[0].join(MANIFEST);
    let original = std::fs::read(&path).unwrap();
    for byte in 0..original.len() {
        for bit in 0..8 {
            let mut flipped = original.clone();
            flipped[byte] ^= 1 << bit;
            std::fs::write(&path, &flipped).unwrap();
            assert!(
                verify(&pod, &info.paths[0]).is_err(),
                "flipping bit {bit} of manifest byte {byte} went unnoticed"
            );
        }
    }
    std::fs::write(&path, &original).unwrap();
    verify(&pod, &info.paths[0]).unwrap();
}

#[test]
fn flipped_bits_and_truncations_of_the_world_are_rejected_before_restore() {
    let dir = tempfile::tempdir().unwrap();
    let ft = manager(vec![dir.path().into()], 5, RecoveryPolicy::RollBack);
    let mut pod = pod_with_history();
    let info = ft.create_checkpoint(&mut pod).unwrap();
    pod.run(7);
    let live = pod.world_sha256().unwrap();
    for file in [WORLD_FILE, TENSOR_FILE] {
        let path = info.paths[0].join(file);
        let original = std::fs::read(&path).unwrap();
        assert!(original.len() > 1_000, "{file}: {} bytes", original.len());
        let step = (original.len() * 8 / 257).max(1);
        for bit in (0..original.len() * 8).step_by(step) {
            let mut flipped = original.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            std::fs::write(&path, &flipped).unwrap();
            let error = ft
                .restore_checkpoint(&mut pod, &info.name)
                .unwrap_err()
                .to_string();
            assert!(error.contains("SHA-256"), "{file} bit {bit}: {error}");
            assert_eq!(pod.world_sha256().unwrap(), live, "the live world changed");
        }
        for cut in [0, 1, 8, original.len() / 3, original.len() - 1] {
            std::fs::write(&path, &original[..cut]).unwrap();
            let error = ft
                .restore_checkpoint(&mut pod, &info.name)
                .unwrap_err()
                .to_string();
            assert!(error.contains("length"), "{file} cut at {cut}: {error}");
        }
        let mut longer = original.clone();
        longer.push(0);
        std::fs::write(&path, &longer).unwrap();
        assert!(verify(&pod, &info.paths[0]).is_err(), "{file} extended");
        std::fs::write(&path, &original).unwrap();
        verify(&pod, &info.paths[0]).unwrap();
    }
    let path = info.paths[0].join(WORLD_FILE);
    let original = std::fs::read(&path).unwrap();
    let manifest_path = info.paths[0].join(MANIFEST);
    let manifest = std::fs::read(&manifest_path).unwrap();
    std::fs::write(&path, &original).unwrap();
    for cut in [0, 10, manifest.len() / 2, manifest.len() - 1] {
        std::fs::write(&manifest_path, &manifest[..cut]).unwrap();
        assert!(
            verify(&pod, &info.paths[0]).is_err(),
            "manifest cut at {cut}"
        );
    }
    std::fs::remove_file(&manifest_path).unwrap();
    let error = verify(&pod, &info.paths[0]).unwrap_err();
    assert!(
        error.contains("not a checkpoint: it has no `manifest.ron`"),
        "{error}"
    );
    std::fs::write(&manifest_path, &manifest).unwrap();
    std::fs::remove_file(&path).unwrap();
    let error = verify(&pod, &info.paths[0]).unwrap_err();
    assert!(error.contains("world.bin: missing"), "{error}");
    std::fs::write(&path, &original).unwrap();
    std::fs::remove_file(info.paths[0].join(TENSOR_FILE)).unwrap();
    let error = verify(&pod, &info.paths[0]).unwrap_err();
    assert!(error.contains("tensors.safetensors: missing"), "{error}");
    assert_eq!(pod.world_sha256().unwrap(), live);
}

/// A tensor file whose digest matches the manifest but whose contents are
/// not a valid safetensors file (a consistent forgery) is still rejected
/// by the header checks, naming the tensor file.
#[test]
fn a_malformed_tensor_file_with_a_matching_digest_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let mut pod = pod_with_history();
    let snapshot = pod.snapshot().unwrap();
    write_checkpoint(dir.path(), "c", "v4-16", &snapshot, &mut |_| Ok(())).unwrap();
    let cp = dir.path().join("c");
    let original = std::fs::read(cp.join(TENSOR_FILE)).unwrap();
    let manifest = std::fs::read_to_string(cp.join(MANIFEST)).unwrap();
    let forge = |bytes: &[u8]| {
        use sha2::{Digest, Sha256};
        let digest: String = Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let mut m = optirs_tpu::checkpoint::parse_manifest(&cp, manifest.as_bytes()).unwrap();
        let entry = m.files.iter_mut().find(|f| f.name == TENSOR_FILE).unwrap();
        entry.bytes = bytes.len() as u64;
        entry.sha256 = digest;
        std::fs::write(cp.join(TENSOR_FILE), bytes).unwrap();
        std::fs::write(
            cp.join(MANIFEST),
            optirs_tpu::checkpoint::render_manifest(&m),
        )
        .unwrap();
    };
    // The header length points past the end of the file.
    let mut bad = original.clone();
    bad[..8].copy_from_slice(&(original.len() as u64).to_le_bytes());
    forge(&bad);
    let error = verify(&pod, &cp).unwrap_err();
    assert!(
        error.contains("tensors.safetensors") && error.contains("<header>"),
        "{error}"
    );
    // A bool byte that is neither 0 nor 1.
    let header_len = u64::from_le_bytes(original[..8].try_into().unwrap()) as usize;
    let mut bad = original.clone();
    *bad.last_mut().unwrap() = 7; // the last tensor is the pred mask (1-byte elements last)
    forge(&bad);
    let error = verify(&pod, &cp).unwrap_err();
    assert!(error.contains("neither 0 nor 1"), "{error}");
    assert!(
        header_len.is_multiple_of(8),
        "the header is padded to 8 bytes"
    );
    forge(&original);
    verify(&pod, &cp).unwrap();
}

#[test]
fn a_crash_at_any_write_point_leaves_the_previous_checkpoint_and_nothing_half_written() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut pod = pod_with_history();
    let first = pod.snapshot().unwrap();
    write_checkpoint(root, "first", "v4-16", &first, &mut |_| Ok(())).unwrap();
    pod.run(10);
    let second = pod.snapshot().unwrap();
    // Count the write points of one save.
    let mut points = Vec::new();
    let probe = tempfile::tempdir().unwrap();
    write_checkpoint(probe.path(), "probe", "v4-16", &second, &mut |p| {
        points.push(p.clone());
        Ok(())
    })
    .unwrap();
    assert!(
        points.contains(&WritePoint::Rename)
            && points.contains(&WritePoint::SyncFile(TENSOR_FILE.into()))
            && points.len() >= 9,
        "{points:?}"
    );
    for (crash_at, point) in points.iter().enumerate() {
        let name = format!("second-{crash_at}");
        let mut seen = 0;
        let result = write_checkpoint(root, &name, "v4-16", &second, &mut |_| {
            seen += 1;
            if seen > crash_at {
                Err(std::io::Error::other("injected crash"))
            } else {
                Ok(())
            }
        });
        assert!(result.is_err(), "crash point {crash_at} must surface");
        verify(&pod, &root.join("first")).unwrap();
        let target = root.join(&name);
        let committed = target.exists();
        // Only the last point (syncing the root) is after the rename: then
        // the checkpoint is complete and verifies; before it, there is none.
        if committed {
            assert_eq!(*point, WritePoint::SyncRoot);
            verify(&pod, &target).unwrap();
        }
        let registry = pod.world().resource::<SnapshotRegistry>();
        for listing in list_checkpoints(root, registry).unwrap() {
            assert!(listing.problem.is_none(), "{listing:?}");
        }
    }
}

#[test]
fn names_cannot_escape_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let mut pod = pod_with_history();
    let snapshot = pod.snapshot().unwrap();
    for name in ["../x", "..", "a/b", "/abs", ".hidden", "", "a\\b"] {
        let error = write_checkpoint(dir.path(), name, "p", &snapshot, &mut |_| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(error.contains("not a plain name"), "{name}: {error}");
    }
    let ft = manager(vec![dir.path().into()], 5, RecoveryPolicy::RollBack);
    assert!(ft.restore_checkpoint(&mut pod, "../x").is_err());
}

#[test]
fn retention_keeps_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    let ft = manager(vec![dir.path().into()], 3, RecoveryPolicy::RollBack);
    let mut pod = Pod::from_preset("v4-16").unwrap();
    let mut ticks = Vec::new();
    for _ in 0..5 {
        pod.run(10);
        ticks.push(ft.create_checkpoint(&mut pod).unwrap().tick);
    }
    let listed: Vec<u64> = ft
        .list(&pod)
        .unwrap()
        .iter()
        .filter_map(|l| l.tick)
        .collect();
    assert_eq!(listed, vec![ticks[4], ticks[3], ticks[2]]);
}

#[test]
fn replication_and_rollback_skip_corrupt_copies() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let ft = manager(vec![a.clone(), b.clone()], 5, RecoveryPolicy::RollBack);
    let mut pod = Pod::from_preset("v4-16").unwrap();
    pod.run(10);
    let old = ft.create_checkpoint(&mut pod).unwrap();
    pod.run(10);
    let new = ft.create_checkpoint(&mut pod).unwrap();
    assert_eq!(new.paths, vec![a.join(&new.name), b.join(&new.name)]);
    // Corrupt the new checkpoint in root a: restore takes root b's copy.
    std::fs::write(a.join(&new.name).join(WORLD_FILE), b"garbage").unwrap();
    pod.run(3);
    let restored = ft.restore_checkpoint(&mut pod, &new.name).unwrap();
    assert_eq!(restored.paths, vec![b.join(&new.name)]);
    // Corrupt it in b too: rollback falls back to the older one.
    std::fs::write(b.join(&new.name).join(WORLD_FILE), b"garbage").unwrap();
    pod.run(3);
    let back = ft.rollback(&mut pod).unwrap();
    assert_eq!((back.name, pod.clock().tick), (old.name.clone(), old.tick));
    // Replicate the good one into a third root.
    let c = dir.path().join("c");
    let copy = ft.replicate(&pod, &old.name, &c).unwrap();
    verify(&pod, &copy).unwrap();
}

#[test]
fn periodic_checkpoints_run_inside_the_step_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let mut pod = Pod::from_preset("v4-16").unwrap();
    pod.enable_periodic_checkpoints(100, vec![dir.path().into()], 2)
        .unwrap();
    pod.run(350);
    let registry = pod.world().resource::<SnapshotRegistry>();
    let ticks: Vec<Option<u64>> = list_checkpoints(dir.path(), registry)
        .unwrap()
        .into_iter()
        .map(|l| l.tick)
        .collect();
    assert_eq!(ticks, vec![Some(300), Some(200)]);
    assert!(pod.enable_periodic_checkpoints(0, vec![], 1).is_err());
}

#[test]
fn migration_is_refused_but_recovery_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let ft = manager(vec![dir.path().into()], 5, RecoveryPolicy::RollBack);
    let error = ft.migrate_workload(DeviceId(1), DeviceId(2)).unwrap_err();
    assert!(error.kind() == ErrorKind::Unsupported, "{error}");
    assert!(error.to_string().contains("TPU runtime"), "{error}");

    let mut pod = Pod::from_preset("v4-16").unwrap();
    pod.run(100);
    let saved = ft.create_checkpoint(&mut pod).unwrap();
    pod.kill_device(5).unwrap();
    pod.run(1_200);
    let report = ft.recover(&mut pod);
    assert_eq!(report.failed, vec![DeviceId(5)]);
    assert_eq!(
        report.rolled_back_to.as_ref().map(|i| i.tick),
        Some(saved.tick)
    );
    assert_eq!(
        report.errors.len(),
        1,
        "migration refused: {:?}",
        report.errors
    );
    // Rolled back, but device 5 is still dead and known failed.
    assert_eq!(pod.clock().tick, saved.tick);
    assert!(pod.health(5).unwrap().is_failed());
    pod.run(1_200);
    assert!(
        pod.failures().iter().all(|r| r.device != DeviceId(5)),
        "not re-detected"
    );

    // Exclude and rebalance: barriers over every device now skip it.
    let ft = manager(
        vec![dir.path().into()],
        5,
        RecoveryPolicy::ExcludeAndRebalance,
    );
    let mut pod = Pod::from_preset("v4-16").unwrap();
    pod.kill_device(6).unwrap();
    pod.run(1_200);
    let report = ft.recover(&mut pod);
    assert_eq!(report.excluded, vec![DeviceId(6)]);
    let id = pod
        .create_barrier(BarrierSpec::named("after").auto_arrive())
        .unwrap();
    assert!(matches!(
        pod.wait_for_barrier(id).unwrap(),
        optirs_tpu::barrier::BarrierOutcome::Completed { .. }
    ));
}

/// The tensor file is a standard safetensors file: the header parsed by
/// hand (length, JSON, dtype strings, contiguous offsets) matches the
/// snapshot's tensors byte for byte, and — when Python's `safetensors` and
/// `numpy` are installed — Python reads the same values.
#[test]
fn the_tensor_file_is_standard_safetensors() {
    let dir = tempfile::tempdir().unwrap();
    let mut pod = pod_with_history();
    let snapshot = pod.snapshot().unwrap();
    write_checkpoint(dir.path(), "c", "v4-16", &snapshot, &mut |_| Ok(())).unwrap();
    let path = dir.path().join("c").join(TENSOR_FILE);
    let file = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&file[8..8 + n]).unwrap();
    let data = &file[8 + n..];
    assert_eq!(header.len(), snapshot.tensors.len() + 1, "{header:?}");
    assert!(header.contains_key("__metadata__"));
    let mut spans = Vec::new();
    for t in &snapshot.tensors {
        let info = &header[&t.name];
        let dtype = info["dtype"].as_str().unwrap();
        let expected = match t.dtype {
            DType::Pred => "BOOL",
            DType::I32 => "I32",
            DType::F32 => "F32",
            DType::F64 => "F64",
        };
        assert_eq!(dtype, expected, "{}", t.name);
        let shape: Vec<usize> = serde_json::from_value(info["shape"].clone()).unwrap();
        assert_eq!(shape, t.shape);
        let (start, end): (usize, usize) =
            serde_json::from_value(info["data_offsets"].clone()).unwrap();
        assert_eq!(&data[start..end], &*t.data, "{}", t.name);
        assert_eq!(start % t.dtype.byte_size(), 0, "{} is aligned", t.name);
        spans.push((start, end));
    }
    spans.sort();
    assert_eq!(spans.first().unwrap().0, 0);
    assert_eq!(spans.last().unwrap().1, data.len());
    assert!(spans.windows(2).all(|w| w[0].1 == w[1].0), "contiguous");
    // The weight literal: element [1, 2] is 18 / 8.
    let weight = snapshot
        .tensors
        .iter()
        .find(|t| t.name.starts_with("xla.Literal/") && t.dtype == DType::F32)
        .unwrap();
    let at = |i: usize| f32::from_le_bytes(weight.data[4 * i..4 * i + 4].try_into().unwrap());
    assert_eq!(at(18), 2.25);

    let script = r#"
import sys
from safetensors.numpy import load_file
tensors = load_file(sys.argv[1])
for name in sorted(tensors):
    t = tensors[name]
    print(name, t.dtype, ",".join(map(str, t.shape)), repr(float(t.astype("float64").sum())), repr(float(t.reshape(-1)[18])))
"#;
    let output = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&path)
        .output();
    let output = match output {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            println!(
                "note: skipped the Python check (python3 with safetensors and numpy unavailable: {})",
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            );
            return;
        }
        Err(e) => {
            println!("note: skipped the Python check (no python3: {e})");
            return;
        }
    };
    let lines: Vec<String> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len(), snapshot.tensors.len(), "{lines:?}");
    for (line, t) in lines.iter().zip(&snapshot.tensors) {
        let values: Vec<f64> = match t.dtype {
            DType::F32 => t
                .data
                .chunks_exact(4)
                .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap())))
                .collect(),
            DType::F64 => t
                .data
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            DType::I32 => t
                .data
                .chunks_exact(4)
                .map(|c| f64::from(i32::from_le_bytes(c.try_into().unwrap())))
                .collect(),
            DType::Pred => t.data.iter().map(|&b| f64::from(b)).collect(),
        };
        let numpy = match t.dtype {
            DType::Pred => "bool",
            DType::I32 => "int32",
            DType::F32 => "float32",
            DType::F64 => "float64",
        };
        let shape: Vec<String> = t.shape.iter().map(usize::to_string).collect();
        let sum: f64 = values.iter().sum();
        let expected = format!(
            "{} {numpy} {} {sum:?} {:?}",
            t.name,
            shape.join(","),
            values[18]
        );
        assert_eq!(*line, expected);
    }
}

/// An optimizer's moments (Adam's `mu` and `nu`) go to the tensor file, not
/// `world.bin`, and come back from disk: the restored optimizer takes the
/// same next step as the original.
#[test]
fn optimizer_moments_are_in_the_tensor_file_and_restore_from_disk() {
    use ndarray::Array1;
    use optirs_tpu::optimizers::Adam;
    use optirs_tpu::tpu::state::OptimizerSlot;
    use optirs_tpu::tpu::tpu_registry;
    use optirs_tpu::{TPUConfig, TPUOptimizer};

    let n = 1000;
    let g = Array1::from_iter((0..n).map(|i| (i as f32 * 0.37).sin()));
    let mut p = Array1::from_iter((0..n).map(|i| (i as f32 * 0.11).cos()));
    let mut opt = TPUOptimizer::new(Adam::new(0.01f32), TPUConfig::default()).unwrap();
    for _ in 0..2 {
        p = opt.tpu_step(&p, &g).unwrap();
    }
    let slots = |opt: &TPUOptimizer<Adam<f32>, f32>| -> Vec<(String, Tensor)> {
        let world = opt.world();
        let mut slots: Vec<_> = world
            .try_query::<&OptimizerSlot>()
            .unwrap()
            .iter(world)
            .map(|s| (s.name.clone(), s.tensor.clone()))
            .collect();
        slots.sort_by(|a, b| a.0.cmp(&b.0));
        slots
    };
    let moments = slots(&opt);
    assert_eq!(
        moments
            .iter()
            .map(|(name, _)| name.as_str())
            .collect::<Vec<_>>(),
        ["mu", "nu"]
    );
    let dir = tempfile::tempdir().unwrap();
    let snapshot = opt.snapshot().unwrap();
    write_checkpoint(dir.path(), "c", "tpu", &snapshot, &mut |_| Ok(())).unwrap();
    let cp = dir.path().join("c");
    let world_len = std::fs::metadata(cp.join(WORLD_FILE)).unwrap().len();
    assert!(
        world_len < 4 * n as u64,
        "world.bin holds {world_len} bytes"
    );

    // Both moments are f32[1000] entries of the tensor file, byte for byte.
    let file = std::fs::read(cp.join(TENSOR_FILE)).unwrap();
    let header_len = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&file[8..8 + header_len]).unwrap();
    let data = &file[8 + header_len..];
    let mut in_file: Vec<Vec<u8>> = header
        .iter()
        .filter(|(name, _)| name.starts_with("tpu.OptimizerSlot/"))
        .map(|(_, info)| {
            assert_eq!(info["dtype"], "F32");
            assert_eq!(info["shape"], serde_json::json!([n]));
            let (start, end): (usize, usize) =
                serde_json::from_value(info["data_offsets"].clone()).unwrap();
            data[start..end].to_vec()
        })
        .collect();
    let mut expected: Vec<Vec<u8>> = moments
        .iter()
        .map(|(_, t)| {
            t.to_f64_vec()
                .iter()
                .flat_map(|&v| (v as f32).to_le_bytes())
                .collect()
        })
        .collect();
    in_file.sort();
    expected.sort();
    assert_eq!(in_file, expected);

    let (_, restored) = verify_checkpoint(&cp, &tpu_registry()).unwrap();
    let mut other = TPUOptimizer::new(Adam::new(0.01f32), TPUConfig::default()).unwrap();
    other.restore(&restored).unwrap();
    assert_eq!(other.step_count(), 2);
    assert_eq!(slots(&other), moments);
    assert_eq!(
        other.tpu_step(&p, &g).unwrap(),
        opt.tpu_step(&p, &g).unwrap()
    );
}

/// Tensors large enough for the pipelined path (written and read in chunks
/// while a second thread hashes them) round-trip through disk exactly, and
/// a flipped bit deep inside one is still caught before restore.
#[test]
fn large_tensors_round_trip_and_a_flipped_bit_in_one_is_caught() {
    let mut pod = Pod::from_preset("v4-16").unwrap();
    let mut b = GraphBuilder::new(pod.world_mut(), "large");
    let n = 3 << 20; // two 12 MiB literals: 24 MiB of data, several chunks
    let mut sum = b.parameter(TensorType::new(DType::F32, [n]));
    for k in 0..2 {
        let values: Vec<f32> = (0..n).map(|i| (i as f32 * 1e-3 + k as f32).sin()).collect();
        let w = b.constant(Tensor::F32(
            ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[n]), values).unwrap(),
        ));
        sum = b.add(sum, w);
    }
    b.output(sum);
    b.finish();
    let dir = tempfile::tempdir().unwrap();
    let snapshot = pod.snapshot().unwrap();
    let sha = snapshot.sha256_hex();
    write_checkpoint(dir.path(), "c", "v4-16", &snapshot, &mut |_| Ok(())).unwrap();
    let cp = dir.path().join("c");
    let registry = pod.world().resource::<SnapshotRegistry>();
    let (_, read) = verify_checkpoint(&cp, registry).unwrap();
    assert_eq!(read.sha256_hex(), sha);
    assert_eq!(read.tensors, snapshot.tensors);
    // No copies: the snapshot shares the live literals, and the restored
    // literals are the buffers the file was read into.
    let literals = |pod: &mut Pod| -> Vec<std::sync::Arc<Tensor>> {
        let world = pod.world_mut();
        let mut q = world.query::<&optirs_tpu::xla::graph::Literal>();
        q.iter(world)
            .filter(|l| l.0.len() == n)
            .map(|l| l.0.clone())
            .collect()
    };
    let shares = |snapshot: &optirs_tpu::checkpoint::WorldSnapshot, t: &std::sync::Arc<Tensor>| {
        snapshot.tensors.iter().any(|s| {
            s.data
                .as_tensor()
                .is_some_and(|d| std::sync::Arc::ptr_eq(d, t))
        })
    };
    let live = literals(&mut pod);
    assert_eq!(live.len(), 2);
    assert!(live.iter().all(|t| shares(&snapshot, t)));
    pod.restore_snapshot(&read).unwrap();
    assert_eq!(pod.world_sha256().unwrap(), sha);
    let restored = literals(&mut pod);
    assert_eq!(restored.len(), 2);
    assert!(restored.iter().all(|t| shares(&read, t)));

    let path = cp.join(TENSOR_FILE);
    let original = std::fs::read(&path).unwrap();
    let mut flipped = original.clone();
    let at = original.len() - n; // inside the second tensor's last chunk
    flipped[at] ^= 0x10;
    std::fs::write(&path, &flipped).unwrap();
    let error = verify(&pod, &cp).unwrap_err();
    assert!(
        error.contains("SHA-256") && error.contains(TENSOR_FILE),
        "{error}"
    );
    assert_eq!(pod.world_sha256().unwrap(), sha, "the live world changed");
}
