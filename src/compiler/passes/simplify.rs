//! `algebraic-simplifier`: rewrites that are exact in IEEE arithmetic.
//!
//! A node is replaced by one of its operands (users and outputs are rewired;
//! the node itself is left for DCE) when the operand has the node's type and:
//!
//! | pattern | why it is exact |
//! |---|---|
//! | `x * 1`, `1 * x`, `x / 1` | multiplication by one is exact, NaN and `-0` included |
//! | `x + (-0.0)`, `(-0.0) + x`, `x - (+0.0)` | `-0 + -0 = -0`, `+0 + -0 = +0`; note `x + 0.0` is **not** exact (`-0 + 0 = +0`) |
//! | integer `x + 0`, `0 + x`, `x - 0` | exact |
//! | `neg(neg(x))`, `not(not(x))` | exact |
//! | `max(x, x)`, `min(x, x)`, `and(x, x)`, `or(x, x)` | exact |
//! | `select(p, x, x)`, `select(true, x, y)`, `select(false, x, y)` | exact |
//! | identity transpose / reshape / broadcast / slice, `convert` to the same dtype, `reduce` over no dimension, `concatenate` of one operand | the data does not change |
//!
//! Rewrites that are *not* exact (`x * 0`, `x - x`, reassociation) are never made.
//! "Changed" means some use was redirected. Custom calls are never touched.

use bevy_ecs::entity::EntityHashMap;
use bevy_ecs::prelude::*;

use super::PassOutcome;
use crate::compiler::CompileError;
use crate::compiler::graph::{Literal, Node, Operands, ValueType, forward_outputs, topo_entities};
use crate::ir::op::{BinaryOp, Op, UnaryOp};

/// The pass name.
pub const NAME: &str = "algebraic-simplifier";

/// Redirects `e`'s operands through `forward`; returns whether any moved.
pub(crate) fn forward_operands(
    world: &mut World,
    e: Entity,
    forward: &EntityHashMap<Entity>,
) -> bool {
    if forward.is_empty() {
        return false;
    }
    let needs = world
        .get::<Operands>(e)
        .is_some_and(|o| o.0.iter().any(|x| forward.contains_key(x)));
    if !needs {
        return false;
    }
    let mut ops = world.get_mut::<Operands>(e).expect("checked above");
    for o in ops.0.iter_mut() {
        if let Some(&n) = forward.get(o) {
            *o = n;
        }
    }
    true
}

fn literal_is(world: &World, e: Entity, value: f64) -> bool {
    world.get::<Node>(e).is_some_and(|n| n.op == Op::Constant)
        && world.get::<Literal>(e).is_some_and(|l| l.0.is_all(value))
}

