//! `verify`: structural invariants of a program's graph.
//!
//! Checks, and reports **every** violation (not just the first):
//! - each listed node exists, is a node, and belongs to this program;
//! - each operand is a live node of the same program (no dangling operands);
//! - each op has its arity (concatenate takes at least one operand);
//! - parameters, iota and custom calls declare a type; constants carry a literal;
//! - parameter indices are distinct and cover `0..n`;
//! - every declared output is a node of this program;
//! - the graph has no cycle (one cycle is printed node by node).
//!
//! Reads the graph components; writes nothing. Never "changes" the graph.
//! The same check runs after every pass when [`super::VerifyGraph`] is on.

use bevy_ecs::prelude::*;

use super::PassOutcome;
use crate::compiler::CompileError;
use crate::compiler::graph::{
    DeclaredType, GraphIndex, InProgram, Literal, Node, Operands, ProgramOutputs, node_label,
    program_name, program_nodes,
};
use crate::ir::op::Op;

/// The pass name.
pub const NAME: &str = "verify";

/// At most this many cycle members are printed.
const MAX_CYCLE_PRINT: usize = 12;

/// Every violation, one line each, naming its node.
pub fn violations(world: &World, program: Entity) -> Vec<String> {
    let mut out = Vec::new();
    let nodes = program_nodes(world, program);
    let mut parameters = Vec::new();
    for &e in &nodes {
        let label = node_label(world, e);
        let Some(node) = world.get::<Node>(e) else {
            out.push(format!(
                "entity {e} is listed as a node of the program but is not a node"
            ));
            continue;
        };
        if world.get::<InProgram>(e).map(|p| p.0) != Some(program) {
            out.push(format!("node {label}: belongs to another program"));
        }
        let operands = world
            .get::<Operands>(e)
            .map(|o| o.0.as_slice())
            .unwrap_or(&[]);
        check_arity(&node.op, operands.len(), &label, &mut out);
        for (i, &o) in operands.iter().enumerate() {
            if world.get::<Node>(o).is_none() {
                out.push(format!(
                    "node {label}: operand {i} is a dangling reference ({o} is not a node)"
                ));
            } else if world.get::<InProgram>(o).map(|p| p.0) != Some(program) {
                out.push(format!(
                    "node {label}: operand {i} ({}) belongs to another program",
                    node_label(world, o)
                ));
            }
        }
        match &node.op {
            Op::Parameter { index } => {
                parameters.push((*index, label.clone()));
                needs_declared_type(world, e, &label, &mut out);
            }
            Op::Iota { .. } | Op::CustomCall { .. } => {
                needs_declared_type(world, e, &label, &mut out)
            }
            Op::Constant if world.get::<Literal>(e).is_none() => {
                out.push(format!("node {label}: constant has no literal value"));
            }
            _ => {}
        }
    }
    check_parameters(parameters, &mut out);
    if let Some(outputs) = world.get::<ProgramOutputs>(program) {
        for (i, &o) in outputs.0.iter().enumerate() {
            if world.get::<InProgram>(o).map(|p| p.0) != Some(program) {
                out.push(format!("output {i} ({o}) is not a node of this program"));
            }
        }
    }
    check_cycles(world, program, &mut out);
    out
}

fn check_arity(op: &Op, got: usize, label: &str, out: &mut Vec<String>) {
    match op.arity() {
        Some(n) if n != got => out.push(format!(
            "node {label}: {} takes {n} operand{}, got {got}",
            op.name(),
            if n == 1 { "" } else { "s" }
        )),
        None if matches!(op, Op::Concatenate { .. }) && got == 0 => {
            out.push(format!(
                "node {label}: concatenate needs at least one operand"
            ));
        }
        _ => {}
    }
}

fn needs_declared_type(world: &World, e: Entity, label: &str, out: &mut Vec<String>) {
    if world.get::<DeclaredType>(e).is_none() {
        out.push(format!("node {label}: needs a declared type (`ty`)"));
    }
}

