//! The cost of one op, counted as XLA's `HloCostAnalysis` counts it.
//!
//! Pure: an op, its operand types and its result type in, an [`OpCost`] out.
//! The rules (XLA's handler names in parentheses):
//!
//! * `dot` (`HandleDot`, `GetDotFlops`): 2 × result elements × the product of
//!   the lhs contracting dimensions (one multiply-add is 2 flops; batch
//!   dimensions are in the result already).
//! * `convolution` (`HandleConvolution`, `GetConvolutionFlops`): 2 × N × O ×
//!   C/g × the product over spatial dimensions of the *valid* (output,
//!   kernel tap) pairs, those whose input position falls inside the
//!   unpadded input. With `valid` padding every pair is valid and this is
//!   2 × output elements × KH × KW × C/g; taps on padding are not counted.
//! * elementwise unary, binary, compare, select, convert
//!   (`HandleElementwiseOp`): one per result element, in `transcendentals`
//!   for `exp log sqrt rsqrt tanh logistic sin cos pow`, in `flops` for the
//!   rest (integer ops included, as in XLA).
//! * `reduce` (`HandleReduce`): input − output elements applications of the
//!   reducer, one flop each. `reduce_mean` adds one divide per result
//!   element, so it counts input elements.
//! * data movement (`broadcast reshape transpose slice concatenate`), `iota`
//!   and `custom_call`: 0 flops (a custom call is opaque; XLA does not cost
//!   it either).
//! * `parameter`, `constant` (`HandleParameter`, `HandleConstant`): nothing,
//!   no bytes either: their bytes are counted where they are read.
//!
//! Bytes (XLA's default in `Preprocess`): every operand's bytes are read and
//! the result's bytes written; a `slice` reads only what it keeps
//! (`HandleSlice`: the result's bytes).

use std::iter::Sum;
use std::ops::{Add, AddAssign};

use serde::{Deserialize, Serialize};

use crate::ir::op::{ConvAttrs, Op, ReduceKind, UnaryOp};
use crate::ir::types::TensorType;
use crate::kernels::contraction::conv_geometry;

/// Flops of one multiply-add (XLA's `kFmaFlops`).
pub const FMA_FLOPS: u64 = 2;

/// What one op (or a kernel, or a program) computes and moves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpCost {
    /// Floating-point (and integer) operations, transcendentals excluded.
    pub flops: u64,
    /// Transcendental function evaluations (`exp`, `tanh`, …), one per element.
    pub transcendentals: u64,
    /// Bytes read from memory.
    pub bytes_read: u64,
    /// Bytes written to memory.
    pub bytes_written: u64,
}

impl OpCost {
    /// Bytes read plus bytes written (XLA's `bytes accessed`).
    pub fn bytes_accessed(&self) -> u64 {
        self.bytes_read.saturating_add(self.bytes_written)
    }

    /// Flops per byte accessed, or `None` when nothing is accessed.
    pub fn arithmetic_intensity(&self) -> Option<f64> {
        let bytes = self.bytes_accessed();
        (bytes > 0).then(|| self.flops as f64 / bytes as f64)
    }
}

impl Add for OpCost {
    type Output = OpCost;

    fn add(self, o: OpCost) -> OpCost {
        OpCost {
            flops: self.flops.saturating_add(o.flops),
            transcendentals: self.transcendentals.saturating_add(o.transcendentals),
            bytes_read: self.bytes_read.saturating_add(o.bytes_read),
            bytes_written: self.bytes_written.saturating_add(o.bytes_written),
        }
    }
}

impl AddAssign for OpCost {
    fn add_assign(&mut self, o: OpCost) {
        *self = *self + o;
    }
}

impl Sum for OpCost {
    fn sum<I: Iterator<Item = OpCost>>(iter: I) -> OpCost {
        iter.fold(OpCost::default(), Add::add)
    }
}

impl<'a> Sum<&'a OpCost> for OpCost {
    fn sum<I: Iterator<Item = &'a OpCost>>(iter: I) -> OpCost {
        iter.copied().sum()
    }
}

fn elements(t: &TensorType) -> u64 {
    t.element_count() as u64
}

fn bytes(t: &TensorType) -> u64 {
    t.byte_size() as u64
}

/// Whether XLA counts the unary op as a transcendental.
fn is_transcendental_unary(u: UnaryOp) -> bool {
    match u {
        UnaryOp::Exp
        | UnaryOp::Log
        | UnaryOp::Sqrt
        | UnaryOp::Rsqrt
        | UnaryOp::Tanh
        | UnaryOp::Logistic
        | UnaryOp::Sin
        | UnaryOp::Cos => true,
        UnaryOp::Neg
        | UnaryOp::Abs
        | UnaryOp::Floor
        | UnaryOp::Ceil
        | UnaryOp::Sign
        | UnaryOp::Not => false,
    }
}