/// The operand `e` can be replaced by, if a rule applies.
fn simplified(world: &World, e: Entity) -> Option<Entity> {
    let node = world.get::<Node>(e)?;
    let ops = &world.get::<Operands>(e)?.0;
    let ty = &world.get::<ValueType>(e)?.0;
    let same = |x: Entity| world.get::<ValueType>(x).is_some_and(|t| &t.0 == ty);
    let is = |x: Entity, v: f64| literal_is(world, x, v);
    let float = ty.dtype.is_float();
    let pick = |x: Entity| same(x).then_some(x);
    let op_of = |x: Entity| world.get::<Node>(x).map(|n| &n.op);
    match (&node.op, ops.as_slice()) {
        (Op::Binary(BinaryOp::Mul), &[a, b]) if is(b, 1.0) => pick(a),
        (Op::Binary(BinaryOp::Mul), &[a, b]) if is(a, 1.0) => pick(b),
        (Op::Binary(BinaryOp::Div), &[a, b]) if is(b, 1.0) => pick(a),
        (Op::Binary(BinaryOp::Add), &[a, b]) if is(b, if float { -0.0 } else { 0.0 }) => pick(a),
        (Op::Binary(BinaryOp::Add), &[a, b]) if is(a, if float { -0.0 } else { 0.0 }) => pick(b),
        (Op::Binary(BinaryOp::Sub), &[a, b]) if is(b, 0.0) => pick(a),
        (Op::Binary(BinaryOp::Max | BinaryOp::Min | BinaryOp::And | BinaryOp::Or), &[a, b])
            if a == b =>
        {
            pick(a)
        }
        (Op::Unary(u @ (UnaryOp::Neg | UnaryOp::Not)), &[a]) => match op_of(a) {
            Some(Op::Unary(inner)) if inner == u => {
                let x = world.get::<Operands>(a)?.0.first().copied()?;
                pick(x)
            }
            _ => None,
        },
        (Op::Select, &[_, t, f]) if t == f => pick(t),
        (Op::Select, &[p, t, _]) if is(p, 1.0) => pick(t),
        (Op::Select, &[p, _, f]) if is(p, 0.0) => pick(f),
        (Op::Transpose { perm }, &[a]) if perm.iter().enumerate().all(|(i, &p)| i == p) => pick(a),
        (Op::Broadcast { dims, .. }, &[a])
            if dims
                .as_ref()
                .is_none_or(|d| d.iter().enumerate().all(|(i, &p)| i == p)) =>
        {
            pick(a)
        }
        (Op::Reshape { .. } | Op::Slice { .. } | Op::Convert(_), &[a]) => pick(a),
        (Op::Reduce { dims, .. }, &[a]) if dims.is_empty() => pick(a),
        (Op::Concatenate { .. }, &[a]) => pick(a),
        _ => None,
    }
}

/// Applies the rules in topological order, so `neg(neg(neg(neg x)))` collapses in one run.
pub fn run(world: &mut World, program: Entity) -> Result<PassOutcome, CompileError> {
    let Ok(order) = topo_entities(world, program) else {
        return Ok(PassOutcome::unchanged());
    };
    let mut forward = EntityHashMap::default();
    let mut changed = false;
    for e in order {
        changed |= forward_operands(world, e, &forward);
        if let Some(r) = simplified(world, e) {
            forward.insert(e, r);
        }
    }
    changed |= forward_outputs(world, program, &forward);
    Ok(PassOutcome::changed(changed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiler::builder::GraphBuilder;
    use crate::compiler::graph::ProgramOutputs;
    use crate::compiler::passes::shape_inference;
    use crate::ir::{DType, TensorType};

    fn outputs_after(build: impl FnOnce(&mut GraphBuilder, Entity) -> Entity) -> (Entity, Entity) {
        let mut world = World::new();
        let mut b = GraphBuilder::new(&mut world, "s");
        let x = b.parameter(TensorType::new(DType::F32, [4]));
        let y = build(&mut b, x);
        b.output(y);
        let p = b.finish();
        shape_inference::run(&mut world, p).unwrap();
        run(&mut world, p).unwrap();
        (world.get::<ProgramOutputs>(p).unwrap().0[0], x)
    }

    #[test]
    fn removes_exact_identities() {
        let (out, x) = outputs_after(|b, x| {
            let one = b.scalar(DType::F32, 1.0);
            let m = b.mul(x, one);
            let n = b.unary(UnaryOp::Neg, m);
            let nn = b.unary(UnaryOp::Neg, n);
            let mz = b.scalar(DType::F32, -0.0);
            b.add(nn, mz)
        });
        assert_eq!(out, x);
    }

    #[test]
    fn keeps_x_plus_positive_zero() {
        let (out, x) = outputs_after(|b, x| {
            let z = b.scalar(DType::F32, 0.0);
            b.add(x, z)
        });
        assert_ne!(out, x, "x + 0.0 turns -0.0 into +0.0, so it must stay");
    }

    #[test]
    fn keeps_shape_changing_identities() {
        let (out, x) = outputs_after(|b, x| {
            let one = b.constant(
                crate::ir::Tensor::from_f64s(&TensorType::new(DType::F32, [2, 4]), &[1.0]).unwrap(),
            );
            b.mul(x, one)
        });
        assert_ne!(out, x, "x * ones[2,4] broadcasts x");
    }
}
