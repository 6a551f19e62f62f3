//! The sharded optimizer on a pod split over ranks (threads of this
//! process, through the same frames as MPI ranks) is the one-process
//! sharded optimizer: the same parameters bit for bit on every rank, the
//! merged world's digest equal to the one-process world's, each rank
//! holding only its devices' state shards and reading only its replicas'
//! gradients, and a failure in flight failing the step alike everywhere.

use ndarray::{ArrayD, IxDyn};
use optirs_tpu::health::Fault;
use optirs_tpu::memory::ShardSlot;
use optirs_tpu::optimizers::{Adam, SGD};
use optirs_tpu::pod::ranks::RankedPod;
use optirs_tpu::sharding::ranked::HeldElsewhere;
use optirs_tpu::sharding::{GradientSource, ParamSet, ShardingError, SyntheticGradients};
use optirs_tpu::topology::{DeviceId, Topology, load_preset};
use optirs_tpu::tpu::{ShardedOptimizer, ShardingConfig};
use optirs_tpu::{OptimError, Optimizer, Pod, Result};
use proptest::prelude::*;

#[path = "common/ranks.rs"]
mod ranks_common;
use optirs_tpu::transport::cluster::ThreadSharing;
use ranks_common::{on_ranks, on_ranks_sharing};

fn model(sizes: &[usize]) -> ParamSet<f32> {
    let mut set = ParamSet::new();
    for (i, &n) in sizes.iter().enumerate() {
        let values: Vec<f32> = (0..n)
            .map(|j| ((i * 31 + j) % 17) as f32 * 0.25 - 2.0)
            .collect();
        set.insert(
            format!("t{i}"),
            ArrayD::from_shape_vec(IxDyn(&[n]), values).unwrap(),
        )
        .unwrap();
    }
    set
}

/// Adam at 1e-2 over a model of `sizes`, on `pod` in one process.
fn adam_one(pod: Pod, sizes: &[usize], sharding: ShardingConfig) -> ShardedOptimizer<Adam<f32>> {
    ShardedOptimizer::on_pod(Adam::new(1e-2f32), pod, model(sizes), sharding).unwrap()
}

/// [`adam_one`] on this rank's part of a split pod.
fn adam_split(
    pod: RankedPod,
    sizes: &[usize],
    sharding: ShardingConfig,
) -> Result<ShardedOptimizer<Adam<f32>>> {
    ShardedOptimizer::on_ranked_pod(Adam::new(1e-2f32), pod, model(sizes), sharding)
}

fn grads(step: u64, replicas: usize) -> SyntheticGradients {
    SyntheticGradients {
        seed: 11,
        step,
        replicas,
        scale: 3.0,
    }
}

fn sharding(bucket_bytes: usize) -> ShardingConfig {
    ShardingConfig {
        bucket_bytes,
        ..ShardingConfig::default()
    }
}

