//! `optirs-tpu collectives`: nccl-tests-style table on a pod's torus, or
//! hierarchically over a multislice pod (ICI inside each slice, DCN
//! across), with each pass's bytes and modeled time.

use super::parse::{parse_count, usage};
use super::{output, progress};
use anyhow::{Context, Result, bail};
use clap::Args;
use optirs_tpu::Pod;
use optirs_tpu::collectives::bench::{
    BenchOp, BenchRow, BenchTable, run_nccl_style_multislice, run_nccl_style_torus,
};
use optirs_tpu::collectives::pod::charge_links;
use optirs_tpu::collectives::{
    LinkModel, MultisliceShape, PassSummary, Traffic, multislice_all_gather_traffic,
    multislice_all_to_all_traffic, multislice_reduce_scatter_traffic,
};
use optirs_tpu::profile::trace::{Event, Trace};
use optirs_tpu::topology::{DEFAULT_PRESET, Topology};
use serde_json::json;
use std::path::PathBuf;

/// Host memory the benchmark may use for buffers (inputs and working copies).
const MAX_BENCH_BYTES: u128 = 4 << 30;

#[derive(Args, Debug)]
pub struct CollectivesArgs {
    /// A preset name or a pod file path (one slice, or several joined by
    /// the DCN fabric).
    #[arg(default_value = DEFAULT_PRESET)]
    pod: String,
    /// all_reduce, reduce_scatter, all_gather or broadcast.
    #[arg(long, default_value = "all_reduce")]
    op: BenchOp,
    /// Bytes per rank, comma-separated; K, M and G suffixes are powers of 2.
    #[arg(long, value_delimiter = ',', value_parser = parse_size,
          allow_negative_numbers = true, default_value = "4K,64K,1M,4M")]
    sizes: Vec<usize>,
    /// Print a JSON list of rows.
    #[arg(long)]
    json: bool,
    /// Write a Chrome/Perfetto trace of each size's modeled passes (ICI and
    /// DCN on their own tracks), sizes one after another. Never overwrites.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
}

/// `64K` → 65536: a positive whole number of bytes (digits, `_`, an
/// exponent: the count parser every command uses) with an optional K, M or
/// G suffix (powers of 2), a whole number of f32 elements.
fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let (digits, scale) = match text.chars().last() {
        Some('K' | 'k') => (&text[..text.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&text[..text.len() - 1], 1 << 20),
        Some('G' | 'g') => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    let value = parse_count(digits).map_err(|_| {
        format!("`{text}` is not a size in bytes above 0, like 4096, 1e6, 64K or 1M")
    })?;
    let bytes = value
        .checked_mul(scale)
        .ok_or_else(|| format!("`{text}` is too large"))?;
    if bytes % 4 != 0 {
        return Err(format!(
            "`{text}` ({}) is not a whole number of f32 elements (4 bytes each)",
            output::plural(bytes as u64, "byte", "bytes")
        ));
    }
    Ok(bytes)
}

pub fn collectives(args: CollectivesArgs) -> Result<()> {
    output::refuse_existing(&[("--trace", args.trace.as_deref())])?;
    let pod = Pod::load(&args.pod)?;
    if pod.topology().slices > 1 {
        return multislice(args, pod);
    }
    let shape = pod.torus_shape()?;
    check_memory(shape.device_count() as u128, &args.sizes)?;
    let topology = pod.topology().clone();
    let model = LinkModel::new(
        topology.ici.latency_ns as f64 * 1e-9,
        topology.ici.bytes_per_s,
    )?;
    let rows = each_size(&args, |size| {
        run_nccl_style_torus(args.op, &shape, &[size], model)
    })?;
    if let Some(path) = &args.trace {
        write_trace(path, &args, &rows, &|_| Vec::new())?;
    }
    if args.json {
        return output::print_json(&rows);
    }
    output::print_text(&format!(
        "# {} on {} ({} {}, {} ranks; model: ICI {:.0} GB/s per direction, {} ns per hop)\n{}",
        args.op,
        topology.name,
        topology.generation,
        topology.shape_string(),
        shape.device_count(),
        topology.ici.bytes_per_s / 1e9,
        topology.ici.latency_ns,
        BenchTable(&rows)
    ))
}

/// The rows of every `--sizes` entry, one size at a time, with a progress
/// bar on a terminal (a large size on a large pod takes a while).
fn each_size<E>(
    args: &CollectivesArgs,
    mut one: impl FnMut(usize) -> std::result::Result<Vec<BenchRow>, E>,
) -> Result<Vec<BenchRow>>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let bar = progress::bar(args.sizes.len() as u64, args.json, "collectives");
    let mut rows = Vec::with_capacity(args.sizes.len());
    for (done, &size) in args.sizes.iter().enumerate() {
        bar.set_message(format!("{} {}", args.op, output::bytes(size as u64)));
        rows.extend(one(size)?);
        bar.set_position(done as u64 + 1);
    }
    bar.finish_and_clear();
    Ok(rows)
}

