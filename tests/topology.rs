//! Pod files, presets and the figures derived from their entities.

use optirs_tpu::Pod;
use optirs_tpu::topology::{
    Device, Host, Link, LinkKind, PRESETS, Problem, TopologyError, load_preset, parse_topology,
};

fn within(value: f64, expected: f64, tolerance: f64) -> bool {
    ((value - expected) / expected).abs() <= tolerance
}

#[test]
fn every_preset_loads_and_spawns_its_entities() {
    for (name, _) in PRESETS {
        let topology = load_preset(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut pod = Pod::from_topology(topology.clone()).unwrap();
        let world = pod.world_mut();
        let devices = world.query::<&Device>().iter(world).count() as u32;
        let hosts = world.query::<&Host>().iter(world).count() as u32;
        let links = world.query::<&Link>().iter(world).count();
        assert_eq!(devices, topology.num_devices(), "{name}: devices");
        assert_eq!(hosts, topology.num_hosts(), "{name}: hosts");
        assert_eq!(links, topology.links().len(), "{name}: links");
        // Every chip has one link per port, except on mesh (unwrapped) axes.
        let expected_ports = 2 * topology.ndims;
        let wrapped_everywhere = (0..topology.ndims).all(|a| topology.wraparound[a]);
        if wrapped_everywhere {
            assert_eq!(links, devices as usize * expected_ports / 2, "{name}");
        }
        assert!(pod.figures().diameter_hops.is_some(), "{name}: connected");
    }
}

#[test]
fn v5e_256_matches_published_bisection_and_allreduce() {
    let figures = Pod::from_preset("v5e-256").unwrap().figures();
    assert_eq!(
        (figures.devices, figures.hosts, figures.links),
        (256, 32, 512)
    );
    assert_eq!(figures.diameter_hops, Some(16));
    assert!(
        within(figures.bisection_bytes_per_s, 1.6e12, 0.10),
        "{figures:?}"
    );
    assert!(
        within(figures.allreduce_bytes_per_s, 51.2e12, 0.10),
        "{figures:?}"
    );
}

#[test]
fn v6e_256_matches_published_bisection_and_allreduce() {
    let figures = Pod::from_preset("v6e-256").unwrap().figures();
    assert!(
        within(figures.bisection_bytes_per_s, 3.2e12, 0.10),
        "{figures:?}"
    );
    assert!(
        within(figures.allreduce_bytes_per_s, 102.4e12, 0.10),
        "{figures:?}"
    );
}

#[test]
fn tpu7x_pod_files_parse_and_the_preset_is_four_cubes_of_ironwood() {
    let text = "Pod(name: \"i\", generation: \"tpu7x\", shape: \"4x4x4\", cubes: (spares: 1))";
    let cube = parse_topology(text, "i.ron").unwrap();
    assert_eq!(cube.generation, optirs_tpu::hardware::TpuGeneration::Tpu7x);
    assert_eq!((cube.num_devices(), cube.num_hosts()), (64, 16));
    assert!(cube.warnings.is_empty(), "{:?}", cube.warnings);
    assert_eq!(cube.cubes.map(|c| c.spares), Some(1));
    let preset = load_preset("tpu7x-512").unwrap();
    assert_eq!((preset.dims, preset.wraparound), ([4, 8, 8], [true; 3]));
    let figures = Pod::from_topology(preset).unwrap().figures();
    assert_eq!(
        (figures.devices, figures.hosts, figures.links),
        (256, 64, 768)
    );
    assert_eq!(figures.diameter_hops, Some(10));
    // 64 links across the middle of an 8-chip axis at 100 GB/s each way.
    assert!(
        within(figures.bisection_bytes_per_s, 6.4e12, 1e-9),
        "{figures:?}"
    );
}

#[test]
fn v4_4096_matches_published_bisection() {
    let figures = Pod::from_preset("v4-8192").unwrap().figures();
    assert_eq!(
        (figures.devices, figures.hosts, figures.links),
        (4096, 1024, 12288)
    );
    assert_eq!(figures.diameter_hops, Some(24));
    assert!(
        within(figures.bisection_bytes_per_s, 24e12, 0.10),
        "{figures:?}"
    );
}

#[test]
fn figures_follow_the_entities_not_a_table() {
    // The same shape as a mesh has half the bisection and a longer diameter.
    // v3: any axis of 3 or more chips wraps.
    let torus = pod("generation: \"v3\", shape: \"8x8\"").figures();
    let mesh = pod("generation: \"v3\", shape: \"8x8\", wraparound: [false, false]").figures();
    assert_eq!(torus.diameter_hops, Some(8));
    assert_eq!(mesh.diameter_hops, Some(14));
    assert_eq!(
        mesh.bisection_bytes_per_s * 2.0,
        torus.bisection_bytes_per_s
    );
    assert_eq!(mesh.links, 2 * 8 * 7);
    // A DCN link across the cut adds its bandwidth to the bisection.
    let bridged = pod(
        "generation: \"v3\", shape: \"8x8\", wraparound: [false, false], \
         extra_links: [(a: 0, b: 7, kind: Dcn, bandwidth_gb_per_s: 10.0), \
         (a: 0, b: 56, kind: Dcn, bandwidth_gb_per_s: 10.0)]",
    )
    .figures();
    assert_eq!(bridged.dcn_links, 2);
    assert_eq!(
        bridged.bisection_bytes_per_s,
        mesh.bisection_bytes_per_s + 10e9
    );
    assert!(
        bridged.diameter_hops < mesh.diameter_hops,
        "a shortcut shortens paths"
    );
}

#[test]
fn multislice_needs_dcn_and_counts_the_slice_cut() {
    let figures = Pod::from_file(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/assets/pods/examples/v5e-16x2-multislice.ron"
    ))
    .unwrap()
    .figures();
    assert_eq!(figures.devices, 32);
    assert_eq!(figures.dcn_links, 2);
    assert_eq!(figures.bisection_cut.as_deref(), Some("slice"));
    assert!(within(figures.bisection_bytes_per_s, 2.0 * 25e9, 1e-9));
}

