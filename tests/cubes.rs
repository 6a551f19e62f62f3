//! Cube-built pods (`cubes: (spares: N)`): cubes, optical circuit switches,
//! the loader's errors, a failed chip failing its cube, and the spare-cube
//! recovery of a sharded model.

use bevy_ecs::prelude::*;
use ndarray::{ArrayD, IxDyn};
use optirs_tpu::health::cubes::{spare_cubes, swap_in_spares};
use optirs_tpu::health::{Fault, Health};
use optirs_tpu::sharding::{ParamSet, RecoveryPolicy};
use optirs_tpu::topology::{
    Cube, CubeRole, Device, DeviceId, InCube, Link, Ocs, OcsCircuit, Problem, TopologyError,
    parse_topology,
};
use optirs_tpu::tpu::{ShardedOptimizer, ShardingConfig};
use optirs_tpu::{OptimError, Pod};
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

fn pod(fields: &str) -> Pod {
    Pod::from_ron_str(&format!("Pod(name: \"t\", {fields})"), "t.ron").unwrap()
}

fn invalid(text: &str) -> (String, Option<usize>, Problem, String) {
    match parse_topology(text, "t.ron") {
        Err(e @ TopologyError::Invalid { .. }) => {
            let rendered = e.to_string();
            let TopologyError::Invalid {
                field,
                line,
                problem,
                ..
            } = e
            else {
                unreachable!()
            };
            (field, line, *problem, rendered)
        }
        other => panic!("expected a semantic error, got {other:?}"),
    }
}

fn cubes(pod: &mut Pod) -> BTreeMap<u32, Cube> {
    let world = pod.world_mut();
    world
        .query::<&Cube>()
        .iter(world)
        .map(|c| (c.index, *c))
        .collect()
}

/// Device-id adjacency read from the link entities.
fn adjacency(world: &mut World) -> Vec<Vec<u32>> {
    let ids: HashMap<Entity, u32> = world
        .query::<(Entity, &Device)>()
        .iter(world)
        .map(|(e, d)| (e, d.id.0))
        .collect();
    let mut adjacent = vec![Vec::new(); ids.len()];
    for link in world.query::<&Link>().iter(world) {
        let (a, b) = (ids[&link.a], ids[&link.b]);
        adjacent[a as usize].push(b);
        adjacent[b as usize].push(a);
    }
    adjacent
}

fn connected(adjacent: &[Vec<u32>]) -> bool {
    let mut seen = vec![false; adjacent.len()];
    seen[0] = true;
    let mut queue = VecDeque::from([0u32]);
    while let Some(v) = queue.pop_front() {
        for &w in &adjacent[v as usize] {
            if !seen[w as usize] {
                seen[w as usize] = true;
                queue.push_back(w);
            }
        }
    }
    seen.into_iter().all(|s| s)
}

