//! Host systems: an ambiguous batch is refused with both systems named,
//! and the pod goes on stepping.

use bevy_ecs::prelude::*;
use optirs_tpu::Pod;
use optirs_tpu::error::ErrorKind;
use optirs_tpu::schedule::{Step, StepSystems};

#[derive(Resource, Default)]
struct Counter(u64);

fn count_up(mut counter: ResMut<Counter>) {
    counter.0 += 1;
}

fn count_reset(mut counter: ResMut<Counter>) {
    counter.0 = 0;
}

#[test]
fn an_ambiguous_batch_is_an_error_naming_both_systems() {
    let mut pod = Pod::from_preset("v5e-16").unwrap();
    pod.world_mut().init_resource::<Counter>();
    pod.add_systems(count_up.in_set(StepSystems::Monitor))
        .unwrap();
    let error = pod
        .add_systems(count_reset.in_set(StepSystems::Monitor))
        .unwrap_err();
    assert!(error.kind() == ErrorKind::Schedule, "{error}");
    let message = error.to_string();
    assert!(
        message.contains("count_up") && message.contains("count_reset"),
        "{message}"
    );
    // The refused batch is gone: the pod steps with the first one only.
    pod.run(3);
    assert_eq!(pod.world().resource::<Counter>().0, 3);
    // Ordered, the same system is accepted.
    pod.add_systems(count_reset.after(count_up).in_set(StepSystems::Monitor))
        .unwrap();
    pod.step();
    assert_eq!(pod.world().resource::<Counter>().0, 0);
}

#[test]
fn validate_schedules_reports_systems_added_through_the_world() {
    let mut pod = Pod::from_preset("v5e-16").unwrap();
    pod.world_mut().init_resource::<Counter>();
    pod.validate_schedules().unwrap();
    pod.world_mut()
        .resource_mut::<bevy_ecs::schedule::Schedules>()
        .add_systems(Step, (count_up, count_reset).in_set(StepSystems::Monitor));
    let message = pod.validate_schedules().unwrap_err().to_string();
    assert!(
        message.contains("count_up") && message.contains("count_reset"),
        "{message}"
    );
}
