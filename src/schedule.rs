//! The engine's schedules and the ordered system sets every domain plugs into.
//!
//! Two schedules run on one `World`:
//!
//! * [`Step`]: one pod tick. Its sets run in the order of [`StepSystems`].
//! * [`Compile`]: the compiler pipeline, run on demand. Its sets run in the
//!   order of [`CompileSystems`].
//!
//! Both use bevy's `SingleThreadedExecutor` (deterministic, and faster than the
//! multi-threaded one on small machines; heavy kernels parallelize with rayon
//! inside a system) and treat an ambiguous system order as a build error, so
//! every order the engine relies on is written down here or in a plugin.
//!
//! A domain installs itself with a plain function, `install(world)`, that
//! inserts its resources and adds its systems to these sets.
//!
//! Hosts add their own systems with `Pod::add_systems`, which builds the
//! schedule at once ([`build`]) and refuses a batch that makes it ambiguous,
//! with bevy's message naming both systems, instead of letting the next
//! `Pod::step` panic; each batch sits in its own [`HostSystems`] set so a
//! refused one is taken out again.

use bevy_ecs::prelude::*;
use bevy_ecs::schedule::{
    LogLevel, ScheduleBuildSettings, ScheduleCleanupPolicy, ScheduleLabel, Schedules,
    SingleThreadedExecutor,
};

/// One pod tick: clock, faults, heartbeats, clock sync, transport, fault
/// detection, barriers, collectives, execution, coalescing, recovery, monitoring,
/// checkpoints. A phase gets
/// a set when a system runs in it: a set with nothing to do is not kept.
#[derive(ScheduleLabel, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Step;

/// The compiler pipeline over the graph entities in the world.
#[derive(ScheduleLabel, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Compile;

/// The phases of one [`Step`], in the order they run.
#[derive(SystemSet, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepSystems {
    /// Advance the simulated clock by one tick.
    AdvanceClock,
    /// Apply faults scheduled for this time (kills, pauses, cut links).
    InjectFaults,
    /// Devices emit heartbeats that are due.
    Heartbeats,
    /// Each device that just sent a heartbeat runs one NTP exchange.
    ClockSync,
    /// Messages move over channels according to latency and bandwidth.
    Transport,
    /// Missed heartbeats mark devices suspect, then failed.
    FaultDetection,
    /// Barriers collect arrivals, complete or fail.
    Barriers,
    /// Collective operations make progress over the links; a sharded
    /// step's communication is watched for failures.
    Collectives,
    /// A sharded step whose time has come runs its update on every shard.
    Execute,
    /// Finished steps give their transient device memory back; the heaps
    /// coalesce the freed blocks.
    Coalesce,
    /// After a failed step, the model's recovery policy re-shards it onto
    /// the surviving devices.
    Recovery,
    /// Health and performance monitoring.
    Monitor,
    /// Periodic checkpoints (last, so a checkpoint sees the whole tick).
    Checkpoint,
}

/// The order inside [`StepSystems::Collectives`]: the collectives make
/// progress first, then a sharded step's communication is watched, so a
/// step sees the links and devices as this tick's progress left them.
#[derive(SystemSet, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectiveSystems {
    /// Collective operations make progress over the links.
    Progress,
    /// A sharded step in flight is failed if a participant or link is lost.
    Watch,
}

/// The compiler passes, in pipeline order.
#[derive(SystemSet, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompileSystems {
    /// Structural checks: cycles, dangling operands, arity.
    Verify,
    /// Infer and check every node's shape and dtype.
    ShapeInference,
    /// Folding, algebraic simplification, CSE and DCE, to a fixed point.
    Simplify,
    /// Group elementwise producers with their consumers into kernels.
    Fuse,
    /// Count flops, transcendentals and bytes of nodes, kernels and programs.
    CostAnalysis,
    /// Give every kernel a position in a topological order.
    Order,
    /// Assign buffer offsets by liveness.
    PlanMemory,
    /// Build the executable.
    Lower,
}

/// Build settings shared by every engine schedule: ambiguous orders are errors.
pub fn build_settings() -> ScheduleBuildSettings {
    ScheduleBuildSettings {
        ambiguity_detection: LogLevel::Error,
        hierarchy_detection: LogLevel::Error,
        ..Default::default()
    }
}

/// A schedule with the engine's executor and build settings.
pub fn deterministic_schedule(label: impl ScheduleLabel) -> Schedule {
    let mut schedule = Schedule::new(label);
    schedule.set_executor(SingleThreadedExecutor::new());
    schedule.set_build_settings(build_settings());
    schedule
}

/// Every [`StepSystems`] set, in run order (the schedule chains them so).
pub const STEP_SETS: [StepSystems; 13] = [
    StepSystems::AdvanceClock,
    StepSystems::InjectFaults,
    StepSystems::Heartbeats,
    StepSystems::ClockSync,
    StepSystems::Transport,
    StepSystems::FaultDetection,
    StepSystems::Barriers,
    StepSystems::Collectives,
    StepSystems::Execute,
    StepSystems::Coalesce,
    StepSystems::Recovery,
    StepSystems::Monitor,
    StepSystems::Checkpoint,
];

