//! The element types, as one trait family: [`Element`] (what a tensor can
//! hold: `f32`, `f64`, `i32`, `bool`, and its [`DType`]), [`ReduceElement`]
//! (what collectives can reduce: `f32`, `f64`, `i32`) and [`FloatElement`]
//! (what the optimizers run on: `f32`, `f64`, with the roundings optax's
//! numbers depend on). The executor, the collectives and the optimizers
//! all bound their generics by this family.

use ndarray::ArrayD;

use super::tensor::Tensor;
use super::types::DType;

/// Element types a tensor can hold (`f32`, `f64`, `i32`, `bool`): the base
/// of the family, what a runtime buffer can hold.
pub trait Element: Copy + Send + Sync + 'static {
    /// The dtype.
    const DTYPE: DType;
    /// Wraps an array.
    fn into_tensor(a: ArrayD<Self>) -> Tensor;
    /// Unwraps an array of this type; gives the tensor back otherwise.
    fn from_tensor(t: Tensor) -> Result<ArrayD<Self>, Tensor>;
    /// The array inside a tensor of this type.
    fn array_mut(t: &mut Tensor) -> Option<&mut ArrayD<Self>>;
    /// The array inside a tensor of this type, to read.
    fn array_ref(t: &Tensor) -> Option<&ArrayD<Self>>;
}

macro_rules! element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn into_tensor(a: ArrayD<Self>) -> Tensor {
                Tensor::$d(a)
            }
            fn from_tensor(t: Tensor) -> Result<ArrayD<Self>, Tensor> {
                match t {
                    Tensor::$d(a) => Ok(a),
                    other => Err(other),
                }
            }
            fn array_mut(t: &mut Tensor) -> Option<&mut ArrayD<Self>> {
                match t {
                    Tensor::$d(a) => Some(a),
                    _ => None,
                }
            }
            fn array_ref(t: &Tensor) -> Option<&ArrayD<Self>> {
                match t {
                    Tensor::$d(a) => Some(a),
                    _ => None,
                }
            }
        }
    };
}
element!(f32, F32);
element!(f64, F64);
element!(i32, I32);
element!(bool, Pred);

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for i32 {}
}

/// An element type the collectives can move and reduce (`f32`, `f64`,
/// `i32`): integers wrap, floats follow IEEE 754.
pub trait ReduceElement:
    sealed::Sealed + Element + PartialEq + std::fmt::Debug + bytemuck::Pod
{
    /// Size of one element in bytes.
    const BYTES: usize;
    /// The additive identity, used to initialize scratch space.
    const ZERO: Self;
    /// `a + b` (wrapping for integers).
    fn add(a: Self, b: Self) -> Self;
    /// `a * b` (wrapping for integers).
    fn mul(a: Self, b: Self) -> Self;
    /// The larger of `a` and `b`.
    fn max(a: Self, b: Self) -> Self;
    /// The smaller of `a` and `b`.
    fn min(a: Self, b: Self) -> Self;
    /// `self / n` (truncating for integers); `n` is at least 1.
    fn div_count(self, n: usize) -> Self;
}

macro_rules! float_element {
    ($t:ty) => {
        impl ReduceElement for $t {
            const BYTES: usize = std::mem::size_of::<$t>();
            const ZERO: Self = 0.0;
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                a + b
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                a * b
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                a.max(b)
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                a.min(b)
            }
            #[inline(always)]
            fn div_count(self, n: usize) -> Self {
                self / n as $t
            }
        }
    };
}

float_element!(f32);
float_element!(f64);

impl ReduceElement for i32 {
    const BYTES: usize = 4;
    const ZERO: Self = 0;
    #[inline(always)]
    fn add(a: Self, b: Self) -> Self {
        a.wrapping_add(b)
    }
    #[inline(always)]
    fn mul(a: Self, b: Self) -> Self {
        a.wrapping_mul(b)
    }
    #[inline(always)]
    fn max(a: Self, b: Self) -> Self {
        Ord::max(a, b)
    }
    #[inline(always)]
    fn min(a: Self, b: Self) -> Self {
        Ord::min(a, b)
    }
    #[inline(always)]
    fn div_count(self, n: usize) -> Self {
        // `n` is a rank count; counts beyond `i32::MAX` saturate.
        let n = i32::try_from(n).unwrap_or(i32::MAX);
        self.wrapping_div(n)
    }
}

/// A floating-point element type the optimizers run on (`f32`, `f64`).
///
/// The extra operations pin down the rounding that the optax reference
/// depends on; `num_traits::Float` alone leaves them unspecified.
pub trait FloatElement: ReduceElement + num_traits::Float + std::fmt::Display + Default {
    /// Rounds an `f64` to this type, once, to nearest-even.
    fn from_f64_rounded(x: f64) -> Self;

    /// Widens to `f64` (exact for `f32` and `f64`).
    fn as_f64(self) -> f64;

    /// `self^t` for an integer step count, rounded once from a more precise
    /// value. For `f32` this is `pow` in `f64` rounded to `f32`: libm's `pow`
    /// is within one `f64` ulp, so the result is the correctly rounded `f32`
    /// unless `b^t` lies within about 2^-52 (relative) of a rounding
    /// boundary. `pow_f32_is_correctly_rounded_for_default_betas` (ignored
    /// test) checks it exactly for b = 0.9, 0.99 and 0.999 at every count
    /// where `1 - b^t` still differs from 1. `f32::powi` is not correctly
    /// rounded (it is off by one ulp at 0.9^7 already).
    fn pow_rounded(self, t: i32) -> Self;

    /// `1 / sqrt(self)`. For `f32`, computed in `f64` and rounded once, which
    /// is the correctly rounded result for every `f32` input (the exhaustive
    /// check is `rsqrt_f32_is_correctly_rounded`, an ignored test).
    fn rsqrt(self) -> Self;
}

impl FloatElement for f32 {
    #[inline]
    fn from_f64_rounded(x: f64) -> Self {
        x as f32
    }

    #[inline]
    fn as_f64(self) -> f64 {
        f64::from(self)
    }

    #[inline]
    fn pow_rounded(self, t: i32) -> Self {
        f64::from(self).powf(f64::from(t)) as f32
    }

    #[inline]
    fn rsqrt(self) -> Self {
        (1.0 / f64::from(self).sqrt()) as f32
    }
}

impl FloatElement for f64 {
    #[inline]
    fn from_f64_rounded(x: f64) -> Self {
        x
    }

    #[inline]
    fn as_f64(self) -> f64 {
        self
    }

    #[inline]
    fn pow_rounded(self, t: i32) -> Self {
        self.powf(f64::from(t))
    }

    #[inline]
    fn rsqrt(self) -> Self {
        1.0 / self.sqrt()
    }
}
