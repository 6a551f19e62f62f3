//! The modeled strategy step's unit tests.

use super::*;
use crate::cost_model::replicated::modeled_step_with_recovery;
use crate::topology::{load_preset, load_topology, parse_topology};

const MULTISLICE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/pods/examples/v5e-16x2-multislice.ron"
);

fn tensors(sizes: &[usize]) -> Vec<(String, Vec<usize>)> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| (format!("param{i}"), vec![n]))
        .collect()
}

fn step(
    topology: &Topology,
    sizes: &[usize],
    bucket_bytes: usize,
    options: &StrategyOptions,
) -> StrategyStep {
    modeled_strategy_step(
        topology,
        &tensors(sizes),
        DType::F32,
        2,
        bucket_bytes,
        options,
    )
    .unwrap()
}

#[test]
fn replicated_on_the_default_mesh_is_today_s_modeled_step_to_the_bit() {
    for pod in ["v5e-16", "v4-128", MULTISLICE] {
        let topology = load_topology(pod).unwrap();
        for recovery in [RecoveryPolicy::Rollback, RecoveryPolicy::Redundant] {
            for (sizes, bucket) in [
                (vec![1_000_000, 3_001], 1 << 20),
                (vec![5000, 300], 4096),
                (vec![16_800_000], 25 << 20),
            ] {
                let today = modeled_step_with_recovery(
                    &topology,
                    &tensors(&sizes),
                    DType::F32,
                    2,
                    bucket,
                    recovery,
                )
                .unwrap();
                let options = StrategyOptions {
                    recovery,
                    ..StrategyOptions::new(Strategy::Replicated, &topology)
                };
                let ours = step(&topology, &sizes, bucket, &options);
                let what = format!("{pod} {recovery:?} {sizes:?}");
                assert_eq!(ours.step_seconds, today.timeline.step_seconds, "{what}");
                assert_eq!(ours.update_seconds, today.timeline.update_seconds, "{what}");
                assert_eq!(ours.phases, today.timeline.phases, "{what}");
                assert_eq!(ours.link_bytes, u128::from(today.link_bytes), "{what}");
                assert_eq!(
                    ours.hbm_bytes_per_device, today.hbm_bytes_per_device,
                    "{what}"
                );
                assert_eq!(ours.buckets, today.buckets, "{what}");
                assert_eq!(ours.devices, today.devices, "{what}");
                assert_eq!(
                    ours.phase_bytes.values().sum::<u128>(),
                    ours.link_bytes,
                    "{what}"
                );
                assert_eq!(
                    ours.axes.values().map(|a| a.link_bytes).sum::<u128>(),
                    ours.link_bytes,
                    "{what}"
                );
            }
        }
    }
}

#[test]
fn zero2_moves_what_replicated_moves_and_holds_a_gradient_shard() {
    let topology = load_preset("v4-128").unwrap();
    let sizes = [6_400_000];
    let rep = step(
        &topology,
        &sizes,
        1 << 20,
        &StrategyOptions::new(Strategy::Replicated, &topology),
    );
    let z2 = step(
        &topology,
        &sizes,
        1 << 20,
        &StrategyOptions::new(Strategy::Zero2, &topology),
    );
    // One slice, data = 1: the same collectives and update.
    assert_eq!(z2.link_bytes, rep.link_bytes);
    assert_eq!(z2.step_seconds, rep.step_seconds);
    // 6.4e6 f32 over 64 devices: a 400 kB gradient shard, a 1 MiB bucket in flight.
    assert_eq!(z2.memory.grads, 400_000);
    assert_eq!(z2.memory.gradient_bucket, (1 << 20) / 64 * 64 * 4 / 4);
}

