//! `optirs-tpu collectives`: nccl-tests-style table on a pod's torus.

use super::output;
use anyhow::{Result, bail};
use clap::Args;
use optirs_tpu::Pod;
use optirs_tpu::collectives::LinkModel;
use optirs_tpu::collectives::bench::{BenchOp, BenchTable, run_nccl_style_torus};
use optirs_tpu::topology::DEFAULT_PRESET;

/// Host memory the benchmark may use for buffers (inputs and working copies).
const MAX_BENCH_BYTES: u128 = 4 << 30;

#[derive(Args, Debug)]
pub struct CollectivesArgs {
    /// A preset name or a pod file path (one slice).
    #[arg(default_value = DEFAULT_PRESET)]
    pod: String,
    /// all_reduce, reduce_scatter, all_gather or broadcast.
    #[arg(long, default_value = "all_reduce")]
    op: BenchOp,
    /// Bytes per rank, comma-separated; K, M and G suffixes are powers of 2.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "4K,64K,1M,4M")]
    sizes: Vec<usize>,
    /// Print a JSON list of rows.
    #[arg(long)]
    json: bool,
}

/// `64K` → 65536.
fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let (digits, scale) = match text.chars().last() {
        Some('K' | 'k') => (&text[..text.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&text[..text.len() - 1], 1 << 20),
        Some('G' | 'g') => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    let value: usize = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size like 4096, 64K or 1M"))?;
    let bytes = value
        .checked_mul(scale)
        .ok_or_else(|| format!("`{text}` is too large"))?;
    if bytes % 4 != 0 {
        return Err(format!(
            "{bytes} bytes is not a whole number of f32 elements"
        ));
    }
    Ok(bytes)
}

pub fn collectives(args: CollectivesArgs) -> Result<()> {
    let pod = Pod::load(&args.pod)?;
    let shape = pod.torus_shape()?;
    let ranks = shape.device_count() as u128;
    if let Some(&largest) = args.sizes.iter().max() {
        let needed = 2 * ranks * largest as u128;
        if needed > MAX_BENCH_BYTES {
            bail!(
                "{} ranks x {largest} bytes needs {:.1} GiB of host memory for inputs and buffers; \
                 the limit is {} GiB: use smaller --sizes or a smaller pod",
                ranks,
                needed as f64 / (1u64 << 30) as f64,
                MAX_BENCH_BYTES >> 30
            );
        }
    }
    let topology = pod.topology();
    let model = LinkModel::new(
        topology.ici.latency_ns as f64 * 1e-9,
        topology.ici.bytes_per_s,
    )?;
    let rows = run_nccl_style_torus(args.op, &shape, &args.sizes, model)?;
    if args.json {
        return output::print_json(&rows);
    }
    output::print_text(&format!(
        "# {} on {} ({} {}, {} ranks; model: ICI {:.0} GB/s per direction, {} ns per hop)\n{}",
        args.op,
        topology.name,
        topology.generation,
        topology.shape_string(),
        ranks,
        topology.ici.bytes_per_s / 1e9,
        topology.ici.latency_ns,
        BenchTable(&rows)
    ))
}
