//! The host API: building, stepping and reading a pod.

use bevy_ecs::prelude::*;
use optirs_tpu::Pod;
use optirs_tpu::pod::{SimClock, Ticks};
use optirs_tpu::schedule::{Step, StepSystems, deterministic_schedule};

#[test]
fn step_advances_simulated_time_by_one_tick() {
    let mut pod = Pod::from_preset("v4-16").unwrap();
    let tick_ns = pod.topology().tick_ns;
    assert_eq!(*pod.clock(), SimClock::new(tick_ns));
    pod.step();
    assert_eq!((pod.clock().tick, pod.clock().now_ns), (1, tick_ns));
    pod.run(9);
    assert_eq!((pod.clock().tick, pod.clock().now_ns), (10, 10 * tick_ns));
}

#[test]
fn tick_length_comes_from_the_pod_file() {
    let mut pod = Pod::from_ron_str(
        "Pod(name: \"t\", generation: \"v5e\", shape: \"2x2\", tick_ms: 2.5)",
        "t",
    )
    .unwrap();
    pod.run(4);
    assert_eq!(pod.clock().now_ns, 10_000_000);
    assert_eq!(pod.clock().now_seconds(), 0.01);
}

#[test]
fn run_until_stops_when_the_condition_holds() {
    let mut pod = Pod::from_preset("v5e-16").unwrap();
    let ran = pod.run_until(Ticks(1000), |world| world.resource::<SimClock>().tick >= 7);
    assert_eq!(ran, Some(7));
    assert_eq!(pod.clock().tick, 7);
    let never = pod.run_until(Ticks(5), |_| false);
    assert_eq!(never, None);
    assert_eq!(pod.clock().tick, 12);
}

#[test]
fn the_same_pod_file_builds_the_same_world() {
    let (mut a, mut b) = (
        Pod::from_preset("v5p-256").unwrap(),
        Pod::from_preset("v5p-256").unwrap(),
    );
    a.run(33);
    b.run(33);
    assert_eq!(a.clock(), b.clock());
    assert_eq!(a.figures(), b.figures());
    let entities = |pod: &Pod| pod.world().entities().count_spawned();
    assert_eq!(entities(&a), entities(&b));
}

#[derive(Resource, Default)]
struct Counter(u32);

fn bump(mut counter: ResMut<Counter>) {
    counter.0 += 1;
}

fn double(mut counter: ResMut<Counter>) {
    counter.0 *= 2;
}

#[test]
fn an_ambiguous_system_order_fails_the_schedule_build() {
    let mut world = World::new();
    world.init_resource::<Counter>();
    let mut schedule = deterministic_schedule(Step);
    schedule.add_systems((bump, double).in_set(StepSystems::Monitor));
    let Err(error) = schedule.initialize(&mut world) else {
        panic!("an ambiguous order must not build");
    };
    let message = error.to_string(schedule.graph(), &world);
    assert!(
        message.contains("bump") && message.contains("double"),
        "{message}"
    );

    // Ordered, the same systems build and run deterministically.
    let mut ordered = deterministic_schedule(Step);
    ordered.add_systems((bump, double).chain());
    ordered.initialize(&mut world).unwrap();
    ordered.run(&mut world);
    assert_eq!(world.resource::<Counter>().0, 2);
}

#[test]
fn hosts_can_add_their_own_systems_to_the_step() {
    let mut pod = Pod::from_preset("v4-16").unwrap();
    pod.world_mut().init_resource::<Counter>();
    pod.world_mut().schedule_scope(Step, |_, schedule| {
        schedule.add_systems(bump.in_set(StepSystems::Monitor));
    });
    pod.run(3);
    assert_eq!(pod.world().resource::<Counter>().0, 3);
}

#[test]
fn every_step_set_has_a_system() {
    use bevy_ecs::schedule::{Schedules, SystemSet};
    use optirs_tpu::schedule::STEP_SETS;
    let pod = optirs_tpu::Pod::from_preset("v4-16").unwrap();
    let schedules = pod.world().resource::<Schedules>();
    let step = schedules.get(Step).unwrap();
    for set in STEP_SETS {
        let systems = step.graph().systems_in_set(set.intern()).unwrap();
        assert!(!systems.is_empty(), "StepSystems::{set:?} has no system");
    }
}