#[test]
fn fsdp_gathers_twice_and_never_holds_more_than_prefetch_plus_one_buckets() {
    let topology = load_preset("v4-128").unwrap();
    let ici = &topology.ici;
    let sizes = [64 * 1000 * 10];
    for prefetch in [0usize, 1, 2, 50] {
        let options = StrategyOptions {
            prefetch,
            use_seconds: 1e-4,
            record_spans: true,
            ..StrategyOptions::new(Strategy::Fsdp, &topology)
        };
        let s = step(&topology, &sizes, 64 * 1000 * 4, &options);
        assert_eq!(s.buckets, 10);
        // Per bucket: two all-gathers and a reduce-scatter of 256 kB over
        // 64 devices: 3 · 63/64 of the bucket per device.
        assert_eq!(s.link_bytes, 10 * 3 * 64 * 63 * 1000 * 4);
        // Every gather is the collectives' all-gather of the bucket over
        // the three axes at once; its axis-0 passes summed, 20 times.
        let shape = crate::collectives::pod::slice_torus(&topology).unwrap();
        let link = LinkModel::new(ici.latency_ns as f64 * 1e-9, ici.bytes_per_s).unwrap();
        let axis0 = cost::all_gather_cost(&shape, &[0, 1, 2], 64_000, 4, &link).axis_seconds()[&0];
        let gathers = s.phases["all_gather.axis0"];
        assert!(
            (gathers - 20.0 * axis0).abs() < 1e-12,
            "{gathers} vs {}",
            20.0 * axis0
        );
        // Peak gathered buckets: gathers started and not yet freed.
        let mut events: Vec<(f64, i32)> = Vec::new();
        for sp in &s.spans {
            match sp.kind {
                SpanKind::Gather { .. } => events.push((sp.start_seconds, 1)),
                SpanKind::Free { .. } => events.push((sp.end_seconds, -1)),
                _ => {}
            }
        }
        events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let (mut now, mut peak) = (0i32, 0i32);
        for (_, d) in events {
            now += d;
            peak = peak.max(now);
        }
        // Gathers (about 20 µs) outrun 100 µs uses, so the window fills.
        let bound = (prefetch + 1).min(20);
        assert!(peak as usize <= bound, "prefetch {prefetch}: {peak}");
        if prefetch <= 2 {
            assert_eq!(peak as usize, bound, "prefetch {prefetch}");
        }
        assert_eq!(
            s.spans
                .iter()
                .filter(|sp| sp.kind == SpanKind::Update)
                .count(),
            10
        );
        // Every use after its gather, every update after its gradient.
        for k in 0..10u32 {
            let of = |kind| {
                s.spans
                    .iter()
                    .find(|sp| sp.bucket == k && sp.kind == kind)
                    .unwrap()
            };
            assert!(
                of(SpanKind::Use { backward: true }).start_seconds
                    >= of(SpanKind::Gather { backward: true }).end_seconds
            );
            assert!(of(SpanKind::Update).start_seconds >= of(SpanKind::ReduceScatter).end_seconds);
        }
        assert!((s.use_seconds - 20.0 * 1e-4).abs() < 1e-15);
        assert!(s.step_seconds >= s.use_seconds + s.update_seconds);
    }
}

#[test]
fn a_hybrid_mesh_all_reduces_the_shard_over_the_dcn() {
    let topology = load_topology(MULTISLICE).unwrap();
    let options = StrategyOptions::new(Strategy::Fsdp, &topology);
    let s = step(&topology, &[32 * 1000], 32 * 1000 * 4, &options);
    // fsdp=16 per slice, data=2: each device's 2000-element shard
    // all-reduced over DCN, a reduce-scatter and an all-gather whose
    // exchange sends each host's chips' 1000-element halves.
    let per_host = (0..16).filter(|&d| topology.host_of(d) == 0).count();
    let chunk = (per_host * 1000 * 4) as f64;
    let fabric = topology.fabric_link_params(&topology.dcn_fabric.unwrap());
    let dcn = fabric.latency_ns as f64 * 1e-9 + chunk / fabric.bytes_per_s;
    assert!((s.phases["reduce_scatter.dcn"] - dcn).abs() < 1e-15);
    assert!((s.phases["all_gather.dcn"] - dcn).abs() < 1e-15);
    // Every host sends its chunk to the other slice, twice.
    let hosts = 2 * 16 / per_host as u64;
    assert_eq!(
        s.axes["dcn"].link_bytes,
        u128::from(hosts * 2 * chunk as u64)
    );
    assert_eq!(s.memory.params, (32_000 / 16 * 4));
}

#[test]
fn bad_options_are_typed_errors() {
    let topology = load_preset("v5e-16").unwrap();
    let mut options = StrategyOptions::new(Strategy::Fsdp, &topology);
    options.use_seconds = f64::NAN;
    let tensors = tensors(&[1000]);
    assert!(modeled_strategy_step(&topology, &tensors, DType::F32, 2, 4096, &options).is_err());
    let v4 = load_preset("v4-128").unwrap();
    let options = StrategyOptions::new(Strategy::Fsdp, &v4);
    let err =
        modeled_strategy_step(&topology, &tensors, DType::F32, 2, 4096, &options).unwrap_err();
    assert!(matches!(err, ShardingError::Devices { .. }), "{err}");
}

fn v5p() -> Topology {
    parse_topology(
        "Pod(name: \"v5p-12288\", generation: \"v5p\", shape: \"16x16x24\")",
        "v5p.ron",
    )
    .unwrap()
}

