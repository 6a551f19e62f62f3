//! `fusion`: group nodes into kernels.
//!
//! Every computation ends up in exactly one kernel; parameters and constants
//! are kernel inputs, not kernels. Elementwise ops, broadcasts and iota are
//! *fusible*: visiting nodes consumers-first, a fusible producer joins the
//! kernel of its consumers. When its consumers sit in several kernels it
//! joins one of them and becomes an extra output of that kernel
//! (**multi-output fusion**) — an Adam update (new params, m and v) becomes
//! one kernel that reads each input once. A value that is a program output
//! is likewise an extra output of the kernel it lives in.
//!
//! Legality, each refusal recorded as a [`FusionRefusal`] with its reason:
//! - the consumer kernel is not a loop fusion (a dot, reduce, convolution,
//!   data movement or custom call does not absorb elementwise producers);
//! - the kernel reached [`MAX_FUSION_NODES`];
//! - joining would create a cycle between kernels (another consumer kernel
//!   reaches the chosen one);
//! - the reachability check ran out of its [`MAX_REACHABILITY_VISITS`] budget.
//!
//! Reads the graph and types; writes [`Kernel`] entities, [`InKernel`] on
//! nodes, [`ProgramKernels`] and [`FusionRefusals`] on the program.
//! "Changed" means some kernel has more than one node.

use std::borrow::Cow;

use bevy_ecs::prelude::*;
use serde::Serialize;
use smallvec::SmallVec;

use super::PassOutcome;
use crate::xla::CompileError;
use crate::xla::graph::{GraphIndex, Node, ProgramOutputs, node_label};
use crate::xla::op::Op;

/// The pass name.
pub const NAME: &str = "fusion";

/// The most nodes one fused kernel may hold.
pub const MAX_FUSION_NODES: usize = 512;

/// Node visits allowed for one cycle check before fusion is refused.
pub const MAX_REACHABILITY_VISITS: usize = 4096;

/// A kernel: the unit the executable launches.
#[derive(Component, Debug, Clone)]
pub struct Kernel {
    /// The owning program.
    pub program: Entity,
    /// Member nodes in topological order.
    pub members: Vec<Entity>,
    /// Values read from outside the kernel (each once), in first-use order.
    pub inputs: Vec<Entity>,
    /// Member values needed outside the kernel (or declared outputs).
    pub outputs: Vec<Entity>,
    /// Whether this is a loop fusion of fusible ops (vs a single other op).
    pub fused: bool,
}

/// The kernel a node was placed in.
#[derive(Component, Debug, Clone, Copy)]
pub struct InKernel(pub Entity);

/// A program's kernels; in execution order once `ordering` ran.
#[derive(Component, Debug, Clone, Default)]
pub struct ProgramKernels(pub Vec<Entity>);

/// Why a producer was not fused into a consumer.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FusionRefusal {
    /// The reason.
    pub reason: String,
    /// The producer's label.
    pub producer: String,
    /// The consumer's label.
    pub consumer: String,
}

/// All refusals of a program, in the order they happened.
#[derive(Component, Debug, Clone, Default)]
pub struct FusionRefusals(pub Vec<FusionRefusal>);

/// Whether a producer may fuse, with the reason when it may not (XLA's `FusionDecision`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FusionDecision {
    /// Fusion is legal.
    Fuse,
    /// Fusion is refused for this reason.
    Refuse(Cow<'static, str>),
}

impl FusionDecision {
    /// `self`, then `next` when `self` allows fusion.
    pub fn and(self, next: impl FnOnce() -> FusionDecision) -> FusionDecision {
        match self {
            FusionDecision::Fuse => next(),
            refused => refused,
        }
    }
}

const NONE: u32 = u32::MAX;

struct Group {
    members: Vec<u32>,
    fused: bool,
}

struct Planner<'a> {
    g: &'a GraphIndex,
    users: Vec<SmallVec<[u32; 4]>>,
    group_of: Vec<u32>,
    groups: Vec<Group>,
}

