//! `optirs-tpu topology` and `optirs-tpu presets`.

use super::{output, parse};
use anyhow::Result;
use clap::Args;
use optirs_tpu::Pod;
use optirs_tpu::topology::{DEFAULT_PRESET, cloud_types, to_dot};
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
    /// Only this generation's accelerator types (`v4`, `v5e`, `tpu7x`).
    #[arg(long)]
    generation: Option<String>,
    /// Print a JSON list instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct PresetRow {
    name: &'static str,
    alias: Option<&'static str>,
    generation: &'static str,
    shape: &'static str,
    chips: u32,
    hosts: u32,
    /// What the name's number counts: `TensorCores` or `chips`.
    counts: &'static str,
}

/// Every Cloud accelerator type: name, shape, chips, hosts (from the
/// catalogue, without building the pods).
pub fn presets(args: PresetsArgs) -> Result<()> {
    if let Some(wanted) = &args.generation {
        wanted
            .parse::<optirs_tpu::hardware::TpuGeneration>()
            .map_err(|e| parse::usage(format!("--generation: {e}")))?;
    }
    let rows: Vec<PresetRow> = cloud_types()
        .iter()
        .filter(|t| {
            args.generation
                .as_deref()
                .is_none_or(|g| g.trim().eq_ignore_ascii_case(t.generation))
        })
        .map(|t| PresetRow {
            name: &t.name,
            alias: t.alias.as_deref(),
            generation: t.generation,
            shape: t.shape,
            chips: t.chips,
            hosts: t.hosts,
            counts: t.counts(),
        })
        .collect();
    if args.json {
        return output::print_json(&rows);
    }
    let mut text = format!(
        "{:<16} {:<5} {:<9} {:>5} {:>5}  {}\n",
        "preset", "gen", "shape", "chips", "hosts", "name counts"
    );
    for row in rows {
        let alias = row
            .alias
            .map(|a| format!(" (alias {a})"))
            .unwrap_or_default();
        text += &format!(
            "{:<16} {:<5} {:<9} {:>5} {:>5}  {}{alias}\n",
            row.name, row.generation, row.shape, row.chips, row.hosts, row.counts
        );
    }
    output::print_text(&text)
}
