//! The mesh's `expert` axis in a transformer's modeled step
//! (`optirs_tpu::step_model::expert_parallel`): the experts split over it
//! and the rest of the model sharded over it as over fsdp (the bucket's
//! plan against its closed form), the two all-to-alls a layer a pass
//! against the ring's closed form, the shared experts' cover, the HBM, and
//! the refusals.

use optirs_tpu::collectives::{LinkModel, TorusShape, torus_all_to_all_seconds};
use optirs_tpu::model::{MixtureOfExperts, ModelConfig, bundled, parameter_count};
use optirs_tpu::sharding::strategy::{
    CollectiveKind, PlanStep, Purpose, bucket_plan, bucket_plan_with_experts,
};
use optirs_tpu::sharding::{Mesh, MeshAxisName, Strategy};
use optirs_tpu::step_model::{ModelStep, ModelStepOptions, StepModelError, model_step};
use optirs_tpu::topology::{Topology, parse_topology};
use proptest::prelude::*;

/// A v5p slice of 4x8x8 (256 chips): an 8-long torus axis takes expert=8.
fn v5p_4x8x8() -> Topology {
    parse_topology(
        "Pod(name: \"v5p-4x8x8\", generation: \"v5p\", shape: \"4x8x8\")",
        "v5p.ron",
    )
    .unwrap()
}

fn step(
    config: &ModelConfig,
    topology: &Topology,
    mesh: &str,
) -> Result<ModelStep, StepModelError> {
    let options = ModelStepOptions {
        mesh: Mesh::parse_split(mesh, topology).unwrap(),
        strategy: Strategy::Fsdp,
        ..ModelStepOptions::new(topology)
    };
    model_step(config, topology, &options)
}

proptest! {
    /// Without an expert axis (or without experts) the plan is the dense
    /// plan, collective for collective; with one, the state is `len/(F·X)`
    /// a device and the gathers bring each device every weight but the
    /// other devices' experts.
    #[test]
    fn the_expert_plan_shards_everything_and_gathers_the_local_experts(
        buckets in 1u64..50,
        expert_percent in 0u64..=100,
        strategy in prop_oneof![Just(Strategy::Replicated), Just(Strategy::Zero2), Just(Strategy::Fsdp)],
    ) {
        let topology = v5p_4x8x8();
        let dense = Mesh::parse_split("fsdp=-1", &topology).unwrap();
        let len = buckets * 256 * 8;
        prop_assert_eq!(
            bucket_plan_with_experts(strategy, &dense, (len, len * expert_percent / 100), 2, false),
            bucket_plan(strategy, &dense, len, 2, false)
        );
        let mesh = Mesh::parse_split("fsdp=-1,expert=8", &topology).unwrap();
        let experts = len * expert_percent / 100 / 8 * 8;
        let plan = bucket_plan_with_experts(strategy, &mesh, (len, experts), 2, false);
        let update = plan.iter().find_map(|s| match s {
            PlanStep::Update { elements } => Some(*elements),
            _ => None,
        });
        // Every strategy's update runs on the device's 1/256 (data is 1).
        prop_assert_eq!(update, Some(len / 256));
        if strategy == Strategy::Fsdp {
            // Received by a gather: (n−1)/n of what each collective gathers.
            let received: f64 = plan
                .iter()
                .filter_map(|s| match s {
                    PlanStep::Collective(c)
                        if c.purpose == Purpose::ParamsForward
                            && c.kind == CollectiveKind::AllGather =>
                    {
                        Some(c.elements as f64 * (c.devices - 1) as f64 / c.devices as f64)
                    }
                    _ => None,
                })
                .sum();
            let rest = (len - experts) as f64;
            let local_experts = experts as f64 / 8.0;
            // Every weight the device does not hold, of what its group uses.
            let closed = rest * (1.0 - 1.0 / 256.0) + local_experts * (1.0 - 1.0 / 32.0);
            prop_assert!((received - closed).abs() <= 1.0 + 1e-9 * closed, "{} vs {}", received, closed);
        }
    }
}

