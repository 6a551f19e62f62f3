//! [`GraphBuilder`]: build a program's graph from Rust.
//!
//! ```
//! use bevy_ecs::world::World;
//! use optirs_tpu::xla::{DType, GraphBuilder, TensorType};
//!
//! let mut world = World::new();
//! let mut b = GraphBuilder::new(&mut world, "axpy");
//! let x = b.parameter(TensorType::new(DType::F32, [4]));
//! let y = b.parameter(TensorType::new(DType::F32, [4]));
//! let a = b.scalar(DType::F32, 2.0);
//! let ax = b.mul(a, x);
//! let out = b.add(ax, y);
//! b.output(out);
//! let program = b.finish();
//! assert_eq!(optirs_tpu::xla::graph::program_nodes(&world, program).len(), 5);
//! ```

use bevy_ecs::prelude::*;
use smallvec::SmallVec;

use super::graph::{
    DeclaredType, InProgram, Literal, Node, NodeName, Operands, Output, PendingCompile, Program,
    ProgramNodes, ProgramOutputs,
};
use super::op::{BinaryOp, CompareDir, ConvAttrs, DotDims, Op, ReduceKind, UnaryOp};
use super::types::{DType, TensorType};
use crate::ir::Tensor;

/// Adds nodes to a new program in a world. Nodes are named `op.N` unless
/// named explicitly; operands must be nodes already added.
pub struct GraphBuilder<'w> {
    world: &'w mut World,
    program: Entity,
    nodes: Vec<Entity>,
    outputs: Vec<Entity>,
    next_parameter: usize,
}

impl<'w> GraphBuilder<'w> {
    /// Spawns an empty program named `name` (marked for compilation).
    pub fn new(world: &'w mut World, name: &str) -> Self {
        let program = world
            .spawn((
                Program {
                    name: name.to_owned(),
                },
                ProgramNodes::default(),
                ProgramOutputs::default(),
                PendingCompile,
            ))
            .id();
        GraphBuilder {
            world,
            program,
            nodes: Vec::new(),
            outputs: Vec::new(),
            next_parameter: 0,
        }
    }

    /// The program entity.
    pub fn program(&self) -> Entity {
        self.program
    }

    /// The world being built into.
    pub fn world(&self) -> &World {
        self.world
    }

    /// Adds a node. `name` defaults to `op.N` where N is the node's position.
    pub fn node_named(
        &mut self,
        name: Option<String>,
        op: Op,
        operands: &[Entity],
        declared: Option<TensorType>,
        literal: Option<Tensor>,
    ) -> Entity {
        let name = name.unwrap_or_else(|| format!("{}.{}", op.name(), self.nodes.len()));
        let mut e = self.world.spawn((
            InProgram(self.program),
            Node { op },
            Operands(SmallVec::from_slice(operands)),
            NodeName(name),
        ));
        if let Some(t) = declared {
            e.insert(DeclaredType(t));
        }
        if let Some(l) = literal {
            e.insert(Literal::new(l));
        }
        let id = e.id();
        self.nodes.push(id);
        id
    }

    /// Adds an unnamed node.
    pub fn node(&mut self, op: Op, operands: &[Entity]) -> Entity {
        self.node_named(None, op, operands, None, None)
    }

    /// The next parameter (indices count up from 0).
    pub fn parameter(&mut self, ty: TensorType) -> Entity {
        let index = self.next_parameter;
        self.next_parameter += 1;
        self.node_named(None, Op::Parameter { index }, &[], Some(ty), None)
    }

    /// A constant tensor.
    pub fn constant(&mut self, value: Tensor) -> Entity {
        self.node_named(None, Op::Constant, &[], None, Some(value))
    }

    /// A rank-0 constant.
    pub fn scalar(&mut self, dtype: DType, value: f64) -> Entity {
        self.constant(Tensor::scalar(dtype, value))
    }

    /// Indices along `dim`.
    pub fn iota(&mut self, ty: TensorType, dim: usize) -> Entity {
        self.node_named(None, Op::Iota { dim }, &[], Some(ty), None)
    }