#[test]
fn hosts_drive_blocks_of_chips() {
    let mut pod = Pod::from_preset("v4-128").unwrap();
    let topology = pod.topology().clone();
    assert_eq!(topology.host_bounds, [2, 2, 1]);
    // Chips (0,0,0), (1,0,0), (0,1,0), (1,1,0) share host 0.
    for xyz in [[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0]] {
        assert_eq!(topology.host_of(topology.device_at(0, xyz)), 0);
    }
    assert_ne!(topology.host_of(topology.device_at(0, [2, 0, 0])), 0);
    let world = pod.world_mut();
    for devices in world
        .query::<&optirs_tpu::topology::HostDevices>()
        .iter(world)
    {
        assert_eq!(devices.devices().len(), 4);
    }
}

fn text(fields: &str) -> String {
    format!("Pod(name: \"test\", {fields})")
}

fn pod(fields: &str) -> Pod {
    Pod::from_ron_str(&text(fields), "test.ron").unwrap()
}

fn problem(fields: &str) -> (String, Problem) {
    match parse_topology(&text(fields), "test.ron") {
        Err(TopologyError::Invalid { field, problem, .. }) => (field, *problem),
        other => panic!("expected a semantic error for `{fields}`, got {other:?}"),
    }
}

#[test]
fn unknown_generation_is_named() {
    let (field, problem) = problem("generation: \"v7\", shape: \"4x4\"");
    assert_eq!(field, "generation");
    assert_eq!(problem, Problem::UnknownGeneration("v7".into()));
    assert!(problem.to_string().contains("v5e"), "lists the known ones");
}

#[test]
fn zero_sized_dimension_is_named() {
    let (field, problem) = problem("generation: \"v4\", shape: \"4x0x4\"");
    assert_eq!(field, "shape");
    assert!(
        matches!(problem, Problem::ZeroDimension { axis: 1, .. }),
        "{problem:?}"
    );
}

#[test]
fn malformed_and_mis_dimensioned_shapes_are_rejected() {
    let (_, p) = problem("generation: \"v4\", shape: \"4xfour\"");
    assert!(matches!(p, Problem::MalformedShape { .. }), "{p:?}");
    let (_, p) = problem("generation: \"v4\", shape: \"4x4\"");
    assert!(
        matches!(
            p,
            Problem::WrongDimensionCount {
                expected: 3,
                got: 2,
                ..
            }
        ),
        "{p:?}"
    );
    let (_, p) = problem("generation: \"v5e\", shape: \"4x4x4x4\"");
    assert!(matches!(p, Problem::MalformedShape { .. }), "{p:?}");
}

