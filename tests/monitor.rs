//! Monitoring, profiling and pictures: the trace is valid Chrome/Perfetto
//! JSON, the SVGs are well-formed XML, exports never overwrite, and
//! `bench schedule --json` has its documented keys.

use ndarray::Array1;
use optirs_tpu::barrier::BarrierSpec;
use optirs_tpu::clock::SimDuration;
use optirs_tpu::collectives::ReduceOp;
use optirs_tpu::exec::kernels::Tensor;
use optirs_tpu::health::Fault;
use optirs_tpu::monitor::checks::Level;
use optirs_tpu::monitor::{DeviceHistory, HbmUsage, HealthChecks, MonitorConfig};
use optirs_tpu::optimizers::Adam;
use optirs_tpu::topology::DeviceId;
use optirs_tpu::tpu::state::DeviceHeap;
use optirs_tpu::xla::backend::profiling_integration::{ProfilingError, ProfilingIntegration};
use optirs_tpu::{Pod, TPUConfig, TPUOptimizer, TPUVersion};
use serde_json::Value;
use std::collections::HashMap;

#[path = "common/heap.rs"]
mod heap;
use heap::heap_used;

const ADAM: &str = include_str!("../assets/programs/adam.ron");

#[path = "common/binary.rs"]
mod binary;
use binary::optirs;

/// A profiled v4-16 that heartbeats, passes a barrier, all-reduces, loses a
/// device, compiles Adam and executes it.
fn profiled_run() -> ProfilingIntegration {
    let mut profiler = ProfilingIntegration::new();
    let mut pod = profiler.build_pod(|| Pod::from_preset("v4-16")).unwrap();
    assert!(
        profiler.memory().events.is_empty(),
        "empty until something ran"
    );
    let barrier = pod
        .create_barrier(BarrierSpec::named("start").auto_arrive())
        .unwrap();
    let mut buffers: Vec<Vec<f32>> = (0..8).map(|i| vec![i as f32; 1 << 12]).collect();
    let collective = pod.launch_all_reduce(&mut buffers, ReduceOp::Sum).unwrap();
    pod.schedule_fault(SimDuration::from_secs(1), Fault::KillDevice(DeviceId(3)));
    let ticks = 1_500; // 15 s: past the heartbeat timeout
    profiler.run(&mut pod, ticks, &mut |_| {});
    assert!(pod.barrier_outcome(barrier).is_some());
    assert!(
        pod.world()
            .get::<optirs_tpu::collectives::pod::CollectiveOutcome>(collective.entity)
            .is_some()
    );
    let report = profiler
        .compile_program_str(&mut pod, "adam", ADAM)
        .unwrap();
    let args: Vec<Tensor> = report
        .executable
        .parameters
        .iter()
        .map(|ty| Tensor::from_f64s(ty, &vec![0.5; ty.element_count()]).unwrap())
        .collect();
    let (_, timings) = report.executable.run_timed(&args).unwrap();
    profiler.record_kernels(&report.program, &timings);
    profiler
}

#[test]
fn trace_is_chrome_json_with_sane_monotonic_tracks() {
    let profiler = profiled_run();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    profiler.write_trace(&path).unwrap();
    let trace: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let events = trace["traceEvents"]
        .as_array()
        .expect("traceEvents is a list");
    let mut last: HashMap<(u64, u64), Vec<(f64, f64)>> = HashMap::new();
    let mut categories: HashMap<String, usize> = HashMap::new();
    for event in events {
        for key in ["name", "ph", "ts", "dur", "pid", "tid"] {
            assert!(event.get(key).is_some(), "no `{key}` in {event}");
        }
        let ph = event["ph"].as_str().unwrap();
        assert!(ph == "X" || ph == "M", "{event}");
        let ts = event["ts"].as_f64().unwrap();
        let dur = event["dur"].as_f64().unwrap();
        assert!(
            ts.is_finite() && ts >= 0.0 && dur.is_finite() && dur >= 0.0,
            "{event}"
        );
        if ph == "M" {
            continue;
        }
        *categories
            .entry(event["cat"].as_str().unwrap().to_string())
            .or_default() += 1;
        let track = (
            event["pid"].as_u64().unwrap(),
            event["tid"].as_u64().unwrap(),
        );
        // Per track: starts never go back, and slices nest or follow.
        let stack = last.entry(track).or_default();
        if let Some(&(prev_ts, _)) = stack.last() {
            assert!(
                ts >= prev_ts,
                "track {track:?} goes back in time at {event}"
            );
        }
        while stack.last().is_some_and(|&(s, d)| ts >= s + d) {
            stack.pop();
        }
        if let Some(&(s, d)) = stack.last() {
            assert!(
                ts + dur <= s + d + 1e-3,
                "track {track:?}: {event} overlaps without nesting"
            );
        }
        stack.push((ts, dur));
    }
    for cat in [
        "Step",
        "step",
        "heartbeats",
        "barriers",
        "collectives",
        "failures",
        "Compile",
        "compile",
        "pass",
        "kernel",
    ] {
        assert!(
            categories.get(cat).is_some_and(|&n| n > 0),
            "no `{cat}` events: {categories:?}"
        );
    }
    let counters = profiler.counters();
    assert_eq!(counters.ticks, 1_500);
    assert_eq!(counters.failures, 1);
    assert_eq!(counters.collectives, 1);
    assert_eq!(counters.compiles, 1);
    assert!(counters.kernels_executed > 0);
    assert!(counters.heartbeats > 100);
}