fn check_parameters(mut parameters: Vec<(usize, String)>, out: &mut Vec<String>) {
    parameters.sort();
    for w in parameters.windows(2) {
        if w[0].0 == w[1].0 {
            out.push(format!(
                "node {}: parameter index {} is also used by {}",
                w[1].1, w[1].0, w[0].1
            ));
        }
    }
    for (expected, (index, label)) in parameters.iter().enumerate() {
        if *index > expected {
            out.push(format!(
                "node {label}: parameter index {index} leaves index {expected} unused (indices must cover 0..n)"
            ));
            break;
        }
    }
}

/// Finds one cycle among the nodes Kahn's algorithm could not order: each of
/// them has an unordered operand, so walking operands must revisit a node.
fn check_cycles(world: &World, program: Entity, out: &mut Vec<String>) {
    let g = GraphIndex::build(world, program);
    let Err(stuck) = g.topo_order() else { return };
    let mut in_stuck = vec![false; g.nodes.len()];
    for &i in &stuck {
        in_stuck[i as usize] = true;
    }
    let mut seen_at = vec![usize::MAX; g.nodes.len()];
    let mut path = Vec::new();
    let mut cur = stuck[0];
    while seen_at[cur as usize] == usize::MAX {
        seen_at[cur as usize] = path.len();
        path.push(cur);
        match g.operands[cur as usize]
            .iter()
            .find(|&&o| in_stuck[o as usize])
        {
            Some(&next) => cur = next,
            None => break,
        }
    }
    let start = seen_at[cur as usize].min(path.len());
    let cycle: Vec<String> = path[start..]
        .iter()
        .rev()
        .take(MAX_CYCLE_PRINT)
        .map(|&i| node_label(world, g.nodes[i as usize]))
        .collect();
    let first = cycle.first().cloned().unwrap_or_default();
    out.push(format!(
        "node {first}: is on a cycle: {} -> {first}{}",
        cycle.join(" -> "),
        if stuck.len() > cycle.len() {
            format!(" ({} nodes cannot be ordered)", stuck.len())
        } else {
            String::new()
        }
    ));
}

/// Runs the verifier: `Err(CompileError::Invalid)` listing every violation.
pub fn run(world: &mut World, program: Entity) -> Result<PassOutcome, CompileError> {
    let v = violations(world, program);
    if v.is_empty() {
        Ok(PassOutcome::unchanged())
    } else {
        Err(CompileError::Invalid {
            program: program_name(world, program),
            violations: v,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiler::builder::GraphBuilder;
    use crate::compiler::graph::Operands;
    use crate::ir::types::{DType, TensorType};

    #[test]
    fn reports_every_violation_with_node_names() {
        let mut world = World::new();
        let mut b = GraphBuilder::new(&mut world, "bad");
        let x = b.parameter(TensorType::new(DType::F32, [4]));
        let y = b.add(x, x);
        let z = b.mul(y, x);
        b.output(z);
        let p = b.finish();
        // Make a cycle y -> z -> y and an arity violation.
        world.get_mut::<Operands>(y).unwrap().0[1] = z;
        world.get_mut::<Operands>(z).unwrap().0.push(x);
        let ghost = world.spawn_empty().id();
        world.despawn(ghost);
        world.get_mut::<Operands>(x).unwrap().0.push(ghost);
        let v = violations(&world, p);
        assert!(
            v.iter()
                .any(|m| m.contains("%mul.2: mul takes 2 operands, got 3")),
            "{v:?}"
        );
        assert!(v.iter().any(|m| m.contains("dangling")), "{v:?}");
        assert!(
            v.iter()
                .any(|m| m.contains("cycle") && m.contains("%add.1")),
            "{v:?}"
        );
        let err = run(&mut world, p).unwrap_err().to_string();
        assert!(
            err.starts_with("program `bad` is invalid (4 violations)"),
            "{err}"
        );
    }

    #[test]
    fn a_valid_graph_passes() {
        let mut world = World::new();
        let mut b = GraphBuilder::new(&mut world, "ok");
        let x = b.parameter(TensorType::new(DType::F32, [4]));
        let y = b.add(x, x);
        b.output(y);
        let p = b.finish();
        assert!(violations(&world, p).is_empty());
    }
}