#[test]
fn chips_per_host_must_divide_the_slice() {
    let (field, p) = problem("generation: \"v4\", shape: \"3x4x4\", custom: true");
    assert_eq!(field, "chips_per_host");
    assert!(
        matches!(
            p,
            Problem::HostBlockDoesNotDivide {
                axis: 0,
                bound: 2,
                size: 3
            }
        ),
        "{p:?}"
    );
    let (field, p) = problem("generation: \"v5e\", shape: \"8x8\", chips_per_host: \"3x1\"");
    assert_eq!(field, "chips_per_host");
    assert!(
        matches!(p, Problem::HostBlockDoesNotDivide { axis: 0, .. }),
        "{p:?}"
    );
}

#[test]
fn v4_wraparound_needs_a_multiple_of_four() {
    let (field, p) = problem(
        "generation: \"v4\", shape: \"4x4x6\", custom: true, wraparound: [true, true, true]",
    );
    assert_eq!(field, "wraparound[2]");
    assert!(
        matches!(
            p,
            Problem::WraparoundNotAllowed {
                axis: 2,
                size: 6,
                ..
            }
        ),
        "{p:?}"
    );
    assert!(p.to_string().contains("multiple of 4"), "{p}");
    // Without asking for it, the 6-chip axis is simply a mesh.
    let topology = parse_topology(
        &text("generation: \"v4\", shape: \"4x4x6\", custom: true"),
        "t",
    )
    .unwrap();
    assert_eq!(topology.wraparound, [true, true, false]);
}

#[test]
fn explicit_links_are_checked() {
    let base = "generation: \"v5e\", shape: \"4x4\", extra_links: ";
    let (field, p) = problem(&format!("{base}[(a: 0, b: 16, kind: Dcn)]"));
    assert_eq!(field, "extra_links[0]");
    assert_eq!(
        p,
        Problem::UnknownDevice {
            device: 16,
            devices: 16
        }
    );

    let (_, p) = problem(&format!(
        "{base}[(a: 0, b: 5, kind: Dcn), (a: 3, b: 3, kind: Dcn)]"
    ));
    assert_eq!(p, Problem::SelfLink { device: 3 });

    let (field, p) = problem(&format!(
        "{base}[(a: 0, b: 5, kind: Dcn), (a: 5, b: 0, kind: Dcn)]"
    ));
    assert_eq!(field, "extra_links[1]");
    assert!(
        matches!(
            p,
            Problem::DuplicateLink {
                a: 0,
                b: 5,
                kind: "DCN",
                ..
            }
        ),
        "{p:?}"
    );

    // An ICI link the torus already has.
    let (_, p) = problem(&format!("{base}[(a: 0, b: 1, kind: Ici)]"));
    assert!(
        matches!(
            p,
            Problem::DuplicateLink {
                a: 0,
                b: 1,
                kind: "ICI",
                ..
            }
        ),
        "{p:?}"
    );
    assert!(p.to_string().contains("torus"), "{p}");
}

#[test]
fn a_disconnected_pod_is_rejected() {
    let (field, p) =
        problem("generation: \"v5e\", shape: \"4x4\", slices: 2, dcn: (fabric: false)");
    assert_eq!(field, "extra_links");
    assert_eq!(
        p,
        Problem::Disconnected {
            unreachable: 16,
            count: 16
        }
    );
    assert!(p.to_string().contains("Dcn"), "tells how to fix it: {p}");
}

