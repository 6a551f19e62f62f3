//! An XLA-shaped compiler whose graph lives in a `bevy_ecs` world and whose
//! passes are systems of the `Compile` schedule ([`crate::schedule::Compile`]).
//!
//! * [`graph`]: the IR as components (program, node, operands, types, literals, outputs).
//! * [`builder::GraphBuilder`] builds graphs from Rust; [`program`] loads the
//!   RON format of `docs/programs.md`.
//! * [`passes`]: verify → shape inference → {constant folding, algebraic
//!   simplification, CSE, DCE} to a fixed point → fusion → cost analysis →
//!   ordering → memory planning → lowering, each in its `CompileSystems` set.
//! * [`cost::op_cost`]: flops, transcendentals and bytes of one op, by XLA's
//!   `HloCostAnalysis` rules; [`passes::cost_analysis::analyze`] costs a
//!   whole program (fusion-aware once kernels exist).
//! * [`interpreter::interpret`]: the unoptimized reference (the oracle).
//! * [`executable::Executable`]: the lowered program and its evaluator.
//! * [`report::CompileReport`]: the pass table, kernels, fusion refusals, cost and
//!   memory plan, as JSON, text and Graphviz.
//!
//! # Entry points for a host
//!
//! ```no_run
//! use optirs_tpu::xla;
//! let report = xla::compile_program_file("assets/programs/adam.ron".as_ref())?;
//! println!("{report}");                 // human tables
//! println!("{}", report.to_json());     // {passes, kernels, fusion_refusals, memory, cost}
//! std::fs::write("adam.dot", report.to_dot())?;
//! let outputs = report.executable.run(&[/* one Tensor per parameter */])?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`compile_program_file_with`] / [`compile_program_str_with`] take
//! [`CompileOptions`]: pass names to disable (`--disable-pass cse`) and
//! whether to verify after every pass.
//!
//! In a world shared with other domains: call
//! [`crate::schedule::init_schedules`], then [`install`]; spawn programs with
//! [`GraphBuilder`] or [`program::spawn_program`] (they carry
//! [`graph::PendingCompile`]); run the `Compile` schedule; read
//! [`CompileReport`] with [`report_for`]. To compile a program again after
//! editing its graph, insert [`graph::PendingCompile`] on it and run the
//! schedule again; its kernels, buffers and pass log are replaced.
//!
//! ```
//! use bevy_ecs::world::World;
//! use optirs_tpu::exec::kernels::Tensor;
//! use optirs_tpu::schedule::{Compile, init_schedules};
//! use optirs_tpu::xla::{self, DType, GraphBuilder, TensorType, UnaryOp};
//!
//! let mut world = World::new();
//! init_schedules(&mut world);
//! xla::install(&mut world);
//! let mut b = GraphBuilder::new(&mut world, "softplus-ish");
//! let x = b.parameter(TensorType::new(DType::F32, [3]));
//! let e = b.unary(UnaryOp::Exp, x);
//! let one = b.scalar(DType::F32, 1.0);
//! let s = b.add(e, one);
//! let y = b.unary(UnaryOp::Log, s);
//! b.output(y);
//! let program = b.finish();
//!
//! world.run_schedule(Compile);
//! let report = xla::report_for(&mut world, program)?;
//! assert_eq!(report.kernels, 1, "exp, add and log fuse into one loop");
//! let x = Tensor::from_f64s(&TensorType::new(DType::F32, [3]), &[0.0, 1.0, 2.0])?;
//! let out = report.executable.run(&[x])?;
//! assert!((out[0].to_f64_vec()[0] - 2f64.ln()).abs() < 1e-6);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod builder;
pub mod cost;
pub mod error;
pub mod executable;
pub mod graph;
pub mod interpreter;
pub mod passes;
pub mod persist;
pub mod program;
pub mod report;

use std::path::Path;

use bevy_ecs::prelude::*;

pub use crate::ir::{
    BinaryOp, CompareDir, ConvAttrs, DotDims, Op, Padding, ReduceKind, UnaryOp, op, types,
};
pub use crate::ir::{DType, TensorType};
pub use builder::GraphBuilder;
pub use cost::{OpCost, op_cost};
pub use error::{ArgumentCount, CompileError, InferenceError};
pub use executable::Executable;
pub use passes::cost_analysis::{KernelCost, NodeCost, ProgramCost, analyze};
pub use passes::install;
pub use report::CompileReport;

use crate::schedule::{Compile, init_schedules};
use passes::lower::CompiledExecutable;
use passes::{CompileFailure, PassLog};

