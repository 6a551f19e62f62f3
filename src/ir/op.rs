//! The op set: what a graph node computes, with its attributes.
//!
//! Elementwise ops (unary, binary, compare, select, convert) broadcast their
//! operands by numpy rules; [`Op::Broadcast`] states a broadcast explicitly.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::types::DType;

/// An elementwise function of one operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnaryOp {
    /// `-x` (wrapping for integers).
    Neg,
    /// `|x|` (wrapping for integers).
    Abs,
    /// `e^x`.
    Exp,
    /// Natural logarithm.
    Log,
    /// Square root.
    Sqrt,
    /// `1 / sqrt(x)`, correctly rounded: one rounding, also for `f32`
    /// ([`FloatElement::rsqrt`](crate::ir::FloatElement::rsqrt)), where
    /// `1 / sqrt` in `f32` rounds twice.
    Rsqrt,
    /// Hyperbolic tangent.
    Tanh,
    /// `1 / (1 + e^-x)`.
    Logistic,
    /// Sine.
    Sin,
    /// Cosine.
    Cos,
    /// Round toward negative infinity.
    Floor,
    /// Round toward positive infinity.
    Ceil,
    /// `-1`, `0` or `1` (`±0` and NaN are kept for floats).
    Sign,
    /// Logical not (pred) or bitwise not (i32).
    Not,
}

/// An elementwise function of two operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b` (integers: truncating; `x / 0 = -1`, as in XLA).
    Div,
    /// Remainder with the sign of `a` (integers: `x % 0 = x`).
    Rem,
    /// Maximum, NaN-propagating.
    Max,
    /// Minimum, NaN-propagating.
    Min,
    /// `a^b` (integers: negative exponents give 0 unless `|a| = 1`).
    Pow,
    /// Logical (pred) or bitwise (i32) and.
    And,
    /// Logical (pred) or bitwise (i32) or.
    Or,
}

impl BinaryOp {
    /// Whether `a op b == b op a` bit for bit, so CSE may sort the operands.
    pub fn is_commutative(self) -> bool {
        matches!(
            self,
            BinaryOp::Add
                | BinaryOp::Mul
                | BinaryOp::Max
                | BinaryOp::Min
                | BinaryOp::And
                | BinaryOp::Or
        )
    }
}

/// The comparison of a compare op; the result is `pred`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompareDir {
    /// `a == b`.
    Eq,
    /// `a != b`.
    Ne,
    /// `a < b`.
    Lt,
    /// `a <= b`.
    Le,
    /// `a > b`.
    Gt,
    /// `a >= b`.
    Ge,
}

/// The reduction of a reduce op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReduceKind {
    /// Sum.
    Sum,
    /// Maximum (NaN-propagating).
    Max,
    /// Minimum (NaN-propagating).
    Min,
    /// Sum divided by the number of reduced elements.
    Mean,
}

/// Dimension numbers of a general dot product.
///
/// The result dimensions are the batch dimensions, then the free lhs
/// dimensions, then the free rhs dimensions (XLA's `DotGeneral` order).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DotDims {
    /// Contracted dimensions of the lhs.
    pub lhs_contracting: Vec<usize>,
    /// Contracted dimensions of the rhs, pairwise with `lhs_contracting`.
    pub rhs_contracting: Vec<usize>,
    /// Batch dimensions of the lhs.
    pub lhs_batch: Vec<usize>,
    /// Batch dimensions of the rhs, pairwise with `lhs_batch`.
    pub rhs_batch: Vec<usize>,
}

/// Spatial padding of a convolution.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Padding {
    /// No padding.
    Valid,
    /// Output size `ceil(input / stride)`, extra padding at the end (XLA/TF `SAME`).
    Same,
    /// `(low, high)` per spatial dimension.
    Explicit(Vec<(usize, usize)>),
}

/// Attributes of a 2-D convolution: input `[N, C, H, W]`, kernel
/// `[O, C / feature_groups, KH, KW]`, output `[N, O, OH, OW]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConvAttrs {
    /// Window strides `[sh, sw]`.
    pub stride: [usize; 2],
    /// Spatial padding.
    pub padding: Padding,
    /// Kernel (rhs) dilation `[dh, dw]`.
    pub dilation: [usize; 2],
    /// Feature groups (`C` and `O` must be divisible by it).
    pub feature_groups: usize,
}

impl Default for ConvAttrs {
    fn default() -> Self {
        ConvAttrs {
            stride: [1, 1],
            padding: Padding::Valid,
            dilation: [1, 1],
            feature_groups: 1,
        }
    }
}

