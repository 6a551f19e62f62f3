//! One error of every domain, produced the way a user meets it and
//! returned as [`OptimError`]: its message is the domain's, the domain error
//! comes back with `downcast_ref`, and walking `source()` reaches the
//! original cause (the file and field, the device, the node, the I/O or
//! parser error) rather than a string that flattened it.

use std::error::Error;
use std::path::Path;

use bevy_ecs::prelude::*;
use ndarray::Array1;
use optirs_tpu::barrier::BarrierError;
use optirs_tpu::checkpoint::{CheckpointError, WORLD_FILE, verify_checkpoint, write_checkpoint};
use optirs_tpu::collectives::{CollectiveError, TorusShape};
use optirs_tpu::compiler::{ArgumentCount, CompileError, InferenceError};
use optirs_tpu::error::{ErrorKind, OptimError};
use optirs_tpu::exec::runtime::{ExecError, NoCustomCalls, Runtime};
use optirs_tpu::goodput::{Fleet, GoodputConfig, GoodputError};
use optirs_tpu::health::FaultError;
use optirs_tpu::ir::KernelError;
use optirs_tpu::memory::MemoryError;
use optirs_tpu::optimizers::{Adam, OptimizerError, SGD};
use optirs_tpu::persist::{SnapshotError, WorldSnapshot};
use optirs_tpu::schedule::ScheduleError;
use optirs_tpu::schedule::StepSystems;
use optirs_tpu::sharding::{ParamSet, ShardingError};
use optirs_tpu::topology::TopologyError;
use optirs_tpu::transport::TransportError;
use optirs_tpu::{Pod, TPUConfig, TPUOptimizer};
use sha2::Digest;

/// The error and every source below it, outermost first.
fn chain(error: &OptimError) -> Vec<&(dyn Error + 'static)> {
    let mut links: Vec<&(dyn Error + 'static)> = vec![error];
    let mut link: &(dyn Error + 'static) = error;
    while let Some(next) = link.source() {
        links.push(next);
        link = next;
    }
    links
}

/// The messages of the chain, outermost first.
fn messages(error: &OptimError) -> Vec<String> {
    chain(error).iter().map(|e| e.to_string()).collect()
}

/// Whether some link of the chain is an `E`.
fn has<E: Error + 'static>(error: &OptimError) -> bool {
    chain(error).iter().any(|e| e.is::<E>())
}

/// The checks every domain's error passes: its kind, the domain error
/// by downcast and as the first source, and a chain that ends.
fn check_domain<E: Error + 'static>(error: &OptimError, kind: ErrorKind) -> &E {
    assert_eq!(error.kind(), kind, "{error}");
    let links = chain(error);
    assert!(
        links.len() >= 2,
        "the domain error is the source: {error:?}"
    );
    assert!(links[1].is::<E>(), "the first source is the domain error");
    assert_eq!(links[1].to_string(), error.to_string());
    error.downcast_ref::<E>().expect("the domain error")
}

fn pod() -> Pod {
    Pod::from_preset("v4-16").unwrap()
}

#[test]
fn topology_a_bad_pod_file_names_the_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.ron");
    std::fs::write(
        &path,
        "Pod(\n    name: \"bad\",\n    generation: \"v7\",\n    shape: \"4x4\",\n)\n",
    )
    .unwrap();
    let error = Pod::load(path.to_str().unwrap()).unwrap_err();
    let domain = check_domain::<TopologyError>(&error, ErrorKind::Topology);
    let TopologyError::Invalid { field, .. } = domain else {
        panic!("expected a semantic error, got {domain:?}");
    };
    assert_eq!(field, "generation");
    let text = messages(&error).join(" | ");
    assert!(text.contains("bad.ron"), "{text}");
    assert!(text.contains(":3"), "names the line: {text}");
    assert!(text.contains("generation"), "{text}");
}

#[test]
fn memory_out_of_hbm_names_the_device() {
    let config = TPUConfig {
        hbm_bytes: Some(64 * 1024),
        ..Default::default()
    };
    let mut opt = TPUOptimizer::new(Adam::new(0.01f32), config).unwrap();
    let p = Array1::from_elem(100_000, 0.5f32);
    let error = opt.tpu_step(&p, &p).unwrap_err();
    let domain = check_domain::<MemoryError>(&error, ErrorKind::Memory);
    assert!(
        matches!(domain, MemoryError::OutOfDeviceMemory(_)),
        "{domain}"
    );
    assert!(
        messages(&error).last().unwrap().contains("device 0"),
        "{error}"
    );
}

#[test]
fn transport_a_message_to_a_device_outside_the_pod_names_it() {
    let error = pod().send_data(0, 999, 8).unwrap_err();
    let domain = check_domain::<TransportError>(&error, ErrorKind::Transport);
    assert!(matches!(domain, TransportError::UnknownDevice(d) if d.0 == 999));
    assert!(messages(&error).last().unwrap().contains("999"), "{error}");
}

