//! What a goodput run is given: the fleet that fails, the model whose state
//! is checkpointed, the failure process and the recovery policy, and the
//! costs derived from them.
//!
//! Defaults that are not hardware figures live here with their sources;
//! hardware figures come from [`crate::hardware`] and the pod's topology.

use std::sync::Arc;

use serde::Serialize;

use super::error::{GoodputError, StepModelError};
use crate::collectives::TorusShape;
use crate::cost_model::{StrategyOptions, modeled_strategy_step};
use crate::hardware::{CHECKPOINT_READ_BYTES_PER_S_PER_HOST, TpuGeneration, checkpoint_io_seconds};
use crate::sharding::{DEFAULT_BUCKET_BYTES, RecoveryPolicy, Strategy};
use crate::topology::Topology;
use crate::topology::resolve::DEFAULT_HEARTBEAT_TIMEOUT_NS;

/// Seconds from a failure's detection until the job runs its first step
/// again, excluding the checkpoint read and the reconfiguration, which are
/// modeled separately: rescheduling the job, starting every host's process,
/// forming the collective groups, compiling. An assumption: no TPU or GPU
/// publication gives it for a whole pod. TrainMover (Lao et al., arXiv
/// 2412.12636) measures checkpoint-restart baselines at 1024 GPUs of the
/// order of ten minutes (its ~10-20 s downtime is "up to ~70x" shorter).
pub const DEFAULT_RESTART_SECONDS: f64 = 600.0;

/// Seconds to swap the failed unit for a spare and rewire the slice: the
/// TPU v4 optical circuit switches reconfigure 4x4x4 cubes into a new torus
/// "in around 10 seconds" (Gemini technical report, 2023, "Training
/// Infrastructure"; Jouppi et al., ISCA 2023).
pub const DEFAULT_RECONFIGURE_SECONDS: f64 = 10.0;

/// Hours until a failed cube is back in the spare pool (its failed tray
/// replaced and the cube retested). An assumption: no publication gives
/// TPU repair times; a day is the order of a hardware ticket's turnaround.
pub const DEFAULT_CUBE_REPAIR_HOURS: f64 = 24.0;

/// Optimizer-state slots per parameter unless told otherwise: Adam's two
/// moments, the crate's default optimizer.
pub const DEFAULT_OPTIMIZER_SLOTS: usize = 2;

/// Bytes per parameter and per state element: the crate's sharded model is
/// f32 throughout.
pub const ELEMENT_BYTES: f64 = 4.0;

/// What one failure takes down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FailureUnit {
    /// One chip; `--mtbf-hours` is one chip's mean time between failures.
    Chip,
    /// One host and every chip it drives; `--mtbf-hours` is one host's.
    Host,
}

impl std::str::FromStr for FailureUnit {
    type Err = GoodputError;
    fn from_str(s: &str) -> Result<Self, GoodputError> {
        match s {
            "chip" => Ok(FailureUnit::Chip),
            "host" => Ok(FailureUnit::Host),
            other => Err(GoodputError::UnknownFailureUnit { name: other.into() }),
        }
    }
}

/// Parses a recovery policy name for a goodput run.
pub fn parse_recovery(name: &str) -> Result<RecoveryPolicy, GoodputError> {
    match name {
        "rollback" => Ok(RecoveryPolicy::Rollback),
        "redundant" => Ok(RecoveryPolicy::Redundant),
        "spare-cube" => Ok(RecoveryPolicy::SpareCube),
        other => Err(GoodputError::UnknownRecovery {
            name: other.into(),
            note: "",
        }),
    }
}

/// How often checkpoints are written.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckpointInterval {
    /// After this many seconds of training (rounded to whole steps).
    Every(f64),
    /// The interval the simulation finds best ([`super::interval::search_interval`]).
    Auto,
    /// Never (every rollback restarts from the first step).
    Never,
}

