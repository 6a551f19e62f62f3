//! The sharded pod optimizer: a real-data step against the unsharded
//! `TPUOptimizer` step on the same parameters, the closed-form model of a
//! 175e9-parameter step on an 8960-chip v5p pod, and the pod tick with an
//! idle model attached against the bare tick.
//!
//! `cargo bench --bench sharding` (`SHARDING_PARAMS` and `SHARDING_POD`
//! change the real-data case; the default is 1e7 parameters on v4-128).
//! `sharded` makes and reduces every replica's gradient (64 on v4-128);
//! `sharded-reduced` takes one host-reduced gradient, as the unsharded
//! step does, under each strategy (`SHARDING_STRATEGIES`, a comma list;
//! all three by default): the arithmetic is the same, only residency and
//! the modeled collectives differ.

use criterion::{Criterion, criterion_group, criterion_main};
use ndarray::{Array1, ArrayD, IxDyn};
use optirs_tpu::cost_model::modeled_step;
use optirs_tpu::optimizers::Adam;
use optirs_tpu::sharding::{ParamSet, Strategy, SyntheticGradients};
use optirs_tpu::topology::parse_topology;
use optirs_tpu::tpu::{ShardedOptimizer, ShardingConfig};
use optirs_tpu::{Pod, TPUConfig, TPUOptimizer};
use std::hint::black_box;

fn config_for(pod: &Pod) -> TPUConfig {
    TPUConfig::for_pod(pod.topology())
}

/// Ten tensors summing to `total` elements.
fn model(total: usize) -> ParamSet<f32> {
    let mut set = ParamSet::new();
    let mut left = total;
    for i in 0..10 {
        let n = if i == 9 { left } else { total / 10 + i * 7 };
        left -= n;
        set.insert(format!("t{i}"), ArrayD::from_elem(IxDyn(&[n]), 0.01f32))
            .unwrap();
    }
    set
}

fn real_data(c: &mut Criterion) {
    let total: usize = std::env::var("SHARDING_PARAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let preset = std::env::var("SHARDING_POD").unwrap_or_else(|_| "v4-128".into());
    let mut group = c.benchmark_group("sharding::step");
    group.sample_size(10);
    let pod = Pod::from_preset(&preset).unwrap();
    let config = config_for(&pod);
    let replicas = pod.topology().num_devices() as usize;
    let mut sharded = ShardedOptimizer::on_pod(
        Adam::new(1e-3f32),
        pod,
        model(total),
        ShardingConfig::default(),
    )
    .unwrap();
    let mut step = 0;
    group.bench_function(format!("sharded/adam/{total}/{preset}"), |b| {
        b.iter(|| {
            step += 1;
            let grads = SyntheticGradients {
                seed: 1,
                step,
                replicas,
                scale: 1e-2,
            };
            sharded.step(&grads).unwrap()
        })
    });
    drop(sharded);
    let reduced = model(total);
    let strategies: Vec<Strategy> = std::env::var("SHARDING_STRATEGIES")
        .ok()
        .map(|v| v.split(',').map(|s| s.parse().unwrap()).collect())
        .unwrap_or_else(|| Strategy::ALL.to_vec());
    for strategy in strategies {
        let mut sharded = ShardedOptimizer::on_pod(
            Adam::new(1e-3f32),
            Pod::from_preset(&preset).unwrap(),
            model(total),
            ShardingConfig {
                strategy,
                ..ShardingConfig::default()
            },
        )
        .unwrap();
        let name = match strategy {
            Strategy::Replicated => format!("sharded-reduced/adam/{total}/{preset}"),
            other => format!("sharded-reduced-{other}/adam/{total}/{preset}"),
        };
        group.bench_function(name, |b| {
            b.iter(|| sharded.step_reduced(black_box(&reduced)).unwrap())
        });
    }
    let mut unsharded = TPUOptimizer::new(Adam::new(1e-3f32), config).unwrap();
    let mut params = Array1::from_elem(total, 0.01f32);
    let grads = Array1::from_elem(total, 1e-3f32);
    group.bench_function(format!("unsharded/adam/{total}"), |b| {
        b.iter(|| {
            unsharded
                .tpu_step_in_place(&mut params, black_box(&grads))
                .unwrap()
        })
    });
    group.finish();
}

fn modeled(c: &mut Criterion) {
    let topology = parse_topology(
        "Pod(name: \"v5p-8960\", generation: \"v5p\", shape: \"16x20x28\", custom: true)",
        "v5p-8960",
    )
    .unwrap();
    let tensors = vec![("params".to_string(), vec![175_000_000_000usize])];
    let mut group = c.benchmark_group("cost_model::replicated");
    group.bench_function("adam/175e9/v5p-8960", |b| {
        b.iter(|| {
            modeled_step(
                black_box(&topology),
                &tensors,
                optirs_tpu::ir::DType::F32,
                2,
                25 << 20,
            )
            .unwrap()
        })
    });
    group.finish();
}

fn idle_tick(c: &mut Criterion) {
    let mut group = c.benchmark_group("sharding::idle_tick");
    let mut bare = Pod::from_preset("v5e-16").unwrap();
    group.bench_function("v5e-16/bare", |b| b.iter(|| bare.step()));
    let pod = Pod::from_preset("v5e-16").unwrap();
    let mut idle = ShardedOptimizer::on_pod(
        Adam::new(1e-3f32),
        pod,
        model(1 << 20),
        ShardingConfig::default(),
    )
    .unwrap();
    idle.step(&SyntheticGradients {
        seed: 1,
        step: 1,
        replicas: 16,
        scale: 1e-2,
    })
    .unwrap();
    group.bench_function("v5e-16/idle-model", |b| b.iter(|| idle.pod_mut().step()));
    group.finish();
}

criterion_group!(benches, modeled, idle_tick, real_data);
criterion_main!(benches);
