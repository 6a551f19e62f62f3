//! The compiler passes and the systems that run them in the `Compile` schedule.
//!
//! Pipeline (each row is one system in its [`CompileSystems`] set; the sets
//! are chained, so the order is fixed):
//!
//! | set | passes | why here |
//! |---|---|---|
//! | `Verify` | `verify` | everything after assumes an acyclic, well-formed graph |
//! | `ShapeInference` | `shape-inference` | folding and simplification compare types |
//! | `Simplify` | `constant-folding`, `algebraic-simplifier`, `cse`, `dce`, to a fixed point (cap [`MAX_FIXED_POINT_ITERATIONS`]) | folding exposes CSE; CSE and simplification leave dead nodes for DCE |
//! | `Fuse` | `fusion` (disabled: one kernel per op) | runs on the final graph, so kernels are counted once |
//! | `CostAnalysis` | `cost-analysis` | a fusion is costed by what crosses its boundary, so kernels must exist |
//! | `Order` | `ordering` | memory planning needs kernel positions |
//! | `PlanMemory` | `memory-plan` | needs live ranges from the order |
//! | `Lower` | `lower` | needs kernels, order and offsets |
//!
//! Each pass is a module with a stable kebab-case `NAME` and a
//! `run(world, program)` that returns [`PassOutcome`]. A program whose pass
//! fails gets a [`CompileFailure`] and is skipped by later passes. When the
//! [`VerifyGraph`] resource is on (the default in debug builds and tests) the
//! verifier runs after every pass and a violation fails the program with
//! [`CompileError::PassBrokeGraph`].

pub mod constant_folding;
pub mod cost_analysis;
pub mod cse;
pub mod dce;
pub mod fusion;
pub mod lower;
pub mod memory_plan;
pub mod ordering;
pub mod shape_inference;
pub mod simplify;
pub mod verify;

use std::time::Instant;

use bevy_ecs::prelude::*;
use serde::Serialize;

use super::CompileError;
use super::graph::{PendingCompile, ProgramNodes};
use crate::schedule::{Compile, CompileSystems};

/// XLA's `HloPassFix` default iteration limit.
pub const MAX_FIXED_POINT_ITERATIONS: usize = 25;

/// What one pass run did.
#[derive(Debug, Clone, Default)]
pub struct PassOutcome {
    /// Whether the graph changed.
    pub changed: bool,
    /// Something the report should say (e.g. "no declared outputs").
    pub note: Option<String>,
}

impl PassOutcome {
    /// Nothing changed.
    pub fn unchanged() -> Self {
        PassOutcome::default()
    }

    /// Changed or not.
    pub fn changed(changed: bool) -> Self {
        PassOutcome {
            changed,
            note: None,
        }
    }
}

/// One row of the pass table (a fixed-point pass is one row summed over its
/// iterations). Node counts are the pass's own: in the `Simplify` group,
/// what the other passes of the group removed between its runs is not
/// counted, so `nodes_before - nodes_after` is what this pass removed.
#[derive(Debug, Clone, Serialize)]
pub struct PassRecord {
    /// The pass `NAME`.
    pub name: &'static str,
    /// Whether any run changed the graph.
    pub changed: bool,
    /// Live nodes before the first run.
    pub nodes_before: usize,
    /// `nodes_before` plus the net change of this pass's own runs (for a
    /// pass that ran once: live nodes after it).
    pub nodes_after: usize,
    /// Wall time over all runs, in microseconds.
    pub micros: u64,
    /// How many times the pass ran.
    #[serde(skip)]
    pub runs: usize,
    /// A note for the report.
    #[serde(skip)]
    pub note: Option<String>,
}

/// The pass table of a program.
#[derive(Component, Debug, Clone, Default)]
pub struct PassLog(pub Vec<PassRecord>);

/// The error that stopped a program's compilation.
#[derive(Component, Debug)]
pub struct CompileFailure(pub CompileError);

/// Run the verifier after every pass.
#[derive(Resource, Debug, Clone, Copy)]
pub struct VerifyGraph(pub bool);

impl Default for VerifyGraph {
    fn default() -> Self {
        VerifyGraph(cfg!(debug_assertions))
    }
}

