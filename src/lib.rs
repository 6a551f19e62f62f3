#![doc = include_str!("../README.md")]
//!
//! # Layers
//!
//! The crate's modules are layers. A module imports only modules of lower
//! layers (its unit tests may use the whole crate), so no top-level modules
//! import each other in a circle, and every layer can be read, tested and
//! moved with only what is below it. `tests/layers.rs` reads this table and
//! every `crate::` path under `src/`, and fails naming the file and the
//! import that points up the table or sideways within a layer; a new
//! top-level module is added here.
//!
//! | layer | modules | what lives there |
//! |---|---|---|
//! | 0 core | `hardware`, `units`, `rng`, `schedule`, `error` | per-generation figures with their sources; memory sizes in binary units; the seeded random stream; the `Step` and `Compile` schedules and their ordered sets; `OptimError`, the one error type every layer returns |
//! | 1 time, input files | `clock`, `files` | simulated time, the only time systems read, and the host's typed times (`SimDuration`) and step budgets (`Ticks`); input files opened only when they are regular files, within a size limit |
//! | 2 vocabulary | `ir` | the one `DType`, tensor types, the op set, `Tensor` |
//! | 3 codecs and kernels | `persist`, `kernels` | how components become snapshot columns; the kernels constant folding, the interpreter and executables share |
//! | 4 topology | `topology` | RON pod files, presets, device/host/link entities, derived figures |
//! | 5 memory | `memory` | device memory in one home: heaps, each device's HBM and its usage, resident optimizer state, alignment; the host's streaming floor |
//! | 6 transport, optimizers | `transport`, `optimizers` | control messages and data over the links, and the backend that decides which process delivers; the `Optimizer` trait and the seven rules, bit-exact with optax |
//! | 7 health | `health` | heartbeats, suspect/failed detection, faults, exclusion |
//! | 8 pod services | `barrier`, `collectives`, `clock_sync`, `monitor`, `load_balance`, `svg` | barriers; collectives on real buffers; NTP; monitoring; placement; pictures |
//! | 9 compiler | `compiler` | graph IR as entities, the passes of `Compile`, lowering |
//! | 10 execution, models | `exec`, `model` | the fast runtime: native (Cranelift) and interpreted fused loops; transformer model configs (RON), MaxText's FLOP and parameter counts, activation memory by remat policy, MaxText's published runs |
//! | 11 sharded training | `sharding` | a whole model's optimizer sharded over the pod: parameter sets, buckets, per-device state shards, the data-parallel step as work of the `Collectives`, `Execute` and `Coalesce` sets |
//! | 12 cost models | `cost_model` | a sharded step's time, traffic and HBM in closed form, no buffers or entities: the replicated (ZeRO-1) step over tori and slices, any strategy on any mesh in the optimizer's or a training step's order, one mesh axis's collectives; what the step model and the planner read, sharing the bucket plan, residency and timing with the real run below |
//! | 13 checkpoints, goodput, step model | `checkpoint`, `goodput`, `step_model` | the registry of everything the engine persists; manifests, files, verification, periodic checkpoints; a long run's goodput through failures, checkpoints and recoveries as a discrete-event timeline; a transformer's whole training step on a pod (layers on the MXU at the roofline, each matmul at its type's peak, the mesh's collectives overlapped by one rule for every strategy, host offload over each chip's host link, HBM at the step's peak by kind, MFU and hardware utilization), held against published runs it was not fitted to |
//! | 14 recovery, planning | `recovery`, `plan` | a sharded model's recovery after a failed step: the `Recovery` set's system and the three policies (rollback from the newest checkpoint, redundant copies, spare-cube swap), re-sharding onto the survivors; the fastest layout of a model on a pod that fits, by a pruned search over every layout the step model takes, ranked by tokens a second (or by their goodput under failures), across pods by time to train |
//! | 15 assembly | `pod` | `Pod`: the world, the install order of every domain, the host API |
//! | 16 profiling | `profile` | counters, Chrome/Perfetto traces, per-system timing |
//! | 17 training | `training` | a training run in one place: the sharded optimizer's host API and its step checkpoints, the run loop and its time ledger, the run's report, goodput and trace |
//! | 18 seed facades | `tpu`, `coordination`, `fault_tolerance`, `xla` | `TPUOptimizer`, `PodCoordinator`, `FaultToleranceManager`, the seed's compiler paths |
//! | 19 facades over facades | `pod_coordination` | `TPUPodCoordinator` over `PodCoordinator`; the seed's clock-sync path |
//! | 20 binary | `cli` | the command line (part of the `optirs-tpu` binary, not the library) |
//!
//! Errors are leaves: each domain's error enum (`TopologyError`,
//! `MemoryError`, `TransportError`, `FaultError`, `BarrierError`,
//! `CollectiveError`, `OptimizerError`, `CompileError`, `ExecError`, `SnapshotError`,
//! `CheckpointError`, `ShardingError`, `ModelError`) imports nothing but the bottom
//! layers' ids, and converts itself into [`OptimError`] (layer 0, an
//! `ErrorKind` and the domain error kept whole, as `std::io::Error` carries
//! any error), so every layer returns the one error type. Domains expose world functions
//! (`barrier::create_barrier`, `collectives::pod::launch_all_reduce`,
//! `clock_sync::set_device_clock`); [`Pod`] wraps them, and only `pod/`
//! holds `impl Pod`. Systems order themselves against the sets of
//! [`schedule`], never against another domain's function.
//!
//! # Data path
//!
//! A RON pod file (or a preset) is parsed and validated by [`topology`]
//! and spawned as device, host and link entities; [`Pod::from_topology`]
//! installs every domain's resources and systems into the [`schedule::Step`]
//! sets in one documented order; each [`Pod::step`] runs one tick in
//! simulated time; reports ([`monitor::performance_report`], figures,
//! traces) read the world, and [`checkpoint`] writes the whole world (the
//! columns of [`persist`]) with a SHA-256 manifest and restores it only
//! after verifying every byte.
//!
//! ## One `train` step, module by module
//!
//! 1. **`cli::train`** parses the flags into a [`training::RunPlan`]
//!    (steps, kills, checkpoint cadence) and a [`training::ShardedOptimizer`]
//!    built with [`ShardedOptimizer::on_pod`](training::ShardedOptimizer::on_pod):
//!    [`sharding::world::participants`] reads the pod's live devices and
//!    ring plan, [`sharding::world::place_model`] marks their HBM and
//!    installs the model's state shards, and [`sharding::world::compile_update`]
//!    compiles the update once per shard length ([`compiler`] passes,
//!    lowered to an [`exec`] runtime, native where Cranelift can).
//! 2. **[`training::run_steps`]** is the loop: per step it calls
//!    [`ShardedOptimizer::step`](training::ShardedOptimizer::step), charges
//!    the simulated nanoseconds to the run's [`sharding::ledger`], and after
//!    a completed step writes a due checkpoint
//!    (`ShardedOptimizer::checkpoint_if_due`, [`checkpoint`] files, its
//!    modeled write time waited out).
//! 3. **The step** is launched by [`sharding::step::launch_step`] (the
//!    gradients reduce-scattered per bucket, the step's modeled end an
//!    exact stop of the [`clock`]) and then lives in the world: the pod
//!    ticks ([`Pod::advance_until`]) through the [`schedule::Step`] sets —
//!    [`health`] applies faults and detects failures; in `Collectives`,
//!    [`collectives::pod`] progresses transfers (`CollectiveSystems::Progress`)
//!    and the step's watch fails it if a participant or link is lost
//!    (`CollectiveSystems::Watch`); in `Execute` the step's time has come and
//!    every shard runs its compiled update; in `Coalesce` its transient memory
//!    goes back to the [`memory`] heaps; in `Recovery` a failed step is
//!    recovered by [`recovery`] (rollback, redundant copies, spare cubes);
//!    `Checkpoint` writes the pod's periodic checkpoints.
//! 4. **[`training::TrainReport`]** turns the outcome into the report
//!    (goodput from the ledger, the median step, phases, recoveries), and
//!    [`training::trace::trace_of`] draws it with [`profile::trace`], the
//!    one trace writer; `cli::train` prints it.
#![warn(missing_docs)]

