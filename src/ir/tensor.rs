//! [`Tensor`]: a dense, dynamically shaped array of one of the [`DType`]s.

use std::hash::{Hash, Hasher};

use ndarray::{ArrayD, IxDyn};

use super::types::{DType, TensorType};

/// A dense array value. Serializes as its dtype and ndarray's own form
/// (shape and elements in row-major order).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Tensor {
    /// Booleans.
    Pred(ArrayD<bool>),
    /// 32-bit integers.
    I32(ArrayD<i32>),
    /// Single-precision floats.
    F32(ArrayD<f32>),
    /// Double-precision floats.
    F64(ArrayD<f64>),
}

/// Applies `$body` to the array inside a tensor, whatever its dtype, and
/// wraps the result in the same variant.
macro_rules! map_tensor {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            Tensor::Pred($a) => Tensor::Pred($body),
            Tensor::I32($a) => Tensor::I32($body),
            Tensor::F32($a) => Tensor::F32($body),
            Tensor::F64($a) => Tensor::F64($body),
        }
    };
}
pub(crate) use map_tensor;

impl Tensor {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Tensor::Pred(_) => DType::Pred,
            Tensor::I32(_) => DType::I32,
            Tensor::F32(_) => DType::F32,
            Tensor::F64(_) => DType::F64,
        }
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        match self {
            Tensor::Pred(a) => a.shape(),
            Tensor::I32(a) => a.shape(),
            Tensor::F32(a) => a.shape(),
            Tensor::F64(a) => a.shape(),
        }
    }

    /// The tensor type (`f32[8,128]`).
    pub fn tensor_type(&self) -> TensorType {
        TensorType::new(self.dtype(), self.shape().to_vec())
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape().iter().product()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All zeros (false) of a type.
    pub fn zeros(ty: &TensorType) -> Tensor {
        let dim = IxDyn(&ty.dims);
        match ty.dtype {
            DType::Pred => Tensor::Pred(ArrayD::from_elem(dim, false)),
            DType::I32 => Tensor::I32(ArrayD::zeros(dim)),
            DType::F32 => Tensor::F32(ArrayD::zeros(dim)),
            DType::F64 => Tensor::F64(ArrayD::zeros(dim)),
        }
    }

    /// A tensor of `ty` from values in row-major order, converted from `f64`
    /// (integers truncate, pred is `value != 0`). A single value fills the
    /// whole tensor (a splat).
    pub fn from_f64s(ty: &TensorType, values: &[f64]) -> KernelResult<Tensor> {
        let n = ty.element_count();
        if values.len() != n && values.len() != 1 {
            return Err(KernelError::ValueCount {
                ty: ty.clone(),
                needed: n,
                got: values.len(),
            });
        }
        let at = |i: usize| {
            if values.len() == 1 {
                values[0]
            } else {
                values[i]
            }
        };
        let dim = IxDyn(&ty.dims);
        let build = |f: &dyn Fn(usize) -> f64| (0..n).map(f).collect::<Vec<_>>();
        let shape_err = KernelError::Shape;
        Ok(match ty.dtype {
            DType::Pred => Tensor::Pred(
                ArrayD::from_shape_vec(dim, (0..n).map(|i| at(i) != 0.0).collect())
                    .map_err(shape_err)?,
            ),
            DType::I32 => Tensor::I32(
                ArrayD::from_shape_vec(dim, build(&at).into_iter().map(|v| v as i32).collect())
                    .map_err(shape_err)?,
            ),
            DType::F32 => Tensor::F32(
                ArrayD::from_shape_vec(dim, build(&at).into_iter().map(|v| v as f32).collect())
                    .map_err(shape_err)?,
            ),
            DType::F64 => Tensor::F64(ArrayD::from_shape_vec(dim, build(&at)).map_err(shape_err)?),
        })
    }

    /// A rank-0 tensor.
    pub fn scalar(dtype: DType, value: f64) -> Tensor {
        match dtype {
            DType::Pred => Tensor::Pred(ArrayD::from_elem(IxDyn(&[]), value != 0.0)),
            DType::I32 => Tensor::I32(ArrayD::from_elem(IxDyn(&[]), value as i32)),
            DType::F32 => Tensor::F32(ArrayD::from_elem(IxDyn(&[]), value as f32)),
            DType::F64 => Tensor::F64(ArrayD::from_elem(IxDyn(&[]), value)),
        }
    }

    /// The elements in row-major order as `f64` (pred as 0/1).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match self {
            Tensor::Pred(a) => a.iter().map(|&v| f64::from(u8::from(v))).collect(),
            Tensor::I32(a) => a.iter().map(|&v| f64::from(v)).collect(),
            Tensor::F32(a) => a.iter().map(|&v| f64::from(v)).collect(),
            Tensor::F64(a) => a.iter().copied().collect(),
        }
    }

    /// Whether every element is `value` (compared as `f64`, bit-exactly for floats).
    pub fn is_all(&self, value: f64) -> bool {
        match self {
            Tensor::Pred(a) => a.iter().all(|&v| f64::from(u8::from(v)) == value),
            Tensor::I32(a) => a.iter().all(|&v| f64::from(v) == value),
            Tensor::F32(a) => a.iter().all(|&v| v.to_bits() == (value as f32).to_bits()),
            Tensor::F64(a) => a.iter().all(|&v| v.to_bits() == value.to_bits()),
        }
    }

    /// Bitwise equality: same type and the same bits in every element, so
    /// `NaN == NaN` and `-0.0 != 0.0`.
    pub fn bitwise_eq(&self, other: &Tensor) -> bool {
        if self.dtype() != other.dtype() || self.shape() != other.shape() {
            return false;
        }
        match (self, other) {
            (Tensor::Pred(a), Tensor::Pred(b)) => a == b,
            (Tensor::I32(a), Tensor::I32(b)) => a == b,
            (Tensor::F32(a), Tensor::F32(b)) => a
                .iter()
                .zip(b.iter())
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            (Tensor::F64(a), Tensor::F64(b)) => a
                .iter()
                .zip(b.iter())
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            _ => false,
        }
    }

    /// Feeds the type and element bits to `state` (consistent with [`Tensor::bitwise_eq`]).
    pub fn hash_bits<H: Hasher>(&self, state: &mut H) {
        self.dtype().hash(state);
        self.shape().hash(state);
        match self {
            Tensor::Pred(a) => a.iter().for_each(|v| v.hash(state)),
            Tensor::I32(a) => a.iter().for_each(|v| v.hash(state)),
            Tensor::F32(a) => a.iter().for_each(|v| v.to_bits().hash(state)),
            Tensor::F64(a) => a.iter().for_each(|v| v.to_bits().hash(state)),
        }
    }

    /// Elements `[lo, hi)` in row-major order, as a rank-1 tensor.
    pub fn flat_range(&self, lo: usize, hi: usize) -> Tensor {
        fn take<T: Clone>(a: &ArrayD<T>, lo: usize, hi: usize) -> ArrayD<T> {
            let data: Vec<T> = match a.as_slice() {
                Some(s) => s[lo..hi].to_vec(),
                None => a.iter().skip(lo).take(hi - lo).cloned().collect(),
            };
            ArrayD::from_shape_vec(IxDyn(&[hi - lo]), data).expect("length matches")
        }
        map_tensor!(self, a => take(a, lo, hi))
    }

    /// Writes `chunk` (same dtype) to elements `[lo, lo + chunk.len())` in
    /// row-major order. Returns `false` on a dtype mismatch.
    pub fn write_flat(&mut self, lo: usize, chunk: &Tensor) -> bool {
        fn put<T: Clone>(a: &mut ArrayD<T>, lo: usize, c: &ArrayD<T>) {
            match a.as_slice_mut() {
                Some(s) => s[lo..lo + c.len()]
                    .iter_mut()
                    .zip(c.iter())
                    .for_each(|(d, v)| *d = v.clone()),
                None => a
                    .iter_mut()
                    .skip(lo)
                    .zip(c.iter())
                    .for_each(|(d, v)| *d = v.clone()),
            }
        }
        match (self, chunk) {
            (Tensor::Pred(a), Tensor::Pred(c)) => put(a, lo, c),
            (Tensor::I32(a), Tensor::I32(c)) => put(a, lo, c),
            (Tensor::F32(a), Tensor::F32(c)) => put(a, lo, c),
            (Tensor::F64(a), Tensor::F64(c)) => put(a, lo, c),
            _ => return false,
        }
        true
    }

    /// Whether two tensors agree: exactly for pred and i32, within
    /// `rel_tol * max(1, |a|, |b|)` for floats (NaN matches NaN, infinities
    /// must be equal).
    pub fn approx_eq(&self, other: &Tensor, rel_tol: f64) -> bool {
        if self.dtype() != other.dtype() || self.shape() != other.shape() {
            return false;
        }
        if !self.dtype().is_float() {
            return self == other;
        }
        self.to_f64_vec()
            .iter()
            .zip(other.to_f64_vec())
            .all(|(&a, b)| {
                (a.is_nan() && b.is_nan())
                    || a == b
                    || (a - b).abs() <= rel_tol * 1f64.max(a.abs()).max(b.abs())
            })
    }
}

pub use super::kernel_error::KernelError;

/// Result of a kernel.
pub type KernelResult<T> = std::result::Result<T, KernelError>;