#[test]
fn memory_export_of_a_run_that_reserved_nothing_is_empty_and_never_overwrites() {
    let profiler = profiled_run();
    let memory = profiler.memory();
    // The run compiled and executed a program off the pod's devices: no
    // device memory was reserved, so there is nothing to export.
    assert!(
        memory.events.is_empty() && memory.peaks.is_empty(),
        "{memory:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("memory.json");
    profiler.write_memory(&path).unwrap();
    let again = profiler.write_memory(&path).unwrap_err();
    assert!(matches!(again, ProfilingError::Exists { .. }), "{again}");
    assert!(again.to_string().contains("never overwrite"), "{again}");
}

/// HBM of the chip the optimizer runs on: small, so real tensors fill it.
const HBM: u64 = 1 << 20;

/// Adam on one chip of a v4-16 whose HBM is [`HBM`].
fn adam_on_pod() -> TPUOptimizer<Adam<f32>, f32> {
    let config = TPUConfig {
        tpu_version: TPUVersion::V4,
        num_cores: 2,
        hbm_bytes: Some(HBM),
        ..Default::default()
    };
    let pod = Pod::from_preset("v4-16").unwrap();
    TPUOptimizer::on_pod(Adam::new(0.01f32), config, pod).unwrap()
}

/// Runs the pod for one sample interval; device 0's memory check and the
/// HBM bytes of its newest sample.
fn sample_memory(opt: &mut TPUOptimizer<Adam<f32>, f32>) -> (Level, u64) {
    let pod = opt.pod_mut().unwrap();
    let every = pod.world().resource::<MonitorConfig>().sample_every_ns;
    pod.run(every.div_ceil(pod.clock().tick_ns));
    let entity = pod.device_entity(0).unwrap();
    let level = pod
        .world()
        .get::<HealthChecks>(entity)
        .unwrap()
        .memory
        .level();
    let history = pod.world().resource::<DeviceHistory>();
    let sample = history.device(0).last().unwrap();
    assert_eq!(sample.hbm_capacity, HBM);
    (level, sample.hbm_used)
}

/// Elements whose two f32 moments take `fraction` of [`HBM`], and their bytes.
fn adam_state(fraction: f64) -> (usize, u64) {
    let n = (HBM as f64 * fraction / 8.0) as usize;
    (n, 2 * (4 * n as u64).next_multiple_of(64))
}

#[test]
fn memory_pressure_follows_the_optimizer_state_resident_in_hbm() {
    let mut opt = adam_on_pod();
    let step = |opt: &mut TPUOptimizer<Adam<f32>, f32>, n: usize| {
        let p = Array1::from_elem(n, 0.5f32);
        opt.tpu_step(&p, &p).map(|_| ())
    };
    assert_eq!(sample_memory(&mut opt), (Level::Ok, 0));

    // 10 %: the step runs; the moments stay resident after it.
    let (n, bytes) = adam_state(0.10);
    step(&mut opt, n).unwrap();
    step(&mut opt, n).unwrap();
    assert_eq!((opt.hbm_usage(0), heap_used(&opt)), (bytes, bytes));
    assert_eq!(sample_memory(&mut opt), (Level::Ok, bytes));

    // 90 %: the state is created; the step cannot fit beside it.
    opt.reset_state();
    let (n, bytes) = adam_state(0.90);
    let err = step(&mut opt, n).unwrap_err().to_string();
    assert!(err.contains("out of HBM: the program `"), "{err}");
    assert_eq!(sample_memory(&mut opt), (Level::Warning, bytes));

    // 97 %: critical.
    opt.reset_state();
    let (n, bytes) = adam_state(0.97);
    step(&mut opt, n).unwrap_err();
    assert_eq!(sample_memory(&mut opt), (Level::Critical, bytes));
    let snapshot = opt.snapshot().unwrap();

    // Released: back to OK on the next sample.
    opt.reset_state();
    assert_eq!((opt.hbm_usage(0), heap_used(&opt)), (0, 0));
    assert_eq!(sample_memory(&mut opt), (Level::Ok, 0));

    // A restored pod has the state resident again, and it can be released.
    opt.restore(&snapshot).unwrap();
    assert_eq!((opt.hbm_usage(0), heap_used(&opt)), (bytes, bytes));
    assert_eq!(sample_memory(&mut opt), (Level::Critical, bytes));
    opt.reset_state();
    assert_eq!(heap_used(&opt), 0);
    assert_eq!(sample_memory(&mut opt), (Level::Ok, 0));

    // So does a pod built from the snapshot, and an optimizer adopts it.
    let pod = Pod::from_snapshot(&snapshot).unwrap();
    let entity = pod.device_entity(0).unwrap();
    assert_eq!(pod.world().get::<HbmUsage>(entity), Some(&HbmUsage(bytes)));
    let heap = pod.world().get::<DeviceHeap>(entity).unwrap();
    assert_eq!(heap.0.used_bytes() as u64, bytes);
    let idle = pod.device_entity(1).unwrap();
    assert!(
        pod.world().get::<DeviceHeap>(idle).is_none(),
        "no heap where nothing runs"
    );
    let config = opt.config().clone();
    let mut adopted = TPUOptimizer::on_pod(Adam::new(0.01f32), config, pod).unwrap();
    assert_eq!(adopted.slot("mu").map(|t| t.len()), Some(n));
    assert_eq!((adopted.hbm_usage(0), heap_used(&adopted)), (bytes, bytes));
    adopted.reset_state();
    assert_eq!((adopted.hbm_usage(0), heap_used(&adopted)), (0, 0));
}

#[test]
fn an_optimizer_on_a_pod_checks_its_configuration() {
    let pod = || Pod::from_preset("v4-16").unwrap();
    let config = |version, num_cores| TPUConfig {
        tpu_version: version,
        num_cores,
        ..Default::default()
    };
    let err = TPUOptimizer::on_pod(Adam::new(0.01f32), config(TPUVersion::V5e, 1), pod())
        .unwrap_err()
        .to_string();
    assert!(err.contains("is a v4 pod"), "{err}");
    let err = TPUOptimizer::on_pod(Adam::new(0.01f32), config(TPUVersion::V4, 32), pod())
        .unwrap_err()
        .to_string();
    assert!(err.contains("needs 16 chips, but v4-16 has 8"), "{err}");
}

fn parse_svg(text: &str) -> roxmltree::Document<'_> {
    let doc = roxmltree::Document::parse(text).expect("well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc
}

#[test]
fn topology_svg_is_well_formed_and_marks_failed_devices() {
    let mut pod = Pod::from_preset("v4-128").unwrap();
    pod.kill_device(7).unwrap();
    pod.run(1_500);
    let svg = optirs_tpu::svg::topology_svg(pod.world_mut());
    let doc = parse_svg(&svg);
    let titles: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text())
        .collect();
    let devices = titles.iter().filter(|t| t.starts_with("device ")).count();
    assert_eq!(devices, 64);
    assert!(
        titles
            .iter()
            .any(|t| t.starts_with("device 7 ") && t.ends_with("failed")),
        "{titles:?}"
    );
    assert_eq!(titles.iter().filter(|t| t.ends_with(": failed")).count(), 1);
    assert!(titles.iter().any(|t| t.starts_with("host ")));
    // Every torus link of the 4x4x4 pod is drawn once, z links included.
    let links: Vec<&str> = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("link"))
        .filter_map(|n| n.children().find(|c| c.has_tag_name("title")))
        .filter_map(|t| t.text())
        .collect();
    assert_eq!(links.len(), pod.figures().links as usize);
    assert_eq!(links.len(), 3 * 64, "a 4x4x4 torus has 3 links per device");
    let z = links.iter().filter(|t| t.contains(" z")).count();
    assert_eq!(z, 64, "4x4 rings of 4 along z");
    let z_wraps = links
        .iter()
        .filter(|t| t.contains(" z, wraparound"))
        .count();
    assert_eq!(z_wraps, 16, "one wraparound per z ring");
    let distinct: std::collections::HashSet<&&str> = links.iter().collect();
    assert_eq!(distinct.len(), links.len(), "no link drawn twice");
}

