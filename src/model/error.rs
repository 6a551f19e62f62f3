//! Why a model description was refused, naming the file, line and field as
//! pod files do (`TopologyError`).

use thiserror::Error;

/// A model file that could not be read, parsed or accepted, or a figure
/// derived from a model that is out of range.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The file could not be read: missing, not a regular file, larger than
    /// a model file may be, or unreadable. The message names the file.
    #[error("cannot read model file {0}")]
    Read(crate::files::InputError),
    /// The text is not a well-formed model file (an unknown remat policy
    /// lands here, with serde's list of the valid ones).
    #[error("{origin}:{line}:{column}: in `{field}`: {message}")]
    Syntax {
        /// The file name, or what the text came from.
        origin: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The field being read (`remat`), or `Model` at top level.
        field: String,
        /// What the parser expected.
        message: String,
    },
    /// The file parses but describes a model that cannot be built.
    #[error("{origin}{}: `{field}`: {problem}", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Invalid {
        /// The file name, or what the text came from.
        origin: String,
        /// The line the field is on, when it could be found.
        line: Option<usize>,
        /// The offending field (`kv_heads`).
        field: String,
        /// What is wrong.
        problem: String,
    },
    /// No bundled model has this name.
    #[error("no bundled model named `{name}` (bundled: {known})")]
    UnknownModel {
        /// What was asked for.
        name: String,
        /// The bundled names, comma-separated.
        known: String,
    },
    /// `per_device_batch × chips` is not a whole number of sequences, or
    /// there are no chips.
    #[error(
        "model `{model}`: per_device_batch {per_device_batch:e} x {chips} chips = {product:e} \
         is not a positive whole number of sequences"
    )]
    FractionalGlobalBatch {
        /// The model's name.
        model: String,
        /// Its per-device batch.
        per_device_batch: f64,
        /// The chip count asked for.
        chips: u64,
        /// Their product.
        product: f64,
    },
    /// A layer program the compiler refused (a tensor larger than the IR
    /// allows, at these dimensions and tokens).
    #[error("model `{model}`: the {program} program: {source}")]
    Program {
        /// The model's name.
        model: String,
        /// Which program (`layer_forward`).
        program: String,
        /// What the compiler said.
        source: Box<crate::compiler::CompileError>,
    },
    /// The published-runs table could not be parsed or is inconsistent.
    #[error("published table {origin}: {problem}")]
    Published {
        /// Where the table came from.
        origin: String,
        /// What is wrong.
        problem: String,
    },
}

impl From<ModelError> for crate::error::OptimError {
    fn from(error: ModelError) -> Self {
        crate::error::OptimError::new(crate::error::ErrorKind::Model, error)
    }
}
