//! Real runs under the zero2 and fsdp strategies: the same bits as the
//! replicated run and the unsharded step, each device's HBM exactly the
//! residency closed form during and after a step, the fsdp collectives on
//! the links and in the model of time, recovery under every policy, and
//! checkpoints restored onto another strategy, mesh and device count; on
//! meshes whose data axis replicates the state (hybrid across slices).

use ndarray::{Array1, ArrayD, IxDyn};
use optirs_tpu::collectives::{ReduceOp, TorusShape, all_reduce, torus_all_reduce};
use optirs_tpu::health::Fault;
use optirs_tpu::memory::HbmUsage;
use optirs_tpu::sharding::residency::{ResidencyInput, hbm_bytes_per_device};
use optirs_tpu::sharding::{
    Mesh, MeshSizes, ParamSet, RecoveryPolicy, ShardLayout, ShardPlan, ShardingError, Strategy,
    SyntheticGradients,
};
use optirs_tpu::topology::DeviceId;
use optirs_tpu::tpu::{ShardedOptimizer, ShardingConfig};
use optirs_tpu::{Pod, TPUConfig, TPUOptimizer};
use proptest::prelude::*;

type Base = Box<dyn optirs_tpu::Optimizer<f32, IxDyn> + Send + Sync>;
type Sharded = ShardedOptimizer<Base, f32>;

fn values(seed: u64, n: usize) -> Vec<f32> {
    let g = SyntheticGradients {
        seed,
        step: 0,
        replicas: 1,
        scale: 4.0,
    };
    (0..n).map(|i| g.value(0, i) as f32).collect()
}

fn pod_named(name: &str) -> Pod {
    match name {
        "mesh-3x5" => Pod::from_ron_str(
            "Pod(name: \"mesh-3x5\", generation: \"v5e\", shape: \"3x5\", custom: true, chips_per_host: \"1x1\")",
            "mesh-3x5",
        )
        .unwrap(),
        // 1 µs ticks, so a fault lands inside a µs-long step.
        "v4-16-fine" => Pod::from_ron_str(
            "Pod(name: \"v4-16-fine\", generation: \"v4\", shape: \"2x2x2\", tick_ms: 0.001)",
            "v4-16-fine",
        )
        .unwrap(),
        "cubes" => Pod::from_ron_str(
            "Pod(name: \"cubes\", generation: \"v4\", shape: \"4x4x4\", tick_ms: 0.01, \
             cubes: (spares: 1, reconfigure_seconds: 0.0001))",
            "cubes",
        )
        .unwrap(),
        "ms-v5e" => Pod::from_ron_str(
            "Pod(name: \"ms-v5e\", generation: \"v5e\", shape: \"4x4\", slices: 2)",
            "ms-v5e",
        )
        .unwrap(),
        other => Pod::from_preset(other).unwrap(),
    }
}

fn model(sizes: &[usize]) -> ParamSet<f32> {
    let mut set = ParamSet::new();
    for (i, &n) in sizes.iter().enumerate() {
        let shape = if n % 2 == 0 && n > 2 {
            vec![2, n / 2]
        } else {
            vec![n]
        };
        let v = values(1000 + i as u64, n);
        set.insert(
            format!("t{i}"),
            ArrayD::from_shape_vec(IxDyn(&shape), v).unwrap(),
        )
        .unwrap();
    }
    set
}

/// Every replica's gradients for `step` (a function of the replica's
/// position in the layout and the element, as a data-parallel job's).
fn replica_grads(layout: &ShardLayout, sizes: &[usize], step: u64) -> Vec<ParamSet<f32>> {
    let shapes = model(sizes);
    (0..layout.devices())
        .map(|r| {
            let synthetic = SyntheticGradients {
                seed: 5,
                step,
                replicas: layout.devices(),
                scale: 1.0,
            };
            let mut out = ParamSet::new();
            let mut at = 0;
            for (name, t) in shapes.iter() {
                let v: Vec<f32> = (0..t.len())
                    .map(|i| synthetic.value(r, at + i) as f32)
                    .collect();
                at += t.len();
                out.insert(name, ArrayD::from_shape_vec(IxDyn(t.shape()), v).unwrap())
                    .unwrap();
            }
            out
        })
        .collect()
}

/// The reduced gradient as the pod's own all-reduce computes it, bucket by
/// bucket (the reference the unsharded step takes).
fn reference_reduced(layout: &ShardLayout, grads: &[ParamSet<f32>]) -> Array1<f32> {
    let replicas: Vec<Vec<f32>> = grads.iter().map(|g| g.to_flat()).collect();
    let mut out = Vec::new();
    let ranks = layout
        .participants
        .iter()
        .map(|d| d.0 as usize + 1)
        .max()
        .unwrap();
    for bucket in &layout.buckets {
        let mut buffers: Vec<Vec<f32>> = vec![Vec::new(); ranks];
        for (r, d) in layout.participants.iter().enumerate() {
            let mut b = replicas[r][bucket.offset..bucket.offset + bucket.len].to_vec();
            b.resize(bucket.padded_len, 0.0);
            buffers[d.0 as usize] = b;
        }
        match &layout.plan {
            ShardPlan::Torus { dims, wraparound } => {
                let shape = TorusShape::new(dims, wraparound).unwrap();
                torus_all_reduce(&mut buffers, &shape, ReduceOp::Mean).unwrap();
            }
            ShardPlan::Ring { ring } => {
                let ring: Vec<usize> = ring.iter().map(|d| d.0 as usize).collect();
                all_reduce(&mut buffers, &ring, ReduceOp::Mean).unwrap();
            }
            // A multislice all-reduce folds on the grid with the slices
            // as its last axis.
            ShardPlan::Multislice { .. } => {
                let shape = layout.plan.grid_shape().unwrap();
                torus_all_reduce(&mut buffers, &shape, ReduceOp::Mean).unwrap();
            }
        }
        out.extend_from_slice(&buffers[layout.participants[0].0 as usize][..bucket.len]);
    }
    Array1::from_vec(out)
}

