//! The mesh's `stage` axis in a transformer's modeled step
//! (`optirs_tpu::step_model::pipeline`): the bubble against its closed form
//! `(P−1)/(R·M+P−1)`, the schedule slot by slot, the permutes on the stage
//! axis's links (ICI or DCN), a stage's HBM, and the refusals.

use optirs_tpu::model::{ModelConfig, bundled};
use optirs_tpu::sharding::{Mesh, MeshAxisName, Strategy};
use optirs_tpu::step_model::{
    ModelStep, ModelStepOptions, PipelineOptions, StepModelError, model_step,
};
use optirs_tpu::topology::{Topology, parse_topology};
use proptest::prelude::*;

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
    (microbatches, repeats): (Option<usize>, Option<usize>),
) -> Result<ModelStep, StepModelError> {
    let options = ModelStepOptions {
        mesh: Mesh::parse_split(mesh, topology).unwrap(),
        strategy: Strategy::Fsdp,
        pipeline: PipelineOptions {
            microbatches,
            repeats,
        },
        ..ModelStepOptions::new(topology)
    };
    model_step(config, topology, &options)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// The bubble is the closed form's share of the pipelined passes, every
    /// stage idles `P − 1` iterations a pass, and microbatch `m` of round
    /// `r` reaches stage `s` at forward iteration `r·M + m + s`.
    #[test]
    fn the_bubble_and_the_schedule_are_the_closed_forms(
        stages in prop_oneof![Just(4usize), Just(8)],
        per_stage in prop_oneof![Just(1usize), Just(2), Just(4)],
        repeats in prop_oneof![Just(1usize), Just(2), Just(5)],
    ) {
        let topology = v5p_4x8x8();
        let config = bundled("llama2-70b").unwrap(); // 80 layers
        let m = stages * per_stage;
        let mesh = format!("stage={stages},fsdp=-1");
        let s = step(&config, &topology, &mesh, (Some(m), Some(repeats))).unwrap();
        let p = s.pipeline.unwrap();
        let (pp, r, mm) = (stages as f64, repeats as f64, m as f64);
        let closed = (pp - 1.0) / (r * mm + pp - 1.0);
        prop_assert!((p.bubble_fraction - closed).abs() < 1e-15);
        let pipelined = p.iteration_seconds * r * mm;
        let share = p.bubble_seconds / (pipelined + p.bubble_seconds);
        prop_assert!((share - closed).abs() < 1e-12, "{} vs {}", share, closed);
        prop_assert_eq!(p.layers_per_stage, 80 / stages as u64);
        let slots = p.schedule();
        prop_assert_eq!(slots.len(), 2 * stages * repeats * m);
        for stage in 0..stages {
            let forward: Vec<_> = slots.iter().filter(|x| x.stage == stage && !x.backward).collect();
            prop_assert_eq!(forward.len(), repeats * m);
            for x in &forward {
                let t = (x.start_seconds / (p.forward_iteration_seconds + p.permute.seconds)).round() as usize;
                prop_assert_eq!(t, x.repeat * m + x.microbatch + stage);
            }
        }
        // The rates are over the whole model's tokens and FLOPs.
        prop_assert!((s.tokens_per_device - config.tokens_per_device()).abs() < 1e-9);
        prop_assert!(s.mfu <= s.hardware_utilization + 1e-12);
        prop_assert!(s.hardware_utilization <= s.efficiency + 1e-12);
    }
}

