//! The whole-tensor dot that does not accumulate in index order: a plain
//! 2-D floating-point dot through ndarray's matrix multiply.

use ndarray::Ix2;

use crate::ir::{DotDims, Tensor};

/// `[m, k] x [k, n]` in floating point through ndarray's matrix multiply.
pub(super) fn matmul(args: &[&Tensor], dims: &DotDims) -> Option<Tensor> {
    let plain = dims.lhs_batch.is_empty()
        && dims.rhs_batch.is_empty()
        && dims.lhs_contracting == [1]
        && dims.rhs_contracting == [0];
    if !plain {
        return None;
    }
    match (args.first()?, args.get(1)?) {
        (Tensor::F32(a), Tensor::F32(b)) => {
            let (a, b) = (
                a.view().into_dimensionality::<Ix2>().ok()?,
                b.view().into_dimensionality::<Ix2>().ok()?,
            );
            (a.ncols() == b.nrows()).then(|| Tensor::F32(a.dot(&b).into_dyn()))
        }
        (Tensor::F64(a), Tensor::F64(b)) => {
            let (a, b) = (
                a.view().into_dimensionality::<Ix2>().ok()?,
                b.view().into_dimensionality::<Ix2>().ok()?,
            );
            (a.ncols() == b.nrows()).then(|| Tensor::F64(a.dot(&b).into_dyn()))
        }
        _ => None,
    }
}
