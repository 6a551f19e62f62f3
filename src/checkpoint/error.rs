//! Errors of checkpoints on disk.

use std::path::PathBuf;
use thiserror::Error;

use crate::persist::SnapshotError;

/// A checkpoint on disk that cannot be written, verified or restored.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// Reading or writing a file failed. The message includes the I/O
    /// error's, so the I/O error is a field, not a `source()` (a chain
    /// printed in full would say it twice).
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A checkpoint of this name exists already: checkpoints are never
    /// overwritten.
    #[error("{path}: a checkpoint with this name exists")]
    Exists {
        /// The checkpoint directory.
        path: PathBuf,
    },
    /// The path to write a checkpoint to is taken by something that is not
    /// a checkpoint (a directory of other files, a regular file, ...).
    #[error(
        "{path}: exists and is {found}, not a checkpoint; a checkpoint is never written over \
         anything: choose a new name"
    )]
    Occupied {
        /// The path asked for.
        path: PathBuf,
        /// What is there (`a directory without a manifest`, `a regular file`).
        found: &'static str,
    },
    /// A storage root (or a directory on the way to it) exists and is not a
    /// directory.
    #[error("{path}: is {found}, not a directory (a storage root is a directory of checkpoints)")]
    RootNotDirectory {
        /// The entry that is not a directory.
        path: PathBuf,
        /// What it is (`a regular file`, `a named pipe`, ...).
        found: &'static str,
    },
    /// A directory asked for as one checkpoint is a storage root: it holds
    /// checkpoints instead of being one.
    #[error(
        "{path}: is a storage root holding {count} {noun}, not a checkpoint; the newest is \
         {newest}",
        noun = if *count == 1 { "checkpoint" } else { "checkpoints" },
        newest = newest.display()
    )]
    StorageRoot {
        /// The directory given.
        path: PathBuf,
        /// Checkpoints under it (directories with a manifest that parses).
        count: usize,
        /// The newest of them (by recorded tick).
        newest: PathBuf,
    },
    /// A directory asked for as a checkpoint holds no manifest and no
    /// checkpoints.
    #[error("{path}: not a checkpoint: it has no `manifest.ron`")]
    NotACheckpoint {
        /// The directory given.
        path: PathBuf,
    },
    /// The checkpoint directory does not exist.
    #[error("{path}: no such checkpoint directory")]
    NoDirectory {
        /// The directory asked for.
        path: PathBuf,
    },
    /// Something in a checkpoint is not what a checkpoint holds: the
    /// directory is not a directory, or a file is a symbolic link, a named
    /// pipe, a device or a directory. Nothing that is not a regular file is
    /// opened.
    #[error("{path}: is {found}, not {expected}")]
    NotRegular {
        /// The entry.
        path: PathBuf,
        /// What it is (`a symbolic link`, `a named pipe`, ...).
        found: &'static str,
        /// What it should be (`a regular file`, `a directory`).
        expected: &'static str,
    },
    /// The checkpoint directory holds an entry its manifest does not list.
    #[error("{path}: not listed in the manifest (a checkpoint holds exactly its manifest's files)")]
    Unlisted {
        /// The entry.
        path: PathBuf,
    },
    /// The manifest is missing, unparsable or inconsistent.
    #[error("{path}: bad manifest: {reason}")]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The manifest's RON does not parse (its digest line matched, so it
    /// was written that way or edited with its digest).
    #[error("{path}: bad manifest: {source}")]
    ManifestSyntax {
        /// The manifest file.
        path: PathBuf,
        /// The parser's error, with its line and column.
        #[source]
        source: ron::error::SpannedError,
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
    #[error(
        "checkpoint name {0:?} is not a plain name (no `/`, `\\`, `..`, leading `.`, control or \
         bidirectional characters)"
    )]
    BadName(String),
    /// The checkpoint is of another pod than the one it would restore into.
    #[error(
        "{path}: the checkpoint is of pod `{checkpoint}`, but this pod is `{live}` (a checkpoint \
         restores only into a pod of its own topology)"
    )]
    OtherPod {
        /// The checkpoint directory.
        path: PathBuf,
        /// The manifest's pod.
        checkpoint: String,
        /// The live pod's name.
        live: String,
    },
    /// No checkpoint in any root verifies.
    #[error("no checkpoint verifies: {0}")]
    NoValidCheckpoint(String),
    /// The snapshot inside is invalid (the message includes the
    /// snapshot error's, which is a field for the same reason as in
    /// [`CheckpointError::Io`]).
    #[error("{path}: {error}")]
    Snapshot {
        /// The world file.
        path: PathBuf,
        /// Why.
        error: SnapshotError,
    },
}

impl From<CheckpointError> for crate::error::OptimError {
    fn from(error: CheckpointError) -> Self {
        crate::error::OptimError::new(crate::error::ErrorKind::Checkpoint, error)
    }
}
