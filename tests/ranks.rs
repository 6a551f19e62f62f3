//! A pod split over ranks (threads of this process, through the same
//! backend and frames as MPI ranks) is the pod one process runs: the merge
//! of the ranks' parts has the single-process `world_sha256`, for every
//! preset and every rank count its hosts allow, with faults.

use optirs_tpu::Pod;
use optirs_tpu::health::Fault;
use optirs_tpu::pod::ranks::RankedPod;
use optirs_tpu::topology::{DeviceId, Topology, load_preset};
use optirs_tpu::transport::ClusterError;
use proptest::prelude::*;
use std::time::{Duration, Instant};

#[path = "common/ranks.rs"]
mod ranks_common;
use ranks_common::on_ranks;

/// Faults at simulated times, ns.
type Plan = Vec<(u64, Fault)>;

fn single(topology: &Topology, ticks: u64, plan: &Plan) -> String {
    let mut pod = Pod::from_topology(topology.clone()).unwrap();
    for &(at, fault) in plan {
        pod.schedule_fault(at, fault);
    }
    pod.run(ticks);
    pod.world_sha256().unwrap()
}

fn split(topology: &Topology, ranks: u32, ticks: u64, plan: &Plan) -> String {
    let results = on_ranks(ranks, |mailbox| {
        let mut pod = RankedPod::new(topology.clone(), mailbox)?;
        pod.handshake(&format!("{ticks} ticks, faults {plan:?}"))?;
        for &(at, fault) in plan {
            pod.schedule_fault(at, fault);
        }
        pod.run(ticks)?;
        Ok(pod.gather()?.map(|world| world.sha256_hex()))
    });
    let mut results = results.into_iter();
    let digest = results.next().unwrap().unwrap().expect("rank 0 merges");
    for (rank, other) in results.enumerate() {
        assert_eq!(
            other.unwrap(),
            None,
            "rank {} holds no merged world",
            rank + 1
        );
    }
    digest
}

/// A kill on the last rank's devices, a pause and resume on rank 0's, a
/// jittery device and a cut link: faults on both sides of every split.
fn faults(topology: &Topology) -> Plan {
    let n = topology.num_devices();
    let tick = topology.tick_ns;
    vec![
        (3 * tick + 17, Fault::KillDevice(DeviceId(n - 1))),
        (5 * tick, Fault::PauseDevice(DeviceId(0))),
        (9 * tick, Fault::ResumeDevice(DeviceId(0))),
        (2 * tick, Fault::DeviceJitter(DeviceId(n / 2), tick / 3)),
        (4 * tick, Fault::CutLink(DeviceId(0), DeviceId(1))),
    ]
}

#[test]
fn every_preset_split_over_every_rank_count_is_the_one_process_world() {
    for name in [
        "assets/pods/examples/v2-4x2-custom.ron",
        "v2-8",
        "v3-64",
        "v4-16",
        "v4-128",
        "v5e-16",
        "v5e-256",
        "v5p-256",
        "v6e-256",
        "tpu7x-512",
    ] {
        let topology = optirs_tpu::topology::load_topology(name).unwrap();
        // Long enough for the kill to be detected (the timeout is a few
        // heartbeat intervals).
        let ticks = (3 * topology.heartbeat_timeout_ns / topology.tick_ns).clamp(40, 400);
        let plan = faults(&topology);
        let one = single(&topology, ticks, &plan);
        for ranks in [1, 2, 4] {
            if ranks > topology.num_hosts() {
                continue;
            }
            assert_eq!(
                split(&topology, ranks, ticks, &plan),
                one,
                "{name} over {ranks} ranks, {ticks} ticks"
            );
        }
    }
}

#[test]
fn the_full_v4_pod_split_in_two_and_four_is_the_one_process_world() {
    let topology = load_preset("v4-8192").unwrap();
    let plan = faults(&topology);
    let one = single(&topology, 12, &plan);
    for ranks in [2, 4] {
        assert_eq!(split(&topology, ranks, 12, &plan), one, "{ranks} ranks");
    }
}

