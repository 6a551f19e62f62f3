//! `optirs-tpu compile PROGRAM.ron`: run the compiler pipeline and report.

use super::output;
use anyhow::Result;
use clap::Args;
use clap::builder::PossibleValuesParser;
use optirs_tpu::exec::loop_plan;
use optirs_tpu::exec::runtime::Runtime;
use optirs_tpu::xla::executable::Executable;
use optirs_tpu::xla::passes::OPTIONAL_PASSES;
use optirs_tpu::xla::{CompileOptions, compile_program_file_with};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct CompileArgs {
    /// A program file (see docs/programs.md; examples in assets/programs/).
    program: PathBuf,
    /// Print one JSON object: passes, kernels, fusion_refusals, memory, cost.
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
    /// Skip an optional pass by name (repeatable; with fusion disabled each
    /// op is its own kernel). The program still runs and computes the same
    /// values.
    #[arg(long = "disable-pass", value_name = "NAME",
          value_parser = PossibleValuesParser::new(OPTIONAL_PASSES))]
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
    let mut text = format!("{report}");
    text.push_str(&execution_section(&report.executable));
    output::print_text(&text)
}

/// How the fast runtime runs each kernel: fused loops as native code or,
/// with the reason, through the chunk interpreter, each with what loop
/// planning decided.
fn execution_section(exe: &Arc<Executable>) -> String {
    let runtime = Runtime::new(exe.clone());
    let mut out = String::from("\nexecution (exec::runtime)\n");
    let kernels = exe
        .kernels
        .iter()
        .zip(runtime.native_loops())
        .zip(runtime.loop_plans());
    for ((kernel, native), plan) in kernels {
        let name = kernel.name.split(':').next().unwrap_or(&kernel.name);
        let how = match native {
            Some(Ok(())) => "native loop".to_owned(),
            Some(Err(why)) => format!("interpreted loop: {why}"),
            None => "whole-tensor kernels".to_owned(),
        };
        out.push_str(&format!("  {name:<16} {how}\n"));
        if let Some((_, stats)) = plan {
            out.push_str(&format!("  {:<16} {}: {stats}\n", "", loop_plan::NAME));
        }
    }
    out
}
