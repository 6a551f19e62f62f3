//! `shape-inference`: compute every node's [`ValueType`] from its operands.
//!
//! Reads ops, operands, declared types and literals; writes [`ValueType`].
//! "Changed" means some node got a new or different type. Refuses (with an
//! error naming the node) on dtype mismatches, shapes that do not broadcast,
//! out-of-range dimensions and malformed attributes.

use bevy_ecs::prelude::*;
use smallvec::SmallVec;

use super::PassOutcome;
use crate::compiler::CompileError;
pub use crate::compiler::error::InferenceError;
use crate::compiler::graph::{
    DeclaredType, GraphIndex, Literal, Node, ValueType, node_label, program_name,
};
use crate::ir::op::{BinaryOp, Op, UnaryOp};
use crate::ir::types::{DType, TensorType};
use crate::kernels::contraction::{conv_result_shape, dot_result_shape};
use crate::kernels::elementwise::broadcast_shapes;
use crate::kernels::resolve_reshape;

/// The pass name.
pub const NAME: &str = "shape-inference";

/// The largest tensor a program may describe (2^36 elements).
pub const MAX_ELEMENTS: usize = 1 << 36;

/// The result type of `op` applied to operands of `args` types. `declared`
/// and `literal` supply the type of leaf nodes.
pub fn infer_type(
    op: &Op,
    args: &[&TensorType],
    declared: Option<&TensorType>,
    literal: Option<TensorType>,
) -> Result<TensorType, InferenceError> {
    let t = infer_unchecked(op, args, declared, literal)?;
    let too_big = t
        .dims
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .is_none_or(|n| n > MAX_ELEMENTS);
    if too_big {
        return Err(InferenceError::TooLarge {
            ty: t,
            limit: MAX_ELEMENTS,
        });
    }
    Ok(t)
}

fn infer_unchecked(
    op: &Op,
    args: &[&TensorType],
    declared: Option<&TensorType>,
    literal: Option<TensorType>,
) -> Result<TensorType, InferenceError> {
    match op {
        Op::Parameter { .. } | Op::CustomCall { .. } => {
            declared.cloned().ok_or(InferenceError::NeedsDeclaredType)
        }
        Op::Iota { dim } => infer_iota(declared, *dim),
        Op::Constant => literal.ok_or(InferenceError::NoLiteral),
        Op::Unary(u) => infer_unary(op, *u, arg(args, 0)?),
        Op::Binary(b) => infer_binary(op, *b, arg(args, 0)?, arg(args, 1)?),
        Op::Compare(_) => {
            let (x, y) = (arg(args, 0)?, arg(args, 1)?);
            same_dtype(x, y)?;
            Ok(TensorType::new(DType::Pred, bcast(&x.dims, &y.dims)?))
        }
        Op::Select => infer_select(arg(args, 0)?, arg(args, 1)?, arg(args, 2)?),
        Op::Convert(to) => Ok(TensorType::new(*to, arg(args, 0)?.dims.clone())),
        Op::Broadcast { shape, dims } => infer_broadcast(arg(args, 0)?, shape, dims.as_deref()),
        Op::Reshape { shape } => {
            let a = arg(args, 0)?;
            Ok(TensorType::new(
                a.dtype,
                resolve_reshape(a.element_count(), shape)?,
            ))
        }
        Op::Transpose { perm } => infer_transpose(arg(args, 0)?, perm),
        Op::Slice {
            start,
            limit,
            stride,
        } => infer_slice(arg(args, 0)?, start, limit, stride),
        Op::Concatenate { dim } => infer_concatenate(args, *dim),
        Op::Reduce { dims, .. } => infer_reduce(arg(args, 0)?, dims),
        Op::Dot(d) => {
            let (x, y) = numeric_pair(op, args)?;
            Ok(TensorType::new(
                x.dtype,
                dot_result_shape(&x.dims, &y.dims, d)?,
            ))
        }
        Op::Convolution(c) => {
            let (x, w) = numeric_pair(op, args)?;
            Ok(TensorType::new(
                x.dtype,
                conv_result_shape(&x.dims, &w.dims, c)?,
            ))
        }
    }
}

/// Operand `i`'s type.
fn arg<'a>(args: &[&'a TensorType], i: usize) -> Result<&'a TensorType, InferenceError> {
    args.get(i)
        .copied()
        .ok_or(InferenceError::MissingOperand { index: i })
}

fn same_dtype(a: &TensorType, b: &TensorType) -> Result<(), InferenceError> {
    if a.dtype == b.dtype {
        Ok(())
    } else {
        Err(InferenceError::DTypesDiffer {
            lhs: a.clone(),
            rhs: b.clone(),
        })
    }
}

fn bcast(a: &[usize], b: &[usize]) -> Result<Vec<usize>, InferenceError> {
    broadcast_shapes(a, b).ok_or_else(|| InferenceError::DoNotBroadcast {
        lhs: a.to_vec(),
        rhs: b.to_vec(),
    })
}

fn undefined(op: &Op, dtype: DType) -> InferenceError {
    InferenceError::Undefined {
        op: op.name(),
        dtype,
    }
}

