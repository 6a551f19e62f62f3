//! What a checkpoint directory may hold, what retention may delete, and
//! what a restore may change: extra files, links, named pipes, foreign
//! directories beside managed checkpoints, other topologies, forged worlds.

use optirs_tpu::Pod;
use optirs_tpu::checkpoint::{MANIFEST, SnapshotRegistry, WORLD_FILE, verify_checkpoint};
use optirs_tpu::fault_tolerance::{FaultToleranceManager, RecoveryPolicy};
use std::path::{Path, PathBuf};

#[path = "common/checkpoint.rs"]
mod checkpoint_helpers;
use checkpoint_helpers::verify;

fn manager(roots: Vec<PathBuf>, keep: usize) -> FaultToleranceManager {
    checkpoint_helpers::manager(roots, keep, RecoveryPolicy::RollBack)
}

/// A checkpoint written by the manager at tick 10 of a v4-16 pod.
fn saved(root: &Path) -> (Pod, PathBuf) {
    let ft = manager(vec![root.into()], 5);
    let mut pod = Pod::from_preset("v4-16").unwrap();
    pod.run(10);
    let info = ft.create_checkpoint(&mut pod).unwrap();
    (pod, info.paths[0].clone())
}

#[test]
fn retention_never_deletes_what_it_cannot_identify_nor_the_new_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // A directory of the user's that sorts before every managed name.
    std::fs::create_dir(root.join("tick-best")).unwrap();
    std::fs::write(root.join("tick-best").join("notes.txt"), b"keep me").unwrap();
    let ft = manager(vec![root.into()], 1);
    let mut pod = Pod::from_preset("v4-16").unwrap();
    pod.run(100);
    let first = ft.create_checkpoint(&mut pod).unwrap();
    assert!(
        first.paths[0].exists(),
        "the checkpoint just written is gone"
    );
    assert!(root.join("tick-best").join("notes.txt").exists());
    pod.run(100);
    let second = ft.create_checkpoint(&mut pod).unwrap();
    assert!(second.paths[0].exists());
    assert!(
        !first.paths[0].exists(),
        "the older managed checkpoint stays"
    );
    assert!(root.join("tick-best").exists());
    pod.run(7);
    let back = ft.rollback(&mut pod).unwrap();
    assert_eq!(back.tick, second.tick);
}

#[test]
fn retention_orders_by_the_recorded_tick_and_keeps_the_new_one_after_a_rollback() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let ft = manager(vec![root.into()], 2);
    let mut pod = Pod::from_preset("v4-16").unwrap();
    pod.run(10);
    let early = ft.create_checkpoint(&mut pod).unwrap();
    pod.run(90);
    let late = ft.create_checkpoint(&mut pod).unwrap();
    // Back to tick 10, then a checkpoint at tick 15: it is the newest
    // written but not the highest tick; it is never the one removed.
    ft.restore_checkpoint(&mut pod, &early.name).unwrap();
    pod.run(5);
    let new = ft.create_checkpoint(&mut pod).unwrap();
    assert!(new.paths[0].exists());
    assert!(late.paths[0].exists());
    assert!(!early.paths[0].exists());
    // A checkpoint saved under a name of its own is never counted or removed.
    let snapshot = pod.snapshot().unwrap();
    optirs_tpu::checkpoint::write_checkpoint(root, "tick-0", "v4-16", &snapshot, &mut |_| Ok(()))
        .unwrap();
    pod.run(5);
    ft.create_checkpoint(&mut pod).unwrap();
    assert!(root.join("tick-0").exists());
}

#[test]
fn a_checkpoint_is_exactly_its_manifests_regular_files() {
    let dir = tempfile::tempdir().unwrap();
    let (pod, cp) = saved(dir.path());
    verify(&pod, &cp).unwrap();
    for extra in ["extra.bin", "world.bin.bak", ".DS_Store"] {
        let path = cp.join(extra);
        std::fs::write(&path, b"x").unwrap();
        let error = verify(&pod, &cp).unwrap_err();
        assert!(
            error.contains(extra) && error.contains("not listed"),
            "{extra}: {error}"
        );
        std::fs::remove_file(&path).unwrap();
    }
    std::fs::create_dir(cp.join("sub")).unwrap();
    std::fs::write(cp.join("sub").join("inner"), b"x").unwrap();
    let error = verify(&pod, &cp).unwrap_err();
    assert!(error.contains("sub"), "{error}");
    std::fs::remove_dir_all(cp.join("sub")).unwrap();
    verify(&pod, &cp).unwrap();
}

