//! `optirs-tpu topology` and `optirs-tpu presets`.

use super::output;
use anyhow::Result;
use clap::Args;
use optirs_tpu::Pod;
use optirs_tpu::topology::{DEFAULT_PRESET, PRESETS, load_preset, to_dot};
use serde::Serialize;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct TopologyArgs {
    /// A preset name (see `optirs-tpu presets`) or a pod file path.
    #[arg(default_value = DEFAULT_PRESET)]
    pod: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Also write the pod as a Graphviz graph (hosts as clusters). Like
    /// every export, it never overwrites an existing file.
    #[arg(long, value_name = "FILE")]
    dot: Option<PathBuf>,
    /// Also draw the pod as SVG: hosts, devices on their torus coordinates,
    /// every link (z links as stubs), failed devices marked; z-planes side
    /// by side; for a cube-built pod, the cubes, each optical circuit's
    /// switch and the OCS assignment. Never overwrites an existing file.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

pub fn topology(args: TopologyArgs) -> Result<()> {
    output::refuse_existing(&[
        ("--dot", args.dot.as_deref()),
        ("--svg", args.svg.as_deref()),
    ])?;
    let mut pod = Pod::load(&args.pod)?;
    let figures = pod.figures();
    for warning in &figures.warnings {
        eprintln!("warning: {}: {warning}", args.pod);
    }
    if let Some(path) = &args.dot {
        output::write_new("--dot", path, &to_dot(pod.world_mut()))?;
    }
    if let Some(path) = &args.svg {
        output::write_new(
            "--svg",
            path,
            &optirs_tpu::svg::topology_svg(pod.world_mut()),
        )?;
    }
    if args.json {
        return output::print_json(&figures);
    }
    let diameter = figures
        .diameter_hops
        .map_or_else(|| "disconnected".to_string(), |d| d.to_string());
    let topology = pod.topology();
    let cubes = topology.cubes.map_or_else(String::new, |c| {
        format!(
            "  cubes          {} of the pod's {} ({}x{}x{} each), {} spare; {} optical circuit \
             switches; swap {}\n",
            topology.slice_cubes(),
            c.pod_cubes,
            c.edge,
            c.edge,
            c.edge,
            c.spares,
            c.ocs_count(),
            output::seconds(c.reconfigure_seconds())
        )
    });
    let wrap: Vec<&str> = topology.wraparound[..topology.ndims]
        .iter()
        .map(|&w| if w { "torus" } else { "mesh" })
        .collect();
    output::print_text(&format!(
        "{name}: {generation} {shape} ({wrap}){slices}\n\
         \x20 devices        {devices} chips, {cores} TensorCores, {hbm:.0} GiB HBM\n\
         \x20 hosts          {hosts}\n\
         \x20 links          {links} ({ici} ICI, {dcn} DCN)\n\
         {cubes}\
         \x20 diameter       {diameter} hops\n\
         \x20 bisection      {bisection} (cut across {cut})\n\
         \x20 DCN bisection  {dcn_bisection}\n\
         \x20 all-reduce     {allreduce}\n\
         \x20 mean path      {mean_hops} hops\n\
         \x20 all-to-all     {alltoall} (bound)\n",
        name = figures.name,
        generation = figures.generation,
        shape = figures.shape,
        wrap = wrap.join(" x ") + if figures.twisted { ", twisted" } else { "" },
        slices = if figures.slices > 1 {
            format!(" x {} slices", figures.slices)
        } else {
            String::new()
        },
        devices = figures.devices,
        cores = figures.cores,
        hbm = figures.hbm_bytes as f64 / (1u64 << 30) as f64,
        hosts = figures.hosts,
        links = figures.links,
        ici = figures.ici_links,
        dcn = figures.dcn_links,
        bisection = output::bytes_per_s(figures.bisection_bytes_per_s),
        cut = figures.bisection_cut.as_deref().unwrap_or("nothing"),
        dcn_bisection = if figures.slices > 1 {
            output::bytes_per_s(figures.dcn_bisection_bytes_per_s)
        } else {
            "- (one slice)".to_string()
        },
        allreduce = output::bytes_per_s(figures.allreduce_bytes_per_s),
        mean_hops = figures
            .mean_hops
            .map_or_else(|| "-".to_string(), |h| format!("{h:.2}")),
        alltoall = output::bytes_per_s(figures.alltoall_bytes_per_s),
    ))
}

#[derive(Args, Debug)]
pub struct PresetsArgs {
    /// Print a JSON list instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct PresetRow {
    name: &'static str,
    generation: String,
    shape: String,
    devices: u32,
    hosts: u32,
    description: String,
}

pub fn presets(args: PresetsArgs) -> Result<()> {
    let mut rows = Vec::new();
    for (name, _) in PRESETS {
        let topology = load_preset(name)?;
        rows.push(PresetRow {
            name,
            generation: topology.generation.to_string(),
            shape: topology.shape_string(),
            devices: topology.num_devices(),
            hosts: topology.num_hosts(),
            description: topology.description.clone(),
        });
    }
    if args.json {
        return output::print_json(&rows);
    }
    let mut text = format!(
        "{:<9} {:<4} {:<10} {:>7} {:>6}  description\n",
        "preset", "gen", "shape", "chips", "hosts"
    );
    for row in rows {
        text += &format!(
            "{:<9} {:<4} {:<10} {:>7} {:>6}  {}\n",
            row.name, row.generation, row.shape, row.devices, row.hosts, row.description
        );
    }
    output::print_text(&text)
}