#[test]
fn a_cube_built_v4_slice_has_cubes_switches_and_ocs_circuits() {
    let mut p = pod("generation: \"v4\", shape: \"4x4x8\", cubes: (spares: 2)");
    let layout = p.topology().cubes.expect("cube-built");
    assert_eq!(
        (layout.pod_cubes, layout.spares, layout.ocs_count()),
        (64, 2, 48)
    );
    assert_eq!(layout.reconfigure_seconds(), 10.0);
    let all = cubes(&mut p);
    assert_eq!(all.len(), 64, "the whole pod's cubes");
    let roles: Vec<CubeRole> = all.values().map(|c| c.role).collect();
    assert_eq!(
        roles[0],
        CubeRole::Slice {
            slice: 0,
            position: [0, 0, 0]
        }
    );
    assert_eq!(
        roles[1],
        CubeRole::Slice {
            slice: 0,
            position: [0, 0, 1]
        }
    );
    assert_eq!(&roles[2..4], &[CubeRole::Spare, CubeRole::Spare]);
    assert!(roles[4..].iter().all(|r| *r == CubeRole::Unallocated));
    let world = p.world_mut();
    let switches: Vec<Ocs> = world.query::<&Ocs>().iter(world).copied().collect();
    assert_eq!(switches.len(), 48);
    assert!(switches.iter().all(|o| o.ports == 128));
    // Device (x, y, z) is chip (x, y, z mod 4) of cube z / 4.
    let topology = p.topology().clone();
    let world = p.world_mut();
    for (device, in_cube) in world.query::<(&Device, &InCube)>().iter(world) {
        let (_, [x, y, z]) = topology.coords(device.id.0);
        assert_eq!(in_cube.cube, z / 4, "{}", device.id);
        assert_eq!(in_cube.chip, [x, y, z % 4]);
    }
    // 2 cubes x 96 face links / 2 ends = 96 circuits: 32 per axis, 2 on
    // every switch; inside a cube, no circuit.
    let circuits: Vec<(Link, OcsCircuit)> = world
        .query::<(&Link, &OcsCircuit)>()
        .iter(world)
        .map(|(l, c)| (*l, *c))
        .collect();
    assert_eq!(circuits.len(), 96);
    let mut per_switch = BTreeMap::new();
    for (link, circuit) in &circuits {
        *per_switch.entry(circuit.ocs).or_insert(0) += 1;
        assert_eq!(u32::from(link.axis.unwrap()), circuit.ocs / 16);
        assert!(link.wraps || circuit.cube_a != circuit.cube_b);
    }
    assert_eq!(per_switch.len(), 48);
    assert!(per_switch.values().all(|&n| n == 2));
    let z_crossings = circuits
        .iter()
        .filter(|(l, c)| l.axis == Some(2) && !l.wraps && c.cube_a != c.cube_b)
        .count();
    assert_eq!(z_crossings, 16, "one per (x, y) between the two cubes");
}

#[test]
fn pods_without_cubes_spawn_none() {
    let mut p = Pod::from_preset("v4-128").unwrap();
    assert!(p.topology().cubes.is_none());
    assert!(cubes(&mut p).is_empty());
    let world = p.world_mut();
    assert_eq!(world.query::<&InCube>().iter(world).count(), 0);
}

#[test]
fn bad_cube_blocks_are_refused_naming_the_field_and_line() {
    let v5e = "Pod(name: \"t\", generation: \"v5e\", shape: \"4x4\",\n cubes: (spares: 1))";
    let (field, line, problem, text) = invalid(v5e);
    assert_eq!((field.as_str(), line), ("cubes", Some(2)));
    assert!(matches!(problem, Problem::Cubes { .. }));
    assert!(text.starts_with("t.ron:2: `cubes`:"), "{text}");
    assert!(text.contains("only v4, v5p and tpu7x"), "{text}");
    let small = "Pod(name: \"t\", generation: \"v4\", shape: \"2x2x4\", cubes: ())";
    let (field, _, _, text) = invalid(small);
    assert_eq!(field, "cubes");
    assert!(text.contains("not made of whole 4x4x4 cubes"), "{text}");
    // A slice that uses more cubes than the pod has.
    let big = "Pod(name: \"t\", generation: \"v4\",\n shape: \"4x4x8\",\n cubes: (pod_cubes: 1))";
    let (field, line, _, text) = invalid(big);
    assert_eq!((field.as_str(), line), ("shape", Some(2)));
    assert!(text.contains("use 2 cubes"), "{text}");
    assert!(text.contains("more than the pod's 1"), "{text}");
    let full = "Pod(name: \"t\", generation: \"v4\", shape: \"16x16x16\", cubes: (spares: 1))";
    let (field, _, _, text) = invalid(full);
    assert_eq!(field, "cubes.spares");
    assert!(text.contains("at most 0 spares fit"), "{text}");
    let over = "Pod(name: \"t\", generation: \"v4\", shape: \"4x4x4\", cubes: (pod_cubes: 65))";
    assert_eq!(invalid(over).0, "cubes.pod_cubes");
    for bad in ["0.0", "-1.0", "1e9"] {
        let text = format!(
            "Pod(name: \"t\", generation: \"v4\", shape: \"4x4x4\", cubes: (reconfigure_seconds: {bad}))"
        );
        assert_eq!(invalid(&text).0, "cubes.reconfigure_seconds", "{bad}");
    }
    let unknown = "Pod(name: \"t\", generation: \"v4\", shape: \"4x4x4\", cubes: (spare: 1))";
    let err = parse_topology(unknown, "t.ron").unwrap_err().to_string();
    assert!(err.contains("t.ron:1:") && err.contains("spare"), "{err}");
}

