//! The DCN fabric of multislice pods: hosts joined across slices through
//! their NICs, as link entities that routing, time, figures and the
//! hierarchical collectives (ICI inside a slice, DCN across) use.

use optirs_tpu::Pod;
use optirs_tpu::collectives::ReduceOp;
use optirs_tpu::hardware::TpuGeneration;
use optirs_tpu::health::Fault;
use optirs_tpu::topology::{
    DeviceId, Link, LinkKind, LinkTraffic, Problem, TopologyError, parse_topology,
};

fn pod(fields: &str) -> Pod {
    Pod::from_ron_str(&format!("Pod(name: \"m\", {fields})"), "m.ron").unwrap()
}

fn problem(fields: &str) -> (String, Problem) {
    match parse_topology(&format!("Pod(name: \"m\", {fields})"), "m.ron") {
        Err(TopologyError::Invalid { field, problem, .. }) => (field, *problem),
        other => panic!("expected a semantic error for `{fields}`, got {other:?}"),
    }
}

fn dcn_links(pod: &mut Pod) -> Vec<Link> {
    let world = pod.world_mut();
    world
        .query::<&Link>()
        .iter(world)
        .filter(|l| l.kind == LinkKind::Dcn)
        .copied()
        .collect()
}

#[test]
fn a_four_slice_v5p_pod_needs_no_hand_listed_links() {
    let mut p = pod("generation: \"v5p\", shape: \"4x4x8\", slices: 4");
    let topology = p.topology().clone();
    let hosts_per_slice = topology.num_hosts() / 4;
    assert_eq!(hosts_per_slice, 32);
    let links = dcn_links(&mut p);
    // Every host to its twin in each of the other 3 slices: 32 x C(4, 2).
    assert_eq!(links.len(), 32 * 6);
    // A v5p host's NICs: 4 chips x 50 Gbit/s = 25 GB/s, over 3 rails.
    let host = TpuGeneration::V5p.spec().dcn_host_bytes_per_s;
    assert_eq!(host, 25e9);
    for link in &links {
        assert!((link.bytes_per_s - host / 3.0).abs() < 1e-3, "{link:?}");
        assert_eq!(link.latency_ns, 10_000);
    }
    let figures = p.figures();
    assert_eq!(figures.dcn_links, 192);
    assert!(figures.diameter_hops.is_some(), "connected");
    // Slices {0, 1} | {2, 3}: each host has 2 rails across, 32 hosts x 2
    // slices x 2 rails x 25/3 GB/s.
    let expected = 32.0 * 2.0 * 2.0 * host / 3.0;
    assert!((figures.dcn_bisection_bytes_per_s - expected).abs() < 1.0);
    assert_eq!(figures.bisection_cut.as_deref(), Some("slice"));
    assert_eq!(
        figures.bisection_bytes_per_s,
        figures.dcn_bisection_bytes_per_s
    );
}

#[test]
fn oversubscription_and_host_bandwidth_set_the_fabric_links() {
    let base = "generation: \"v5e\", shape: \"4x4\", slices: 2";
    let plain = pod(base).figures();
    let over = pod(&format!("{base}, dcn: (oversubscription: 2.0)")).figures();
    let fast = pod(&format!("{base}, dcn: (host_gb_per_s: 100.0)")).figures();
    // Two v5e hosts per slice, one rail each: 2 x 25 GB/s.
    assert_eq!(plain.dcn_bisection_bytes_per_s, 50e9);
    assert_eq!(over.dcn_bisection_bytes_per_s, 25e9);
    assert_eq!(fast.dcn_bisection_bytes_per_s, 200e9);
}

#[test]
fn data_between_slices_crosses_the_fabric_in_simulated_time() {
    let fields = "generation: \"v5e\", shape: \"4x4\", slices: 2, \
                  ici: (bandwidth_gb_per_s: 50.0, latency_us: 1.0), \
                  dcn: (latency_us: 10.0, host_gb_per_s: 25.0)";
    // Host 0's first chips are devices 0 and 16: one DCN hop.
    let mut p = pod(fields);
    let topology = p.topology().clone();
    assert_eq!(
        (topology.host_leader(0, 0), topology.host_leader(1, 0)),
        (0, 16)
    );
    let at = p.send_data(0, 16, 1_000_000).unwrap();
    assert_eq!(
        at,
        1_000_000_000 / 25_000 + 10_000,
        "1 MB at 25 GB/s plus 10 µs"
    );
    // Device 1 to its twin 17: an ICI hop to a host's first chip, the DCN
    // hop, an ICI hop (store and forward): 2 x (20 + 1) µs + 50 µs.
    let mut p = pod(fields);
    assert_eq!(p.send_data(1, 17, 1_000_000).unwrap(), 2 * 21_000 + 50_000);
}