impl std::str::FromStr for CheckpointInterval {
    type Err = GoodputError;
    fn from_str(s: &str) -> Result<Self, GoodputError> {
        match s {
            "auto" => Ok(CheckpointInterval::Auto),
            "never" => Ok(CheckpointInterval::Never),
            text => match text.parse::<f64>() {
                Ok(v) if v.is_finite() && v > 0.0 => Ok(CheckpointInterval::Every(v)),
                _ => Err(GoodputError::BadInterval { text: text.into() }),
            },
        }
    }
}

/// The chips that fail and how the redundant copies sit on them.
#[derive(Debug, Clone, PartialEq)]
pub struct Fleet {
    /// The pod's name.
    pub name: String,
    /// Chips.
    pub chips: u32,
    /// Hosts.
    pub hosts: u32,
    /// The host of each position of the sharded step's ring: position `i`'s
    /// redundant state copy lives on position `i + 1` (its successor, as
    /// [`crate::sharding::ShardLayout::peers`] places it).
    pub ring_hosts: Vec<u32>,
    /// Seconds from a failure until it is detected: the heartbeat timeout.
    pub detect_seconds: f64,
    /// Bytes per second of one ICI link.
    pub ici_bytes_per_s: f64,
    /// Latency of one ICI hop, seconds.
    pub ici_latency_seconds: f64,
    /// Bytes per second of one chip's host link, each way (the
    /// generation's [`crate::hardware::HardwareSpec::host_link_bytes_per_s`]).
    pub host_link_bytes_per_s: f64,
    /// Spare cubes of a cube-built pod (`cubes: (spares: N)` in its pod
    /// file); `None` for a pod not built of cubes.
    pub spare_cubes: Option<u32>,
}

impl Fleet {
    /// The fleet of a pod: every slice's snake ring in turn, each chip's
    /// host from the topology, detection after its heartbeat timeout.
    pub fn from_topology(topology: &Topology) -> Result<Fleet, GoodputError> {
        let n = topology.ndims;
        let dims: Vec<usize> = topology.dims[..n].iter().map(|&d| d as usize).collect();
        let wrap: Vec<bool> = (0..n).map(|a| topology.wraparound[a]).collect();
        let shape =
            TorusShape::new(&dims, &wrap).map_err(|source| GoodputError::Torus { source })?;
        let ring = shape.snake_ring();
        let per_slice = topology.chips_per_slice();
        let ring_hosts = (0..topology.slices)
            .flat_map(|s| {
                ring.iter()
                    .map(move |&d| topology.host_of(s * per_slice + d as u32))
            })
            .collect();
        let fleet = Fleet {
            name: topology.name.clone(),
            chips: topology.num_devices(),
            hosts: topology.num_hosts(),
            ring_hosts,
            detect_seconds: topology.heartbeat_timeout_ns as f64 * 1e-9,
            ici_bytes_per_s: topology.ici.bytes_per_s,
            ici_latency_seconds: topology.ici.latency_ns as f64 * 1e-9,
            host_link_bytes_per_s: topology.generation.spec().host_link_bytes_per_s,
            spare_cubes: topology.cubes.map(|c| c.spares),
        };
        fleet.check()?;
        Ok(fleet)
    }

    /// A fleet of `chips` in hosts of `chips_per_host` consecutive ring
    /// positions (a cluster of 8-accelerator servers, say), with
    /// `generation`'s ICI figures and the default heartbeat timeout.
    pub fn blocks(
        name: &str,
        chips: u32,
        chips_per_host: u32,
        generation: TpuGeneration,
    ) -> Result<Fleet, GoodputError> {
        if chips_per_host == 0 {
            return Err(GoodputError::EmptyFleet { what: "hosts" });
        }
        let spec = generation.spec();
        let fleet = Fleet {
            name: name.into(),
            chips,
            hosts: chips.div_ceil(chips_per_host),
            ring_hosts: (0..chips).map(|c| c / chips_per_host).collect(),
            detect_seconds: DEFAULT_HEARTBEAT_TIMEOUT_NS as f64 * 1e-9,
            ici_bytes_per_s: spec.ici_bytes_per_s,
            ici_latency_seconds: spec.ici_latency_ns as f64 * 1e-9,
            host_link_bytes_per_s: spec.host_link_bytes_per_s,
            spare_cubes: None,
        };
        fleet.check()?;
        Ok(fleet)
    }