#[test]
fn a_layers_all_to_alls_are_the_rings_closed_form() {
    let topology = v5p_4x8x8();
    let config = bundled("mixtral-8x7b").unwrap();
    let dense = step(&config, &topology, "fsdp=-1").unwrap();
    let experts = step(&config, &topology, "fsdp=-1,expert=8").unwrap();
    let ep = experts.expert_parallel.unwrap();
    assert!(dense.expert_parallel.is_none());
    assert_eq!((ep.size, ep.experts_per_device), (8, 1));
    // The expert axis is one 8-long torus axis with wraparound: one ring
    // all-to-all of the device's routed rows (top-2 at capacity factor
    // 1.25: every expert's whole capacity is sent).
    let axis = Mesh::parse_split("fsdp=-1,expert=8", &topology)
        .unwrap()
        .torus_axes(MeshAxisName::Expert);
    assert_eq!(axis.len(), 1);
    let ring = TorusShape::new(&[8], &[true]).unwrap();
    let link = LinkModel::new(
        topology.ici.latency_ns as f64 * 1e-9,
        topology.ici.bytes_per_s,
    )
    .unwrap();
    let moe = config.moe.unwrap();
    assert_eq!(moe.routed_rows_per_token(config.seq_len), 2.5);
    let rows = config.tokens_per_device() * 2.5 * config.embed as f64;
    let closed = torus_all_to_all_seconds(&ring, rows as usize, 2, &link);
    assert!(
        (ep.all_to_all.seconds - closed).abs() <= 1e-12 + 1e-9 * closed,
        "{} vs {closed}",
        ep.all_to_all.seconds
    );
    // The scaling book's form: on a bidirectional ring of n each device's
    // buffer of V bytes travels n/4 hops on average over 2n links, V·n/8
    // a link (a quarter of an all-gather of the n buffers, V·n/2); the
    // relay's busiest link carries (n/2)(n/2+1)/2 chunks of V/n, 25 % more
    // at n = 8.
    let bytes = rows * 2.0;
    let book = bytes * 8.0 / (8.0 * topology.ici.bytes_per_s);
    let error = (ep.all_to_all.seconds - book) / book;
    println!(
        "mixtral-8x7b expert=8 dispatch: {:.3} ms, scaling book {:.3} ms ({:+.2} %)",
        ep.all_to_all.seconds * 1e3,
        book * 1e3,
        error * 100.0
    );
    assert!(error.abs() < 0.30, "{error}");
    // Two a pass forward, their transposes and the recomputed forward's
    // backward; no shared experts cover them, so all of it is exposed.
    let layers = config.layers as f64;
    let recompute = optirs_tpu::step_model::recomputed_fraction(&config, config.remat);
    let all = experts.phases["all_to_all.expert"];
    let expected = ep.all_to_all.seconds * 2.0 * (2.0 + recompute) * layers;
    assert!(
        (all - expected).abs() <= 1e-9 * expected,
        "{all} vs {expected}"
    );
    assert_eq!(experts.phases["exposed_all_to_all"], all);
    // The step is the dense step's compute plus what is exposed (the
    // layers' compute is the same: each device runs its tokens' share).
    assert_eq!(experts.layer.forward.flops, dense.layer.forward.flops);
    // A device's matmuls read its own expert's weights, not all eight.
    let weights = |s: &ModelStep| s.layer.forward.bytes;
    assert!(weights(&experts) < weights(&dense));
    assert!(experts.step_seconds > dense.step_seconds + 0.9 * all);
    // Every parameter is still sharded over all 256 devices.
    let total = parameter_count(&config).total() as f64;
    let per_device = experts.optimizer.elements as f64;
    assert!(
        (per_device * 256.0 / total - 1.0).abs() < 0.01,
        "{per_device}"
    );
    // A device gathers one expert, not eight: far less in flight.
    assert!(experts.hbm.gathered < dense.hbm.gathered / 4);
    assert!(experts.hbm.all_to_all_buffers > 0 && dense.hbm.all_to_all_buffers == 0);
    // MFU stays below the hardware's use, below the MXU's efficiency.
    assert!(experts.mfu <= experts.hardware_utilization);
    assert!(experts.hardware_utilization <= experts.efficiency + 1e-12);
}

