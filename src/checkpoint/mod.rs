//! Whole-world checkpoints.
//!
//! [`SnapshotRegistry`] captures every registered component type of every
//! engine entity and every registered resource into a [`WorldSnapshot`],
//! with entity references remapped through dense ids, and restores it in
//! place after checking all of it.

mod engine;
mod error;
mod hashed_io;
mod periodic;
mod read;
mod recovery;
mod retention;
pub mod split;
mod store;
mod tensor_file;

pub use crate::persist::{
    Column, DenseIds, FORMAT_VERSION, LoadContext, Persist, SnapshotError, SnapshotRegistry,
    StoreContext, StoredTensor, TensorBytes, TensorRef, WorldSnapshot, hex,
};
pub use engine::{NOT_PERSISTED, engine_registry};
pub use error::CheckpointError;
pub use periodic::{PeriodicCheckpoints, next_periodic_checkpoint, write_periodic_checkpoint};
pub use recovery::recover_sharded_model;
pub use retention::{RetentionReport, checkpoint_name, enforce_retention};
pub use store::{
    CheckpointListing, FileEntry, MANIFEST, Manifest, StorageRoot, WORLD_FILE, WritePoint,
    check_name, check_new_checkpoint, check_storage_root, list_checkpoints, parse_manifest,
    remove_stale_temporaries, render_manifest, verify_checkpoint, write_checkpoint,
};
pub use tensor_file::TENSOR_FILE;
