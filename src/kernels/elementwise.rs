//! Elementwise kernels: unary, binary, compare, select, convert. Operands are
//! broadcast by numpy rules.

use ndarray::{ArrayD, IxDyn, Zip};

use super::tensor::Tensor;
use super::{KernelError, KernelResult};
use crate::ir::{BinaryOp, CompareDir, DType, FloatElement, UnaryOp};

/// The numpy broadcast of two shapes (trailing dimensions aligned, 1 stretches).
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i < rank - a.len() {
            1
        } else {
            a[i - (rank - a.len())]
        };
        let db = if i < rank - b.len() {
            1
        } else {
            b[i - (rank - b.len())]
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

fn zip2<A: Copy, B: Copy, C>(
    a: &ArrayD<A>,
    b: &ArrayD<B>,
    f: impl Fn(A, B) -> C,
) -> KernelResult<ArrayD<C>> {
    if a.shape() == b.shape() {
        return Ok(Zip::from(a).and(b).map_collect(|&x, &y| f(x, y)));
    }
    let shape = broadcast_shapes(a.shape(), b.shape()).ok_or_else(|| {
        KernelError::ShapesDoNotBroadcast {
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
        }
    })?;
    let av = a
        .broadcast(IxDyn(&shape))
        .ok_or(KernelError::BroadcastView)?;
    let bv = b
        .broadcast(IxDyn(&shape))
        .ok_or(KernelError::BroadcastView)?;
    Ok(Zip::from(&av).and(&bv).map_collect(|&x, &y| f(x, y)))
}

macro_rules! float_unary {
    ($t:ty, $op:expr) => {{
        let f: fn($t) -> $t = match $op {
            UnaryOp::Neg => |x| -x,
            UnaryOp::Abs => |x| x.abs(),
            UnaryOp::Exp => |x| x.exp(),
            UnaryOp::Log => |x| x.ln(),
            UnaryOp::Sqrt => |x| x.sqrt(),
            UnaryOp::Rsqrt => |x| x.rsqrt(),
            UnaryOp::Tanh => |x| x.tanh(),
            UnaryOp::Logistic => |x| 1.0 / (1.0 + (-x).exp()),
            UnaryOp::Sin => |x| x.sin(),
            UnaryOp::Cos => |x| x.cos(),
            UnaryOp::Floor => |x| x.floor(),
            UnaryOp::Ceil => |x| x.ceil(),
            UnaryOp::Sign => |x| {
                if x == 0.0 || x.is_nan() {
                    x
                } else {
                    x.signum()
                }
            },
            UnaryOp::Not => return Err(KernelError::NotOnFloat),
        };
        f
    }};
}

/// `op` on one `f32`.
pub(crate) fn f32_unary(op: UnaryOp) -> KernelResult<fn(f32) -> f32> {
    Ok(float_unary!(f32, op))
}

/// `op` on one `f64`.
pub(crate) fn f64_unary(op: UnaryOp) -> KernelResult<fn(f64) -> f64> {
    Ok(float_unary!(f64, op))
}

/// `op` on one `i32` (XLA's wrapping semantics).
pub(crate) fn i32_unary(op: UnaryOp) -> KernelResult<fn(i32) -> i32> {
    Ok(match op {
        UnaryOp::Neg => |x: i32| x.wrapping_neg(),
        UnaryOp::Abs => |x: i32| x.wrapping_abs(),
        UnaryOp::Sign => |x: i32| x.signum(),
        UnaryOp::Not => |x: i32| !x,
        UnaryOp::Floor | UnaryOp::Ceil => |x| x,
        _ => {
            return Err(KernelError::Undefined {
                op: format!("{op:?}"),
                dtype: DType::I32,
            });
        }
    })
}

/// `op` on one predicate.
pub(crate) fn pred_unary(op: UnaryOp) -> KernelResult<fn(bool) -> bool> {
    match op {
        UnaryOp::Not => Ok(|x: bool| !x),
        _ => Err(KernelError::Undefined {
            op: format!("{op:?}"),
            dtype: DType::Pred,
        }),
    }
}

/// `op(x)` elementwise.
pub fn unary(op: UnaryOp, x: &Tensor) -> KernelResult<Tensor> {
    Ok(match x {
        Tensor::F32(a) => Tensor::F32(a.mapv(f32_unary(op)?)),
        Tensor::F64(a) => Tensor::F64(a.mapv(f64_unary(op)?)),
        Tensor::I32(a) => Tensor::I32(a.mapv(i32_unary(op)?)),
        Tensor::Pred(a) => Tensor::Pred(a.mapv(pred_unary(op)?)),
    })
}

/// XLA's float `max`: NaN wins (a NaN `b` first, then a NaN `a`), and on a
/// tie `a` (so `max(-0, +0)` is `-0`). The one definition the kernels, the
/// chunk interpreter and (rebuilt from compares) the native loops follow.
#[allow(clippy::eq_op, reason = "x != x detects NaN for any float type")]
#[inline(always)]
pub(crate) fn float_max<T: PartialOrd + Copy>(a: T, b: T) -> T {
    if b != b || !(a != a || a >= b) { b } else { a }
}

/// XLA's float `min`, with [`float_max`]'s NaN and tie rules.
#[allow(clippy::eq_op, reason = "x != x detects NaN for any float type")]
#[inline(always)]
pub(crate) fn float_min<T: PartialOrd + Copy>(a: T, b: T) -> T {
    if b != b || !(a != a || a <= b) { b } else { a }
}

macro_rules! float_binary {
    ($t:ty, $op:expr) => {{
        let f: fn($t, $t) -> $t = match $op {
            BinaryOp::Add => |a, b| a + b,
            BinaryOp::Sub => |a, b| a - b,
            BinaryOp::Mul => |a, b| a * b,
            BinaryOp::Div => |a, b| a / b,
            BinaryOp::Rem => |a, b| a % b,
            BinaryOp::Max => float_max,
            BinaryOp::Min => float_min,
            BinaryOp::Pow => |a, b| a.powf(b),
            BinaryOp::And | BinaryOp::Or => {
                return Err(KernelError::AndOrOnFloat);
            }
        };
        f
    }};
}

/// XLA's integer power: a negative exponent gives 0 except for bases ±1;
/// overflow wraps.
pub(crate) fn int_pow(base: i32, exp: i32) -> i32 {
    if exp < 0 {
        return match base {
            1 => 1,
            -1 if exp % 2 == 0 => 1,
            -1 => -1,
            _ => 0,
        };
    }
    base.wrapping_pow(exp as u32)
}

/// `op` on two `f32`s.
pub(crate) fn f32_binary(op: BinaryOp) -> KernelResult<fn(f32, f32) -> f32> {
    Ok(float_binary!(f32, op))
}

/// `op` on two `f64`s.
pub(crate) fn f64_binary(op: BinaryOp) -> KernelResult<fn(f64, f64) -> f64> {
    Ok(float_binary!(f64, op))
}

/// `op` on two `i32`s (XLA's wrapping and division-by-zero rules).
pub(crate) fn i32_binary(op: BinaryOp) -> KernelResult<fn(i32, i32) -> i32> {
    Ok(match op {
        BinaryOp::Add => |a: i32, b: i32| a.wrapping_add(b),
        BinaryOp::Sub => |a: i32, b: i32| a.wrapping_sub(b),
        BinaryOp::Mul => |a: i32, b: i32| a.wrapping_mul(b),
        BinaryOp::Div => |a: i32, b: i32| if b == 0 { -1 } else { a.wrapping_div(b) },
        BinaryOp::Rem => |a: i32, b: i32| if b == 0 { a } else { a.wrapping_rem(b) },
        BinaryOp::Max => |a: i32, b: i32| a.max(b),
        BinaryOp::Min => |a: i32, b: i32| a.min(b),
        BinaryOp::Pow => int_pow,
        BinaryOp::And => |a: i32, b: i32| a & b,
        BinaryOp::Or => |a: i32, b: i32| a | b,
    })
}

/// `op` on two predicates.
pub(crate) fn pred_binary(op: BinaryOp) -> KernelResult<fn(bool, bool) -> bool> {
    Ok(match op {
        BinaryOp::And | BinaryOp::Min => |a: bool, b: bool| a & b,
        BinaryOp::Or | BinaryOp::Max => |a: bool, b: bool| a | b,
        _ => {
            return Err(KernelError::Undefined {
                op: format!("{op:?}"),
                dtype: DType::Pred,
            });
        }
    })
}

/// `a op b` elementwise with numpy broadcasting; both operands have the same dtype.
pub fn binary(op: BinaryOp, a: &Tensor, b: &Tensor) -> KernelResult<Tensor> {
    Ok(match (a, b) {
        (Tensor::F32(x), Tensor::F32(y)) => Tensor::F32(zip2(x, y, f32_binary(op)?)?),
        (Tensor::F64(x), Tensor::F64(y)) => Tensor::F64(zip2(x, y, f64_binary(op)?)?),
        (Tensor::I32(x), Tensor::I32(y)) => Tensor::I32(zip2(x, y, i32_binary(op)?)?),
        (Tensor::Pred(x), Tensor::Pred(y)) => Tensor::Pred(zip2(x, y, pred_binary(op)?)?),
        _ => return Err(operand_dtypes_differ(a.dtype(), b.dtype())),
    })
}

pub(crate) fn operand_dtypes_differ(a: DType, b: DType) -> KernelError {
    KernelError::DTypesDiffer { lhs: a, rhs: b }
}

pub(crate) fn compare_fn<T: PartialOrd>(dir: CompareDir) -> fn(T, T) -> bool {
    match dir {
        CompareDir::Eq => |a, b| a == b,
        CompareDir::Ne => |a, b| a != b,
        CompareDir::Lt => |a, b| a < b,
        CompareDir::Le => |a, b| a <= b,
        CompareDir::Gt => |a, b| a > b,
        CompareDir::Ge => |a, b| a >= b,
    }
}

/// `a dir b` elementwise, giving pred.
pub fn compare(dir: CompareDir, a: &Tensor, b: &Tensor) -> KernelResult<Tensor> {
    Ok(Tensor::Pred(match (a, b) {
        (Tensor::F32(x), Tensor::F32(y)) => zip2(x, y, compare_fn(dir))?,
        (Tensor::F64(x), Tensor::F64(y)) => zip2(x, y, compare_fn(dir))?,
        (Tensor::I32(x), Tensor::I32(y)) => zip2(x, y, compare_fn(dir))?,
        (Tensor::Pred(x), Tensor::Pred(y)) => zip2(x, y, compare_fn(dir))?,
        _ => {
            return Err(KernelError::MixedDTypes {
                operands: "compare operands",
                numeric: false,
            });
        }
    }))
}

fn select_arrays<T: Copy>(
    p: &ArrayD<bool>,
    t: &ArrayD<T>,
    f: &ArrayD<T>,
) -> KernelResult<ArrayD<T>> {
    let shape = broadcast_shapes(p.shape(), t.shape())
        .and_then(|s| broadcast_shapes(&s, f.shape()))
        .ok_or(KernelError::SelectDoesNotBroadcast)?;
    let dim = IxDyn(&shape);
    let bad = || KernelError::SelectDoesNotBroadcast;
    let (pv, tv, fv) = (
        p.broadcast(dim.clone()).ok_or_else(bad)?,
        t.broadcast(dim.clone()).ok_or_else(bad)?,
        f.broadcast(dim).ok_or_else(bad)?,
    );
    Ok(Zip::from(&pv)
        .and(&tv)
        .and(&fv)
        .map_collect(|&c, &x, &y| if c { x } else { y }))
}

/// `pred ? on_true : on_false` elementwise with numpy broadcasting.
pub fn select(pred: &Tensor, on_true: &Tensor, on_false: &Tensor) -> KernelResult<Tensor> {
    let Tensor::Pred(p) = pred else {
        return Err(KernelError::PredicateNotPred);
    };
    Ok(match (on_true, on_false) {
        (Tensor::F32(t), Tensor::F32(f)) => Tensor::F32(select_arrays(p, t, f)?),
        (Tensor::F64(t), Tensor::F64(f)) => Tensor::F64(select_arrays(p, t, f)?),
        (Tensor::I32(t), Tensor::I32(f)) => Tensor::I32(select_arrays(p, t, f)?),
        (Tensor::Pred(t), Tensor::Pred(f)) => Tensor::Pred(select_arrays(p, t, f)?),
        _ => {
            return Err(KernelError::MixedDTypes {
                operands: "select branches",
                numeric: false,
            });
        }
    })
}

/// Elementwise conversion: float→int truncates and saturates (NaN→0),
/// pred↔number is 0/1 and `!= 0`.
pub fn convert(x: &Tensor, to: DType) -> Tensor {
    match (x, to) {
        (t, d) if t.dtype() == d => t.clone(),
        (Tensor::Pred(a), DType::I32) => Tensor::I32(a.mapv(Cast::cast)),
        (Tensor::Pred(a), DType::F32) => Tensor::F32(a.mapv(Cast::cast)),
        (Tensor::Pred(a), DType::F64) => Tensor::F64(a.mapv(Cast::cast)),
        (Tensor::I32(a), DType::Pred) => Tensor::Pred(a.mapv(Cast::cast)),
        (Tensor::I32(a), DType::F32) => Tensor::F32(a.mapv(Cast::cast)),
        (Tensor::I32(a), DType::F64) => Tensor::F64(a.mapv(Cast::cast)),
        (Tensor::F32(a), DType::Pred) => Tensor::Pred(a.mapv(Cast::cast)),
        (Tensor::F32(a), DType::I32) => Tensor::I32(a.mapv(Cast::cast)),
        (Tensor::F32(a), DType::F64) => Tensor::F64(a.mapv(Cast::cast)),
        (Tensor::F64(a), DType::Pred) => Tensor::Pred(a.mapv(Cast::cast)),
        (Tensor::F64(a), DType::I32) => Tensor::I32(a.mapv(Cast::cast)),
        (Tensor::F64(a), DType::F32) => Tensor::F32(a.mapv(Cast::cast)),
        (t, _) => t.clone(),
    }
}

/// One element's conversion, as [`convert`] defines it.
pub(crate) trait Cast<T> {
    fn cast(self) -> T;
}

macro_rules! cast {
    ($from:ty => $to:ty, $f:expr) => {
        impl Cast<$to> for $from {
            #[inline(always)]
            fn cast(self) -> $to {
                let f: fn($from) -> $to = $f;
                f(self)
            }
        }
    };
}

cast!(bool => bool, |v| v);
cast!(i32 => i32, |v| v);
cast!(f32 => f32, |v| v);
cast!(f64 => f64, |v| v);
cast!(bool => i32, i32::from);
cast!(bool => f32, |v| f32::from(u8::from(v)));
cast!(bool => f64, |v| f64::from(u8::from(v)));
cast!(i32 => bool, |v| v != 0);
cast!(i32 => f32, |v| v as f32);
cast!(i32 => f64, f64::from);
cast!(f32 => bool, |v| v != 0.0);
cast!(f32 => i32, |v| v as i32);
cast!(f32 => f64, f64::from);
cast!(f64 => bool, |v| v != 0.0);
cast!(f64 => i32, |v| v as i32);
cast!(f64 => f32, |v| v as f32);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::TensorType;

    fn f32s(dims: &[usize], v: &[f64]) -> Tensor {
        Tensor::from_f64s(&TensorType::new(DType::F32, dims.to_vec()), v).unwrap()
    }

    #[test]
    fn binary_broadcasts_by_numpy_rules() {
        let a = f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
        let b = f32s(&[3], &[10., 20., 30.]);
        let c = binary(BinaryOp::Add, &a, &b).unwrap();
        assert_eq!(c.to_f64_vec(), vec![11., 22., 33., 14., 25., 36.]);
        assert!(binary(BinaryOp::Add, &a, &f32s(&[2], &[1., 2.])).is_err());
    }

    #[test]
    fn integer_edge_cases_follow_xla() {
        let t = |v: &[f64]| Tensor::from_f64s(&TensorType::new(DType::I32, [v.len()]), v).unwrap();
        let q = binary(BinaryOp::Div, &t(&[7., 7.]), &t(&[0., 2.])).unwrap();
        assert_eq!(q.to_f64_vec(), vec![-1., 3.]);
        let p = binary(BinaryOp::Pow, &t(&[2., -1., 3.]), &t(&[-1., -3., 2.])).unwrap();
        assert_eq!(p.to_f64_vec(), vec![0., -1., 9.]);
    }

    #[test]
    fn max_propagates_nan() {
        let a = f32s(&[2], &[f64::NAN, 1.]);
        let b = f32s(&[2], &[1., f64::NAN]);
        let m = binary(BinaryOp::Max, &a, &b).unwrap().to_f64_vec();
        assert!(m[0].is_nan() && m[1].is_nan());
    }
}