fn check_memory(ranks: u128, sizes: &[usize]) -> Result<()> {
    if let Some(&largest) = sizes.iter().max() {
        let needed = 2 * ranks * largest as u128;
        if needed > MAX_BENCH_BYTES {
            bail!(
                "{} ranks x {largest} bytes ({}) needs {:.1} GiB of host memory for inputs and \
                 buffers; the limit is {} GiB: use smaller --sizes or a smaller pod",
                ranks,
                output::bytes(largest as u64),
                needed as f64 / (1u64 << 30) as f64,
                MAX_BENCH_BYTES >> 30
            );
        }
    }
    Ok(())
}

/// The traffic the hierarchical `op` puts on the links for `len` elements.
fn multislice_traffic(op: BenchOp, shape: &MultisliceShape, len: usize) -> Traffic {
    match op {
        BenchOp::ReduceScatter => multislice_reduce_scatter_traffic(shape, len, 4),
        BenchOp::AllGather => multislice_all_gather_traffic(shape, len, 4, 0),
        BenchOp::AllToAll => {
            let count = shape.device_count().max(1);
            multislice_all_to_all_traffic(shape, len - len % count, 4)
        }
        _ => {
            let mut t = multislice_reduce_scatter_traffic(shape, len, 4);
            t.transfers
                .extend(multislice_all_gather_traffic(shape, len, 4, 4).transfers);
            t
        }
    }
}

/// A multislice pod: the hierarchical collective, its traffic charged to
/// the pod's link entities (ICI and the DCN fabric's), each hop modeled
/// with its own link's figures.
fn multislice(args: CollectivesArgs, mut pod: Pod) -> Result<()> {
    let topology = pod.topology().clone();
    let shape = pod.multislice_shape()?;
    if args.op == BenchOp::Broadcast {
        return Err(usage(format!(
            "--op broadcast: broadcast across slices is not built: {} has {} slices; use \
             all_reduce, reduce_scatter, all_gather or all_to_all (hierarchical), or a one-slice \
             pod",
            topology.name, topology.slices
        )));
    }
    check_memory(shape.device_count() as u128, &args.sizes)?;
    let rows = multislice_rows(&args, &mut pod, &shape)?;
    if let Some(path) = &args.trace {
        write_trace(path, &args, &rows, &|row| row.passes.clone())?;
    }
    if args.json {
        return output::print_json(&rows);
    }
    let dcn_factor = dcn_bus_factor(args.op, shape.slices() as f64);
    let mut text = multislice_header(&args, &topology, &shape, dcn_factor, &rows)?;
    text += &pass_lines(&rows, dcn_factor);
    output::print_text(&text)
}

/// Every size's rows: the largest size's traffic is charged to the pod's
/// links first, so each hop is timed with its own link's model.
fn multislice_rows(
    args: &CollectivesArgs,
    pod: &mut Pod,
    shape: &MultisliceShape,
) -> Result<Vec<BenchRow>> {
    // Every hop of the largest size's schedule is a link entity of the pod
    // (smaller sizes use a subset); their models drive the time.
    let largest = args.sizes.iter().copied().max().unwrap_or(0) / 4;
    let charge = charge_links(
        pod.world_mut(),
        &multislice_traffic(args.op, shape, largest.max(shape.device_count())),
    )?;
    let link = |s: usize, d: usize| charge.model(s, d);
    each_size(args, |size| {
        run_nccl_style_multislice(args.op, shape, &[size], &link)
    })
}

/// The share of a size the DCN pass moves per slice, the factor from its
/// time to its bus bandwidth: `2 (n - 1) / n` for an all-reduce (a reduce
/// scatter then an all-gather), `(n - 1) / n` otherwise.
fn dcn_bus_factor(op: BenchOp, slices: f64) -> f64 {
    match op {
        BenchOp::AllReduce => 2.0 * (slices - 1.0) / slices,
        _ => (slices - 1.0) / slices,
    }
}

