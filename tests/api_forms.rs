//! The host API as it reads at the call site: typed simulated times
//! (`SimDuration`) and step budgets (`Ticks`), device ids taken as
//! `DeviceId` or a bare number, barriers described by a `BarrierSpec`, and
//! parameter sets built from an iterator. Each compatibility form (a bare
//! `u64` of nanoseconds, a bare `u32` id, the world function's positional
//! barrier arguments) gives the world the typed form gives, digest for
//! digest.

use ndarray::{ArrayD, IxDyn};
use optirs_tpu::Pod;
use optirs_tpu::barrier::{self, BarrierOutcome, BarrierSpec};
use optirs_tpu::clock::{SimClock, SimDuration, SimDurationError, Ticks};
use optirs_tpu::error::ErrorKind;
use optirs_tpu::health::{Fault, Health};
use optirs_tpu::sharding::{ParamSet, ShardingError};
use optirs_tpu::topology::DeviceId;

fn pod() -> Pod {
    Pod::from_preset("v5e-16").unwrap()
}

#[test]
fn a_fault_scheduled_in_seconds_is_the_fault_scheduled_in_nanoseconds() {
    let mut typed = pod();
    typed.schedule_fault(SimDuration::from_secs(3), Fault::KillDevice(DeviceId(5)));
    let mut bare = pod();
    bare.schedule_fault(3_000_000_000, Fault::KillDevice(DeviceId(5)));
    let mut std_time = pod();
    std_time.schedule_fault(
        std::time::Duration::from_secs(3),
        Fault::KillDevice(DeviceId(5)),
    );
    for pod in [&mut typed, &mut bare, &mut std_time] {
        pod.run(1_500);
    }
    let digest = typed.world_sha256().unwrap();
    assert_eq!(bare.world_sha256().unwrap(), digest);
    assert_eq!(std_time.world_sha256().unwrap(), digest);

    // The records keep their nanosecond fields and read as durations.
    let record = typed.failures()[0];
    assert_eq!(record.injected_at(), Some(SimDuration::from_secs(3)));
    assert_eq!(record.detected_at().as_nanos(), record.detected_at_ns);
    assert_eq!(
        record.detection_delay(),
        Some(SimDuration::from_nanos(
            record.detected_at_ns - 3_000_000_000
        ))
    );
    let health = typed.health(DeviceId(5)).unwrap();
    assert_eq!(health.detected_at(), Some(record.detected_at()));
    assert_eq!(Health::Healthy.detected_at(), None);
    let json = serde_json::to_value(record).unwrap();
    assert_eq!(json["detected_at_ns"], record.detected_at_ns);
    assert_eq!(json["injected_at_ns"], 3_000_000_000u64);
}

#[test]
fn a_scheduled_fault_and_the_clock_read_as_durations() {
    let mut pod = pod();
    pod.schedule_fault(
        SimDuration::from_millis(1_500),
        Fault::PauseDevice(DeviceId(2)),
    );
    let plan = pod.world().resource::<optirs_tpu::health::FaultPlan>();
    assert_eq!(plan.pending[0].at(), SimDuration::from_millis(1_500));
    assert_eq!(plan.pending[0].at_ns, 1_500_000_000);
    pod.run(10);
    let clock = *pod.clock();
    assert_eq!(clock.now().as_nanos(), clock.now_ns);
    assert_eq!(clock.tick_length().as_nanos(), clock.tick_ns);
}

#[test]
fn advancing_to_a_typed_time_is_advancing_to_its_nanoseconds() {
    let mut typed = pod();
    let mut bare = pod();
    typed
        .advance_until(SimDuration::from_secs_f64(0.0125).unwrap(), |_| false)
        .unwrap();
    bare.advance_until(12_500_000, |_| false).unwrap();
    assert_eq!(typed.clock().now(), SimDuration::from_micros(12_500));
    assert_eq!(typed.world_sha256().unwrap(), bare.world_sha256().unwrap());
}