#[test]
fn a_stage_holds_its_layers_and_the_pipeline_costs_its_bubble() {
    let topology = v5p_4x8x8();
    let config = bundled("llama2-70b").unwrap();
    let flat = step(&config, &topology, "fsdp=-1", (None, None)).unwrap();
    let piped = step(&config, &topology, "stage=4,fsdp=-1", (Some(16), None)).unwrap();
    let p = piped.pipeline.unwrap();
    assert_eq!((p.stages, p.microbatches, p.repeats), (4, 16, 1));
    // The layers' FLOPs per device are the same (the stage's devices run
    // every sequence through a quarter of the layers); the model FLOPs
    // per device are the model's.
    let layer =
        |s: &ModelStep, layers: f64| (s.layer.forward.flops + s.layer.backward.flops) * layers;
    let ratio = layer(&piped, 20.0) / layer(&flat, 80.0);
    assert!((ratio - 1.0).abs() < 1e-9, "{ratio}");
    assert_eq!(piped.model_flops_per_device, flat.model_flops_per_device);
    // A stage holds a quarter of the layers, sharded over a quarter of the
    // devices: the same state a device, but for the embedding every stage
    // holds (under 3 % more here).
    let state = |s: &ModelStep| (s.hbm.params + s.hbm.grads + s.hbm.state) as f64;
    let more = state(&piped) / state(&flat) - 1.0;
    assert!((0.0..0.03).contains(&more), "{more}");
    assert!(piped.hbm.pipeline_buffers > 0 && flat.hbm.pipeline_buffers == 0);
    // One layer's backward works on one microbatch at a time: 4·T/16 tokens
    // against the flat step's T.
    assert!(piped.hbm.layer_working < flat.hbm.layer_working / 2);
    // The step pays the bubble and the permutes over the flat step's work.
    assert!(piped.step_seconds >= flat.step_seconds - 0.01 * flat.step_seconds);
    assert!(piped.step_seconds >= p.bubble_seconds + p.permute_seconds);
    assert_eq!(piped.phases["pipeline_bubble"], p.bubble_seconds);
    // More microbatches, a smaller bubble: never slower.
    let more = step(&config, &topology, "stage=4,fsdp=-1", (Some(32), None)).unwrap();
    assert!(more.pipeline.unwrap().bubble_seconds < p.bubble_seconds);
}

#[test]
fn stages_over_the_dcn_permute_on_the_rails() {
    let topology = parse_topology(
        "Pod(name: \"m\", generation: \"v5e\", shape: \"16x16\", slices: 4, \
         dcn: (latency_us: 10.0, host_gb_per_s: 12.5, oversubscription: 1.0))",
        "m.ron",
    )
    .unwrap();
    let config = bundled("maxtext-v5e-32b").unwrap();
    let mesh = Mesh::parse_split("stage=4,fsdp=-1", &topology).unwrap();
    assert!(mesh.crosses_slices(MeshAxisName::Stage), "{mesh}");
    let s = step(&config, &topology, "stage=4,fsdp=-1", (Some(8), None)).unwrap();
    let p = s.pipeline.unwrap();
    // Each host's 8 chips send a microbatch's activations to the next
    // slice, its one destination: the whole NIC (a rail is the NIC shared
    // by the 3 other slices).
    assert_eq!(topology.num_hosts(), 128);
    let chips_per_host = 8.0;
    let microbatch = config.tokens_per_device() * 4.0 / 8.0 * config.embed as f64 * 2.0;
    let closed = 10e-6 + chips_per_host * microbatch / 12.5e9;
    assert!(
        (p.permute.seconds - closed).abs() <= 1e-9 * closed,
        "{} vs {closed}",
        p.permute.seconds
    );
    assert!((p.permute_seconds - 2.0 * (8.0 + 3.0) * closed).abs() <= 1e-9 * closed * 22.0);
}

#[test]
fn a_pipeline_the_model_cannot_take_is_refused_naming_the_field() {
    let topology = v5p_4x8x8();
    let config = bundled("llama2-70b").unwrap();
    let field = |mesh: &str, schedule| match step(&config, &topology, mesh, schedule) {
        Err(StepModelError::Field { field, problem, .. }) => (field, problem),
        other => panic!("{mesh}: {:?}", other.map(|s| s.step_seconds)),
    };
    let (f, why) = field("stage=4,fsdp=-1", (Some(6), None));
    assert_eq!(f, "microbatches");
    assert!(why.contains("multiple of 4"), "{why}");
    let (f, _) = field("stage=4,fsdp=-1", (Some(0), None));
    assert_eq!(f, "microbatches");
    let (f, why) = field("stage=4,fsdp=-1", (None, Some(3)));
    assert_eq!(f, "layers");
    assert!(why.contains("80 is not a multiple of 12"), "{why}");
    let (f, _) = field("stage=4,fsdp=-1", (None, Some(0)));
    assert_eq!(f, "repeats");
    let (f, why) = field("fsdp=-1", (Some(4), None));
    assert_eq!(f, "microbatches");
    assert!(why.contains("no stage axis"), "{why}");
    let (f, _) = field("fsdp=-1", (None, Some(2)));
    assert_eq!(f, "repeats");
    let small = ModelConfig {
        layers: 2,
        ..config.clone()
    };
    match step(&small, &topology, "stage=4,fsdp=-1", (None, None)) {
        Err(StepModelError::Field { field, problem, .. }) => {
            assert_eq!(field, "layers");
            assert!(problem.contains("more stages than"), "{problem}");
        }
        other => panic!("{:?}", other.map(|s| s.step_seconds)),
    }
}
