//! `ordering`: a topological order of kernels.
//!
//! Kahn's algorithm over the kernel graph (a kernel depends on the kernels
//! that produce its inputs); among ready kernels the one whose first member
//! comes earliest in the node order runs first, so the order is
//! deterministic and follows the program text. Reads [`Kernel`]s; writes
//! [`KernelPosition`] and reorders [`ProgramKernels`]. "Changed" means the
//! kernel order differs from creation order. Refuses (an error) only when
//! the kernels form a cycle, which fusion never creates.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use bevy_ecs::entity::EntityHashMap;
use bevy_ecs::prelude::*;

use super::PassOutcome;
use super::fusion::{InKernel, Kernel, ProgramKernels};
use crate::compiler::CompileError;
use crate::compiler::graph::{node_label, program_nodes};

/// The pass name.
pub const NAME: &str = "ordering";

/// A kernel's position in execution order.
#[derive(
    Component,
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct KernelPosition(pub u32);

/// Orders the kernels of `program`.
pub fn run(world: &mut World, program: Entity) -> Result<PassOutcome, CompileError> {
    let kernels = world
        .get::<ProgramKernels>(program)
        .map(|k| k.0.clone())
        .unwrap_or_default();
    let mut index: EntityHashMap<usize> = EntityHashMap::default();
    for (i, &k) in kernels.iter().enumerate() {
        index.insert(k, i);
    }
    let mut node_pos: EntityHashMap<u32> = EntityHashMap::default();
    for (i, e) in program_nodes(world, program).into_iter().enumerate() {
        node_pos.insert(e, i as u32);
    }
    let n = kernels.len();
    let mut pending = vec![0usize; n];
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut rank = vec![u32::MAX; n];
    for (i, &k) in kernels.iter().enumerate() {
        let kernel = world.get::<Kernel>(k).expect("kernel");
        rank[i] = kernel
            .members
            .iter()
            .filter_map(|m| node_pos.get(m).copied())
            .min()
            .unwrap_or(u32::MAX);
        let mut deps: Vec<usize> = kernel
            .inputs
            .iter()
            .filter_map(|x| world.get::<InKernel>(*x))
            .filter_map(|ik| index.get(&ik.0).copied())
            .collect();
        deps.sort_unstable();
        deps.dedup();
        pending[i] = deps.len();
        for d in deps {
            dependents[d].push(i);
        }
    }
    let mut ready: BinaryHeap<Reverse<(u32, usize)>> = (0..n)
        .filter(|&i| pending[i] == 0)
        .map(|i| Reverse((rank[i], i)))
        .collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse((_, i))) = ready.pop() {
        order.push(i);
        for &d in &dependents[i] {
            pending[d] -= 1;
            if pending[d] == 0 {
                ready.push(Reverse((rank[d], d)));
            }
        }
    }
    if order.len() != n {
        let stuck = (0..n)
            .find(|&i| pending[i] > 0)
            .expect("some kernel is stuck");
        let member = world.get::<Kernel>(kernels[stuck]).expect("kernel").members[0];
        return Err(CompileError::Shape {
            node: node_label(world, member),
            message: "its kernel is on a cycle of kernels".into(),
        });
    }
    let changed = order.iter().enumerate().any(|(p, &i)| p != i);
    let ordered: Vec<Entity> = order.iter().map(|&i| kernels[i]).collect();
    for (p, &k) in ordered.iter().enumerate() {
        world.entity_mut(k).insert(KernelPosition(p as u32));
    }
    world.entity_mut(program).insert(ProgramKernels(ordered));
    Ok(PassOutcome::changed(changed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiler::builder::GraphBuilder;
    use crate::compiler::passes::{fusion, shape_inference};
    use crate::ir::{DType, ReduceKind, TensorType, UnaryOp};

    #[test]
    fn producers_run_before_consumers() {
        let mut world = World::new();
        let mut b = GraphBuilder::new(&mut world, "o");
        let x = b.parameter(TensorType::new(DType::F32, [8]));
        let e = b.unary(UnaryOp::Exp, x);
        let r = b.reduce(e, ReduceKind::Sum, vec![0]);
        let y = b.add(e, r);
        b.output(y);
        let p = b.finish();
        shape_inference::run(&mut world, p).unwrap();
        fusion::run(&mut world, p).unwrap();
        run(&mut world, p).unwrap();
        let pos = |n: Entity| {
            world
                .get::<KernelPosition>(world.get::<InKernel>(n).unwrap().0)
                .unwrap()
                .0
        };
        assert!(pos(e) < pos(r) && pos(r) < pos(y));
    }
}
