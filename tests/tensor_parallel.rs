//! Tensor parallelism in a transformer's modeled step
//! (`optirs_tpu::step_model::tensor`): the activations' gathers and
//! reduce-scatters against the ring's closed form, the weights split `t`
//! ways, the collectives hidden behind the matmuls or exposed when they
//! are longer, and the refusals.

use optirs_tpu::model::{ModelConfig, bundled};
use optirs_tpu::sharding::{Mesh, MeshAxisName, MeshSizes};
use optirs_tpu::step_model::{ModelStepOptions, StepModelError, model_step};
use optirs_tpu::topology::{Topology, load_preset, parse_topology};

fn v5e_256() -> Topology {
    load_preset("v5e-256").unwrap()
}

fn mesh(topology: &Topology, data: usize, fsdp: usize, tensor: usize) -> Mesh {
    MeshSizes::new(data, fsdp, tensor)
        .lay_out_split(topology)
        .unwrap()
}

fn options(topology: &Topology, mesh: Mesh) -> ModelStepOptions {
    ModelStepOptions {
        mesh,
        ..ModelStepOptions::new(topology)
    }
}

#[test]
fn a_layers_gather_is_the_bidirectional_rings_closed_form() {
    // v5e-256 is 16x16 with wraparound: tensor=16 is one ring of 16.
    let topology = v5e_256();
    let config = bundled("maxtext-v5e-128b").unwrap();
    let m = mesh(&topology, 1, 16, 16);
    assert_eq!(m.torus_axes(MeshAxisName::Tensor).len(), 1);
    let tp = optirs_tpu::step_model::tensor::tensor_parallel(&config, &topology, &m, 1.0)
        .unwrap()
        .unwrap();
    // [t · T, embed] bf16 gathered: each device receives (t−1)/t of it, half
    // each way round the ring, one hop of latency per step.
    let t = 16.0;
    let bytes = t * config.tokens_per_device() * config.embed as f64 * 2.0;
    let beta = topology.ici.bytes_per_s;
    let alpha = topology.ici.latency_ns as f64 * 1e-9;
    let closed = (t - 1.0) / t * bytes / (2.0 * beta);
    let latency_bound = (t - 1.0) * alpha;
    assert!(
        tp.gather.seconds >= closed && tp.gather.seconds <= closed + latency_bound + 1e-12,
        "gather {} s, closed form {closed} s + at most {latency_bound} s latency",
        tp.gather.seconds
    );
    let error = (tp.gather.seconds - closed) / closed;
    println!(
        "tensor=16 gather: {} s, closed form {closed} s, {:+.4}%",
        tp.gather.seconds,
        error * 100.0
    );
    assert!(error < 0.01, "{error}");
    // A reduce-scatter moves as much.
    assert!((tp.scatter.seconds - tp.gather.seconds).abs() <= 1e-12 * tp.gather.seconds);
    // MaxText's default block: one gather and one scatter a pass; full
    // remat reruns the forward's in the backward.
    assert_eq!(tp.per_pass, 1);
    let pass = tp.gather.seconds + tp.scatter.seconds;
    assert!((tp.forward_seconds - pass).abs() <= 1e-15);
    assert!((tp.backward_seconds - 2.0 * pass).abs() <= 1e-15);
    // A sequential block (llama2) has two of each.
    let llama = bundled("llama2-7b").unwrap();
    let tp = optirs_tpu::step_model::tensor::tensor_parallel(&llama, &topology, &m, 0.0)
        .unwrap()
        .unwrap();
    assert_eq!(tp.per_pass, 2);
}

#[test]
fn tensor_parallelism_splits_the_weights_and_shrinks_the_fsdp_gathers() {
    let topology = v5e_256();
    let config = bundled("maxtext-v5e-128b").unwrap();
    let flat = model_step(
        &config,
        &topology,
        &options(&topology, mesh(&topology, 1, 256, 1)),
    )
    .unwrap();
    let split = model_step(
        &config,
        &topology,
        &options(&topology, mesh(&topology, 1, 16, 16)),
    )
    .unwrap();
    // The same compute per device: the model FLOPs are the model's.
    assert_eq!(flat.model_flops_per_device, split.model_flops_per_device);
    assert_eq!(flat.layer.forward.flops, split.layer.forward.flops);
    // Each device reads 1/16 of a layer's weights.
    assert!(split.layer.forward.bytes < flat.layer.forward.bytes);
    // fsdp over 16 devices of 1/16 of each layer, not over 256 of all of it:
    // the gathered layer in flight is 1/16 as large.
    assert!(
        split.hbm.gathered * 15 < flat.hbm.gathered && split.hbm.gathered * 17 > flat.hbm.gathered,
        "{} vs {}",
        split.hbm.gathered,
        flat.hbm.gathered
    );
    // The parameter shards are the same size either way (256 devices).
    let ratio = split.hbm.params as f64 / flat.hbm.params as f64;
    assert!((ratio - 1.0).abs() < 0.01, "{ratio}");
    // The tensor collectives are in the phases and hide behind the matmuls.
    assert!(split.phases["all_gather.tensor"] > 0.5);
    assert_eq!(split.phases["exposed_tensor_parallel"], 0.0);
    assert!(split.layer.forward.tensor_seconds < split.layer.forward.seconds);
    assert!(!flat.phases.contains_key("all_gather.tensor"));
}