/// Names of passes to skip; only the [`OPTIONAL_PASSES`] can be disabled
/// (the others produce what later passes need). A disabled `Simplify` pass
/// does not run; a disabled `fusion` runs [`fusion::run_unfused`] (one
/// kernel per op), since ordering, memory planning and lowering need kernels.
#[derive(Resource, Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DisabledPasses(pub Vec<String>);

/// The passes that may be disabled: the `Simplify` fixed point and fusion.
/// A program compiled with any of them disabled still runs and computes the
/// same values.
pub const OPTIONAL_PASSES: [&str; 5] = [
    constant_folding::NAME,
    simplify::NAME,
    cse::NAME,
    dce::NAME,
    fusion::NAME,
];

fn is_disabled(world: &World, name: &str) -> bool {
    world
        .get_resource::<DisabledPasses>()
        .is_some_and(|d| d.0.iter().any(|n| n == name))
}

/// A pass entry point.
pub type PassFn = fn(&mut World, Entity) -> Result<PassOutcome, CompileError>;

fn node_count(world: &World, program: Entity) -> usize {
    world.get::<ProgramNodes>(program).map_or(0, |n| n.0.len())
}

/// Runs one pass on one program, timing it and verifying afterwards when asked.
pub fn run_pass(
    world: &mut World,
    program: Entity,
    name: &'static str,
    pass: PassFn,
) -> Result<PassRecord, CompileError> {
    let nodes_before = node_count(world, program);
    let start = Instant::now();
    let outcome = pass(world, program)?;
    let micros = start.elapsed().as_micros() as u64;
    if world.get_resource::<VerifyGraph>().is_some_and(|v| v.0) && name != verify::NAME {
        let violations = verify::violations(world, program);
        if !violations.is_empty() {
            return Err(CompileError::PassBrokeGraph {
                pass: name,
                violations,
            });
        }
    }
    Ok(PassRecord {
        name,
        changed: outcome.changed,
        nodes_before,
        nodes_after: node_count(world, program),
        micros,
        runs: 1,
        note: outcome.note,
    })
}

/// Programs waiting for this `Compile` run that have not failed.
fn pending_programs(world: &mut World) -> Vec<Entity> {
    let mut q = world.query_filtered::<Entity, (With<PendingCompile>, Without<CompileFailure>)>();
    let mut v: Vec<Entity> = q.iter(world).collect();
    v.sort();
    v
}

fn record(world: &mut World, program: Entity, result: Result<PassRecord, CompileError>) -> bool {
    match result {
        Ok(r) => {
            if let Some(mut log) = world.get_mut::<PassLog>(program) {
                log.0.push(r);
            } else {
                world.entity_mut(program).insert(PassLog(vec![r]));
            }
            true
        }
        Err(e) => {
            world.entity_mut(program).insert(CompileFailure(e));
            false
        }
    }
}

fn run_on_pending(world: &mut World, name: &'static str, pass: PassFn) {
    for p in pending_programs(world) {
        let r = run_pass(world, p, name, pass);
        record(world, p, r);
    }
}

/// `Verify` set: structural checks. Starts a fresh pass log for every
/// pending program (a program may be compiled again after edits).
pub fn verify_programs(world: &mut World) {
    for p in pending_programs(world) {
        world.entity_mut(p).insert(PassLog::default());
    }
    run_on_pending(world, verify::NAME, verify::run);
}

/// `ShapeInference` set.
pub fn infer_shapes(world: &mut World) {
    run_on_pending(world, shape_inference::NAME, shape_inference::run);
}

/// The passes of the `Simplify` fixed point, in order.
pub const SIMPLIFY_PASSES: [(&str, PassFn); 4] = [
    (constant_folding::NAME, constant_folding::run),
    (simplify::NAME, simplify::run),
    (cse::NAME, cse::run),
    (dce::NAME, dce::run),
];

/// `Simplify` set: folding, simplification, CSE and DCE until nothing
/// changes or [`MAX_FIXED_POINT_ITERATIONS`] rounds ran.
pub fn simplify_to_fixed_point(world: &mut World) {
    for p in pending_programs(world) {
        let result = fixed_point(world, p);
        match result {
            Ok(rows) => {
                for r in rows {
                    record(world, p, Ok(r));
                }
            }
            Err(e) => {
                record(world, p, Err(e));
            }
        }
    }
}

