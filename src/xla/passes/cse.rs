//! `cse`: common subexpression elimination by hash-consing.
//!
//! Two nodes are the same value when they have the same op and attributes,
//! the same type, the same operands (sorted first for commutative ops, so
//! `a + b` and `b + a` merge) and, for constants, the same literal bits
//! (`-0.0` and `0.0` differ; NaN payloads compare by bits). The later node's
//! uses (and outputs) are redirected to the earlier one; DCE removes it.
//!
//! Never merged: custom calls (opaque, possibly side-effecting or random)
//! and parameters (distinct arguments). "Changed" means some use was redirected.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use bevy_ecs::entity::EntityHashMap;
use bevy_ecs::prelude::*;
use smallvec::SmallVec;

use super::PassOutcome;
use super::simplify::forward_operands;
use crate::xla::CompileError;
use crate::xla::graph::{Literal, Node, Operands, ValueType, forward_outputs, topo_entities};
use crate::xla::op::Op;
use crate::xla::types::TensorType;

/// The pass name.
pub const NAME: &str = "cse";

#[derive(Hash, PartialEq, Eq)]
struct ValueKey {
    op: Op,
    ty: TensorType,
    operands: SmallVec<[Entity; 4]>,
    literal_hash: u64,
}

/// Whether CSE may merge nodes with this op.
pub fn can_merge(op: &Op) -> bool {
    !op.is_opaque() && !matches!(op, Op::Parameter { .. })
}

fn key_of(world: &World, e: Entity) -> Option<ValueKey> {
    let op = &world.get::<Node>(e)?.op;
    if !can_merge(op) {
        return None;
    }
    let mut operands = world.get::<Operands>(e)?.0.clone();
    if let Op::Binary(b) = op
        && b.is_commutative()
    {
        operands.sort();
    }
    let literal_hash = world.get::<Literal>(e).map_or(0, |l| {
        let mut h = DefaultHasher::new();
        l.0.hash_bits(&mut h);
        h.finish()
    });
    Some(ValueKey {
        op: op.clone(),
        ty: world.get::<ValueType>(e)?.0.clone(),
        operands,
        literal_hash,
    })
}

fn same_literal(world: &World, a: Entity, b: Entity) -> bool {
    match (world.get::<Literal>(a), world.get::<Literal>(b)) {
        (Some(x), Some(y)) => x.0.bitwise_eq(&y.0),
        (None, None) => true,
        _ => false,
    }
}

/// Merges equal values in topological order (operands are canonical before
/// their users are hashed, so whole equal subtrees merge in one run).
pub fn run(world: &mut World, program: Entity) -> Result<PassOutcome, CompileError> {
    let Ok(order) = topo_entities(world, program) else {
        return Ok(PassOutcome::unchanged());
    };
    let mut seen: HashMap<ValueKey, SmallVec<[Entity; 1]>> = HashMap::with_capacity(order.len());
    let mut forward = EntityHashMap::default();
    let mut changed = false;
    for e in order {
        changed |= forward_operands(world, e, &forward);
        let Some(key) = key_of(world, e) else {
            continue;
        };
        let candidates = seen.entry(key).or_default();
        match candidates.iter().find(|&&c| same_literal(world, c, e)) {
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
    use crate::xla::builder::GraphBuilder;
    use crate::xla::graph::ProgramOutputs;
    use crate::xla::passes::shape_inference;
    use crate::xla::{DType, TensorType};

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
