//! The crate's one error type.
//!
//! Each domain owns a `thiserror` enum that names the offending element (a
//! file and line, a device, a node): `TopologyError`, `MemoryError`,
//! `OptimizerError`, `ShardingError`, `ModelError`, ... [`OptimError`] carries any one
//! of them whole, with its [`ErrorKind`], the way [`std::io::Error`]
//! carries any error: it lives in the bottom layer, so every layer —
//! the optimizers' [`Optimizer::step`](crate::Optimizer::step) included —
//! returns the same type, and generic code over optimizers returns it
//! unchanged. Each domain converts its own error into it (`?` does), and
//! the domain error comes back with [`OptimError::downcast_ref`] or
//! [`OptimError::downcast`]:
//!
//! ```
//! use ndarray::Array1;
//! use optirs_tpu::error::{ErrorKind, OptimError};
//! use optirs_tpu::optimizers::{OptimizerError, SGD};
//! use optirs_tpu::Optimizer;
//!
//! let mut sgd = SGD::new(0.1f32);
//! let err: OptimError = sgd.step(&Array1::zeros(3), &Array1::zeros(2)).unwrap_err();
//! assert_eq!(err.kind(), ErrorKind::Optimizer);
//! assert!(matches!(
//!     err.downcast_ref::<OptimizerError>(),
//!     Some(OptimizerError::ShapeMismatch { .. })
//! ));
//! ```

use std::error::Error as StdError;
use std::fmt;

use thiserror::Error;

/// Result alias used across the crate.
pub type Result<T, E = OptimError> = std::result::Result<T, E>;

/// Which domain an error comes from (what [`OptimError::kind`] says). The
/// error itself is the domain's own type, reachable by downcasting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A configuration value is out of range or inconsistent ([`InvalidConfig`]).
    InvalidConfig,
    /// The operation needs a vendor TPU runtime, which this engine never
    /// links, or is refused by design ([`Unsupported`]).
    Unsupported,
    /// A schedule could not be built, e.g. an ambiguous system order
    /// ([`crate::schedule::ScheduleError`]).
    Schedule,
    /// An input file could not be read (`files::InputError`).
    Io,
    /// A pod file could not be read, parsed or accepted (`TopologyError`).
    Topology,
    /// A device's HBM cannot hold what was asked, or a device has no heap
    /// (`MemoryError`).
    Memory,
    /// A message could not be sent, or a rank of a split pod failed
    /// (`TransportError`).
    Transport,
    /// An optimizer step was refused: params and grads of different
    /// shapes, state built for another shape, an invalid state
    /// (`OptimizerError`).
    Optimizer,
    /// A fault could not be injected, or a device is down (`FaultError`).
    Fault,
    /// A collective could not run, or failed before it completed
    /// (`CollectiveError`).
    Collective,
    /// A barrier request was refused (`BarrierError`).
    Barrier,
    /// A world snapshot could not be taken or restored (`SnapshotError`).
    Snapshot,
    /// A checkpoint on disk could not be written, verified or restored
    /// (`CheckpointError`).
    Checkpoint,
    /// A program could not be compiled (`CompileError`).
    Compile,
    /// A compiled program failed while running (`ExecError`).
    Exec,
    /// A sharded model could not be built or stepped, or a step failed in
    /// flight (`ShardingError`).
    Sharding,
    /// A goodput simulation was refused: an input out of range, or a pod
    /// whose step cannot be modeled (`GoodputError`).
    Goodput,
    /// A model description could not be read, parsed or accepted, or a
    /// figure derived from it is out of range (`ModelError`).
    Model,
}

/// Every error the engine returns: a [`ErrorKind`] and the domain's own
/// error, kept whole (never flattened into a string).
///
/// `Display` is the domain error's message, and
/// [`source`](StdError::source) is the domain error itself, so walking the
/// chain reaches the original cause (the I/O error, the field, the device);
/// a printer that skips a cause its message already contains says each
/// once. The domain error is also [`OptimError::get_ref`] /
/// [`OptimError::downcast_ref`].
pub struct OptimError {
    kind: ErrorKind,
    error: Box<dyn StdError + Send + Sync + 'static>,
}

impl OptimError {
    /// Wraps `error` as an error of `kind`. Domains call this in their
    /// `From` conversions.
    pub fn new(kind: ErrorKind, error: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        OptimError {
            kind,
            error: error.into(),
        }
    }

    /// A configuration value out of range or inconsistent.
    pub fn invalid_config(reason: impl Into<String>) -> Self {
        OptimError::new(ErrorKind::InvalidConfig, InvalidConfig(reason.into()))
    }

    /// An operation this engine does not do, and why.
    pub fn unsupported(operation: impl Into<String>, reason: impl Into<String>) -> Self {
        OptimError::new(
            ErrorKind::Unsupported,
            Unsupported {
                operation: operation.into(),
                reason: reason.into(),
            },
        )
    }

    /// Which domain the error comes from.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The domain's error.
    pub fn get_ref(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.error
    }