#[test]
fn the_merged_world_restores_into_a_pod_with_the_same_digest_and_failures() {
    let topology = load_preset("v4-16").unwrap();
    let ticks = 3 * topology.heartbeat_timeout_ns / topology.tick_ns;
    let plan = faults(&topology);
    let results = on_ranks(2, |mailbox| {
        let mut pod = RankedPod::new(topology.clone(), mailbox)?;
        for &(at, fault) in &plan {
            pod.schedule_fault(at, fault);
        }
        pod.run(ticks)?;
        pod.gather()
    });
    let merged = results.into_iter().next().unwrap().unwrap().unwrap();
    let mut restored = Pod::from_snapshot(&merged).unwrap();
    assert_eq!(restored.world_sha256().unwrap(), merged.sha256_hex());
    let failed: Vec<u32> = restored.failures().iter().map(|f| f.device.0).collect();
    assert_eq!(failed, vec![topology.num_devices() - 1]);
}

fn count<C: bevy_ecs::component::Component>(pod: &RankedPod) -> usize {
    let world = pod.pod().world();
    world
        .try_query::<&C>()
        .map_or(0, |query| query.iter_manual(world).count())
}

#[test]
fn each_rank_holds_only_its_devices_state_and_rank_0_the_service() {
    use optirs_tpu::clock_sync::DeviceClock;
    use optirs_tpu::health::{Health, Heartbeat, LastHeard};
    let topology = load_preset("v3-64").unwrap();
    let results = on_ranks(4, |mailbox| {
        let mut pod = RankedPod::new(topology.clone(), mailbox)?;
        pod.run(5)?;
        let rank = pod.layout().rank();
        let local = pod.layout().local_devices();
        Ok((
            rank,
            local,
            count::<Heartbeat>(&pod),
            count::<DeviceClock>(&pod),
            count::<Health>(&pod),
            count::<LastHeard>(&pod),
        ))
    });
    for result in results {
        let (rank, local, heartbeats, clocks, health, heard) = result.unwrap();
        // v3-64: 8 hosts of 4 chips; 4 ranks own 2 hosts each.
        let expected: Vec<DeviceId> = (0..32)
            .filter(|&d| topology.host_of(d) / 2 == rank)
            .map(DeviceId)
            .collect();
        assert_eq!(local, expected);
        assert_eq!((heartbeats, clocks), (8, 8), "rank {rank}");
        let service = if rank == 0 { 32 } else { 0 };
        assert_eq!((health, heard), (service, service), "rank {rank}");
    }
}

#[test]
fn more_ranks_than_hosts_is_refused_on_every_rank() {
    let topology = load_preset("v4-16").unwrap();
    for result in on_ranks(3, |mailbox| {
        RankedPod::new(topology.clone(), mailbox).map(|_| ())
    }) {
        let error = result.unwrap_err().to_string();
        assert!(error.contains("3 ranks for a pod of 2 hosts"), "{error}");
        assert!(error.contains("at most 2 ranks"), "{error}");
    }
}

#[test]
fn ranks_started_with_different_runs_refuse_to_start_naming_the_difference() {
    let topology = load_preset("v4-16").unwrap();
    let results = on_ranks(2, |mailbox| {
        let rank = mailbox.rank();
        let mut pod = RankedPod::new(topology.clone(), mailbox)?;
        pod.handshake(&format!("{} ticks", 100 + rank))
    });
    for result in results {
        let error = result.unwrap_err().to_string();
        assert!(error.contains("the ranks disagree"), "{error}");
        assert!(error.contains("rank 1 has"), "{error}");
        assert!(
            error.contains("101 ticks") && error.contains("100 ticks"),
            "{error}"
        );
    }
    let other = load_preset("v5e-16").unwrap();
    let results = on_ranks(2, |mailbox| {
        // Same host count, another pod.
        let pod = if mailbox.rank() == 0 {
            &topology
        } else {
            &other
        };
        RankedPod::new(pod.clone(), mailbox)?.handshake("10 ticks")
    });
    for result in results {
        let error = result.unwrap_err().to_string();
        assert!(
            error.contains("pod `v5e-16`") && error.contains("pod `v4-16`"),
            "{error}"
        );
    }
}

