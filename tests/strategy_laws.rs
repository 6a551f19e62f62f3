//! The strategy model's laws: a strategy that moves fewer bytes on the same
//! mesh under the same overlap is never slower; jumping over runs of equal
//! buckets gives what simulating each does; the cost of modeling does not
//! grow with the model.

use optirs_tpu::cost_model::{
    DataReduction, Precision, StepOrder, StrategyOptions, StrategyStep, modeled_strategy_step,
};
use optirs_tpu::ir::DType;
use optirs_tpu::sharding::{Mesh, MeshAxisName, MeshSizes, RecoveryPolicy, Strategy};
use optirs_tpu::topology::{Topology, load_topology};

const MULTISLICE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/pods/examples/v5e-16x2-multislice.ron"
);

fn pod(i: usize) -> Topology {
    load_topology(["v5e-16", "v4-128", MULTISLICE][i]).unwrap()
}

/// The mesh with the first `data_axes` physical axes as `data`, the rest
/// `fsdp`, if it lays out.
fn mesh(topology: &Topology, data_axes: usize) -> Option<Mesh> {
    let phys = optirs_tpu::sharding::mesh::physical_axes(topology);
    let data: usize = phys.iter().take(data_axes).map(|p| p.1).product();
    Mesh::lay_out(
        MeshSizes::new(data, topology.num_devices() as usize / data, 1),
        topology,
    )
    .ok()
}