#[cfg(unix)]
#[test]
fn a_listed_file_replaced_by_a_link_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (pod, cp) = saved(&dir.path().join("root"));
    let copy = dir.path().join("elsewhere.bin");
    std::fs::copy(cp.join(WORLD_FILE), &copy).unwrap();
    std::fs::remove_file(cp.join(WORLD_FILE)).unwrap();
    std::os::unix::fs::symlink(&copy, cp.join(WORLD_FILE)).unwrap();
    let error = verify(&pod, &cp).unwrap_err();
    assert!(
        error.contains(WORLD_FILE) && error.contains("symbolic link"),
        "{error}"
    );
    // The listing says so too, and a rollback does not take it.
    let ft = manager(vec![dir.path().join("root")], 5);
    let listed = ft.list(&pod).unwrap();
    assert!(
        listed[0]
            .problem
            .as_deref()
            .unwrap()
            .contains("symbolic link")
    );
    // A link to a whole checkpoint directory is not followed either.
    let linked = dir.path().join("root").join("linked");
    std::fs::remove_file(cp.join(WORLD_FILE)).unwrap();
    std::fs::copy(&copy, cp.join(WORLD_FILE)).unwrap();
    std::os::unix::fs::symlink(&cp, &linked).unwrap();
    let error = verify(&pod, &linked).unwrap_err();
    assert!(error.contains("symbolic link"), "{error}");
}

#[cfg(unix)]
fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
}

#[cfg(unix)]
#[test]
fn a_named_pipe_is_refused_without_blocking() {
    for file in [MANIFEST, WORLD_FILE] {
        let dir = tempfile::tempdir().unwrap();
        let (pod, cp) = saved(dir.path());
        std::fs::remove_file(cp.join(file)).unwrap();
        mkfifo(&cp.join(file));
        // In a thread, so a regression fails the test instead of hanging it.
        let (send, receive) = std::sync::mpsc::channel();
        let dir_path = cp.clone();
        std::thread::spawn(move || {
            let registry = optirs_tpu::checkpoint::engine_registry();
            let verified = verify_checkpoint(&dir_path, &registry).map(|_| ());
            let listed =
                optirs_tpu::checkpoint::list_checkpoints(dir_path.parent().unwrap(), &registry)
                    .map(|l| l[0].problem.clone());
            let _ = send.send((
                verified.map_err(|e| e.to_string()),
                listed.map_err(|e| e.to_string()),
            ));
        });
        let (verified, listed) = receive
            .recv_timeout(std::time::Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("a named pipe as {file} blocked verification"));
        let error = verified.unwrap_err();
        assert!(
            error.contains(file) && error.contains("named pipe"),
            "{error}"
        );
        assert!(listed.unwrap().unwrap().contains("named pipe"));
        drop(pod);
    }
}

#[test]
fn errors_say_what_is_wrong_once() {
    let dir = tempfile::tempdir().unwrap();
    let (mut pod, cp) = saved(dir.path());
    let snapshot = pod.snapshot().unwrap();
    let name = cp.file_name().unwrap().to_str().unwrap();
    let error =
        optirs_tpu::checkpoint::write_checkpoint(dir.path(), name, "v4-16", &snapshot, &mut |_| {
            Ok(())
        })
        .unwrap_err();
    let chain = format!("{:#}", anyhow::Error::from(error));
    assert_eq!(
        chain.matches("a checkpoint with this name exists").count(),
        1,
        "{chain}"
    );
    let missing = dir.path().join("no-such-checkpoint");
    let error = verify(&pod, &missing).unwrap_err();
    assert!(
        error.contains("no-such-checkpoint") && error.contains("no such checkpoint directory"),
        "{error}"
    );
    // A directory in place of the manifest: named once, as a directory.
    std::fs::remove_file(cp.join(MANIFEST)).unwrap();
    std::fs::create_dir(cp.join(MANIFEST)).unwrap();
    let registry = pod.world().resource::<SnapshotRegistry>();
    let error = verify_checkpoint(&cp, registry).unwrap_err();
    let chain = format!("{:#}", anyhow::Error::from(error));
    assert!(
        chain.contains("is a directory, not a regular file"),
        "{chain}"
    );
    assert!(!chain.contains("os error 21"), "{chain}");
}