/// What a run ends with: the merged world's digest and the parameters.
#[derive(Debug, PartialEq)]
struct Outcome {
    digest: String,
    params: Vec<u32>,
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn one_process<O: Optimizer<f32, IxDyn>>(
    optimizer: O,
    topology: &Topology,
    sizes: &[usize],
    bucket_bytes: usize,
    steps: u64,
) -> Outcome {
    let pod = Pod::from_topology(topology.clone()).unwrap();
    let mut opt =
        ShardedOptimizer::on_pod(optimizer, pod, model(sizes), sharding(bucket_bytes)).unwrap();
    let replicas = topology.num_devices() as usize;
    for step in 1..=steps {
        opt.step(&grads(step, replicas)).unwrap();
    }
    Outcome {
        digest: opt.pod_mut().world_sha256().unwrap(),
        params: bits(&opt.flat_params().unwrap()),
    }
}

/// What a rank reports: the merged world's digest (rank 0 only) and its
/// parameters' bits.
fn rank_outcome<O: Optimizer<f32, IxDyn>>(
    opt: &mut ShardedOptimizer<O, f32>,
) -> Result<(Option<String>, Vec<u32>)> {
    let params = bits(&opt.flat_params()?);
    let merged = opt.ranked_mut().expect("split").gather()?;
    Ok((merged.map(|w| w.sha256_hex()), params))
}

fn split<O: Optimizer<f32, IxDyn> + Clone + Send + Sync>(
    optimizer: O,
    topology: &Topology,
    ranks: u32,
    sizes: &[usize],
    bucket_bytes: usize,
    steps: u64,
) -> Vec<(Option<String>, Vec<u32>)> {
    split_sharing(
        ThreadSharing::Memory,
        optimizer,
        topology,
        ranks,
        sizes,
        bucket_bytes,
        steps,
    )
}

/// [`split`], the ranks reading each other's members in shared memory or
/// moving them as frames.
fn split_sharing<O: Optimizer<f32, IxDyn> + Clone + Send + Sync>(
    sharing: ThreadSharing,
    optimizer: O,
    topology: &Topology,
    ranks: u32,
    sizes: &[usize],
    bucket_bytes: usize,
    steps: u64,
) -> Vec<(Option<String>, Vec<u32>)> {
    on_ranks_sharing(ranks, sharing, |mailbox| {
        let mut pod = RankedPod::new(topology.clone(), mailbox)?;
        pod.handshake(&format!("{steps} steps of {sizes:?}"))?;
        let mut opt = ShardedOptimizer::on_ranked_pod(
            optimizer.clone(),
            pod,
            model(sizes),
            sharding(bucket_bytes),
        )?;
        let replicas = topology.num_devices() as usize;
        for step in 1..=steps {
            opt.step(&grads(step, replicas))?;
        }
        rank_outcome(&mut opt)
    })
    .into_iter()
    .map(|r| r.unwrap())
    .collect()
}

fn assert_same(single: &Outcome, ranked: &[(Option<String>, Vec<u32>)], what: &str) {
    assert_eq!(
        ranked[0].0.as_deref(),
        Some(single.digest.as_str()),
        "{what}: merged world"
    );
    for (rank, (merged, params)) in ranked.iter().enumerate() {
        assert_eq!(params, &single.params, "{what}: rank {rank}'s parameters");
        if rank > 0 {
            assert_eq!(merged, &None, "{what}: only rank 0 merges");
        }
    }
}

#[test]
fn sharded_steps_split_over_ranks_are_the_one_process_steps() {
    // Several buckets (256-byte buckets over odd tensors), both plans' pods.
    let sizes = [37, 130, 5];
    // The ranks read each other's members in shared memory (ranks on one
    // node) or move them as frames (ranks on several nodes).
    for (preset, ranks) in [("v4-16", 2), ("v5e-16", 2), ("v3-64", 4), ("v4-128", 4)] {
        let topology = load_preset(preset).unwrap();
        let single = one_process(Adam::new(1e-2f32), &topology, &sizes, 256, 3);
        for sharing in [ThreadSharing::Memory, ThreadSharing::MessagesOnly] {
            let adam = Adam::new(1e-2f32);
            let ranked = split_sharing(sharing, adam, &topology, ranks, &sizes, 256, 3);
            assert_same(
                &single,
                &ranked,
                &format!("adam on {preset} over {ranks} ranks, {sharing:?}"),
            );
        }
    }
}

#[test]
fn a_multislice_model_split_over_ranks_is_the_one_process_model() {
    // Two v5e 4x4 slices over DCN: 4 hosts, so 2 ranks split within the
    // slices and 4 ranks put a rank on each host.
    let topology = Pod::from_ron_str(
        "Pod(name: \"two-slices\", generation: \"v5e\", shape: \"4x4\", slices: 2)",
        "two-slices.ron",
    )
    .unwrap()
    .topology()
    .clone();
    let sizes = [700, 33];
    let single = one_process(Adam::new(1e-2f32), &topology, &sizes, 1024, 2);
    for ranks in [2, 4] {
        let ranked = split(Adam::new(1e-2f32), &topology, ranks, &sizes, 1024, 2);
        assert_same(&single, &ranked, &format!("two slices over {ranks} ranks"));
    }
}

#[test]
fn each_rank_holds_only_its_devices_state_shards() {
    let topology = load_preset("v3-64").unwrap();
    let counts = on_ranks(4, |mailbox| {
        let pod = RankedPod::new(topology.clone(), mailbox)?;
        let local = pod.layout().local_devices().len();
        let mut opt = adam_split(pod, &[300], sharding(1 << 20))?;
        opt.step(&grads(1, 32))?;
        let world = opt.pod_mut().world_mut();
        let mut held =
            world.query_filtered::<&ShardSlot, bevy_ecs::query::Without<HeldElsewhere>>();
        let held: Vec<DeviceId> = held.iter(world).map(|s| s.device).collect();
        let rank = opt.ranked().unwrap().layout().rank();
        let all_local = held
            .iter()
            .all(|&d| opt.ranked().unwrap().layout().is_local(d));
        // The state lives on this rank's devices only; gathering it here
        // is refused rather than answered from a part.
        let gathered = opt.state("mu");
        Ok((rank, local, held.len(), all_local, gathered.is_err()))
    });
    for r in counts {
        let (rank, local, held, all_local, refused) = r.unwrap();
        assert_eq!(
            held,
            2 * local,
            "rank {rank}: Adam's two slots per local device"
        );
        assert!(all_local, "rank {rank} holds another rank's shard");
        assert!(refused, "rank {rank} answered state() from its part");
    }
}

/// Gradients where another rank's replicas are NaN: a rank that read one
/// would poison every parameter.
struct OwnReplicasOnly {
    real: SyntheticGradients,
    local: Vec<bool>,
}

impl GradientSource<f32> for OwnReplicasOnly {
    fn replicas(&self) -> usize {
        self.local.len()
    }

