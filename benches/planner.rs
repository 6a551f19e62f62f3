//! What modeling costs: the closed-form strategy step, a transformer's
//! whole step and `goodput`'s default step at 10⁶ and 10¹⁸ parameters
//! (and a transformer of 2²⁴ layers). The schedules jump over runs of
//! equal buckets, so each pair should take the same time.
//!
//! And `plan`'s whole search (every layout of a pod, pruned and
//! exhaustive): its layouts a second are the space's layouts over the
//! time.
//!
//! `cargo bench --bench planner`.

use criterion::{Criterion, criterion_group, criterion_main};
use optirs_tpu::cost_model::{StepOrder, StrategyOptions, modeled_strategy_step};
use optirs_tpu::goodput::modeled_step_seconds;
use optirs_tpu::ir::DType;
use optirs_tpu::model::bundled;
use optirs_tpu::sharding::{RecoveryPolicy, Strategy};
use optirs_tpu::step_model::{ModelStepOptions, model_step};
use optirs_tpu::topology::load_preset;
use std::hint::black_box;

fn strategy_steps(c: &mut Criterion) {
    let topology = load_preset("v5e-16").unwrap();
    let mut group = c.benchmark_group("planner::strategy_step");
    for params in [1_000_000usize, 1_000_000_000_000_000_000] {
        for (name, strategy, order) in [
            ("replicated", Strategy::Replicated, StepOrder::Optimizer),
            ("fsdp-training", Strategy::Fsdp, StepOrder::Training),
        ] {
            let options = StrategyOptions {
                order,
                use_seconds: 1e-3,
                ..StrategyOptions::new(strategy, &topology)
            };
            let tensors = [("params".to_string(), vec![params])];
            group.bench_function(format!("{name}/{params:e}"), |b| {
                b.iter(|| {
                    modeled_strategy_step(
                        black_box(&topology),
                        &tensors,
                        DType::F32,
                        2,
                        25 << 20,
                        &options,
                    )
                    .unwrap()
                })
            });
        }
    }
    group.finish();
}

fn model_steps(c: &mut Criterion) {
    let topology = load_preset("v5p-256").unwrap();
    let mut group = c.benchmark_group("planner::model_step");
    let mut config = bundled("llama2-7b").unwrap();
    for layers in [32u64, 1 << 24] {
        config.layers = layers;
        let options = ModelStepOptions::new(&topology);
        group.bench_function(format!("llama2-7b/{layers}-layers"), |b| {
            b.iter(|| model_step(black_box(&config), &topology, &options).unwrap())
        });
    }
    group.finish();
}

fn goodput_steps(c: &mut Criterion) {
    let topology = load_preset("v5e-256").unwrap();
    let mut group = c.benchmark_group("planner::goodput_default_step");
    for params in [1_000_000u64, 1_000_000_000_000_000_000] {
        group.bench_function(format!("{params:e}"), |b| {
            b.iter(|| {
                modeled_step_seconds(black_box(&topology), params, 2, RecoveryPolicy::Rollback)
                    .unwrap()
            })
        });
    }
    group.finish();
}

fn searches(c: &mut Criterion) {
    use optirs_tpu::plan::{PlanRequest, SearchSpace, plan};
    use optirs_tpu::topology::parse_topology;
    let mut group = c.benchmark_group("planner::search");
    group.sample_size(10);
    let v5p = parse_topology(
        r#"Pod(name: "v5p-12288", generation: "v5p", shape: "16x16x24")"#,
        "v5p-12288.ron",
    )
    .unwrap();
    let cases = [
        ("gpt3-175b", v5p),
        ("maxtext-v5e-32b", load_preset("v5e-256").unwrap()),
        ("llama2-7b", load_preset("v5p-256").unwrap()),
    ];
    for (model, topology) in &cases {
        let config = bundled(model).unwrap();
        let space = SearchSpace::every(&config);
        for prune in [true, false] {
            let request = PlanRequest {
                config: &config,
                topology,
                space: &space,
                base: ModelStepOptions::new(topology),
                keep: 10,
                prune,
                ceiling: None,
            };
            let layouts = plan(&request).layouts;
            let name = format!(
                "{model}/{}/{}-layouts",
                if prune { "pruned" } else { "exhaustive" },
                layouts
            );
            group.bench_function(name, |b| b.iter(|| plan(black_box(&request))));
        }
    }
    group.finish();
}

criterion_group!(
    benches,
    strategy_steps,
    model_steps,
    goodput_steps,
    searches
);
criterion_main!(benches);
