//! Data-movement kernels: broadcast, reshape, transpose, slice, concatenate, iota.

use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn, Slice};

use super::tensor::{Tensor, map_tensor};
use super::{KernelError, KernelResult};
use crate::ir::{DType, TensorType};

/// The operand shape aligned to the result rank for an explicit broadcast:
/// operand dimension `i` goes to result dimension `dims[i]`.
fn broadcast_array<T: Clone>(
    a: &ArrayD<T>,
    shape: &[usize],
    dims: Option<&[usize]>,
) -> KernelResult<ArrayD<T>> {
    let fail = || KernelError::BroadcastTo {
        from: a.shape().to_vec(),
        to: shape.to_vec(),
        dims: dims.map(<[usize]>::to_vec),
    };
    let Some(dims) = dims else {
        return Ok(a.broadcast(IxDyn(shape)).ok_or_else(fail)?.to_owned());
    };
    if dims.len() != a.ndim() || dims.iter().any(|&d| d >= shape.len()) {
        return Err(fail());
    }
    // Permute the operand so that its dimensions appear in result order, then
    // insert the missing dimensions as length 1 and stretch.
    let mut order: Vec<usize> = (0..dims.len()).collect();
    order.sort_by_key(|&i| dims[i]);
    let mut view = a.view().permuted_axes(order.clone());
    let mut sorted: Vec<usize> = order.iter().map(|&i| dims[i]).collect();
    sorted.dedup();
    if sorted.len() != dims.len() {
        return Err(fail());
    }
    for d in 0..shape.len() {
        if !sorted.contains(&d) {
            view = view.insert_axis(Axis(d));
        }
    }
    Ok(view.broadcast(IxDyn(shape)).ok_or_else(fail)?.to_owned())
}

/// Broadcast to `shape`, by numpy rules or an explicit dimension mapping.
pub fn broadcast(x: &Tensor, shape: &[usize], dims: Option<&[usize]>) -> KernelResult<Tensor> {
    Ok(map_tensor!(x, a => broadcast_array(a, shape, dims)?))
}

fn reshape_array<T: Clone>(a: &ArrayD<T>, shape: &[usize]) -> KernelResult<ArrayD<T>> {
    ArrayD::from_shape_vec(IxDyn(shape), a.iter().cloned().collect()).map_err(|source| {
        KernelError::Reshape {
            from: a.shape().to_vec(),
            to: shape.to_vec(),
            source,
        }
    })
}

/// Same elements in row-major order, new (fully known) dimensions.
pub fn reshape(x: &Tensor, shape: &[usize]) -> KernelResult<Tensor> {
    Ok(map_tensor!(x, a => reshape_array(a, shape)?))
}

fn transpose_array<T: Clone>(a: &ArrayD<T>, perm: &[usize]) -> KernelResult<ArrayD<T>> {
    let mut seen = vec![false; a.ndim()];
    if perm.len() != a.ndim()
        || perm
            .iter()
            .any(|&p| p >= a.ndim() || std::mem::replace(&mut seen[p], true))
    {
        return Err(KernelError::NotAPermutation {
            perm: perm.to_vec(),
            rank: a.ndim(),
        });
    }
    Ok(a.view()
        .permuted_axes(perm.to_vec())
        .as_standard_layout()
        .into_owned())
}

/// Result dimension `i` is operand dimension `perm[i]`.
pub fn transpose(x: &Tensor, perm: &[usize]) -> KernelResult<Tensor> {
    Ok(map_tensor!(x, a => transpose_array(a, perm)?))
}

fn slice_array<T: Clone>(
    a: &ArrayD<T>,
    start: &[usize],
    limit: &[usize],
    stride: &[usize],
) -> KernelResult<ArrayD<T>> {
    let n = a.ndim();
    let ok = start.len() == n
        && limit.len() == n
        && stride.len() == n
        && (0..n).all(|i| start[i] <= limit[i] && limit[i] <= a.shape()[i] && stride[i] >= 1);
    if !ok {
        return Err(KernelError::SliceOutOfBounds {
            start: start.into(),
            limit: limit.into(),
            stride: stride.into(),
            shape: a.shape().into(),
        });
    }
    Ok(a.slice_each_axis(|ax| {
        let i = ax.axis.index();
        Slice::new(
            start[i] as isize,
            Some(limit[i] as isize),
            stride[i] as isize,
        )
    })
    .to_owned())
}