/// The cost of `op` with operands of types `operands` and a result of type
/// `result`. Never fails: a missing operand counts as nothing (the verifier
/// and shape inference reject such graphs before this runs).
pub fn op_cost(op: &Op, operands: &[&TensorType], result: &TensorType) -> OpCost {
    let n = elements(result);
    let mut cost = OpCost {
        flops: 0,
        transcendentals: 0,
        bytes_read: operands.iter().map(|t| bytes(t)).sum(),
        bytes_written: bytes(result),
    };
    match op {
        Op::Parameter { .. } | Op::Constant => return OpCost::default(),
        Op::Unary(u) => {
            if is_transcendental_unary(*u) {
                cost.transcendentals = n;
            } else {
                cost.flops = n;
            }
        }
        Op::Binary(b) => {
            if *b == crate::ir::op::BinaryOp::Pow {
                cost.transcendentals = n;
            } else {
                cost.flops = n;
            }
        }
        Op::Compare(_) | Op::Select | Op::Convert(_) => cost.flops = n,
        Op::Slice { .. } => cost.bytes_read = bytes(result),
        Op::Iota { .. }
        | Op::Broadcast { .. }
        | Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Concatenate { .. }
        | Op::CustomCall { .. } => {}
        Op::Reduce { kind, .. } => {
            let input = operands.first().map_or(0, |t| elements(t));
            let applications = input.saturating_sub(n);
            cost.flops = match kind {
                ReduceKind::Sum | ReduceKind::Max | ReduceKind::Min => applications,
                ReduceKind::Mean => applications.saturating_add(n),
            };
        }
        Op::Dot(dims) => {
            let width = operands.first().map_or(0, |lhs| {
                dims.lhs_contracting
                    .iter()
                    .map(|&d| lhs.dims.get(d).map_or(0, |&x| x as u64))
                    .fold(1u64, u64::saturating_mul)
            });
            cost.flops = FMA_FLOPS.saturating_mul(n).saturating_mul(width);
        }
        Op::Convolution(attrs) => {
            cost.flops = match (operands.first(), operands.get(1)) {
                (Some(x), Some(w)) => convolution_flops(x, w, attrs),
                _ => 0,
            };
        }
    }
    cost
}

/// XLA's `GetConvolutionFlops` for input `[N,C,H,W]`, kernel `[O,C/g,KH,KW]`:
/// 2 × N × O × C/g × Π valid (output, tap) pairs per spatial dimension.
/// Shapes the convolution kernel refuses cost 0 (shape inference rejects
/// them first).
fn convolution_flops(input: &TensorType, kernel: &TensorType, attrs: &ConvAttrs) -> u64 {
    let Ok(geo) = conv_geometry(&input.dims, &kernel.dims, attrs) else {
        return 0;
    };
    let (batch, out_features, in_per_group) = (
        input.dims[0] as u64,
        kernel.dims[0] as u64,
        kernel.dims[1] as u64,
    );
    let mut positions = 1u64;
    for i in 0..2 {
        positions = positions.saturating_mul(valid_positions(
            input.dims[2 + i],
            kernel.dims[2 + i],
            geo.out[i],
            attrs.stride[i],
            attrs.dilation[i],
            geo.pad_lo[i],
        ));
    }
    FMA_FLOPS
        .saturating_mul(batch)
        .saturating_mul(out_features)
        .saturating_mul(in_per_group)
        .saturating_mul(positions)
}

