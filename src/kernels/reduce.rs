//! Reductions over dimensions: sum, max, min, mean.

use ndarray::{ArrayD, Axis};

use super::tensor::Tensor;
use super::{KernelError, KernelResult};
use crate::ir::{DType, ReduceKind};

fn check_dims(rank: usize, dims: &[usize]) -> KernelResult<Vec<usize>> {
    let mut sorted = dims.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != dims.len() || sorted.iter().any(|&d| d >= rank) {
        return Err(KernelError::ReduceDims {
            dims: dims.to_vec(),
            rank,
        });
    }
    Ok(sorted)
}

macro_rules! reduce_float {
    ($a:expr, $kind:expr, $dims:expr, $t:ty) => {{
        let mut out: ArrayD<$t> = $a.clone();
        let mut count: usize = 1;
        for &d in $dims.iter().rev() {
            count *= out.shape()[d];
            out = match $kind {
                ReduceKind::Sum | ReduceKind::Mean => out.fold_axis(Axis(d), 0.0, |&s, &x| s + x),
                ReduceKind::Max => out.fold_axis(Axis(d), <$t>::NEG_INFINITY, |&s, &x| {
                    if s.is_nan() || x.is_nan() {
                        <$t>::NAN
                    } else {
                        s.max(x)
                    }
                }),
                ReduceKind::Min => out.fold_axis(Axis(d), <$t>::INFINITY, |&s, &x| {
                    if s.is_nan() || x.is_nan() {
                        <$t>::NAN
                    } else {
                        s.min(x)
                    }
                }),
            };
        }
        if $kind == ReduceKind::Mean {
            let n = count as $t;
            out.mapv_inplace(|s| s / n);
        }
        out
    }};
}

/// Reduces `x` over `dims`, which disappear from the result. Sums run in
/// row-major order; a mean divides the sum by the number of reduced elements
/// (integer division for i32).
pub fn reduce(x: &Tensor, kind: ReduceKind, dims: &[usize]) -> KernelResult<Tensor> {
    let dims = check_dims(x.shape().len(), dims)?;
    Ok(match x {
        Tensor::F32(a) => Tensor::F32(reduce_float!(a, kind, dims, f32)),
        Tensor::F64(a) => Tensor::F64(reduce_float!(a, kind, dims, f64)),
        Tensor::I32(a) => {
            let mut out = a.clone();
            let mut count: i32 = 1;
            for &d in dims.iter().rev() {
                count = count.wrapping_mul(out.shape()[d] as i32);
                out = match kind {
                    ReduceKind::Sum | ReduceKind::Mean => {
                        out.fold_axis(Axis(d), 0i32, |&s, &x| s.wrapping_add(x))
                    }
                    ReduceKind::Max => out.fold_axis(Axis(d), i32::MIN, |&s, &x| s.max(x)),
                    ReduceKind::Min => out.fold_axis(Axis(d), i32::MAX, |&s, &x| s.min(x)),
                };
            }
            if kind == ReduceKind::Mean {
                out.mapv_inplace(|s| {
                    if count == 0 {
                        -1
                    } else {
                        s.wrapping_div(count)
                    }
                });
            }
            Tensor::I32(out)
        }
        Tensor::Pred(_) => {
            return Err(KernelError::Undefined {
                op: "reduce".to_owned(),
                dtype: DType::Pred,
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{DType, TensorType};

    #[test]
    fn reduces_over_several_dims() {
        let v: Vec<f64> = (0..24).map(f64::from).collect();
        let x = Tensor::from_f64s(&TensorType::new(DType::F32, [2, 3, 4]), &v).unwrap();
        let s = reduce(&x, ReduceKind::Sum, &[0, 2]).unwrap();
        assert_eq!(s.shape(), &[3]);
        assert_eq!(s.to_f64_vec(), vec![60., 92., 124.]);
        let m = reduce(&x, ReduceKind::Mean, &[1]).unwrap();
        assert_eq!(m.to_f64_vec()[0], 4.0);
        assert_eq!(
            reduce(&x, ReduceKind::Max, &[0, 1, 2])
                .unwrap()
                .to_f64_vec(),
            vec![23.]
        );
        assert!(reduce(&x, ReduceKind::Sum, &[3]).is_err());
    }
}
