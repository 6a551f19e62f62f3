//! `fusion`: group nodes into kernels.
//!
//! Every computation ends up in exactly one kernel; parameters and constants
//! are kernel inputs, not kernels. Elementwise ops, broadcasts and iota are
//! *fusible*. Kernels are **contiguous segments of one topological order**,
//! so the kernel graph can never have a cycle (every edge between kernels
//! points forward in the order) and no reachability search is needed.
//!
//! The order is chosen to make fused segments long: among ready nodes,
//! fusible nodes with an operand in the open fused segment go first (the
//! consumer follows its producer into the kernel), then ops that are not
//! fusible (each closes the open segment and becomes a kernel of its own),
//! then fusible nodes that start a new segment (e.g. a broadcast of a
//! parameter, which thereby lands in the kernel of its consumer). A value
//! used outside its kernel, or declared as a program output, becomes an
//! extra kernel output (**multi-output fusion**): an Adam update (new
//! params, m and v) becomes one kernel that reads each input once.
//!
//! Each producer→consumer edge that crosses kernels from a fusible producer
//! is recorded as a [`FusionRefusal`] with its reason:
//! - the consumer is not a loop fusion (a dot, reduce, convolution, data
//!   movement or custom call does not absorb elementwise producers);
//! - the producer's kernel reached [`MAX_FUSION_NODES`];
//! - the consumer depends on a kernel that depends on the producer (fusing
//!   them would create a cycle), or waits on a non-fusible kernel that runs
//!   in between (checked with at most [`MAX_REACHABILITY_VISITS`] visits).
//!
//! Reads the graph and types; writes [`Kernel`] entities, [`InKernel`] on
//! nodes, [`ProgramKernels`] and [`FusionRefusals`] on the program.
//! "Changed" means some kernel has more than one node. Disabled
//! (`--disable-pass fusion`), [`run_unfused`] runs instead: one unfused
//! kernel per op. Linear in the graph
//! size apart from a heap over ready nodes (`O(n log n)`).

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

use bevy_ecs::prelude::*;
use serde::Serialize;
use smallvec::SmallVec;

use super::PassOutcome;
use crate::compiler::CompileError;
use crate::compiler::graph::{GraphIndex, Node, ProgramOutputs, node_label};
use crate::ir::op::Op;

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
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct FusionRefusal {
    /// The reason.
    pub reason: String,
    /// The producer's label.
    pub producer: String,
    /// The consumer's label.
    pub consumer: String,
}

/// All refusals of a program, in the order they happened.
#[derive(Component, Debug, Clone, Default, Serialize, serde::Deserialize)]
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
    closed_at_cap: bool,
}

struct Planner<'a> {
    g: &'a GraphIndex,
    /// Whether fusible ops may share a kernel (off: one kernel per op).
    fuse: bool,
    users: Vec<SmallVec<[u32; 4]>>,
    group_of: Vec<u32>,
    groups: Vec<Group>,
}

/// Whether a fusible node may join the open segment `group`.
fn can_join(group: &Group) -> FusionDecision {
    if !group.fused {
        return FusionDecision::Refuse("the consumer is not a loop fusion".into());
    }
    if group.members.len() >= MAX_FUSION_NODES {
        return FusionDecision::Refuse(
            format!("the producer's kernel is at the size cap of {MAX_FUSION_NODES} nodes").into(),
        );
    }
    FusionDecision::Fuse
}

/// Ready-node queues, by priority.
#[derive(Default)]
struct Ready {
    continuing: BinaryHeap<Reverse<u32>>,
    other: BinaryHeap<Reverse<u32>>,
    fresh: BinaryHeap<Reverse<u32>>,
}

impl Ready {
    fn pop(&mut self) -> Option<u32> {
        self.continuing
            .pop()
            .or_else(|| self.other.pop())
            .or_else(|| self.fresh.pop())
            .map(|Reverse(i)| i)
    }
}

