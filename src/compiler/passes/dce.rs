//! `dce`: dead code elimination.
//!
//! A node is live when a declared output depends on it or it may have side
//! effects ([`Op::has_side_effects`], the predicate CSE uses: custom calls),
//! and so is everything a live node depends on; every other node is
//! despawned. An unused custom call therefore stays, as XLA's HloDCE keeps
//! instructions with side effects. A program with **no declared outputs** is left intact (nothing
//! says which values matter) and the pass notes that in the report.
//! Non-goals: unused parameters are dead too but keep their argument slot
//! (the program's signature never changes). "Changed" means a node was removed.

use bevy_ecs::prelude::*;

use super::PassOutcome;
use crate::compiler::CompileError;
use crate::compiler::graph::Node;
use crate::compiler::graph::{GraphIndex, ProgramNodes, ProgramOutputs};
use crate::ir::op::Op;

/// The pass name.
pub const NAME: &str = "dce";

/// The note recorded for a program without outputs.
pub const NO_OUTPUTS_NOTE: &str = "no declared outputs: graph left intact";

/// Removes every node no output depends on, unless it (or a node that
/// depends on it) may have side effects; parameters are always kept.
pub fn run(world: &mut World, program: Entity) -> Result<PassOutcome, CompileError> {
    let outputs = world
        .get::<ProgramOutputs>(program)
        .map(|o| o.0.clone())
        .unwrap_or_default();
    if outputs.is_empty() {
        return Ok(PassOutcome {
            changed: false,
            note: Some(NO_OUTPUTS_NOTE.into()),
        });
    }
    let g = GraphIndex::build(world, program);
    let mut live = vec![false; g.nodes.len()];
    let mut stack: Vec<u32> = outputs
        .iter()
        .filter_map(|o| g.index.get(o).copied())
        .collect();
    stack.extend(g.nodes.iter().enumerate().filter_map(|(i, &e)| {
        world
            .get::<Node>(e)
            .is_some_and(|n| n.op.has_side_effects())
            .then_some(i as u32)
    }));
    while let Some(i) = stack.pop() {
        if std::mem::replace(&mut live[i as usize], true) {
            continue;
        }
        stack.extend(g.operands[i as usize].iter().copied());
    }
    let mut kept = Vec::with_capacity(g.nodes.len());
    let mut removed = false;
    for (i, &e) in g.nodes.iter().enumerate() {
        let is_parameter = world
            .get::<Node>(e)
            .is_some_and(|n| matches!(n.op, Op::Parameter { .. }));
        if live[i] || is_parameter {
            kept.push(e);
        } else {
            world.despawn(e);
            removed = true;
        }
    }
    if removed {
        world.entity_mut(program).insert(ProgramNodes(kept));
    }
    Ok(PassOutcome::changed(removed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiler::builder::GraphBuilder;
    use crate::compiler::graph::program_nodes;
    use crate::ir::{DType, TensorType};

    #[test]
    fn removes_dead_nodes_and_keeps_parameters() {
        let mut world = World::new();
        let mut b = GraphBuilder::new(&mut world, "d");
        let x = b.parameter(TensorType::new(DType::F32, [4]));
        let unused = b.parameter(TensorType::new(DType::F32, [4]));
        let live = b.add(x, x);
        let dead = b.mul(x, x);
        b.output(live);
        let p = b.finish();
        assert!(run(&mut world, p).unwrap().changed);
        assert_eq!(program_nodes(&world, p), vec![x, unused, live]);
        assert!(world.get_entity(dead).is_err());
        assert!(!run(&mut world, p).unwrap().changed);
    }

    #[test]
    fn keeps_an_unused_custom_call_and_its_operands() {
        let mut world = World::new();
        let mut b = GraphBuilder::new(&mut world, "d");
        let x = b.parameter(TensorType::new(DType::F32, [4]));
        let live = b.add(x, x);
        let arg = b.mul(x, x);
        let call = b.custom_call("identity", &[arg], TensorType::new(DType::F32, [4]));
        let dead = b.unary(crate::ir::UnaryOp::Neg, call);
        b.output(live);
        let p = b.finish();
        assert!(
            run(&mut world, p).unwrap().changed,
            "the neg of the call is dead"
        );
        assert_eq!(program_nodes(&world, p), vec![x, live, arg, call]);
        assert!(world.get_entity(dead).is_err());
    }

    #[test]
    fn leaves_a_graph_without_outputs_intact() {
        let mut world = World::new();
        let mut b = GraphBuilder::new(&mut world, "d");
        let x = b.parameter(TensorType::new(DType::F32, [4]));
        b.mul(x, x);
        let p = b.finish();
        let out = run(&mut world, p).unwrap();
        assert!(!out.changed);
        assert_eq!(out.note.as_deref(), Some(NO_OUTPUTS_NOTE));
        assert_eq!(program_nodes(&world, p).len(), 2);
    }
}
