//! Whole-world snapshots: coverage, byte-identical round trips, determinism
//! after restore, and rejection of corrupt snapshots.

use bevy_ecs::entity::Entity;
use optirs_tpu::Pod;
use optirs_tpu::barrier::BarrierSpec;
use optirs_tpu::checkpoint::{NOT_PERSISTED, SnapshotRegistry, WorldSnapshot};
use optirs_tpu::clock::SimDuration;
use optirs_tpu::exec::kernels::Tensor;
use optirs_tpu::health::Fault;
use optirs_tpu::schedule::Compile;
use optirs_tpu::topology::DeviceId;
use optirs_tpu::xla::graph::Program;
use optirs_tpu::xla::passes::CompileFailure;
use optirs_tpu::xla::passes::lower::CompiledExecutable;
use optirs_tpu::xla::{self, CompareDir, DType, GraphBuilder, TensorType};
use proptest::prelude::*;

/// `f32[24,40]`: above the inline threshold, so it goes to the tensor file.
const BIG: [usize; 2] = [24, 40];

/// `select(mask, x * w, x) + 0.5` with a large f32 weight and a large pred
/// mask as constants (both in the tensor file), compiled in the pod's world.
fn compile_tensor_program(pod: &mut Pod) -> Entity {
    let ty = TensorType::new(DType::F32, BIG);
    let n = ty.element_count();
    let weights: Vec<f64> = (0..n).map(|i| (i as f64 * 0.37).sin()).collect();
    let mask: Vec<f64> = (0..n).map(|i| f64::from(i % 3 == 0)).collect();
    let mut b = GraphBuilder::new(pod.world_mut(), "tensors");
    let x = b.parameter(ty.clone());
    let w = b.constant(Tensor::from_f64s(&ty, &weights).unwrap());
    let m = b.constant(Tensor::from_f64s(&TensorType::new(DType::Pred, BIG), &mask).unwrap());
    let xw = b.mul(x, w);
    let picked = b.select(m, xw, x);
    let half = b.scalar(DType::F32, 0.5);
    let y = b.add(picked, half);
    let zero = b.scalar(DType::F32, 0.0);
    let positive = b.compare(CompareDir::Gt, y, zero);
    b.output(y);
    b.output(positive);
    let program = b.finish();
    pod.world_mut().run_schedule(Compile);
    program
}

/// Compiles the bundled Adam and MLP programs, the tensor program, and a
/// program that fails shape inference (its failure stays in the world).
fn compile_programs(pod: &mut Pod) {
    for name in ["adam", "mlp"] {
        pod.compile_program_file(format!("assets/programs/{name}.ron"))
            .unwrap();
    }
    compile_tensor_program(pod);
    let bad = r#"(
        name: "bad",
        nodes: [
            (name: "a", op: "parameter", ty: "f32[2]"),
            (name: "b", op: "parameter", ty: "f32[3]"),
            (name: "c", op: "add", operands: ["a", "b"]),
        ],
        outputs: ["c"],
    )"#;
    xla::load_program_str(pod.world_mut(), "bad", bad).unwrap();
    pod.world_mut().run_schedule(Compile);
}

/// The executable of the program called `name`.
fn executable(pod: &mut Pod, name: &str) -> std::sync::Arc<xla::Executable> {
    let world = pod.world_mut();
    let mut query = world.query::<(&Program, &CompiledExecutable)>();
    query
        .iter(world)
        .find(|(p, _)| p.name == name)
        .map(|(_, e)| e.0.clone())
        .unwrap_or_else(|| panic!("no compiled program `{name}`"))
}

/// A pod with every kind of engine entity and some history: failures,
/// barriers (pending and finished), messages in flight, cut links.
fn busy_pod() -> Pod {
    let mut pod = Pod::from_preset("v5e-16").unwrap();
    pod.inject(Fault::DeviceJitter(DeviceId(3), 2_000_000_000))
        .unwrap();
    pod.inject(Fault::LinkJitter(DeviceId(0), DeviceId(1), 5_000))
        .unwrap();
    pod.schedule_fault(SimDuration::from_secs(2), Fault::KillDevice(DeviceId(9)));
    pod.schedule_fault(SimDuration::from_secs(20), Fault::PauseDevice(DeviceId(4)));
    let done = pod
        .create_barrier(BarrierSpec::named("done").auto_arrive())
        .unwrap();
    pod.wait_for_barrier(done).unwrap();
    pod.run(1_300);
    pod.create_barrier(
        BarrierSpec::named("pending")
            .timeout(SimDuration::from_secs(60))
            .auto_arrive(),
    )
    .unwrap();
    pod.inject(Fault::CutLink(DeviceId(5), DeviceId(6)))
        .unwrap();
    pod.send_data(0, 10, 1 << 30).unwrap();
    pod.run(3);
    compile_programs(&mut pod);
    pod
}