impl Planner<'_> {
    /// Emits nodes in priority order and cuts the order into kernels.
    fn segment(&mut self, ops: &[Op]) {
        let mut pending: Vec<u32> = self.g.operands.iter().map(|o| o.len() as u32).collect();
        let mut ready = Ready::default();
        let mut open: u32 = NONE;
        let is_leaf = |i: usize| matches!(ops[i], Op::Parameter { .. } | Op::Constant);
        for (i, &p) in pending.iter().enumerate() {
            if p == 0 {
                ready.fresh.push(Reverse(i as u32));
            }
        }
        while let Some(i) = ready.pop() {
            let iu = i as usize;
            if !is_leaf(iu) {
                if self.fuse && ops[iu].is_fusible() {
                    let join = open != NONE
                        && can_join(&self.groups[open as usize]) == FusionDecision::Fuse;
                    if join {
                        self.group_of[iu] = open;
                        self.groups[open as usize].members.push(i);
                    } else {
                        if open != NONE && self.groups[open as usize].fused {
                            self.groups[open as usize].closed_at_cap = true;
                        }
                        open = self.new_group(i, true);
                    }
                } else {
                    self.new_group(i, false);
                    open = NONE;
                }
            }
            for &u in &self.users[iu] {
                pending[u as usize] -= 1;
                if pending[u as usize] != 0 {
                    continue;
                }
                let uu = u as usize;
                let queue = if is_leaf(uu) {
                    &mut ready.continuing
                } else if !ops[uu].is_fusible() {
                    &mut ready.other
                } else if open != NONE
                    && self.g.operands[uu]
                        .iter()
                        .any(|&o| self.group_of[o as usize] == open)
                {
                    &mut ready.continuing
                } else {
                    &mut ready.fresh
                };
                queue.push(Reverse(u));
            }
        }
    }

    fn new_group(&mut self, node: u32, fused: bool) -> u32 {
        let id = self.groups.len() as u32;
        self.group_of[node as usize] = id;
        self.groups.push(Group {
            members: vec![node],
            fused,
            closed_at_cap: false,
        });
        id
    }

    /// Whether `from` reaches `to` through a node outside loop fusions,
    /// looking only at nodes before `to` in the order; `None` when the
    /// search exceeds its budget.
    fn reaches_through_other_kernel(&self, from: u32, to: u32, position: &[u32]) -> Option<bool> {
        let limit = position[to as usize];
        let mut stack: Vec<(u32, bool)> = vec![(from, false)];
        let mut seen: bevy_ecs::entity::EntityHashSet = Default::default();
        let mut visits = 0;
        while let Some((x, through)) = stack.pop() {
            for &u in &self.users[x as usize] {
                visits += 1;
                if visits > MAX_REACHABILITY_VISITS {
                    return None;
                }
                if u == to {
                    if through {
                        return Some(true);
                    }
                    continue;
                }
                if position[u as usize] > limit || !seen.insert(self.g.nodes[u as usize]) {
                    continue;
                }
                let g = self.group_of[u as usize];
                let other = g == NONE || !self.groups[g as usize].fused;
                stack.push((u, through || other));
            }
        }
        Some(false)
    }

    /// The reason the edge `producer → consumer` crosses kernels.
    fn refusal_reason(&self, producer: u32, consumer: u32, position: &[u32]) -> Cow<'static, str> {
        let pg = &self.groups[self.group_of[producer as usize] as usize];
        let cg = &self.groups[self.group_of[consumer as usize] as usize];
        if !cg.fused {
            return "the consumer is not a loop fusion, so it does not absorb elementwise producers".into();
        }
        if pg.closed_at_cap && pg.members.len() >= MAX_FUSION_NODES {
            return format!("the producer's kernel is at the size cap of {MAX_FUSION_NODES} nodes")
                .into();
        }
        match self.reaches_through_other_kernel(producer, consumer, position) {
            Some(true) => "fusing would create a cycle: the consumer depends on a kernel that depends on the producer".into(),
            Some(false) => "the consumer waits on a kernel that is not a loop fusion and runs after the producer's kernel".into(),
            None => format!("the cycle check exceeded its budget of {MAX_REACHABILITY_VISITS} visits").into(),
        }
    }
}

/// The note of the `fusion` row when the pass is disabled.
pub const DISABLED_NOTE: &str = "disabled: one kernel per op";

