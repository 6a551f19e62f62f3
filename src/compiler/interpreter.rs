//! The reference interpreter: evaluates a program's graph as written, node by
//! node in topological order, with no pass applied. It is the oracle the
//! optimized executable is tested against.

use bevy_ecs::entity::EntityHashMap;
use bevy_ecs::prelude::*;
use smallvec::SmallVec;

use super::CompileError;
use super::graph::{
    DeclaredType, Literal, Node, Operands, ProgramOutputs, node_label, program_name, topo_entities,
};
use super::op::Op;
use crate::ir::Tensor;
use crate::kernels::evaluate;

/// Evaluates `program` on `args` (by parameter index) and returns its
/// declared outputs in order.
pub fn interpret(
    world: &World,
    program: Entity,
    args: &[Tensor],
) -> Result<Vec<Tensor>, CompileError> {
    let order = topo_entities(world, program).map_err(|cycle| CompileError::Evaluate {
        node: node_label(world, cycle[0]),
        message: "is on a cycle".into(),
    })?;
    let mut values: EntityHashMap<Tensor> = EntityHashMap::default();
    for e in order {
        let node = world.get::<Node>(e).ok_or_else(|| CompileError::Evaluate {
            node: format!("{e}"),
            message: "is not a node".into(),
        })?;
        let value = match &node.op {
            Op::Parameter { index } => {
                let arg = args.get(*index).ok_or_else(|| {
                    CompileError::Arguments(format!(
                        "program `{}` reads argument {index}, but only {} were given",
                        program_name(world, program),
                        args.len()
                    ))
                })?;
                if let Some(d) = world.get::<DeclaredType>(e)
                    && d.0 != arg.tensor_type()
                {
                    return Err(CompileError::Arguments(format!(
                        "argument {index} must be {}, got {}",
                        d.0,
                        arg.tensor_type()
                    )));
                }
                arg.clone()
            }
            Op::Constant => world
                .get::<Literal>(e)
                .map(|l| (*l.0).clone())
                .ok_or_else(|| CompileError::Evaluate {
                    node: node_label(world, e),
                    message: "has no literal".into(),
                })?,
            op => {
                let operands = world
                    .get::<Operands>(e)
                    .map(|o| o.0.clone())
                    .unwrap_or_default();
                let args: SmallVec<[&Tensor; 4]> = operands
                    .iter()
                    .map(|o| values.get(o))
                    .collect::<Option<_>>()
                    .ok_or_else(|| CompileError::Evaluate {
                        node: node_label(world, e),
                        message: "has an operand that is not a node of this program".into(),
                    })?;
                let declared = world.get::<DeclaredType>(e).map(|d| &d.0);
                evaluate(op, &args, declared).map_err(|source| CompileError::Kernel {
                    node: node_label(world, e),
                    source,
                })?
            }
        };
        values.insert(e, value);
    }
    let outputs = world
        .get::<ProgramOutputs>(program)
        .map(|o| o.0.clone())
        .unwrap_or_default();
    outputs
        .iter()
        .map(|o| {
            values
                .get(o)
                .cloned()
                .ok_or_else(|| CompileError::Evaluate {
                    node: node_label(world, *o),
                    message: "is a declared output but was not computed".into(),
                })
        })
        .collect()
}