#[test]
fn bad_numbers_are_rejected() {
    let cases = [
        (
            "generation: \"v5e\", shape: \"4x4\", tick_ms: 0.0",
            "tick_ms",
        ),
        (
            "generation: \"v5e\", shape: \"4x4\", tick_ms: -1.0",
            "tick_ms",
        ),
        (
            "generation: \"v5e\", shape: \"4x4\", ici: (bandwidth_gb_per_s: 0.0)",
            "ici.bandwidth_gb_per_s",
        ),
        (
            "generation: \"v5e\", shape: \"4x4\", ici: (latency_us: -3.0)",
            "ici.latency_us",
        ),
        (
            "generation: \"v5e\", shape: \"4x4\", cores_per_chip: 0",
            "cores_per_chip",
        ),
        ("generation: \"v5e\", shape: \"4x4\", slices: 0", "slices"),
    ];
    for (fields, expected) in cases {
        let (field, p) = problem(fields);
        assert_eq!(field, expected, "{fields}");
        assert!(matches!(p, Problem::BadNumber { .. }), "{fields}: {p:?}");
    }
    let (field, p) = problem(
        "generation: \"v5e\", shape: \"4x4\", heartbeat: (interval_ms: 500.0, timeout_ms: 400.0)",
    );
    assert_eq!(field, "heartbeat.timeout_ms");
    assert!(
        matches!(p, Problem::TimeoutNotAfterInterval { .. }),
        "{p:?}"
    );
    let (_, p) = problem("generation: \"v4\", shape: \"256x256x256\"");
    assert!(matches!(p, Problem::TooManyChips { .. }), "{p:?}");
    // Would overflow 64 bits if multiplied naively.
    let (_, p) = problem(
        "generation: \"v4\", shape: \"4000000000x4000000000x4000000000\", slices: 4000000000",
    );
    assert!(
        matches!(
            p,
            Problem::TooManyChips {
                chips: u64::MAX,
                ..
            }
        ),
        "{p:?}"
    );
}

#[test]
fn semantic_errors_carry_file_and_line() {
    let text = "Pod(\n    name: \"x\",\n    generation: \"v9\",\n    shape: \"4x4\",\n)\n";
    let error = parse_topology(text, "pods/x.ron").unwrap_err();
    assert_eq!(
        error.to_string(),
        "pods/x.ron:3: `generation`: unknown TPU generation `v9` (known: v2, v3, v4, v5e, v5p, v6e, tpu7x)"
    );
}

fn syntax(text: &str) -> (usize, usize, String, String) {
    match parse_topology(text, "pods/bad.ron") {
        Err(TopologyError::Syntax {
            origin,
            line,
            column,
            field,
            message,
        }) => {
            assert_eq!(origin, "pods/bad.ron");
            (line, column, field, message)
        }
        other => panic!("expected a syntax error, got {other:?}"),
    }
}

#[test]
fn syntax_errors_name_file_line_column_and_field() {
    let (line, column, field, _) =
        syntax("Pod(\n    name: \"x\",\n    generation: \"v4\",\n    shape: 444,\n)\n");
    assert_eq!((line, field.as_str()), (4, "shape"));
    assert!(column > 1);

    let (line, _, field, _) = syntax(
        "Pod(\n  name: \"x\",\n  generation: \"v5e\",\n  shape: \"4x4\",\n  extra_links: [\n    (a: 0, b: 1, kind: Dcn),\n    (a: \"two\", b: 1, kind: Dcn),\n  ],\n)\n",
    );
    assert_eq!((line, field.as_str()), (7, "extra_links[1].a"));

    let (_, _, field, message) =
        syntax("Pod(name: \"x\", generation: \"v4\", shape: \"4x4x4\", shap: \"4\")");
    assert!(message.contains("shap"), "{message}");
    assert_eq!(field, "shap");

    let (_, _, _, message) = syntax("Pod(name: \"x\", generation: \"v4\")");
    assert!(
        message.contains("shape"),
        "names the missing field: {message}"
    );

    let (_, _, _, message) = syntax(
        "Pod(name: \"x\", generation: \"v5e\", shape: \"4x4\", extra_links: [(a: 0, b: 5, kind: Pcie)])",
    );
    assert!(message.contains("Pcie"), "{message}");

    let (line, _, _, _) =
        syntax("Pod(name: \"x\", generation: \"v4\", shape: \"4x4x4\")\ntrailing");
    assert_eq!(line, 2);
}

#[test]
fn missing_files_and_unknown_presets_say_what_exists() {
    let error = Pod::load("v9-1").unwrap_err().to_string();
    assert!(
        error.contains("v9-1") && error.contains("v5litepod-256") && error.contains("presets"),
        "{error}"
    );
    let error = Pod::from_file("/nonexistent/pod.ron")
        .unwrap_err()
        .to_string();
    assert!(error.contains("/nonexistent/pod.ron"), "{error}");
}