#[test]
fn gpt3_under_fsdp_fits_a_v5p_slice_and_is_modeled_fast() {
    let topology = v5p();
    let started = std::time::Instant::now();
    let s = step(
        &topology,
        &[175_000_000_000],
        25 << 20,
        &StrategyOptions::new(Strategy::Fsdp, &topology),
    );
    let wall = started.elapsed().as_secs_f64();
    assert_eq!(s.fits(topology.hbm_bytes), Ok(()));
    // 175e9 · 4 B / 6144 = 113.9 MB a kind, 4·113.9 MB for params,
    // grads and two slots, plus three 25 MiB buckets.
    let shard = 175e9 * 4.0 / 6144.0;
    let expected = 4.0 * shard + 3.0 * (25u64 << 20) as f64;
    let got = s.hbm_bytes_per_device as f64;
    assert!(
        (got - expected).abs() / expected < 1e-3,
        "{got} vs {expected}"
    );
    let rep = step(
        &topology,
        &[175_000_000_000],
        25 << 20,
        &StrategyOptions::new(Strategy::Replicated, &topology),
    );
    assert!(rep.fits(topology.hbm_bytes).is_err());
    eprintln!(
        "175e9 fsdp on v5p 16x16x24: {} B per device, step {} s, modeled in {wall} s",
        s.hbm_bytes_per_device, s.step_seconds
    );
    if !cfg!(debug_assertions) {
        assert!(wall < 0.05, "{wall} s");
    }
}

#[test]
fn a_trillion_parameters_under_hybrid_fsdp_fit_four_v5p_slices() {
    let topology = parse_topology(
        "Pod(name: \"v5p-12288x4\", generation: \"v5p\", shape: \"16x16x24\", slices: 4, \
         dcn: (latency_us: 10.0, host_gb_per_s: 25.0, oversubscription: 1.0))",
        "v5p4.ron",
    )
    .unwrap();
    let options = StrategyOptions::new(Strategy::Fsdp, &topology);
    assert_eq!(options.mesh.to_string(), "data=4,fsdp=6144,tensor=1");
    let started = std::time::Instant::now();
    let s = step(&topology, &[1_000_000_000_000], 25 << 20, &options);
    let wall = started.elapsed().as_secs_f64();
    assert_eq!(s.fits(topology.hbm_bytes), Ok(()));
    let shard = 1e12 * 4.0 / 6144.0;
    let expected = 4.0 * shard + 3.0 * (25u64 << 20) as f64;
    let got = s.hbm_bytes_per_device as f64;
    assert!(
        (got - expected).abs() / expected < 1e-3,
        "{got} vs {expected}"
    );
    assert!(s.phases["reduce_scatter.dcn"] > 0.0 && s.phases["all_gather.dcn"] > 0.0);
    eprintln!(
        "1e12 fsdp on 4 v5p 16x16x24 slices: {} B per device, step {} s, modeled in {wall} s",
        s.hbm_bytes_per_device, s.step_seconds
    );
    // 152,971 buckets: 44 ms at best in a release build on a shared
    // 2-core machine, up to 100 ms under load; the bound leaves room.
    if !cfg!(debug_assertions) {
        assert!(wall < 0.15, "{wall} s");
    }
}

/// The training order's third step is the steady state: a fifth step
/// lasts as long (a longer run of steps changes nothing).
#[test]
fn the_third_step_is_the_steady_state() {
    use crate::cost_model::streams::Work;
    for pod in ["v5e-16", "v4-128", MULTISLICE] {
        let topology = load_topology(pod).unwrap();
        for strategy in Strategy::ALL {
            for data_reduction in DataReduction::ALL {
                for (forward, params, bucket) in [
                    (1e-5, 5_000_000, 1 << 20),
                    (0.0, 300_000, 4096),
                    (1e-3, 20_000, 256),
                ] {
                    let options = StrategyOptions {
                        data_reduction,
                        order: StepOrder::Training,
                        prefetch: 2,
                        ..StrategyOptions::new(strategy, &topology)
                    };
                    let period = |steps: usize| {
                        let geometry = PodGeometry::of(&topology).unwrap();
                        let devices = geometry.chips * geometry.slices;
                        let runs = BucketRuns::new(params, DType::F32, bucket, devices).unwrap();
                        let mut costing = Costing::new(
                            &topology,
                            &options,
                            (
                                geometry.shape,
                                geometry.rail,
                                geometry.chips,
                                geometry.slices,
                            ),
                            (4, 2, false),
                        )
                        .unwrap();
                        let costs: Vec<LengthCost> = runs
                            .runs
                            .iter()
                            .map(|&(len, _)| costing.length(strategy, len, 0.0))
                            .collect();
                        let mut streams =
                            Streams::new(costing.phases.0.len(), costing.axes.0.len(), false);
                        streams.skip_empty = true;
                        let uses = Uses {
                            forward,
                            backward: 2.0 * forward,
                            between: forward,
                        };
                        let work = Work {
                            costs: &costs,
                            runs: &runs,
                        };
                        let window = (3, strategy == Strategy::Fsdp);
                        streams.pipelined(work, uses, window, steps)
                    };
                    let (third, fifth) = (period(STEADY_STEPS), period(5));
                    assert!(
                        (third - fifth).abs() <= 1e-9 * fifth,
                        "{pod} {strategy} {data_reduction:?} {forward}: {third} vs {fifth}"
                    );
                }
            }
        }
    }
}