#[test]
fn seconds_without_a_nanosecond_count_are_a_typed_error() {
    for (secs, want) in [
        (f64::NAN, "finite"),
        (-1.0, "negative"),
        (1e12, "longest simulated time"),
    ] {
        let error = SimDuration::from_secs_f64(secs).unwrap_err();
        assert!(error.to_string().contains(want), "{error}");
        let error = optirs_tpu::OptimError::from(error);
        assert_eq!(error.kind(), ErrorKind::InvalidConfig);
        assert!(error.downcast_ref::<SimDurationError>().is_some());
    }
}

#[test]
fn a_step_budget_is_ticks_and_a_bare_count_still_converts() {
    let mut typed = pod();
    let mut bare = pod();
    let ten = |world: &bevy_ecs::world::World| world.resource::<SimClock>().tick == 10;
    assert_eq!(typed.run_until(Ticks(100), ten), Some(10));
    assert_eq!(bare.run_until(100, ten), Some(10));
    assert_eq!(typed.run_until(Ticks(3), |_| false), None);
    assert_eq!(bare.run_until(3, |_| false), None);
    assert_eq!(typed.clock().tick, bare.clock().tick);
}

#[test]
fn device_ids_are_taken_typed_or_bare() {
    let mut typed = pod();
    let mut bare = pod();
    assert_eq!(
        typed.device_entity(DeviceId(4)).unwrap(),
        bare.device_entity(4).unwrap()
    );
    assert_eq!(
        typed.send_data(DeviceId(0), DeviceId(5), 1 << 20).unwrap(),
        bare.send_data(0, 5, 1 << 20).unwrap()
    );
    typed.set_device_clock(DeviceId(3), -2_000, 1.5).unwrap();
    bare.set_device_clock(3, -2_000, 1.5).unwrap();
    typed.kill_device(DeviceId(7)).unwrap();
    bare.kill_device(7).unwrap();
    typed.run(1_500);
    bare.run(1_500);
    assert!(typed.health(DeviceId(7)).unwrap().is_failed());
    assert_eq!(typed.health(DeviceId(7)), bare.health(7));
    assert_eq!(typed.clock_estimate(DeviceId(3)), bare.clock_estimate(3));
    assert_eq!(typed.world_sha256().unwrap(), bare.world_sha256().unwrap());
    // An id the pod does not have is the same error either way.
    let typed_error = typed.device_entity(DeviceId(99)).unwrap_err().to_string();
    assert_eq!(typed_error, bare.device_entity(99).unwrap_err().to_string());
    assert!(typed_error.contains("device 99"), "{typed_error}");
}

#[test]
fn a_barrier_spec_is_the_positional_barrier() {
    let mut spec = pod();
    let mut positional = pod();
    let id = spec
        .create_barrier(
            BarrierSpec::named("step-0")
                .participants([3, 1, 2, 1])
                .timeout(SimDuration::from_secs(5))
                .auto_arrive(),
        )
        .unwrap();
    let same = barrier::create_barrier(
        positional.world_mut(),
        "step-0",
        Some(vec![DeviceId(1), DeviceId(2), DeviceId(3)]),
        Some(5_000_000_000),
        true,
    )
    .unwrap();
    assert_eq!(id, same);
    let (a, b) = (
        spec.wait_for_barrier(id).unwrap(),
        positional.wait_for_barrier(same).unwrap(),
    );
    assert_eq!(a, b);
    assert!(matches!(a, BarrierOutcome::Completed { .. }));
    assert_eq!(
        spec.world_sha256().unwrap(),
        positional.world_sha256().unwrap()
    );
    assert!(a.finished_at().is_some());
    assert_eq!(BarrierOutcome::Pending.finished_at(), None);
}

