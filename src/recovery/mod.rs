//! Recovery of a sharded model after a failed step, in one home: the
//! `Recovery` set's system ([`recover_sharded_model`]) applies the model's
//! [`RecoveryPolicy`] once per step that failed because devices were lost
//! (killed, paused or declared failed; rank 0's declarations on a pod split
//! over ranks).
//!
//! * **Rollback** ([`rollback`]) reads the newest periodic checkpoint
//!   (every root of the pod's [`PeriodicCheckpoints`], newest tick first,
//!   each verified byte for byte; corrupt ones are skipped) that holds the
//!   same model, and takes its parameters, state and count; the steps
//!   completed since are lost; before the first checkpoint it restarts from
//!   the model as the run began ([`crate::sharding::model::StartingModel`],
//!   in memory, if the host kept it). Only the model rolls back: the pod's
//!   time, health and the failure stay as they are, which is what a
//!   training job restarting on the surviving hosts sees. These are the
//!   checkpoints `FaultToleranceManager` lists and restores. The model is
//!   then re-sharded onto the survivors.
//! * **Redundant** promotes the lost devices' state copies from their ring
//!   successors ([`state_from_copies`]) and re-shards onto the survivors;
//!   no step is lost.
//! * **SpareCube** ([`spare_cube`]) first checks that a spare cube is there
//!   for every lost device's cube (an error before any work otherwise),
//!   then reads the newest checkpoint as a rollback does and swaps the
//!   cubes ([`swap_cubes_after_loss`]): the lost devices' cubes are swapped
//!   for spares ([`crate::health::cubes`]), so the model excludes nobody,
//!   keeps every device and its layout (the torus plan) and is reinstalled
//!   with the checkpoint's state. With no spare free it falls back to a
//!   rollback onto the survivors, as `goodput` models it (the record names
//!   the policy that ran).
//!
//! **Re-sharding** ([`reshard`]): the lost devices are excluded, the layout
//! is rebuilt over a ring of the survivors (the ring order without them,
//! every hop routed on the torus), and the model is reinstalled with the
//! given parameters, count and state, every shard reserved in its new
//! device's heap. If that does not fit, the previous model is put back as
//! it was.
//!
//! **Modeled time** (the next step waits for it): each survivor receives
//! its new state shards, `slots · shard_elements · element_bytes` (twice
//! with redundant copies), over one ICI link at the generation's bandwidth
//! and latency ([`crate::hardware`]); a rollback first reads the
//! checkpoint's parameters and state at
//! [`crate::hardware::CHECKPOINT_READ_BYTES_PER_S_PER_HOST`] on every host;
//! a spare-cube recovery's time is the checkpoint read, the OCS
//! reconfiguration and the same shard transfer.
//!
//! What happened is in [`ShardedStep::recovery`] and, on success, appended
//! to the model's `recoveries`. A failure no policy can survive (no lost
//! device but a cut link, both copies of a shard lost, every device lost,
//! no checkpoint of the model) is recorded there as an error.
//!
//! [`RecoveryPolicy`]: crate::sharding::RecoveryPolicy
//! [`PeriodicCheckpoints`]: crate::checkpoint::PeriodicCheckpoints
//! [`ShardedStep::recovery`]: crate::sharding::ShardedStep::recovery

pub mod reshard;
pub mod rollback;
pub mod spare_cube;
mod system;

use bevy_ecs::prelude::*;
use bevy_ecs::schedule::Schedules;

pub use reshard::{Restored, reshard_after_loss, state_from_copies};
pub use spare_cube::swap_cubes_after_loss;
pub use system::{lost_devices, recover_sharded_model};

use crate::schedule::{Step, StepSystems};

/// Installs [`recover_sharded_model`] in the `Recovery` set. It does
/// nothing until a sharded step has failed and released its memory.
pub fn install(world: &mut World) {
    world
        .resource_mut::<Schedules>()
        .add_systems(Step, recover_sharded_model.in_set(StepSystems::Recovery));
}