#[test]
fn graph_and_memory_svgs_are_well_formed() {
    let report = optirs_tpu::xla::compile_program_str("adam", ADAM).unwrap();
    let graph = report.to_svg();
    let doc = parse_svg(&graph);
    let fused = doc
        .descendants()
        .filter(|n| n.text().is_some_and(|t| t.starts_with("fused kernel")))
        .count();
    assert!(fused >= 1, "adam has at least one fused kernel");
    let memory = report.to_memory_svg();
    let doc = parse_svg(&memory);
    let buffers = doc
        .descendants()
        .filter(|n| n.has_tag_name("rect") && n.children().any(|c| c.has_tag_name("title")))
        .count();
    assert_eq!(buffers, report.buffers.len());
}

#[test]
fn bench_schedule_json_has_its_keys() {
    let output = optirs(&[
        "bench",
        "schedule",
        "v4-16",
        "--steps",
        "20",
        "--compile-runs",
        "1",
        "--json",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.stderr.is_empty(), "no progress bar off a terminal");
    let bench: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(bench["pod"], "v4-16");
    assert_eq!(bench["steps"], 20);
    let systems = bench["systems"].as_array().unwrap();
    assert!(systems.len() >= 15, "{systems:?}");
    for system in systems {
        for key in ["name", "set", "mean_ns", "p50_ns", "p99_ns"] {
            assert!(system.get(key).is_some(), "no `{key}` in {system}");
        }
        assert!(system["p50_ns"].as_u64().unwrap() <= system["p99_ns"].as_u64().unwrap());
    }
    let sets: Vec<&str> = systems.iter().filter_map(|s| s["set"].as_str()).collect();
    for set in [
        "Heartbeats",
        "FaultDetection",
        "Monitor",
        "Simplify",
        "Lower",
    ] {
        assert!(sets.contains(&set), "no system in {set}: {sets:?}");
    }
}

#[test]
fn run_trace_writes_a_valid_file_and_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.json");
    let path_str = path.to_str().unwrap();
    let first = optirs(&[
        "run", "v4-16", "--steps", "50", "--json", "--trace", path_str,
    ]);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let trace: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert!(trace["traceEvents"].as_array().unwrap().len() > 50);
    let before = std::fs::read(&path).unwrap();
    let second = optirs(&["run", "v4-16", "--steps", "5", "--trace", path_str]);
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("already exists") && stderr.contains("never overwrites"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the first trace is intact"
    );
}