#[test]
fn a_named_barrier_is_every_device_arrived_at_by_the_host_with_the_default_timeout() {
    let mut pod = pod();
    let id = pod.create_barrier("manual").unwrap();
    let entity = pod.world().resource::<barrier::BarrierRegistry>().by_id[id as usize];
    let created = pod.world().get::<barrier::Barrier>(entity).unwrap().clone();
    assert_eq!(created.participants.len(), 16);
    assert!(!created.auto_arrive);
    assert_eq!(
        created.deadline_at(),
        created.started_at() + SimDuration::from_nanos(barrier::DEFAULT_TIMEOUT_NS)
    );
    // Nobody arrives: the wait ends at the deadline.
    let BarrierOutcome::Failed(failure) = pod.wait_for_barrier(id).unwrap() else {
        panic!("a barrier nobody arrives at fails at its deadline");
    };
    assert_eq!(failure.at(), created.deadline_at());
    assert_eq!(failure.stragglers.len(), 16);
    // A std duration is a timeout too, and a spec from a String is its name.
    let again = pod
        .create_barrier(
            BarrierSpec::from("manual".to_string()).timeout(std::time::Duration::from_millis(20)),
        )
        .unwrap();
    assert_eq!(again, id);
    let BarrierOutcome::Failed(failure) = pod.wait_for_barrier(again).unwrap() else {
        panic!("a barrier nobody arrives at fails at its deadline");
    };
    assert_eq!(failure.generation, 1);
}

#[test]
fn a_barrier_spec_refuses_what_the_positional_form_refuses() {
    let mut pod = pod();
    let error = pod
        .create_barrier(BarrierSpec::named("none").participants(Vec::<DeviceId>::new()))
        .unwrap_err();
    assert!(error.to_string().contains("no participants"), "{error}");
    let error = pod
        .create_barrier(BarrierSpec::named("far").participants([40]))
        .unwrap_err();
    assert!(error.to_string().contains("device 40"), "{error}");
}

#[test]
fn a_param_set_from_an_iterator_is_the_set_built_tensor_by_tensor() {
    let w = ArrayD::from_elem(IxDyn(&[4, 3]), 0.5f32);
    let b = ArrayD::from_elem(IxDyn(&[3]), -1.0f32);
    let from_iter = ParamSet::try_from_iter([("w", w.clone()), ("b", b.clone())]).unwrap();
    let chained = ParamSet::new()
        .with("w", w.clone())
        .unwrap()
        .with("b", b)
        .unwrap();
    assert_eq!(from_iter, chained);
    // Owned names and a transposed (non-standard layout) tensor.
    let transposed = ParamSet::try_from_iter(vec![(String::from("wt"), w.t().to_owned())]).unwrap();
    assert_eq!(transposed.get("wt").unwrap().shape(), &[3, 4]);
    assert_eq!(
        transposed.to_flat(),
        w.t().iter().copied().collect::<Vec<_>>()
    );
}

#[test]
fn one_bad_tensor_is_one_error_naming_it() {
    let ok = ArrayD::from_elem(IxDyn(&[2]), 1.0f32);
    let empty = ArrayD::<f32>::zeros(IxDyn(&[3, 0]));
    let error = ParamSet::try_from_iter([
        ("first", ok.clone()),
        ("hollow", empty.clone()),
        ("last", ok.clone()),
    ])
    .unwrap_err();
    let mut by_insert = ParamSet::new();
    by_insert.insert("first", ok.clone()).unwrap();
    let insert_error = by_insert.insert("hollow", empty).unwrap_err();
    assert_eq!(error.to_string(), insert_error.to_string());
    assert!(
        matches!(&error, ShardingError::EmptyTensor { name, shape } if name == "hollow" && shape == &[3, 0]),
        "{error}"
    );
    assert!(error.to_string().contains("`hollow`"), "{error}");

    let error = ParamSet::try_from_iter([("w", ok.clone()), ("w", ok)]).unwrap_err();
    assert!(
        matches!(&error, ShardingError::DuplicateTensor { name } if name == "w"),
        "{error}"
    );
}
