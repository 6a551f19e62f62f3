//! Elementwise ops on rank-0 values, without allocating: a fused loop's
//! prelude (Adam's bias corrections, a learning-rate product) runs every
//! step, and building a one-element array per op costs more than a small
//! step's whole loop. Every op goes through the same per-element functions
//! as the whole-tensor kernels ([`super::elementwise`]), so a scalar result
//! is bit-identical to [`super::evaluate`] on rank-0 tensors.

use super::elementwise::{
    Cast, compare_fn, f32_binary, f32_unary, f64_binary, f64_unary, i32_binary, i32_unary,
    operand_dtypes_differ, pred_binary, pred_unary,
};
use super::{KernelError, KernelResult, Tensor};
use crate::ir::{DType, Op};

/// One value of a rank-0 tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// A predicate.
    Pred(bool),
    /// A 32-bit integer.
    I32(i32),
    /// A single-precision float.
    F32(f32),
    /// A double-precision float.
    F64(f64),
}

impl Scalar {
    /// The element of a one-element tensor (`None` for any other).
    pub fn of(t: &Tensor) -> Option<Scalar> {
        if t.len() != 1 {
            return None;
        }
        Some(match t {
            Tensor::Pred(a) => Scalar::Pred(*a.iter().next()?),
            Tensor::I32(a) => Scalar::I32(*a.iter().next()?),
            Tensor::F32(a) => Scalar::F32(*a.iter().next()?),
            Tensor::F64(a) => Scalar::F64(*a.iter().next()?),
        })
    }

    /// Reads a value of `dtype` at `ptr`.
    ///
    /// # Safety
    /// `ptr` must point to a live, aligned element of `dtype`.
    pub(crate) unsafe fn read(dtype: DType, ptr: usize) -> Scalar {
        // SAFETY: the caller's contract.
        unsafe {
            match dtype {
                DType::Pred => Scalar::Pred(*(ptr as *const bool)),
                DType::I32 => Scalar::I32(*(ptr as *const i32)),
                DType::F32 => Scalar::F32(*(ptr as *const f32)),
                DType::F64 => Scalar::F64(*(ptr as *const f64)),
            }
        }
    }

    /// The dtype.
    pub fn dtype(self) -> DType {
        match self {
            Scalar::Pred(_) => DType::Pred,
            Scalar::I32(_) => DType::I32,
            Scalar::F32(_) => DType::F32,
            Scalar::F64(_) => DType::F64,
        }
    }

    /// The value as a rank-0 tensor.
    pub fn to_tensor(self) -> Tensor {
        use ndarray::{ArrayD, IxDyn};
        let d = IxDyn(&[]);
        match self {
            Scalar::Pred(v) => Tensor::Pred(ArrayD::from_elem(d, v)),
            Scalar::I32(v) => Tensor::I32(ArrayD::from_elem(d, v)),
            Scalar::F32(v) => Tensor::F32(ArrayD::from_elem(d, v)),
            Scalar::F64(v) => Tensor::F64(ArrayD::from_elem(d, v)),
        }
    }

    /// The value in eight bytes, laid out as one element of its dtype at
    /// the start (what a loop reading a scalar operand by address expects).
    pub(crate) fn to_cell(self) -> ScalarCell {
        let mut cell = ScalarCell([0; 8]);
        match self {
            Scalar::Pred(v) => cell.0[0] = u8::from(v),
            Scalar::I32(v) => cell.0[..4].copy_from_slice(&v.to_ne_bytes()),
            Scalar::F32(v) => cell.0[..4].copy_from_slice(&v.to_ne_bytes()),
            Scalar::F64(v) => cell.0.copy_from_slice(&v.to_ne_bytes()),
        }
        cell
    }
}

/// Eight bytes aligned for any element type.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(8))]
pub(crate) struct ScalarCell(pub(crate) [u8; 8]);

/// Whether [`evaluate`] computes `op`: the elementwise ops.
pub fn is_scalar_op(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Convert(_)
    )
}