impl Planner<'_> {
    fn new_group(&mut self, node: u32, fused: bool) {
        self.group_of[node as usize] = self.groups.len() as u32;
        self.groups.push(Group {
            members: vec![node],
            fused,
        });
    }

    /// Whether kernel `from` reaches kernel `to` through assigned nodes.
    fn reaches(&self, from: u32, to: u32) -> Option<bool> {
        let mut visited_groups = vec![from];
        let mut stack = vec![from];
        let mut visits = 0;
        while let Some(gid) = stack.pop() {
            for &m in &self.groups[gid as usize].members {
                for &u in &self.users[m as usize] {
                    visits += 1;
                    if visits > MAX_REACHABILITY_VISITS {
                        return None;
                    }
                    let ug = self.group_of[u as usize];
                    if ug == to {
                        return Some(true);
                    }
                    if ug != NONE && !visited_groups.contains(&ug) {
                        visited_groups.push(ug);
                        stack.push(ug);
                    }
                }
            }
        }
        Some(false)
    }

    fn decide(&self, target: u32, user_groups: &[u32]) -> FusionDecision {
        let group = &self.groups[target as usize];
        if !group.fused {
            return FusionDecision::Refuse(
                "the consumer is not a loop fusion, so it does not absorb elementwise producers"
                    .into(),
            );
        }
        if group.members.len() >= MAX_FUSION_NODES {
            return FusionDecision::Refuse(
                format!("the consumer kernel is at the size cap of {MAX_FUSION_NODES} nodes")
                    .into(),
            );
        }
        for &h in user_groups.iter().filter(|&&h| h != target) {
            match self.reaches(h, target) {
                Some(true) => {
                    return FusionDecision::Refuse("joining this kernel would create a cycle: another consumer kernel feeds it".into());
                }
                None => {
                    return FusionDecision::Refuse(format!("the cycle check exceeded its budget of {MAX_REACHABILITY_VISITS} visits").into());
                }
                Some(false) => {}
            }
        }
        FusionDecision::Fuse
    }
}