fn fixed_point(world: &mut World, p: Entity) -> Result<Vec<PassRecord>, CompileError> {
    let mut rows: Vec<Option<PassRecord>> = vec![None; SIMPLIFY_PASSES.len()];
    for round in 0..MAX_FIXED_POINT_ITERATIONS {
        let mut any = false;
        for (slot, (name, pass)) in rows.iter_mut().zip(SIMPLIFY_PASSES) {
            if is_disabled(world, name) {
                if slot.is_some() {
                    continue;
                }
                let n = node_count(world, p);
                *slot = Some(PassRecord {
                    name,
                    changed: false,
                    nodes_before: n,
                    nodes_after: n,
                    micros: 0,
                    runs: 0,
                    note: Some("disabled".into()),
                });
                continue;
            }
            let r = run_pass(world, p, name, pass)?;
            any |= r.changed;
            match slot {
                None => *slot = Some(r),
                Some(acc) => {
                    acc.changed |= r.changed;
                    acc.nodes_after =
                        (acc.nodes_after + r.nodes_after).saturating_sub(r.nodes_before);
                    acc.micros += r.micros;
                    acc.runs += 1;
                    acc.note = acc.note.take().or(r.note);
                }
            }
        }
        if !any {
            break;
        }
        if round + 1 == MAX_FIXED_POINT_ITERATIONS
            && let Some(Some(last)) = rows.last_mut()
        {
            last.note = Some(format!(
                "stopped at the iteration cap ({MAX_FIXED_POINT_ITERATIONS})"
            ));
        }
    }
    Ok(rows.into_iter().flatten().collect())
}

/// `Fuse` set (one kernel per op when `fusion` is disabled).
pub fn fuse_kernels(world: &mut World) {
    if is_disabled(world, fusion::NAME) {
        run_on_pending(world, fusion::NAME, fusion::run_unfused);
    } else {
        run_on_pending(world, fusion::NAME, fusion::run);
    }
}

/// `CostAnalysis` set.
pub fn analyze_costs(world: &mut World) {
    run_on_pending(world, cost_analysis::NAME, cost_analysis::run);
}

/// `Order` set.
pub fn order_kernels(world: &mut World) {
    run_on_pending(world, ordering::NAME, ordering::run);
}

/// `PlanMemory` set.
pub fn plan_memory(world: &mut World) {
    run_on_pending(world, memory_plan::NAME, memory_plan::run);
}

/// `Lower` set: builds executables, then ends the compilation of every
/// pending program (failed ones included).
pub fn lower_programs(world: &mut World) {
    run_on_pending(world, lower::NAME, lower::run);
    let mut q = world.query_filtered::<Entity, With<PendingCompile>>();
    let done: Vec<Entity> = q.iter(world).collect();
    for p in done {
        world.entity_mut(p).remove::<PendingCompile>();
    }
}

/// Adds the compiler's systems to the `Compile` schedule (which
/// [`crate::schedule::init_schedules`] must have created) and its resources.
pub fn install(world: &mut World) {
    world.init_resource::<VerifyGraph>();
    world.init_resource::<DisabledPasses>();
    let mut schedules = world.resource_mut::<bevy_ecs::schedule::Schedules>();
    schedules.add_systems(Compile, verify_programs.in_set(CompileSystems::Verify));
    schedules.add_systems(Compile, infer_shapes.in_set(CompileSystems::ShapeInference));
    schedules.add_systems(
        Compile,
        simplify_to_fixed_point.in_set(CompileSystems::Simplify),
    );
    schedules.add_systems(Compile, fuse_kernels.in_set(CompileSystems::Fuse));
    schedules.add_systems(Compile, analyze_costs.in_set(CompileSystems::CostAnalysis));
    schedules.add_systems(Compile, order_kernels.in_set(CompileSystems::Order));
    schedules.add_systems(Compile, plan_memory.in_set(CompileSystems::PlanMemory));
    schedules.add_systems(Compile, lower_programs.in_set(CompileSystems::Lower));
}
