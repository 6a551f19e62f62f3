//! Prints an nccl-tests-style table for one collective on this CPU, with
//! the modeled time on links of the given latency and bandwidth.
//!
//! ```text
//! cargo run --release --example collectives_table -- OP RANKS LATENCY_US BANDWIDTH_GBPS [SIZE_BYTES ...]
//! cargo run --release --example collectives_table -- all_reduce 8 1 45 4000 400000 4000000
//! ```

use std::process::ExitCode;

use optirs_tpu::collectives::LinkModel;
use optirs_tpu::collectives::bench::{BenchOp, BenchTable, run_nccl_style};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(table) => {
            print!("{table}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("error: {message}");
            eprintln!(
                "usage: collectives_table OP RANKS LATENCY_US BANDWIDTH_GBPS [SIZE_BYTES ...]"
            );
            ExitCode::from(2)
        }
    }
}

fn run(args: &[String]) -> Result<String, String> {
    let [op, ranks, latency_us, bandwidth_gbps, sizes @ ..] = args else {
        return Err("expected at least four arguments".to_owned());
    };
    let op: BenchOp = op.parse().map_err(|e| format!("{e}"))?;
    let ranks: usize = ranks.parse().map_err(|e| format!("RANKS {ranks:?}: {e}"))?;
    let latency_us: f64 = latency_us
        .parse()
        .map_err(|e| format!("LATENCY_US {latency_us:?}: {e}"))?;
    let bandwidth_gbps: f64 = bandwidth_gbps
        .parse()
        .map_err(|e| format!("BANDWIDTH_GBPS {bandwidth_gbps:?}: {e}"))?;
    let sizes: Vec<usize> = if sizes.is_empty() {
        vec![4_000_000]
    } else {
        sizes
            .iter()
            .map(|s| s.parse().map_err(|e| format!("SIZE_BYTES {s:?}: {e}")))
            .collect::<Result<_, _>>()?
    };
    let model =
        LinkModel::new(latency_us * 1e-6, bandwidth_gbps * 1e9).map_err(|e| e.to_string())?;
    let rows = run_nccl_style(op, ranks, &sizes, model).map_err(|e| e.to_string())?;
    Ok(format!(
        "# {op}: {ranks} ranks in process, f32 sum; model: α = {latency_us} µs, β = {bandwidth_gbps} GB/s per link direction\n{}",
        BenchTable(&rows)
    ))
}