#[test]
fn shared_experts_cover_the_all_to_alls() {
    let topology = v5p_4x8x8();
    let base = bundled("mixtral-8x7b").unwrap();
    let shared = ModelConfig {
        moe: Some(MixtureOfExperts {
            shared_experts: 1,
            ..base.moe.unwrap()
        }),
        ..base.clone()
    };
    let s = step(&shared, &topology, "fsdp=-1,expert=8").unwrap();
    let ep = s.expert_parallel.unwrap();
    assert!(ep.forward_hidden_seconds > 0.0);
    assert!(ep.forward_hidden_seconds <= ep.forward_seconds);
    let exposed = s.phases["exposed_all_to_all"];
    assert!(exposed < s.phases["all_to_all.expert"], "{exposed}");
}

#[test]
fn an_expert_axis_across_the_slices_crosses_the_dcn() {
    let topology = parse_topology(
        "Pod(name: \"m\", generation: \"v5p\", shape: \"4x4x8\", slices: 2, \
         dcn: (latency_us: 10.0, host_gb_per_s: 25.0, oversubscription: 1.0))",
        "m.ron",
    )
    .unwrap();
    let config = bundled("mixtral-8x7b").unwrap();
    // expert=2 is the slices (no torus axis is 2 long).
    let mesh = Mesh::parse_split("expert=2,fsdp=-1", &topology).unwrap();
    assert!(mesh.crosses_slices(MeshAxisName::Expert), "{mesh}");
    assert!(mesh.torus_axes(MeshAxisName::Expert).is_empty());
    let s = step(&config, &topology, "expert=2,fsdp=-1").unwrap();
    let ep = s.expert_parallel.unwrap();
    assert_eq!(ep.experts_per_device, 4);
    // Each host's 4 chips send the other slice half of their routed rows
    // on the host's rail at once.
    let rows = config.tokens_per_device() * 2.5 * config.embed as f64;
    let closed = 10e-6 + 4.0 * (rows / 2.0) * 2.0 / 25e9;
    println!(
        "expert=2 over the DCN: {:.3} ms a dispatch, closed form {:.3} ms",
        ep.all_to_all.seconds * 1e3,
        closed * 1e3
    );
    assert!(
        (ep.all_to_all.seconds - closed).abs() <= 1e-9 * closed,
        "{} vs {closed}",
        ep.all_to_all.seconds
    );
}

#[test]
fn an_expert_axis_the_model_cannot_take_is_refused_naming_the_field() {
    let topology = v5p_4x8x8();
    let field = |config: &ModelConfig, mesh: &str| match step(config, &topology, mesh) {
        Err(StepModelError::Field { field, problem, .. }) => (field, problem),
        other => panic!("{mesh}: {other:?}"),
    };
    let (f, why) = field(&bundled("llama2-7b").unwrap(), "fsdp=-1,expert=8");
    assert_eq!(f, "mesh");
    assert!(why.contains("dense"), "{why}");
    let four = ModelConfig {
        moe: Some(MixtureOfExperts {
            num_experts: 4,
            ..bundled("mixtral-8x7b").unwrap().moe.unwrap()
        }),
        ..bundled("mixtral-8x7b").unwrap()
    };
    let (f, why) = field(&four, "fsdp=-1,expert=8");
    assert_eq!(f, "num_experts");
    assert!(why.contains("4 is not a multiple of 8"), "{why}");
}

#[test]
fn only_the_moe_layers_send_and_the_shared_expert_covers_them() {
    // DeepSeek-V3: the first 3 of 61 layers dense, one shared expert.
    let topology = parse_topology(
        "Pod(name: \"v5p-1024\", generation: \"v5p\", shape: \"8x8x8\")",
        "v5p.ron",
    )
    .unwrap();
    let config = bundled("deepseek3-671b").unwrap();
    assert_eq!(config.dense_and_moe_layers(), (3, 58));
    let s = step(&config, &topology, "fsdp=-1,expert=8").unwrap();
    let ep = s.expert_parallel.unwrap();
    assert_eq!(ep.experts_per_device, 32);
    let recompute = optirs_tpu::step_model::recomputed_fraction(&config, config.remat);
    let expected = ep.all_to_all.seconds * 2.0 * (2.0 + recompute) * 58.0;
    let all = s.phases["all_to_all.expert"];
    assert!(
        (all - expected).abs() <= 1e-9 * expected,
        "{all} vs {expected}"
    );
    assert!(ep.forward_hidden_seconds > 0.0);
    assert!(s.phases["exposed_all_to_all"] < all);
    // The expert weights are most of the model: the share split over the
    // axis.
    assert!(
        ep.expert_share > 0.9 && ep.expert_share < 1.0,
        "{}",
        ep.expert_share
    );
}

