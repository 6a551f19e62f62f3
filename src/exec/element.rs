//! The element types a runtime buffer can hold ([`crate::exec::runtime`]
//! re-exports the trait as `exec::runtime::Element`).

use ndarray::ArrayD;

use crate::ir::DType;
use crate::ir::Tensor;

/// Element types a runtime buffer can hold.
pub trait Element: Copy + Send + Sync + 'static {
    /// The dtype.
    const DTYPE: DType;
    /// Wraps an array.
    fn into_tensor(a: ArrayD<Self>) -> Tensor;
    /// Unwraps an array of this type; gives the tensor back otherwise.
    fn from_tensor(t: Tensor) -> Result<ArrayD<Self>, Tensor>;
    /// The array inside a tensor of this type.
    fn array_mut(t: &mut Tensor) -> Option<&mut ArrayD<Self>>;
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
        }
    };
}
element!(f32, F32);
element!(f64, F64);
element!(i32, I32);
element!(bool, Pred);
