//! The kernels every evaluator shares: constant folding, the reference
//! interpreter and lowered executables call the same functions, so a folded
//! constant is bit-identical to what the executable would have computed.
//!
//! [`evaluate`] dispatches one [`Op`] over whole tensors; the per-family
//! functions (elementwise, structural, reductions, contractions) are public so
//! an executor can call them on chunks.

pub mod contraction;
pub mod elementwise;
pub mod reduce;
pub mod scalar;
pub mod structural;
pub use crate::ir::tensor;
pub use crate::ir::{KernelError, KernelResult, Tensor};

use crate::ir::{Op, TensorType};

/// Custom-call targets the built-in evaluators know: `identity` returns its
/// first operand.
pub const BUILTIN_CUSTOM_CALLS: &[&str] = &["identity"];

/// Resolves a reshape target with at most one `-1` against `count` elements.
pub fn resolve_reshape(count: usize, shape: &[i64]) -> KernelResult<Vec<usize>> {
    let mut unknown = None;
    let mut known: usize = 1;
    for (i, &d) in shape.iter().enumerate() {
        match d {
            -1 if unknown.is_none() => unknown = Some(i),
            -1 => {
                return Err(KernelError::ReshapeUnknowns {
                    shape: shape.to_vec(),
                });
            }
            d if d < 0 => return Err(KernelError::ReshapeNegative { dim: d }),
            d => known = known.saturating_mul(d as usize),
        }
    }
    let mut dims: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
    if let Some(i) = unknown {
        if known == 0 || !count.is_multiple_of(known) {
            return Err(KernelError::ReshapeCannotInfer {
                shape: shape.to_vec(),
                count,
            });
        }
        dims[i] = count / known;
    } else if known != count {
        return Err(KernelError::ReshapeCount {
            shape: shape.to_vec(),
            known,
            count,
        });
    }
    Ok(dims)
}

/// Evaluates `op` on `operands`. `declared` is the node's declared type,
/// needed by iota and custom calls. Parameters and constants are not
/// computations and are rejected.
pub fn evaluate(
    op: &Op,
    operands: &[&Tensor],
    declared: Option<&TensorType>,
) -> KernelResult<Tensor> {
    let arg = |i: usize| {
        operands
            .get(i)
            .copied()
            .ok_or_else(|| KernelError::MissingOperand {
                op: op.to_string(),
                index: i,
            })
    };
    match op {
        Op::Unary(u) => elementwise::unary(*u, arg(0)?),
        Op::Binary(b) => elementwise::binary(*b, arg(0)?, arg(1)?),
        Op::Compare(c) => elementwise::compare(*c, arg(0)?, arg(1)?),
        Op::Select => elementwise::select(arg(0)?, arg(1)?, arg(2)?),
        Op::Convert(to) => Ok(elementwise::convert(arg(0)?, *to)),
        Op::Broadcast { shape, dims } => structural::broadcast(arg(0)?, shape, dims.as_deref()),
        Op::Reshape { shape } => {
            let x = arg(0)?;
            let dims = resolve_reshape(x.len(), shape)?;
            structural::reshape(x, &dims)
        }
        Op::Transpose { perm } => structural::transpose(arg(0)?, perm),
        Op::Slice {
            start,
            limit,
            stride,
        } => structural::slice(arg(0)?, start, limit, stride),
        Op::Concatenate { dim } => structural::concatenate(operands, *dim),
        Op::Reduce { kind, dims } => reduce::reduce(arg(0)?, *kind, dims),
        Op::Dot(dims) => contraction::dot_general(arg(0)?, arg(1)?, dims),
        Op::Convolution(attrs) => contraction::convolution(arg(0)?, arg(1)?, attrs),
        Op::Iota { dim } => {
            let ty = declared.ok_or(KernelError::IotaNeedsType)?;
            structural::iota(ty, *dim)
        }
        Op::CustomCall { target } if target == "identity" => Ok(arg(0)?.clone()),
        Op::CustomCall { target } => Err(KernelError::UnknownCustomCall {
            target: target.clone(),
            known: BUILTIN_CUSTOM_CALLS,
        }),
        Op::Parameter { .. } | Op::Constant => {
            Err(KernelError::NotAComputation { op: op.to_string() })
        }
    }
}
