//! `optirs-tpu bench`: wall-clock benchmarks of the engine's schedules.

use super::parse::{parse_count, parse_count_u64};
use super::{output, progress};
use anyhow::Result;
use clap::builder::PossibleValuesParser;
use clap::{Args, Subcommand};
use optirs_tpu::topology::DEFAULT_PRESET;
use optirs_tpu::tpu::bench::BENCH_OPTIMIZERS;
use optirs_tpu::xla::backend::schedule_timing::{BUNDLED_PROGRAMS, ScheduleBench, bench_schedules};

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Time every system of the `Step` and `Compile` schedules per run
    /// (mean, p50, p99), grouped by the set it runs in.
    Schedule(ScheduleArgs),
    /// Time the compiled optimizer step, in place and with a fresh output,
    /// against the machine's streaming floor (the bytes the update must move
    /// at the best rate of an add, a sum and a copy over its working set
    /// with every core), a plain copy and a hand-written fresh-output loop,
    /// in paired rounds of one run.
    Optimizer(OptimizerArgs),
}

#[derive(Args, Debug)]
pub struct OptimizerArgs {
    /// The optimizer.
    #[arg(long, default_value = "adam", ignore_case = true,
          value_parser = PossibleValuesParser::new(BENCH_OPTIMIZERS))]
    optimizer: String,
    /// Parameters (f32), at least 1: `10000000`, `10_000_000` or `1e7`.
    /// Refused before any allocation when the buffers would not fit in the
    /// available host memory.
    #[arg(long, default_value = "10000000", value_parser = parse_count,
          allow_negative_numbers = true)]
    size: usize,
    /// Timed paired rounds (each runs every side once), at least 1; then the
    /// in-place step as many times in a row (warm).
    #[arg(long, default_value_t = 21, value_parser = parse_count_u64,
          allow_negative_numbers = true)]
    steps: u64,
    /// Print one JSON object: optimizer, size, step_seconds (fresh output),
    /// in_place_step_seconds, floor_seconds, ratio_to_floor (in place),
    /// fresh_ratio_to_floor, warm_in_place_step_seconds,
    /// warm_floor_seconds, warm_ratio_to_floor, copy_seconds,
    /// fresh_loop_seconds, ratio_to_fresh_loop, compile_seconds, floor_gbps,
    /// floor_kernel, floor_threads (and bytes_per_step and the GB/s of each
    /// side).
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct ScheduleArgs {
    /// A preset name (see `optirs-tpu presets`) or a pod file path.
    #[arg(default_value = DEFAULT_PRESET)]
    pod: String,
    /// `Step` ticks to time, at least 1: `1000` or `1e3`.
    #[arg(long, default_value_t = 1000, value_parser = parse_count_u64,
          allow_negative_numbers = true)]
    steps: u64,
    /// Times each bundled program is compiled for the `Compile` rows, at
    /// least 1.
    #[arg(long, default_value_t = 5, value_parser = parse_count,
          allow_negative_numbers = true)]
    compile_runs: usize,
    /// Print one JSON object: {pod, steps, systems: [{name, set, mean_ns, p50_ns, p99_ns, ..}]}.
    #[arg(long)]
    json: bool,
}

pub fn bench(args: BenchArgs) -> Result<()> {
    match args.command {
        BenchCommand::Schedule(args) => schedule(args),
        BenchCommand::Optimizer(args) => optimizer(args),
    }
}

fn optimizer(args: OptimizerArgs) -> Result<()> {
    let steps = usize::try_from(args.steps)?;
    let spinner = progress::spinner(args.json, "bench optimizer");
    let bench = optirs_tpu::tpu::bench_optimizer(&args.optimizer, args.size, steps);
    spinner.finish_and_clear();
    let bench = bench?;
    if args.json {
        return output::print_json(&bench);
    }
    output::print_text(&format!("{bench}\n"))
}

fn schedule(args: ScheduleArgs) -> Result<()> {
    let total = args.steps + (args.compile_runs * BUNDLED_PROGRAMS.len()) as u64;
    let bar = progress::bar(total, args.json, "bench schedule");
    let result = bench_schedules(&args.pod, args.steps, args.compile_runs, &mut |done, _| {
        bar.set_position(done)
    });
    bar.finish_and_clear();
    let bench = result?;
    if args.json {
        return output::print_json(&bench);
    }
    output::print_text(&render(&bench, args.compile_runs))
}

/// The table: one row per system, `Step` then `Compile`, in run order.
fn render(bench: &ScheduleBench, compile_runs: usize) -> String {
    let mut text = format!(
        "pod {}: {} Step ticks; Compile over {} bundled programs x {compile_runs}\n",
        bench.pod,
        bench.steps,
        BUNDLED_PROGRAMS.len()
    );
    let mut schedule = "";
    for row in &bench.systems {
        if row.schedule != schedule {
            schedule = row.schedule;
            let total: f64 = bench
                .systems
                .iter()
                .filter(|s| s.schedule == schedule)
                .map(|s| s.mean_ns)
                .sum();
            text += &format!(
                "\n{schedule} (sum of means {})\n  {:<16} {:<60} {:>6} {:>10} {:>10} {:>10}\n",
                output::seconds(total * 1e-9),
                "set",
                "system",
                "runs",
                "mean",
                "p50",
                "p99"
            );
        }
        text += &format!(
            "  {:<16} {:<60} {:>6} {:>10} {:>10} {:>10}\n",
            row.set,
            short_name(&row.name),
            row.runs,
            output::seconds(row.mean_ns * 1e-9),
            output::seconds(row.p50_ns as f64 * 1e-9),
            output::seconds(row.p99_ns as f64 * 1e-9),
        );
    }
    text
}

/// `optirs_tpu::health::emit_heartbeats` → `health::emit_heartbeats`.
fn short_name(name: &str) -> &str {
    name.strip_prefix("optirs_tpu::").unwrap_or(name)
}
