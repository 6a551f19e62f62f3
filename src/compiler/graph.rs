//! The graph IR as components.
//!
//! A **program** entity carries [`Program`], [`ProgramNodes`] (every node, in
//! creation order) and [`ProgramOutputs`] (the declared results, in order).
//! Each **node** entity carries [`InProgram`], [`Node`] (op and attributes),
//! [`Operands`] (ordered; a node may use the same operand twice, and fan-out
//! is free), [`NodeName`], and optionally [`DeclaredType`] (parameters, iota,
//! custom calls), [`Literal`] (constants) and [`Output`]. Shape inference adds
//! [`ValueType`]. Many programs can share one world.
//!
//! [`GraphIndex`] is a dense snapshot of one program's edges that passes
//! build once per run (hash lookups happen only while building it).

use bevy_ecs::entity::EntityHashMap;
use bevy_ecs::prelude::*;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::sync::Arc;

use super::op::Op;
use super::types::TensorType;
use crate::ir::Tensor;

/// A program: the root of one graph.
#[derive(Component, Debug, Clone, Serialize, Deserialize)]
pub struct Program {
    /// The program's name (file stem or builder name).
    pub name: String,
}

/// Every live node of a program, in creation order.
#[derive(Component, Debug, Clone, Default)]
pub struct ProgramNodes(pub Vec<Entity>);

/// The declared results of a program, in order. An empty list means "no
/// declared outputs": DCE then leaves the graph intact.
#[derive(Component, Debug, Clone, Default)]
pub struct ProgramOutputs(pub Vec<Entity>);

/// Marks a program whose `Compile` run has not finished.
#[derive(Component, Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct PendingCompile;

/// The node belongs to this program entity.
#[derive(Component, Debug, Clone, Copy)]
pub struct InProgram(pub Entity);

/// What the node computes.
#[derive(Component, Debug, Clone, Serialize, Deserialize)]
pub struct Node {
    /// The op with its attributes.
    pub op: Op,
}

/// Ordered operands.
#[derive(Component, Debug, Clone, Default)]
pub struct Operands(pub SmallVec<[Entity; 4]>);

/// The node's name, printed as `%name`.
#[derive(Component, Debug, Clone, Serialize, Deserialize)]
pub struct NodeName(pub String);

/// The type a parameter, iota or custom call declares.
#[derive(Component, Debug, Clone, Serialize, Deserialize)]
pub struct DeclaredType(pub TensorType);

/// The type shape inference computed.
#[derive(Component, Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValueType(pub TensorType);

/// The value of a constant. Shared, not owned: a constant never changes in
/// place, so a checkpoint writes it straight from here and a restored one
/// keeps the buffer it was read into.
#[derive(Component, Debug, Clone)]
pub struct Literal(pub Arc<Tensor>);

impl Literal {
    /// A literal holding `value`.
    pub fn new(value: Tensor) -> Literal {
        Literal(Arc::new(value))
    }
}

/// Marks a node listed in its program's outputs.
#[derive(Component, Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Output;

/// `%name (f32[8,128])`, or `%name` before shape inference.
pub fn node_label(world: &World, node: Entity) -> String {
    let name = world
        .get::<NodeName>(node)
        .map_or_else(|| format!("{node}"), |n| n.0.clone());
    match world.get::<ValueType>(node) {
        Some(t) => format!("%{name} ({})", t.0),
        None => format!("%{name}"),
    }
}

/// A program's name, or its entity when it has none.
pub fn program_name(world: &World, program: Entity) -> String {
    world
        .get::<Program>(program)
        .map_or_else(|| format!("{program}"), |p| p.name.clone())
}

/// The nodes of a program (empty when the entity is not a program).
pub fn program_nodes(world: &World, program: Entity) -> Vec<Entity> {
    world
        .get::<ProgramNodes>(program)
        .map(|n| n.0.clone())
        .unwrap_or_default()
}