#[test]
fn v5p_is_cube_built_with_140_cubes() {
    let mut p =
        pod("generation: \"v5p\", shape: \"4x4x8\", cubes: (spares: 1, reconfigure_seconds: 4.5)");
    let layout = p.topology().cubes.unwrap();
    assert_eq!(layout.pod_cubes, 140);
    assert_eq!(layout.reconfigure_ns, 4_500_000_000);
    assert_eq!(cubes(&mut p).len(), 140);
}

#[test]
fn a_failed_chip_fails_its_cube() {
    let mut p = pod("generation: \"v4\", shape: \"4x4x8\", tick_ms: 100.0, cubes: (spares: 1)");
    let device = p.topology().device_at(0, [1, 2, 5]);
    p.kill_device(device).unwrap();
    for _ in 0..200 {
        p.step();
        if p.health(device).is_some_and(|h| h.is_failed()) {
            break;
        }
    }
    let Some(Health::Failed { detected_at_ns }) = p.health(device) else {
        panic!("the detector never failed {device}");
    };
    let all = cubes(&mut p);
    assert_eq!(
        all[&1].failed_at_ns,
        Some(detected_at_ns),
        "z = 5 is in cube 1"
    );
    assert_eq!(all[&0].failed_at_ns, None);
}

#[test]
fn the_svg_draws_cubes_and_the_ocs_assignment() {
    let mut p = pod("generation: \"v4\", shape: \"4x4x8\", cubes: (spares: 1)");
    let svg = optirs_tpu::svg::topology_svg(p.world_mut());
    // One outline per (cube, z-plane): 2 cubes x 4 planes each.
    assert_eq!(svg.matches("class=\"cube\"").count(), 8, "{svg}");
    assert!(svg.contains("via OCS"), "circuits are named");
    assert!(
        svg.contains("cube 2: spare"),
        "the assignment lists the spare"
    );
    assert!(svg.contains("cube 1: slice 0 position (0,0,1)"));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Every device sits in exactly one cube, a slice cube holds 64 chips,
    /// and swapping any slice cube for a spare keeps every device's degree
    /// and the torus connected, re-points every circuit of the failed cube
    /// and keeps the slice's set of positions (its shape).
    #[test]
    fn a_spare_swap_keeps_the_torus(
        (cx, cy, cz) in (1u32..=2, 1u32..=2, 1u32..=2),
        spares in 1u32..=2,
        pick in 0u32..8,
    ) {
        let shape = format!("{}x{}x{}", 4 * cx, 4 * cy, 4 * cz);
        let mut p = pod(&format!(
            "generation: \"v4\", shape: \"{shape}\", cubes: (spares: {spares})"
        ));
        let slice_cubes = cx * cy * cz;
        let world = p.world_mut();
        let mut members: BTreeMap<u32, usize> = BTreeMap::new();
        for c in world.query::<&InCube>().iter(world) {
            *members.entry(c.cube).or_default() += 1;
        }
        prop_assert_eq!(members.len() as u32, slice_cubes);
        prop_assert!(members.values().all(|&n| n == 64));
        let devices = world.query::<&Device>().iter(world).count();
        prop_assert_eq!(devices, 64 * slice_cubes as usize);
        let degree_before: Vec<usize> = adjacency(world).iter().map(Vec::len).collect();
        let positions = |world: &mut World| -> HashSet<[u32; 3]> {
            world.query::<&Cube>().iter(world).filter_map(|c| match c.role {
                CubeRole::Slice { position, .. } => Some(position),
                _ => None,
            }).collect()
        };
        let before = positions(world);
        let failed = pick % slice_cubes;
        let swaps = swap_in_spares(world, &[failed], 1_000).unwrap();
        prop_assert_eq!(swaps.len(), 1);
        prop_assert_eq!(swaps[0].spare, slice_cubes);
        prop_assert_eq!(swaps[0].devices.len(), 64);
        let adjacent = adjacency(world);
        prop_assert_eq!(adjacent.iter().map(Vec::len).collect::<Vec<_>>(), degree_before);
        prop_assert!(adjacent.iter().all(|a| a.len() == 6));
        prop_assert!(connected(&adjacent));
        prop_assert_eq!(positions(world), before);
        prop_assert_eq!(spare_cubes(world).len() as u32, spares - 1);
        for c in world.query::<&OcsCircuit>().iter(world) {
            prop_assert!(c.cube_a != failed && c.cube_b != failed);
        }
        let retired = world.query::<&Cube>().iter(world)
            .find(|c| c.index == failed).unwrap().role;
        prop_assert_eq!(retired, CubeRole::Retired);
        let moved: Vec<u32> = world.query::<&InCube>().iter(world)
            .filter(|c| c.cube == slice_cubes).map(|_| 1).collect();
        prop_assert_eq!(moved.len(), 64);
    }
}