    /// Whether the domain's error is an `E`.
    pub fn is<E: StdError + 'static>(&self) -> bool {
        self.error.is::<E>()
    }

    /// The domain's error as an `E`, if it is one.
    pub fn downcast_ref<E: StdError + 'static>(&self) -> Option<&E> {
        self.error.downcast_ref::<E>()
    }

    /// The domain's error as an `E`, or this error back if it is not one.
    pub fn downcast<E: StdError + Send + Sync + 'static>(self) -> Result<E, OptimError> {
        let kind = self.kind;
        self.error
            .downcast::<E>()
            .map(|e| *e)
            .map_err(|error| OptimError { kind, error })
    }

    /// The domain's error, boxed.
    pub fn into_inner(self) -> Box<dyn StdError + Send + Sync + 'static> {
        self.error
    }
}

impl fmt::Display for OptimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl fmt::Debug for OptimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OptimError")
            .field("kind", &self.kind)
            .field("error", &self.error)
            .finish()
    }
}

impl StdError for OptimError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.error)
    }
}

/// A configuration value is out of range or inconsistent.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid configuration: {0}")]
pub struct InvalidConfig(pub String);

/// An operation this engine does not do: it needs a vendor TPU runtime, or
/// it is refused by design.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{operation} is not supported: {reason}")]
pub struct Unsupported {
    /// What was asked for.
    pub operation: String,
    /// Why it cannot be done here.
    pub reason: String,
}

impl From<InvalidConfig> for OptimError {
    fn from(error: InvalidConfig) -> Self {
        OptimError::new(ErrorKind::InvalidConfig, error)
    }
}

impl From<Unsupported> for OptimError {
    fn from(error: Unsupported) -> Self {
        OptimError::new(ErrorKind::Unsupported, error)
    }
}

/// The known name nearest to `name`, if one is near enough to be what was
/// meant: the same but for case, or a few edits away (one edit for short
/// names, one more per four characters). For the "did you mean" of an
/// unknown name's message.
pub fn nearest_name<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let wanted = name.trim().to_lowercase();
    let length = wanted.chars().count();
    if length == 0 {
        return None;
    }
    let limit = 1 + length / 4;
    known
        .into_iter()
        .map(|candidate| (edit_distance(&wanted, &candidate.to_lowercase()), candidate))
        .filter(|&(distance, _)| distance <= limit && distance < length)
        .min_by_key(|&(distance, _)| distance)
        .map(|(_, candidate)| candidate)
}

/// `; did you mean `NAME`?` for the nearest known name, or nothing.
pub fn did_you_mean<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> String {
    nearest_name(name, known)
        .map(|near| format!("; did you mean `{near}`?"))
        .unwrap_or_default()
}

/// Edits from `a` to `b` in characters: an insertion, a deletion, a
/// substitution or two neighbours swapped cost 1, but a digit for another
/// digit costs 2 (`v9` is another number, not a slip for `v2`).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let (x, y) = (a[i - 1], b[j - 1]);
            let substitute = match (x == y, x.is_ascii_digit() && y.is_ascii_digit()) {
                (true, _) => 0,
                (false, true) => 2,
                (false, false) => 1,
            };
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + substitute);
            if i > 1 && j > 1 && x == b[j - 2] && a[i - 2] == y {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_domain_error_is_kept_whole_and_comes_back() {
        let err = OptimError::unsupported("live migration", "it needs a vendor runtime");
        assert_eq!(err.kind(), ErrorKind::Unsupported);
        assert_eq!(
            err.to_string(),
            "live migration is not supported: it needs a vendor runtime"
        );
        assert!(err.is::<Unsupported>());
        assert!(err.downcast_ref::<InvalidConfig>().is_none());
        let err = err.downcast::<InvalidConfig>().unwrap_err();
        let back = err.downcast::<Unsupported>().unwrap();
        assert_eq!(back.operation, "live migration");
    }

    #[test]
    fn the_source_is_the_domain_error_so_a_chain_reaches_its_cause() {
        #[derive(Debug, Error)]
        #[error("cannot read the plan: {0}")]
        struct Domain(#[source] std::io::Error);
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let err = OptimError::new(ErrorKind::Io, Domain(io));
        let domain = err.source().expect("the domain error");
        assert_eq!(domain.to_string(), err.to_string());
        assert!(domain.is::<Domain>());
        let cause = domain.source().expect("the io error");
        assert!(cause.is::<std::io::Error>());
        assert!(cause.source().is_none());
    }

    #[test]
    fn a_near_name_is_suggested_and_a_far_one_is_not() {
        let known = ["v4-8", "v5e-16", "v5p-128", "fsdp", "adam"];
        assert_eq!(nearest_name("v5e16", known), Some("v5e-16"));
        assert_eq!(nearest_name("V4-8", known), Some("v4-8"));
        assert_eq!(nearest_name("fsd", known), Some("fsdp"));
        assert_eq!(nearest_name("adamm", known), Some("adam"));
        assert_eq!(nearest_name("hots", ["chip", "host"]), Some("host"));
        assert_eq!(nearest_name("v9", ["v2", "v3", "v4"]), None);
        assert_eq!(nearest_name("", known), None);
        assert_eq!(nearest_name("zz", known), None);
        assert_eq!(nearest_name("/no/such/pod.ron", known), None);
        assert_eq!(did_you_mean("fsdq", known), "; did you mean `fsdp`?");
        assert_eq!(did_you_mean("lamb", ["sgd"]), "");
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