/// The comment lines above the table (the pod, the link models, the DCN
/// bandwidth to expect) and the table itself.
fn multislice_header(
    args: &CollectivesArgs,
    topology: &Topology,
    shape: &MultisliceShape,
    dcn_factor: f64,
    rows: &[BenchRow],
) -> Result<String> {
    let fabric = topology
        .dcn_fabric
        .context("multislice_shape needs the fabric")?;
    let rail = topology.fabric_link_params(&fabric);
    let hosts_per_slice = topology.num_hosts() / topology.slices;
    let slice_nics = f64::from(hosts_per_slice) * fabric.host_bytes_per_s / fabric.oversubscription;
    Ok(format!(
        "# {} on {} ({} slices of {} {}, {} ranks; hierarchical: ICI inside each slice, DCN across)\n\
         # model: ICI {:.0} GB/s per direction, {} ns per hop; DCN rails {:.2} GB/s each way \
         (host NICs {:.1} GB/s / {} rails / oversubscription {}), {} ns\n\
         # expected DCN bandwidth per slice: {} hosts x {:.1} GB/s / {} = {:.1} GB/s \
         (the bound of the DCN pass's bus bandwidth, {:.3} x size / DCN time)\n{}",
        args.op,
        topology.name,
        topology.slices,
        topology.generation,
        topology.shape_string(),
        shape.device_count(),
        topology.ici.bytes_per_s / 1e9,
        topology.ici.latency_ns,
        rail.bytes_per_s / 1e9,
        fabric.host_bytes_per_s / 1e9,
        topology.slices - 1,
        fabric.oversubscription,
        rail.latency_ns,
        hosts_per_slice,
        fabric.host_bytes_per_s / 1e9,
        fabric.oversubscription,
        slice_nics / 1e9,
        dcn_factor,
        BenchTable(rows)
    ))
}

/// One comment line per size: its passes with their links, bytes and
/// modeled time, and the DCN pass's share and bus bandwidth.
fn pass_lines(rows: &[BenchRow], dcn_factor: f64) -> String {
    let mut text = String::from("# passes (modeled):\n");
    for row in rows {
        let dcn: f64 = row
            .passes
            .iter()
            .filter(|p| p.is_dcn())
            .map(PassSummary::seconds)
            .sum();
        let parts: Vec<String> = row
            .passes
            .iter()
            .map(|p| {
                format!(
                    "{} {} {} {:.1} us",
                    p.name,
                    if p.is_dcn() { "DCN" } else { "ICI" },
                    output::bytes(p.bytes),
                    p.seconds() * 1e6
                )
            })
            .collect();
        let dcn_busbw = if dcn > 0.0 {
            dcn_factor * row.bytes as f64 / dcn / 1e9
        } else {
            0.0
        };
        text += &format!(
            "#{:>13}  {}; DCN {:.1} us of {:.1} us, DCN busbw {:.2} GB/s\n",
            row.bytes,
            parts.join(" | "),
            dcn * 1e6,
            row.modeled_seconds * 1e6,
            dcn_busbw
        );
    }
    text
}

/// Each size's passes as spans on an ICI and a DCN track, in modeled
/// time, sizes one after another (µs).
fn write_trace(
    path: &std::path::Path,
    args: &CollectivesArgs,
    rows: &[BenchRow],
    passes: &dyn Fn(&BenchRow) -> Vec<PassSummary>,
) -> Result<()> {
    let mut trace = Trace::new();
    trace
        .process(0, format!("{} on {}", args.op, args.pod))
        .thread(0, 0, "ICI")
        .thread(0, 1, "DCN");
    let mut offset = 0.0;
    for row in rows {
        let mut spans = passes(row);
        if spans.is_empty() {
            // One torus: the collective as one ICI span (its passes are
            // listed for multislice pods only).
            spans.push(PassSummary {
                order: 0,
                kind: optirs_tpu::collectives::PhaseKind::AllGather,
                dim: 0,
                name: row.op.clone(),
                bytes: 0,
                start_seconds: 0.0,
                end_seconds: row.modeled_seconds,
            });
        }
        for p in &spans {
            trace.push(
                Event::complete(
                    format!("{} ({} B)", p.name, row.bytes),
                    (offset + p.start_seconds) * 1e6,
                    p.seconds() * 1e6,
                )
                .on(0, u32::from(p.is_dcn()))
                .category(if p.is_dcn() { "dcn" } else { "ici" })
                .args(json!({"size_bytes": row.bytes, "link_bytes": p.bytes})),
            );
        }
        offset += row.modeled_seconds;
    }
    output::write_new("--trace", path, &serde_json::to_string(&trace)?)
}
