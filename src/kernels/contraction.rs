//! Contractions: general dot product and 2-D convolution. Each output element
//! accumulates in a fixed order (contracted index ascending), so results are
//! reproducible bit for bit.

use ndarray::{Array3, ArrayD, IxDyn};

use super::tensor::Tensor;
use super::{KernelError, KernelResult};
use crate::ir::{ConvAttrs, DotDims, Padding};

/// Element types a contraction accumulates in.
trait Accumulate: Copy + 'static {
    const ZERO: Self;
    fn mul_add(self, a: Self, b: Self) -> Self;
}

impl Accumulate for f32 {
    const ZERO: f32 = 0.0;
    fn mul_add(self, a: f32, b: f32) -> f32 {
        self + a * b
    }
}

impl Accumulate for f64 {
    const ZERO: f64 = 0.0;
    fn mul_add(self, a: f64, b: f64) -> f64 {
        self + a * b
    }
}

impl Accumulate for i32 {
    const ZERO: i32 = 0;
    fn mul_add(self, a: i32, b: i32) -> i32 {
        self.wrapping_add(a.wrapping_mul(b))
    }
}

/// The dimensions of `rank` that are neither batch nor contracting, in order.
fn free_dims(rank: usize, batch: &[usize], contracting: &[usize]) -> Vec<usize> {
    (0..rank)
        .filter(|d| !batch.contains(d) && !contracting.contains(d))
        .collect()
}

fn distinct_in_range(dims: &[usize], rank: usize) -> bool {
    let mut seen = vec![false; rank];
    dims.iter()
        .all(|&d| d < rank && !std::mem::replace(&mut seen[d], true))
}

/// The result dimensions of a general dot: batch, free lhs, free rhs.
pub fn dot_result_shape(lhs: &[usize], rhs: &[usize], dims: &DotDims) -> KernelResult<Vec<usize>> {
    let both: Vec<usize> = dims
        .lhs_batch
        .iter()
        .chain(&dims.lhs_contracting)
        .copied()
        .collect();
    let both_r: Vec<usize> = dims
        .rhs_batch
        .iter()
        .chain(&dims.rhs_contracting)
        .copied()
        .collect();
    if !distinct_in_range(&both, lhs.len()) || !distinct_in_range(&both_r, rhs.len()) {
        return Err(KernelError::DotDims {
            dims: Box::new(dims.clone()),
            lhs: lhs.to_vec(),
            rhs: rhs.to_vec(),
        });
    }
    if dims.lhs_batch.len() != dims.rhs_batch.len()
        || dims.lhs_contracting.len() != dims.rhs_contracting.len()
    {
        return Err(KernelError::DotUnpaired);
    }
    for (&l, &r) in dims.lhs_batch.iter().zip(&dims.rhs_batch) {
        if lhs[l] != rhs[r] {
            return Err(KernelError::DotBatch {
                lhs: lhs[l],
                rhs: rhs[r],
            });
        }
    }
    for (&l, &r) in dims.lhs_contracting.iter().zip(&dims.rhs_contracting) {
        if lhs[l] != rhs[r] {
            return Err(KernelError::DotContracting {
                lhs_dim: l,
                lhs: lhs[l],
                rhs_dim: r,
                rhs: rhs[r],
            });
        }
    }
    let mut out: Vec<usize> = dims.lhs_batch.iter().map(|&d| lhs[d]).collect();
    out.extend(
        free_dims(lhs.len(), &dims.lhs_batch, &dims.lhs_contracting)
            .iter()
            .map(|&d| lhs[d]),
    );
    out.extend(
        free_dims(rhs.len(), &dims.rhs_batch, &dims.rhs_contracting)
            .iter()
            .map(|&d| rhs[d]),
    );
    Ok(out)
}

/// Permutes `a` to `order` and views it as `[B, rows, cols]`.
fn as_batched<T: Copy>(
    a: &ArrayD<T>,
    order: Vec<usize>,
    b: usize,
    rows: usize,
    cols: usize,
) -> Array3<T> {
    let p = a.view().permuted_axes(order);
    let data: Vec<T> = p.iter().copied().collect();
    Array3::from_shape_vec((b, rows, cols), data).expect("sizes come from the same shape")
}

