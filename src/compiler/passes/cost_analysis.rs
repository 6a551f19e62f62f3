//! `cost-analysis`: flops, transcendentals and bytes of every node, kernel
//! and program (XLA's `HloCostAnalysis`, rules in [`crate::compiler::cost`]).
//!
//! Runs after fusion because a fused kernel is costed as XLA costs a fusion:
//! its flops and transcendentals are the sum of its nodes', but its bytes
//! are only what crosses the kernel boundary — each external input read
//! once, each kernel output written once — since values inside a loop
//! fusion never touch memory. A kernel that is not a loop fusion (a dot, a
//! reduce, every kernel with fusion disabled) costs what its one node costs.
//! A program's totals are the sum of its kernels.
//!
//! Reads ops, operands, [`ValueType`]s and kernels; writes [`NodeCost`] on
//! nodes, [`KernelCost`] on kernels and [`ProgramCost`] on the program. The
//! graph is not changed. [`analyze`] computes the same [`ProgramCost`]
//! without writing anything, for a host that costs many programs. Linear
//! in nodes plus operand edges.

use bevy_ecs::prelude::*;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use super::PassOutcome;
use super::fusion::{Kernel, ProgramKernels};
use crate::compiler::CompileError;
use crate::compiler::cost::{OpCost, op_cost};
use crate::compiler::graph::{Node, Operands, Program, ValueType, node_label, program_nodes};
use crate::ir::types::TensorType;

/// The pass name.
pub const NAME: &str = "cost-analysis";

/// The cost of one node on its own.
#[derive(Component, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeCost(pub OpCost);

/// The cost of one kernel, fusion-aware.
#[derive(Component, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelCost(pub OpCost);

/// The cost of a program: totals and one entry per kernel.
#[derive(Component, Debug, Clone, Default, PartialEq, Serialize)]
pub struct ProgramCost {
    /// Sum over kernels (over nodes when the program has no kernels yet).
    pub totals: OpCost,
    /// Each kernel with its cost, in [`ProgramKernels`] order when costed
    /// (`ordering`, which runs later, may put them in another order).
    #[serde(skip)]
    pub kernels: Vec<(Entity, OpCost)>,
}

fn value_type(world: &World, node: Entity) -> Result<&TensorType, CompileError> {
    world
        .get::<ValueType>(node)
        .map(|t| &t.0)
        .ok_or_else(|| CompileError::Shape {
            node: node_label(world, node),
            message: "has no type: cost analysis needs shape inference to run first".into(),
        })
}

/// The cost of one node from its op and the types shape inference left.
pub fn node_cost(world: &World, node: Entity) -> Result<OpCost, CompileError> {
    let op = &world
        .get::<Node>(node)
        .ok_or_else(|| CompileError::NotCompiled(format!("{node} is not a graph node")))?
        .op;
    let result = value_type(world, node)?;
    let operands: SmallVec<[&TensorType; 4]> = world
        .get::<Operands>(node)
        .map(|o| o.0.as_slice())
        .unwrap_or(&[])
        .iter()
        .map(|&o| value_type(world, o))
        .collect::<Result<_, _>>()?;
    Ok(op_cost(op, &operands, result))
}

/// A kernel's cost given its members' costs: a loop fusion reads each
/// input once and writes each output once; any other kernel costs its nodes.
fn kernel_cost_with(
    world: &World,
    kernel: &Kernel,
    member_cost: &mut impl FnMut(Entity) -> Result<OpCost, CompileError>,
) -> Result<OpCost, CompileError> {
    let nodes: OpCost = kernel
        .members
        .iter()
        .map(|&m| member_cost(m))
        .sum::<Result<OpCost, _>>()?;
    if !kernel.fused {
        return Ok(nodes);
    }
    let mut read = 0u64;
    for &i in &kernel.inputs {
        read = read.saturating_add(value_type(world, i)?.byte_size() as u64);
    }
    let mut written = 0u64;
    for &o in &kernel.outputs {
        written = written.saturating_add(value_type(world, o)?.byte_size() as u64);
    }
    Ok(OpCost {
        flops: nodes.flops,
        transcendentals: nodes.transcendentals,
        bytes_read: read,
        bytes_written: written,
    })
}

/// The cost of one kernel.
pub fn kernel_cost(world: &World, kernel: &Kernel) -> Result<OpCost, CompileError> {
    kernel_cost_with(world, kernel, &mut |m| node_cost(world, m))
}