/// Groups nodes into kernels and spawns the kernel entities.
pub fn run(world: &mut World, program: Entity) -> Result<PassOutcome, CompileError> {
    plan_kernels(world, program, true)
}

/// What runs instead of [`run`] when `fusion` is disabled: every op that
/// is not a parameter or constant becomes a kernel of its own, not a loop
/// fusion (the executor runs it whole, as it runs a dot or a reduce), and
/// no refusals are recorded. Later passes need kernels, so this still
/// spawns them; "changed" is always false.
pub fn run_unfused(world: &mut World, program: Entity) -> Result<PassOutcome, CompileError> {
    plan_kernels(world, program, false)?;
    Ok(PassOutcome {
        changed: false,
        note: Some(DISABLED_NOTE.into()),
    })
}

fn plan_kernels(
    world: &mut World,
    program: Entity,
    fuse: bool,
) -> Result<PassOutcome, CompileError> {
    despawn_previous_kernels(world, program);
    let g = GraphIndex::build(world, program);
    let ops: Vec<Op> = g
        .nodes
        .iter()
        .map(|&e| world.get::<Node>(e).expect("node").op.clone())
        .collect();
    let mut planner = Planner {
        g: &g,
        fuse,
        users: g.users(),
        group_of: vec![NONE; g.nodes.len()],
        groups: Vec::new(),
    };
    planner.segment(&ops);
    let mut order = Vec::with_capacity(g.nodes.len());
    for group in &planner.groups {
        order.extend_from_slice(&group.members);
    }
    let mut position = vec![u32::MAX; g.nodes.len()];
    for (p, &i) in order.iter().enumerate() {
        position[i as usize] = p as u32;
    }
    if let Some(stuck) = (0..g.nodes.len()).find(|&i| {
        planner.group_of[i] == NONE && !matches!(ops[i], Op::Parameter { .. } | Op::Constant)
    }) {
        return Err(CompileError::Shape {
            node: node_label(world, g.nodes[stuck]),
            message: "is on a cycle".into(),
        });
    }
    let mut refusals = Vec::new();
    for (p, op) in ops.iter().enumerate() {
        if !fuse || !op.is_fusible() {
            continue;
        }
        let mut reported: SmallVec<[u32; 4]> = SmallVec::new();
        for &q in &planner.users[p] {
            let qg = planner.group_of[q as usize];
            if qg == planner.group_of[p] || reported.contains(&qg) {
                continue;
            }
            reported.push(qg);
            refusals.push(FusionRefusal {
                reason: planner.refusal_reason(p as u32, q, &position).into_owned(),
                producer: node_label(world, g.nodes[p]),
                consumer: node_label(world, g.nodes[q as usize]),
            });
        }
    }
    let changed = planner.groups.iter().any(|gr| gr.members.len() > 1);
    spawn_kernels(world, program, &planner, &order);
    world.entity_mut(program).insert(FusionRefusals(refusals));
    Ok(PassOutcome::changed(changed))
}

/// Despawns the kernels of an earlier compilation of `program`.
fn despawn_previous_kernels(world: &mut World, program: Entity) {
    if let Some(old) = world.entity_mut(program).take::<ProgramKernels>() {
        for k in old.0 {
            world.despawn(k);
        }
    }
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
    use crate::compiler::builder::GraphBuilder;
    use crate::compiler::passes::shape_inference;
    use crate::ir::{DType, ReduceKind, TensorType, UnaryOp};

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
    fn unfused_gives_each_op_its_own_kernel_and_no_refusals() {
        let mut world = World::new();
        let mut b = GraphBuilder::new(&mut world, "u");
        let x = b.parameter(TensorType::new(DType::F32, [8]));
        let e = b.unary(UnaryOp::Exp, x);
        let y = b.add(e, x);
        b.output(y);
        let p = b.finish();
        shape_inference::run(&mut world, p).unwrap();
        let out = run_unfused(&mut world, p).unwrap();
        assert!(!out.changed);
        assert_eq!(out.note.as_deref(), Some(DISABLED_NOTE));
        let ks = kernels(&world, p);
        assert_eq!(ks.len(), 2);
        assert!(ks.iter().all(|k| k.members.len() == 1 && !k.fused));
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