fn infer_iota(declared: Option<&TensorType>, dim: usize) -> Result<TensorType, InferenceError> {
    let t = declared.ok_or(InferenceError::IotaNeedsDeclaredType)?;
    if dim >= t.rank() {
        return Err(InferenceError::IotaDim { dim, ty: t.clone() });
    }
    Ok(t.clone())
}

fn infer_unary(op: &Op, u: UnaryOp, a: &TensorType) -> Result<TensorType, InferenceError> {
    let ok = match u {
        UnaryOp::Not => matches!(a.dtype, DType::Pred | DType::I32),
        UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign | UnaryOp::Floor | UnaryOp::Ceil => {
            a.dtype != DType::Pred
        }
        _ => a.dtype.is_float(),
    };
    if !ok {
        return Err(undefined(op, a.dtype));
    }
    Ok(a.clone())
}

fn infer_binary(
    op: &Op,
    b: BinaryOp,
    x: &TensorType,
    y: &TensorType,
) -> Result<TensorType, InferenceError> {
    same_dtype(x, y)?;
    let ok = match b {
        BinaryOp::And | BinaryOp::Or => matches!(x.dtype, DType::Pred | DType::I32),
        BinaryOp::Max | BinaryOp::Min => true,
        _ => x.dtype != DType::Pred,
    };
    if !ok {
        return Err(undefined(op, x.dtype));
    }
    Ok(TensorType::new(x.dtype, bcast(&x.dims, &y.dims)?))
}

fn infer_select(
    p: &TensorType,
    t: &TensorType,
    f: &TensorType,
) -> Result<TensorType, InferenceError> {
    if p.dtype != DType::Pred {
        return Err(InferenceError::PredicateNotPred { ty: p.clone() });
    }
    same_dtype(t, f)?;
    let dims = bcast(&bcast(&p.dims, &t.dims)?, &f.dims)?;
    Ok(TensorType::new(t.dtype, dims))
}

fn infer_broadcast(
    a: &TensorType,
    shape: &[usize],
    dims: Option<&[usize]>,
) -> Result<TensorType, InferenceError> {
    let ok = match dims {
        None => broadcast_shapes(&a.dims, shape).as_deref() == Some(shape),
        Some(d) => {
            let mut seen = vec![false; shape.len()];
            d.len() == a.rank()
                && d.iter().zip(&a.dims).all(|(&o, &s)| {
                    o < shape.len()
                        && !std::mem::replace(&mut seen[o], true)
                        && (s == shape[o] || s == 1)
                })
        }
    };
    if !ok {
        return Err(InferenceError::BroadcastTo {
            from: a.clone(),
            to: shape.to_vec(),
            dims: dims.map(<[usize]>::to_vec),
        });
    }
    Ok(TensorType::new(a.dtype, shape.to_vec()))
}

fn infer_transpose(a: &TensorType, perm: &[usize]) -> Result<TensorType, InferenceError> {
    let mut seen = vec![false; a.rank()];
    if perm.len() != a.rank()
        || perm
            .iter()
            .any(|&p| p >= a.rank() || std::mem::replace(&mut seen[p], true))
    {
        return Err(InferenceError::NotAPermutation {
            perm: perm.to_vec(),
            ty: a.clone(),
        });
    }
    Ok(TensorType::new(
        a.dtype,
        perm.iter().map(|&p| a.dims[p]).collect::<Vec<_>>(),
    ))
}

fn infer_slice(
    a: &TensorType,
    start: &[usize],
    limit: &[usize],
    stride: &[usize],
) -> Result<TensorType, InferenceError> {
    let n = a.rank();
    if start.len() != n || limit.len() != n || stride.len() != n {
        return Err(InferenceError::SliceRank { rank: n });
    }
    let mut dims = Vec::with_capacity(n);
    for i in 0..n {
        if start[i] > limit[i] || limit[i] > a.dims[i] || stride[i] == 0 {
            return Err(InferenceError::SliceOutOfBounds {
                start: start[i],
                limit: limit[i],
                stride: stride[i],
                dim: i,
                ty: a.clone(),
            });
        }
        dims.push((limit[i] - start[i]).div_ceil(stride[i]));
    }
    Ok(TensorType::new(a.dtype, dims))
}

fn infer_concatenate(args: &[&TensorType], dim: usize) -> Result<TensorType, InferenceError> {
    let first = arg(args, 0)?;
    if dim >= first.rank() {
        return Err(InferenceError::ConcatenateDim {
            dim,
            ty: first.clone(),
        });
    }
    let mut dims = first.dims.clone();
    for a in &args[1..] {
        same_dtype(first, a)?;
        let compatible = a.rank() == first.rank()
            && (0..a.rank()).all(|i| i == dim || a.dims[i] == first.dims[i]);
        if !compatible {
            return Err(InferenceError::Concatenate {
                first: first.clone(),
                other: (*a).clone(),
                dim,
            });
        }
        dims[dim] = dims[dim].saturating_add(a.dims[dim]);
    }
    Ok(TensorType::new(first.dtype, dims))
}

