//! A whole model's optimizer, sharded over every device of a pod: the
//! weight-update sharding of Xu et al. (2020) that XLA applies on Cloud
//! TPU, in the shape of ZeRO stage 1.
//!
//! Each step: the replicas' gradients are reduce-scattered over the torus,
//! each device runs the fused compiled update on its `1/n` of every bucket
//! with its own shard of the optimizer state (resident in its own HBM),
//! and the new parameters are all-gathered so every replica holds them.
//! A model is packed into buckets ([`layout`]) so a step runs few
//! collectives and few programs. The step is work of the pod's systems in
//! simulated time ([`step`], [`timing`]); this module holds the world
//! side, and `optirs_tpu::tpu::ShardedOptimizer` the host API that
//! compiles the programs and waits for the steps.
//!
//! **Strategies.** The model's [`Strategy`] says what each device holds:
//! replicated (the above), zero2 (gradient shards and one bucket in flight
//! instead of a whole gradient) or fsdp (a parameter shard instead of a
//! replica, each bucket gathered before its use, no gather after the
//! update; `strategy_step`); [`residency`] gives each device's HBM in
//! closed form. The arithmetic is the same under every strategy.
//!
//! **Exactness.** A sharded step gives the bits of the unsharded
//! `TPUOptimizer` step on the whole model with the reduced gradient: the
//! update is element-wise and compiled from the same graph, and the
//! gradient of element `i` is reduced in one fixed order, the
//! reduce-scatter's ([`crate::collectives::ReduceGrid`]: along torus axis
//! 0 starting after the owner, then axis 1, then axis 2; `Mean` divides
//! the sum once), which is also [`crate::collectives::torus_all_reduce`]'s.
//! On a multislice pod the slice index is a fourth axis folded last, over
//! DCN ([`crate::collectives::multislice`]), so the same holds there.
//!
//! **The closed form.** The same step without buffers or entities, for
//! models and pods this machine cannot hold and for the planner, is the
//! layer above, `cost_model`; it calls this module's bucket plan
//! ([`strategy`]), residency and timing rather than computing them again.
//!
//! **Over ranks.** On a pod split over processes ([`crate::pod::ranks`])
//! each rank holds its devices' state shards and its replicas' gradients,
//! and the step's collectives cross ranks on the same schedule
//! ([`ranked`]), so the bits stay the one-process step's.

pub mod bucket_runs;
pub mod error;
pub mod gradients;
pub mod layout;
pub mod ledger;
pub mod mesh;
mod mesh_error;
mod mesh_layout;
mod mesh_traffic;
pub mod model;
pub mod params;
pub mod participants;
pub mod ranked;
mod ranked_shared;
pub mod residency;
pub mod step;
pub mod stored_model;
pub mod strategy;
mod strategy_step;
pub mod timing;
mod traffic;
pub mod world;

use bevy_ecs::prelude::*;
use bevy_ecs::schedule::Schedules;

pub use error::{FailureCause, RecoveryFailure, ShardingError, UnknownName, UpdateError};
pub use gradients::{GradientSource, ReducedGradients, ReplicaGradients, SyntheticGradients};
pub use layout::{Bucket, ShardLayout, ShardPlan, TensorSpec};
pub use mesh::{
    Mesh, MeshAxis, MeshAxisName, MeshError, MeshSizes, PhysicalAxis, Strategy, UnknownStrategy,
};
pub use model::{RecoveryPolicy, RecoveryRecord, Reduction, ShardedModel, SlotValues, model_of};
pub use params::ParamSet;
pub use residency::{HbmByKind, ResidencyInput, hbm_bytes_per_device};
pub use step::{ShardProgram, ShardedStep, StepOutcome};
pub use timing::{Span, StepPhase, StepTimeline};

use crate::schedule::{CollectiveSystems, Step, StepSystems};

/// Default bucket size: 25 MiB, PyTorch DDP's `bucket_cap_mb`, past the
/// size at which a ring pass over a TPU torus axis runs at link bandwidth
/// (each of a 16-device ring's messages is then 1.6 MB, well above the
/// links' latency-bandwidth product of about 0.1 MB).
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// Installs the step's systems: [`step::watch_sharded_step`] in
/// `Collectives` (its `Watch` set, after the collectives' progress), [`step::commit_sharded_step`] in `Execute`,
/// [`step::release_step_memory`] in `Coalesce`. They do nothing while the
/// pod holds no model, and insert nothing until a model exists.
pub fn install(world: &mut World) {
    crate::clock::register_exact_stop(world, step_ends);
    crate::clock::register_exact_stop(world, recovery_ends);
    world.resource_mut::<Schedules>().add_systems(
        Step,
        (
            step::watch_sharded_step.in_set(CollectiveSystems::Watch),
            step::commit_sharded_step.in_set(StepSystems::Execute),
            step::release_step_memory.in_set(StepSystems::Coalesce),
        ),
    );
}

/// The modeled end of the step in flight: the clock stops there, so the
/// step completes at its own nanosecond, not at the next tick boundary.
fn step_ends(world: &World) -> Option<u64> {
    world
        .get_resource::<ShardedStep>()
        .filter(|s| s.is_pending())
        .map(|s| s.completes_at_ns)
}

/// The end of a recovery in progress (the next step may start then).
fn recovery_ends(world: &World) -> Option<u64> {
    model_of(world).map(|m| m.recovering_until_ns)
}

/// When the sharded step's systems (and its recovery) next change the
/// world: a pending step's modeled end (unknown if a participant or a
/// link it uses is already in trouble, which fails it at the next tick);
/// never without a step or once a finished step was released (and, if it
/// failed, recovered); unknown (every tick) while a finished step is
/// unreleased or waiting for recovery.
pub fn next_event(world: &mut World) -> crate::clock::NextEvent {
    use crate::clock::NextEvent;
    let Some(step) = world.get_resource::<ShardedStep>() else {
        return NextEvent::Never;
    };
    if step.is_pending() {
        return if step::in_trouble(world) {
            NextEvent::Unknown
        } else {
            NextEvent::At(step.completes_at_ns)
        };
    }
    if !step.released
        || (matches!(step.outcome, StepOutcome::Failed { .. }) && step.recovery.is_none())
    {
        return NextEvent::Unknown;
    }
    NextEvent::Never
}