#[test]
fn fault_killing_a_device_outside_the_pod_names_it() {
    let error = pod().kill_device(999).unwrap_err();
    let domain = check_domain::<FaultError>(&error, ErrorKind::Fault);
    assert!(matches!(domain, FaultError::UnknownDevice(d) if d.0 == 999));
    assert!(messages(&error).last().unwrap().contains("999"), "{error}");
}

#[test]
fn barrier_an_arrival_at_no_barrier_names_the_id() {
    let error = pod().arrive(12_345, 0).unwrap_err();
    check_domain::<BarrierError>(&error, ErrorKind::Barrier);
    assert!(
        messages(&error).last().unwrap().contains("12345"),
        "{error}"
    );
}

#[test]
fn collectives_a_torus_without_dimensions_is_refused() {
    let error: OptimError = TorusShape::new(&[], &[]).unwrap_err().into();
    check_domain::<CollectiveError>(&error, ErrorKind::Collective);
}

#[test]
fn optimizers_params_and_grads_of_different_shapes_name_both() {
    let mut sgd = SGD::new(0.1f32);
    let error = sgd.step(&Array1::zeros(3), &Array1::zeros(2)).unwrap_err();
    let domain = check_domain::<OptimizerError>(&error, ErrorKind::Optimizer);
    assert!(matches!(domain, OptimizerError::ShapeMismatch { .. }));
}

fn program_file(dir: &Path, nodes: &str, outputs: &str) -> std::path::PathBuf {
    let path = dir.join("bad_program.ron");
    std::fs::write(
        &path,
        format!(
            "(\n    name: \"bad\",\n    nodes: [\n{nodes}    ],\n    outputs: [{outputs}],\n)\n"
        ),
    )
    .unwrap();
    path
}

#[test]
fn compiler_a_dtype_mismatch_reaches_the_inference_error_through_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = program_file(
        dir.path(),
        "        (name: \"x\", op: \"parameter\", ty: \"f32[4]\"),\n        \
         (name: \"n\", op: \"parameter\", ty: \"i32[4]\"),\n        \
         (name: \"sum\", op: \"add\", operands: [\"x\", \"n\"]),\n",
        "\"sum\"",
    );
    let error = pod().compile_program_file(&path).unwrap_err();
    let domain = check_domain::<CompileError>(&error, ErrorKind::Compile);
    assert!(matches!(domain, CompileError::InFile { .. }), "{domain:?}");
    let text = error.to_string();
    assert!(
        text.contains("bad_program.ron") && text.contains("%sum"),
        "{text}"
    );
    let inference = chain(&error)
        .into_iter()
        .find_map(|e| e.downcast_ref::<InferenceError>())
        .expect("the inference error is in the chain");
    assert!(matches!(inference, InferenceError::DTypesDiffer { .. }));
    assert_eq!(
        messages(&error).last().unwrap(),
        "operand dtypes differ: f32[4] and i32[4]"
    );
}

#[test]
fn compiler_a_constant_with_too_few_values_reaches_the_kernel_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = program_file(
        dir.path(),
        "        (name: \"c\", op: \"constant\", ty: \"f32[4]\", value: [1.0, 2.0]),\n",
        "\"c\"",
    );
    let error = pod().compile_program_file(&path).unwrap_err();
    check_domain::<CompileError>(&error, ErrorKind::Compile);
    assert!(has::<KernelError>(&error), "{:?}", messages(&error));
    assert_eq!(
        messages(&error).last().unwrap(),
        "f32[4] needs 4 values (or one to splat), got 2"
    );
}

#[test]
fn compiler_an_executable_given_too_few_arguments_names_the_program() {
    let report = optirs_tpu::xla::compile_program_str(
        "one",
        "(name: \"one\", nodes: [(name: \"x\", op: \"parameter\", ty: \"f32[2]\")], \
         outputs: [\"x\"])",
    )
    .unwrap();
    let error: OptimError = report.executable.run(&[]).unwrap_err().into();
    check_domain::<CompileError>(&error, ErrorKind::Compile);
    let count = chain(&error)
        .into_iter()
        .find_map(|e| e.downcast_ref::<ArgumentCount>())
        .expect("the argument count is in the chain");
    assert_eq!((count.expected, count.got), (1, 0));
}

#[test]
fn exec_a_run_with_too_few_arguments_reaches_the_argument_count() {
    let report = optirs_tpu::xla::compile_program_str(
        "one",
        "(name: \"one\", nodes: [(name: \"x\", op: \"parameter\", ty: \"f32[2]\")], \
         outputs: [\"x\"])",
    )
    .unwrap();
    let error: OptimError = Runtime::new(report.executable.clone())
        .run_tensors(&[], &mut NoCustomCalls)
        .unwrap_err()
        .into();
    check_domain::<ExecError>(&error, ErrorKind::Exec);
    assert!(has::<ArgumentCount>(&error), "{:?}", messages(&error));
}