#[test]
fn explicit_links_still_join_slices_beside_the_fabric() {
    let base = "generation: \"v5e\", shape: \"4x4\", slices: 2";
    let mut p = pod(&format!("{base}, extra_links: [(a: 8, b: 24, kind: Dcn)]"));
    assert_eq!(p.figures().dcn_links, 3);
    // One that repeats a fabric link is named as such.
    let (field, p) = problem(&format!("{base}, extra_links: [(a: 16, b: 0, kind: Dcn)]"));
    assert_eq!(field, "extra_links[0]");
    assert!(p.to_string().contains("a DCN fabric link"), "{p}");
    // Without the fabric, the explicit links are the only way across.
    let mut p = pod(&format!(
        "{base}, dcn: (fabric: false), extra_links: [(a: 0, b: 16, kind: Dcn)]"
    ));
    assert_eq!(p.figures().dcn_links, 1);
}

#[test]
fn fabric_figures_without_a_fabric_are_refused() {
    let (field, p) = problem("generation: \"v5e\", shape: \"4x4\", dcn: (fabric: true)");
    assert_eq!(field, "dcn.fabric");
    assert!(p.to_string().contains("2 or more slices"), "{p}");
    let (field, _) = problem("generation: \"v5e\", shape: \"4x4\", dcn: (host_gb_per_s: 10.0)");
    assert_eq!(field, "dcn.host_gb_per_s");
    let (field, _) = problem(
        "generation: \"v5e\", shape: \"4x4\", slices: 2, dcn: (fabric: false, oversubscription: 2.0)",
    );
    assert_eq!(field, "dcn.oversubscription");
    let (field, p) =
        problem("generation: \"v5e\", shape: \"4x4\", slices: 2, dcn: (oversubscription: 0.5)");
    assert_eq!(field, "dcn.oversubscription");
    assert!(matches!(p, Problem::BadNumber { .. }), "{p:?}");
    let (field, _) =
        problem("generation: \"v5e\", shape: \"4x4\", slices: 2, dcn: (host_gb_per_s: -1.0)");
    assert_eq!(field, "dcn.host_gb_per_s");
    // The fabric grows with the square of the slices; past its cap the pod
    // is refused before any link is built.
    let (field, p) = problem("generation: \"v5e\", shape: \"1x1\", slices: 2000");
    assert_eq!(field, "slices");
    assert!(p.to_string().contains("1999000 DCN fabric links"), "{p}");
    parse_topology(
        "Pod(name: \"m\", generation: \"v5e\", shape: \"1x1\", slices: 2000, dcn: (fabric: false))",
        "m",
    )
    .map(|_| ())
    .expect_err("2000 slices without a fabric are disconnected");
    // The error carries the file's line.
    let text = "Pod(\n  name: \"m\",\n  generation: \"v5e\",\n  shape: \"4x4\",\n  dcn: (fabric: true),\n)\n";
    let message = parse_topology(text, "pods/m.ron").unwrap_err().to_string();
    assert!(
        message.starts_with("pods/m.ron:5: `dcn.fabric`:"),
        "{message}"
    );
}

#[test]
fn a_fabric_pod_round_trips_through_a_snapshot() {
    let mut p = pod("generation: \"v5e\", shape: \"4x4\", slices: 3");
    p.run(3);
    let before = p.world_sha256().unwrap();
    let snapshot = p.snapshot().unwrap();
    let mut restored = Pod::from_snapshot(&snapshot).unwrap();
    assert_eq!(restored.world_sha256().unwrap(), before);
    assert_eq!(restored.topology().dcn_fabric, p.topology().dcn_fabric);
}

/// Device `d`'s buffer: small integers, so every order sums exactly.
fn buffers(devices: usize, len: usize) -> Vec<Vec<f32>> {
    (0..devices)
        .map(|d| {
            (0..len)
                .map(|i| ((d * 7 + i * 13) % 31) as f32 - 15.0)
                .collect()
        })
        .collect()
}

fn fabric_traffic(pod: &mut Pod) -> Vec<(Link, LinkTraffic)> {
    let world = pod.world_mut();
    world
        .query::<(&Link, &LinkTraffic)>()
        .iter(world)
        .filter(|(l, _)| l.kind == LinkKind::Dcn)
        .map(|(l, t)| (*l, *t))
        .collect()
}

