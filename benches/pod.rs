//! Pod construction and the `Step` schedule.
//!
//! `cargo bench --bench pod`

use criterion::{Criterion, criterion_group, criterion_main};
use optirs_tpu::Pod;
use optirs_tpu::topology::{load_preset, parse_topology, preset_text};
use std::hint::black_box;

fn load(c: &mut Criterion) {
    let mut group = c.benchmark_group("pod::load");
    let text = preset_text("v4-8192").unwrap();
    group.bench_function("parse_validate/v4-8192", |b| {
        b.iter(|| parse_topology(black_box(&text), "v4-8192").unwrap())
    });
    let topology = load_preset("v4-8192").unwrap();
    group.bench_function("spawn/v4-8192", |b| {
        b.iter(|| Pod::from_topology(black_box(topology.clone())).unwrap())
    });
    group.bench_function("parse_validate_spawn/v4-8192", |b| {
        b.iter(|| Pod::from_preset(black_box("v4-8192")).unwrap())
    });
    group.sample_size(10);
    group.bench_function("figures/v4-8192", |b| {
        let mut pod = Pod::from_preset("v4-8192").unwrap();
        b.iter(|| pod.figures())
    });
    group.finish();
}

fn step(c: &mut Criterion) {
    let mut group = c.benchmark_group("pod::step");
    for preset in ["v4-16", "v5e-256", "v4-8192"] {
        let mut pod = Pod::from_preset(preset).unwrap();
        group.bench_function(preset, |b| b.iter(|| pod.step()));
    }
    group.finish();
}

/// The `Step` of v4-8192 with the profiler's system timer subscribed and
/// recording: the cost of per-system timing (compare with `pod::step`,
/// where bevy's system spans are disabled).
fn step_timed(c: &mut Criterion) {
    use optirs_tpu::xla::backend::system_timer::SystemTimer;
    let mut group = c.benchmark_group("pod::step_timed");
    let timer = SystemTimer::new();
    let mut pod = timer.scope(|| Pod::from_preset("v4-8192")).unwrap();
    timer.set_recording(true);
    group.bench_function("v4-8192", |b| {
        b.iter(|| {
            pod.step();
            timer.take().len()
        })
    });
    group.finish();
}

criterion_group!(benches, load, step, step_timed);
criterion_main!(benches);