fn dot_arrays<T: Accumulate>(
    l: &ArrayD<T>,
    r: &ArrayD<T>,
    dims: &DotDims,
) -> KernelResult<ArrayD<T>> {
    let out_shape = dot_result_shape(l.shape(), r.shape(), dims)?;
    let lf = free_dims(l.ndim(), &dims.lhs_batch, &dims.lhs_contracting);
    let rf = free_dims(r.ndim(), &dims.rhs_batch, &dims.rhs_contracting);
    let size = |a: &ArrayD<T>, ds: &[usize]| ds.iter().map(|&d| a.shape()[d]).product::<usize>();
    let (b, m, k, n) = (
        size(l, &dims.lhs_batch),
        size(l, &lf),
        size(l, &dims.lhs_contracting),
        size(r, &rf),
    );
    let lorder: Vec<usize> = dims
        .lhs_batch
        .iter()
        .chain(&lf)
        .chain(&dims.lhs_contracting)
        .copied()
        .collect();
    let rorder: Vec<usize> = dims
        .rhs_batch
        .iter()
        .chain(&dims.rhs_contracting)
        .chain(&rf)
        .copied()
        .collect();
    let lhs = as_batched(l, lorder, b, m, k);
    let rhs = as_batched(r, rorder, b, k, n);
    let mut out = vec![T::ZERO; b * m * n];
    for bi in 0..b {
        for mi in 0..m {
            let row = &mut out[(bi * m + mi) * n..(bi * m + mi + 1) * n];
            for ki in 0..k {
                let a = lhs[[bi, mi, ki]];
                for (ni, acc) in row.iter_mut().enumerate() {
                    *acc = acc.mul_add(a, rhs[[bi, ki, ni]]);
                }
            }
        }
    }
    ArrayD::from_shape_vec(IxDyn(&out_shape), out).map_err(KernelError::Shape)
}

/// General dot product (XLA `DotGeneral`).
pub fn dot_general(lhs: &Tensor, rhs: &Tensor, dims: &DotDims) -> KernelResult<Tensor> {
    Ok(match (lhs, rhs) {
        (Tensor::F32(a), Tensor::F32(b)) => Tensor::F32(dot_arrays(a, b, dims)?),
        (Tensor::F64(a), Tensor::F64(b)) => Tensor::F64(dot_arrays(a, b, dims)?),
        (Tensor::I32(a), Tensor::I32(b)) => Tensor::I32(dot_arrays(a, b, dims)?),
        _ => {
            return Err(KernelError::MixedDTypes {
                operands: "dot operands",
                numeric: true,
            });
        }
    })
}

/// Resolved convolution geometry: the low padding and the output size of
/// each spatial dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvGeometry {
    /// Padding before the first input row/column, per spatial dimension.
    pub pad_lo: [usize; 2],
    /// Output size per spatial dimension.
    pub out: [usize; 2],
}

/// The geometry of a convolution of `input` `[N,C,H,W]` by `kernel`
/// `[O,C/g,KH,KW]`, or why the shapes and attributes do not fit.
pub fn conv_geometry(
    input: &[usize],
    kernel: &[usize],
    attrs: &ConvAttrs,
) -> KernelResult<ConvGeometry> {
    if input.len() != 4 || kernel.len() != 4 {
        return Err(KernelError::ConvRank {
            input: input.to_vec(),
            kernel: kernel.to_vec(),
        });
    }
    let g = attrs.feature_groups;
    if g == 0
        || !input[1].is_multiple_of(g)
        || !kernel[0].is_multiple_of(g)
        || kernel[1] * g != input[1]
    {
        return Err(KernelError::ConvGroups {
            groups: g,
            input: input[1],
            output: kernel[0],
            kernel: kernel[1],
        });
    }
    if attrs.stride.contains(&0) || attrs.dilation.contains(&0) {
        return Err(KernelError::ConvStride);
    }
    let mut pad_lo = [0; 2];
    let mut out = [0; 2];
    for i in 0..2 {
        let (size, k, s, d) = (
            input[2 + i],
            kernel[2 + i],
            attrs.stride[i],
            attrs.dilation[i],
        );
        let eff = k.saturating_sub(1).saturating_mul(d).saturating_add(1);
        let (lo, hi) = match &attrs.padding {
            Padding::Valid => (0, 0),
            Padding::Same => {
                let o = size.div_ceil(s);
                let total = o
                    .saturating_sub(1)
                    .saturating_mul(s)
                    .saturating_add(eff)
                    .saturating_sub(size);
                (total / 2, total - total / 2)
            }
            Padding::Explicit(p) => *p.get(i).ok_or(KernelError::ConvPadding)?,
        };
        let padded = size.saturating_add(lo).saturating_add(hi);
        if k == 0 || padded < eff {
            return Err(KernelError::ConvWindow {
                window: eff,
                padded,
                dim: i,
            });
        }
        pad_lo[i] = lo;
        out[i] = (padded - eff) / s + 1;
    }
    Ok(ConvGeometry { pad_lo, out })
}

/// The result dimensions `[N, O, OH, OW]` of a convolution.
pub fn conv_result_shape(
    input: &[usize],
    kernel: &[usize],
    attrs: &ConvAttrs,
) -> KernelResult<Vec<usize>> {
    let g = conv_geometry(input, kernel, attrs)?;
    Ok(vec![input[0], kernel[0], g.out[0], g.out[1]])
}

