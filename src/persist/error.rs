//! Checkpoint errors: each names the file, the column or the entity.

use thiserror::Error;

/// A snapshot that cannot be taken, verified or restored.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// A component refers to an entity the snapshot does not hold.
    #[error("{what} refers to entity {entity}, which is not part of the engine's world")]
    DanglingEntity {
        /// The referring field.
        what: &'static str,
        /// The entity.
        entity: String,
    },
    /// A stored reference points past the snapshot's entities.
    #[error("{what} refers to dense entity {dense}, but the snapshot has {count} entities")]
    DanglingDenseId {
        /// The referring field.
        what: &'static str,
        /// The id.
        dense: u32,
        /// Entities in the snapshot.
        count: u32,
    },
    /// Parts of one world do not fit together, as the domain that merges
    /// the column reports it (its error kept whole).
    #[error("the parts of the world disagree on `{column}`: {source}")]
    PartsUnfit {
        /// Component or resource name.
        column: String,
        /// The merging domain's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Parts of one world (from the processes that each ran some of it)
    /// do not fit together.
    #[error("the parts of the world disagree on `{column}`: {reason}")]
    PartsDisagree {
        /// Component or resource name.
        column: String,
        /// Which parts, and how.
        reason: String,
    },
    /// A column's bytes do not decode.
    #[error("column `{column}` does not decode: {reason}")]
    Corrupt {
        /// Component or resource name.
        column: String,
        /// The decoder's message.
        reason: String,
    },
    /// A column's bytes are not the encoding of its type.
    #[error("column `{column}` does not decode: {source}")]
    Undecodable {
        /// Component or resource name (`<world>` for the snapshot itself).
        column: String,
        /// The decoder's error.
        #[source]
        source: postcard::Error,
    },
    /// A column decodes, but its value breaks an invariant the loaders
    /// check for files people write (a forged file's digest matches too).
    #[error("column `{column}` does not decode: {source}")]
    Invalid {
        /// Component or resource name.
        column: String,
        /// The invariant it breaks.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The snapshot lacks a column the engine needs, or has one it does not know.
    #[error("snapshot {problem} column `{column}`")]
    ColumnMismatch {
        /// `lacks the` / `has an unknown`.
        problem: &'static str,
        /// The column.
        column: String,
    },
    /// The snapshot was written by another format version.
    #[error(
        "snapshot format version {found} is not supported (this build reads version {supported})"
    )]
    UnsupportedVersion {
        /// In the snapshot.
        found: u32,
        /// This build's.
        supported: u32,
    },
    /// A resource the snapshot must capture is missing from the world.
    #[error("the world has no `{0}` resource to capture")]
    MissingResource(&'static str),
    /// A column refers to a tensor the snapshot does not hold.
    #[error("{what} refers to tensor `{name}`, which the snapshot does not hold")]
    MissingTensor {
        /// The referring field.
        what: &'static str,
        /// The tensor name.
        name: String,
    },
    /// The snapshot is of another pod than the one it would be restored
    /// into. Re-sharding state onto another topology is not supported; a
    /// snapshot restores only into a pod of its own topology.
    #[error(
        "the snapshot holds pod {snapshot}, but this pod is {live}: a snapshot restores only into \
         a pod of the same topology"
    )]
    OtherTopology {
        /// The snapshot's pod (name, generation and shape).
        snapshot: String,
        /// The live pod's.
        live: String,
    },
    /// A tensor is malformed, misnamed or not referred to by any column.
    #[error("tensor `{name}`: {reason}")]
    Tensor {
        /// The tensor name.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

impl From<SnapshotError> for crate::error::OptimError {
    fn from(error: SnapshotError) -> Self {
        crate::error::OptimError::new(crate::error::ErrorKind::Snapshot, error)
    }
}