#[test]
fn link_figures_default_per_generation_and_can_be_overridden() {
    let default = pod("generation: \"v6e\", shape: \"4x4\"");
    assert_eq!(default.topology().ici.bytes_per_s, 100e9);
    let custom = pod(
        "generation: \"v6e\", shape: \"4x4\", ici: (bandwidth_gb_per_s: 10.0, latency_us: 2.5)",
    );
    assert_eq!(custom.topology().ici.bytes_per_s, 10e9);
    assert_eq!(custom.topology().ici.latency_ns, 2500);
    let mut custom = custom;
    let world = custom.world_mut();
    for link in world.query::<&Link>().iter(world) {
        assert_eq!(link.kind, LinkKind::Ici);
        assert_eq!((link.bytes_per_s, link.latency_ns), (10e9, 2500));
    }
}

/// All-pairs shortest paths by Floyd–Warshall: the oracle for the diameter.
fn floyd_warshall_diameter(topology: &optirs_tpu::topology::Topology) -> Option<u32> {
    let n = topology.num_devices() as usize;
    let mut d = vec![vec![u32::MAX / 2; n]; n];
    for (i, row) in d.iter_mut().enumerate() {
        row[i] = 0;
    }
    for link in topology.links() {
        let (a, b) = (link.a as usize, link.b as usize);
        d[a][b] = 1;
        d[b][a] = 1;
    }
    for k in 0..n {
        for i in 0..n {
            for j in 0..n {
                d[i][j] = d[i][j].min(d[i][k] + d[k][j]);
            }
        }
    }
    let longest = d.iter().flatten().copied().max().unwrap_or(0);
    (longest < u32::MAX / 2).then_some(longest)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    #[test]
    fn diameter_matches_floyd_warshall(
        x in 1u32..6, y in 1u32..6, wrap_x: bool, wrap_y: bool,
        extra in proptest::collection::vec((0u32..36, 0u32..36), 0..4),
    ) {
        let n = x * y;
        let mut links = String::new();
        let mut seen = std::collections::HashSet::new();
        for (a, b) in extra {
            let (a, b) = (a % n, b % n);
            if a != b && seen.insert((a.min(b), a.max(b))) {
                links += &format!("(a: {a}, b: {b}, kind: Dcn),");
            }
        }
        let fields = format!(
            "generation: \"v3\", shape: \"{x}x{y}\", custom: true, chips_per_host: \"1x1\", \
             wraparound: [{}, {}], extra_links: [{links}]",
            wrap_x && x >= 3, wrap_y && y >= 3,
        );
        let mut pod = pod(&fields);
        let expected = floyd_warshall_diameter(pod.topology());
        proptest::prop_assert_eq!(pod.figures().diameter_hops, expected, "{}", fields);
    }
}

#[test]
fn a_large_mesh_or_torus_diameter_comes_from_its_closed_form() {
    // 65,536 chips: a search from every chip is quadratic (minutes); the
    // closed form is the sum over axes of d - 1 (mesh) or d / 2 (ring).
    let started = std::time::Instant::now();
    let mut mesh =
        pod("generation: \"v3\", shape: \"256x256\", custom: true, wraparound: [false, false]");
    assert_eq!(mesh.figures().diameter_hops, Some(510));
    let mut mixed =
        pod("generation: \"v3\", shape: \"256x252\", custom: true, wraparound: [true, false]");
    assert_eq!(mixed.figures().diameter_hops, Some(128 + 251));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
    // The closed form agrees with the graph search on small shapes, including
    // rings of 3 and axes of 1 and 2 (see also `diameter_matches_floyd_warshall`).
    for (shape, wrap, expected) in [
        ("3x3x3", "[false, false, false]", 6),
        ("4x4x4", "[true, true, true]", 6),
        ("4x2x1", "[true, false, false]", 3),
        ("8x4x1", "[true, true, false]", 6),
    ] {
        let mut p = pod(&format!(
            "generation: \"v5p\", shape: \"{shape}\", custom: true, chips_per_host: \"1x1x1\", wraparound: {wrap}"
        ));
        assert_eq!(p.figures().diameter_hops, Some(expected), "{shape} {wrap}");
        let topology = p.topology().clone();
        assert_eq!(
            floyd_warshall_diameter(&topology),
            Some(expected),
            "{shape}"
        );
    }
}

