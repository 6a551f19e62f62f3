//! Element types and reduction operators.
//!
//! Integer reductions use wrapping (two's-complement) arithmetic, as NCCL's
//! integer reductions do: the result of a sum or product is exact modulo 2³²
//! and therefore independent of the order in which the ring combines ranks.
//! Float reductions follow IEEE 754; a ring combines ranks in a different
//! order than a left-to-right loop, so float sums and products agree with a
//! naive reduction only within rounding.
//!
//! `Max` and `Min` on floats use [`f32::max`]/[`f32::min`] (IEEE `maxNum`):
//! a NaN operand is ignored unless every operand is NaN.
//!
//! `Mean` is a sum followed by one division by the number of ranks, done by
//! the rank that finishes the reduction of a chunk. For `i32` the division
//! truncates toward zero (Rust's `/`), applied to the wrapped sum.

use serde::{Deserialize, Serialize};

pub use crate::ir::ReduceElement as Element;

/// A reduction operator, as in `ncclRedOp_t`.
///
/// * Integers wrap (two's complement), as NCCL's integer reductions do: a
///   sum or product is exact modulo 2³² and independent of the order the
///   ring combines ranks in.
/// * Floats follow IEEE 754. The ring combines ranks in another order than
///   a left-to-right loop, so float sums and products match
///   [`naive_reduce`] within rounding. `Max`/`Min` use `f32::max`/`f32::min`
///   (IEEE `maxNum`): a NaN operand is ignored unless all are NaN.
/// * `Mean` is a sum, then one division by the number of ranks by the rank
///   that completes each chunk; for `i32` the division truncates toward
///   zero and applies to the wrapped sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ReduceOp {
    /// Element-wise sum (wrapping for integers).
    Sum,
    /// Sum divided by the number of participating ranks (truncating for integers).
    Mean,
    /// Element-wise maximum.
    Max,
    /// Element-wise minimum.
    Min,
    /// Element-wise product (wrapping for integers).
    Product,
}

impl ReduceOp {
    /// Every operator, for tests and command-line parsing.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Product,
    ];

    /// The nccl-tests name of the operator (`sum`, `avg`, `max`, `min`, `prod`).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "avg",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Product => "prod",
        }
    }
}

/// `acc[i] = op(acc[i], x[i])` for the combining part of `op` (`Mean` sums):
/// one pass of [`combine_in_order`]'s loop with one operand, so it runs on
/// the same AVX2 build where the CPU has it. Every element sees the same
/// operations in the same order at any vector width, so the results are
/// the same bits either way.
#[inline]
pub(crate) fn accumulate<T: Element>(op: ReduceOp, acc: &mut [T], x: &[T]) {
    debug_assert_eq!(acc.len(), x.len());
    fused_from(op, acc, None, [x]);
}

/// [`accumulate`] as compiled for the target alone, the reference the wide
/// build is tested against.
#[cfg(test)]
pub(super) fn accumulate_portable<T: Element>(op: ReduceOp, acc: &mut [T], x: &[T]) {
    fused_from_portable(op, acc, None, [x]);
}

/// Operands [`combine_in_order`] combines in one pass.
const COMBINE_WIDTH: usize = 8;

/// `acc[i] = op(…op(op(first[i], rest[0][i]), rest[1][i])…)`: `first`
/// copied, then every operand of `rest` combined in order, exactly as a
/// copy and one [`accumulate`] per operand (the same association, so the
/// same float results), but in `1 + ⌈(rest.len() − 7) / 8⌉` passes over
/// `acc` instead of `1 + rest.len()`: the copy and the first seven operands
/// in one, then eight at a time.
pub(crate) fn combine_in_order<T: Element>(
    op: ReduceOp,
    acc: &mut [T],
    first: &[T],
    rest: &[&[T]],
) {
    let (head, tail) = rest.split_at(rest.len().min(COMBINE_WIDTH - 1));
    combine_pass(op, acc, Some(first), head);
    for group in tail.chunks(COMBINE_WIDTH) {
        combine_pass(op, acc, None, group);
    }
}

