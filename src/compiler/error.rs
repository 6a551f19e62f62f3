//! [`CompileError`]: every way a program can be rejected. Messages name the
//! node as `node %add.3 (f32[8,128]): ...` and, for files, the file
//! (`adam.ron: node %c: ...`) and where known the line, column and field.

use crate::ir::{DType, KernelError, TensorType};

/// A program could not be loaded, verified, compiled or executed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompileError {
    /// The program file could not be read: missing, not a regular file
    /// (a named pipe, a device, a directory), larger than a program file
    /// may be, or unreadable. The message names the file.
    #[error("{0}")]
    Read(#[source] crate::files::InputError),
    /// The RON text is malformed or has a field of the wrong type.
    #[error("{file}:{line}:{column}: {source}{}", if field.is_empty() || field == "." { String::new() } else { format!(" (in `{field}`)") })]
    Parse {
        /// The file name (or program name for in-memory text).
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The field path, e.g. `nodes[3].operands`.
        field: String,
        /// What is wrong: the RON parser's error (boxed: it is large).
        #[source]
        source: Box<ron::Error>,
    },
    /// A node names an op this compiler does not know.
    #[error("node %{node}: unknown op `{op}`; known ops: {known}")]
    UnknownOp {
        /// The node's name.
        node: String,
        /// The op as written.
        op: String,
        /// The known op names.
        known: String,
    },
    /// A node's attributes are missing or malformed, or it names an operand
    /// that does not exist.
    #[error("node {node}: {message}")]
    InvalidNode {
        /// The node label (`%name` or `%name (type)`).
        node: String,
        /// What is wrong and what to write instead.
        message: String,
    },
    /// The verifier found structural violations (all of them are listed).
    #[error("program `{program}` is invalid ({} violation{}):\n  {}", violations.len(), if violations.len() == 1 { "" } else { "s" }, violations.join("\n  "))]
    Invalid {
        /// The program name.
        program: String,
        /// One line per violation, each naming its node.
        violations: Vec<String>,
    },
    /// Shape or dtype inference failed.
    #[error("node {node}: {message}")]
    Shape {
        /// The node label.
        node: String,
        /// The mismatch.
        message: String,
    },
    /// Shape or dtype inference refused a node's operands.
    #[error("node {node}: {source}")]
    Inference {
        /// The node as written (`%add.3 = add(f32[8], f32[4])`).
        node: String,
        /// What inference refused.
        #[source]
        source: InferenceError,
    },
    /// A kernel refused a node's operands while folding or executing it.
    #[error("node {node}: {source}")]
    Kernel {
        /// The node label (or the lowered kernel's name).
        node: String,
        /// The kernel's error.
        #[source]
        source: crate::ir::KernelError,
    },
    /// A node could not be evaluated for a reason of the graph, not of a
    /// kernel (a cycle, an operand never computed).
    #[error("node {node}: {message}")]
    Evaluate {
        /// The node label.
        node: String,
        /// The kernel's message.
        message: String,
    },
    /// A pass left the graph in a state the verifier rejects (an internal bug).
    #[error("pass `{pass}` broke the graph:\n  {}", violations.join("\n  "))]
    PassBrokeGraph {
        /// The pass name.
        pass: &'static str,
        /// The verifier's findings.
        violations: Vec<String>,
    },
    /// A pass name given to disable is unknown or required.
    #[error("pass `{name}` cannot be disabled; optional passes: {optional}")]
    UnknownPass {
        /// The name given.
        name: String,
        /// The passes that may be disabled.
        optional: String,
    },
    /// Executable arguments do not match the program's parameters.
    #[error("{0}")]
    Arguments(String),
    /// An executable was given another number of arguments than it has
    /// parameters.
    #[error("{0}")]
    ArgumentCount(#[source] ArgumentCount),
    /// The entity is not a program, or its compilation has not produced the requested artifact.
    #[error("{0}")]
    NotCompiled(String),
    /// A compile error restored from a checkpoint: its message, as it was
    /// rendered when the program failed.
    #[error("{0}")]
    Restored(String),
    /// An error in a program file, named with the file as the pod loader
    /// names its files (`FILE: node %c: ...`). The inner error is part of
    /// the message and also its source, so a chain reaches the node's own
    /// error (a printer that skips a cause its message contains prints it
    /// once).
    #[error("{file}: {error}")]
    InFile {
        /// The file.
        file: String,
        /// What is wrong in it.
        #[source]
        error: Box<CompileError>,
    },
}

/// An executable was given another number of arguments than it has
/// parameters. Every evaluator of an executable checks this first.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("program `{program}` takes {expected} arguments, got {got}")]
pub struct ArgumentCount {
    /// The program's name.
    pub program: String,
    /// Its parameter count.
    pub expected: usize,
    /// The arguments given.
    pub got: usize,
}

/// Why shape and dtype inference refused a node: the operand types it was
/// given do not fit the op.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InferenceError {
    /// The node has fewer operands than its op takes.
    #[error("missing operand {index}")]
    MissingOperand {
        /// The missing operand's position.
        index: usize,
    },
    /// A parameter or custom call without a declared type.
    #[error("needs a declared type")]
    NeedsDeclaredType,
    /// An iota without a declared type.
    #[error("iota needs a declared type")]
    IotaNeedsDeclaredType,
    /// An iota dimension beyond the declared rank.
    #[error("iota dimension {dim} is out of range for {ty}")]
    IotaDim {
        /// The dimension.
        dim: usize,
        /// The declared type.
        ty: TensorType,
    },
    /// A constant node without its literal.
    #[error("constant has no literal")]
    NoLiteral,
    /// Two operands that must share a dtype do not.
    #[error("operand dtypes differ: {lhs} and {rhs}")]
    DTypesDiffer {
        /// The first operand's type.
        lhs: TensorType,
        /// The other operand's type.
        rhs: TensorType,
    },
    /// Operand shapes that do not broadcast to one shape.
    #[error("operand shapes {lhs:?} and {rhs:?} do not broadcast")]
    DoNotBroadcast {
        /// The first shape.
        lhs: Vec<usize>,
        /// The other shape.
        rhs: Vec<usize>,
    },
    /// The op is not defined for the operands' dtype.
    #[error("{op} is not defined for {dtype}")]
    Undefined {
        /// The op's name.
        op: &'static str,
        /// The operands' dtype.
        dtype: DType,
    },
    /// A select's predicate is not `pred`.
    #[error("select predicate must be pred, got {ty}")]
    PredicateNotPred {
        /// The predicate's type.
        ty: TensorType,
    },
    /// A broadcast that cannot map its operand onto the result shape.
    #[error("cannot broadcast {from} to {to:?} with dims {dims:?}")]
    BroadcastTo {
        /// The operand's type.
        from: TensorType,
        /// The result shape.
        to: Vec<usize>,
        /// The dimension mapping, if given.
        dims: Option<Vec<usize>>,
    },
    /// A transpose whose permutation does not fit the operand.
    #[error("{perm:?} is not a permutation of the dimensions of {ty}")]
    NotAPermutation {
        /// The permutation.
        perm: Vec<usize>,
        /// The operand's type.
        ty: TensorType,
    },
    /// Slice bounds of another rank than the operand.
    #[error("slice needs start, limit and stride of length {rank}")]
    SliceRank {
        /// The operand's rank.
        rank: usize,
    },
    /// A slice that does not fit one dimension of the operand.
    #[error("slice [{start}, {limit}) step {stride} is out of bounds for dimension {dim} of {ty}")]
    SliceOutOfBounds {
        /// Start index.
        start: usize,
        /// Limit index.
        limit: usize,
        /// Stride.
        stride: usize,
        /// The dimension.
        dim: usize,
        /// The operand's type.
        ty: TensorType,
    },
    /// A concatenation dimension beyond the first operand's rank.
    #[error("concatenate dimension {dim} is out of range for {ty}")]
    ConcatenateDim {
        /// The dimension.
        dim: usize,
        /// The first operand's type.
        ty: TensorType,
    },
    /// Operands whose other dimensions differ.
    #[error("cannot concatenate {first} and {other} along {dim}")]
    Concatenate {
        /// The first operand's type.
        first: TensorType,
        /// The operand that does not fit.
        other: TensorType,
        /// The dimension.
        dim: usize,
    },
    /// Reduction dimensions that repeat or exceed the operand's rank.
    #[error("reduce dimensions {dims:?} are invalid for {ty}")]
    ReduceDims {
        /// The dimensions.
        dims: Vec<usize>,
        /// The operand's type.
        ty: TensorType,
    },
    /// The kernels' shape rules refused (reshape, dot and convolution
    /// dimensions).
    #[error("{0}")]
    Kernel(#[from] KernelError),
    /// A result larger than a program may describe.
    #[error("{ty} has more than {limit} elements")]
    TooLarge {
        /// The result type.
        ty: TensorType,
        /// The element limit.
        limit: usize,
    },
}

impl CompileError {
    /// `self` with the program file named, unless it already names it
    /// (read and parse errors carry their path, line and column).
    pub fn in_file(self, file: &str) -> CompileError {
        match self {
            e @ (CompileError::Read(_)
            | CompileError::Parse { .. }
            | CompileError::InFile { .. }) => e,
            e => CompileError::InFile {
                file: file.to_owned(),
                error: Box::new(e),
            },
        }
    }

    /// The error itself, without the file [`CompileError::in_file`] named.
    pub fn without_file(&self) -> &CompileError {
        match self {
            CompileError::InFile { error, .. } => error.without_file(),
            e => e,
        }
    }
}

impl From<CompileError> for crate::error::OptimError {
    fn from(error: CompileError) -> Self {
        crate::error::OptimError::new(crate::error::ErrorKind::Compile, error)
    }
}
