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
pub use retention::{
    RetentionReport, checkpoint_name, enforce_retention, enforce_retention_sparing,
};
pub use store::{
    CheckpointListing, FileEntry, MANIFEST, Manifest, RUN_FILE, StorageRoot, WORLD_FILE,
    WritePoint, check_name, check_new_checkpoint, check_storage_root, list_checkpoints,
    parse_manifest, read_run_record, remove_stale_temporaries, render_manifest, verify_checkpoint,
    write_checkpoint, write_checkpoint_with,
};
pub use tensor_file::TENSOR_FILE;

use bevy_ecs::prelude::*;
use bevy_ecs::schedule::Schedules;

use crate::schedule::{Step, StepSystems};

/// Inserts the engine's [`SnapshotRegistry`] (what a checkpoint of this
/// world holds) and installs [`write_periodic_checkpoint`] in the
/// `Checkpoint` set, which does nothing until periodic checkpoints are
/// enabled.
pub fn install(world: &mut World) {
    world.insert_resource(engine_registry());
    world.resource_mut::<Schedules>().add_systems(
        Step,
        write_periodic_checkpoint.in_set(StepSystems::Checkpoint),
    );
}
