//! Errors of checkpoints on disk.

use std::path::PathBuf;
use thiserror::Error;

use crate::persist::SnapshotError;

/// A checkpoint on disk that cannot be written, verified or restored.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The manifest is missing, unparsable or inconsistent.
    #[error("{path}: bad manifest: {reason}")]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A file's length differs from the manifest's.
    #[error("{path}: length {actual} bytes, manifest says {expected} (truncated or extended)")]
    Length {
        /// The file.
        path: PathBuf,
        /// Per the manifest.
        expected: u64,
        /// On disk.
        actual: u64,
    },
    /// A file's SHA-256 differs from the manifest's.
    #[error("{path}: SHA-256 {actual} does not match the manifest's {expected} (corrupted)")]
    Digest {
        /// The file.
        path: PathBuf,
        /// Per the manifest.
        expected: String,
        /// Computed.
        actual: String,
    },
    /// A file the manifest lists is missing.
    #[error("{path}: missing (listed in the manifest)")]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// The checkpoint name would leave the storage root.
    #[error("checkpoint name `{0}` is not a plain name (no `/`, `\\`, `..` or leading `.`)")]
    BadName(String),
    /// No checkpoint in any root verifies.
    #[error("no checkpoint verifies: {0}")]
    NoValidCheckpoint(String),
    /// The snapshot inside is invalid.
    #[error("{path}: {source}")]
    Snapshot {
        /// The world file.
        path: PathBuf,
        /// Why.
        #[source]
        source: SnapshotError,
    },
}