fn step(topology: &Topology, params: usize, bucket: usize, o: &StrategyOptions) -> StrategyStep {
    let tensors = [("w".to_string(), vec![params])];
    modeled_strategy_step(topology, &tensors, DType::F32, 2, bucket, o).unwrap()
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-12)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

    /// On one mesh, with the same overlap, the strategy that moves fewer
    /// bytes is never the slower: zero2's collectives are fsdp's without
    /// the gather before each backward use, and replicated's are zero2's
    /// when the mesh has no data axis; under both reduction schedules.
    /// With a data axis, replicated (ZeRO-1 over every device) shards its
    /// state across it, so its new parameters cross it after their update,
    /// where zero2's all-reduce crosses it before: the same bytes with one
    /// more dependency, which costs at most one bucket's all-gather over
    /// `data` and update.
    #[test]
    fn the_strategy_that_moves_fewer_bytes_is_never_slower(
        pod_index in 0usize..3,
        data_axes in 0usize..3,
        prefetch in 0usize..4,
        redundant in proptest::bool::ANY,
        params in 1000usize..3_000_000,
        bucket in 256usize..2_000_000,
        forward_us in 0u32..400,
        after_backward in proptest::bool::ANY,
        compute_type in proptest::bool::ANY,
    ) {
        let topology = pod(pod_index);
        let Some(mesh) = mesh(&topology, data_axes) else { return Ok(()) };
        let of = |strategy| {
            let o = StrategyOptions {
                mesh: mesh.clone(),
                prefetch,
                recovery: if redundant { RecoveryPolicy::Redundant } else { RecoveryPolicy::Rollback },
                use_seconds: f64::from(forward_us) * 1e-6,
                backward_use_seconds: Some(f64::from(forward_us) * 2e-6),
                between_seconds: f64::from(forward_us) * 1e-6,
                data_reduction: if after_backward {
                    DataReduction::AfterBackward
                } else {
                    DataReduction::Overlapped
                },
                order: StepOrder::Training,
                // bf16 compute: fsdp's gathers and every gradient
                // reduce-scatter in 2 bytes, the replicas' new parameters
                // and the reduction over data in 4.
                precision: compute_type.then_some(Precision {
                    compute: 2,
                    ..Precision::uniform(4, 2)
                }),
                ..StrategyOptions::new(strategy, &topology)
            };
            step(&topology, params, bucket, &o)
        };
        let (rep, z2, fsdp) = (of(Strategy::Replicated), of(Strategy::Zero2), of(Strategy::Fsdp));
        let slack = 1.0 + 1e-12;
        proptest::prop_assert!(z2.link_bytes <= fsdp.link_bytes);
        if z2.link_bytes < fsdp.link_bytes {
            proptest::prop_assert!(
                z2.step_seconds <= fsdp.step_seconds * slack,
                "zero2 moves {} B in {} s, fsdp moves {} B in {} s",
                z2.link_bytes, z2.step_seconds, fsdp.link_bytes, fsdp.step_seconds
            );
        }
        let data = mesh.size(MeshAxisName::Data);
        if data == 1 {
            proptest::prop_assert_eq!(rep.link_bytes, z2.link_bytes);
            proptest::prop_assert!(close(rep.step_seconds, z2.step_seconds, 1e-12));
        } else {
            let data_axes: Vec<String> = mesh
                .axis(MeshAxisName::Data)
                .map(|a| a.physical.iter().map(|p| p.key()).collect())
                .unwrap_or_default();
            let gathers: f64 = data_axes
                .iter()
                .filter_map(|a| rep.phases.get(&format!("all_gather.{a}")))
                .sum();
            let bucket_cost = (gathers + rep.update_seconds) / rep.buckets as f64;
            proptest::prop_assert!(
                rep.step_seconds <= z2.step_seconds * slack + bucket_cost,
                "replicated {} s, zero2 {} s, one bucket's gather over data and update {} s",
                rep.step_seconds, z2.step_seconds, bucket_cost
            );
        }
    }

    /// Jumping over a run of equal buckets once the schedule repeats gives
    /// the figures of simulating every bucket (a recording schedule
    /// simulates each), to rounding.
    #[test]
    fn jumping_over_equal_buckets_is_simulating_them(
        pod_index in 0usize..3,
        strategy in 0usize..3,
        data_axes in 0usize..3,
        prefetch in 0usize..5,
        redundant in proptest::bool::ANY,
        buckets in 40usize..400,
        tail in 0usize..5000,
        forward_us in 0u32..60,
        backward_factor in 1u32..4,
        after_backward in proptest::bool::ANY,
        training in proptest::bool::ANY,
    ) {
        let topology = pod(pod_index);
        let Some(mesh) = mesh(&topology, data_axes) else { return Ok(()) };
        let bucket = 64 * 1024;
        let params = buckets * bucket / 4 + tail;
        let o = StrategyOptions {
            mesh,
            prefetch,
            recovery: if redundant { RecoveryPolicy::Redundant } else { RecoveryPolicy::Rollback },
            use_seconds: f64::from(forward_us) * 1e-6,
            backward_use_seconds: Some(f64::from(forward_us * backward_factor) * 1e-6),
            between_seconds: 3e-6,
            data_reduction: if after_backward {
                DataReduction::AfterBackward
            } else {
                DataReduction::Overlapped
            },
            order: if training { StepOrder::Training } else { StepOrder::Optimizer },
            ..StrategyOptions::new(Strategy::ALL[strategy], &topology)
        };
        let jumped = step(&topology, params, bucket, &o);
        let simulated = step(&topology, params, bucket, &StrategyOptions { record_spans: true, ..o.clone() });
        proptest::prop_assert!(
            close(jumped.step_seconds, simulated.step_seconds, 1e-9),
            "{} vs {}", jumped.step_seconds, simulated.step_seconds
        );
        proptest::prop_assert!(
            (jumped.update_seconds - simulated.update_seconds).abs()
                <= 1e-9 * simulated.update_seconds + 1e-12 * simulated.step_seconds
        );
        proptest::prop_assert!(close(jumped.use_seconds, simulated.use_seconds, 1e-9));
        proptest::prop_assert_eq!(jumped.link_bytes, simulated.link_bytes);
        proptest::prop_assert_eq!(&jumped.phase_bytes, &simulated.phase_bytes);
        proptest::prop_assert_eq!(jumped.phases.len(), simulated.phases.len());
        for (k, v) in &jumped.phases {
            let s = simulated.phases[k];
            // Exposed communication is a difference of two large figures.
            // Each phase sums span lengths of times up to the step's size.
            let tolerance = 1e-9 * s.abs() + 1e-12 * simulated.step_seconds;
            proptest::prop_assert!((v - s).abs() <= tolerance, "{}: {} vs {}", k, v, s);
        }
        proptest::prop_assert!(jumped.schedule_iterations <= simulated.schedule_iterations);
    }
}