#[test]
fn timing_settings_outside_their_ranges_are_rejected_naming_the_field() {
    // From the reliability sweep: both loaded, then `run --steps 5` queued
    // one heartbeat per elapsed interval per device and ran out of memory.
    let (field, p) = problem(
        "generation: \"v4\", shape: \"2x2x2\", heartbeat: (interval_ms: 1e-6, timeout_ms: 2e-6)",
    );
    assert_eq!(field, "heartbeat.interval_ms");
    assert!(
        matches!(p, Problem::IntervalShorterThanTick { .. }),
        "{p:?}"
    );
    let (field, p) = problem("generation: \"v5e\", shape: \"4x4\", tick_ms: 3.2e11");
    assert_eq!(field, "tick_ms");
    assert!(matches!(p, Problem::BadNumber { .. }), "{p:?}");
    // A tick longer than the default interval names the tick.
    let (field, p) = problem("generation: \"v5e\", shape: \"4x4\", tick_ms: 2000.0");
    assert_eq!(field, "tick_ms");
    assert!(
        matches!(p, Problem::IntervalShorterThanTick { .. }),
        "{p:?}"
    );
    for (fields, expected) in [
        ("tick_ms: 1e-4", "tick_ms"),
        ("tick_ms: 60001.0", "tick_ms"),
        (
            "heartbeat: (interval_ms: 3600001.0, timeout_ms: 7200000.0)",
            "heartbeat.interval_ms",
        ),
        (
            "heartbeat: (timeout_ms: 86400001.0)",
            "heartbeat.timeout_ms",
        ),
    ] {
        let (field, p) = problem(&format!("generation: \"v5e\", shape: \"4x4\", {fields}"));
        assert_eq!(field, expected, "{fields}");
        assert!(matches!(p, Problem::BadNumber { .. }), "{fields}: {p:?}");
    }
    // The edges of the ranges load.
    for fields in [
        "tick_ms: 0.001, heartbeat: (interval_ms: 0.001, timeout_ms: 0.1)",
        "tick_ms: 60000.0, heartbeat: (interval_ms: 60000.0, timeout_ms: 86400000.0)",
        "heartbeat: (interval_ms: 3600000.0, timeout_ms: 86400000.0)",
    ] {
        let text = text(&format!("generation: \"v5e\", shape: \"4x4\", {fields}"));
        parse_topology(&text, "test.ron").unwrap_or_else(|e| panic!("{fields}: {e}"));
    }
}

#[test]
fn control_latency_that_outlasts_the_heartbeat_timeout_is_rejected() {
    // From the sweep: accepted, and all 16 healthy devices failed at ~10 s.
    let (field, p) = problem("generation: \"v5e\", shape: \"4x4\", dcn: (latency_us: 9500000.0)");
    assert_eq!(field, "dcn.latency_us");
    assert!(
        matches!(p, Problem::ControlLatencyExceedsTimeout { .. }),
        "{p:?}"
    );
    assert!(
        p.to_string()
            .contains("latency + jitter + interval <= timeout"),
        "{p}"
    );
    let error = parse_topology(
        &text("generation: \"v5e\", shape: \"4x4\",\n dcn: (latency_us: 9500000.0)"),
        "lat.ron",
    )
    .unwrap_err()
    .to_string();
    assert!(error.starts_with("lat.ron:2: `dcn.latency_us`"), "{error}");
    // A timeout that leaves no room for the default latency names the timeout.
    let (field, p) = problem(
        "generation: \"v5e\", shape: \"4x4\", heartbeat: (interval_ms: 1000.0, timeout_ms: 1000.005)",
    );
    assert_eq!(field, "heartbeat.timeout_ms");
    assert!(
        matches!(p, Problem::ControlLatencyExceedsTimeout { .. }),
        "{p:?}"
    );
    // Exactly at the bound loads, and no healthy device fails.
    let mut pod = pod("generation: \"v5e\", shape: \"4x4\", dcn: (latency_us: 9000000.0)");
    pod.run(3_000);
    assert!(pod.failures().is_empty(), "{:?}", pod.failures());
}

#[test]
fn an_empty_pod_name_is_rejected_naming_the_field() {
    for name in ["", "   "] {
        let text = format!(
            "Pod(\n    name: \"{name}\",\n    generation: \"v5e\",\n    shape: \"4x4\",\n)\n"
        );
        match parse_topology(&text, "blank.ron") {
            Err(TopologyError::Invalid {
                field,
                problem,
                line,
                ..
            }) => {
                assert_eq!(field, "name");
                assert_eq!(*problem, Problem::EmptyName);
                assert_eq!(line, Some(2));
            }
            other => panic!("expected the name to be refused, got {other:?}"),
        }
    }
}