#[test]
fn snapshot_bytes_that_are_not_a_snapshot_are_refused() {
    let error: OptimError = WorldSnapshot::from_bytes(b"not a snapshot")
        .unwrap_err()
        .into();
    check_domain::<SnapshotError>(&error, ErrorKind::Snapshot);
    assert!(error.to_string().contains("<world>"), "{error}");
}

#[test]
fn snapshot_bytes_that_are_not_a_snapshot_reach_the_decoder_error() {
    let error: OptimError = WorldSnapshot::from_bytes(b"not a snapshot")
        .unwrap_err()
        .into();
    check_domain::<SnapshotError>(&error, ErrorKind::Snapshot);
    assert!(chain(&error).len() >= 3, "{:?}", messages(&error));
}

/// A checkpoint of a v4-16 pod at tick 3 under `root`, and its directory.
fn saved_checkpoint(root: &Path) -> std::path::PathBuf {
    let mut pod = pod();
    pod.run(3);
    let snapshot = pod.snapshot().unwrap();
    write_checkpoint(root, "ckpt", "v4-16", &snapshot, &mut |_| Ok(())).unwrap();
    root.join("ckpt")
}

#[test]
fn checkpoint_a_corrupt_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = saved_checkpoint(dir.path());
    let world = ckpt.join(WORLD_FILE);
    let mut bytes = std::fs::read(&world).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&world, bytes).unwrap();
    let registry = optirs_tpu::checkpoint::engine_registry();
    let error: OptimError = verify_checkpoint(&ckpt, &registry).unwrap_err().into();
    let domain = check_domain::<CheckpointError>(&error, ErrorKind::Checkpoint);
    assert!(matches!(domain, CheckpointError::Digest { .. }), "{domain}");
    assert!(error.to_string().contains(WORLD_FILE), "{error}");
}

#[test]
fn checkpoint_a_corrupt_manifest_reaches_the_parser_error() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = saved_checkpoint(dir.path());
    // A manifest edited by hand: its digest line matches, its RON does not parse.
    let body = "(not a manifest\n";
    let digest: String = sha2::Sha256::digest(body.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    std::fs::write(
        ckpt.join(optirs_tpu::checkpoint::MANIFEST),
        format!("{body}// manifest-sha256: {digest}\n"),
    )
    .unwrap();
    let registry = optirs_tpu::checkpoint::engine_registry();
    let error: OptimError = verify_checkpoint(&ckpt, &registry).unwrap_err().into();
    check_domain::<CheckpointError>(&error, ErrorKind::Checkpoint);
    assert!(chain(&error).len() >= 3, "{:?}", messages(&error));
}

#[test]
fn sharding_a_tensor_without_elements_is_named() {
    let error: OptimError = ParamSet::<f32>::zeros(&[("w", &[0])]).unwrap_err().into();
    let domain = check_domain::<ShardingError>(&error, ErrorKind::Sharding);
    assert!(matches!(domain, ShardingError::EmptyTensor { name, .. } if name == "w"));
}

#[test]
fn goodput_a_model_without_parameters_is_refused() {
    let topology = optirs_tpu::topology::load_preset("v4-16").unwrap();
    let fleet = Fleet::from_topology(&topology).unwrap();
    let config = GoodputConfig::new(0, 1000.0, 1.0, 1.0);
    let error: OptimError = config.check(&fleet).unwrap_err().into();
    let domain = check_domain::<GoodputError>(&error, ErrorKind::Goodput);
    assert!(matches!(domain, GoodputError::NoParameters));
    assert!(error.to_string().contains("--model-params"), "{error}");
}

#[derive(Resource, Default)]
struct Count(u64);

fn bump(mut count: ResMut<Count>) {
    count.0 += 1;
}

fn reset(mut count: ResMut<Count>) {
    count.0 = 0;
}

#[test]
fn schedule_an_ambiguous_system_pair_is_named() {
    let mut pod = pod();
    pod.world_mut().init_resource::<Count>();
    pod.add_systems(bump.in_set(StepSystems::Monitor)).unwrap();
    let error = pod
        .add_systems(reset.in_set(StepSystems::Monitor))
        .unwrap_err();
    check_domain::<ScheduleError>(&error, ErrorKind::Schedule);
    let text = error.to_string();
    assert!(text.contains("bump") && text.contains("reset"), "{text}");
}

#[test]
fn schedule_an_ambiguous_system_pair_reaches_bevys_error() {
    let mut pod = pod();
    pod.world_mut().init_resource::<Count>();
    pod.add_systems(bump.in_set(StepSystems::Monitor)).unwrap();
    let error = pod
        .add_systems(reset.in_set(StepSystems::Monitor))
        .unwrap_err();
    check_domain::<ScheduleError>(&error, ErrorKind::Schedule);
    assert!(chain(&error).len() >= 3, "{:?}", messages(&error));
}