proptest::proptest! {
    #[test]
    fn one_comm_stream_bounds_the_step_and_the_bytes_add_up(
        pod in 0usize..3,
        strategy in 0usize..3,
        data_choice in 0usize..3,
        prefetch in 0usize..4,
        redundant in proptest::bool::ANY,
        params in 1usize..200_000,
        bucket in 64usize..100_000,
        use_us in 0u32..5,
        after_backward in proptest::bool::ANY,
        training in proptest::bool::ANY,
        compute_type in proptest::bool::ANY,
    ) {
        let topology = load_topology(["v5e-16", "v4-128", MULTISLICE][pod]).unwrap();
        let phys = crate::sharding::mesh::physical_axes(&topology);
        let data: usize = phys.iter().take(data_choice.min(phys.len())).map(|p| p.1).product();
        let mesh = Mesh::lay_out(
            crate::sharding::MeshSizes::new(data, topology.num_devices() as usize / data, 1),
            &topology,
        );
        let Ok(mesh) = mesh else { return Ok(()) };
        let options_strategy = Strategy::ALL[strategy];
        let options = StrategyOptions {
            strategy: options_strategy,
            mesh,
            prefetch,
            recovery: if redundant { RecoveryPolicy::Redundant } else { RecoveryPolicy::Rollback },
            use_seconds: f64::from(use_us) * 1e-6,
            backward_use_seconds: Some(f64::from(use_us) * 2e-6),
            between_seconds: f64::from(use_us) * 1e-6,
            record_spans: false,
            data_reduction: if after_backward {
                DataReduction::AfterBackward
            } else {
                DataReduction::Overlapped
            },
            order: if training {
                StepOrder::Training
            } else {
                StepOrder::Optimizer
            },
            precision: (training && compute_type).then_some(Precision {
                compute: 2,
                ..Precision::uniform(4, 2)
            }),
            expert_share: 0.0,
        };
        let s = modeled_strategy_step(&topology, &tensors(&[params]), DType::F32, 2, bucket, &options).unwrap();
        // Waiting for the backward moves the reduction over data, not
        // its bytes, and never shortens the step.
        let other = StrategyOptions { data_reduction: DataReduction::Overlapped, ..options.clone() };
        let overlapped = modeled_strategy_step(&topology, &tensors(&[params]), DType::F32, 2, bucket, &other).unwrap();
        proptest::prop_assert_eq!(s.link_bytes, overlapped.link_bytes);
        proptest::prop_assert!(s.step_seconds * (1.0 + 1e-12) >= overlapped.step_seconds);
        // Every use, the compute between the passes and the updates
        // run on the compute stream: the step holds all of them.
        let uses = s.buckets as f64 * (options.use_seconds + options.backward())
            + options.between_seconds;
        proptest::prop_assert!((s.use_seconds - uses).abs() <= 1e-9 * uses.max(1e-9));
        proptest::prop_assert!(s.step_seconds * (1.0 + 1e-9) >= s.use_seconds + s.update_seconds);
        // Passes of a round share the stream but not the links: each
        // axis's links (and the DCN's) are busy at most the whole step.
        let slack = 1e-9 * s.step_seconds;
        for (axis, figures) in &s.axes {
            proptest::prop_assert!(
                s.step_seconds + slack >= figures.seconds,
                "{}: {} < {}", axis, s.step_seconds, figures.seconds
            );
        }
        proptest::prop_assert!(s.step_seconds + slack >= s.update_seconds + s.use_seconds);
        proptest::prop_assert_eq!(s.phase_bytes.values().sum::<u128>(), s.link_bytes);
        proptest::prop_assert_eq!(s.axes.values().map(|a| a.link_bytes).sum::<u128>(), s.link_bytes);
        proptest::prop_assert_eq!(s.memory.total(), s.hbm_bytes_per_device);
        // The predecessor's state shards, and under fsdp its parameter
        // shard (held nowhere else).
        let copied = s.memory.state
            + s.memory.master
            + if options_strategy == Strategy::Fsdp { s.memory.params } else { 0 };
        proptest::prop_assert_eq!(s.memory.redundant_state, if redundant { copied } else { 0 });
    }
}