/// A dense snapshot of one program's edges: node `i` is `nodes[i]`.
/// Operands that are not nodes of the program are left out of `operands`
/// and counted in `dangling`.
#[derive(Debug, Default)]
pub struct GraphIndex {
    /// Node entities.
    pub nodes: Vec<Entity>,
    /// Entity → dense index.
    pub index: EntityHashMap<u32>,
    /// Dense operand lists.
    pub operands: Vec<SmallVec<[u32; 4]>>,
    /// Number of operands that are not nodes of this program.
    pub dangling: usize,
}

impl GraphIndex {
    /// Snapshots `program`.
    pub fn build(world: &World, program: Entity) -> GraphIndex {
        let nodes = program_nodes(world, program);
        let mut index = EntityHashMap::default();
        index.reserve(nodes.len());
        for (i, &e) in nodes.iter().enumerate() {
            index.insert(e, i as u32);
        }
        let mut dangling = 0;
        let operands = nodes
            .iter()
            .map(|&e| {
                let ops = world
                    .get::<Operands>(e)
                    .map(|o| o.0.as_slice())
                    .unwrap_or(&[]);
                ops.iter()
                    .filter_map(|o| {
                        let i = index.get(o).copied();
                        dangling += usize::from(i.is_none());
                        i
                    })
                    .collect()
            })
            .collect();
        GraphIndex {
            nodes,
            index,
            operands,
            dangling,
        }
    }

    /// Users of each node (a user appears once per use).
    pub fn users(&self) -> Vec<SmallVec<[u32; 4]>> {
        let mut users = vec![SmallVec::new(); self.nodes.len()];
        for (u, ops) in self.operands.iter().enumerate() {
            for &o in ops {
                users[o as usize].push(u as u32);
            }
        }
        users
    }

    /// A topological order (operands first, ties in creation order), or the
    /// nodes that lie on or behind a cycle.
    pub fn topo_order(&self) -> Result<Vec<u32>, Vec<u32>> {
        let n = self.nodes.len();
        let mut pending: Vec<u32> = self.operands.iter().map(|o| o.len() as u32).collect();
        let users = self.users();
        let mut order = Vec::with_capacity(n);
        let mut ready: Vec<u32> = (0..n as u32)
            .filter(|&i| pending[i as usize] == 0)
            .rev()
            .collect();
        while let Some(i) = ready.pop() {
            order.push(i);
            for &u in users[i as usize].iter().rev() {
                pending[u as usize] -= 1;
                if pending[u as usize] == 0 {
                    ready.push(u);
                }
            }
        }
        if order.len() == n {
            Ok(order)
        } else {
            Err((0..n as u32).filter(|&i| pending[i as usize] > 0).collect())
        }
    }
}

/// Topological order of a program's nodes as entities (operands first).
pub fn topo_entities(world: &World, program: Entity) -> Result<Vec<Entity>, Vec<Entity>> {
    let g = GraphIndex::build(world, program);
    match g.topo_order() {
        Ok(o) => Ok(o.into_iter().map(|i| g.nodes[i as usize]).collect()),
        Err(c) => Err(c.into_iter().map(|i| g.nodes[i as usize]).collect()),
    }
}

/// Rewrites `ProgramOutputs` through `forward` and keeps [`Output`] markers in
/// sync. Returns whether any output changed.
pub fn forward_outputs(
    world: &mut World,
    program: Entity,
    forward: &EntityHashMap<Entity>,
) -> bool {
    let Some(outputs) = world.get::<ProgramOutputs>(program).map(|o| o.0.clone()) else {
        return false;
    };
    let mut changed = false;
    let new: Vec<Entity> = outputs
        .iter()
        .map(|o| match forward.get(o) {
            Some(&n) => {
                changed = true;
                n
            }
            None => *o,
        })
        .collect();
    if changed {
        for &o in &outputs {
            if let Ok(mut e) = world.get_entity_mut(o) {
                e.remove::<Output>();
            }
        }
        for &o in &new {
            if let Ok(mut e) = world.get_entity_mut(o) {
                e.insert(Output);
            }
        }
        if let Some(mut out) = world.get_mut::<ProgramOutputs>(program) {
            out.0 = new;
        }
    }
    changed
}