fn config(
    strategy: Strategy,
    prefetch: usize,
    bucket_bytes: usize,
    recovery: RecoveryPolicy,
) -> ShardingConfig {
    ShardingConfig {
        bucket_bytes,
        recovery,
        strategy,
        prefetch,
        ..ShardingConfig::default()
    }
}

fn sharded(pod: Pod, optimizer: &str, sizes: &[usize], sharding: ShardingConfig) -> Sharded {
    let base = optirs_tpu::optimizers::by_name(optimizer, 0.05f32).unwrap();
    ShardedOptimizer::on_pod(base, pod, model(sizes), sharding).unwrap()
}

const SLOT_NAMES: [&str; 5] = ["mu", "nu", "trace", "sum_of_squares", "nu_hat"];

/// Parameters and every state slot (by name), as bits.
type Bits = (Vec<u32>, Vec<(String, Vec<u32>)>);

/// Parameters and every state slot, as bits.
fn bits(opt: &mut Sharded) -> Bits {
    let params = opt
        .flat_params()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect();
    let mut state = Vec::new();
    for name in SLOT_NAMES {
        if let Some(v) = opt.state(name).unwrap() {
            state.push((name.to_string(), v.iter().map(|x| x.to_bits()).collect()));
        }
    }
    (params, state)
}

/// The residency figures of the optimizer's model as laid out now.
fn residency(opt: &Sharded) -> ResidencyInput {
    let s = opt.sharding();
    let slots = optirs_tpu::sharding::model_of(opt.pod().world())
        .unwrap()
        .slots
        .len();
    ResidencyInput::of_layout(
        opt.layout().unwrap(),
        s.strategy,
        slots,
        s.prefetch,
        s.recovery == RecoveryPolicy::Redundant,
    )
}

/// Every participant's HBM in use now.
fn hbm_now(opt: &Sharded) -> Vec<u64> {
    opt.layout()
        .unwrap()
        .participants
        .iter()
        .map(|&d| {
            let e = opt.pod().device_entity(d).unwrap();
            opt.pod().world().get::<HbmUsage>(e).map_or(0, |u| u.0)
        })
        .collect()
}

/// A step whose HBM during it and after it is the closed form's, per device.
fn checked_step(opt: &mut Sharded, grads: &[ParamSet<f32>]) -> optirs_tpu::tpu::ShardedStepReport {
    let want = hbm_bytes_per_device(&residency(opt));
    let devices = opt.layout().unwrap().devices();
    assert_eq!(hbm_now(opt), vec![want.resident(); devices], "before");
    let report = opt.step_replicas(grads).unwrap();
    for (d, bytes) in &report.hbm_bytes_per_device {
        assert_eq!(*bytes, want.total, "device {d} during step {}", report.step);
    }
    assert_eq!(hbm_now(opt), vec![want.resident(); devices], "after");
    report
}

/// Every strategy over `pod` for `steps` steps: bits equal to the
/// replicated run's and to the unsharded step on the reduced gradient, HBM
/// per device the closed form's.
fn check_strategies(
    pod: &str,
    optimizer: &str,
    sizes: &[usize],
    bucket_bytes: usize,
    prefetch: usize,
    steps: u64,
) {
    check_meshes(
        pod,
        &[None],
        optimizer,
        sizes,
        (bucket_bytes, prefetch),
        steps,
    );
}