#[test]
fn replicate_checks_the_name_before_reading_anything() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let (pod, _) = saved(&root);
    // Something outside the root that is not a checkpoint: reading it would
    // be reported as a verification problem of that path.
    std::fs::create_dir_all(dir.path().join("outside").join("victim")).unwrap();
    let ft = manager(vec![root.clone()], 5);
    let error = ft
        .replicate(&pod, "../outside/victim", &dir.path().join("copy"))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("not a plain name") && !error.contains(MANIFEST),
        "{error}"
    );
    assert!(!dir.path().join("copy").exists());
    let mut pod = pod;
    let snapshot = pod.snapshot().unwrap();
    for name in ["tick\n1", "tick\u{202E}1", "tick\u{2066}1", "tick\t1"] {
        let error =
            optirs_tpu::checkpoint::write_checkpoint(&root, name, "v4-16", &snapshot, &mut |_| {
                Ok(())
            })
            .unwrap_err()
            .to_string();
        assert!(error.contains("not a plain name"), "{name:?}: {error}");
        assert!(ft.replicate(&pod, name, &dir.path().join("copy")).is_err());
    }
}

#[test]
fn a_checkpoint_of_another_topology_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let (_, cp) = saved(dir.path());
    let ft = manager(vec![dir.path().into()], 5);
    let mut big = Pod::from_preset("v5e-256").unwrap();
    big.run(3);
    let before = big.world_sha256().unwrap();
    let name = cp.file_name().unwrap().to_str().unwrap();
    let error = ft
        .restore_checkpoint(&mut big, name)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("v4-16") && error.contains("v5e-256"),
        "{error}"
    );
    assert_eq!(big.topology().name, "v5e-256");
    assert_eq!(big.world_sha256().unwrap(), before);
    // The snapshot's own topology is compared, not only the manifest's name.
    let registry = big.world().resource::<SnapshotRegistry>();
    let (_, snapshot) = verify_checkpoint(&cp, registry).unwrap();
    let error = big.restore_snapshot(&snapshot).unwrap_err().to_string();
    assert!(
        error.contains("v4-16 (v4 2x2x2)") && error.contains("v5e-256 (v5e 16x16)"),
        "{error}"
    );
    assert_eq!(big.world_sha256().unwrap(), before);
}

fn adam_on_v4_8(hbm: u64) -> optirs_tpu::TPUOptimizer<optirs_tpu::optimizers::Adam<f32>, f32> {
    use optirs_tpu::{TPUConfig, TPUOptimizer, TPUVersion};
    let config = TPUConfig {
        tpu_version: TPUVersion::V4,
        num_cores: 2,
        hbm_bytes: Some(hbm),
        ..Default::default()
    };
    let pod = Pod::from_preset("v4-16").unwrap();
    TPUOptimizer::on_pod(optirs_tpu::optimizers::Adam::new(0.01f32), config, pod).unwrap()
}

#[test]
fn a_restore_that_fails_leaves_the_live_world_unchanged() {
    use ndarray::Array1;
    use optirs_tpu::topology::HbmCapacity;
    let dir = tempfile::tempdir().unwrap();
    let mut opt = adam_on_v4_8(1 << 20);
    let p = Array1::from_elem(4096, 0.5f32);
    opt.tpu_step(&p, &p).unwrap();
    let pod = opt.pod_mut().unwrap();
    // The state (two f32[4096] moments) no longer fits device 0's HBM as
    // the checkpoint records it.
    let device = pod.device_entity(0).unwrap();
    pod.world_mut().entity_mut(device).insert(HbmCapacity(1024));
    let ft = manager(vec![dir.path().into()], 5);
    let info = ft.create_checkpoint(pod).unwrap();
    pod.world_mut()
        .entity_mut(device)
        .insert(HbmCapacity(1 << 20));
    pod.run(3);
    let before = pod.world_sha256().unwrap();
    let error = ft
        .restore_checkpoint(pod, &info.name)
        .unwrap_err()
        .to_string();
    assert!(error.contains("out of HBM"), "{error}");
    assert_eq!(pod.world_sha256().unwrap(), before);
    // And the optimizer still works on the unchanged world.
    opt.tpu_step(&p, &p).unwrap();
}
#[test]
fn restoring_through_the_manager_or_the_optimizer_leaves_the_same_working_state() {
    use ndarray::Array1;
    let dir = tempfile::tempdir().unwrap();
    let ft = manager(vec![dir.path().into()], 5);
    let p = Array1::from_iter((0..2048).map(|i| (i as f32 * 0.1).sin()));
    let g = Array1::from_iter((0..2048).map(|i| (i as f32 * 0.3).cos()));
    let (mut a, mut b) = (adam_on_v4_8(1 << 20), adam_on_v4_8(1 << 20));
    for opt in [&mut a, &mut b] {
        opt.tpu_step(&p, &g).unwrap();
        opt.pod_mut().unwrap().run(5);
    }
    let info = ft.create_checkpoint(a.pod_mut().unwrap()).unwrap();
    let snapshot = b.snapshot().unwrap();
    for opt in [&mut a, &mut b] {
        opt.tpu_step(&p, &g).unwrap();
        opt.pod_mut().unwrap().run(5);
    }
    ft.restore_checkpoint(a.pod_mut().unwrap(), &info.name)
        .unwrap();
    b.restore(&snapshot).unwrap();
    assert_eq!(a.hbm_usage(0), b.hbm_usage(0));
    assert!(a.hbm_usage(0) > 0);
    assert_eq!(a.step_count(), 1);
    let (next_a, next_b) = (a.tpu_step(&p, &g).unwrap(), b.tpu_step(&p, &g).unwrap());
    assert_eq!(next_a, next_b);
    assert_eq!(a.hbm_usage(0), b.hbm_usage(0));
    assert_eq!(
        a.pod_mut().unwrap().world_sha256().unwrap(),
        b.pod_mut().unwrap().world_sha256().unwrap()
    );
}