    fn check(&self) -> Result<(), GoodputError> {
        if self.chips == 0 || self.ring_hosts.is_empty() {
            return Err(GoodputError::EmptyFleet { what: "chips" });
        }
        if self.hosts == 0 {
            return Err(GoodputError::EmptyFleet { what: "hosts" });
        }
        Ok(())
    }
}

/// Everything a goodput run is given besides the fleet.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GoodputConfig {
    /// Parameters of the model.
    pub model_params: u64,
    /// Optimizer-state slots per parameter (Adam: 2).
    pub optimizer_slots: usize,
    /// Mean time between failures of one failure unit, hours.
    pub mtbf_hours: f64,
    /// What one failure takes down.
    pub failure_unit: FailureUnit,
    /// Simulated wall time, days.
    pub days: f64,
    /// How often checkpoints are written.
    pub checkpoint: CheckpointInterval,
    /// What a failure costs: a rollback to the last checkpoint, or a
    /// promotion of the redundant copies.
    #[serde(serialize_with = "by_name")]
    pub recovery: RecoveryPolicy,
    /// Seed of the failure times and of which unit fails.
    pub seed: u64,
    /// [`DEFAULT_RESTART_SECONDS`] unless told otherwise.
    pub restart_seconds: f64,
    /// [`DEFAULT_RECONFIGURE_SECONDS`] unless told otherwise.
    pub reconfigure_seconds: f64,
    /// Under spare-cube, hours until a failed cube is a spare again
    /// ([`DEFAULT_CUBE_REPAIR_HOURS`] unless told otherwise).
    pub cube_repair_hours: f64,
    /// One training step, seconds (the CLI defaults to the pod's modeled
    /// sharded step).
    pub step_seconds: f64,
    /// Aggregate checkpoint storage bandwidth, bytes per second; `None`:
    /// [`CHECKPOINT_READ_BYTES_PER_S_PER_HOST`] on every host.
    pub storage_bytes_per_s: Option<f64>,
    /// Asynchronous checkpoints (Orbax's async save): training waits only
    /// for the device-to-host copy, and the write to storage overlaps the
    /// steps that follow. `false`: training waits for the whole write.
    pub async_checkpoint: bool,
}

impl GoodputConfig {
    /// A configuration with the documented defaults: Adam, chip failures,
    /// `auto` checkpoints, rollback, seed 0.
    pub fn new(model_params: u64, mtbf_hours: f64, days: f64, step_seconds: f64) -> Self {
        GoodputConfig {
            model_params,
            optimizer_slots: DEFAULT_OPTIMIZER_SLOTS,
            mtbf_hours,
            failure_unit: FailureUnit::Chip,
            days,
            checkpoint: CheckpointInterval::Auto,
            recovery: RecoveryPolicy::Rollback,
            seed: 0,
            restart_seconds: DEFAULT_RESTART_SECONDS,
            reconfigure_seconds: DEFAULT_RECONFIGURE_SECONDS,
            cube_repair_hours: DEFAULT_CUBE_REPAIR_HOURS,
            step_seconds,
            storage_bytes_per_s: None,
            async_checkpoint: false,
        }
    }