/// Strided slice `[start, limit)`.
pub fn slice(
    x: &Tensor,
    start: &[usize],
    limit: &[usize],
    stride: &[usize],
) -> KernelResult<Tensor> {
    Ok(map_tensor!(x, a => slice_array(a, start, limit, stride)?))
}

fn concat_arrays<'a, T: Clone + 'a>(
    parts: impl Iterator<Item = Option<ArrayViewD<'a, T>>>,
    dim: usize,
) -> KernelResult<ArrayD<T>> {
    let views: Vec<ArrayViewD<'a, T>> =
        parts
            .collect::<Option<Vec<_>>>()
            .ok_or(KernelError::MixedDTypes {
                operands: "concatenate operands",
                numeric: false,
            })?;
    ndarray::concatenate(Axis(dim), &views)
        .map_err(|source| KernelError::Concatenate { dim, source })
}

/// Join tensors of one dtype along `dim`.
pub fn concatenate(parts: &[&Tensor], dim: usize) -> KernelResult<Tensor> {
    let first = parts.first().ok_or(KernelError::ConcatenateEmpty)?;
    if dim >= first.shape().len() {
        return Err(KernelError::ConcatenateDim { dim });
    }
    Ok(match first {
        Tensor::Pred(_) => Tensor::Pred(concat_arrays(
            parts.iter().map(|t| {
                if let Tensor::Pred(a) = t {
                    Some(a.view())
                } else {
                    None
                }
            }),
            dim,
        )?),
        Tensor::I32(_) => Tensor::I32(concat_arrays(
            parts.iter().map(|t| {
                if let Tensor::I32(a) = t {
                    Some(a.view())
                } else {
                    None
                }
            }),
            dim,
        )?),
        Tensor::F32(_) => Tensor::F32(concat_arrays(
            parts.iter().map(|t| {
                if let Tensor::F32(a) = t {
                    Some(a.view())
                } else {
                    None
                }
            }),
            dim,
        )?),
        Tensor::F64(_) => Tensor::F64(concat_arrays(
            parts.iter().map(|t| {
                if let Tensor::F64(a) = t {
                    Some(a.view())
                } else {
                    None
                }
            }),
            dim,
        )?),
    })
}

/// The index along `dim` at every position of `ty`.
pub fn iota(ty: &TensorType, dim: usize) -> KernelResult<Tensor> {
    if dim >= ty.rank() {
        return Err(KernelError::IotaDim {
            dim,
            ty: ty.clone(),
        });
    }
    let idx = ArrayD::from_shape_fn(IxDyn(&ty.dims), |ix| ix[dim]);
    Ok(match ty.dtype {
        DType::Pred => Tensor::Pred(idx.mapv(|i| i != 0)),
        DType::I32 => Tensor::I32(idx.mapv(|i| i as i32)),
        DType::F32 => Tensor::F32(idx.mapv(|i| i as f32)),
        DType::F64 => Tensor::F64(idx.mapv(|i| i as f64)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(dims: &[usize]) -> Tensor {
        let n: usize = dims.iter().product();
        let v: Vec<f64> = (0..n).map(|i| i as f64).collect();
        Tensor::from_f64s(&TensorType::new(DType::I32, dims.to_vec()), &v).unwrap()
    }

    #[test]
    fn explicit_broadcast_maps_dimensions() {
        let x = range(&[3]);
        let b = broadcast(&x, &[3, 2], Some(&[0])).unwrap();
        assert_eq!(b.to_f64_vec(), vec![0., 0., 1., 1., 2., 2.]);
        let b = broadcast(&x, &[2, 3], Some(&[1])).unwrap();
        assert_eq!(b.to_f64_vec(), vec![0., 1., 2., 0., 1., 2.]);
        let m = range(&[2, 3]);
        let t = broadcast(&m, &[3, 4, 2], Some(&[2, 0])).unwrap();
        assert_eq!(t.shape(), &[3, 4, 2]);
        assert_eq!(t.to_f64_vec()[..2], [0., 3.]);
    }

    #[test]
    fn transpose_slice_concat() {
        let m = range(&[2, 3]);
        assert_eq!(
            transpose(&m, &[1, 0]).unwrap().to_f64_vec(),
            vec![0., 3., 1., 4., 2., 5.]
        );
        assert!(transpose(&m, &[0, 0]).is_err());
        let s = slice(&m, &[0, 1], &[2, 3], &[1, 2]).unwrap();
        assert_eq!(s.to_f64_vec(), vec![1., 4.]);
        let c = concatenate(&[&m, &m], 0).unwrap();
        assert_eq!(c.shape(), &[4, 3]);
    }
}