/// A snapshot of a v4-16 that ran long enough to hold monitor history, with
/// one resource column replaced by `forge` applied to its decoded value.
fn forged_resource<T, F>(name: &str, forge: F) -> (Pod, optirs_tpu::persist::WorldSnapshot)
where
    T: serde::Serialize + serde::de::DeserializeOwned,
    F: FnOnce(&mut T),
{
    let mut pod = Pod::from_preset("v4-16").unwrap();
    pod.run(300);
    let mut snapshot = pod.snapshot().unwrap();
    let column = snapshot
        .resources
        .iter_mut()
        .find(|c| c.name == name)
        .unwrap();
    let mut value: T = postcard::from_bytes(&column.bytes).unwrap();
    forge(&mut value);
    column.bytes = postcard::to_stdvec(&value).unwrap();
    (pod, snapshot)
}

/// [`optirs_tpu::monitor::DeviceHistory`] field for field.
#[derive(serde::Serialize, serde::Deserialize)]
struct HistoryFields {
    devices: usize,
    capacity: usize,
    head: usize,
    len: usize,
    samples: Vec<optirs_tpu::monitor::DeviceSample>,
}

#[test]
fn forged_worlds_are_refused_before_the_world_is_touched() {
    // A topology dimension of 0: refused, naming the column, instead of a
    // division by zero while the pod is built.
    let (mut pod, snapshot) =
        forged_resource::<optirs_tpu::topology::Topology, _>("topology.PodTopology", |t| {
            t.dims[0] = 0
        });
    let error = Pod::from_snapshot(&snapshot).unwrap_err().to_string();
    assert!(
        error.contains("topology.PodTopology") && error.contains("dims[0]"),
        "{error}"
    );
    let before = pod.world_sha256().unwrap();
    assert!(pod.restore_snapshot(&snapshot).is_err());
    assert_eq!(pod.world_sha256().unwrap(), before);

    // A monitor history whose length exceeds its samples.
    let (mut pod, snapshot) = forged_resource::<HistoryFields, _>("monitor.DeviceHistory", |h| {
        assert!(h.len > 0, "the run holds samples");
        h.len = h.capacity;
        h.head = h.capacity - 1;
    });
    let before = pod.world_sha256().unwrap();
    let error = pod.restore_snapshot(&snapshot).unwrap_err().to_string();
    assert!(error.contains("monitor.DeviceHistory"), "{error}");
    assert_eq!(pod.world_sha256().unwrap(), before);
    pod.run(1);

    // An entity count of 2^32 - 1: refused without allocating for it.
    let mut snapshot = pod.snapshot().unwrap();
    snapshot.entity_count = u32::MAX;
    let error = pod.restore_snapshot(&snapshot).unwrap_err().to_string();
    assert!(error.contains("entity count"), "{error}");
    assert!(Pod::from_snapshot(&snapshot).is_err());
    // One more entity than the columns have rows for.
    let mut snapshot = pod.snapshot().unwrap();
    snapshot.entity_count += 1;
    let error = pod.restore_snapshot(&snapshot).unwrap_err().to_string();
    assert!(error.contains("has no component"), "{error}");
}