fn analyze_with(
    world: &World,
    program: Entity,
    member_cost: &mut impl FnMut(Entity) -> Result<OpCost, CompileError>,
) -> Result<ProgramCost, CompileError> {
    if world.get::<Program>(program).is_none() {
        return Err(CompileError::NotCompiled(format!(
            "{program} is not a program"
        )));
    }
    let Some(kernels) = world.get::<ProgramKernels>(program) else {
        let totals = program_nodes(world, program)
            .into_iter()
            .map(&mut *member_cost)
            .sum::<Result<OpCost, _>>()?;
        return Ok(ProgramCost {
            totals,
            kernels: Vec::new(),
        });
    };
    let mut rows = Vec::with_capacity(kernels.0.len());
    for &k in &kernels.0 {
        let kernel = world.get::<Kernel>(k).ok_or_else(|| {
            CompileError::NotCompiled(format!("kernel {k} of the program is missing"))
        })?;
        rows.push((k, kernel_cost_with(world, kernel, member_cost)?));
    }
    Ok(ProgramCost {
        totals: rows.iter().map(|(_, c)| c).sum(),
        kernels: rows,
    })
}

/// The cost of `program` from the types shape inference left, without
/// running the pipeline or writing to the world. With kernels (after
/// fusion), the totals are fusion-aware; without, every node is costed on
/// its own. Errors name the first node without a type.
pub fn analyze(world: &World, program: Entity) -> Result<ProgramCost, CompileError> {
    analyze_with(world, program, &mut |m| node_cost(world, m))
}

/// Costs every node, kernel and the program, and attaches the results.
pub fn run(world: &mut World, program: Entity) -> Result<PassOutcome, CompileError> {
    let nodes = program_nodes(world, program);
    let mut node_costs = Vec::with_capacity(nodes.len());
    for &n in &nodes {
        node_costs.push((n, NodeCost(node_cost(world, n)?)));
    }
    world.insert_batch(node_costs);
    let cost = analyze_with(world, program, &mut |m| {
        world
            .get::<NodeCost>(m)
            .map(|c| c.0)
            .ok_or_else(|| CompileError::NotCompiled(format!("kernel member {m} is not a node")))
    })?;
    let kernel_costs: Vec<(Entity, KernelCost)> = cost
        .kernels
        .iter()
        .map(|&(k, c)| (k, KernelCost(c)))
        .collect();
    world.insert_batch(kernel_costs);
    world.entity_mut(program).insert(cost);
    Ok(PassOutcome::unchanged())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiler::builder::GraphBuilder;
    use crate::compiler::passes::{fusion, shape_inference};
    use crate::ir::{DType, UnaryOp};

    #[test]
    fn a_fusion_reads_its_inputs_once_and_writes_its_outputs() {
        let mut world = World::new();
        let mut b = GraphBuilder::new(&mut world, "c");
        let t = TensorType::new(DType::F32, [16]);
        let x = b.parameter(t.clone());
        let e = b.unary(UnaryOp::Exp, x);
        let y = b.mul(e, x);
        b.output(y);
        let p = b.finish();
        shape_inference::run(&mut world, p).unwrap();
        let unfused = analyze(&world, p).unwrap();
        // exp: reads x (64), writes 64; mul: reads e and x (128), writes 64.
        assert_eq!(unfused.totals.bytes_read, 192);
        assert_eq!(unfused.totals.bytes_written, 128);
        fusion::run(&mut world, p).unwrap();
        run(&mut world, p).unwrap();
        let cost = world.get::<ProgramCost>(p).unwrap();
        assert_eq!(cost.kernels.len(), 1);
        assert_eq!(cost.totals.flops, 16);
        assert_eq!(cost.totals.transcendentals, 16);
        assert_eq!(
            (cost.totals.bytes_read, cost.totals.bytes_written),
            (64, 64)
        );
        assert_eq!(world.get::<NodeCost>(e).unwrap().0.transcendentals, 16);
        assert_eq!(
            world.get::<KernelCost>(cost.kernels[0].0).unwrap().0,
            cost.totals
        );
        assert_eq!(analyze(&world, p).unwrap(), *cost);
    }

    #[test]
    fn a_node_without_a_type_is_an_error_naming_it() {
        let mut world = World::new();
        let mut b = GraphBuilder::new(&mut world, "c");
        let x = b.parameter(TensorType::new(DType::F32, [4]));
        let y = b.unary(UnaryOp::Neg, x);
        b.output(y);
        let p = b.finish();
        let err = analyze(&world, p).unwrap_err().to_string();
        assert!(
            err.contains("%") && err.contains("shape inference"),
            "{err}"
        );
        let not_a_program = world.spawn_empty().id();
        assert!(analyze(&world, not_a_program).is_err());
    }
}
