//! `optirs-tpu run`: step a pod.

use super::output;
use anyhow::Result;
use clap::Args;
use optirs_tpu::Pod;
use optirs_tpu::topology::DEFAULT_PRESET;
use serde::Serialize;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// A preset name (see `optirs-tpu presets`) or a pod file path.
    #[arg(default_value = DEFAULT_PRESET)]
    pod: String,
    /// Ticks to run.
    #[arg(long, default_value_t = 1000)]
    steps: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// What `run` reports.
#[derive(Serialize, Debug)]
struct RunReport {
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
}

pub fn run(args: RunArgs) -> Result<()> {
    let build_start = Instant::now();
    let mut pod = Pod::load(&args.pod)?;
    let build_seconds = build_start.elapsed().as_secs_f64();
    let start = Instant::now();
    pod.run(args.steps);
    let wall_seconds = start.elapsed().as_secs_f64();
    let topology = pod.topology();
    let report = RunReport {
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
        wall_ns_per_tick: wall_seconds * 1e9 / args.steps.max(1) as f64,
    };
    if args.json {
        return output::print_json(&report);
    }
    output::print_text(&format!(
        "pod {} ({}, {} chips on {} hosts, {} links), built in {}\n\
         ran {} ticks: {} simulated in {} wall ({} per tick)\n",
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
    ))
}