/// `op` on rank-0 operands, as [`super::evaluate`] computes it on rank-0
/// tensors.
pub fn evaluate(op: &Op, args: &[Scalar]) -> KernelResult<Scalar> {
    let arg = |i: usize| {
        args.get(i)
            .copied()
            .ok_or_else(|| KernelError::MissingOperand {
                op: op.to_string(),
                index: i,
            })
    };
    Ok(match op {
        Op::Unary(u) => match arg(0)? {
            Scalar::F32(x) => Scalar::F32(f32_unary(*u)?(x)),
            Scalar::F64(x) => Scalar::F64(f64_unary(*u)?(x)),
            Scalar::I32(x) => Scalar::I32(i32_unary(*u)?(x)),
            Scalar::Pred(x) => Scalar::Pred(pred_unary(*u)?(x)),
        },
        Op::Binary(b) => match (arg(0)?, arg(1)?) {
            (Scalar::F32(x), Scalar::F32(y)) => Scalar::F32(f32_binary(*b)?(x, y)),
            (Scalar::F64(x), Scalar::F64(y)) => Scalar::F64(f64_binary(*b)?(x, y)),
            (Scalar::I32(x), Scalar::I32(y)) => Scalar::I32(i32_binary(*b)?(x, y)),
            (Scalar::Pred(x), Scalar::Pred(y)) => Scalar::Pred(pred_binary(*b)?(x, y)),
            (x, y) => return Err(operand_dtypes_differ(x.dtype(), y.dtype())),
        },
        Op::Compare(dir) => Scalar::Pred(match (arg(0)?, arg(1)?) {
            (Scalar::F32(x), Scalar::F32(y)) => compare_fn(*dir)(x, y),
            (Scalar::F64(x), Scalar::F64(y)) => compare_fn(*dir)(x, y),
            (Scalar::I32(x), Scalar::I32(y)) => compare_fn(*dir)(x, y),
            (Scalar::Pred(x), Scalar::Pred(y)) => compare_fn(*dir)(x, y),
            _ => {
                return Err(KernelError::MixedDTypes {
                    operands: "compare operands",
                    numeric: false,
                });
            }
        }),
        Op::Select => {
            let Scalar::Pred(p) = arg(0)? else {
                return Err(KernelError::PredicateNotPred);
            };
            let (t, f) = (arg(1)?, arg(2)?);
            if t.dtype() != f.dtype() {
                return Err(KernelError::MixedDTypes {
                    operands: "select branches",
                    numeric: false,
                });
            }
            if p { t } else { f }
        }
        Op::Convert(to) => convert(arg(0)?, *to),
        _ => {
            return Err(KernelError::NotScalar { op: op.to_string() });
        }
    })
}