    /// Checks every input that does not depend on the step's length, so a
    /// caller that models the step can refuse bad input before modeling it
    /// ([`Costs::derive`] checks these again, and the step).
    pub fn check(&self, fleet: &Fleet) -> Result<(), GoodputError> {
        positive(
            "--mtbf-hours",
            self.mtbf_hours,
            " (the mean time between failures of one chip or host, e.g. 50000)",
        )?;
        positive("--days", self.days, " (the simulated run's length)")?;
        if self.days > MAX_DAYS {
            return Err(GoodputError::TooLong {
                days: self.days,
                limit: MAX_DAYS,
            });
        }
        if self.model_params == 0 {
            return Err(GoodputError::NoParameters);
        }
        non_negative("--restart-seconds", self.restart_seconds)?;
        non_negative("--reconfigure-seconds", self.reconfigure_seconds)?;
        if self.recovery == RecoveryPolicy::SpareCube {
            positive(
                "--cube-repair-hours",
                self.cube_repair_hours,
                " (until a failed cube is a spare again)",
            )?;
            if fleet.spare_cubes.unwrap_or(0) == 0 {
                return Err(GoodputError::NoSpareCube {
                    pod: fleet.name.clone(),
                });
            }
        }
        if let CheckpointInterval::Every(s) = self.checkpoint {
            positive("--checkpoint-every", s, " (seconds of training, or `auto`)")?;
        }
        if let Some(bw) = self.storage_bytes_per_s {
            positive(
                "--storage-bytes-per-s",
                bw,
                " (aggregate checkpoint bandwidth)",
            )?;
        }
        fleet.check()?;
        let system_mtbf_seconds = self.mtbf_hours * 3600.0 / f64::from(self.units(fleet));
        let expected = self.days * 86_400.0 / system_mtbf_seconds;
        if expected > MAX_FAILURES as f64 {
            return Err(GoodputError::TooManyFailures {
                days: self.days,
                system_mtbf_seconds,
                expected,
                limit: MAX_FAILURES,
            });
        }
        Ok(())
    }

    /// Failure units of `fleet` under this configuration.
    fn units(&self, fleet: &Fleet) -> u32 {
        match self.failure_unit {
            FailureUnit::Chip => fleet.chips,
            FailureUnit::Host => fleet.hosts,
        }
    }
}

/// The most failures one run simulates (a guard against an MTBF of
/// seconds on a year-long run; a 54-day run of 16,384 chips with a failure
/// every 3 h has about 430).
pub const MAX_FAILURES: u64 = 50_000_000;

/// The longest run simulated, days: about 27 years, so that the run's
/// seconds stay under the 10^9 any command's time is bounded by.
pub const MAX_DAYS: f64 = 10_000.0;

/// The most steps one run counts (54 days of 1 µs steps is 4.7e12), so
/// that step counts never overflow.
pub const MAX_STEPS: u64 = 1_000_000_000_000_000;

/// The costs a run's timeline is made of, derived from the fleet and the
/// configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Costs {
    /// Failure units in the fleet.
    pub units: u32,
    /// Mean time between failures of the whole fleet, seconds.
    pub system_mtbf_seconds: f64,
    /// One step, seconds.
    pub step_seconds: f64,
    /// Per step, the redundant policy's copy of each device's new state
    /// shards to its ring successor over one ICI link, one message per
    /// bucket, seconds (0 under rollback). Counted as overhead, not as
    /// productive time.
    pub replication_seconds_per_step: f64,
    /// Bytes of one checkpoint: parameters and every state slot.
    pub checkpoint_bytes: u64,
    /// Aggregate storage bandwidth, bytes per second.
    pub storage_bytes_per_s: f64,
    /// Writing one checkpoint to storage, seconds
    /// ([`crate::hardware::checkpoint_io_seconds`] unless the bandwidth is
    /// given).
    pub checkpoint_write_seconds: f64,
    /// Reading one back after a rollback, seconds (as the write).
    pub checkpoint_read_seconds: f64,
    /// Copying one checkpoint from device HBM to host memory, every chip
    /// its share at [`Fleet::host_link_bytes_per_s`], seconds: what an
    /// asynchronous checkpoint blocks training for.
    pub host_copy_seconds: f64,
    /// What training waits for per checkpoint, besides a previous write
    /// still in flight: the write (synchronous) or the host copy
    /// (asynchronous), seconds.
    pub checkpoint_blocking_seconds: f64,
    /// The storage write that overlaps training (asynchronous; 0 when
    /// synchronous), seconds. The checkpoint is usable for a rollback only
    /// once it has finished.
    pub checkpoint_background_seconds: f64,
    /// Failure to detection, seconds.
    pub detect_seconds: f64,
    /// Restart, seconds.
    pub restart_seconds: f64,
    /// Swap for a spare, seconds.
    pub reconfigure_seconds: f64,
    /// Re-sharding from the redundant copies: every device receives its
    /// state shards (both copies) over one ICI link, seconds.
    pub reshard_seconds: f64,
    /// Downtime of a rollback: detect, restart, reconfigure, read.
    pub rollback_seconds: f64,
    /// Downtime of a redundant recovery: detect, restart, reconfigure,
    /// re-shard.
    pub redundant_seconds: f64,
    /// Spare cubes (spare-cube only; 0 otherwise).
    pub spare_cubes: u32,
    /// Until a failed cube is a spare again, seconds.
    pub cube_repair_seconds: f64,
    /// Downtime of a spare-cube recovery while a spare is free: detect,
    /// reconfigure the OCSes, read the checkpoint (the job keeps its slice,
    /// so there is no restart); without a free spare it is a rollback.
    pub spare_cube_seconds: f64,
}