#[test]
fn every_engine_type_is_in_the_snapshot() {
    let pod = busy_pod();
    let world = pod.world();
    let registry = world.resource::<SnapshotRegistry>();
    let mut missing = Vec::new();
    for (_, info) in world.components().iter_registered() {
        let name = info.name().to_string();
        if !name.starts_with("optirs_tpu::") {
            continue;
        }
        let short = name.rsplit("::").next().unwrap();
        let registered = info.type_id().is_some_and(|t| registry.contains_type(t));
        let excused = NOT_PERSISTED.iter().any(|(n, _)| *n == short);
        if !registered && !excused {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "not in the snapshot registry: {missing:?}"
    );
}

#[test]
fn capture_restore_capture_is_byte_identical() {
    let mut pod = busy_pod();
    let first = pod.snapshot().unwrap();
    pod.restore_snapshot(&first).unwrap();
    let second = pod.snapshot().unwrap();
    assert_eq!(first.to_bytes(), second.to_bytes());
    assert_eq!(first.sha256_hex(), second.sha256_hex());
    assert_eq!(first.tensors, second.tensors);
    assert!(
        first.tensors.len() >= 4,
        "literals and executable constants go to the tensor file: {:?}",
        first.tensors.iter().map(|t| &t.name).collect::<Vec<_>>()
    );
    // Through the bytes too.
    let decoded = WorldSnapshot::from_parts(&first.to_bytes(), first.tensors.clone()).unwrap();
    assert_eq!(decoded, first);
}

#[test]
fn world_sha256_covers_tensor_data() {
    let mut pod = busy_pod();
    let snapshot = pod.snapshot().unwrap();
    let mut changed = snapshot.clone();
    let t = &mut changed.tensors[0];
    let mut data = t.data.to_vec();
    data[0] ^= 1;
    t.data = data.into();
    assert_eq!(changed.to_bytes(), snapshot.to_bytes());
    assert_ne!(changed.sha256_hex(), snapshot.sha256_hex());
    // A tensor no column refers to, or a reference to a missing one, is an error.
    let mut extra = snapshot.clone();
    let mut stray = extra.tensors[0].clone();
    stray.name = "zz.stray/0.0".into();
    extra.tensors.push(stray);
    let error = pod.restore_snapshot(&extra).unwrap_err().to_string();
    assert!(error.contains("no column refers to it"), "{error}");
    let mut missing = snapshot.clone();
    missing.tensors.remove(0);
    let error = pod.restore_snapshot(&missing).unwrap_err().to_string();
    assert!(
        error.contains("which the snapshot does not hold"),
        "{error}"
    );
}

#[test]
fn a_restored_executable_gives_the_same_outputs() {
    let mut original = busy_pod();
    let snapshot = original.snapshot().unwrap();
    let mut restored = Pod::from_preset("v5e-16").unwrap();
    restored.restore_snapshot(&snapshot).unwrap();
    let ty = TensorType::new(DType::F32, BIG);
    let x: Vec<f64> = (0..ty.element_count())
        .map(|i| i as f64 / 7.0 - 50.0)
        .collect();
    let args = [Tensor::from_f64s(&ty, &x).unwrap()];
    let before = executable(&mut original, "tensors").run(&args).unwrap();
    let exe = executable(&mut restored, "tensors");
    assert_eq!(*exe, *executable(&mut original, "tensors"));
    let after = exe.run(&args).unwrap();
    assert_eq!(before.len(), 2);
    for (a, b) in before.iter().zip(&after) {
        assert!(a.bitwise_eq(b), "{a:?} != {b:?}");
    }
    // MLP: every parameter a ramp.
    let mlp = executable(&mut original, "mlp");
    let args: Vec<Tensor> = mlp
        .parameters
        .iter()
        .map(|ty| {
            let v: Vec<f64> = (0..ty.element_count())
                .map(|i| (i % 17) as f64 * 0.01)
                .collect();
            Tensor::from_f64s(ty, &v).unwrap()
        })
        .collect();
    let before = mlp.run(&args).unwrap();
    let after = executable(&mut restored, "mlp").run(&args).unwrap();
    assert!(before[0].bitwise_eq(&after[0]));
    // The failed program's error survives as its message.
    let world = restored.world_mut();
    let failures: Vec<String> = world
        .query::<&CompileFailure>()
        .iter(world)
        .map(|f| f.0.to_string())
        .collect();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(failures[0].contains("%c"), "{}", failures[0]);
    // The restored world compiles new programs in its Compile schedule.
    restored
        .compile_program_file("assets/programs/cse_fold.ron")
        .unwrap();
}

#[test]
fn a_restored_pod_steps_exactly_like_the_original() {
    let mut original = busy_pod();
    let snapshot = original.snapshot().unwrap();
    let mut restored = Pod::from_preset("v5e-16").unwrap();
    restored.run(17); // a different history, replaced wholesale
    restored.restore_snapshot(&snapshot).unwrap();
    assert_eq!(
        restored.world_sha256().unwrap(),
        original.world_sha256().unwrap()
    );
    original.run(2_500);
    restored.run(2_500);
    assert_eq!(
        restored.world_sha256().unwrap(),
        original.world_sha256().unwrap()
    );
    assert_eq!(original.failures(), restored.failures());
    assert_eq!(
        original.failures().len(),
        2,
        "device 9 killed, device 4 paused"
    );
}

#[test]
fn a_corrupt_snapshot_is_rejected_and_the_world_is_unchanged() {
    let mut pod = busy_pod();
    let good = pod.snapshot().unwrap();
    let before = pod.world_sha256().unwrap();
    let bytes = good.to_bytes();
    let mut rejected = 0;
    // Flip one bit in every 97th byte: each flip either fails to decode, fails
    // the checks, or (inside a value) decodes to a different world — which
    // the on-disk SHA-256 catches; here we require no flip to panic and every
    // rejected one to leave the world as it was.
    for at in (0..bytes.len()).step_by(97) {
        let mut bad = bytes.clone();
        bad[at] ^= 0x10;
        let Ok(snapshot) = WorldSnapshot::from_bytes(&bad) else {
            rejected += 1;
            continue;
        };
        if pod.restore_snapshot(&snapshot).is_err() {
            rejected += 1;
            assert_eq!(pod.world_sha256().unwrap(), before);
        } else {
            pod.restore_snapshot(&good).unwrap();
        }
    }
    assert!(rejected > 0);
    // Structural damage is always caught.
    let mut missing = good.clone();
    missing.components.remove(0);
    let error = pod.restore_snapshot(&missing).unwrap_err().to_string();
    assert!(error.contains("lacks the column"), "{error}");
    let mut dangling = good.clone();
    dangling.entity_count = 3;
    let error = pod.restore_snapshot(&dangling).unwrap_err().to_string();
    assert!(error.contains("dense entity"), "{error}");
    let mut future = good.clone();
    future.format_version = 99;
    assert!(pod.restore_snapshot(&future).is_err());
    assert_eq!(pod.world_sha256().unwrap(), before);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// Stepping a restored pod N ticks gives the same world bytes as stepping
    /// the original N ticks.
    #[test]
    fn restore_then_step_equals_step(
        preset in prop::sample::select(vec!["v4-16", "v5e-16", "assets/pods/examples/v2-4x2-custom.ron", "v4-128"]),
        before in 0u64..600,
        after in 0u64..600,
        kill in 0u32..8,
        kill_at_ms in 0u64..6_000,
        seed: u64,
    ) {
        let mut original = Pod::load(preset).unwrap();
        original.set_seed(seed);
        original.inject(Fault::DeviceJitter(DeviceId(kill), 3_000_000_000)).unwrap();
        original.schedule_fault(kill_at_ms * 1_000_000, Fault::KillDevice(DeviceId(kill)));
        original
            .create_barrier(BarrierSpec::named("b").auto_arrive()).unwrap();
        original.compile_program_file("assets/programs/mlp.ron").unwrap();
        original.run(before);
        let snapshot = original.snapshot().unwrap();
        let mut restored = Pod::load(preset).unwrap();
        restored.restore_snapshot(&snapshot).unwrap();
        prop_assert_eq!(restored.snapshot().unwrap().to_bytes(), snapshot.to_bytes());
        original.run(after);
        restored.run(after);
        prop_assert_eq!(restored.world_sha256().unwrap(), original.world_sha256().unwrap());
    }
}
