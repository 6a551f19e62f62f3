//! Heartbeats, fault detection and barriers on the 4096-chip v4 pod.
//!
//! `cargo bench --bench coordination`

use criterion::{Criterion, criterion_group, criterion_main};
use optirs_tpu::Pod;
use optirs_tpu::barrier::BarrierSpec;
use optirs_tpu::clock::SimDuration;
use optirs_tpu::coordination::{PodConfig, PodCoordinator};
use optirs_tpu::health::Fault;
use optirs_tpu::topology::DeviceId;

fn step_with_coordination(c: &mut Criterion) {
    let mut group = c.benchmark_group("pod::step_coordination");
    // Heartbeats and detection every tick, plus a barrier that stays pending
    // (one participant is paused, the deadline is far away).
    let mut pod = Pod::from_preset("v4-8192").unwrap();
    pod.inject(Fault::PauseDevice(DeviceId(4095))).unwrap();
    pod.create_barrier(
        BarrierSpec::named("pending")
            .timeout(SimDuration::from_nanos(u64::MAX / 2))
            .auto_arrive(),
    )
    .unwrap();
    pod.run(5);
    group.bench_function("v4-8192/heartbeats+detection+barrier", |b| {
        b.iter(|| pod.step())
    });
    group.finish();
}

fn synchronize(c: &mut Criterion) {
    let mut group = c.benchmark_group("coordination::synchronize_devices");
    for devices in [8usize, 256, 4096] {
        let mut pod = PodCoordinator::new(PodConfig {
            num_devices: devices,
            ..Default::default()
        })
        .unwrap();
        let mut round = 0u64;
        group.bench_function(format!("{devices}"), |b| {
            b.iter(|| {
                round += 1;
                pod.synchronize_devices(format!("step-{round}")).unwrap()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, step_with_coordination, synchronize);
criterion_main!(benches);
