//! `optirs-tpu run`: step a pod.

use super::{output, progress};
use anyhow::{Result, bail};
use clap::Args;
use optirs_tpu::Pod;
use optirs_tpu::health::Fault;
use optirs_tpu::topology::DEFAULT_PRESET;
use optirs_tpu::topology::DeviceId;
use optirs_tpu::xla::backend::profiling_integration::ProfilingIntegration;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// A preset name (see `optirs-tpu presets`) or a pod file path.
    #[arg(default_value = DEFAULT_PRESET)]
    pod: String,
    /// Ticks to run.
    #[arg(long, default_value_t = 1000)]
    steps: u64,
    /// Kill a device at a simulated time: `DEVICE@SECONDS` (repeatable).
    #[arg(long, value_name = "DEVICE@SECONDS", value_parser = parse_timed_device)]
    kill: Vec<(u32, f64)>,
    /// Pause a device (it stops responding) at a simulated time (repeatable).
    #[arg(long, value_name = "DEVICE@SECONDS", value_parser = parse_timed_device)]
    pause: Vec<(u32, f64)>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Write a Chrome/Perfetto trace of the run (systems in wall time,
    /// devices in simulated time). An existing file is never overwritten.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
}

/// Parses `5@3.5` into device 5 at 3.5 s.
fn parse_timed_device(text: &str) -> Result<(u32, f64), String> {
    let (device, seconds) = text
        .split_once('@')
        .ok_or_else(|| format!("`{text}` is not DEVICE@SECONDS (e.g. 5@3.5)"))?;
    let device = device
        .trim()
        .parse::<u32>()
        .map_err(|_| format!("`{device}` is not a device id"))?;
    let seconds = seconds
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e9)
        .ok_or_else(|| format!("`{seconds}` is not a time in seconds"))?;
    Ok((device, seconds))
}

/// One detected failure, in seconds.
#[derive(Serialize, Debug)]
struct FailureRow {
    device: u32,
    injected_at_s: Option<f64>,
    detected_at_s: f64,
}

/// What `run` (and `checkpoint restore`) report.
#[derive(Serialize, Debug)]
pub struct RunReport {
    pod: String,
    generation: String,
    devices: u32,
    hosts: u32,
    links: usize,
    ticks: u64,
    tick_ns: u64,
    simulated_seconds: f64,
    build_seconds: f64,
    wall_seconds: f64,
    wall_ns_per_tick: f64,
    failures: Vec<FailureRow>,
    world_sha256: String,
}

pub fn run(args: RunArgs) -> Result<()> {
    if let Some(path) = &args.trace
        && path.exists()
    {
        bail!(
            "{} already exists; --trace never overwrites a file: choose a new path or remove it",
            path.display()
        );
    }
    let mut profiler = args.trace.as_ref().map(|_| ProfilingIntegration::new());
    let build_start = Instant::now();
    let mut pod = match &profiler {
        Some(profiler) => profiler.build_pod(|| Pod::load(&args.pod))?,
        None => Pod::load(&args.pod)?,
    };
    let build_seconds = build_start.elapsed().as_secs_f64();
    let devices = pod.topology().num_devices();
    let faults = args
        .kill
        .iter()
        .map(|&(d, s)| (d, s, Fault::KillDevice(DeviceId(d))))
        .chain(
            args.pause
                .iter()
                .map(|&(d, s)| (d, s, Fault::PauseDevice(DeviceId(d)))),
        );
    for (device, seconds, fault) in faults {
        if device >= devices {
            bail!(
                "device {device} does not exist: {} has devices 0..{devices}",
                args.pod
            );
        }
        pod.schedule_fault((seconds * 1e9).round() as u64, fault);
    }
    let bar = progress::bar(args.steps, args.json, "run");
    let start = Instant::now();
    match &mut profiler {
        Some(profiler) => profiler.run(&mut pod, args.steps, &mut |done| {
            if done % 64 == 0 {
                bar.set_position(done)
            }
        }),
        None => {
            for done in 1..=args.steps {
                pod.step();
                if done % 64 == 0 {
                    bar.set_position(done);
                }
            }
        }
    }
    let wall_seconds = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let report = report_after(&mut pod, args.steps, build_seconds, wall_seconds)?;
    if let (Some(profiler), Some(path)) = (&profiler, &args.trace) {
        profiler.write_trace(path)?;
    }
    print_report(&report, args.json)
}

/// Runs `steps` ticks and reports the pod's state after them.
pub fn step_and_report(pod: &mut Pod, steps: u64, build_seconds: f64) -> Result<RunReport> {
    let start = Instant::now();
    pod.run(steps);
    let wall_seconds = start.elapsed().as_secs_f64();
    report_after(pod, steps, build_seconds, wall_seconds)
}

/// Reports the pod's state after `steps` ticks that took `wall_seconds`.
fn report_after(
    pod: &mut Pod,
    steps: u64,
    build_seconds: f64,
    wall_seconds: f64,
) -> Result<RunReport> {
    let world_sha256 = pod.world_sha256()?;
    let topology = pod.topology();
    Ok(RunReport {
        pod: topology.name.clone(),
        generation: topology.generation.to_string(),
        devices: topology.num_devices(),
        hosts: topology.num_hosts(),
        links: topology.links().len(),
        ticks: pod.clock().tick,
        tick_ns: pod.clock().tick_ns,
        simulated_seconds: pod.clock().now_seconds(),
        build_seconds,
        wall_seconds,
        wall_ns_per_tick: wall_seconds * 1e9 / steps.max(1) as f64,
        failures: pod
            .failures()
            .iter()
            .map(|record| FailureRow {
                device: record.device.0,
                injected_at_s: record.injected_at_ns.map(|ns| ns as f64 * 1e-9),
                detected_at_s: record.detected_at_ns as f64 * 1e-9,
            })
            .collect(),
        world_sha256,
    })
}

/// Prints a report as JSON or text.
pub fn print_report(report: &RunReport, json: bool) -> Result<()> {
    if json {
        return output::print_json(report);
    }
    let mut failures = String::new();
    for row in &report.failures {
        let injected = row
            .injected_at_s
            .map_or("no injected fault".to_string(), |s| {
                format!("fault at {s:.3} s")
            });
        failures += &format!(
            "  device {:>5} failed: {injected}, detected at {:.3} s\n",
            row.device, row.detected_at_s
        );
    }
    if report.failures.is_empty() {
        failures = "  no failures detected\n".to_string();
    }
    output::print_text(&format!(
        "pod {} ({}, {} chips on {} hosts, {} links), built in {}\n\
         at tick {}: {} simulated; ran in {} wall ({} per tick)\n{failures}\
         world sha256 {}\n",
        report.pod,
        report.generation,
        report.devices,
        report.hosts,
        report.links,
        output::seconds(report.build_seconds),
        report.ticks,
        output::seconds(report.simulated_seconds),
        output::seconds(report.wall_seconds),
        output::seconds(report.wall_ns_per_tick * 1e-9),
        report.world_sha256,
    ))
}
