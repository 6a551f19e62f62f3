//! A host application that owns a pod and steps it from its own loop,
//! adding one system of its own to the `Step` schedule.
//!
//! `cargo run --release --example host_app -- v5e-256`

use bevy_ecs::prelude::*;
use optirs_tpu::Pod;
use optirs_tpu::pod::SimClock;
use optirs_tpu::schedule::{Step, StepSystems};

/// The host's own bookkeeping, updated by a system inside the pod's tick.
#[derive(Resource, Default)]
struct SimulatedSecondsSeen(u64);

fn count_whole_seconds(clock: Res<SimClock>, mut seen: ResMut<SimulatedSecondsSeen>) {
    seen.0 = clock.now_ns / 1_000_000_000;
}

fn main() -> optirs_tpu::Result<()> {
    let preset = std::env::args().nth(1).unwrap_or_else(|| "v5e-16".into());
    let mut pod = Pod::load(&preset)?;
    pod.world_mut().init_resource::<SimulatedSecondsSeen>();
    pod.world_mut().schedule_scope(Step, |_, schedule| {
        schedule.add_systems(count_whole_seconds.in_set(StepSystems::Monitor));
    });

    let figures = pod.figures();
    println!(
        "{}: {} chips, {} links, diameter {} hops",
        figures.name,
        figures.devices,
        figures.links,
        figures.diameter_hops.unwrap_or(0)
    );
    // The host decides when to stop: here, after 5 simulated seconds.
    while pod.world().resource::<SimulatedSecondsSeen>().0 < 5 {
        pod.step();
        if pod.clock().tick % 100 == 0 {
            println!(
                "tick {:>4}  t = {:.2} s",
                pod.clock().tick,
                pod.clock().now_seconds()
            );
        }
    }
    println!(
        "stopped at tick {} ({:.2} s simulated)",
        pod.clock().tick,
        pod.clock().now_seconds()
    );
    Ok(())
}