#[test]
fn every_preset_is_an_offered_shape_or_says_it_is_custom() {
    for (name, text) in PRESETS {
        let topology = load_preset(name).unwrap();
        let offered = topology
            .generation
            .spec()
            .slice_shapes
            .offers(topology.dims);
        if offered {
            assert!(
                topology.warnings.is_empty(),
                "{name}: {:?}",
                topology.warnings
            );
        } else {
            assert!(text.contains("custom: true"), "{name} is not a Cloud shape");
            assert_eq!(topology.warnings.len(), 1, "{name}");
            assert!(topology.warnings[0].contains("custom: true"), "{name}");
        }
    }
    // The deliberately unreal pod, once the `v2-8` preset: 8 v2 chips.
    let custom = optirs_tpu::topology::load_topology("assets/pods/examples/v2-4x2-custom.ron");
    assert!(!custom.unwrap().warnings.is_empty());
}

#[test]
fn a_shape_google_does_not_offer_is_refused_with_file_line_field_and_the_offered_shapes() {
    let file =
        "Pod(\n    name: \"v5p-x\",\n    generation: \"v5p\",\n    shape: \"16x16x28\",\n)\n";
    let error = parse_topology(file, "pods/v5p.ron").unwrap_err();
    let message = error.to_string();
    assert!(
        message.starts_with(
            "pods/v5p.ron:4: `shape`: v5p slices are not offered in shape `16x16x28` (offered: \
             2x2x1, 2x2x2, 2x2x4, 2x4x4, and any AxBxC of whole 4x4x4 cubes"
        ),
        "{message}"
    );
    assert!(message.contains("up to 6144 chips"), "{message}");
    assert!(
        message.ends_with("set `custom: true` to load it anyway"),
        "{message}"
    );
    // 2D generations list their shapes.
    let (field, p) = problem("generation: \"v5e\", shape: \"3x5\"");
    assert_eq!(field, "shape");
    assert!(
        p.to_string()
            .contains("offered: 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16"),
        "{p}"
    );
    // The largest v5p slice and the largest v4 slice load; one cube more does not.
    parse_topology(&text("generation: \"v5p\", shape: \"16x16x24\""), "t").unwrap();
    parse_topology(&text("generation: \"v4\", shape: \"16x16x16\""), "t").unwrap();
    let (_, p) = problem("generation: \"v4\", shape: \"16x16x20\"");
    assert!(matches!(p, Problem::ShapeNotOffered { .. }), "{p:?}");
    // Axis order does not matter: 8x4 is Cloud's 4x8.
    parse_topology(&text("generation: \"v3\", shape: \"8x4\""), "t").unwrap();
}

#[test]
fn a_custom_shape_loads_with_a_warning_the_figures_carry() {
    let mut pod = pod("generation: \"v5e\", shape: \"3x5\", custom: true, chips_per_host: \"1x1\"");
    let warnings = pod.topology().warnings.clone();
    assert_eq!(warnings.len(), 1);
    assert!(
        warnings[0].contains("`3x5` is not a slice shape"),
        "{warnings:?}"
    );
    assert_eq!(pod.figures().warnings, warnings);
    // `custom: true` on an offered shape is not silently meaningless either.
    let offered = parse_topology(
        &text("generation: \"v5e\", shape: \"4x4\", custom: true"),
        "t",
    );
    assert!(offered.unwrap().warnings[0].contains("changes nothing"));
    // `custom: false` is the default: refused.
    let (_, p) = problem("generation: \"v5e\", shape: \"3x5\", custom: false");
    assert!(matches!(p, Problem::ShapeNotOffered { .. }), "{p:?}");
}