/// One pass of [`combine_in_order`] over at most [`COMBINE_WIDTH`]
/// operands, starting from `init` (or from `acc` itself). Compiled for
/// AVX2 where the CPU has it ([`fused_from`]). On the 2-core reference
/// machine (`optirs-tpu collectives assets/pods/examples/v2-4x2-custom.ron --op reduce-scatter`, paired runs)
/// that took a 4 MiB-per-rank reduce-scatter (32 MiB in all, the size of
/// the L3) from 0.97–1.30 ms to 0.84–1.27 ms. At 16 MiB per rank the pass
/// took 2.8–4.1 ms either way: 0.94–1.10× the old copy floor, about 1.5×
/// the streaming floor (`BENCHMARKS.md`, "The streaming floor").
fn combine_pass<T: Element>(op: ReduceOp, acc: &mut [T], init: Option<&[T]>, xs: &[&[T]]) {
    macro_rules! with_width {
        ($($k:literal)*) => {
            match xs.len() {
                $($k => {
                    let xs: [&[T]; $k] = xs.try_into().expect("the width matched");
                    fused_from(op, acc, init, xs)
                })*
                _ => unreachable!("at most COMBINE_WIDTH operands per pass"),
            }
        };
    }
    with_width!(0 1 2 3 4 5 6 7 8);
}

/// `acc[i] = op(…op(start[i], xs[0][i])…, xs[K−1][i])` with `start` the
/// `init` slice or `acc` itself. The `match` on `op` sits outside the loops
/// so each is a plain element-wise kernel the compiler vectorizes.
#[inline]
fn fused_from<T: Element, const K: usize>(
    op: ReduceOp,
    acc: &mut [T],
    init: Option<&[T]>,
    xs: [&[T]; K],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected on this CPU.
        unsafe { fused_from_avx2(op, acc, init, xs) };
        return;
    }
    fused_from_portable(op, acc, init, xs);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fused_from_avx2<T: Element, const K: usize>(
    op: ReduceOp,
    acc: &mut [T],
    init: Option<&[T]>,
    xs: [&[T]; K],
) {
    fused_from_portable(op, acc, init, xs);
}

#[inline(always)]
fn fused_from_portable<T: Element, const K: usize>(
    op: ReduceOp,
    acc: &mut [T],
    init: Option<&[T]>,
    xs: [&[T]; K],
) {
    let len = acc.len();
    let xs = xs.map(|x| &x[..len]);
    macro_rules! fused {
        ($f:expr) => {
            match init {
                Some(init) => {
                    for ((a, &v0), i) in acc.iter_mut().zip(&init[..len]).zip(0..) {
                        let mut v = v0;
                        for x in &xs {
                            v = $f(v, x[i]);
                        }
                        *a = v;
                    }
                }
                None => {
                    for (i, a) in acc.iter_mut().enumerate() {
                        let mut v = *a;
                        for x in &xs {
                            v = $f(v, x[i]);
                        }
                        *a = v;
                    }
                }
            }
        };
    }
    match op {
        ReduceOp::Sum | ReduceOp::Mean => fused!(T::add),
        ReduceOp::Product => fused!(T::mul),
        ReduceOp::Max => fused!(T::max),
        ReduceOp::Min => fused!(T::min),
    }
}

/// Divides every element by `n` (the `Mean` epilogue).
#[inline]
pub(crate) fn divide_all<T: Element>(xs: &mut [T], n: usize) {
    for x in xs {
        *x = x.div_count(n);
    }
}

/// The reference every collective is tested against: rank 0, then rank 1, …
/// combined left to right, then divided by the rank count for `Mean`.
///
/// Returns an empty vector for no inputs. Inputs shorter than the first are
/// an error of the caller; this helper reduces the common prefix.
pub fn naive_reduce<T: Element>(inputs: &[&[T]], op: ReduceOp) -> Vec<T> {
    let Some((first, rest)) = inputs.split_first() else {
        return Vec::new();
    };
    let len = inputs.iter().map(|x| x.len()).min().unwrap_or(0);
    let mut acc = first[..len].to_vec();
    for x in rest {
        accumulate(op, &mut acc, &x[..len]);
    }
    if op == ReduceOp::Mean {
        divide_all(&mut acc, inputs.len());
    }
    acc
}