fn params(n: usize) -> ParamSet<f32> {
    let mut set = ParamSet::new();
    let values: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
    set.insert("w", ArrayD::from_shape_vec(IxDyn(&[n]), values).unwrap())
        .unwrap();
    set
}

type Sharded = ShardedOptimizer<Box<dyn optirs_tpu::Optimizer<f32, IxDyn> + Send + Sync>, f32>;

fn sharded(pod: Pod, recovery: RecoveryPolicy) -> Result<Sharded, OptimError> {
    let base = optirs_tpu::optimizers::by_name("adam", 0.01f32).unwrap();
    ShardedOptimizer::on_pod(
        base,
        pod,
        params(640),
        ShardingConfig {
            bucket_bytes: 1024,
            recovery,
            ..Default::default()
        },
    )
}

fn grads(n: usize, replicas: usize, step: u64) -> Vec<ParamSet<f32>> {
    (0..replicas)
        .map(|r| {
            let mut set = ParamSet::new();
            let v: Vec<f32> = (0..n)
                .map(|i| ((i + r) as f32 * 0.01 + step as f32).cos())
                .collect();
            set.insert("w", ArrayD::from_shape_vec(IxDyn(&[n]), v).unwrap())
                .unwrap();
            set
        })
        .collect()
}

#[test]
fn spare_cube_recovery_swaps_the_cube_and_restarts_from_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    // A 2 ms reconfiguration at 10 µs ticks: the wait is 200 ticks (each
    // writing its periodic checkpoint every 5 ticks).
    let mut p = pod("generation: \"v4\", shape: \"4x4x4\", tick_ms: 0.01, \
         cubes: (spares: 1, reconfigure_seconds: 0.002)");
    p.enable_periodic_checkpoints(5, vec![dir.path().to_path_buf()], 3)
        .unwrap();
    let mut opt = sharded(p, RecoveryPolicy::SpareCube).unwrap();
    let layout_before = opt.layout().unwrap().clone();
    let mut history = vec![opt.flat_params().unwrap()];
    for step in 1..=4 {
        opt.step_replicas(&grads(640, 64, step)).unwrap();
        history.push(opt.flat_params().unwrap());
    }
    let now = opt.pod().clock().now_ns;
    opt.pod_mut()
        .schedule_fault(now + 2_000, Fault::KillDevice(DeviceId(5)));
    let err = opt.step_replicas(&grads(640, 64, 5)).unwrap_err();
    assert!(err.to_string().contains("failed"), "{err}");
    assert_eq!(opt.recoveries().len(), 1, "{err}");
    let r = opt.recoveries()[0].clone();
    assert_eq!(r.policy, RecoveryPolicy::SpareCube);
    assert_eq!(r.swapped_cubes, vec![[0, 1]]);
    assert_eq!(r.devices_after, 64, "no device is excluded");
    let kept = opt.steps_completed();
    assert!(
        (1..=4).contains(&kept),
        "restored from a periodic checkpoint: {kept}"
    );
    assert_eq!(r.lost_steps, 4 - kept);
    assert!(
        r.recovery_seconds >= 0.002,
        "the OCS reconfiguration is waited for"
    );
    assert_eq!(opt.flat_params().unwrap(), history[kept as usize]);
    assert_eq!(
        opt.layout().unwrap(),
        &layout_before,
        "same devices, same torus plan"
    );
    let all = cubes(opt.pod_mut());
    assert_eq!(all[&0].role, CubeRole::Retired);
    assert_eq!(
        all[&1].role,
        CubeRole::Slice {
            slice: 0,
            position: [0, 0, 0]
        }
    );
    let device = opt.pod().device_entity(5).unwrap();
    assert_eq!(opt.pod().world().get::<InCube>(device).unwrap().cube, 1);
    // The next step runs on the spare, once the reconfiguration is over.
    let report = opt.step_replicas(&grads(640, 64, kept + 1)).unwrap();
    assert_eq!(report.step, kept + 1);
    assert!(report.launched_at_ns >= r.failed_at_ns + 2_000_000);
    // No spare is left: the next cube failure rolls back onto the
    // survivors, as `goodput` models a spare-cube run then.
    let now = opt.pod().clock().now_ns;
    opt.pod_mut()
        .schedule_fault(now + 2_000, Fault::KillDevice(DeviceId(9)));
    let err = opt.step_replicas(&grads(640, 64, kept + 2)).unwrap_err();
    assert!(err.to_string().contains("failed"), "{err}");
    assert_eq!(opt.recoveries().len(), 2);
    let fallback = opt.recoveries()[1].clone();
    assert_eq!(fallback.policy, RecoveryPolicy::Rollback);
    assert!(fallback.swapped_cubes.is_empty());
    assert_eq!(fallback.devices_after, 63);
    assert_eq!(opt.layout().unwrap().devices(), 63);
}