/// [`check_strategies`] on each of `meshes` (`None`: the pod's default),
/// every run held to the same unsharded step and to each other.
fn check_meshes(
    pod: &str,
    meshes: &[Option<&str>],
    optimizer: &str,
    sizes: &[usize],
    (bucket_bytes, prefetch): (usize, usize),
    steps: u64,
) {
    let mut runs: Vec<Sharded> = Vec::new();
    for mesh in meshes {
        for &s in &Strategy::ALL {
            let pod = pod_named(pod);
            let sizes_of = mesh.map(|m| Mesh::parse(m, pod.topology()).unwrap().sizes());
            let sharding = ShardingConfig {
                mesh: sizes_of,
                ..config(s, prefetch, bucket_bytes, RecoveryPolicy::Rollback)
            };
            runs.push(sharded(pod, optimizer, sizes, sharding));
        }
    }
    let tpu_config = TPUConfig::for_pod(runs[0].pod().topology());
    let mut reference = TPUOptimizer::new(
        optirs_tpu::optimizers::by_name(optimizer, 0.05f32).unwrap(),
        tpu_config,
    )
    .unwrap();
    let mut flat = Array1::from_vec(model(sizes).to_flat());
    let layout = runs[0].layout().unwrap().clone();
    for step in 1..=steps {
        let grads = replica_grads(&layout, sizes, step);
        reference
            .tpu_step_in_place(&mut flat, &reference_reduced(&layout, &grads))
            .unwrap();
        let want: Vec<u32> = flat.iter().map(|x| x.to_bits()).collect();
        let mut replicated = None;
        for run in runs.iter_mut() {
            checked_step(run, &grads);
            let got = bits(run);
            assert_eq!(
                got.0,
                want,
                "{optimizer} on {pod}, {} on {:?}, step {step}: params differ from the \
                 unsharded step",
                run.sharding().strategy,
                run.sharding().mesh
            );
            for (name, values) in &got.1 {
                let reference_slot: Vec<u32> = reference
                    .slot(name)
                    .unwrap()
                    .to_f64_vec()
                    .iter()
                    .map(|&v| (v as f32).to_bits())
                    .collect();
                assert_eq!(values, &reference_slot, "{optimizer} slot {name}");
            }
            match &replicated {
                None => replicated = Some(got),
                Some(r) => assert_eq!(&got, r, "{}", run.sharding().strategy),
            }
            assert_eq!(run.step_count(), step as i32);
        }
    }
    for run in &runs {
        assert_eq!(run.params().unwrap().to_flat(), flat.to_vec());
    }
}

#[test]
fn every_optimizer_under_every_strategy_is_exact_on_v4_8() {
    for name in optirs_tpu::optimizers::NAMES {
        check_strategies("v4-16", name, &[7, 33, 1, 64, 5], 64, 1, 3);
    }
}

#[test]
fn every_strategy_is_exact_on_other_pods() {
    check_strategies("v5e-16", "adam", &[100, 3, 17], 128, 0, 2);
    check_strategies("mesh-3x5", "rmsprop", &[29, 61], 96, 2, 2);
    check_strategies("v4-128", "adamw", &[300, 11], 4096, 1, 2);
}

