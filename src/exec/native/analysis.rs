//! What can go native: the float each body value computes in, or why the
//! body is outside the native set.

use cranelift_codegen::ir::{Type, types};

use super::NativeRefusal;
use crate::compiler::executable::{Arg as InstrArg, LoweredKernel, Stage};
use crate::ir::{BinaryOp, DType, Op, TensorType, UnaryOp};

/// A float type a native body computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Float {
    F32,
    F64,
}

impl Float {
    pub(super) fn of(d: DType) -> Option<Float> {
        match d {
            DType::F32 => Some(Float::F32),
            DType::F64 => Some(Float::F64),
            _ => None,
        }
    }

    pub(super) fn scalar(self) -> Type {
        match self {
            Float::F32 => types::F32,
            Float::F64 => types::F64,
        }
    }

    /// The 128-bit vector of this float.
    pub(super) fn vector(self) -> Type {
        match self {
            Float::F32 => types::F32X4,
            Float::F64 => types::F64X2,
        }
    }

    pub(super) fn lanes(self) -> i64 {
        match self {
            Float::F32 => 4,
            Float::F64 => 2,
        }
    }

    /// log2 of the element size.
    pub(super) fn shift(self) -> i64 {
        match self {
            Float::F32 => 2,
            Float::F64 => 3,
        }
    }
}

/// A fused loop's body as the code generator sees it.
pub(super) struct Body {
    /// Elements per vector step: 4 when any value is `f32`, else 2; an
    /// `f64` value then spans two vectors ("parts").
    pub(super) lanes: i64,
    /// Per instruction: the float of its value, or of the operands it
    /// compared (for predicate masks).
    pub(super) floats: Vec<Option<Float>>,
}

impl Body {
    pub(super) fn parts(&self, f: Float) -> usize {
        (self.lanes / f.lanes()) as usize
    }
}

/// Checks that a fused loop's body is in the native set and types every
/// value, or says why it is not.
pub(super) fn analyze(
    kernel: &LoweredKernel,
    input_types: &[TensorType],
) -> Result<Body, NativeRefusal> {
    let mut floats: Vec<Option<Float>> = vec![None; kernel.instrs.len()];
    let mut any_f32 = false;
    // The float and kind (`true`: mask) of an operand.
    let operand =
        |floats: &[Option<Float>], a: &InstrArg| -> Result<(Float, bool), NativeRefusal> {
            let (d, f) = match *a {
                InstrArg::Input(i) => (input_types[i as usize].dtype, None),
                InstrArg::Local(l) => {
                    let src = &kernel.instrs[l as usize];
                    let f = (src.stage == Stage::Loop)
                        .then(|| floats[l as usize])
                        .flatten();
                    (src.ty.dtype, f)
                }
            };
            match (d, f) {
                (DType::Pred, Some(f)) => Ok((f, true)),
                _ => Float::of(d)
                    .map(|f| (f, false))
                    .ok_or(NativeRefusal::Values(d)),
            }
        };
    for (j, instr) in kernel.instrs.iter().enumerate() {
        if instr.stage != Stage::Loop {
            continue;
        }
        let args = instr
            .args
            .iter()
            .map(|a| operand(&floats, a))
            .collect::<Result<Vec<_>, _>>()?;
        let float = |k: usize| match args.get(k) {
            Some(&(f, false)) => Some(f),
            _ => None,
        };
        let mask = |k: usize| match args.get(k) {
            Some(&(f, true)) => Some(f),
            _ => None,
        };
        let same = |a: Option<Float>, b: Option<Float>| a.filter(|_| a == b);
        let result = match &instr.op {
            Op::Unary(UnaryOp::Not) => mask(0),
            Op::Unary(
                UnaryOp::Neg
                | UnaryOp::Abs
                | UnaryOp::Sqrt
                | UnaryOp::Rsqrt
                | UnaryOp::Floor
                | UnaryOp::Ceil
                | UnaryOp::Sign,
            ) => float(0),
            Op::Binary(BinaryOp::And | BinaryOp::Or) => same(mask(0), mask(1)),
            Op::Binary(
                BinaryOp::Add
                | BinaryOp::Sub
                | BinaryOp::Mul
                | BinaryOp::Div
                | BinaryOp::Max
                | BinaryOp::Min,
            )
            | Op::Compare(_) => same(float(0), float(1)),
            Op::Select => same(mask(0), same(float(1), float(2))),
            Op::Convert(d) => float(0).and(Float::of(*d)),
            op => return Err(NativeRefusal::NoNativeForm(op.clone())),
        };
        let result = result.ok_or_else(|| NativeRefusal::OperandTypes(instr.op.clone()))?;
        let is_mask = matches!(
            instr.op,
            Op::Compare(_) | Op::Unary(UnaryOp::Not) | Op::Binary(BinaryOp::And | BinaryOp::Or)
        );
        if !is_mask && Float::of(instr.ty.dtype) != Some(result) {
            return Err(NativeRefusal::Gives {
                op: instr.op.clone(),
                dtype: instr.ty.dtype,
            });
        }
        any_f32 |= result == Float::F32 || args.iter().any(|&(f, _)| f == Float::F32);
        floats[j] = Some(result);
    }
    for &(i, _) in &kernel.outputs {
        let instr = &kernel.instrs[i as usize];
        if instr.stage == Stage::Loop && instr.ty.dtype == DType::Pred {
            return Err(NativeRefusal::PredOutput);
        }
    }
    Ok(Body {
        lanes: if any_f32 { 4 } else { 2 },
        floats,
    })
}