#[test]
fn topology_and_compile_svg_flags_write_files() {
    let dir = tempfile::tempdir().unwrap();
    let pod = dir.path().join("pod.svg");
    let graph = dir.path().join("graph.svg");
    let memory = dir.path().join("memory.svg");
    let out = optirs(&["topology", "v5e-16", "--svg", pod.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = optirs(&[
        "compile",
        "assets/programs/mlp.ron",
        "--svg",
        graph.to_str().unwrap(),
        "--memory-svg",
        memory.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for path in [pod, graph, memory] {
        parse_svg(&std::fs::read_to_string(&path).unwrap());
    }
}

#[test]
fn svg_and_dot_exports_refuse_an_existing_file() {
    let dir = tempfile::tempdir().unwrap();
    let existing = dir.path().join("existing.svg");
    std::fs::write(&existing, "keep me").unwrap();
    let existing = existing.to_str().unwrap();
    let fresh = dir.path().join("fresh.svg");
    let fresh = fresh.to_str().unwrap();
    let program = "assets/programs/mlp.ron";
    let refused = [
        (vec!["topology", "v4-16", "--svg", existing], "--svg"),
        (vec!["topology", "v4-16", "--dot", existing], "--dot"),
        (vec!["compile", program, "--svg", existing], "--svg"),
        (
            vec!["compile", program, "--svg", fresh, "--memory-svg", existing],
            "--memory-svg",
        ),
        (vec!["compile", program, "--dot", existing], "--dot"),
    ];
    for (args, flag) in refused {
        let out = optirs(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "{existing} already exists; {flag} never overwrites a file"
            )),
            "{args:?}: {stderr}"
        );
        assert_eq!(std::fs::read_to_string(existing).unwrap(), "keep me");
        assert!(
            !std::path::Path::new(fresh).exists(),
            "{args:?}: nothing is written when one export is refused"
        );
    }
    let out = optirs(&["compile", program, "--svg", fresh, "--memory-svg", fresh]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--svg and --memory-svg both name"),
        "{stderr}"
    );
    assert!(!std::path::Path::new(fresh).exists());
}

#[test]
fn no_progress_bar_when_output_is_not_a_terminal() {
    let out = optirs(&["run", "v4-16", "--steps", "200"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("monitor: "),
        "the report has the monitor's lines: {text}"
    );
}

/// The monitor's health checks on a live pod.
mod health_checks {
    use optirs_tpu::health::Fault;
    use optirs_tpu::monitor::*;
    use optirs_tpu::pod::Pod;
    use optirs_tpu::topology::DeviceId;

    fn checks(pod: &Pod, device: u32) -> HealthChecks {
        let entity = pod.device_entity(device).unwrap();
        *pod.world().get::<HealthChecks>(entity).unwrap()
    }

    fn interval(pod: &Pod) -> u64 {
        pod.world().resource::<MonitorConfig>().sample_every_ns
    }

    /// Runs until `ns` more simulated time has passed.
    fn run_for(pod: &mut Pod, ns: u64) {
        let ticks = ns.div_ceil(pod.clock().tick_ns);
        pod.run(ticks);
    }

    #[test]
    fn a_quiet_pod_is_healthy_and_its_history_is_bounded() {
        let mut pod = Pod::from_preset("v4-16").unwrap();
        let len = pod.world().resource::<MonitorConfig>().history_len;
        let every = interval(&pod);
        run_for(&mut pod, every * (len as u64 + 20));
        for device in 0..8 {
            assert_eq!(
                checks(&pod, device),
                HealthChecks::default(),
                "device {device}"
            );
            let history = pod.world().resource::<DeviceHistory>();
            assert_eq!(
                history.device(device as usize).count(),
                len,
                "exactly history_len samples"
            );
        }
        assert_eq!(pod.world().resource::<DeviceHistory>().len(), len);
        let report = performance_report(pod.world_mut(), None);
        assert_eq!(report.checks.ok, 8);
        assert!(report.availability.p50 > 0.85, "{report:?}");
        assert!(report.heartbeat_latency_ns.p50 > 0.0);
    }

    #[test]
    fn heartbeat_checks_cross_and_recover_with_a_pause() {
        let mut pod = Pod::from_preset("v4-16").unwrap();
        let thresholds = *pod.world().resource::<HealthThresholds>();
        let every = interval(&pod);
        run_for(&mut pod, 4 * every);
        pod.inject(Fault::PauseDevice(DeviceId(5))).unwrap();
        let paused_at = pod.clock().now_ns;
        run_for(&mut pod, thresholds.heartbeat_age_warning_ns + 2 * every);
        let c = checks(&pod, 5);
        assert!(
            matches!(c.heartbeat, CheckState::Warning { since_ns } if since_ns > paused_at),
            "{c:?}"
        );
        assert_eq!(
            checks(&pod, 4).heartbeat,
            CheckState::Ok,
            "peers stay healthy"
        );
        pod.inject(Fault::ResumeDevice(DeviceId(5))).unwrap();
        run_for(&mut pod, 2 * every);
        assert_eq!(
            checks(&pod, 5).heartbeat,
            CheckState::Ok,
            "back once heartbeats arrive"
        );
    }

    #[test]
    fn a_killed_device_goes_critical() {
        let mut pod = Pod::from_preset("v4-16").unwrap();
        let thresholds = *pod.world().resource::<HealthThresholds>();
        let every = interval(&pod);
        run_for(&mut pod, 4 * every);
        pod.kill_device(2).unwrap();
        run_for(&mut pod, thresholds.heartbeat_age_critical_ns + 2 * every);
        let c = checks(&pod, 2);
        assert!(matches!(c.heartbeat, CheckState::Critical { .. }), "{c:?}");
        assert!(matches!(c.error_rate, CheckState::Critical { .. }), "{c:?}");
        let report = performance_report(pod.world_mut(), None);
        assert_eq!(report.checks.critical, 1);
    }

    #[test]
    fn memory_pressure_crosses_both_thresholds_and_back() {
        let mut pod = Pod::from_preset("v4-16").unwrap();
        let entity = pod.device_entity(1).unwrap();
        let capacity = pod
            .world()
            .get::<optirs_tpu::topology::HbmCapacity>(entity)
            .unwrap()
            .0;
        let every = interval(&pod);
        let set = |pod: &mut Pod, fraction: f64| {
            pod.world_mut()
                .entity_mut(entity)
                .insert(HbmUsage((capacity as f64 * fraction) as u64));
            run_for(pod, every);
            checks(pod, 1).memory.level()
        };
        assert_eq!(set(&mut pod, 0.50), checks::Level::Ok);
        assert_eq!(set(&mut pod, 0.90), checks::Level::Warning);
        assert_eq!(set(&mut pod, 0.97), checks::Level::Critical);
        assert_eq!(set(&mut pod, 0.10), checks::Level::Ok);
    }

    #[test]
    fn a_slow_control_path_straggles_until_it_is_fixed() {
        let mut pod = Pod::from_preset("v4-16").unwrap();
        let every = interval(&pod);
        let window = pod.world().resource::<MonitorConfig>().window_samples as u64;
        let base = pod
            .world()
            .resource::<optirs_tpu::health::HeartbeatConfig>()
            .control_latency_ns;
        run_for(&mut pod, 2 * every);
        pod.inject(Fault::DeviceJitter(DeviceId(6), base * 20))
            .unwrap();
        run_for(&mut pod, (window + 1) * every);
        assert_eq!(checks(&pod, 6).straggling.level(), checks::Level::Warning);
        assert_eq!(checks(&pod, 0).straggling.level(), checks::Level::Ok);
        pod.inject(Fault::DeviceJitter(DeviceId(6), 0)).unwrap();
        run_for(&mut pod, (window + 1) * every);
        assert_eq!(checks(&pod, 6).straggling.level(), checks::Level::Ok);
    }

    #[test]
    fn link_rates_follow_traffic() {
        let mut pod = Pod::from_preset("v4-16").unwrap();
        let every = interval(&pod);
        run_for(&mut pod, every);
        pod.send_data(0, 1, 1 << 30).unwrap();
        run_for(&mut pod, 3 * every);
        let report = performance_report(pod.world_mut(), Some(&[1000, 2000, 3000]));
        assert!(report.link_bytes_per_s.max > 0.0, "{report:?}");
        assert!(report.link_peak_bytes_per_s >= report.link_bytes_per_s.max);
        assert_eq!(report.link_bytes_per_s.p50, 0.0, "most links stay idle");
        assert_eq!(report.busiest_links[0].ends, (0, 1));
        assert_eq!(report.step_wall_ns.unwrap().p50, 2000.0);
    }

    #[test]
    fn the_sliding_window_equals_a_sum_over_the_newest_samples() {
        let mut pod = Pod::from_preset("v4-16").unwrap();
        let every = interval(&pod);
        pod.inject(Fault::DeviceJitter(DeviceId(2), 50_000))
            .unwrap();
        run_for(&mut pod, 30 * every);
        let window = pod.world().resource::<MonitorConfig>().window_samples;
        let history = pod.world().resource::<DeviceHistory>();
        for device in 0..8u32 {
            let summed = checks::Window::of(history.device(device as usize).rev().take(window));
            let entity = pod.device_entity(device).unwrap();
            let kept = pod.world().get::<DeviceMetrics>(entity).unwrap().window;
            assert_eq!(
                (kept.heard, kept.latency_sum_ns),
                (summed.heard, summed.latency_sum_ns)
            );
            assert!((kept.expected - summed.expected).abs() < 1e-9);
        }
    }
}