/// A policy as its command-line name (`redundant`).
fn by_name<S: serde::Serializer>(policy: &RecoveryPolicy, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(policy)
}

fn positive(name: &'static str, value: f64, hint: &'static str) -> Result<(), GoodputError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(GoodputError::NotPositive { name, value, hint })
    }
}

fn non_negative(name: &'static str, value: f64) -> Result<(), GoodputError> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(GoodputError::Negative { name, value })
    }
}

impl Costs {
    /// Checks every input and derives the costs; the run does no work
    /// unless this succeeds.
    pub fn derive(fleet: &Fleet, config: &GoodputConfig) -> Result<Costs, GoodputError> {
        config.check(fleet)?;
        positive(
            "--step-seconds",
            config.step_seconds,
            " (one training step)",
        )?;
        let spare_cubes = match config.recovery {
            RecoveryPolicy::SpareCube => fleet.spare_cubes.unwrap_or(0),
            _ => 0,
        };
        let units = config.units(fleet);
        let system_mtbf_seconds = config.mtbf_hours * 3600.0 / f64::from(units);
        let horizon = config.days * 86_400.0;
        if horizon / config.step_seconds > MAX_STEPS as f64 {
            return Err(GoodputError::TooManySteps {
                days: config.days,
                step_seconds: config.step_seconds,
                limit: MAX_STEPS,
            });
        }
        if horizon < config.step_seconds {
            return Err(GoodputError::ShorterThanAStep {
                days: config.days,
                step_seconds: config.step_seconds,
            });
        }
        let slots = config.optimizer_slots as f64;
        let params = config.model_params as f64;
        let checkpoint_bytes = params * ELEMENT_BYTES * (1.0 + slots);
        let (storage_bytes_per_s, io_seconds) = match config.storage_bytes_per_s {
            Some(bw) => (bw, checkpoint_bytes / bw),
            None => (
                f64::from(fleet.hosts) * CHECKPOINT_READ_BYTES_PER_S_PER_HOST,
                checkpoint_io_seconds(checkpoint_bytes, fleet.hosts),
            ),
        };
        let host_copy_seconds =
            checkpoint_bytes / (f64::from(fleet.chips) * fleet.host_link_bytes_per_s);
        let (checkpoint_blocking_seconds, checkpoint_background_seconds) =
            if config.async_checkpoint {
                (host_copy_seconds, io_seconds)
            } else {
                (io_seconds, 0.0)
            };
        // Each device's state shards: slots × params / chips elements, sent
        // as one message per bucket (as the pod's `replicate_state` does).
        let shard_bytes = slots * params / f64::from(fleet.chips) * ELEMENT_BYTES;
        let buckets = (params * ELEMENT_BYTES / DEFAULT_BUCKET_BYTES as f64).ceil();
        let redundant = config.recovery == RecoveryPolicy::Redundant;
        let replication_seconds_per_step = if redundant {
            buckets * fleet.ici_latency_seconds + shard_bytes / fleet.ici_bytes_per_s
        } else {
            0.0
        };
        let reshard_seconds = fleet.ici_latency_seconds + 2.0 * shard_bytes / fleet.ici_bytes_per_s;
        let parts = |restart: f64, last: f64| {
            fleet.detect_seconds + restart + config.reconfigure_seconds + last
        };
        Ok(Costs {
            units,
            system_mtbf_seconds,
            step_seconds: config.step_seconds,
            replication_seconds_per_step,
            checkpoint_bytes: checkpoint_bytes.round() as u64,
            storage_bytes_per_s,
            checkpoint_write_seconds: io_seconds,
            checkpoint_read_seconds: io_seconds,
            host_copy_seconds,
            checkpoint_blocking_seconds,
            checkpoint_background_seconds,
            detect_seconds: fleet.detect_seconds,
            restart_seconds: config.restart_seconds,
            reconfigure_seconds: config.reconfigure_seconds,
            reshard_seconds,
            rollback_seconds: parts(config.restart_seconds, io_seconds),
            redundant_seconds: parts(config.restart_seconds, reshard_seconds),
            spare_cubes,
            cube_repair_seconds: config.cube_repair_hours * 3600.0,
            spare_cube_seconds: parts(0.0, io_seconds),
        })
    }