fn convert(x: Scalar, to: DType) -> Scalar {
    macro_rules! to {
        ($v:expr) => {
            match to {
                DType::Pred => Scalar::Pred(Cast::cast($v)),
                DType::I32 => Scalar::I32(Cast::cast($v)),
                DType::F32 => Scalar::F32(Cast::cast($v)),
                DType::F64 => Scalar::F64(Cast::cast($v)),
            }
        };
    }
    if x.dtype() == to {
        return x;
    }
    match x {
        Scalar::Pred(v) => to!(v),
        Scalar::I32(v) => to!(v),
        Scalar::F32(v) => to!(v),
        Scalar::F64(v) => to!(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, CompareDir, UnaryOp};
    use proptest::prelude::*;

    fn any_scalar() -> impl Strategy<Value = Scalar> {
        prop_oneof![
            any::<bool>().prop_map(Scalar::Pred),
            any::<i32>().prop_map(Scalar::I32),
            prop_oneof![
                any::<f32>(),
                Just(0.0f32),
                Just(-0.0),
                Just(f32::NAN),
                Just(f32::INFINITY),
                -4.0f32..4.0
            ]
            .prop_map(Scalar::F32),
            prop_oneof![any::<f64>(), Just(-0.0f64), Just(f64::NAN), -4.0f64..4.0]
                .prop_map(Scalar::F64),
        ]
    }

    fn any_op() -> impl Strategy<Value = Op> {
        let unary = [
            UnaryOp::Neg,
            UnaryOp::Abs,
            UnaryOp::Exp,
            UnaryOp::Log,
            UnaryOp::Sqrt,
            UnaryOp::Rsqrt,
            UnaryOp::Tanh,
            UnaryOp::Logistic,
            UnaryOp::Sin,
            UnaryOp::Cos,
            UnaryOp::Floor,
            UnaryOp::Ceil,
            UnaryOp::Sign,
            UnaryOp::Not,
        ];
        let binary = [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Rem,
            BinaryOp::Max,
            BinaryOp::Min,
            BinaryOp::Pow,
            BinaryOp::And,
            BinaryOp::Or,
        ];
        let dirs = [
            CompareDir::Eq,
            CompareDir::Ne,
            CompareDir::Lt,
            CompareDir::Le,
            CompareDir::Gt,
            CompareDir::Ge,
        ];
        let dtypes = [DType::Pred, DType::I32, DType::F32, DType::F64];
        prop_oneof![
            proptest::sample::select(unary.to_vec()).prop_map(Op::Unary),
            proptest::sample::select(binary.to_vec()).prop_map(Op::Binary),
            proptest::sample::select(dirs.to_vec()).prop_map(Op::Compare),
            Just(Op::Select),
            proptest::sample::select(dtypes.to_vec()).prop_map(Op::Convert),
        ]
    }

    fn same_bits(a: Scalar, b: Scalar) -> bool {
        match (a, b) {
            (Scalar::F32(x), Scalar::F32(y)) => x.to_bits() == y.to_bits(),
            (Scalar::F64(x), Scalar::F64(y)) => x.to_bits() == y.to_bits(),
            (x, y) => x == y,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]
        /// Bit for bit the whole-tensor kernels on rank-0 tensors, and the
        /// same ops refused.
        #[test]
        fn scalar_ops_equal_the_tensor_kernels(
            op in any_op(),
            x in any_scalar(),
            y in any_scalar(),
            z in any_scalar(),
            same in any::<bool>(),
        ) {
            // Mostly operands of one dtype, as programs have them.
            let (y, z) = if same {
                (convert(y, x.dtype()), convert(z, x.dtype()))
            } else {
                (y, z)
            };
            let args = [x, y, z];
            let tensors: Vec<Tensor> = args.iter().map(|s| s.to_tensor()).collect();
            let refs: Vec<&Tensor> = tensors.iter().collect();
            let want = crate::kernels::evaluate(&op, &refs, None);
            let got = evaluate(&op, &args);
            match (want, got) {
                (Ok(w), Ok(g)) => {
                    let w = Scalar::of(&w).expect("a rank-0 result");
                    prop_assert!(same_bits(w, g), "{op}: {w:?} vs {g:?}");
                }
                (Err(_), Err(_)) => {}
                (w, g) => prop_assert!(false, "{op}: {w:?} vs {g:?}"),
            }
        }
    }

    #[test]
    fn a_cell_holds_the_element_at_its_start() {
        let c = Scalar::F32(1.5).to_cell();
        assert_eq!(f32::from_ne_bytes(c.0[..4].try_into().unwrap()), 1.5);
        let c = Scalar::F64(-2.25).to_cell();
        assert_eq!(f64::from_ne_bytes(c.0), -2.25);
        assert_eq!(Scalar::Pred(true).to_cell().0[0], 1);
        // SAFETY: the cell holds an aligned i32 at its start.
        let back =
            unsafe { Scalar::read(DType::I32, Scalar::I32(-7).to_cell().0.as_ptr() as usize) };
        assert_eq!(back, Scalar::I32(-7));
    }
}