fn conv_arrays<T: Accumulate>(
    x: &ArrayD<T>,
    w: &ArrayD<T>,
    attrs: &ConvAttrs,
) -> KernelResult<ArrayD<T>> {
    let geo = conv_geometry(x.shape(), w.shape(), attrs)?;
    let (xs, ws) = (x.shape(), w.shape());
    let (n, o, cg, kh, kw) = (xs[0], ws[0], ws[1], ws[2], ws[3]);
    let og = o / attrs.feature_groups;
    let [oh, ow] = geo.out;
    let x = x.as_standard_layout();
    let w = w.as_standard_layout();
    let (xd, wd) = (x.as_slice().unwrap_or(&[]), w.as_slice().unwrap_or(&[]));
    let (h, wid) = (xs[2], xs[3]);
    let mut out = vec![T::ZERO; n * o * oh * ow];
    for ni in 0..n {
        for oi in 0..o {
            let group = oi / og;
            for y in 0..oh {
                for xo in 0..ow {
                    let mut acc = T::ZERO;
                    for ci in 0..cg {
                        let c = group * cg + ci;
                        for ky in 0..kh {
                            let iy = (y * attrs.stride[0] + ky * attrs.dilation[0]) as isize
                                - geo.pad_lo[0] as isize;
                            if iy < 0 || iy as usize >= h {
                                continue;
                            }
                            for kx in 0..kw {
                                let ix = (xo * attrs.stride[1] + kx * attrs.dilation[1]) as isize
                                    - geo.pad_lo[1] as isize;
                                if ix < 0 || ix as usize >= wid {
                                    continue;
                                }
                                let xv =
                                    xd[((ni * xs[1] + c) * h + iy as usize) * wid + ix as usize];
                                let wv = wd[((oi * cg + ci) * kh + ky) * kw + kx];
                                acc = acc.mul_add(xv, wv);
                            }
                        }
                    }
                    out[((ni * o + oi) * oh + y) * ow + xo] = acc;
                }
            }
        }
    }
    ArrayD::from_shape_vec(IxDyn(&[n, o, oh, ow]), out).map_err(KernelError::Shape)
}

/// 2-D convolution, input `[N,C,H,W]`, kernel `[O,C/g,KH,KW]`.
pub fn convolution(input: &Tensor, kernel: &Tensor, attrs: &ConvAttrs) -> KernelResult<Tensor> {
    Ok(match (input, kernel) {
        (Tensor::F32(a), Tensor::F32(b)) => Tensor::F32(conv_arrays(a, b, attrs)?),
        (Tensor::F64(a), Tensor::F64(b)) => Tensor::F64(conv_arrays(a, b, attrs)?),
        (Tensor::I32(a), Tensor::I32(b)) => Tensor::I32(conv_arrays(a, b, attrs)?),
        _ => {
            return Err(KernelError::MixedDTypes {
                operands: "convolution operands",
                numeric: true,
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{DType, TensorType};

    fn t(dims: &[usize], v: &[f64]) -> Tensor {
        Tensor::from_f64s(&TensorType::new(DType::I32, dims.to_vec()), v).unwrap()
    }

    #[test]
    fn matmul_and_batched_dot() {
        let a = t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
        let b = t(&[3, 2], &[7., 8., 9., 10., 11., 12.]);
        let dims = DotDims {
            lhs_contracting: vec![1],
            rhs_contracting: vec![0],
            ..Default::default()
        };
        assert_eq!(
            dot_general(&a, &b, &dims).unwrap().to_f64_vec(),
            vec![58., 64., 139., 154.]
        );
        let batched = DotDims {
            lhs_batch: vec![0],
            rhs_batch: vec![0],
            lhs_contracting: vec![1],
            rhs_contracting: vec![1],
        };
        let r = dot_general(&a, &a, &batched).unwrap();
        assert_eq!(r.to_f64_vec(), vec![14., 77.]);
        let bad = DotDims {
            lhs_contracting: vec![0],
            rhs_contracting: vec![0],
            ..Default::default()
        };
        assert!(dot_general(&a, &b, &bad).is_err());
    }

    #[test]
    fn convolution_same_padding_and_groups() {
        let x = t(&[1, 1, 3, 3], &[1., 2., 3., 4., 5., 6., 7., 8., 9.]);
        let w = t(&[1, 1, 3, 3], &[0., 0., 0., 0., 1., 0., 0., 0., 0.]);
        let same = ConvAttrs {
            padding: Padding::Same,
            ..Default::default()
        };
        assert_eq!(
            convolution(&x, &w, &same).unwrap().to_f64_vec(),
            x.to_f64_vec()
        );
        let valid = convolution(&x, &w, &ConvAttrs::default()).unwrap();
        assert_eq!(valid.to_f64_vec(), vec![5.]);
        let strided = ConvAttrs {
            stride: [2, 2],
            padding: Padding::Same,
            ..Default::default()
        };
        assert_eq!(
            conv_result_shape(&[1, 1, 3, 3], &[1, 1, 3, 3], &strided).unwrap(),
            vec![1, 1, 2, 2]
        );
        let x2 = t(&[1, 2, 1, 1], &[3., 5.]);
        let w2 = t(&[2, 1, 1, 1], &[2., 10.]);
        let grouped = ConvAttrs {
            feature_groups: 2,
            ..Default::default()
        };
        assert_eq!(
            convolution(&x2, &w2, &grouped).unwrap().to_f64_vec(),
            vec![6., 50.]
        );
    }
}