#[test]
fn collectives_longer_than_the_matmuls_are_exposed() {
    // A layer whose weights are small beside its activations (embed 4096,
    // heads × head_dim 2048, MLP 4096): its matmuls per token are shorter
    // than moving the token's activations 15 times over a 16-device ring.
    let topology = v5e_256();
    let config = ModelConfig {
        embed: 4096,
        heads: 16,
        kv_heads: 16,
        head_dim: 128,
        mlp_dim: 4096,
        ..bundled("maxtext-v5e-16b").unwrap()
    };
    let step = model_step(
        &config,
        &topology,
        &options(&topology, mesh(&topology, 1, 16, 16)),
    )
    .unwrap();
    let f = step.layer.forward;
    assert!(f.tensor_seconds > f.seconds, "{f:?}");
    assert_eq!(f.elapsed(), f.tensor_seconds);
    let layers = config.layers as f64;
    let exposed =
        (f.exposed_tensor_seconds() + step.layer.backward.exposed_tensor_seconds()) * layers;
    assert!((step.phases["exposed_tensor_parallel"] - exposed).abs() <= 1e-12 * exposed);
    assert!(step.exposed_communication >= exposed - 1e-12);
    // compute + exposed communication is the step.
    let sum = step.compute_seconds + step.exposed_communication;
    assert!(
        (sum - step.step_seconds).abs() <= 1e-9 * step.step_seconds,
        "{sum} vs {}",
        step.step_seconds
    );
}

#[test]
fn a_dimension_the_tensor_axis_does_not_divide_is_refused_naming_it() {
    let topology = v5e_256();
    let config = ModelConfig {
        heads: 24,
        kv_heads: 24,
        ..bundled("maxtext-v5e-16b").unwrap()
    };
    let err = model_step(
        &config,
        &topology,
        &options(&topology, mesh(&topology, 1, 16, 16)),
    )
    .unwrap_err();
    assert!(
        matches!(err, StepModelError::Field { field: "heads", .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("24 is not a multiple of 16"),
        "{err}"
    );
    // llama2-70b's 8 KV heads do not split 16 ways.
    let err = model_step(
        &bundled("llama2-70b").unwrap(),
        &topology,
        &options(&topology, mesh(&topology, 1, 16, 16)),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            StepModelError::Field {
                field: "kv_heads",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_tensor_axis_across_the_slices_is_refused() {
    let two = parse_topology(
        "Pod(name: \"2xv5e-16\", generation: \"v5e\", shape: \"4x4\", slices: 2)",
        "test",
    )
    .unwrap();
    let m = mesh(&two, 1, 16, 2);
    assert!(m.crosses_slices(MeshAxisName::Tensor), "{m}");
    let err = model_step(&bundled("llama2-7b").unwrap(), &two, &options(&two, m)).unwrap_err();
    assert!(
        matches!(err, StepModelError::Field { field: "mesh", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("DCN"), "{err}");
}

#[test]
fn flat_tensors_still_refuse_a_tensor_axis() {
    let topology = v5e_256();
    let e = Mesh::parse("fsdp=16,tensor=16", &topology).unwrap_err();
    assert!(
        e.to_string().contains("declares how its tensors split"),
        "{e}"
    );
    let m = Mesh::parse_split("fsdp=16,tensor=16", &topology).unwrap();
    assert_eq!(m.to_string(), "data=1,fsdp=16,tensor=16");
    assert_eq!(m.devices_per_tensor_shard(), 16);
}

mod properties {
    use super::*;
    use optirs_tpu::cost_model::DataReduction;
    use proptest::prelude::*;

    const MODELS: [&str; 4] = [
        "maxtext-v5e-16b",
        "maxtext-v5e-128b",
        "maxtext-v5p-32b",
        "llama2-7b",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// On any mesh a model's step lays out on (one or two v5e-256
        /// slices, tensor 1 or 16, fsdp the rest): the per-device FLOPs do
        /// not depend on the split, compute plus exposed communication is
        /// the step, and the all-reduce after the backward never makes a
        /// step shorter than overlapping it.
        #[test]
        fn a_split_keeps_the_work_and_the_step_adds_up(
            model in 0usize..MODELS.len(),
            slices in 1u32..=2,
            tensor in prop::sample::select(vec![1usize, 16]),
            batch in prop::sample::select(vec![1.0f64, 2.0, 4.0]),
        ) {
            let config = ModelConfig { per_device_batch: batch, ..bundled(MODELS[model]).unwrap() };
            let pod = if slices == 1 {
                v5e_256()
            } else {
                parse_topology(
                    "Pod(name: \"2xv5e-256\", generation: \"v5e\", shape: \"16x16\", slices: 2)",
                    "test",
                )
                .unwrap()
            };
            let m = mesh(&pod, slices as usize, 256 / tensor, tensor);
            let step = |when| {
                let o = ModelStepOptions { data_reduction: when, ..options(&pod, m.clone()) };
                model_step(&config, &pod, &o)
            };
            let flat = model_step(&config, &pod, &options(&pod, mesh(&pod, slices as usize, 256, 1))).unwrap();
            match step(DataReduction::AfterBackward) {
                Err(StepModelError::Field { field, .. }) => {
                    // Only a dimension 16 does not divide is refused.
                    prop_assert!(tensor == 16 && ["heads", "kv_heads", "mlp_dim"].contains(&field));
                }
                Err(e) => prop_assert!(false, "{e}"),
                Ok(after) => {
                    let overlapped = step(DataReduction::Overlapped).unwrap();
                    prop_assert_eq!(after.model_flops_per_device, flat.model_flops_per_device);
                    prop_assert_eq!(after.layer.forward.flops, flat.layer.forward.flops);
                    prop_assert!(after.step_seconds >= overlapped.step_seconds - 1e-12);
                    for s in [&after, &overlapped] {
                        let sum = s.compute_seconds + s.exposed_communication;
                        prop_assert!((sum - s.step_seconds).abs() <= 1e-9 * s.step_seconds);
                    }
                    if slices == 1 {
                        prop_assert_eq!(after.step_seconds, overlapped.step_seconds);
                    }
                }
            }
        }
    }
}