#[test]
fn a_ring_of_experts_gathers_and_scatters_in_place_of_the_all_to_alls() {
    use optirs_tpu::cost_model::axis_collective;
    use optirs_tpu::sharding::strategy::CollectiveKind;
    let topology = v5p_4x8x8();
    let base = bundled("mixtral-8x7b").unwrap();
    let ring = ModelConfig {
        moe: Some(MixtureOfExperts {
            use_ring_of_experts: true,
            ..base.moe.unwrap()
        }),
        ..base.clone()
    };
    let a2a = step(&base, &topology, "fsdp=-1,expert=8").unwrap();
    let s = step(&ring, &topology, "fsdp=-1,expert=8").unwrap();
    let mesh = Mesh::parse_split("fsdp=-1,expert=8", &topology).unwrap();
    let gathered = (ring.tokens_per_device() * 8.0 * ring.embed as f64) as usize;
    let on =
        |kind| axis_collective(&topology, &mesh, MeshAxisName::Expert, kind, gathered, 2).unwrap();
    let pass = on(CollectiveKind::AllGather).seconds + on(CollectiveKind::ReduceScatter).seconds;
    let recompute = optirs_tpu::step_model::recomputed_fraction(&ring, ring.remat);
    let expected = pass * (2.0 + recompute) * ring.layers as f64;
    let all = s.phases["all_to_all.expert"];
    assert!(
        (all - expected).abs() <= 1e-9 * expected,
        "{all} vs {expected}"
    );
    // Eight devices' tokens against 2.5 routed rows a token: the ring moves
    // more, and holds the gathered input.
    assert!(all > a2a.phases["all_to_all.expert"]);
    assert!(s.hbm.all_to_all_buffers > a2a.hbm.all_to_all_buffers);
    // Without an expert axis there is nothing to gather: the same step.
    let flat = step(&ring, &topology, "fsdp=-1").unwrap();
    let flat_base = step(&base, &topology, "fsdp=-1").unwrap();
    assert_eq!(flat.step_seconds, flat_base.step_seconds);
}

/// A dropless mixture's grouped matmuls compute a tile two experts share
/// once for each: fewer experts on a device (an expert axis) leave fewer
/// shared tiles, a tensor axis's gathered tokens more rows to fill them,
/// and the count MaxText makes (and MFU) stays the rows'.
#[test]
fn dropless_tiles_shrink_with_the_expert_axis() {
    use optirs_tpu::model::{bundled, layer_matmul_flops};
    use optirs_tpu::step_model::hardware_matmul_flops_on;
    let deepseek = bundled("deepseek3-671b").unwrap();
    let counted = layer_matmul_flops(&deepseek).mlp_out;
    let alone = hardware_matmul_flops_on(&deepseek, (1, 1)).mlp_out;
    let over_16 = hardware_matmul_flops_on(&deepseek, (1, 16)).mlp_out;
    let tensor_4 = hardware_matmul_flops_on(&deepseek, (4, 1)).mlp_out;
    assert!(
        counted < over_16 && over_16 < alone,
        "{counted} {over_16} {alone}"
    );
    assert!(
        counted < tensor_4 && tensor_4 < alone,
        "{counted} {tensor_4} {alone}"
    );
    // 6 × 8192 tokens, top-8 of 256 plus one shared expert: the routed
    // eight of the nine experts a token run a third more rows.
    let tiles = (768.0 + 255.0 * (1.0 - 1.0 / 512.0)) / 768.0;
    let moe_share = {
        let mlp = optirs_tpu::model::mlp_flops(&deepseek);
        let (dense, moe) = (mlp.dense_layers as f64, mlp.moe_layers as f64);
        mlp.moe.1 * moe / (mlp.dense.1 * dense + mlp.moe.1 * moe)
    };
    let expected = counted * (1.0 + moe_share * 8.0 / 9.0 * (tiles - 1.0));
    assert!(
        (alone / expected - 1.0).abs() < 1e-9,
        "{alone} against {expected}"
    );
}