    fn fill(&self, replica: usize, offset: usize, out: &mut [f32]) {
        if self.local[replica] {
            GradientSource::<f32>::fill(&self.real, replica, offset, out);
        } else {
            out.fill(f32::NAN);
        }
    }
}

#[test]
fn a_rank_reads_only_its_own_replicas_gradients() {
    let topology = load_preset("v4-16").unwrap();
    let sizes = [64, 9];
    let single = one_process(SGD::new(0.1f32), &topology, &sizes, 1 << 20, 2);
    let ranked: Vec<(Option<String>, Vec<u32>)> = on_ranks(2, |mailbox| {
        let pod = RankedPod::new(topology.clone(), mailbox)?;
        let local: Vec<bool> = (0..topology.num_devices())
            .map(|d| pod.layout().is_local(DeviceId(d)))
            .collect();
        let mut opt = ShardedOptimizer::on_ranked_pod(
            SGD::new(0.1f32),
            pod,
            model(&sizes),
            sharding(1 << 20),
        )?;
        for step in 1..=2 {
            let source = OwnReplicasOnly {
                real: grads(step, local.len()),
                local: local.clone(),
            };
            opt.step(&source)?;
        }
        rank_outcome(&mut opt)
    })
    .into_iter()
    .map(|r| r.unwrap())
    .collect();
    assert_same(&single, &ranked, "sgd with other ranks' replicas poisoned");
}

#[test]
fn a_device_killed_in_flight_fails_the_step_alike_on_every_rank() {
    // 1 µs ticks, so the step spans many ticks and the kill lands in it.
    let topology = Pod::from_ron_str(
        "Pod(name: \"v4-16-fine\", generation: \"v4\", shape: \"2x2x2\", tick_ms: 0.001)",
        "v4-16-fine",
    )
    .unwrap()
    .topology()
    .clone();
    // One process: step 1 completes, step 2 fails on the kill.
    let run_one = || {
        let pod = Pod::from_topology(topology.clone()).unwrap();
        let mut opt = adam_one(pod, &[5000, 77], sharding(4096));
        let first = opt.step(&grads(1, 8)).map(|r| r.step);
        let now = opt.pod().clock().now_ns;
        opt.pod_mut()
            .schedule_fault(now + 1_000, Fault::KillDevice(DeviceId(7)));
        let second = opt.step(&grads(2, 8)).map(|r| r.step);
        (first, second, opt.pod_mut().world_sha256().unwrap())
    };
    let (first, second, digest) = run_one();
    let failed_on = |e: &OptimError| match e.downcast_ref::<ShardingError>() {
        Some(ShardingError::Unrecoverable { step, cause, .. })
        | Some(ShardingError::StepFailed { step, cause, .. }) => Some((*step, cause.to_string())),
        _ => None,
    };
    assert_eq!(first.as_ref().ok(), Some(&1));
    let expected = failed_on(second.as_ref().unwrap_err()).expect("a failed step");
    let ranked = on_ranks(2, |mailbox| {
        let pod = RankedPod::new(topology.clone(), mailbox)?;
        let mut opt = adam_split(pod, &[5000, 77], sharding(4096))?;
        let first = opt.step(&grads(1, 8)).map(|r| r.step);
        let now = opt.pod().clock().now_ns;
        opt.ranked_mut()
            .unwrap()
            .schedule_fault(now + 1_000, Fault::KillDevice(DeviceId(7)));
        let second = opt.step(&grads(2, 8)).map(|r| r.step);
        let merged = opt.ranked_mut().unwrap().gather()?;
        Ok((first.ok(), second.err().and_then(|e| failed_on(&e)), merged))
    });
    for (rank, r) in ranked.into_iter().enumerate() {
        let (first, second, merged) = r.unwrap();
        assert_eq!(first, Some(1), "rank {rank}");
        assert_eq!(second.as_ref(), Some(&expected), "rank {rank}");
        if rank == 0 {
            assert_eq!(merged.unwrap().sha256_hex(), digest);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// Random models, buckets, optimizers, pods and rank counts: split is
    /// one process.
    #[test]
    fn split_training_is_one_process_training(
        sizes in prop::collection::vec(1usize..200, 1..5),
        bucket in prop::sample::select(vec![64usize, 256, 4096, 1 << 20]),
        adam in any::<bool>(),
        pod in prop::sample::select(vec![("v4-16", 2u32), ("v5e-16", 2), ("v3-64", 4), ("v4-128", 2)]),
        shared in any::<bool>(),
    ) {
        let (preset, ranks) = pod;
        let topology = load_preset(preset).unwrap();
        let sharing = if shared { ThreadSharing::Memory } else { ThreadSharing::MessagesOnly };
        let what = format!(
            "{sizes:?} in {bucket}-byte buckets on {preset} over {ranks}, {sharing:?}"
        );
        if adam {
            let single = one_process(Adam::new(3e-3f32), &topology, &sizes, bucket, 2);
            let adam = Adam::new(3e-3f32);
            let ranked = split_sharing(sharing, adam, &topology, ranks, &sizes, bucket, 2);
            assert_same(&single, &ranked, &what);
        } else {
            let single = one_process(SGD::new(0.05f32), &topology, &sizes, bucket, 2);
            let sgd = SGD::new(0.05f32);
            let ranked = split_sharing(sharing, sgd, &topology, ranks, &sizes, bucket, 2);
            assert_same(&single, &ranked, &what);
        }
    }
}

#[test]
fn a_split_training_checkpoint_restores_on_other_rank_counts_and_continues_bit_for_bit() {
    let topology = load_preset("v3-64").unwrap();
    let sizes = [3000, 77];
    let straight = one_process(Adam::new(1e-2f32), &topology, &sizes, 4096, 3);
    let root = tempfile::tempdir().unwrap();
    let build = |pod: RankedPod| adam_split(pod, &sizes, sharding(4096));
    // Two steps on four ranks, then a split checkpoint.
    for r in on_ranks(4, |mailbox| {
        let mut opt = build(RankedPod::new(topology.clone(), mailbox)?)?;
        for step in 1..=2 {
            opt.step(&grads(step, 32))?;
        }
        opt.ranked_mut()
            .unwrap()
            .save_checkpoint(root.path(), "after-2")?;
        Ok(())
    }) {
        r.unwrap();
    }
    let dir = root.path().join("after-2");
    // Step 3 on two ranks from it.
    let ranked: Vec<(Option<String>, Vec<u32>)> = on_ranks(2, |mailbox| {
        let mut opt = build(RankedPod::new(topology.clone(), mailbox)?)?;
        opt.ranked_mut().unwrap().restore_checkpoint(&dir)?;
        opt.step(&grads(3, 32))?;
        rank_outcome(&mut opt)
    })
    .into_iter()
    .map(|r| r.unwrap())
    .collect();
    assert_same(&straight, &ranked, "restored on 2 ranks");
    // And in one process.
    let registry = Pod::from_topology(topology.clone()).unwrap();
    let registry = registry
        .world()
        .resource::<optirs_tpu::persist::SnapshotRegistry>();
    let (_, snapshot) =
        optirs_tpu::checkpoint::split::read_split_checkpoint(&dir, registry).unwrap();
    let mut opt = adam_one(
        Pod::from_topology(topology.clone()).unwrap(),
        &sizes,
        sharding(4096),
    );
    opt.restore(&snapshot).unwrap();
    opt.step(&grads(3, 32)).unwrap();
    assert_eq!(opt.pod_mut().world_sha256().unwrap(), straight.digest);
    assert_eq!(bits(&opt.flat_params().unwrap()), straight.params);
}

#[test]
fn the_pods_all_reduce_over_ranks_is_the_one_process_all_reduce() {
    use optirs_tpu::collectives::ReduceOp;
    for (preset, ranks, op) in [
        ("v4-16", 2u32, ReduceOp::Sum),
        ("v3-64", 4, ReduceOp::Mean),
        ("v5e-16", 2, ReduceOp::Max),
    ] {
        let topology = load_preset(preset).unwrap();
        let n = topology.num_devices() as usize;
        let len = 1000;
        let input = |d: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((d * 7919 + i * 31) % 1013) as f32 * 0.37 - 150.0)
                .collect()
        };
        let mut one = Pod::from_topology(topology.clone()).unwrap();
        let mut buffers: Vec<Vec<f32>> = (0..n).map(input).collect();
        let report = one.all_reduce(&mut buffers, op).unwrap();
        let digest = one.world_sha256().unwrap();
        let results = on_ranks(ranks, |mailbox| {
            let mut pod = RankedPod::new(topology.clone(), mailbox)?;
            let mut local: Vec<Option<Vec<f32>>> = (0..n)
                .map(|d| pod.layout().is_local(DeviceId(d as u32)).then(|| input(d)))
                .collect();
            let theirs = pod.all_reduce(&mut local, op)?;
            Ok((theirs, local, pod.gather()?.map(|w| w.sha256_hex())))
        });
        for (rank, r) in results.into_iter().enumerate() {
            let (theirs, local, merged) = r.unwrap();
            assert_eq!(theirs.link_bytes, report.link_bytes, "{preset}");
            assert_eq!(theirs.completes_at_ns, report.completes_at_ns, "{preset}");
            for (d, buffer) in local.iter().enumerate() {
                if let Some(b) = buffer {
                    assert_eq!(bits(b), bits(&buffers[d]), "{preset}: device {d}");
                }
            }
            if rank == 0 {
                assert_eq!(merged.as_deref(), Some(digest.as_str()), "{preset}");
            }
        }
    }
}

#[test]
fn a_split_model_recovers_from_its_redundant_copies_as_one_process_does() {
    recovers_as_one_process(optirs_tpu::sharding::RecoveryPolicy::Redundant);
}

#[test]
fn a_split_model_rolls_back_to_its_split_checkpoint_as_one_process_does() {
    recovers_as_one_process(optirs_tpu::sharding::RecoveryPolicy::Rollback);
}

/// Step 2 fails on device 6's kill; the survivors re-shard (from the
/// copies, or from the last periodic checkpoint: split ones on the split
/// pod) and the steps go on on 7 devices, as in one process.
fn recovers_as_one_process(policy: optirs_tpu::sharding::RecoveryPolicy) {
    use optirs_tpu::sharding::RecoveryPolicy;
    let topology = Pod::from_ron_str(
        "Pod(name: \"v4-16-fine\", generation: \"v4\", shape: \"2x2x2\", tick_ms: 0.001)",
        "v4-16-fine",
    )
    .unwrap()
    .topology()
    .clone();
    let sizes = [5000, 77];
    let redundant = ShardingConfig {
        bucket_bytes: 4096,
        recovery: policy,
        ..ShardingConfig::default()
    };
    let checkpoints = |pod: &mut Pod, root: &std::path::Path| {
        if policy == RecoveryPolicy::Rollback {
            pod.enable_periodic_checkpoints(20, vec![root.to_path_buf()], 3)
                .unwrap();
        }
    };
    let (one_root, split_root) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let run = |opt: &mut dyn FnMut(u64) -> Result<u64, OptimError>| {
        let mut outcomes = Vec::new();
        for step in 1..=5 {
            outcomes.push(opt(step).map_err(|e| !e.to_string().is_empty()));
        }
        outcomes
    };
    let pod = Pod::from_topology(topology.clone()).unwrap();
    let mut one = adam_one(pod, &sizes, redundant);
    checkpoints(one.pod_mut(), one_root.path());
    let one_outcomes = run(&mut |step| {
        if step == 2 {
            let now = one.pod().clock().now_ns;
            one.pod_mut()
                .schedule_fault(now + 1_000, Fault::KillDevice(DeviceId(6)));
        }
        let replicas = one.layout().unwrap().devices();
        one.step(&grads(step, replicas)).map(|r| r.step)
    });
    assert!(one_outcomes[1].is_err(), "{one_outcomes:?}");
    assert_eq!(one.recoveries().len(), 1);
    let single = Outcome {
        digest: one.pod_mut().world_sha256().unwrap(),
        params: bits(&one.flat_params().unwrap()),
    };
    let ranked = on_ranks(2, |mailbox| {
        let pod = RankedPod::new(topology.clone(), mailbox)?;
        let mut opt = adam_split(pod, &sizes, redundant)?;
        checkpoints(opt.pod_mut(), split_root.path());
        let outcomes = run(&mut |step| {
            if step == 2 {
                let now = opt.pod().clock().now_ns;
                opt.ranked_mut()
                    .unwrap()
                    .schedule_fault(now + 1_000, Fault::KillDevice(DeviceId(6)));
            }
            let replicas = opt.layout()?.devices();
            opt.step(&grads(step, replicas)).map(|r| r.step)
        });
        let params = bits(&opt.flat_params()?);
        let recoveries = opt.recoveries().len();
        let merged = opt.ranked_mut().unwrap().gather()?.map(|w| w.sha256_hex());
        Ok((outcomes, recoveries, merged, params))
    });
    for (rank, r) in ranked.into_iter().enumerate() {
        let (outcomes, recoveries, merged, params) = r.unwrap();
        assert_eq!(outcomes, one_outcomes, "rank {rank}");
        assert_eq!(recoveries, 1, "rank {rank}");
        assert_eq!(params, single.params, "rank {rank}'s parameters");
        if rank == 0 {
            assert_eq!(merged.as_deref(), Some(single.digest.as_str()));
        }
    }
}

#[test]
fn the_pods_ring_reduce_scatter_and_all_gather_over_ranks_are_the_one_process_ones() {
    use optirs_tpu::collectives::ReduceOp;
    for (preset, ranks) in [("v4-16", 2u32), ("v3-64", 4)] {
        let topology = load_preset(preset).unwrap();
        let n = topology.num_devices() as usize;
        let len = 777;
        let input = |d: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((d * 104_729 + i * 13) % 997) as f32 * 0.21 - 99.0)
                .collect()
        };
        let mut one = Pod::from_topology(topology.clone()).unwrap();
        let mut buffers: Vec<Vec<f32>> = (0..n).map(input).collect();
        let (rs, ring) = one.reduce_scatter(&mut buffers, ReduceOp::Sum).unwrap();
        let after_rs = buffers.clone();
        let (ag, _) = one.all_gather(&mut buffers).unwrap();
        let digest = one.world_sha256().unwrap();
        let results = on_ranks(ranks, |mailbox| {
            let mut pod = RankedPod::new(topology.clone(), mailbox)?;
            let mut local: Vec<Option<Vec<f32>>> = (0..n)
                .map(|d| pod.layout().is_local(DeviceId(d as u32)).then(|| input(d)))
                .collect();
            let (their_rs, their_ring) = pod.reduce_scatter(&mut local, ReduceOp::Sum)?;
            let local_rs = local.clone();
            let (their_ag, _) = pod.all_gather(&mut local)?;
            let merged = pod.gather()?.map(|w| w.sha256_hex());
            Ok((their_rs, their_ring, local_rs, their_ag, local, merged))
        });
        for (rank, r) in results.into_iter().enumerate() {
            let (their_rs, their_ring, local_rs, their_ag, local, merged) = r.unwrap();
            assert_eq!(their_ring, ring, "{preset}");
            assert_eq!(their_rs.link_bytes, rs.link_bytes, "{preset}");
            assert_eq!(their_ag.completes_at_ns, ag.completes_at_ns, "{preset}");
            for d in 0..n {
                if let (Some(a), Some(b)) = (&local_rs[d], &local[d]) {
                    assert_eq!(bits(a), bits(&after_rs[d]), "{preset}: device {d} after RS");
                    assert_eq!(bits(b), bits(&buffers[d]), "{preset}: device {d} after AG");
                }
            }
            if rank == 0 {
                assert_eq!(merged.as_deref(), Some(digest.as_str()), "{preset}");
            }
        }
    }
}