/// Groups nodes into kernels and spawns the kernel entities.
pub fn run(world: &mut World, program: Entity) -> Result<PassOutcome, CompileError> {
    let g = GraphIndex::build(world, program);
    let order = g.topo_order().map_err(|c| CompileError::Shape {
        node: node_label(world, g.nodes[c[0] as usize]),
        message: "is on a cycle".into(),
    })?;
    let mut planner = Planner {
        g: &g,
        users: g.users(),
        group_of: vec![NONE; g.nodes.len()],
        groups: Vec::new(),
    };
    let ops: Vec<Op> = g
        .nodes
        .iter()
        .map(|&e| world.get::<Node>(e).expect("node").op.clone())
        .collect();
    let mut refusals = Vec::new();
    for &i in order.iter().rev() {
        let op = &ops[i as usize];
        if matches!(op, Op::Parameter { .. } | Op::Constant) {
            continue;
        }
        if !op.is_fusible() {
            planner.new_group(i, false);
            continue;
        }
        let mut user_groups: SmallVec<[u32; 4]> = SmallVec::new();
        for &u in &planner.users[i as usize] {
            let ug = planner.group_of[u as usize];
            if !user_groups.contains(&ug) {
                user_groups.push(ug);
            }
        }
        let mut refused: SmallVec<[(u32, Cow<'static, str>); 2]> = SmallVec::new();
        let mut joined = false;
        for &target in &user_groups {
            match planner.decide(target, &user_groups) {
                FusionDecision::Fuse => {
                    planner.group_of[i as usize] = target;
                    planner.groups[target as usize].members.push(i);
                    joined = true;
                    break;
                }
                FusionDecision::Refuse(reason) => refused.push((target, reason)),
            }
        }
        if !joined {
            planner.new_group(i, true);
            for (target, reason) in refused {
                let consumer = planner.users[i as usize]
                    .iter()
                    .find(|&&u| planner.group_of[u as usize] == target)
                    .copied()
                    .unwrap_or(i);
                refusals.push(FusionRefusal {
                    reason: reason.into_owned(),
                    producer: node_label(world, g.nodes[i as usize]),
                    consumer: node_label(world, g.nodes[consumer as usize]),
                });
            }
        }
    }
    let changed = planner.groups.iter().any(|gr| gr.members.len() > 1);
    spawn_kernels(world, program, &planner, &order);
    world.entity_mut(program).insert(FusionRefusals(refusals));
    Ok(PassOutcome::changed(changed))
}

fn spawn_kernels(world: &mut World, program: Entity, planner: &Planner, order: &[u32]) {
    let g = planner.g;
    let mut position = vec![0u32; g.nodes.len()];
    for (p, &i) in order.iter().enumerate() {
        position[i as usize] = p as u32;
    }
    let is_output: Vec<bool> = {
        let mut v = vec![false; g.nodes.len()];
        if let Some(out) = world.get::<ProgramOutputs>(program) {
            for o in &out.0 {
                if let Some(&i) = g.index.get(o) {
                    v[i as usize] = true;
                }
            }
        }
        v
    };
    let mut kernels = Vec::with_capacity(planner.groups.len());
    for (gid, group) in planner.groups.iter().enumerate() {
        let mut members = group.members.clone();
        members.sort_by_key(|&m| position[m as usize]);
        let mut inputs: Vec<Entity> = Vec::new();
        let mut seen_inputs = bevy_ecs::entity::EntityHashSet::default();
        let mut outputs = Vec::new();
        for &m in &members {
            for &o in &g.operands[m as usize] {
                if planner.group_of[o as usize] != gid as u32
                    && seen_inputs.insert(g.nodes[o as usize])
                {
                    inputs.push(g.nodes[o as usize]);
                }
            }
            let used_outside = planner.users[m as usize]
                .iter()
                .any(|&u| planner.group_of[u as usize] != gid as u32);
            if used_outside || is_output[m as usize] {
                outputs.push(g.nodes[m as usize]);
            }
        }
        if outputs.is_empty() {
            outputs.push(g.nodes[*members.last().expect("non-empty group") as usize]);
        }
        let member_entities: Vec<Entity> = members.iter().map(|&m| g.nodes[m as usize]).collect();
        let kernel = world
            .spawn(Kernel {
                program,
                members: member_entities.clone(),
                inputs,
                outputs,
                fused: group.fused,
            })
            .id();
        for e in member_entities {
            world.entity_mut(e).insert(InKernel(kernel));
        }
        kernels.push(kernel);
    }
    world.entity_mut(program).insert(ProgramKernels(kernels));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xla::builder::GraphBuilder;
    use crate::xla::passes::shape_inference;
    use crate::xla::{DType, ReduceKind, TensorType, UnaryOp};

    fn fuse(build: impl FnOnce(&mut GraphBuilder)) -> (World, Entity) {
        let mut world = World::new();
        let mut b = GraphBuilder::new(&mut world, "f");
        build(&mut b);
        let p = b.finish();
        shape_inference::run(&mut world, p).unwrap();
        run(&mut world, p).unwrap();
        (world, p)
    }

    fn kernels(world: &World, p: Entity) -> Vec<Kernel> {
        world
            .get::<ProgramKernels>(p)
            .unwrap()
            .0
            .iter()
            .map(|&k| world.get::<Kernel>(k).unwrap().clone())
            .collect()
    }

    fn refusals(world: &World, p: Entity) -> Vec<FusionRefusal> {
        world.get::<FusionRefusals>(p).unwrap().0.clone()
    }

    #[test]
    fn multi_output_fusion_keeps_outputs_used_elsewhere() {
        let (world, p) = fuse(|b| {
            let x = b.parameter(TensorType::new(DType::F32, [8]));
            let e = b.unary(UnaryOp::Exp, x);
            let y = b.add(e, x);
            b.output(e);
            b.output(y);
        });
        let ks = kernels(&world, p);
        assert_eq!(ks.len(), 1);
        assert_eq!(ks[0].outputs.len(), 2);
        assert_eq!(ks[0].inputs.len(), 1, "x is read once");
        assert!(refusals(&world, p).is_empty());
    }

    #[test]
    fn refuses_to_fuse_into_a_reduce() {
        let (world, p) = fuse(|b| {
            let x = b.parameter(TensorType::new(DType::F32, [8]));
            let e = b.unary(UnaryOp::Exp, x);
            let r = b.reduce(e, ReduceKind::Sum, vec![0]);
            b.output(r);
        });
        assert_eq!(kernels(&world, p).len(), 2);
        let r = refusals(&world, p);
        assert_eq!(r.len(), 1);
        assert!(r[0].reason.contains("not a loop fusion"), "{r:?}");
        assert_eq!(r[0].producer, "%exp.1 (f32[8])");
    }

    #[test]
    fn refuses_at_the_size_cap() {
        let (world, p) = fuse(|b| {
            let mut x = b.parameter(TensorType::new(DType::F32, [2]));
            for _ in 0..MAX_FUSION_NODES + 1 {
                x = b.unary(UnaryOp::Neg, x);
            }
            b.output(x);
        });
        assert_eq!(kernels(&world, p).len(), 2);
        let r = refusals(&world, p);
        assert!(r.len() == 1 && r[0].reason.contains("size cap"), "{r:?}");
    }

    #[test]
    fn refuses_a_fusion_that_would_create_a_cycle() {
        // e feeds the reduce r and the add y; y also consumes r. Putting e in
        // y's kernel would make that kernel feed r and r feed it.
        let (world, p) = fuse(|b| {
            let x = b.parameter(TensorType::new(DType::F32, [8]));
            let e = b.unary(UnaryOp::Exp, x);
            let r = b.reduce(e, ReduceKind::Sum, vec![0]);
            let y = b.add(e, r);
            b.output(y);
        });
        let r = refusals(&world, p);
        assert!(r.iter().any(|f| f.reason.contains("cycle")), "{r:?}");
        assert_eq!(kernels(&world, p).len(), 3);
    }
}