#[test]
fn spare_cube_recovery_on_a_pod_without_spares_is_refused_before_any_work() {
    for fields in [
        "generation: \"v4\", shape: \"4x4x4\"",
        "generation: \"v4\", shape: \"4x4x4\", cubes: (spares: 0)",
    ] {
        let Err(err) = sharded(pod(fields), RecoveryPolicy::SpareCube) else {
            panic!("{fields}: spare-cube without spares must be refused");
        };
        assert!(err.to_string().contains("needs spare cubes"), "{err}");
    }
}

#[test]
fn cubes_and_a_swap_survive_a_whole_world_checkpoint() {
    let mut p = pod("generation: \"v4\", shape: \"4x4x8\", cubes: (spares: 1)");
    let fresh = p.figures().cubes.expect("cube figures");
    assert_eq!(
        (
            fresh.pod_cubes,
            fresh.slice_cubes,
            fresh.spare_cubes,
            fresh.retired_cubes
        ),
        (64, 2, 1, 0)
    );
    assert_eq!((fresh.ocs, fresh.ocs_links), (48, 96));
    swap_in_spares(p.world_mut(), &[1], 5_000).unwrap();
    let swapped = p.figures().cubes.unwrap();
    assert_eq!(
        (
            swapped.slice_cubes,
            swapped.spare_cubes,
            swapped.retired_cubes,
            swapped.failed_cubes
        ),
        (2, 0, 1, 1)
    );
    assert!(
        Pod::from_preset("v4-128")
            .unwrap()
            .figures()
            .cubes
            .is_none()
    );
    let before = cubes(&mut p);
    let snapshot = p.snapshot().unwrap();
    let mut restored = Pod::from_snapshot(&snapshot).unwrap();
    assert_eq!(restored.world_sha256().unwrap(), p.world_sha256().unwrap());
    assert_eq!(cubes(&mut restored), before);
    assert_eq!(before[&1].role, CubeRole::Retired);
    let device = restored.topology().device_at(0, [0, 0, 4]);
    let entity = restored.device_entity(device).unwrap();
    let in_cube = *restored.world().get::<InCube>(entity).unwrap();
    assert_eq!(
        in_cube,
        InCube {
            cube: 2,
            chip: [0, 0, 0]
        }
    );
    let world = restored.world_mut();
    let circuits = world.query::<&OcsCircuit>().iter(world).count();
    assert_eq!(circuits, 96);
}