/// Every [`CompileSystems`] set, in run order (the schedule chains them so).
pub const COMPILE_SETS: [CompileSystems; 8] = [
    CompileSystems::Verify,
    CompileSystems::ShapeInference,
    CompileSystems::Simplify,
    CompileSystems::Fuse,
    CompileSystems::CostAnalysis,
    CompileSystems::Order,
    CompileSystems::PlanMemory,
    CompileSystems::Lower,
];

/// Adds the [`Step`] and [`Compile`] schedules to `world` with their sets
/// chained in order. Domains then add systems to the sets.
pub fn init_schedules(world: &mut World) {
    let mut step = deterministic_schedule(Step);
    for pair in STEP_SETS.windows(2) {
        step.configure_sets(pair[1].after(pair[0]));
    }
    step.configure_sets(
        (CollectiveSystems::Progress, CollectiveSystems::Watch)
            .chain()
            .in_set(StepSystems::Collectives),
    );
    let mut compile = deterministic_schedule(Compile);
    for pair in COMPILE_SETS.windows(2) {
        compile.configure_sets(pair[1].after(pair[0]));
    }
    let mut schedules = world.get_resource_or_init::<Schedules>();
    schedules.insert(step);
    schedules.insert(compile);
}

/// The set of one batch of host systems (numbered in the order the batches
/// were added), so a batch the schedule refuses can be removed whole.
#[derive(SystemSet, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HostSystems(pub u64);

/// Why a schedule could not be built (or a refused batch taken out of it):
/// the schedule's label and bevy's message, rendered against the schedule's
/// graph while it was at hand (bevy's error names systems by key only).
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// Bevy refused to build the schedule; for an ambiguous order the
    /// message names both systems and the data they conflict on.
    #[error("schedule build failed: {label}: {message}")]
    Build {
        /// The schedule (`Step`).
        label: String,
        /// Bevy's message, rendered with the systems' names.
        message: String,
        /// Bevy's error (it names systems by key only).
        #[source]
        source: bevy_ecs::schedule::ScheduleBuildError,
    },
    /// The world has no schedule of that label.
    #[error("schedule build failed: {label}: no such schedule")]
    NoSuchSchedule {
        /// The schedule.
        label: String,
    },
    /// The graph could not be built even without the ambiguity checks, so
    /// a refused batch could not be taken out.
    #[error(
        "schedule build failed: {label}: the refused systems could not be taken out: {message}"
    )]
    NotRemoved {
        /// The schedule.
        label: String,
        /// Bevy's message, rendered with the systems' names.
        message: String,
        /// Bevy's error.
        #[source]
        source: bevy_ecs::schedule::ScheduleBuildError,
    },
    /// Bevy could not remove a refused batch from the built graph.
    #[error("schedule build failed: {label}: {source}")]
    Removal {
        /// The schedule.
        label: String,
        /// Bevy's error.
        #[source]
        source: bevy_ecs::schedule::ScheduleError,
    },
}

/// Builds the schedule `label` of `world` now (a no-op when nothing changed
/// since the last build). On failure returns bevy's message, with the
/// schedule: for an ambiguous order it names both systems and the data they
/// conflict on.
pub fn build(world: &mut World, label: impl ScheduleLabel) -> Result<(), ScheduleError> {
    let label = label.intern();
    world
        .try_schedule_scope(label, |world, schedule| match schedule.initialize(world) {
            Ok(_) => Ok(()),
            Err(error) => Err(ScheduleError::Build {
                label: format!("{label:?}"),
                message: error.to_string(schedule.graph(), world),
                source: error,
            }),
        })
        .map_err(|_| ScheduleError::NoSuchSchedule {
            label: format!("{label:?}"),
        })?
}

/// Removes the systems of host batch `set` from schedule `label` and builds
/// it again (used after [`build`] refused the batch). Bevy removes systems
/// only from a built graph, so the graph is first built with ambiguity and
/// hierarchy checks off (never run), the batch taken out, and the schedule
/// built again with the engine's [`build_settings`]. A batch that cannot be
/// built even so (a dependency cycle) cannot be taken out: the error says so.
pub fn remove_host_systems(
    world: &mut World,
    label: impl ScheduleLabel,
    set: HostSystems,
) -> Result<(), ScheduleError> {
    let label = label.intern();
    world
        .try_schedule_scope(label, |world, schedule| {
            schedule.set_build_settings(ScheduleBuildSettings {
                ambiguity_detection: LogLevel::Ignore,
                hierarchy_detection: LogLevel::Ignore,
                ..build_settings()
            });
            let removed = schedule
                .initialize(world)
                .map_err(|error| ScheduleError::NotRemoved {
                    label: format!("{label:?}"),
                    message: error.to_string(schedule.graph(), world),
                    source: error,
                })
                .and_then(|_| {
                    schedule
                        .graph_mut()
                        .remove_systems_in_set(
                            set,
                            ScheduleCleanupPolicy::RemoveSetAndSystemsAllowBreakages,
                        )
                        .map(|_| ())
                        .map_err(|source| ScheduleError::Removal {
                            label: format!("{label:?}"),
                            source,
                        })
                });
            schedule.set_build_settings(build_settings());
            removed
        })
        .map_err(|_| ScheduleError::NoSuchSchedule {
            label: format!("{label:?}"),
        })??;
    build(world, label)
}
