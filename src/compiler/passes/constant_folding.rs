//! `constant-folding`: replace a node whose operands are all constants by a
//! constant, computed with the executor's own kernels
//! ([`crate::kernels::evaluate`]), so folding never changes a result bit.
//!
//! Reads ops, operands and literals; rewrites a folded node in place into
//! `constant` with a [`Literal`] (its users need no rewiring). "Changed"
//! means at least one node was folded. Refuses to fold:
//! - custom calls (opaque) and leaves (parameters, constants, iota);
//! - broadcasts (folding would turn a small constant into a large one);
//! - results of more than [`MAX_FOLD_ELEMENTS`] elements.

use bevy_ecs::prelude::*;
use smallvec::SmallVec;

use super::PassOutcome;
use crate::compiler::CompileError;
use crate::compiler::graph::{Literal, Node, Operands, ValueType, node_label, topo_entities};
use crate::ir::op::Op;
use crate::kernels::evaluate;

/// The pass name.
pub const NAME: &str = "constant-folding";

/// Largest result folded (XLA uses a size limit for the same reason).
pub const MAX_FOLD_ELEMENTS: usize = 1 << 16;

/// Whether a node is a constant.
pub fn is_constant(world: &World, e: Entity) -> bool {
    world.get::<Node>(e).is_some_and(|n| n.op == Op::Constant) && world.get::<Literal>(e).is_some()
}

fn can_fold(world: &World, e: Entity, op: &Op, operands: &[Entity]) -> bool {
    !operands.is_empty()
        && !op.is_opaque()
        && !matches!(op, Op::Broadcast { .. })
        && world
            .get::<ValueType>(e)
            .is_some_and(|t| t.0.element_count() <= MAX_FOLD_ELEMENTS)
        && operands.iter().all(|&o| is_constant(world, o))
}

/// Folds every foldable node, in topological order (so chains fold in one run).
pub fn run(world: &mut World, program: Entity) -> Result<PassOutcome, CompileError> {
    let Ok(order) = topo_entities(world, program) else {
        return Ok(PassOutcome::unchanged());
    };
    let mut changed = false;
    for e in order {
        let (op, operands) = match (world.get::<Node>(e), world.get::<Operands>(e)) {
            (Some(n), Some(o)) => (n.op.clone(), o.0.clone()),
            _ => continue,
        };
        if !can_fold(world, e, &op, &operands) {
            continue;
        }
        let value = {
            let args: SmallVec<[_; 4]> = operands
                .iter()
                .map(|&o| &*world.get::<Literal>(o).expect("checked constant").0)
                .collect();
            evaluate(&op, &args, None).map_err(|source| CompileError::Kernel {
                node: node_label(world, e),
                source,
            })?
        };
        world.entity_mut(e).insert((
            Node { op: Op::Constant },
            Operands::default(),
            Literal::new(value),
        ));
        changed = true;
    }
    Ok(PassOutcome::changed(changed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiler::builder::GraphBuilder;
    use crate::compiler::passes::shape_inference;
    use crate::ir::{DType, TensorType};

    #[test]
    fn folds_chains_with_the_shared_kernels() {
        let mut world = World::new();
        let mut b = GraphBuilder::new(&mut world, "f");
        let two = b.scalar(DType::F32, 2.0);
        let three = b.scalar(DType::F32, 3.0);
        let six = b.mul(two, three);
        let root = b.unary(crate::ir::UnaryOp::Sqrt, six);
        let x = b.parameter(TensorType::new(DType::F32, [4]));
        let y = b.add(x, root);
        let bc = b.broadcast(two, vec![4], None);
        b.output(y);
        b.output(bc);
        let p = b.finish();
        shape_inference::run(&mut world, p).unwrap();
        assert!(run(&mut world, p).unwrap().changed);
        let lit = &world.get::<Literal>(root).unwrap().0;
        assert_eq!(lit.to_f64_vec(), vec![f64::from(6f32.sqrt())]);
        assert!(!is_constant(&world, y), "x is a parameter");
        assert!(!is_constant(&world, bc), "broadcasts are not folded");
        assert!(!run(&mut world, p).unwrap().changed);
    }

    #[test]
    fn never_folds_custom_calls() {
        let mut world = World::new();
        let mut b = GraphBuilder::new(&mut world, "f");
        let c = b.scalar(DType::F32, 2.0);
        let cc = b.custom_call("identity", &[c], TensorType::scalar(DType::F32));
        b.output(cc);
        let p = b.finish();
        shape_inference::run(&mut world, p).unwrap();
        assert!(!run(&mut world, p).unwrap().changed);
    }
}