fn infer_reduce(a: &TensorType, dims: &[usize]) -> Result<TensorType, InferenceError> {
    if a.dtype == DType::Pred {
        return Err(InferenceError::Undefined {
            op: "reduce",
            dtype: DType::Pred,
        });
    }
    let mut seen = vec![false; a.rank()];
    if dims
        .iter()
        .any(|&d| d >= a.rank() || std::mem::replace(&mut seen[d], true))
    {
        return Err(InferenceError::ReduceDims {
            dims: dims.to_vec(),
            ty: a.clone(),
        });
    }
    let out: Vec<usize> = (0..a.rank())
        .filter(|&d| !seen[d])
        .map(|d| a.dims[d])
        .collect();
    Ok(TensorType::new(a.dtype, out))
}

/// The two operands of a dot or convolution: one dtype, not pred.
fn numeric_pair<'a>(
    op: &Op,
    args: &[&'a TensorType],
) -> Result<(&'a TensorType, &'a TensorType), InferenceError> {
    let (x, y) = (arg(args, 0)?, arg(args, 1)?);
    same_dtype(x, y)?;
    if x.dtype == DType::Pred {
        return Err(undefined(op, DType::Pred));
    }
    Ok((x, y))
}

/// Infers types in topological order over a dense snapshot of the graph,
/// then writes the new or changed types in one batch.
pub fn run(world: &mut World, program: Entity) -> Result<PassOutcome, CompileError> {
    let g = GraphIndex::build(world, program);
    let order = g.topo_order().map_err(|cycle| CompileError::Shape {
        node: node_label(world, g.nodes[cycle[0] as usize]),
        message: "is on a cycle".into(),
    })?;
    if g.dangling > 0 {
        return Err(CompileError::Shape {
            node: program_name(world, program),
            message: format!(
                "{} operands are dangling references; run the verifier",
                g.dangling
            ),
        });
    }
    let mut types: Vec<Option<TensorType>> = vec![None; g.nodes.len()];
    let mut updates: Vec<(Entity, ValueType)> = Vec::new();
    for i in order {
        let i = i as usize;
        let e = g.nodes[i];
        let ty = {
            let node = world.get::<Node>(e).expect("verified node");
            let args: SmallVec<[&TensorType; 4]> = g.operands[i]
                .iter()
                .map(|&o| types[o as usize].as_ref().expect("operands come first"))
                .collect();
            let declared = world.get::<DeclaredType>(e).map(|d| &d.0);
            let literal = world.get::<Literal>(e).map(|l| l.0.tensor_type());
            infer_type(&node.op, &args, declared, literal).map_err(|source| {
                CompileError::Inference {
                    node: describe(world, e, &args),
                    source,
                }
            })?
        };
        if world.get::<ValueType>(e).map(|t| &t.0) != Some(&ty) {
            updates.push((e, ValueType(ty.clone())));
        }
        types[i] = Some(ty);
    }
    let changed = !updates.is_empty();
    world.insert_batch(updates);
    Ok(PassOutcome::changed(changed))
}

/// `%add.3 = add(f32[8], f32[4])`, for errors raised before the node has a type.
fn describe(world: &World, e: Entity, args: &[&TensorType]) -> String {
    let op = world.get::<Node>(e).map_or("?", |n| n.op.name());
    let args: Vec<String> = args.iter().map(|t| t.to_string()).collect();
    format!("{} = {op}({})", node_label(world, e), args.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiler::builder::GraphBuilder;

    #[test]
    fn infers_types_and_names_the_node_on_mismatch() {
        let mut world = World::new();
        let mut b = GraphBuilder::new(&mut world, "s");
        let x = b.parameter(TensorType::new(DType::F32, [8, 128]));
        let y = b.parameter(TensorType::new(DType::F32, [4]));
        let ok = b.reduce(x, crate::ir::ReduceKind::Sum, vec![1]);
        let bad = b.add(x, y);
        b.output(ok);
        b.output(bad);
        let p = b.finish();
        let err = run(&mut world, p).unwrap_err().to_string();
        assert_eq!(
            err,
            "node %add.3 = add(f32[8,128], f32[4]): operand shapes [8, 128] and [4] do not broadcast"
        );
        assert!(
            world.get::<ValueType>(ok).is_none(),
            "a failed run writes no types"
        );
        let t = TensorType::new(DType::F32, [8, 128]);
        let sum = Op::Reduce {
            kind: crate::ir::ReduceKind::Sum,
            dims: vec![1],
        };
        assert_eq!(
            infer_type(&sum, &[&t], None, None).unwrap().to_string(),
            "f32[8]"
        );
    }

    #[test]
    fn reshape_infers_minus_one() {
        let t = TensorType::new(DType::F32, [6, 4]);
        let r = infer_type(&Op::Reshape { shape: vec![-1, 8] }, &[&t], None, None).unwrap();
        assert_eq!(r.dims, vec![3, 8]);
        assert!(
            infer_type(
                &Op::Reshape {
                    shape: vec![-1, -1]
                },
                &[&t],
                None,
                None
            )
            .is_err()
        );
    }
}