#[test]
fn the_topology_command_prints_the_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("odd.ron");
    std::fs::write(
        &path,
        "Pod(name: \"odd\", generation: \"v5e\", shape: \"3x5\", custom: true, chips_per_host: \"1x1\")",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_optirs-tpu"))
        .args(["topology", path.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning:") && stderr.contains("`3x5`"),
        "{stderr}"
    );
    let figures: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(figures["warnings"].as_array().unwrap().len(), 1);
}

#[test]
fn every_cloud_accelerator_type_is_a_pod_of_cloud_s_chips_shape_and_hosts() {
    use optirs_tpu::topology::{cloud_type, cloud_types};
    let types = cloud_types();
    // Cloud's published sizes (the v2..v6e pages, the v5p table, XPK).
    for (name, chips, shape, hosts) in [
        ("v2-8", 4, "2x2", 1),
        ("v2-512", 256, "16x16", 64),
        ("v3-2048", 1024, "32x32", 256),
        ("v4-8", 4, "2x2x1", 1),
        ("v4-16", 8, "2x2x2", 2),
        ("v4-4096", 2048, "8x16x16", 512),
        ("v4-8192", 4096, "16x16x16", 1024),
        ("v5litepod-1", 1, "1x1", 1),
        ("v5e-16", 16, "4x4", 2),
        ("v5litepod-256", 256, "16x16", 32),
        ("v5p-8", 4, "2x2x1", 1),
        ("v5p-128", 64, "4x4x4", 16),
        ("v5p-1024", 512, "8x8x8", 128),
        ("v5p-12288", 6144, "16x16x24", 1536),
        ("v5p-17920", 8960, "16x20x28", 2240),
        ("v6e-1", 1, "1x1", 1),
        ("v6e-256", 256, "16x16", 32),
        ("tpu7x-2", 1, "1x1x1", 1),
        ("tpu7x-18432", 9216, "16x24x24", 2304),
    ] {
        let cloud = cloud_type(name).unwrap_or_else(|| panic!("{name}"));
        assert_eq!(
            (cloud.chips, cloud.shape, cloud.hosts),
            (chips, shape, hosts),
            "{name}"
        );
    }
    let mut names: Vec<&str> = types.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), types.len(), "one shape per size");
    // Every type builds, with no warning, as the catalogue says; the
    // small ones are spawned too.
    for cloud in types {
        let topology = load_preset(&cloud.name).unwrap_or_else(|e| panic!("{}: {e}", cloud.name));
        assert!(
            topology.warnings.is_empty(),
            "{}: {:?}",
            cloud.name,
            topology.warnings
        );
        assert_eq!(topology.num_devices(), cloud.chips, "{}", cloud.name);
        assert_eq!(topology.num_hosts(), cloud.hosts, "{}", cloud.name);
        assert_eq!(topology.shape_string(), cloud.shape, "{}", cloud.name);
    }
    // The bundled files are the catalogue's pods.
    for (name, _) in PRESETS {
        let cloud = cloud_type(name).unwrap();
        let topology = load_preset(name).unwrap();
        assert_eq!(
            (
                topology.num_devices(),
                topology.num_hosts(),
                topology.shape_string()
            ),
            (cloud.chips, cloud.hosts, cloud.shape.to_string()),
            "{name}"
        );
    }
}

#[test]
fn a_family_name_cloud_does_not_sell_is_refused_with_the_cloud_name() {
    for (name, wanted) in [
        ("v4-4", "`v4-8`"),
        ("v5p-1000", "`v5p-1024`"),
        ("v5e-3", "`v5e-4`"),
        ("v5litepod-300", "`v5litepod-256`"),
        ("tpu7x-3", "`tpu7x-2`"),
    ] {
        let error = load_preset(name).unwrap_err();
        assert!(
            matches!(error, TopologyError::NotCloudType { .. }),
            "{name}: {error:?}"
        );
        assert!(error.to_string().contains(wanted), "{name}: {error}");
    }
    // `v4-4` as a chip count is Cloud's v4-8: the message says so.
    let error = load_preset("v4-4").unwrap_err().to_string();
    assert!(
        error.contains("count TensorCores, 2 a chip; 4 chips (2x2x1) is `v4-8`"),
        "{error}"
    );
    // Not of a family's form: the presets and a did-you-mean.
    let error = load_preset("v5e16").unwrap_err();
    assert!(
        matches!(error, TopologyError::UnknownPod { .. }),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("did you mean `v5e-16`?"),
        "{error}"
    );
}

#[test]
fn the_old_chip_count_names_say_what_they_mean_now() {
    use optirs_tpu::topology::RENAMED;
    use optirs_tpu::topology::presets::renamed_note;
    for (old, now) in RENAMED {
        let note = renamed_note(old).unwrap();
        assert!(note.contains(&format!("`{now}`")), "{note}");
        // The new name holds the old pod: twice Cloud's chips for the old name.
        let then = optirs_tpu::topology::load_topology(now).unwrap();
        assert_eq!(
            then.num_devices(),
            2 * load_preset(old).unwrap().num_devices(),
            "{old}"
        );
    }
    assert_eq!(renamed_note("v4-16"), None);
}