#[test]
fn an_all_reduce_across_slices_is_hierarchical_on_the_fabric_links() {
    // Two v5e 4x4 slices; each has two 8-chip hosts (NIC chips 0 and 2).
    let mut p = pod("generation: \"v5e\", shape: \"4x4\", slices: 2");
    let len = 4096;
    let inputs = buffers(32, len);
    let expected: Vec<f32> = (0..len)
        .map(|i| inputs.iter().map(|b| b[i]).sum())
        .collect();
    let mut data = inputs.clone();
    let report = p.all_reduce(&mut data, ReduceOp::Sum).unwrap();
    for b in &data {
        assert_eq!(b, &expected);
    }
    let names: Vec<&str> = report.passes.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            // Two rounds with a pass on each axis at once, each way.
            "reduce_scatter.axis0",
            "reduce_scatter.axis1",
            "reduce_scatter.axis0",
            "reduce_scatter.axis1",
            "reduce_scatter.dcn",
            "all_gather.dcn",
            "all_gather.axis0",
            "all_gather.axis1",
            "all_gather.axis0",
            "all_gather.axis1"
        ]
    );
    // After the slice's reduce-scatter each chip holds len/16; it sends
    // half of that to its twin: 8 chips x 128 elements x 4 bytes per host,
    // each way, per pass.
    let per_host = 8 * (len / 16 / 2) * 4;
    let dcn = &report.passes[4];
    assert!(dcn.is_dcn());
    assert_eq!(dcn.bytes, 2 * 2 * per_host as u64, "2 hosts, both ways");
    let rail = p
        .topology()
        .fabric_link_params(&p.topology().dcn_fabric.unwrap());
    let closed = rail.latency_ns as f64 * 1e-9 + per_host as f64 / rail.bytes_per_s;
    assert!((dcn.seconds() - closed).abs() < 1e-12, "{dcn:?}");
    // Rounds one after another, each as long as its longest pass.
    let mut rounds: std::collections::BTreeMap<u32, f64> = Default::default();
    for pass in &report.passes {
        let longest = rounds.entry(pass.order).or_insert(0.0);
        *longest = longest.max(pass.seconds());
    }
    let total: f64 = rounds.values().sum();
    assert!((total - report.modeled_seconds).abs() < 1e-12);
    // Every fabric link carried the reduce-scatter's and the all-gather's
    // chunks, in each direction.
    let fabric = fabric_traffic(&mut p);
    assert_eq!(fabric.len(), 2);
    for (_, t) in &fabric {
        assert_eq!(
            (t.bytes_ab, t.bytes_ba),
            (2 * per_host as u64, 2 * per_host as u64)
        );
    }
    assert_eq!(
        report.link_bytes,
        report.passes.iter().map(|p| p.bytes).sum::<u64>()
    );
}

#[test]
fn reduce_scatter_and_all_gather_across_slices_compose_an_all_reduce() {
    // Three v4 2x2x2 slices, a 2:1 oversubscribed core.
    let mut p =
        pod("generation: \"v4\", shape: \"2x2x2\", slices: 3, dcn: (oversubscription: 2.0)");
    let len = 1000; // not a multiple of the 24 devices
    let inputs = buffers(24, len);
    let mut reduced = inputs.clone();
    p.all_reduce(&mut reduced, ReduceOp::Sum).unwrap();
    let mut data = inputs.clone();
    let (rs, ranges) = p
        .multislice_reduce_scatter(&mut data, ReduceOp::Sum)
        .unwrap();
    assert_eq!(ranges.iter().map(|r| r.len()).sum::<usize>(), len);
    for (d, r) in ranges.iter().enumerate() {
        assert_eq!(data[d][r.clone()], reduced[0][r.clone()], "device {d}");
    }
    let (ag, again) = p.multislice_all_gather(&mut data).unwrap();
    assert_eq!(ranges, again);
    assert_eq!(data, reduced);
    assert_eq!(rs.passes.last().unwrap().name, "reduce_scatter.dcn");
    assert_eq!(ag.passes[0].name, "all_gather.dcn");
    // The 2:1 core halves the rails: each pass's DCN time is the
    // oversubscribed rail's.
    let rail = p
        .topology()
        .fabric_link_params(&p.topology().dcn_fabric.unwrap());
    assert_eq!(rail.bytes_per_s, 12.5e9 / 2.0 / 2.0);
}

#[test]
fn collectives_that_cannot_span_slices_say_what_to_use() {
    let mut p = pod("generation: \"v5e\", shape: \"4x4\", slices: 2");
    let mut data = buffers(32, 64);
    let err = p
        .reduce_scatter(&mut data, ReduceOp::Sum)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("hierarchically") && err.contains("2 slices"),
        "{err}"
    );
    let err = p.broadcast(&mut data, 0).unwrap_err().to_string();
    assert!(err.contains("not built across slices"), "{err}");
    // Hand-listed links are no fabric: the exchange needs every host's rails.
    let mut p = pod(
        "generation: \"v5e\", shape: \"4x4\", slices: 2, dcn: (fabric: false), \
         extra_links: [(a: 0, b: 16, kind: Dcn)]",
    );
    let err = p
        .all_reduce(&mut data, ReduceOp::Sum)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no DCN fabric"), "{err}");
    // A cut rail fails the launch before any counter moves.
    let mut p = pod("generation: \"v5e\", shape: \"4x4\", slices: 2");
    p.inject(Fault::CutLink(DeviceId(0), DeviceId(16))).unwrap();
    let err = p
        .all_reduce(&mut data, ReduceOp::Sum)
        .unwrap_err()
        .to_string();
    assert!(err.contains("cut"), "{err}");
    assert!(
        fabric_traffic(&mut p)
            .iter()
            .all(|(_, t)| t.bytes_ab + t.bytes_ba == 0)
    );
}
