//! `optirs-tpu compile PROGRAM.ron`: run the compiler pipeline and report.

use super::output;
use anyhow::Result;
use clap::Args;
use optirs_tpu::xla::{CompileOptions, compile_program_file_with};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct CompileArgs {
    /// A program file (see docs/programs.md; examples in assets/programs/).
    program: PathBuf,
    /// Print one JSON object: passes, kernels, fusion_refusals, memory.
    #[arg(long)]
    json: bool,
    /// Also write the optimized graph with its fusion groups as Graphviz.
    /// Like every export, it never overwrites an existing file.
    #[arg(long, value_name = "FILE")]
    dot: Option<PathBuf>,
    /// Also draw the optimized graph as SVG, fused kernels as coloured
    /// groups. Never overwrites an existing file.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Also draw the memory plan as SVG: buffers as rectangles over
    /// time (plan steps) x heap offset. Never overwrites an existing file.
    #[arg(long, value_name = "FILE")]
    memory_svg: Option<PathBuf>,
    /// Skip an optional pass by name (repeatable): constant-folding,
    /// algebraic-simplifier, cse, dce, fusion.
    #[arg(long = "disable-pass", value_name = "NAME")]
    disable_pass: Vec<String>,
    /// Run the verifier after every pass.
    #[arg(long)]
    verify_each_pass: bool,
}

pub fn compile(args: CompileArgs) -> Result<()> {
    let options = CompileOptions {
        disabled_passes: args.disable_pass,
        verify_each_pass: args.verify_each_pass.then_some(true),
    };
    output::refuse_existing(&[
        ("--dot", args.dot.as_deref()),
        ("--svg", args.svg.as_deref()),
        ("--memory-svg", args.memory_svg.as_deref()),
    ])?;
    let report = compile_program_file_with(&args.program, &options)?;
    if let Some(path) = &args.dot {
        output::write_new("--dot", path, &report.to_dot())?;
    }
    if let Some(path) = &args.svg {
        output::write_new("--svg", path, &report.to_svg())?;
    }
    if let Some(path) = &args.memory_svg {
        output::write_new("--memory-svg", path, &report.to_memory_svg())?;
    }
    if args.json {
        return output::print_json(&report);
    }
    output::print_text(&format!("{report}"))
}
