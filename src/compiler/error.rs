//! [`CompileError`]: every way a program can be rejected. Messages name the
//! node as `node %add.3 (f32[8,128]): ...` and, for files, the file
//! (`adam.ron: node %c: ...`) and where known the line, column and field.

/// A program could not be loaded, verified, compiled or executed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompileError {
    /// The program file could not be read: missing, not a regular file
    /// (a named pipe, a device, a directory), larger than a program file
    /// may be, or unreadable. The message names the file.
    #[error("{0}")]
    Read(crate::files::InputError),
    /// The RON text is malformed or has a field of the wrong type.
    #[error("{file}:{line}:{column}: {message}{}", if field.is_empty() || field == "." { String::new() } else { format!(" (in `{field}`)") })]
    Parse {
        /// The file name (or program name for in-memory text).
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The field path, e.g. `nodes[3].operands`.
        field: String,
        /// What is wrong.
        message: String,
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
    /// A kernel failed while folding or executing a node.
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
    /// The entity is not a program, or its compilation has not produced the requested artifact.
    #[error("{0}")]
    NotCompiled(String),
    /// A compile error restored from a checkpoint: its message, as it was
    /// rendered when the program failed.
    #[error("{0}")]
    Restored(String),
    /// An error in a program file, named with the file as the pod loader
    /// names its files (`FILE: node %c: ...`). The inner error is part of
    /// the message, not a separate cause, so it is printed once.
    #[error("{file}: {error}")]
    InFile {
        /// The file.
        file: String,
        /// What is wrong in it.
        error: Box<CompileError>,
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