/// What a node computes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Op {
    /// The `index`-th program argument; its type is the node's declared type.
    Parameter {
        /// Position in the argument list.
        index: usize,
    },
    /// A literal (the node's `Literal` component).
    Constant,
    /// Indices along `dim` of the declared type.
    Iota {
        /// The counting dimension.
        dim: usize,
    },
    /// Elementwise unary.
    Unary(UnaryOp),
    /// Elementwise binary (numpy broadcasting).
    Binary(BinaryOp),
    /// Elementwise comparison giving `pred`.
    Compare(CompareDir),
    /// `select(pred, on_true, on_false)`, elementwise.
    Select,
    /// Elementwise conversion to another dtype.
    Convert(DType),
    /// Broadcast to `shape`: operand dimension `i` becomes result dimension
    /// `dims[i]`, or numpy rules (align trailing dimensions) when `dims` is `None`.
    Broadcast {
        /// The result dimensions.
        shape: Vec<usize>,
        /// Explicit dimension mapping.
        dims: Option<Vec<usize>>,
    },
    /// Same elements, new dimensions; at most one `-1` is inferred.
    Reshape {
        /// The result dimensions.
        shape: Vec<i64>,
    },
    /// Permute dimensions: result dimension `i` is operand dimension `perm[i]`.
    Transpose {
        /// The permutation.
        perm: Vec<usize>,
    },
    /// Strided slice `[start, limit)` per dimension.
    Slice {
        /// First index per dimension.
        start: Vec<usize>,
        /// One past the last index per dimension.
        limit: Vec<usize>,
        /// Step per dimension (≥ 1).
        stride: Vec<usize>,
    },
    /// Join operands along `dim`.
    Concatenate {
        /// The joined dimension.
        dim: usize,
    },
    /// Reduce over `dims`, which disappear from the result.
    Reduce {
        /// The reduction.
        kind: ReduceKind,
        /// Reduced dimensions.
        dims: Vec<usize>,
    },
    /// General dot product.
    Dot(DotDims),
    /// 2-D convolution.
    Convolution(ConvAttrs),
    /// An opaque call: never folded, merged by CSE, simplified or fused. Its
    /// type is the node's declared type.
    CustomCall {
        /// The registered target name.
        target: String,
    },
}

impl Op {
    /// The op's name in programs and node labels (`add`, `dot`).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Parameter { .. } => "parameter",
            Op::Constant => "constant",
            Op::Iota { .. } => "iota",
            Op::Unary(u) => match u {
                UnaryOp::Neg => "neg",
                UnaryOp::Abs => "abs",
                UnaryOp::Exp => "exp",
                UnaryOp::Log => "log",
                UnaryOp::Sqrt => "sqrt",
                UnaryOp::Rsqrt => "rsqrt",
                UnaryOp::Tanh => "tanh",
                UnaryOp::Logistic => "logistic",
                UnaryOp::Sin => "sin",
                UnaryOp::Cos => "cos",
                UnaryOp::Floor => "floor",
                UnaryOp::Ceil => "ceil",
                UnaryOp::Sign => "sign",
                UnaryOp::Not => "not",
            },
            Op::Binary(b) => match b {
                BinaryOp::Add => "add",
                BinaryOp::Sub => "sub",
                BinaryOp::Mul => "mul",
                BinaryOp::Div => "div",
                BinaryOp::Rem => "rem",
                BinaryOp::Max => "max",
                BinaryOp::Min => "min",
                BinaryOp::Pow => "pow",
                BinaryOp::And => "and",
                BinaryOp::Or => "or",
            },
            Op::Compare(c) => match c {
                CompareDir::Eq => "eq",
                CompareDir::Ne => "ne",
                CompareDir::Lt => "lt",
                CompareDir::Le => "le",
                CompareDir::Gt => "gt",
                CompareDir::Ge => "ge",
            },
            Op::Select => "select",
            Op::Convert(_) => "convert",
            Op::Broadcast { .. } => "broadcast",
            Op::Reshape { .. } => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Slice { .. } => "slice",
            Op::Concatenate { .. } => "concatenate",
            Op::Reduce { .. } => "reduce",
            Op::Dot(_) => "dot",
            Op::Convolution(_) => "convolution",
            Op::CustomCall { .. } => "custom_call",
        }
    }

    /// The number of operands, or `None` for variadic ops (concatenate, custom call).
    pub fn arity(&self) -> Option<usize> {
        match self {
            Op::Parameter { .. } | Op::Constant | Op::Iota { .. } => Some(0),
            Op::Unary(_)
            | Op::Convert(_)
            | Op::Broadcast { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::Reduce { .. } => Some(1),
            Op::Binary(_) | Op::Compare(_) | Op::Dot(_) | Op::Convolution(_) => Some(2),
            Op::Select => Some(3),
            Op::Concatenate { .. } | Op::CustomCall { .. } => None,
        }
    }

    /// Elementwise ops: each result element depends on the operand elements at
    /// the same (broadcast) position only.
    pub fn is_elementwise(&self) -> bool {
        matches!(
            self,
            Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Convert(_)
        )
    }

    /// Ops the fusion pass may place in a loop-fusion kernel.
    pub fn is_fusible(&self) -> bool {
        self.is_elementwise() || matches!(self, Op::Broadcast { .. } | Op::Iota { .. })
    }

    /// Opaque ops: never folded, merged, simplified or fused.
    pub fn is_opaque(&self) -> bool {
        matches!(self, Op::CustomCall { .. })
    }

    /// Ops that may have an effect besides their result (or give a
    /// different result each time): custom calls. CSE never merges them and
    /// DCE never removes them, even unused (XLA's HloDCE keeps instructions
    /// with side effects for the same reason).
    pub fn has_side_effects(&self) -> bool {
        matches!(self, Op::CustomCall { .. })
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