    /// An elementwise unary op.
    pub fn unary(&mut self, op: UnaryOp, x: Entity) -> Entity {
        self.node(Op::Unary(op), &[x])
    }

    /// An elementwise binary op.
    pub fn binary(&mut self, op: BinaryOp, a: Entity, b: Entity) -> Entity {
        self.node(Op::Binary(op), &[a, b])
    }

    /// `a + b`.
    pub fn add(&mut self, a: Entity, b: Entity) -> Entity {
        self.binary(BinaryOp::Add, a, b)
    }

    /// `a - b`.
    pub fn sub(&mut self, a: Entity, b: Entity) -> Entity {
        self.binary(BinaryOp::Sub, a, b)
    }

    /// `a * b`.
    pub fn mul(&mut self, a: Entity, b: Entity) -> Entity {
        self.binary(BinaryOp::Mul, a, b)
    }

    /// `a / b`.
    pub fn div(&mut self, a: Entity, b: Entity) -> Entity {
        self.binary(BinaryOp::Div, a, b)
    }

    /// `max(a, b)`.
    pub fn max(&mut self, a: Entity, b: Entity) -> Entity {
        self.binary(BinaryOp::Max, a, b)
    }

    /// `a dir b`.
    pub fn compare(&mut self, dir: CompareDir, a: Entity, b: Entity) -> Entity {
        self.node(Op::Compare(dir), &[a, b])
    }

    /// `pred ? t : f`.
    pub fn select(&mut self, pred: Entity, t: Entity, f: Entity) -> Entity {
        self.node(Op::Select, &[pred, t, f])
    }

    /// Broadcast to `shape` (numpy rules when `dims` is `None`).
    pub fn broadcast(&mut self, x: Entity, shape: Vec<usize>, dims: Option<Vec<usize>>) -> Entity {
        self.node(Op::Broadcast { shape, dims }, &[x])
    }

    /// Reshape (one `-1` allowed).
    pub fn reshape(&mut self, x: Entity, shape: Vec<i64>) -> Entity {
        self.node(Op::Reshape { shape }, &[x])
    }

    /// Transpose.
    pub fn transpose(&mut self, x: Entity, perm: Vec<usize>) -> Entity {
        self.node(Op::Transpose { perm }, &[x])
    }

    /// Reduce over `dims`.
    pub fn reduce(&mut self, x: Entity, kind: ReduceKind, dims: Vec<usize>) -> Entity {
        self.node(Op::Reduce { kind, dims }, &[x])
    }

    /// General dot.
    pub fn dot(&mut self, a: Entity, b: Entity, dims: DotDims) -> Entity {
        self.node(Op::Dot(dims), &[a, b])
    }

    /// Matrix product of `[m, k]` and `[k, n]`.
    pub fn matmul(&mut self, a: Entity, b: Entity) -> Entity {
        self.dot(
            a,
            b,
            DotDims {
                lhs_contracting: vec![1],
                rhs_contracting: vec![0],
                ..Default::default()
            },
        )
    }

    /// 2-D convolution.
    pub fn convolution(&mut self, x: Entity, w: Entity, attrs: ConvAttrs) -> Entity {
        self.node(Op::Convolution(attrs), &[x, w])
    }

    /// An opaque call returning `ty`.
    pub fn custom_call(&mut self, target: &str, operands: &[Entity], ty: TensorType) -> Entity {
        self.node_named(
            None,
            Op::CustomCall {
                target: target.to_owned(),
            },
            operands,
            Some(ty),
            None,
        )
    }

    /// Declares `node` as the next program output.
    pub fn output(&mut self, node: Entity) {
        self.outputs.push(node);
    }

    /// Writes the node and output lists to the program and returns it.
    pub fn finish(self) -> Entity {
        for &o in &self.outputs {
            if let Ok(mut e) = self.world.get_entity_mut(o) {
                e.insert(Output);
            }
        }
        let mut p = self.world.entity_mut(self.program);
        p.insert((ProgramNodes(self.nodes), ProgramOutputs(self.outputs)));
        self.program
    }
}
