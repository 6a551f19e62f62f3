//! Twisted tori (`twist: "twisted"`): the links, the figures they give, the
//! errors, and routing over them.

use optirs_tpu::Pod;
use optirs_tpu::collectives::ReduceOp;
use optirs_tpu::topology::{Device, Link, Problem, TopologyError, parse_topology};
use proptest::prelude::*;
use std::collections::{HashMap, HashSet, VecDeque};

fn pod(fields: &str) -> Pod {
    Pod::from_ron_str(&format!("Pod(name: \"t\", {fields})"), "t.ron").unwrap()
}

fn problem(fields: &str) -> (String, Problem) {
    match parse_topology(&format!("Pod(name: \"t\", {fields})"), "t.ron") {
        Err(TopologyError::Invalid { field, problem, .. }) => (field, *problem),
        other => panic!("expected a semantic error for `{fields}`, got {other:?}"),
    }
}

/// Device-id adjacency read from the link entities.
fn adjacency(pod: &mut Pod) -> Vec<Vec<u32>> {
    let world = pod.world_mut();
    let ids: HashMap<_, u32> = world
        .query::<(bevy_ecs::entity::Entity, &Device)>()
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

fn hops_from(adjacent: &[Vec<u32>], source: u32) -> Vec<u32> {
    let mut distance = vec![u32::MAX; adjacent.len()];
    distance[source as usize] = 0;
    let mut queue = VecDeque::from([source]);
    while let Some(v) = queue.pop_front() {
        for &w in &adjacent[v as usize] {
            if distance[w as usize] == u32::MAX {
                distance[w as usize] = distance[v as usize] + 1;
                queue.push_back(w);
            }
        }
    }
    distance
}

#[test]
fn a_twisted_4x4x8_joins_the_short_rings_across_the_long_axis() {
    let mut twisted = pod("generation: \"v4\", shape: \"4x4x8\", twist: \"twisted\"");
    let topology = twisted.topology().clone();
    assert!(topology.is_twisted());
    // (3, y, z) -> (0, y, z + 4 mod 8) and (x, 3, z) -> (x, 0, z + 4 mod 8).
    let links = topology.links();
    let x_wrap = links
        .iter()
        .find(|l| l.axis == Some(0) && l.wraps && l.a == topology.device_at(0, [3, 1, 6]))
        .unwrap();
    assert_eq!(x_wrap.b, topology.device_at(0, [0, 1, 2]));
    let y_wrap = links
        .iter()
        .find(|l| l.axis == Some(1) && l.wraps && l.a == topology.device_at(0, [2, 3, 1]))
        .unwrap();
    assert_eq!(y_wrap.b, topology.device_at(0, [2, 0, 5]));
    let z_wrap = links
        .iter()
        .find(|l| l.axis == Some(2) && l.wraps && l.a == topology.device_at(0, [2, 3, 7]))
        .unwrap();
    assert_eq!(
        z_wrap.b,
        topology.device_at(0, [2, 3, 0]),
        "the long axis is a plain ring"
    );
    // On a 4x8x8 the short axis lands (+4, +4): the diagonal seam.
    let t = parse_topology(
        "Pod(name: \"t\", generation: \"v4\", shape: \"4x8x8\", twist: \"twisted\")",
        "t",
    )
    .unwrap();
    assert_eq!(t.twist, [[0, 4, 4], [0, 0, 0], [0, 0, 0]]);
    assert!(twisted.figures().twisted);
}

#[test]
fn twisting_shortens_paths_and_widens_the_cut_with_the_same_links() {
    let tb = 1e12;
    for (shape, plain_diameter, twisted_diameter, plain_cut, twisted_cut, min_gain) in [
        ("4x4x8", 8, 6, 1.6, 3.2, 1.7),
        ("4x8x8", 10, 6, 3.2, 6.4, 1.35),
        ("8x8x16", 16, 12, 6.4, 12.8, 1.7),
    ] {
        let plain = pod(&format!("generation: \"v4\", shape: \"{shape}\"")).figures();
        let twisted = pod(&format!(
            "generation: \"v4\", shape: \"{shape}\", twist: \"twisted\""
        ))
        .figures();
        assert_eq!(plain.diameter_hops, Some(plain_diameter), "{shape}");
        assert_eq!(twisted.diameter_hops, Some(twisted_diameter), "{shape}");
        assert!(
            (plain.bisection_bytes_per_s / tb - plain_cut).abs() < 1e-9,
            "{shape}"
        );
        assert!(
            (twisted.bisection_bytes_per_s / tb - twisted_cut).abs() < 1e-9,
            "{shape}"
        );
        assert_eq!(
            plain.links, twisted.links,
            "{shape}: a twist moves links, adds none"
        );
        assert_eq!(plain.allreduce_bytes_per_s, twisted.allreduce_bytes_per_s);
        assert!(
            twisted.mean_hops.unwrap() < plain.mean_hops.unwrap(),
            "{shape}"
        );
        let gain = twisted.alltoall_bytes_per_s / plain.alltoall_bytes_per_s;
        assert!(gain > min_gain, "{shape}: all-to-all gain {gain}");
    }
}

#[test]
fn mean_hops_agrees_with_a_search_over_the_link_entities() {
    for fields in [
        "generation: \"v4\", shape: \"4x4x8\"",
        "generation: \"v4\", shape: \"4x4x8\", twist: \"twisted\"",
        "generation: \"v5p\", shape: \"8x4x8\", twist: \"twisted\"",
        "generation: \"v5e\", shape: \"4x8\"",
        "generation: \"v4\", shape: \"2x2x4\"",
    ] {
        let mut p = pod(fields);
        let adjacent = adjacency(&mut p);
        let n = adjacent.len() as u64;
        let sum: u64 = (0..n as u32)
            .map(|s| {
                hops_from(&adjacent, s)
                    .iter()
                    .map(|&d| u64::from(d))
                    .sum::<u64>()
            })
            .sum();
        let expected = sum as f64 / (n * (n - 1)) as f64;
        let mean = p.figures().mean_hops.unwrap();
        assert!(
            (mean - expected).abs() < 1e-12,
            "{fields}: {mean} vs {expected}"
        );
    }
}

#[test]
fn a_twist_that_cannot_exist_is_refused_before_any_work() {
    let (field, p) = problem("generation: \"v4\", shape: \"4x4x8\", twist: \"spiral\"");
    assert_eq!(field, "twist");
    assert_eq!(
        p,
        Problem::UnknownTwist {
            given: "spiral".into()
        }
    );
    assert!(p.to_string().contains("\"twisted\""), "{p}");
    let (field, p) = problem("generation: \"v4\", shape: \"4x4x4\", twist: \"twisted\"");
    assert_eq!(field, "twist");
    assert!(p.to_string().contains("k x k x 2k"), "{p}");
    let (_, p) = problem("generation: \"v4\", shape: \"8x8x8\", twist: \"twisted\"");
    assert!(matches!(p, Problem::TwistNotAllowed { .. }), "{p:?}");
    let (_, p) = problem("generation: \"v5e\", shape: \"8x16\", twist: \"twisted\"");
    assert!(p.to_string().contains("only v4 and v5p"), "{p}");
    let (_, p) = problem(
        "generation: \"v4\", shape: \"4x4x8\", wraparound: [true, false, true], twist: \"twisted\"",
    );
    assert!(p.to_string().contains("wraparound[1] is off"), "{p}");
    // The error names the file and line of the field.
    let text = "Pod(\n  name: \"t\",\n  generation: \"v4\",\n  shape: \"4x4x8\",\n  twist: \"moebius\",\n)\n";
    let message = parse_topology(text, "pods/t.ron").unwrap_err().to_string();
    assert!(
        message.starts_with("pods/t.ron:5: `twist`: unknown twist `moebius`"),
        "{message}"
    );
    // "none" is the default, written or not.
    let none = parse_topology(
        "Pod(name: \"t\", generation: \"v4\", shape: \"4x4x8\", twist: \"none\")",
        "t",
    )
    .unwrap();
    assert!(!none.is_twisted());
}

#[test]
fn collectives_run_on_a_twisted_torus_over_links_that_exist() {
    let mut p = pod("generation: \"v4\", shape: \"4x4x8\", twist: \"twisted\"");
    let n = p.topology().num_devices() as usize;
    let mut buffers: Vec<Vec<i32>> = (0..n).map(|d| vec![d as i32; 64]).collect();
    p.all_reduce(&mut buffers, ReduceOp::Sum).unwrap();
    let total: i32 = (0..n as i32).sum();
    assert!(buffers.iter().all(|b| b.iter().all(|&v| v == total)));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// With a twist every chip keeps its 6 links, no link is doubled, the
    /// pod stays connected, and data between any two chips arrives after
    /// exactly the shortest path's hops.
    #[test]
    fn a_twisted_torus_keeps_degree_six_and_routes_every_pair(
        generation in prop::sample::select(vec!["v4", "v5p"]),
        shape in prop::sample::select(vec!["4x4x8", "4x8x4", "8x4x4", "4x8x8", "8x8x4", "8x4x8"]),
        pairs in proptest::collection::vec((0u32..256, 0u32..256), 1..6),
    ) {
        let mut p = pod(&format!(
            "generation: \"{generation}\", shape: \"{shape}\", twist: \"twisted\", \
             ici: (bandwidth_gb_per_s: 1.0, latency_us: 1.0)"
        ));
        let adjacent = adjacency(&mut p);
        let n = adjacent.len() as u32;
        for (device, neighbours) in adjacent.iter().enumerate() {
            prop_assert_eq!(neighbours.len(), 6, "device {} of {}", device, shape);
            let distinct: HashSet<_> = neighbours.iter().collect();
            prop_assert_eq!(distinct.len(), 6, "device {} has a doubled link", device);
        }
        prop_assert!(p.figures().diameter_hops.is_some(), "connected");
        for (a, b) in pairs {
            let (a, b) = (a % n, b % n);
            if a == b {
                continue;
            }
            let hops = hops_from(&adjacent, a)[b as usize];
            let now = p.clock().now_ns;
            let arrival = p.send_data(a, b, 1000).unwrap();
            // Store and forward: 1000 B at 1 GB/s plus 1 µs on every hop.
            prop_assert_eq!(arrival - now, u64::from(hops) * 2_000, "{} -> {}", a, b);
            // A tick (10 ms) later the links are idle again for the next pair.
            p.step();
        }
    }
}