/// The schedule simulates a bounded number of iterations however many
/// buckets the model has: 10⁶ and 10¹⁸ parameters cost the same.
#[test]
fn the_cost_of_modeling_does_not_grow_with_the_model() {
    for pod_index in 0..3 {
        let topology = pod(pod_index);
        for strategy in Strategy::ALL {
            for order in [StepOrder::Optimizer, StepOrder::Training] {
                for data_reduction in [DataReduction::Overlapped, DataReduction::AfterBackward] {
                    for (forward, redundant) in [(0.0, false), (1e-4, true), (1e-2, false)] {
                        let o = StrategyOptions {
                            order,
                            data_reduction,
                            use_seconds: forward,
                            backward_use_seconds: Some(2.0 * forward),
                            recovery: if redundant {
                                RecoveryPolicy::Redundant
                            } else {
                                RecoveryPolicy::Rollback
                            },
                            ..StrategyOptions::new(strategy, &topology)
                        };
                        let small = step(&topology, 1_000_000, 1 << 20, &o);
                        let huge = step(&topology, 1_000_000_000_000_000_000, 1 << 20, &o);
                        assert!(huge.buckets > 1_000_000_000_000, "{}", huge.buckets);
                        assert!(
                            huge.schedule_iterations <= 256,
                            "{strategy} {order:?} {data_reduction:?} on {}: {} iterations",
                            topology.name,
                            huge.schedule_iterations
                        );
                        assert!(small.schedule_iterations <= 256);
                        assert!(huge.step_seconds.is_finite() && huge.step_seconds > 0.0);
                    }
                }
            }
        }
    }
}

/// The README's strategy advice, held to the program's numbers: replicated
/// and zero2 move the same bytes, fsdp 1.5 times them and is never the
/// faster, in an optimizer step and in a model's training step; fsdp holds
/// the model `F`-fold smaller (175e9 Adam parameters: 1.40 TB per device
/// replicated, 534 MB under fsdp on a 6144-chip v5p slice).
#[test]
fn the_readme_strategy_advice_holds() {
    use optirs_tpu::model::bundled;
    use optirs_tpu::step_model::{ModelStepOptions, model_step};
    let v4 = load_topology("v4-128").unwrap();
    let params = 64 * 1_000_000;
    let of = |strategy| step(&v4, params, 25 << 20, &StrategyOptions::new(strategy, &v4));
    let (rep, z2, fsdp) = (
        of(Strategy::Replicated),
        of(Strategy::Zero2),
        of(Strategy::Fsdp),
    );
    assert_eq!(rep.link_bytes, z2.link_bytes);
    assert_eq!(2 * fsdp.link_bytes, 3 * rep.link_bytes);
    assert!(rep.step_seconds <= fsdp.step_seconds && z2.step_seconds <= fsdp.step_seconds);
    // A model's training step: the same ratio in the compute type, and
    // fsdp never the faster.
    for (model, pod) in [("llama2-7b", "v5p-256"), ("maxtext-v5e-16b", "v5e-256")] {
        let topology = load_topology(pod).unwrap();
        let config = bundled(model).unwrap();
        let of = |strategy| {
            let options = ModelStepOptions {
                strategy,
                ..ModelStepOptions::new(&topology)
            };
            model_step(&config, &topology, &options).unwrap()
        };
        let (rep, z2, fsdp) = (
            of(Strategy::Replicated),
            of(Strategy::Zero2),
            of(Strategy::Fsdp),
        );
        let bytes = |s: &optirs_tpu::step_model::ModelStep| s.strategy_step.link_bytes;
        assert_eq!(bytes(&rep), bytes(&z2), "{model}");
        assert_eq!(2 * bytes(&fsdp), 3 * bytes(&rep), "{model}");
        for fewer in [&rep, &z2] {
            assert!(
                fewer.step_seconds <= fsdp.step_seconds * (1.0 + 1e-12),
                "{model}"
            );
        }
        assert!(fsdp.hbm.total < z2.hbm.total && z2.hbm.total < rep.hbm.total);
    }
    let v5p = optirs_tpu::topology::parse_topology(
        "Pod(name: \"v5p-12288\", generation: \"v5p\", shape: \"16x16x24\")",
        "v5p.ron",
    )
    .unwrap();
    let of = |strategy| {
        step(
            &v5p,
            175_000_000_000,
            25 << 20,
            &StrategyOptions::new(strategy, &v5p),
        )
        .hbm_bytes_per_device
    };
    let gb = |b: u64| b as f64 / 1e9;
    assert!((gb(of(Strategy::Replicated)) / 1400.0 - 1.0).abs() < 0.005);
    assert!(
        (gb(of(Strategy::Fsdp)) / 0.534 - 1.0).abs() < 0.005,
        "{}",
        of(Strategy::Fsdp)
    );
}