pub mod barrier;
pub mod checkpoint;
pub mod clock;
pub mod clock_sync;
pub mod collectives;
pub mod compiler;
pub mod coordination;
pub mod cost_model;
pub mod error;
pub mod exec;
pub mod fault_tolerance;
pub mod files;
pub mod goodput;
pub mod hardware;
pub mod health;
pub mod ir;
pub mod kernels;
pub mod load_balance;
pub mod memory;
pub mod model;
pub mod monitor;
/// The seed's path to the optimizer trait and its vocabulary, now in
/// [`optimizers`].
#[deprecated(
    since = "0.2.0",
    note = "the trait and the rules live in `optirs_tpu::optimizers`"
)]
pub mod optimizer {
    pub use crate::optimizers::program;
    pub use crate::optimizers::{
        ElementOp, FloatElement, HyperParameter, Operand, Optimizer, OptimizerState, StateSlot,
        UpdateKind, UpdateProgram, UpdateRule,
    };
}
pub mod optimizers;
pub mod persist;
pub mod plan;
pub mod pod;
pub mod pod_coordination;
pub mod profile;
pub mod recovery;
pub mod rng;
pub mod schedule;
pub mod sharding;
pub mod step_model;
pub mod svg;
pub mod topology;
pub mod tpu;
pub mod training;
pub mod transport;
pub mod units;
pub mod xla;

pub use error::{OptimError, Result};
pub use hardware::TpuGeneration;
pub use optimizers::Optimizer;
pub use pod::Pod;
pub use tpu::{TPUConfig, TPUOptimizer, TPUVersion};