/// A world with the schedules and the compiler installed.
pub fn compiler_world() -> World {
    let mut world = World::new();
    init_schedules(&mut world);
    install(&mut world);
    world
}

/// The report of a program after a `Compile` run, or the error that stopped it.
pub fn report_for(world: &mut World, program: Entity) -> Result<CompileReport, CompileError> {
    let Ok(mut entity) = world.get_entity_mut(program) else {
        return Err(CompileError::NotCompiled(format!(
            "{program} is not an entity of this world"
        )));
    };
    if let Some(failure) = entity.take::<CompileFailure>() {
        return Err(failure.0);
    }
    let exe = world
        .get::<CompiledExecutable>(program)
        .map(|e| e.0.clone())
        .ok_or_else(|| {
            CompileError::NotCompiled(format!(
                "{} has not been compiled",
                graph::program_name(world, program)
            ))
        })?;
    let passes = world
        .get::<PassLog>(program)
        .map(|l| l.0.clone())
        .unwrap_or_default();
    Ok(CompileReport::collect(world, program, passes, exe))
}

/// Runs the `Compile` schedule (every pending program) and reports on `program`.
pub fn compile(world: &mut World, program: Entity) -> Result<CompileReport, CompileError> {
    world.run_schedule(Compile);
    report_for(world, program)
}

/// Parses RON program text and spawns it into `world`; `name` is used in error positions.
pub fn load_program_str(world: &mut World, name: &str, text: &str) -> Result<Entity, CompileError> {
    let def = program::parse_program(name, text)?;
    program::spawn_program(world, &def)
}

/// Options of one compilation.
#[derive(Debug, Clone, Default)]
pub struct CompileOptions {
    /// Pass names to skip (see [`passes::OPTIONAL_PASSES`]), like XLA's
    /// `--xla_disable_hlo_passes`.
    pub disabled_passes: Vec<String>,
    /// Run the verifier after every pass; `None` keeps the default (on in
    /// debug builds).
    pub verify_each_pass: Option<bool>,
}

impl CompileOptions {
    /// Installs the options as resources of `world`, rejecting unknown or
    /// required pass names.
    pub fn apply(&self, world: &mut World) -> Result<(), CompileError> {
        for name in &self.disabled_passes {
            if !passes::OPTIONAL_PASSES.contains(&name.as_str()) {
                return Err(CompileError::UnknownPass {
                    name: name.clone(),
                    optional: passes::OPTIONAL_PASSES.join(", "),
                });
            }
        }
        world.insert_resource(passes::DisabledPasses(self.disabled_passes.clone()));
        if let Some(v) = self.verify_each_pass {
            world.insert_resource(passes::VerifyGraph(v));
        }
        Ok(())
    }
}

/// Compiles RON program text in a fresh world.
pub fn compile_program_str(name: &str, text: &str) -> Result<CompileReport, CompileError> {
    compile_program_str_with(name, text, &CompileOptions::default())
}

/// Compiles RON program text in a fresh world with `options`.
pub fn compile_program_str_with(
    name: &str,
    text: &str,
    options: &CompileOptions,
) -> Result<CompileReport, CompileError> {
    let mut world = compiler_world();
    options.apply(&mut world)?;
    let p = load_program_str(&mut world, name, text)?;
    compile(&mut world, p)
}

/// Compiles a RON program file in a fresh world.
pub fn compile_program_file(path: &Path) -> Result<CompileReport, CompileError> {
    compile_program_file_with(path, &CompileOptions::default())
}

/// Compiles a RON program file in a fresh world with `options`; every
/// error in the program names the file ([`CompileError::in_file`]).
pub fn compile_program_file_with(
    path: &Path,
    options: &CompileOptions,
) -> Result<CompileReport, CompileError> {
    let mut world = compiler_world();
    options.apply(&mut world)?;
    compile_file(&mut world, path)
}

/// The largest program file read (a program with large constants inline
/// is a few megabytes).
pub const MAX_PROGRAM_FILE_BYTES: u64 = 64 << 20;

/// Reads, spawns and compiles a RON program file in `world` (which has the
/// compiler installed), naming the file in every error as the pod loader
/// does (`FILE: node %c: ...`).
pub fn compile_file(world: &mut World, path: &Path) -> Result<CompileReport, CompileError> {
    let text = crate::files::read_text(path, MAX_PROGRAM_FILE_BYTES, "a program file")
        .map_err(CompileError::Read)?;
    let file = path.display().to_string();
    load_program_str(world, &file, &text)
        .and_then(|p| compile(world, p))
        .map_err(|e| e.in_file(&file))
}