#[test]
fn every_strategy_is_exact_on_every_kind_of_mesh() {
    // Data along torus axes (fsdp of 1 too), on a 3x5 mesh either way
    // round, hybrid across slices (the multislice default), fsdp across
    // slices, and data over the slices and a torus axis.
    check_meshes(
        "v4-128",
        &[
            Some("data=4,fsdp=16"),
            Some("data=16,fsdp=4"),
            Some("data=64"),
        ],
        "adam",
        &[300, 11],
        (4096, 1),
        2,
    );
    check_meshes(
        "mesh-3x5",
        &[Some("data=3,fsdp=5"), Some("data=5,fsdp=3")],
        "rmsprop",
        &[29, 61],
        (96, 0),
        2,
    );
    check_meshes(
        "ms-v5e",
        &[None, Some("fsdp=32"), Some("data=8,fsdp=4")],
        "adamw",
        &[100, 3, 17],
        (128, 2),
        2,
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]

    /// Random models, buckets, prefetch and optimizers on random meshes
    /// of a one-slice and a two-slice pod: every strategy's bits and HBM.
    #[test]
    fn every_strategy_is_exact_on_random_meshes(
        sizes in prop::collection::vec(1usize..90, 1..5),
        bucket_bytes in 4usize..600,
        prefetch in 0usize..3,
        opt in 0usize..7,
        mesh in 0usize..6,
    ) {
        let (pod, mesh) = [
            ("v5e-16", "data=4,fsdp=4"),
            ("v5e-16", "data=16"),
            ("mesh-3x5", "data=5,fsdp=3"),
            ("ms-v5e", "data=2,fsdp=16"),
            ("ms-v5e", "fsdp=-1"),
            ("ms-v5e", "data=8,fsdp=4"),
        ][mesh];
        check_meshes(
            pod,
            &[Some(mesh)],
            optirs_tpu::optimizers::NAMES[opt],
            &sizes,
            (bucket_bytes, prefetch),
            2,
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// Random models (odd sizes, several tensors), buckets, prefetch and
    /// optimizers: every strategy's bits and HBM.
    #[test]
    fn every_strategy_is_exact_on_random_models(
        sizes in prop::collection::vec(1usize..90, 1..7),
        bucket_bytes in 4usize..600,
        prefetch in 0usize..4,
        opt in 0usize..7,
        pod in 0usize..3,
    ) {
        let pod = ["v4-16", "v5e-16", "mesh-3x5"][pod];
        check_strategies(pod, optirs_tpu::optimizers::NAMES[opt], &sizes, bucket_bytes, prefetch, 2);
    }
}

#[test]
fn residency_is_the_replicated_closed_form_of_the_modeled_step() {
    // The replicated figure is the one `cost_model::replicated` has always given.
    for (pod, sizes, bucket) in [
        ("v4-16", vec![5000usize, 77], 4096usize),
        ("v5e-16", vec![12345], 8192),
        ("v4-128", vec![70000, 3], 65536),
    ] {
        let p = pod_named(pod);
        let tensors: Vec<(String, Vec<usize>)> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (format!("t{i}"), vec![n]))
            .collect();
        for recovery in [RecoveryPolicy::Rollback, RecoveryPolicy::Redundant] {
            let modeled = optirs_tpu::cost_model::modeled_step_with_recovery(
                p.topology(),
                &tensors,
                optirs_tpu::ir::DType::F32,
                2,
                bucket,
                recovery,
            )
            .unwrap();
            let opt = sharded(
                pod_named(pod),
                "adam",
                &sizes,
                config(Strategy::Replicated, 1, bucket, recovery),
            );
            assert_eq!(
                hbm_bytes_per_device(&residency(&opt)).total,
                modeled.hbm_bytes_per_device,
                "{pod} {recovery}"
            );
        }
    }
}

#[test]
fn fsdp_holds_less_and_moves_a_gather_more() {
    // One 4096-element bucket per device count 8: replicated and zero2 run
    // the same collectives; fsdp gathers twice and never after the update.
    let sizes = [4096usize];
    let run = |s: Strategy, prefetch: usize| {
        let mut opt = sharded(
            pod_named("v4-16"),
            "adam",
            &sizes,
            config(s, prefetch, 1 << 20, RecoveryPolicy::Rollback),
        );
        let layout = opt.layout().unwrap().clone();
        let report = checked_step(&mut opt, &replica_grads(&layout, &sizes, 1));
        (opt, report)
    };
    let (rep_opt, rep) = run(Strategy::Replicated, 1);
    let (_, zero2) = run(Strategy::Zero2, 1);
    let (fsdp_opt, fsdp) = run(Strategy::Fsdp, 1);
    let (_, fsdp0) = run(Strategy::Fsdp, 0);
    assert_eq!(zero2.link_bytes, rep.link_bytes);
    assert_eq!(zero2.modeled_seconds, rep.modeled_seconds);
    // A torus all-gather moves what the reduce-scatter moved: 3 passes of
    // the same bytes instead of 2.
    assert_eq!(2 * fsdp.link_bytes, 3 * rep.link_bytes);
    let gathers = |r: &optirs_tpu::tpu::ShardedStepReport| -> f64 {
        r.phases
            .iter()
            .filter(|(k, _)| k.starts_with("all_gather"))
            .map(|(_, v)| v)
            .sum()
    };
    let ag = gathers(&rep);
    assert!(ag > 0.0);
    let rel = (gathers(&fsdp) - 2.0 * ag).abs() / ag;
    assert!(
        rel < 1e-12,
        "fsdp gathers twice: {} vs 2 × {ag}",
        gathers(&fsdp)
    );
    // One bucket: RS + U + AG against AG + AG + RS + U, one gather more.
    // A gather's passes run axes at once, so its wall time is its spans'
    // extent, not its phases' sum.
    let wall = |r: &optirs_tpu::tpu::ShardedStepReport| -> f64 {
        let gather = r
            .spans
            .iter()
            .filter(|s| s.phase.key().starts_with("all_gather"));
        let start = gather
            .clone()
            .map(|s| s.start_seconds)
            .fold(f64::INFINITY, f64::min);
        let end = gather.map(|s| s.end_seconds).fold(0.0, f64::max);
        end - start
    };
    let ag = wall(&rep);
    let err = (fsdp.modeled_seconds - (rep.modeled_seconds + ag)).abs();
    assert!(
        err < 1e-12,
        "fsdp {} = replicated {} + gather {ag} (error {err:e})",
        fsdp.modeled_seconds,
        rep.modeled_seconds
    );
    // prefetch changes what is held, not the modeled time (the model has
    // no forward compute to hide a gather behind).
    assert_eq!(fsdp0.modeled_seconds, fsdp.modeled_seconds);
    // The resident parameters: a 1/8 shard against the replica.
    let fsdp_resident = hbm_now(&fsdp_opt)[0];
    let rep_resident = hbm_now(&rep_opt)[0];
    assert_eq!(rep_resident, 4096 * 4 + 2 * 512 * 4);
    assert_eq!(fsdp_resident, 512 * 4 + 2 * 512 * 4);
    // During the step: zero2 holds its gradient shard and the bucket in
    // flight, fsdp those and min(prefetch + 1, buckets) = 1 gathered bucket.
    assert_eq!(
        zero2.hbm_bytes_per_device[0].1,
        4096 * 4 + 2 * 2048 + 2048 + 16384
    );
    assert_eq!(
        fsdp.hbm_bytes_per_device[0].1,
        3 * 2048 + 2048 + 16384 + 16384
    );
    assert_eq!(
        fsdp0.hbm_bytes_per_device[0].1,
        fsdp.hbm_bytes_per_device[0].1
    );
}

#[test]
fn redundant_fsdp_copies_the_parameter_shard_and_sends_it() {
    let sizes = [4096usize];
    let run = |s: Strategy| {
        let mut opt = sharded(
            pod_named("v4-16"),
            "adam",
            &sizes,
            config(s, 1, 1 << 20, RecoveryPolicy::Redundant),
        );
        let layout = opt.layout().unwrap().clone();
        let report = checked_step(&mut opt, &replica_grads(&layout, &sizes, 1));
        (opt, report)
    };
    let (_, rep) = run(Strategy::Replicated);
    let (fsdp_opt, fsdp) = run(Strategy::Fsdp);
    // Resident: own shard, state, and the predecessor's state and shard.
    assert_eq!(hbm_now(&fsdp_opt)[0], 2 * (2048 + 2 * 2048));
    assert!(fsdp.phases["replicate_state"] > rep.phases["replicate_state"]);
}

/// Steps `from..=to` with the gradients of the layout each step runs on.
fn run_steps(opt: &mut Sharded, sizes: &[usize], from: u64, to: u64) {
    for step in from..=to {
        let layout = opt.layout().unwrap().clone();
        checked_step(opt, &replica_grads(&layout, sizes, step));
    }
}

/// A device killed in flight under `policy`: the recovery, then two more
/// steps; the bits and the recovery record (what each strategy ends with).
fn killed_run(
    pod: &str,
    strategy: Strategy,
    policy: RecoveryPolicy,
    device: u32,
    sizes: &[usize],
) -> (Bits, optirs_tpu::sharding::RecoveryRecord) {
    killed_run_on(pod, (strategy, None), policy, device, sizes)
}

/// [`killed_run`] on the mesh `mesh` (`None`: the pod's default).
fn killed_run_on(
    pod: &str,
    (strategy, mesh): (Strategy, Option<&str>),
    policy: RecoveryPolicy,
    device: u32,
    sizes: &[usize],
) -> (Bits, optirs_tpu::sharding::RecoveryRecord) {
    let dir = tempfile::tempdir().unwrap();
    let pod = pod_named(pod);
    let mesh = mesh.map(|m| Mesh::parse(m, pod.topology()).unwrap().sizes());
    let mut opt = sharded(
        pod,
        "adam",
        sizes,
        ShardingConfig {
            mesh,
            ..config(strategy, 1, 1024, policy)
        },
    );
    if policy != RecoveryPolicy::Redundant {
        // A checkpoint at every step boundary: the rollback restores the
        // last one, whatever each strategy's step time.
        opt.enable_step_checkpoints(1, dir.path().to_path_buf(), 2)
            .unwrap();
    }
    for step in 1..=2 {
        let layout = opt.layout().unwrap().clone();
        checked_step(&mut opt, &replica_grads(&layout, sizes, step));
        opt.checkpoint_if_due().unwrap();
    }
    let now = opt.pod().clock().now_ns;
    opt.pod_mut()
        .schedule_fault(now + 1, Fault::KillDevice(DeviceId(device)));
    let layout = opt.layout().unwrap().clone();
    let err = opt
        .step_replicas(&replica_grads(&layout, sizes, 3))
        .unwrap_err();
    assert!(
        matches!(
            err.downcast_ref::<ShardingError>(),
            Some(ShardingError::StepFailed { .. })
        ),
        "{strategy} {policy}: {err}"
    );
    let record = opt.recoveries().last().cloned().expect("recovered");
    assert_eq!(record.policy, policy, "{err}");
    assert_eq!(opt.sharding().strategy, strategy);
    assert_eq!(
        optirs_tpu::sharding::model_of(opt.pod().world())
            .unwrap()
            .strategy,
        strategy,
        "the recovery keeps the strategy"
    );
    // The next steps run on the recovered layout with the closed form's HBM.
    let done = opt.steps_completed();
    run_steps(&mut opt, sizes, done + 1, done + 2);
    (bits(&mut opt), record)
}

#[test]
fn every_policy_recovers_every_strategy_with_the_replicated_bits() {
    let sizes = [3000usize, 41];
    for (pod, policy, device) in [
        ("v4-16-fine", RecoveryPolicy::Rollback, 2),
        ("v4-16-fine", RecoveryPolicy::Redundant, 5),
        ("cubes", RecoveryPolicy::SpareCube, 5),
    ] {
        let (want, want_record) = killed_run(pod, Strategy::Replicated, policy, device, &sizes);
        for strategy in [Strategy::Zero2, Strategy::Fsdp] {
            let (got, record) = killed_run(pod, strategy, policy, device, &sizes);
            assert_eq!(got, want, "{strategy} under {policy}");
            assert_eq!(record.lost_steps, want_record.lost_steps);
            assert_eq!(record.devices_after, want_record.devices_after);
            if strategy == Strategy::Fsdp {
                // The parameter shards move with the state shards.
                assert!(record.reshard_seconds > want_record.reshard_seconds);
            } else {
                assert_eq!(record.reshard_seconds, want_record.reshard_seconds);
            }
        }
    }
}

#[test]
fn a_mesh_that_replicates_the_state_recovers_under_rollback_and_spare_cube() {
    let sizes = [3000usize, 41];
    for (policy, device) in [
        (RecoveryPolicy::Rollback, 9),
        (RecoveryPolicy::SpareCube, 9),
    ] {
        let (want, want_record) = killed_run("cubes", Strategy::Replicated, policy, device, &sizes);
        for strategy in Strategy::ALL {
            let (got, record) = killed_run_on(
                "cubes",
                (strategy, Some("data=4,fsdp=16")),
                policy,
                device,
                &sizes,
            );
            assert_eq!(got, want, "{strategy} on data=4 under {policy}");
            assert_eq!(record.lost_steps, want_record.lost_steps);
            // A rollback re-shards over the 63 survivors; a spare cube keeps
            // all 64 and the mesh.
            assert_eq!(record.devices_after, want_record.devices_after);
        }
    }
}

#[test]
fn a_checkpoint_restores_onto_another_mesh_as_if_never_stopped() {
    let sizes = [700usize, 19];
    let layouts: [(Strategy, Option<&str>); 4] = [
        (Strategy::Replicated, None),
        (Strategy::Fsdp, None),
        (Strategy::Zero2, Some("fsdp=32")),
        (Strategy::Fsdp, Some("data=8,fsdp=4")),
    ];
    let on = |(strategy, mesh): (Strategy, Option<&str>)| {
        let pod = pod_named("ms-v5e");
        let mesh = mesh.map(|m| Mesh::parse(m, pod.topology()).unwrap().sizes());
        let sharding = ShardingConfig {
            mesh,
            ..config(strategy, 1, 512, RecoveryPolicy::Rollback)
        };
        sharded(pod, "adam", &sizes, sharding)
    };
    for from in layouts {
        let mut straight = on(from);
        run_steps(&mut straight, &sizes, 1, 2);
        let snapshot = straight.snapshot().unwrap();
        run_steps(&mut straight, &sizes, 3, 4);
        let want = bits(&mut straight);
        for to in layouts {
            for whole in [false, true] {
                let mut next = on(to);
                if whole {
                    next.restore(&snapshot).unwrap();
                } else {
                    next.restore_resharded(&snapshot).unwrap();
                }
                let held = optirs_tpu::sharding::model_of(next.pod().world()).unwrap();
                assert_eq!(held.strategy, to.0);
                assert_eq!(
                    held.mesh.as_ref().map(|m| m.to_string()),
                    to.1.map(|m| Mesh::parse(m, next.pod().topology()).unwrap().to_string()),
                    "{from:?} → {to:?}"
                );
                run_steps(&mut next, &sizes, 3, 4);
                assert_eq!(
                    bits(&mut next),
                    want,
                    "{from:?} → {to:?} (whole pod: {whole})"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]

    /// Any device lost under rollback or redundant recovery: every strategy
    /// recovers to the replicated run's bits.
    #[test]
    fn a_lost_device_recovers_every_strategy_alike(
        device in 0u32..8,
        redundant in any::<bool>(),
        sizes in prop::collection::vec(1usize..500, 1..4),
    ) {
        let policy = if redundant { RecoveryPolicy::Redundant } else { RecoveryPolicy::Rollback };
        let (want, _) = killed_run("v4-16-fine", Strategy::Replicated, policy, device, &sizes);
        for strategy in [Strategy::Zero2, Strategy::Fsdp] {
            let (got, _) = killed_run("v4-16-fine", strategy, policy, device, &sizes);
            prop_assert_eq!(&got, &want, "{} under {}", strategy, policy);
        }
    }
}

#[test]
fn a_checkpoint_restores_onto_another_strategy_as_if_never_stopped() {
    let sizes = [900usize, 31, 5];
    for from in Strategy::ALL {
        // Never stopped: four steps under `from`.
        let mut straight = sharded(
            pod_named("v4-16"),
            "adam",
            &sizes,
            config(from, 1, 1024, RecoveryPolicy::Rollback),
        );
        run_steps(&mut straight, &sizes, 1, 2);
        let snapshot = straight.snapshot().unwrap();
        run_steps(&mut straight, &sizes, 3, 4);
        let want = bits(&mut straight);
        for to in Strategy::ALL {
            let mut resharded = sharded(
                pod_named("v4-16"),
                "adam",
                &sizes,
                config(to, 2, 1024, RecoveryPolicy::Rollback),
            );
            resharded.restore_resharded(&snapshot).unwrap();
            assert_eq!(resharded.step_count(), 2);
            let held = optirs_tpu::sharding::model_of(resharded.pod().world())
                .unwrap()
                .strategy;
            assert_eq!(held, to, "held as the optimizer says");
            run_steps(&mut resharded, &sizes, 3, 4);
            assert_eq!(bits(&mut resharded), want, "{from} → {to} (re-sharded)");
            // A whole-pod restore of the same pod re-shards onto the
            // optimizer's strategy too.
            let mut restored = sharded(
                pod_named("v4-16"),
                "adam",
                &sizes,
                config(to, 1, 1024, RecoveryPolicy::Rollback),
            );
            restored.restore(&snapshot).unwrap();
            let held = optirs_tpu::sharding::model_of(restored.pod().world())
                .unwrap()
                .strategy;
            assert_eq!(held, to);
            run_steps(&mut restored, &sizes, 3, 4);
            assert_eq!(bits(&mut restored), want, "{from} → {to} (restored)");
        }
    }
}

#[test]
fn a_checkpoint_restores_onto_another_device_count_and_strategy() {
    let sizes = [900usize, 31, 5];
    let mut small = sharded(
        pod_named("v4-16"),
        "adam",
        &sizes,
        config(Strategy::Fsdp, 1, 1024, RecoveryPolicy::Rollback),
    );
    run_steps(&mut small, &sizes, 1, 2);
    let snapshot = small.snapshot().unwrap();
    let layout8 = small.layout().unwrap().clone();
    for to in Strategy::ALL {
        let mut reference = TPUOptimizer::new(
            optirs_tpu::optimizers::by_name("adam", 0.05f32).unwrap(),
            TPUConfig::for_pod(small.pod().topology()),
        )
        .unwrap();
        let mut flat = Array1::from_vec(model(&sizes).to_flat());
        for step in 1..=2 {
            let grads = replica_grads(&layout8, &sizes, step);
            reference
                .tpu_step_in_place(&mut flat, &reference_reduced(&layout8, &grads))
                .unwrap();
        }
        let mut big = sharded(
            pod_named("v4-128"),
            "adam",
            &sizes,
            config(to, 1, 1024, RecoveryPolicy::Rollback),
        );
        big.restore_resharded(&snapshot).unwrap();
        assert_eq!(big.layout().unwrap().devices(), 64);
        assert_eq!(big.flat_params().unwrap(), flat.to_vec());
        let want = hbm_bytes_per_device(&residency(&big)).resident();
        assert_eq!(hbm_now(&big), vec![want; 64]);
        let layout = big.layout().unwrap().clone();
        let grads = replica_grads(&layout, &sizes, 3);
        reference
            .tpu_step_in_place(&mut flat, &reference_reduced(&layout, &grads))
            .unwrap();
        checked_step(&mut big, &grads);
        assert_eq!(big.flat_params().unwrap(), flat.to_vec(), "{to}");
    }
}

/// Every file under `root` with its bytes.
fn files(root: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push((path.clone(), std::fs::read(&path).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_restore_that_does_not_fit_the_strategy_changes_nothing() {
    let sizes = [4000usize];
    // 8 devices, 2048-byte buckets (8 of 512 elements, the last 416): fsdp
    // holds 3 × 2048 bytes per device between steps and 4 × 2048 more in a
    // step; replicated holds 16000 + 2 × 2048.
    let fsdp = hbm_bytes_per_device(&ResidencyInput {
        strategy: Strategy::Fsdp,
        elements: 4000,
        shard_elements: 500,
        bucket_elements: 512,
        buckets: 8,
        elem_bytes: 4,
        slots: 2,
        prefetch: 1,
        redundant: false,
    });
    assert_eq!(fsdp.total, 7 * 2048);
    let hbm = fsdp.total + 1024;
    let small_hbm = ShardingConfig {
        hbm_bytes: Some(hbm),
        ..config(Strategy::Fsdp, 1, 2048, RecoveryPolicy::Rollback)
    };
    let dir = tempfile::tempdir().unwrap();
    let mut writer = sharded(pod_named("v4-16"), "adam", &sizes, small_hbm);
    writer
        .enable_step_checkpoints(1, dir.path().to_path_buf(), 2)
        .unwrap();
    run_steps(&mut writer, &sizes, 1, 1);
    assert!(writer.checkpoint_if_due().unwrap().is_some());
    let snapshot = writer.snapshot().unwrap();
    let stored = files(dir.path());
    // Replicated does not fit that HBM: building it so is refused.
    let err = ShardedOptimizer::on_pod(
        optirs_tpu::optimizers::by_name("adam", 0.05f32).unwrap(),
        pod_named("v4-16"),
        model(&sizes),
        ShardingConfig {
            hbm_bytes: Some(hbm),
            ..config(Strategy::Replicated, 1, 2048, RecoveryPolicy::Rollback)
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("device 0"), "{err}");
    // A replicated optimizer (full HBM) restoring the small-HBM pod, from
    // memory or from disk: refused, its world and the checkpoints as before.
    let mut reader = sharded(
        pod_named("v4-16"),
        "adam",
        &sizes,
        config(Strategy::Replicated, 1, 2048, RecoveryPolicy::Rollback),
    );
    run_steps(&mut reader, &sizes, 1, 2);
    let before = reader.pod_mut().world_sha256().unwrap();
    let before_bits = bits(&mut reader);
    let err = reader.restore(&snapshot).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("device 0") && text.contains("the model's parameters needs 16000 bytes"),
        "{text}"
    );
    assert_eq!(reader.pod_mut().world_sha256().unwrap(), before);
    let before = reader.pod_mut().world_sha256().unwrap();
    let err = reader.resume(dir.path()).unwrap_err();
    assert!(err.to_string().contains("16000 bytes"), "{err}");
    assert_eq!(reader.pod_mut().world_sha256().unwrap(), before);
    assert_eq!(bits(&mut reader), before_bits);
    assert_eq!(files(dir.path()), stored, "the checkpoints are untouched");
    // It goes on as it was.
    run_steps(&mut reader, &sizes, 3, 3);
}

#[test]
fn a_mesh_the_real_run_does_not_build_is_refused_before_any_work() {
    // The redundant copies with a data axis that replicates the state.
    let pod = pod_named("v4-128");
    let sizes = Mesh::parse("data=4,fsdp=16", pod.topology())
        .unwrap()
        .sizes();
    let err = ShardedOptimizer::on_pod(
        optirs_tpu::optimizers::by_name("adam", 0.05f32).unwrap(),
        pod,
        model(&[100]),
        ShardingConfig {
            mesh: Some(sizes),
            ..config(Strategy::Zero2, 1, 1024, RecoveryPolicy::Redundant)
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            err.downcast_ref::<ShardingError>(),
            Some(ShardingError::MeshNotBuilt { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("data=4,fsdp=16,tensor=1"), "{err}");
    // A mesh that does not tile the pod: the mesh's own error.
    let err = ShardedOptimizer::on_pod(
        optirs_tpu::optimizers::by_name("adam", 0.05f32).unwrap(),
        pod_named("v4-128"),
        model(&[100]),
        ShardingConfig {
            mesh: Some(MeshSizes::new(3, 21, 1)),
            ..ShardingConfig::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            err.downcast_ref::<ShardingError>(),
            Some(ShardingError::Mesh(_))
        ),
        "{err}"
    );
}

#[test]
fn a_replicated_snapshot_is_the_format_before_strategies() {
    // The model column of a replicated world holds no strategy (so older
    // snapshots, which hold none, load as replicated), and an fsdp world's
    // does and loads back as fsdp.
    for strategy in Strategy::ALL {
        let mut opt = sharded(
            pod_named("v4-16"),
            "adam",
            &[100],
            config(strategy, 3, 1024, RecoveryPolicy::Rollback),
        );
        let snapshot = opt.snapshot().unwrap();
        let column = snapshot
            .components
            .iter()
            .find(|c| c.name == "sharding.ShardedModel")
            .unwrap();
        let mut fresh = sharded(
            pod_named("v4-16"),
            "adam",
            &[100],
            config(strategy, 3, 1024, RecoveryPolicy::Rollback),
        );
        fresh.restore(&snapshot).unwrap();
        let model = optirs_tpu::sharding::model_of(fresh.pod().world()).unwrap();
        assert_eq!((model.strategy, model.prefetch), (strategy, 3));
        if strategy == Strategy::Replicated {
            // prefetch 3 is not the default: the strategy fields are there.
            assert!(column.bytes.ends_with(&[0, 3]), "{:?}", column.bytes);
        }
    }
    // The default (replicated, prefetch 1) writes the fields of before:
    // the same model with prefetch 3 is two bytes longer.
    let column = |prefetch: usize| {
        let mut opt = sharded(
            pod_named("v4-16"),
            "adam",
            &[100],
            config(
                Strategy::Replicated,
                prefetch,
                1024,
                RecoveryPolicy::Rollback,
            ),
        );
        let snapshot = opt.snapshot().unwrap();
        snapshot
            .components
            .iter()
            .find(|c| c.name == "sharding.ShardedModel")
            .unwrap()
            .bytes
            .clone()
    };
    let (default, extended) = (column(1), column(3));
    assert_eq!(default.len() + 2, extended.len());
    assert_eq!(default[..], extended[..default.len()]);
    let mut opt = sharded(
        pod_named("v4-16"),
        "adam",
        &[100],
        config(Strategy::Replicated, 1, 1024, RecoveryPolicy::Rollback),
    );
    let snapshot = opt.snapshot().unwrap();
    let registry = opt
        .pod()
        .world()
        .resource::<optirs_tpu::persist::SnapshotRegistry>();
    let stored = registry
        .decode_component::<optirs_tpu::sharding::ShardedModel>(&snapshot, "sharding.ShardedModel")
        .unwrap();
    assert_eq!(stored[0].1.strategy(), Strategy::Replicated);
    assert_eq!(stored[0].1.prefetch(), 1);
}

#[path = "common/ranks.rs"]
mod ranks_common;

#[test]
fn the_sharded_strategies_are_refused_over_ranks() {
    let topology = optirs_tpu::topology::load_preset("v4-16").unwrap();
    let results = ranks_common::on_ranks(2, |mailbox| {
        let mut pod = optirs_tpu::pod::ranks::RankedPod::new(topology.clone(), mailbox)?;
        pod.handshake("strategies")?;
        ShardedOptimizer::on_ranked_pod(
            optirs_tpu::optimizers::by_name("adam", 0.05f32).unwrap(),
            pod,
            model(&[100]),
            config(Strategy::Fsdp, 1, 1024, RecoveryPolicy::Rollback),
        )
        .map(|_| ())
    });
    for r in results {
        let err = r.unwrap_err();
        assert!(
            err.to_string()
                .contains("the fsdp strategy on a pod split over ranks (v4-16) runs modeled only"),
            "{err}"
        );
    }
}

#[test]
fn a_step_whose_buffers_do_not_fit_names_the_buffer_and_changes_nothing() {
    // 8 buckets of 512 elements over 8 devices: fsdp holds 3 × 2048 bytes
    // between steps; a step adds the gradient shards, the bucket in flight
    // and two gathered buckets (2048 bytes each). Room for all but the
    // second gathered bucket:
    let sizes = [4000usize];
    let hbm = 3 * 2048 + 3 * 2048 + 1024;
    let mut opt = sharded(
        pod_named("v4-16"),
        "adam",
        &sizes,
        ShardingConfig {
            hbm_bytes: Some(hbm),
            ..config(Strategy::Fsdp, 1, 2048, RecoveryPolicy::Rollback)
        },
    );
    let before = bits(&mut opt);
    let resident = hbm_now(&opt);
    let layout = opt.layout().unwrap().clone();
    let err = opt
        .step_replicas(&replica_grads(&layout, &sizes, 1))
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("device 0")
            && text.contains("step 1's gathered parameter bucket needs 2048 bytes"),
        "{text}"
    );
    assert_eq!(bits(&mut opt), before);
    assert_eq!(opt.step_count(), 0);
    assert_eq!(hbm_now(&opt), resident, "the buffers reserved went back");
    // With prefetch 0 one gathered bucket is enough: the same HBM runs.
    let mut lean = sharded(
        pod_named("v4-16"),
        "adam",
        &sizes,
        ShardingConfig {
            hbm_bytes: Some(hbm),
            ..config(Strategy::Fsdp, 0, 2048, RecoveryPolicy::Rollback)
        },
    );
    checked_step(&mut lean, &replica_grads(&layout, &sizes, 1));
}
