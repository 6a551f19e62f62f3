//! `cse`: common subexpression elimination by hash-consing.
//!
//! Two nodes are the same value when they have the same op and attributes,
//! the same type, the same operands (sorted first for commutative ops, so
//! `a + b` and `b + a` merge) and, for constants, the same literal bits
//! (`-0.0` and `0.0` differ; NaN payloads compare by bits). The later node's
//! uses (and outputs) are redirected to the earlier one; DCE removes it.
//!
//! Never merged: ops that may have side effects ([`Op::has_side_effects`]:
//! custom calls, opaque and possibly random) and parameters (distinct
//! arguments). "Changed" means some use was redirected.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use bevy_ecs::entity::EntityHashMap;
use bevy_ecs::prelude::*;
use smallvec::SmallVec;

use super::PassOutcome;
use super::simplify::forward_operands;
use crate::compiler::CompileError;
use crate::compiler::graph::{Literal, Node, Operands, ValueType, forward_outputs, topo_entities};
use crate::ir::op::Op;

/// The pass name.
pub const NAME: &str = "cse";

/// Whether CSE may merge nodes with this op: not when it may have side
/// effects ([`Op::has_side_effects`], the predicate DCE keeps nodes by).
pub fn can_merge(op: &Op) -> bool {
    !op.has_side_effects() && !matches!(op, Op::Parameter { .. })
}

/// Operands in canonical order (sorted for commutative ops).
fn canonical_operands(op: &Op, operands: &[Entity]) -> SmallVec<[Entity; 4]> {
    let mut v = SmallVec::from_slice(operands);
    if matches!(op, Op::Binary(b) if b.is_commutative()) {
        v.sort_unstable();
    }
    v
}

/// A hash of everything that makes a node's value: op and attributes,
/// type, canonical operands and literal bits.
fn value_hash(world: &World, e: Entity) -> Option<u64> {
    let op = &world.get::<Node>(e)?.op;
    if !can_merge(op) {
        return None;
    }
    let mut h = DefaultHasher::new();
    op.hash(&mut h);
    world.get::<ValueType>(e)?.0.hash(&mut h);
    canonical_operands(op, &world.get::<Operands>(e)?.0).hash(&mut h);
    if let Some(l) = world.get::<Literal>(e) {
        l.0.hash_bits(&mut h);
    }
    Some(h.finish())
}

/// Whether two nodes compute the same value (the full comparison behind a hash match).
fn same_value(world: &World, a: Entity, b: Entity) -> bool {
    let (Some(na), Some(nb)) = (world.get::<Node>(a), world.get::<Node>(b)) else {
        return false;
    };
    let operands = |e: Entity, op: &Op| {
        world
            .get::<Operands>(e)
            .map(|o| canonical_operands(op, &o.0))
            .unwrap_or_default()
    };
    let literal_eq = match (world.get::<Literal>(a), world.get::<Literal>(b)) {
        (Some(x), Some(y)) => x.0.bitwise_eq(&y.0),
        (None, None) => true,
        _ => false,
    };
    na.op == nb.op
        && world.get::<ValueType>(a) == world.get::<ValueType>(b)
        && operands(a, &na.op) == operands(b, &nb.op)
        && literal_eq
}

/// Merges equal values in topological order (operands are canonical before
/// their users are hashed, so whole equal subtrees merge in one run).
pub fn run(world: &mut World, program: Entity) -> Result<PassOutcome, CompileError> {
    let Ok(order) = topo_entities(world, program) else {
        return Ok(PassOutcome::unchanged());
    };
    let mut seen: HashMap<u64, SmallVec<[Entity; 1]>> = HashMap::with_capacity(order.len());
    let mut forward = EntityHashMap::default();
    let mut changed = false;
    for e in order {
        changed |= forward_operands(world, e, &forward);
        let Some(hash) = value_hash(world, e) else {
            continue;
        };
        let candidates = seen.entry(hash).or_default();
        match candidates.iter().find(|&&c| same_value(world, c, e)) {
            Some(&c) => {
                forward.insert(e, c);
            }
            None => candidates.push(e),
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

    #[test]
    fn merges_commutative_duplicates_but_not_custom_calls_or_distinct_zeros() {
        let mut world = World::new();
        let mut b = GraphBuilder::new(&mut world, "c");
        let x = b.parameter(TensorType::new(DType::F32, [4]));
        let y = b.parameter(TensorType::new(DType::F32, [4]));
        let s1 = b.add(x, y);
        let s2 = b.add(y, x);
        let c1 = b.custom_call("identity", &[x], TensorType::new(DType::F32, [4]));
        let c2 = b.custom_call("identity", &[x], TensorType::new(DType::F32, [4]));
        let z = b.scalar(DType::F32, 0.0);
        let nz = b.scalar(DType::F32, -0.0);
        let z2 = b.scalar(DType::F32, 0.0);
        for o in [s1, s2, c1, c2, z, nz, z2] {
            b.output(o);
        }
        let p = b.finish();
        shape_inference::run(&mut world, p).unwrap();
        assert!(run(&mut world, p).unwrap().changed);
        let out = world.get::<ProgramOutputs>(p).unwrap().0.clone();
        assert_eq!(out[1], s1);
        assert_ne!(out[3], out[2], "custom calls never merge");
        assert_eq!(out[6], z);
        assert_ne!(out[5], z, "-0.0 and 0.0 are different constants");
        assert!(!run(&mut world, p).unwrap().changed);
    }
}
