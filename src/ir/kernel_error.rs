//! [`KernelError`]: every way a kernel refuses its operands, typed so a
//! caller can tell a dtype mismatch from a bad shape or bad attributes, and
//! so ndarray's own error stays the source where it is the cause.

use ndarray::ShapeError;

use super::op::DotDims;
use super::types::{DType, TensorType};

/// A kernel could not run on these operands (wrong dtype, bad shape or attributes).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// An op was given fewer operands than it takes.
    #[error("{op} is missing operand {index}")]
    MissingOperand {
        /// The op as printed.
        op: String,
        /// The missing operand's position.
        index: usize,
    },
    /// A parameter or constant was asked to compute.
    #[error("{op} is a value, not a computation")]
    NotAComputation {
        /// The op as printed.
        op: String,
    },
    /// The scalar evaluator was given an op that is not elementwise.
    #[error("{op} is not an elementwise op on scalars")]
    NotScalar {
        /// The op as printed.
        op: String,
    },
    /// Iota was evaluated without the node's declared type.
    #[error("iota needs its declared type")]
    IotaNeedsType,
    /// A custom call no built-in evaluator implements.
    #[error("custom call target `{target}` has no CPU implementation (known: {known:?})")]
    UnknownCustomCall {
        /// The call target.
        target: String,
        /// The targets the evaluators know.
        known: &'static [&'static str],
    },
    /// An op is not defined for an operand's dtype.
    #[error("{op} is not defined for {dtype}")]
    Undefined {
        /// The op (`Sqrt`, `reduce`).
        op: String,
        /// The operand's dtype.
        dtype: DType,
    },
    /// `not` was applied to a floating-point operand.
    #[error("not is defined for pred and i32")]
    NotOnFloat,
    /// `and`/`or` were applied to floating-point operands.
    #[error("and/or are defined for pred and i32")]
    AndOrOnFloat,
    /// The two operands of a binary op have different dtypes.
    #[error("operand dtypes differ: {lhs} and {rhs}")]
    DTypesDiffer {
        /// The first operand's dtype.
        lhs: DType,
        /// The second operand's dtype.
        rhs: DType,
    },
    /// Operands that must share a dtype do not (`compare operands`,
    /// `select branches`, `dot operands` ...).
    #[error("{operands} must share a {}dtype", if *numeric { "numeric " } else { "" })]
    MixedDTypes {
        /// Which operands.
        operands: &'static str,
        /// Whether the shared dtype must also be numeric.
        numeric: bool,
    },
    /// A select's predicate is not `pred`.
    #[error("select predicate must be pred")]
    PredicateNotPred,
    /// The operands of an elementwise op do not broadcast to one shape.
    #[error("shapes {lhs:?} and {rhs:?} do not broadcast")]
    ShapesDoNotBroadcast {
        /// The first operand's shape.
        lhs: Vec<usize>,
        /// The second operand's shape.
        rhs: Vec<usize>,
    },
    /// An operand would not stretch to the broadcast shape computed for it.
    #[error("broadcast")]
    BroadcastView,
    /// The three operands of a select do not broadcast to one shape.
    #[error("select operands do not broadcast")]
    SelectDoesNotBroadcast,
    /// An explicit broadcast cannot map the operand onto the result shape.
    #[error("cannot broadcast {from:?} to {to:?} with dims {dims:?}")]
    BroadcastTo {
        /// The operand's shape.
        from: Vec<usize>,
        /// The result shape.
        to: Vec<usize>,
        /// The dimension mapping, if one was given.
        dims: Option<Vec<usize>>,
    },
    /// A reshape target has more than one `-1`.
    #[error("reshape {shape:?} has more than one -1")]
    ReshapeUnknowns {
        /// The target as written.
        shape: Vec<i64>,
    },
    /// A reshape target has a negative dimension other than `-1`.
    #[error("reshape dimension {dim} is negative")]
    ReshapeNegative {
        /// The dimension.
        dim: i64,
    },
    /// The `-1` of a reshape target cannot be resolved.
    #[error("cannot infer -1 in reshape {shape:?} of {count} elements")]
    ReshapeCannotInfer {
        /// The target as written.
        shape: Vec<i64>,
        /// The operand's element count.
        count: usize,
    },
    /// A reshape target holds another number of elements than the operand.
    #[error("reshape {shape:?} has {known} elements, the operand has {count}")]
    ReshapeCount {
        /// The target as written.
        shape: Vec<i64>,
        /// The target's element count.
        known: usize,
        /// The operand's element count.
        count: usize,
    },
    /// ndarray refused a reshape.
    #[error("reshape {from:?} to {to:?}: {source}")]
    Reshape {
        /// The operand's shape.
        from: Vec<usize>,
        /// The target shape.
        to: Vec<usize>,
        /// ndarray's error.
        #[source]
        source: ShapeError,
    },
    /// A transpose's permutation is not one of the operand's dimensions.
    #[error("{perm:?} is not a permutation of {rank} dimensions")]
    NotAPermutation {
        /// The permutation.
        perm: Vec<usize>,
        /// The operand's rank.
        rank: usize,
    },
    /// A slice does not fit the operand.
    #[error("slice [{start:?}, {limit:?}) step {stride:?} is out of bounds for {shape:?}")]
    SliceOutOfBounds {
        /// Start indices.
        start: Box<[usize]>,
        /// Limit indices.
        limit: Box<[usize]>,
        /// Strides.
        stride: Box<[usize]>,
        /// The operand's shape.
        shape: Box<[usize]>,
    },
    /// A concatenation without operands.
    #[error("concatenate needs at least one operand")]
    ConcatenateEmpty,
    /// A concatenation dimension beyond the operands' rank.
    #[error("concatenate dimension {dim} is out of range")]
    ConcatenateDim {
        /// The dimension.
        dim: usize,
    },
    /// ndarray refused a concatenation.
    #[error("concatenate along {dim}: {source}")]
    Concatenate {
        /// The dimension.
        dim: usize,
        /// ndarray's error.
        #[source]
        source: ShapeError,
    },
    /// An iota dimension beyond the type's rank.
    #[error("iota dimension {dim} is out of range for {ty}")]
    IotaDim {
        /// The dimension.
        dim: usize,
        /// The declared type.
        ty: TensorType,
    },
    /// Reduction dimensions repeat or exceed the operand's rank.
    #[error("reduce dimensions {dims:?} are invalid for rank {rank}")]
    ReduceDims {
        /// The dimensions.
        dims: Vec<usize>,
        /// The operand's rank.
        rank: usize,
    },
    /// Dot dimension numbers that repeat or exceed the operands' ranks.
    #[error("dot dimension numbers {dims:?} are invalid for shapes {lhs:?} and {rhs:?}")]
    DotDims {
        /// The dimension numbers (boxed, so the error stays small).
        dims: Box<DotDims>,
        /// The lhs shape.
        lhs: Vec<usize>,
        /// The rhs shape.
        rhs: Vec<usize>,
    },
    /// Dot dimension numbers with unpaired batch or contracting dimensions.
    #[error("dot needs as many lhs as rhs batch and contracting dimensions")]
    DotUnpaired,
    /// Paired batch dimensions of a dot have different sizes.
    #[error("dot batch dimensions differ: {lhs} vs {rhs}")]
    DotBatch {
        /// The lhs size.
        lhs: usize,
        /// The rhs size.
        rhs: usize,
    },
    /// Paired contracting dimensions of a dot have different sizes.
    #[error(
        "dot contracting dimensions differ: lhs dim {lhs_dim} is {lhs} but rhs dim {rhs_dim} is {rhs}"
    )]
    DotContracting {
        /// The lhs dimension.
        lhs_dim: usize,
        /// Its size.
        lhs: usize,
        /// The rhs dimension.
        rhs_dim: usize,
        /// Its size.
        rhs: usize,
    },
    /// A convolution's operands are not both of rank 4.
    #[error(
        "convolution needs input [N,C,H,W] and kernel [O,C/g,KH,KW], got {input:?} and {kernel:?}"
    )]
    ConvRank {
        /// The input shape.
        input: Vec<usize>,
        /// The kernel shape.
        kernel: Vec<usize>,
    },
    /// Feature groups that do not split the features evenly.
    #[error(
        "feature_groups {groups} does not divide input features {input} and output features {output} with kernel input features {kernel}"
    )]
    ConvGroups {
        /// The feature groups.
        groups: usize,
        /// Input features.
        input: usize,
        /// Output features.
        output: usize,
        /// Kernel input features.
        kernel: usize,
    },
    /// A zero stride or dilation.
    #[error("convolution stride and dilation must be at least 1")]
    ConvStride,
    /// Explicit padding not given for both spatial dimensions.
    #[error("explicit padding needs (low, high) for both spatial dimensions")]
    ConvPadding,
    /// A convolution window larger than its padded input.
    #[error(
        "convolution window {window} is larger than the padded input {padded} in spatial dimension {dim}"
    )]
    ConvWindow {
        /// The dilated window size.
        window: usize,
        /// The padded input size.
        padded: usize,
        /// The spatial dimension.
        dim: usize,
    },
    /// A tensor of a type was built from the wrong number of values.
    #[error("{ty} needs {needed} values (or one to splat), got {got}")]
    ValueCount {
        /// The type.
        ty: TensorType,
        /// Its element count.
        needed: usize,
        /// The values given.
        got: usize,
    },
    /// ndarray refused to build a result array.
    #[error("{0}")]
    Shape(#[source] ShapeError),
}

// ndarray's `ShapeError` is `PartialEq` over its error kind only, which is
// an equivalence, so kernel errors compare as `Eq` (errors that hold them
// derive it).
impl Eq for KernelError {}