#[test]
fn a_rank_that_stops_answering_is_named_with_its_hosts_and_nobody_hangs() {
    let topology = load_preset("v3-64").unwrap();
    let timeout = Duration::from_millis(300);
    let start = Instant::now();
    let results = on_ranks(4, |mailbox| {
        let rank = mailbox.rank();
        let mut pod = RankedPod::with_timeout(topology.clone(), mailbox, timeout)?;
        // Rank 2 goes silent after 3 ticks, as a hung or killed process.
        let ticks = if rank == 2 { 3 } else { 50 };
        pod.run(ticks)?;
        if rank == 2 {
            return Ok(());
        }
        unreachable!("rank {rank} ran past a lost rank")
    });
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    for (rank, result) in results.into_iter().enumerate() {
        if rank == 2 {
            assert!(result.is_ok());
            continue;
        }
        let error = result.unwrap_err();
        assert!(
            matches!(
                error.downcast_ref::<optirs_tpu::transport::TransportError>(),
                Some(optirs_tpu::transport::TransportError::Cluster(
                    ClusterError::RankLost { rank: 2, .. }
                ))
            ),
            "rank {rank}: {error}"
        );
        let message = error.to_string();
        assert!(
            message.contains("rank 2 (hosts 4..=5) was lost"),
            "{message}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Random faults and run lengths on a small pod: every split is the
    /// one-process world.
    #[test]
    fn random_faults_and_splits_match_one_process(
        preset in prop::sample::select(vec!["v3-64", "v4-128", "v5e-16"]),
        ranks in 1u32..=4,
        ticks in 1u64..120,
        raw in prop::collection::vec((0u64..100, 0u32..64, 0u8..5, 0u64..400_000), 0..6),
    ) {
        let topology = load_preset(preset).unwrap();
        let ranks = ranks.min(topology.num_hosts());
        let n = topology.num_devices();
        let plan: Plan = raw
            .into_iter()
            .map(|(tick, device, kind, ns)| {
                let d = DeviceId(device % n);
                let at = tick * topology.tick_ns + ns % topology.tick_ns;
                let fault = match kind {
                    0 => Fault::KillDevice(d),
                    1 => Fault::PauseDevice(d),
                    2 => Fault::ResumeDevice(d),
                    3 => Fault::DeviceJitter(d, ns),
                    _ => Fault::CutLink(DeviceId(0), DeviceId(1)),
                };
                (at, fault)
            })
            .collect();
        prop_assert_eq!(split(&topology, ranks, ticks, &plan), single(&topology, ticks, &plan));
    }
}

/// Runs `ticks`, saves a split checkpoint `name` under `root` on `ranks`
/// ranks, and returns the digest of the merged world at the save.
fn save_split(
    topology: &Topology,
    ranks: u32,
    ticks: u64,
    plan: &Plan,
    root: &std::path::Path,
) -> String {
    let results = on_ranks(ranks, |mailbox| {
        let mut pod = RankedPod::new(topology.clone(), mailbox)?;
        for &(at, fault) in plan {
            pod.schedule_fault(at, fault);
        }
        pod.run(ticks)?;
        let manifest = pod.save_checkpoint(root, "saved")?;
        if let Some(manifest) = &manifest {
            assert_eq!(manifest.parts.len(), ranks as usize);
        }
        Ok(pod.gather()?.map(|w| w.sha256_hex()))
    });
    results.into_iter().next().unwrap().unwrap().unwrap()
}

#[test]
fn a_split_checkpoint_restores_with_another_rank_count_or_one_process() {
    use optirs_tpu::checkpoint::engine_registry;
    use optirs_tpu::checkpoint::split::read_split_checkpoint;
    let topology = load_preset("v3-64").unwrap();
    let plan = faults(&topology);
    let (first, then) = (150, 250);
    let root = tempfile::tempdir().unwrap();
    let at_save = save_split(&topology, 4, first, &plan, root.path());
    let dir = root.path().join("saved");
    // Committed: the record and one part per rank, no temporaries.
    let mut entries: Vec<String> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    assert_eq!(entries, vec!["saved"]);
    let (manifest, merged) = read_split_checkpoint(&dir, &engine_registry()).unwrap();
    assert_eq!((manifest.tick, manifest.parts.len()), (first, 4));
    assert_eq!(merged.sha256_hex(), at_save);
    // The one-process run to compare with.
    let mut one = Pod::from_topology(topology.clone()).unwrap();
    for &(at, fault) in &plan {
        one.schedule_fault(at, fault);
    }
    one.run(first + then);
    let expected = one.world_sha256().unwrap();
    // Into one process.
    let mut restored = Pod::from_snapshot(&merged).unwrap();
    restored.run(then);
    assert_eq!(restored.world_sha256().unwrap(), expected);
    // Onto two ranks.
    let results = on_ranks(2, |mailbox| {
        let mut pod = RankedPod::new(topology.clone(), mailbox)?;
        pod.restore_checkpoint(&dir)?;
        pod.handshake("continue")?;
        pod.run(then)?;
        Ok(pod.gather()?.map(|w| w.sha256_hex()))
    });
    let digest = results.into_iter().next().unwrap().unwrap().unwrap();
    assert_eq!(digest, expected);
}

#[test]
fn a_damaged_split_checkpoint_is_refused_on_every_rank_and_no_world_changes() {
    let topology = load_preset("v4-16").unwrap();
    let root = tempfile::tempdir().unwrap();
    save_split(&topology, 2, 30, &Vec::new(), root.path());
    let world = root.path().join("saved/rank-0001/world.bin");
    let mut bytes = std::fs::read(&world).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&world, bytes).unwrap();
    let dir = root.path().join("saved");
    let results = on_ranks(2, |mailbox| {
        let mut pod = RankedPod::new(topology.clone(), mailbox)?;
        pod.run(7)?;
        let before = pod.pod().clock().tick;
        let error = pod.restore_checkpoint(&dir).unwrap_err().to_string();
        assert_eq!(pod.pod().clock().tick, before, "the world changed");
        pod.run(3)?;
        Ok((error, pod.gather()?.map(|w| w.sha256_hex())))
    });
    let mut one = Pod::from_topology(topology.clone()).unwrap();
    one.run(10);
    for (rank, result) in results.into_iter().enumerate() {
        let (error, digest) = result.unwrap();
        assert!(
            error.contains("rank-0001") && error.contains("world.bin"),
            "rank {rank}: {error}"
        );
        if rank == 0 {
            assert_eq!(digest.unwrap(), one.world_sha256().unwrap());
        }
    }
}

#[test]
fn a_save_that_cannot_commit_leaves_the_stored_checkpoints_as_they_were() {
    let topology = load_preset("v4-16").unwrap();
    let root = tempfile::tempdir().unwrap();
    save_split(&topology, 2, 30, &Vec::new(), root.path());
    let record = std::fs::read(root.path().join("saved/ranks.ron")).unwrap();
    // The same name again: refused on every rank, the stored one untouched.
    let results = on_ranks(2, |mailbox| {
        let mut pod = RankedPod::new(topology.clone(), mailbox)?;
        pod.run(5)?;
        pod.save_checkpoint(root.path(), "saved").map(|_| ())
    });
    for result in results {
        let error = result.unwrap_err().to_string();
        assert!(error.contains("exists"), "{error}");
    }
    assert_eq!(
        std::fs::read(root.path().join("saved/ranks.ron")).unwrap(),
        record
    );
    // A rank lost during a save: nothing is committed under the new name.
    let timeout = Duration::from_millis(300);
    let results = on_ranks(2, |mailbox| {
        let rank = mailbox.rank();
        let mut pod = RankedPod::with_timeout(topology.clone(), mailbox, timeout)?;
        pod.run(5)?;
        if rank == 1 {
            return Ok(());
        }
        pod.save_checkpoint(root.path(), "never").map(|_| ())
    });
    assert!(results[0].as_ref().is_err());
    assert!(!root.path().join("never").exists());
    let names: Vec<String> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with(".tmp-"))
        .collect();
    assert_eq!(names, vec!["saved"]);
}