    /// One recovery's parts under `recovery`, in the order they happen, as
    /// (what, seconds); their sum, in this order, is the policy's downtime
    /// ([`Costs::rollback_seconds`], [`Costs::redundant_seconds`],
    /// [`Costs::spare_cube_seconds`]). `with_read`: a checkpoint exists to
    /// read (a rollback before the first one reads nothing).
    pub fn recovery_parts(
        &self,
        recovery: RecoveryPolicy,
        with_read: bool,
    ) -> Vec<(&'static str, f64)> {
        let read = if with_read {
            self.checkpoint_read_seconds
        } else {
            0.0
        };
        match recovery {
            RecoveryPolicy::Redundant => vec![
                ("detect", self.detect_seconds),
                ("restart", self.restart_seconds),
                ("reconfigure", self.reconfigure_seconds),
                ("re-shard", self.reshard_seconds),
            ],
            RecoveryPolicy::SpareCube => vec![
                ("detect", self.detect_seconds),
                ("reconfigure", self.reconfigure_seconds),
                ("read", read),
            ],
            _ => vec![
                ("detect", self.detect_seconds),
                ("restart", self.restart_seconds),
                ("reconfigure", self.reconfigure_seconds),
                ("read", read),
            ],
        }
    }
}

/// The pod's modeled sharded optimizer step for a model of `params` f32
/// parameters with `slots` state slots (replicated on the pod's default
/// mesh, [`crate::cost_model::strategy`]: the reduce-scatter, the
/// update and the all-gather in closed form, in the time a small model
/// takes however large it is; [`crate::cost_model::replicated`]'s figure). It is
/// the step the crate models; a real step's forward and backward passes
/// are not in it (give the whole step's time as `step_seconds` instead).
/// Under `recovery` redundant the step also copies every state shard to
/// its partner, as a real redundant step does; rollback and spare-cube cost
/// nothing per step.
pub fn modeled_step_seconds(
    topology: &Topology,
    params: u64,
    slots: usize,
    recovery: RecoveryPolicy,
) -> Result<f64, GoodputError> {
    if params == 0 {
        return Err(GoodputError::NoParameters);
    }
    let elements = usize::try_from(params).unwrap_or(usize::MAX);
    let tensors = [("params".to_string(), vec![elements])];
    // Spare-cube's per-step cost is rollback's; its cube check belongs to
    // the failure model, which falls back to rollback without a spare.
    let per_step = match recovery {
        RecoveryPolicy::Redundant => RecoveryPolicy::Redundant,
        RecoveryPolicy::Rollback | RecoveryPolicy::SpareCube => RecoveryPolicy::Rollback,
    };
    let options = StrategyOptions {
        recovery: per_step,
        ..StrategyOptions::new(Strategy::Replicated, topology)
    };
    modeled_strategy_step(
        topology,
        &tensors,
        crate::ir::DType::F32,
        slots,
        DEFAULT_BUCKET_BYTES,
        &options,
    )
    .map(|step| step.step_seconds)
    .map_err(|source| GoodputError::Step {
        source: StepModelError(Arc::new(source)),
    })
}