/// Pairs (output `o`, tap `k`) with `0 <= o*stride + k*dilation - pad_lo <
/// input`: for each tap, the outputs form one arithmetic range, so this is
/// `O(taps)`, not `O(taps × outputs)`.
fn valid_positions(
    input: usize,
    taps: usize,
    out: usize,
    stride: usize,
    dilation: usize,
    pad_lo: usize,
) -> u64 {
    if input == 0 || out == 0 || stride == 0 {
        return 0;
    }
    let (input, out, stride, dilation, pad_lo) = (
        input as i128,
        out as i128,
        stride as i128,
        dilation as i128,
        pad_lo as i128,
    );
    let mut count: i128 = 0;
    for k in 0..taps as i128 {
        // o*stride in [pad_lo - k*d, input - 1 + pad_lo - k*d]
        let lo = pad_lo - k * dilation;
        let hi = input - 1 + pad_lo - k * dilation;
        let first = (-((-lo).div_euclid(stride))).max(0);
        let last = hi.div_euclid(stride).min(out - 1);
        count += (last - first + 1).max(0);
    }
    u64::try_from(count).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::op::{BinaryOp, CompareDir, DotDims, Padding};
    use crate::ir::types::DType;
    use proptest::prelude::*;

    fn f32t(dims: &[usize]) -> TensorType {
        TensorType::new(DType::F32, dims.to_vec())
    }

    #[test]
    fn matmul_is_two_m_k_n() {
        let (a, b, r) = (f32t(&[3, 5]), f32t(&[5, 7]), f32t(&[3, 7]));
        let dot = Op::Dot(DotDims {
            lhs_contracting: vec![1],
            rhs_contracting: vec![0],
            ..Default::default()
        });
        let c = op_cost(&dot, &[&a, &b], &r);
        assert_eq!(c.flops, 2 * 3 * 5 * 7);
        assert_eq!(c.transcendentals, 0);
        assert_eq!(c.bytes_read, 4 * (15 + 35));
        assert_eq!(c.bytes_written, 4 * 21);
    }

    #[test]
    fn transcendentals_are_not_flops() {
        let t = f32t(&[10]);
        for u in [
            UnaryOp::Exp,
            UnaryOp::Tanh,
            UnaryOp::Rsqrt,
            UnaryOp::Logistic,
        ] {
            let c = op_cost(&Op::Unary(u), &[&t], &t);
            assert_eq!((c.flops, c.transcendentals), (0, 10), "{u:?}");
        }
        let c = op_cost(&Op::Binary(BinaryOp::Pow), &[&t, &t], &t);
        assert_eq!((c.flops, c.transcendentals), (0, 10));
        let c = op_cost(&Op::Unary(UnaryOp::Neg), &[&t], &t);
        assert_eq!((c.flops, c.transcendentals), (10, 0));
        let p = TensorType::new(DType::Pred, [10]);
        let c = op_cost(&Op::Compare(CompareDir::Lt), &[&t, &t], &p);
        assert_eq!((c.flops, c.bytes_written), (10, 10));
    }

    #[test]
    fn leaves_cost_nothing_and_slices_read_what_they_keep() {
        let t = f32t(&[8, 8]);
        assert_eq!(
            op_cost(&Op::Parameter { index: 0 }, &[], &t),
            OpCost::default()
        );
        assert_eq!(op_cost(&Op::Constant, &[], &t), OpCost::default());
        let half = f32t(&[4, 8]);
        let slice = Op::Slice {
            start: vec![0, 0],
            limit: vec![8, 8],
            stride: vec![2, 1],
        };
        let c = op_cost(&slice, &[&t], &half);
        assert_eq!((c.flops, c.bytes_read, c.bytes_written), (0, 128, 128));
        let tr = op_cost(&Op::Transpose { perm: vec![1, 0] }, &[&t], &t);
        assert_eq!((tr.flops, tr.bytes_read, tr.bytes_written), (0, 256, 256));
    }

    #[test]
    fn reduce_counts_applications_and_mean_its_divides() {
        let (x, r) = (f32t(&[4, 6]), f32t(&[4]));
        let sum = Op::Reduce {
            kind: ReduceKind::Sum,
            dims: vec![1],
        };
        assert_eq!(op_cost(&sum, &[&x], &r).flops, 24 - 4);
        let mean = Op::Reduce {
            kind: ReduceKind::Mean,
            dims: vec![1],
        };
        assert_eq!(op_cost(&mean, &[&x], &r).flops, 24);
    }

    #[test]
    fn same_padding_does_not_count_taps_on_the_padding() {
        // 1-D view: input 4, kernel 3, stride 1, same padding (1, 1): output 4.
        // Taps per output: 2, 3, 3, 2 = 10 valid pairs (12 with the padding).
        assert_eq!(valid_positions(4, 3, 4, 1, 1, 1), 10);
        let x = f32t(&[1, 1, 4, 4]);
        let w = f32t(&[1, 1, 3, 3]);
        let attrs = ConvAttrs {
            padding: Padding::Same,
            ..Default::default()
        };
        assert_eq!(convolution_flops(&x, &w, &attrs), 2 * 10 * 10);
    }

    fn brute_force(input: usize, taps: usize, out: usize, s: usize, d: usize, lo: usize) -> u64 {
        let mut n = 0;
        for o in 0..out {
            for k in 0..taps {
                let i = (o * s + k * d) as i64 - lo as i64;
                n += u64::from(i >= 0 && (i as usize) < input);
            }
        }
        n
    }

    proptest! {
        #[test]
        fn valid_positions_match_brute_force(
            input in 1usize..12, taps in 1usize..5, s in 1usize..4, d in 1usize..3,
            lo in 0usize..4, hi in 0usize..4,
        ) {
            let eff = (taps - 1) * d + 1;
            let padded = input + lo + hi;
            prop_assume!(padded >= eff);
            let out = (padded - eff) / s + 1;
            prop_assert_eq!(
                valid_positions(input, taps, out, s, d, lo),
                brute_force(input, taps, out, s, d, lo)
            );
        }

        #[test]
        fn sums_add_every_field(a in 0u64..1 << 40, b in 0u64..1 << 40) {
            let x = OpCost { flops: a, transcendentals: b, bytes_read: a, bytes_written: b };
            let y = OpCost { flops: b, transcendentals: a, bytes_read: b, bytes_written: a };
            let s: OpCost = [x, y].iter().sum();
            prop_assert_eq!(s.flops, a + b);
            prop_assert_eq!(s.bytes_accessed(), 2 * (a + b));
        }
    }
}
