//! Argument parsing and dispatch.

mod bench;
mod checkpoint;
mod collectives;
mod compile;
mod goodput;
mod interrupt;
mod model_step;
mod model_trace;
mod output;
mod parse;
mod plan;
mod plan_print;
mod progress;
mod ranks;
mod run;
mod topology;
mod train;
mod train_checks;
mod train_print;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// TPU pod coordination and an XLA-shaped optimizer compiler on a CPU
/// reference executor.
#[derive(Parser, Debug)]
#[command(name = "optirs-tpu", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Train a model: its optimizer sharded over every device of a pod,
    /// in simulated time, through failures (the main job).
    Train(train::TrainArgs),
    /// Step a pod in simulated time and report what happened.
    Run(run::RunArgs),
    /// Print a pod's topology figures (diameter, bisection, all-reduce bandwidth).
    Topology(topology::TopologyArgs),
    /// List the pod presets: every Cloud TPU accelerator type, with its
    /// chips, shape and hosts.
    Presets(topology::PresetsArgs),
    /// nccl-tests-style table of a collective on a pod's torus: measured on
    /// this CPU moving the real data, and modeled on the pod's links.
    Collectives(collectives::CollectivesArgs),
    /// Compile a program: pass table, kernels, fusion refusals, memory plan.
    Compile(compile::CompileArgs),
    /// Save, verify, restore, list and inspect whole-world checkpoints.
    Checkpoint(checkpoint::CheckpointArgs),
    /// Simulate a long training run through failures, checkpoints and
    /// recoveries, and report its goodput.
    #[command(
        override_usage = "optirs-tpu goodput [POD] --mtbf-hours <H> --days <D> \
                          [--model <NAME|FILE> | --model-params <N>] [OPTIONS]"
    )]
    Goodput(goodput::GoodputArgs),
    /// Wall-clock benchmarks: `bench schedule` times every system.
    Bench(bench::BenchArgs),
    /// The fastest layouts of a model on a pod that fit, by search over
    /// every strategy, mesh, remat policy, prefetch, reduction schedule and
    /// pipeline; each with the command that models it.
    Plan(plan::PlanArgs),
}

/// Parses the command line, runs the command, maps errors to exit codes.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return refuse_command_line(&error),
    };
    note_renamed_pods();
    let name = match &cli.command {
        Command::Train(_) => "train",
        Command::Run(_) => "run",
        Command::Topology(_) => "topology",
        Command::Presets(_) => "presets",
        Command::Collectives(_) => "collectives",
        Command::Compile(_) => "compile",
        Command::Checkpoint(_) => "checkpoint",
        Command::Bench(_) => "bench",
        Command::Goodput(_) => "goodput",
        Command::Plan(_) => "plan",
    };
    let refused = match name {
        "run" | "train" => Ok(()),
        other => ranks::refuse_split(other),
    };
    let result = refused.and_then(|()| match cli.command {
        Command::Train(args) => train_here_or_split(args),
        Command::Run(args) => run_here_or_split(args),
        Command::Topology(args) => topology::topology(args),
        Command::Presets(args) => topology::presets(args),
        Command::Checkpoint(args) => checkpoint::checkpoint(args),
        Command::Compile(args) => compile::compile(args),
        Command::Collectives(args) => collectives::collectives(args),
        Command::Goodput(args) => goodput::goodput(args),
        Command::Bench(args) => bench::bench(args),
        Command::Plan(args) => plan::plan_command(args),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if output::is_broken_pipe(&error) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", output::error_message(&error));
            ExitCode::from(if parse::is_usage(&error) { 2 } else { 1 })
        }
    }
}

/// A pod named by a name whose meaning changed when presets took Cloud's
/// accelerator types (`v4-16` was 8 chips, Cloud's is 4): one note on
/// stderr, so the change is not silent.
fn note_renamed_pods() {
    let note = std::env::args()
        .skip(2)
        .find_map(|arg| optirs_tpu::topology::presets::renamed_note(&arg));
    if let Some(note) = note {
        eprintln!("note: {note}");
    }
}

/// Help and the version print as clap prints them; any other command-line
/// error is one `error:` line on stderr, exit code 2.
fn refuse_command_line(error: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match error.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // A closed stdout (`--help | head`) is no failure.
            let _ = error.print();
            ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(2))
        }
        _ => {
            eprintln!("error: {}", parse::one_line(&error.render().to_string()));
            ExitCode::from(2)
        }
    }
}

/// `train` in this process, or split over the ranks an MPI launcher
/// started: the split run lives in [`ranks`], above both, so neither
/// command's module imports the other's.
fn train_here_or_split(args: train::TrainArgs) -> anyhow::Result<()> {
    args.refuse_misused_resume()?;
    args.refuse_unbuilt_layout()?;
    match ranks::launched()?.filter(|l| l.size > 1) {
        Some(launch) => ranks::train(args, launch),
        None => train::train(args),
    }
}

/// `run` in this process, or split over the ranks an MPI launcher started.
fn run_here_or_split(args: run::RunArgs) -> anyhow::Result<()> {
    args.check_outputs()?;
    match ranks::launched()? {
        Some(launch) => ranks::run(args, launch),
        None => run::run(args),
    }
}
