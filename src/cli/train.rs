//! `optirs-tpu train`: a model's optimizer sharded over a pod, stepped in
//! simulated time with seeded synthetic gradients, through failures.

use super::parse::number;
use super::parse::{
    parse_count, parse_count_u64, parse_finite, parse_positive, parse_seconds, parse_timed_device,
    usage,
};
use super::{output, progress};
use anyhow::{Context, Result, bail};
use clap::Args;
use clap::builder::PossibleValuesParser;
use ndarray::{ArrayD, IxDyn};
use optirs_tpu::health::Fault;
use optirs_tpu::sharding::ledger::{TimeKind, TimeLedger, TimeParts};
use optirs_tpu::sharding::{
    DEFAULT_BUCKET_BYTES, ParamSet, RecoveryPolicy, Reduction, ShardedStep, ShardingError,
    StepPhase, SyntheticGradients,
};
use optirs_tpu::topology::{DEFAULT_PRESET, DeviceId, load_topology};
use optirs_tpu::tpu::sharded::{CheckpointWrite, Resumed, WriteOutcome};
use optirs_tpu::tpu::{ShardedOptimizer, ShardedStepReport, ShardingConfig};
use optirs_tpu::{OptimError, Pod, TPUConfig};
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

/// The bundled default model: the tensors of one transformer block of
/// width 1024 with its embedding (vocabulary 4096): embedding, attention
/// QKV and output, MLP in and out, two norms' scales and biases; 16.8 M
/// parameters, three buckets at the default bucket size.
pub const DEFAULT_MODEL: &[usize] = &[
    4_194_304, 3_145_728, 1_048_576, 4_194_304, 4_194_304, 1024, 1024, 1024, 1024,
];

/// The tick `train` runs at unless `--tick-ms` says otherwise: fine
/// enough that a step's phases and a fault's time resolve (a pod file's
/// tick is often a millisecond, far longer than a step).
pub const DEFAULT_TRAIN_TICK_MS: f64 = 0.01;

#[derive(Args, Debug)]
pub struct TrainArgs {
    /// A preset name (see `optirs-tpu presets`) or a pod file path.
    #[arg(default_value = DEFAULT_PRESET)]
    pod: String,
    /// One of sgd, momentum, nesterov, adam, adamw, rmsprop, adagrad.
    #[arg(long, default_value = "adam", ignore_case = true,
          value_parser = PossibleValuesParser::new(optirs_tpu::optimizers::NAMES))]
    optimizer: String,
    /// Learning rate.
    #[arg(long, default_value_t = 1e-3, value_parser = parse_finite,
          allow_negative_numbers = true)]
    lr: f64,
    /// The model's tensor sizes in elements, comma-separated (the default
    /// is the bundled 16.8 M-parameter transformer block).
    #[arg(long, value_delimiter = ',', value_name = "N[,N...]", value_parser = parse_count)]
    params: Vec<usize>,
    /// Steps to complete (lost steps are redone).
    #[arg(long, default_value_t = 20, value_parser = parse_count_u64)]
    steps: u64,
    /// Bucket size in bytes.
    #[arg(long, default_value_t = DEFAULT_BUCKET_BYTES, value_parser = parse_count)]
    bucket_bytes: usize,
    /// Gradient reduction: mean or sum.
    #[arg(long, default_value = "mean")]
    reduction: Reduction,
    /// Kill a device at a simulated time: `DEVICE@SECONDS` (repeatable).
    #[arg(long, value_name = "DEVICE@SECONDS", value_parser = parse_timed_device)]
    kill: Vec<(u32, f64)>,
    /// Write a periodic checkpoint every this many simulated seconds.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    checkpoint_every: Option<f64>,
    /// Where checkpoints go (a fresh temporary directory by default).
    #[arg(long, value_name = "DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// Continue the run whose checkpoints are in DIR from its newest
    /// verified one, to `--steps` steps in all (the same arguments as the
    /// run; its checkpoints go on into DIR unless `--checkpoint-dir`
    /// says otherwise).
    #[arg(long, value_name = "DIR")]
    resume: Option<PathBuf>,
    /// What to do when a step fails: rollback, redundant or spare-cube
    /// (a cube-built pod with `cubes: (spares: N)`).
    #[arg(long, default_value = "rollback")]
    recovery: RecoveryPolicy,
    /// Simulated tick in milliseconds (default 0.01).
    #[arg(long, value_name = "MS", value_parser = parse_tick_ms)]
    tick_ms: Option<f64>,
    /// Seed of the synthetic gradients.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write a Chrome/Perfetto trace of every device's compute and
    /// communication per bucket, in simulated time. Never overwrites.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Model the step only, in closed form, without data or a pod in
    /// memory (for models and pods this machine cannot hold).
    #[arg(long)]
    modeled_only: bool,
    /// Under `mpirun`: how long a rank waits for another before it stops,
    /// naming the lost rank and its hosts (rank 0 waits this long, the
    /// others twice as long).
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0,
          value_parser = super::run::parse_rank_timeout)]
    pub(super) rank_timeout: f64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

impl TrainArgs {
    /// Periodic checkpoints every `--checkpoint-every` seconds on a pod at
    /// `tick_ns` ticks: (ticks, directory). The directory is
    /// `--checkpoint-dir` (created), or a fresh temporary one kept alive in
    /// `temporary` for the run.
    pub(super) fn checkpoints(
        &self,
        tick_ns: u64,
        temporary: &mut Option<tempfile::TempDir>,
    ) -> Result<Option<(u64, PathBuf)>> {
        let Some(every) = self.checkpoint_every else {
            return Ok(None);
        };
        if !(every.is_finite() && every > 0.0) {
            bail!("--checkpoint-every must be a positive number of seconds, got {every}");
        }
        let dir = match &self.checkpoint_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                dir.clone()
            }
            None => temporary.insert(tempfile::tempdir()?).path().to_path_buf(),
        };
        let ticks = ((every * 1e9) / tick_ns as f64).round().max(1.0) as u64;
        Ok(Some((ticks, dir)))
    }

    /// Refuses `--kill` under a policy that restores the last checkpoint
    /// when no checkpoints are written: the step could never recover.
    pub(super) fn refuse_unrecoverable_kills(&self) -> Result<()> {
        if !self.kill.is_empty()
            && matches!(
                self.recovery,
                RecoveryPolicy::Rollback | RecoveryPolicy::SpareCube
            )
            && self.checkpoint_every.is_none()
        {
            bail!(
                "--kill with --recovery {} needs --checkpoint-every SECONDS (it restores the \
                 last checkpoint), or use --recovery redundant",
                self.recovery
            );
        }
        Ok(())
    }

    /// `--kill`'s faults at their simulated times, each device checked
    /// against the pod's `devices`.
    pub(super) fn kills(&self, devices: u32) -> Result<Vec<(u64, Fault)>> {
        self.kill
            .iter()
            .map(|&(device, seconds)| {
                if device >= devices {
                    bail!(
                        "--kill: device {device} does not exist: {} has devices 0..{devices}",
                        self.pod
                    );
                }
                Ok((
                    (seconds * 1e9).round() as u64,
                    Fault::KillDevice(DeviceId(device)),
                ))
            })
            .collect()
    }
}

// Used by the `mpi` feature's split run.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
impl TrainArgs {
    /// `--json`.
    pub(super) fn json(&self) -> bool {
        self.json
    }

    /// Everything every rank of a split run must be given alike, for the
    /// start-up handshake.
    pub(super) fn describe(&self, sizes: &[usize]) -> String {
        format!(
            "train {} with {} at lr {} for {} steps, tensors {sizes:?} in {}-byte buckets, \
             {:?} reduction, {} recovery, seed {}, tick {:?} ms, kills {:?}, checkpoints \
             every {:?} s into {:?}",
            self.pod,
            self.optimizer.to_ascii_lowercase(),
            self.lr,
            self.steps,
            self.bucket_bytes,
            self.reduction,
            self.recovery,
            self.seed,
            self.tick_ms,
            self.kill,
            self.checkpoint_every,
            self.checkpoint_dir
        )
    }

    /// Refuses what a run split over ranks does not do yet, before any
    /// rank starts: spare-cube recovery (cube pods run in one process),
    /// periodic checkpoints without a directory every rank sees, traces.
    pub(super) fn refuse_split_only(&self) -> Result<()> {
        let refused = [
            (
                self.recovery == RecoveryPolicy::SpareCube,
                "--recovery spare-cube",
            ),
            (
                self.checkpoint_every.is_some() && self.checkpoint_dir.is_none(),
                "--checkpoint-every without --checkpoint-dir",
            ),
            (self.trace.is_some(), "--trace"),
            (self.modeled_only, "--modeled-only"),
        ];
        if let Some((_, flag)) = refused.iter().find(|(given, _)| *given) {
            bail!(
                "`train {flag}` runs as one process: a model split over MPI ranks recovers \
                 by rollback or from redundant copies, writes its periodic checkpoints into \
                 one --checkpoint-dir every rank sees, and writes no trace yet; change \
                 {flag}, or run without mpirun"
            );
        }
        self.refuse_unrecoverable_kills()
    }
}

#[derive(Serialize, Debug, Clone)]
struct FailureRow {
    step: u64,
    device: Option<u32>,
    at_seconds: f64,
    phase: String,
    cause: String,
}

#[derive(Serialize, Debug)]
struct RecoveryRow {
    policy: String,
    failed_step: u64,
    lost_devices: Vec<u32>,
    lost_steps: u64,
    recovery_seconds: f64,
    /// `[failed, spare]` cubes swapped (spare-cube only).
    swapped_cubes: Vec<[u32; 2]>,
    /// Why the policy that ran is not the one asked for, if it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

#[derive(Serialize, Debug)]
pub(super) struct TrainReport {
    pod: String,
    devices: u32,
    devices_at_end: usize,
    optimizer: String,
    params: usize,
    tensors: usize,
    buckets: usize,
    bucket_bytes: usize,
    steps_completed: u64,
    steps_attempted: u64,
    step_modeled_seconds: f64,
    phases: BTreeMap<String, f64>,
    hbm_bytes_per_device: u64,
    link_bytes: u64,
    failures: Vec<FailureRow>,
    recoveries: Vec<RecoveryRow>,
    /// Productive step time over simulated time, each step's own.
    goodput: f64,
    simulated_seconds: f64,
    /// Where the simulated time went.
    time: TimeReport,
    /// The same, in nanoseconds: the parts add up to `total_ns` exactly.
    time_ns: TimeParts,
    /// Checkpoint writes at step boundaries (none in a split run, whose
    /// periodic checkpoints take no simulated time).
    checkpoints: Option<CheckpointsReport>,
    /// The checkpoint this run resumed from.
    resumed_from: Option<ResumedRow>,
    tick_ns: u64,
    wall_seconds: f64,
    wall_seconds_per_step: f64,
    compile_seconds: f64,
    world_sha256: String,
    /// Processes the pod ran on (`mpirun -n R`; 1 without).
    ranks: u32,
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A tick in milliseconds, within the bounds a pod file's tick has.
fn parse_tick_ms(text: &str) -> Result<f64, String> {
    let ms = parse_positive(
        text,
        optirs_tpu::topology::resolve::MAX_TICK_NS as f64 * 1e-6,
    )?;
    if ms * 1e6 < optirs_tpu::topology::resolve::MIN_TICK_NS as f64 {
        return Err(format!(
            "`{text}` ms is shorter than the shortest tick a pod file may have ({} ns)",
            optirs_tpu::topology::resolve::MIN_TICK_NS
        ));
    }
    Ok(ms)
}

pub(super) fn model_of(sizes: &[usize]) -> Result<ParamSet<f32>> {
    let mut set = ParamSet::new();
    for (i, &n) in sizes.iter().enumerate() {
        if n == 0 {
            bail!("--params: tensor {i} has 0 elements; every tensor needs at least one");
        }
        // Deterministic, small initial values.
        let values: Vec<f32> = (0..n).map(|k| ((k % 97) as f32 - 48.0) * 1e-3).collect();
        set.insert(
            format!("param{i}"),
            ArrayD::from_shape_vec(IxDyn(&[n]), values)?,
        )?;
    }
    Ok(set)
}

pub fn train(args: TrainArgs) -> Result<()> {
    if args.resume.is_some() {
        if args.modeled_only {
            return Err(usage(
                "--modeled-only models one step: --resume needs a real run".to_string(),
            ));
        }
        if args.checkpoint_every.is_none() {
            return Err(usage(
                "--resume continues a run that writes checkpoints: give the run's \
                 --checkpoint-every SECONDS too"
                    .to_string(),
            ));
        }
    }
    if let Some(launch) = super::ranks::launched()?.filter(|l| l.size > 1) {
        if args.resume.is_some() {
            bail!(
                "`train --resume` runs as one process: a training run split over MPI ranks \
                 does not resume from its split checkpoints yet; resume without mpirun"
            );
        }
        return super::ranks::train(args, launch);
    }
    output::refuse_existing(&[("--trace", args.trace.as_deref())])?;
    let sizes = model_sizes(&args);
    if args.modeled_only {
        return modeled_only(&args, &sizes);
    }
    let topology = checked_topology(&args, &sizes)?;
    let mut pod = Pod::from_topology(topology)?;
    let kills = args.kills(pod.topology().num_devices())?;
    args.refuse_unrecoverable_kills()?;
    super::interrupt::install();
    for &(at_ns, fault) in &kills {
        pod.schedule_fault(at_ns, fault);
    }
    let config = TPUConfig::for_pod(pod.topology());
    let mut opt = ShardedOptimizer::new(
        base_optimizer(&args)?,
        config,
        pod,
        model_of(&sizes)?,
        sharding_of(&args),
    )?;
    let mut _tempdir = None;
    let dir = match (&args.checkpoint_dir, &args.resume) {
        // A resumed run writes on into the directory it resumed from.
        (None, Some(resume)) => args.checkpoint_every.map(|_| resume.clone()),
        _ => args.checkpoints(1, &mut _tempdir)?.map(|(_, dir)| dir),
    };
    if let (Some(dir), Some(every)) = (dir, args.checkpoint_every) {
        let every_ns = ((every * 1e9).round() as u64).max(1);
        if args.resume.is_none() {
            opt.check_checkpoint_root(&dir)?;
            refuse_earlier_run(&dir)?;
        }
        opt.enable_step_checkpoints(every_ns, dir, 3)?;
    }
    let resumed = match &args.resume {
        Some(dir) => {
            let resumed = opt.resume(dir)?;
            refuse_other_faults(&mut opt, &kills, resumed.at_ns)?;
            Some(resumed)
        }
        None => None,
    };
    let start_ns = resumed.as_ref().map(|r| r.at_ns);
    let outcome = run_steps_from(&mut opt, &args, args.json, start_ns, resumed)?;
    if let Some(path) = &args.trace {
        write_trace(path, &outcome.reports)?;
    }
    let world_sha256 = opt.pod_mut().world_sha256()?;
    let report = outcome.report(&opt, &args, world_sha256, 1)?;
    print_report(&report, args.json)
}

/// Refuses to start a fresh run in a directory holding this model's
/// checkpoints of an earlier run: rollback would restore them and
/// retention would keep them over this run's.
fn refuse_earlier_run(dir: &std::path::Path) -> Result<()> {
    let registry = optirs_tpu::checkpoint::engine_registry();
    let listings = optirs_tpu::checkpoint::list_checkpoints(dir, &registry)?;
    if let Some(newest) = listings.iter().find(|l| l.problem.is_none()) {
        bail!(
            "{} already holds checkpoints of this model from an earlier run (the newest is \
             {}): continue that run with --resume {}, or use an empty --checkpoint-dir",
            dir.display(),
            newest.path.display(),
            dir.display()
        );
    }
    Ok(())
}

/// Refuses `--kill`s that are not the resumed run's faults still to come
/// (the checkpoint carries them): a resumed run is the same run.
fn refuse_other_faults(
    opt: &mut ShardedOptimizer<Base>,
    kills: &[(u64, Fault)],
    resumed_at_ns: u64,
) -> Result<()> {
    let plan = opt
        .pod()
        .world()
        .resource::<optirs_tpu::health::FaultPlan>();
    let mut pending: Vec<(u64, Fault)> = plan.pending.iter().map(|f| (f.at_ns, f.fault)).collect();
    let mut given: Vec<(u64, Fault)> = kills
        .iter()
        .copied()
        .filter(|&(at, _)| at > resumed_at_ns)
        .collect();
    let key = |f: &(u64, Fault)| format!("{f:?}");
    pending.sort_by_key(key);
    given.sort_by_key(key);
    if pending != given {
        let show = |v: &[(u64, Fault)]| {
            let list: Vec<String> = v
                .iter()
                .map(|(at, f)| match f {
                    Fault::KillDevice(d) => format!("{}@{}", d.0, number(*at as f64 * 1e-9)),
                    other => format!("{other:?}@{}", number(*at as f64 * 1e-9)),
                })
                .collect();
            if list.is_empty() {
                "none".to_string()
            } else {
                list.join(", ")
            }
        };
        return Err(usage(format!(
            "--resume: the run's checkpoint at {} s has kills still to come: {}; the command \
             line gives {}. Resume with the run's own --kill arguments",
            number(resumed_at_ns as f64 * 1e-9),
            show(&pending),
            show(&given)
        )));
    }
    Ok(())
}

/// The model's tensor sizes: `--params`, or the bundled default.
pub(super) fn model_sizes(args: &TrainArgs) -> Vec<usize> {
    if args.params.is_empty() {
        DEFAULT_MODEL.to_vec()
    } else {
        args.params.clone()
    }
}

/// Checks the arguments every run needs and loads the pod at `train`'s
/// tick.
pub(super) fn checked_topology(
    args: &TrainArgs,
    sizes: &[usize],
) -> Result<optirs_tpu::topology::Topology> {
    let total: u128 = sizes.iter().map(|&n| n as u128).sum();
    // Params, gradients, and up to two state slots, on this host.
    let host_bytes = total.saturating_mul(4 * 5);
    let available = optirs_tpu::tpu::bench::host_memory_budget();
    if host_bytes > available {
        bail!(
            "--params totals {total} parameters, about {host_bytes} bytes on this host with \
             optimizer state, but {available} bytes are available; train a smaller model"
        );
    }
    let mut topology = load_topology(&args.pod)?;
    let tick_ms = args.tick_ms.unwrap_or(DEFAULT_TRAIN_TICK_MS);
    topology.tick_ns = ((tick_ms * 1e6).round() as u64).max(1);
    if topology.tick_ns > topology.heartbeat_interval_ns {
        return Err(usage(format!(
            "--tick-ms {} is longer than {}'s heartbeat interval ({} ms): a tick must not \
             skip a heartbeat, as in a pod file",
            number(tick_ms),
            topology.name,
            number(topology.heartbeat_interval_ns as f64 * 1e-6)
        )));
    }
    Ok(topology)
}

/// The optimizer `--optimizer` and `--lr` name.
pub(super) fn base_optimizer(args: &TrainArgs) -> Result<Base> {
    Ok(optirs_tpu::optimizers::by_name(
        &args.optimizer,
        args.lr as f32,
    )?)
}

/// The optimizer `train` shards.
pub(super) type Base = Box<dyn optirs_tpu::Optimizer<f32, IxDyn> + Send + Sync>;

/// How the model is bucketed, reduced and recovered.
pub(super) fn sharding_of(args: &TrainArgs) -> ShardingConfig {
    ShardingConfig {
        bucket_bytes: args.bucket_bytes,
        reduction: args.reduction,
        recovery: args.recovery,
    }
}

/// The steps of a run, as they went.
pub(super) struct Outcome {
    reports: Vec<ShardedStepReport>,
    failures: Vec<FailureRow>,
    attempts: u64,
    wall_seconds: f64,
    ledger: TimeLedger,
    writes: Vec<CheckpointWrite>,
    resumed: Option<Resumed>,
}

/// Steps until `--steps` steps completed (a failed step is retried after
/// its recovery); `quiet` hides the progress bar.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(super) fn run_steps(
    opt: &mut ShardedOptimizer<Base>,
    args: &TrainArgs,
    quiet: bool,
) -> Result<Outcome> {
    run_steps_from(opt, args, quiet, None, None)
}

/// [`run_steps`] whose time is counted from `start_ns` (the resumed
/// checkpoint's time; now by default), writing a checkpoint at every step
/// boundary where one is due; each stretch of simulated time is charged
/// to the ledger.
fn run_steps_from(
    opt: &mut ShardedOptimizer<Base>,
    args: &TrainArgs,
    quiet: bool,
    start_ns: Option<u64>,
    resumed: Option<Resumed>,
) -> Result<Outcome> {
    let devices = opt.pod().topology().num_devices();
    let mut ledger = TimeLedger::starting_at(start_ns.unwrap_or(opt.pod().clock().now_ns));
    // A resumed run waited out its checkpoint's write, as the run did.
    ledger.charge(TimeKind::CheckpointWrite, opt.pod().clock().now_ns);
    let bar = progress::bar(args.steps, quiet, "train");
    let started = Instant::now();
    let mut reports: Vec<ShardedStepReport> = Vec::new();
    let mut failures = Vec::new();
    let mut writes = Vec::new();
    let mut attempts = 0u64;
    let mut recovering = false;
    let max_attempts = args.steps.saturating_mul(4).saturating_add(devices as u64);
    while opt.steps_completed() < args.steps {
        if super::interrupt::requested() {
            bar.finish_and_clear();
            bail!(
                "stopped by a signal at a step boundary with {} of {} steps completed, at {} \
                 simulated (a --checkpoint-dir run continues with --resume)",
                opt.steps_completed(),
                args.steps,
                output::seconds(opt.pod().clock().now_seconds())
            );
        }
        attempts += 1;
        if attempts > max_attempts {
            bail!(
                "gave up after {attempts} attempts with {} steps completed",
                opt.steps_completed()
            );
        }
        let step = opt.steps_completed() + 1;
        let replicas = opt.layout()?.devices();
        let grads = SyntheticGradients {
            seed: args.seed,
            step,
            replicas,
            scale: 1e-2,
        };
        let wait = if recovering {
            TimeKind::Recovery
        } else {
            TimeKind::Other
        };
        match opt.step(&grads) {
            Ok(report) => {
                ledger.charge(wait, report.launched_at_ns);
                ledger.step_completed(report.step, report.launched_at_ns, report.completed_at_ns);
                recovering = false;
                reports.push(report);
                bar.set_position(opt.steps_completed());
                if let Some(write) = opt.checkpoint_if_due()? {
                    ledger.charge(TimeKind::CheckpointWrite, write.ended_at_ns);
                    writes.push(write);
                }
            }
            Err(e) => match e.downcast::<ShardingError>() {
                Ok(ShardingError::StepFailed {
                    step,
                    phase,
                    at_ns,
                    cause,
                }) => {
                    let launched_at_ns = opt
                        .pod()
                        .world()
                        .get_resource::<ShardedStep>()
                        .map_or(at_ns, |s| s.launched_at_ns);
                    ledger.charge(wait, launched_at_ns);
                    ledger.charge(TimeKind::CutOffStep, at_ns);
                    ledger.rolled_back_to(opt.steps_completed());
                    recovering = true;
                    failures.push(failure_row(step, phase, at_ns, &cause));
                }
                Ok(other) => return Err(OptimError::from(other).into()),
                Err(e) => return Err(e.into()),
            },
        }
    }
    ledger.charge(TimeKind::Other, opt.pod().clock().now_ns);
    let wall_seconds = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    Ok(Outcome {
        reports,
        failures,
        attempts,
        wall_seconds,
        ledger,
        writes,
        resumed,
    })
}

/// Where the run's simulated time went, seconds (the parts add up to
/// `simulated_seconds`; `time_ns` has them exactly).
#[derive(Serialize, Debug)]
struct TimeReport {
    productive_seconds: f64,
    undone_steps_seconds: f64,
    cut_off_steps_seconds: f64,
    checkpoint_write_seconds: f64,
    recovery_seconds: f64,
    other_seconds: f64,
}

/// The run's checkpoint writes at step boundaries.
#[derive(Serialize, Debug)]
struct CheckpointsReport {
    /// One write (or a rollback's read), modeled seconds.
    io_seconds: f64,
    written: usize,
    /// Writes a lost device cut short: nothing reached disk.
    voided: usize,
    retention_problems: Vec<String>,
}

/// The checkpoint a resumed run started from.
#[derive(Serialize, Debug)]
struct ResumedRow {
    path: String,
    steps_completed: u64,
    at_seconds: f64,
}

impl Outcome {
    /// The report of the run, with the world's digest (a split run's is
    /// the merged world's) and the rank count.
    pub(super) fn report(
        &self,
        opt: &ShardedOptimizer<Base>,
        args: &TrainArgs,
        world_sha256: String,
        ranks: u32,
    ) -> Result<TrainReport> {
        let reports = &self.reports;
        let parts = self.ledger.parts();
        let simulated_seconds = parts.total_ns as f64 * 1e-9;
        let step_modeled_seconds = median(reports.iter().map(|r| r.modeled_seconds).collect());
        let mut phase_samples: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for r in reports {
            for (k, v) in &r.phases {
                phase_samples.entry(k.clone()).or_default().push(*v);
            }
        }
        let phases = phase_samples
            .into_iter()
            .map(|(k, v)| (k, median(v)))
            .collect();
        let layout = opt.layout()?.clone();
        let seconds = |ns: u64| ns as f64 * 1e-9;
        let checkpoints = if self.writes.is_empty() && opt.ranked().is_some() {
            None
        } else {
            let voided = self
                .writes
                .iter()
                .filter(|w| matches!(w.outcome, WriteOutcome::Voided { .. }))
                .count();
            Some(CheckpointsReport {
                io_seconds: opt.checkpoint_seconds()?,
                written: self.writes.len() - voided,
                voided,
                retention_problems: self
                    .writes
                    .iter()
                    .flat_map(|w| match &w.outcome {
                        WriteOutcome::Written {
                            retention_problems, ..
                        } => retention_problems.clone(),
                        WriteOutcome::Voided { .. } => Vec::new(),
                    })
                    .collect(),
            })
        };
        Ok(TrainReport {
            pod: opt.pod().topology().name.clone(),
            devices: opt.pod().topology().num_devices(),
            devices_at_end: layout.devices(),
            optimizer: args.optimizer.to_ascii_lowercase(),
            params: layout.elements,
            tensors: layout.tensors.len(),
            buckets: layout.buckets.len(),
            bucket_bytes: args.bucket_bytes,
            steps_completed: opt.steps_completed(),
            steps_attempted: self.attempts,
            step_modeled_seconds,
            phases,
            hbm_bytes_per_device: reports
                .iter()
                .flat_map(|r| r.hbm_bytes_per_device.iter().map(|&(_, b)| b))
                .max()
                .unwrap_or(0),
            link_bytes: reports.iter().map(|r| r.link_bytes).sum(),
            failures: self.failures.clone(),
            recoveries: opt
                .recoveries()
                .iter()
                .map(|r| RecoveryRow {
                    policy: r.policy.to_string(),
                    failed_step: r.failed_step,
                    lost_devices: r.lost_devices.iter().map(|d| d.0).collect(),
                    lost_steps: r.lost_steps,
                    recovery_seconds: r.recovery_seconds,
                    swapped_cubes: r.swapped_cubes.clone(),
                    note: (args.recovery == RecoveryPolicy::SpareCube
                        && r.policy == RecoveryPolicy::Rollback)
                        .then(|| {
                            "no spare cube was free: rolled back onto the survivors, as \
                             `goodput` models it"
                                .to_string()
                        }),
                })
                .collect(),
            goodput: parts.goodput(),
            simulated_seconds,
            time: TimeReport {
                productive_seconds: seconds(parts.productive_ns),
                undone_steps_seconds: seconds(parts.undone_ns),
                cut_off_steps_seconds: seconds(parts.cut_off_ns),
                checkpoint_write_seconds: seconds(parts.checkpoint_write_ns),
                recovery_seconds: seconds(parts.recovery_ns),
                other_seconds: seconds(parts.other_ns),
            },
            time_ns: parts,
            checkpoints,
            resumed_from: self.resumed.as_ref().map(|r| ResumedRow {
                path: r.path.display().to_string(),
                steps_completed: r.steps_completed,
                at_seconds: r.at_ns as f64 * 1e-9,
            }),
            tick_ns: opt.pod().clock().tick_ns,
            wall_seconds: self.wall_seconds,
            wall_seconds_per_step: self.wall_seconds / self.attempts.max(1) as f64,
            compile_seconds: opt.compile_seconds(),
            world_sha256,
            ranks,
        })
    }
}

/// `--modeled-only`: the closed-form step of the model on the pod under
/// `--recovery` (the redundant copies' HBM and `replicate_state` time),
/// after the checks a real run makes before its first step, with its
/// messages; then what one closed-form, failure-free step cannot model is
/// refused.
fn modeled_only(args: &TrainArgs, sizes: &[usize]) -> Result<()> {
    if let Some(i) = sizes.iter().position(|&n| n == 0) {
        bail!("--params: tensor {i} has 0 elements; every tensor needs at least one");
    }
    let base = base_optimizer(args)?;
    let slots = base.update_rule().map_or(0, |r| r.slot_names().len());
    let started = Instant::now();
    // The closed form holds no model on this host, so the host-memory
    // check is given none; the pod and `--tick-ms` are checked as a real
    // run checks them.
    let topology = checked_topology(args, &[])?;
    let loaded = started.elapsed().as_secs_f64();
    args.kills(topology.num_devices())?;
    args.refuse_unrecoverable_kills()?;
    let tensors: Vec<(String, Vec<usize>)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| (format!("param{i}"), vec![n]))
        .collect();
    let started = Instant::now();
    let step = optirs_tpu::sharding::modeled::modeled_step_with_recovery(
        &topology,
        &tensors,
        optirs_tpu::ir::DType::F32,
        slots,
        args.bucket_bytes,
        args.recovery,
    )
    .map_err(OptimError::from)?;
    let wall_seconds = started.elapsed().as_secs_f64();
    if args.trace.is_some()
        || !args.kill.is_empty()
        || args.checkpoint_every.is_some()
        || args.checkpoint_dir.is_some()
    {
        return Err(usage(
            "--modeled-only models failure-free steps in closed form: --trace, --kill, \
             --checkpoint-every and --checkpoint-dir need a real run (drop --modeled-only)",
        ));
    }
    let fits = step.hbm_bytes_per_device <= topology.hbm_bytes;
    // Failure-free steps one after another: no checkpoint, no recovery.
    let simulated_seconds = step.timeline.step_seconds * args.steps as f64;
    let report = json!({
        "pod": topology.name,
        "devices": step.devices,
        "optimizer": args.optimizer.to_ascii_lowercase(),
        "recovery": args.recovery.to_string(),
        "params": sizes.iter().map(|&n| n as u128).sum::<u128>(),
        "buckets": step.buckets,
        "bucket_bytes": args.bucket_bytes,
        "steps": args.steps,
        "step_modeled_seconds": step.timeline.step_seconds,
        "simulated_seconds": simulated_seconds,
        "phases": step.timeline.phases,
        "hbm_bytes_per_device": step.hbm_bytes_per_device,
        "hbm_capacity_bytes": topology.hbm_bytes,
        "fits_in_hbm": fits,
        "link_bytes": step.link_bytes,
        "topology_seconds": loaded,
        "wall_seconds": wall_seconds,
    });
    if args.json {
        return output::print_json(&report);
    }
    let mut text = format!(
        "modeled {} parameters with {} on {} ({}, {}), {} recovery: step {}, {} for {} \
         (modeled in {} wall)\n",
        report["params"],
        report["optimizer"].as_str().unwrap_or(""),
        topology.name,
        output::plural(step.devices as u64, "device", "devices"),
        output::plural(step.buckets as u64, "bucket", "buckets"),
        args.recovery,
        output::seconds(step.timeline.step_seconds),
        output::seconds(simulated_seconds),
        output::plural(args.steps, "step", "steps"),
        output::seconds(wall_seconds),
    );
    for (k, v) in &step.timeline.phases {
        text += &format!("  {k:<24} {}\n", output::seconds(*v));
    }
    text += &format!(
        "HBM per device {} of {} ({}); links move {} per step\n",
        output::bytes(step.hbm_bytes_per_device),
        output::bytes(topology.hbm_bytes),
        match (fits, args.recovery) {
            (true, _) => "fits",
            (false, RecoveryPolicy::Redundant) => {
                "does not fit: every replica holds all parameters and gradients (weight-update \
                 sharding shards the optimizer state only), and the redundant policy keeps a \
                 second copy of each device's state shards"
            }
            (false, _) => {
                "does not fit: every replica holds all parameters and gradients (weight-update \
                 sharding shards the optimizer state only)"
            }
        },
        output::bytes(step.link_bytes)
    );
    output::print_text(&text)
}

fn failure_row(
    step: u64,
    phase: StepPhase,
    at_ns: u64,
    cause: &optirs_tpu::sharding::FailureCause,
) -> FailureRow {
    FailureRow {
        step,
        device: cause.device().map(|d| d.0),
        at_seconds: at_ns as f64 * 1e-9,
        phase: phase.key(),
        cause: cause.to_string(),
    }
}

/// Every device's spans per bucket, in simulated time (µs), one process
/// per device with a compute and a communication thread.
fn write_trace(path: &std::path::Path, reports: &[ShardedStepReport]) -> Result<()> {
    let mut events = Vec::new();
    let devices: Vec<u32> = reports
        .first()
        .map(|r| r.hbm_bytes_per_device.iter().map(|&(d, _)| d).collect())
        .unwrap_or_default();
    for &d in &devices {
        events.push(json!({"ph": "M", "name": "process_name", "pid": d, "args": {"name": format!("device {d}")}}));
        events.push(json!({"ph": "M", "name": "thread_name", "pid": d, "tid": 0, "args": {"name": "compute"}}));
        events.push(json!({"ph": "M", "name": "thread_name", "pid": d, "tid": 1, "args": {"name": "communication"}}));
        if reports
            .first()
            .is_some_and(|r| r.spans.iter().any(|s| s.phase.is_dcn()))
        {
            events.push(json!({"ph": "M", "name": "thread_name", "pid": d, "tid": 2, "args": {"name": "DCN (across slices)"}}));
        }
    }
    for r in reports {
        let devices: Vec<u32> = r.hbm_bytes_per_device.iter().map(|&(d, _)| d).collect();
        for span in &r.spans {
            let (tid, cat) = if span.phase == StepPhase::Update {
                (0, "compute")
            } else if span.phase.is_dcn() {
                (2, "dcn")
            } else {
                (1, "communication")
            };
            for &d in &devices {
                events.push(json!({
                    "ph": "X",
                    "name": format!("{} bucket {}", span.phase.key(), span.bucket),
                    "cat": cat,
                    "pid": d,
                    "tid": tid,
                    "ts": r.launched_at_ns as f64 * 1e-3 + span.start_seconds * 1e6,
                    "dur": (span.end_seconds - span.start_seconds) * 1e6,
                    "args": {"step": r.step},
                }));
            }
        }
    }
    let trace = json!({"traceEvents": events, "displayTimeUnit": "ns"});
    output::write_new("--trace", path, &serde_json::to_string(&trace)?)
}

pub(super) fn print_report(r: &TrainReport, json: bool) -> Result<()> {
    if json {
        return output::print_json(r);
    }
    let mut text = format!(
        "trained {} ({} in {}, {}) with {} on {} ({})\n\
         {} completed ({} attempted); step {} modeled, {} wall per step; compile {}\n",
        "the model",
        output::plural(r.params as u64, "parameter", "parameters"),
        output::plural(r.tensors as u64, "tensor", "tensors"),
        output::plural(r.buckets as u64, "bucket", "buckets"),
        r.optimizer,
        r.pod,
        output::plural(u64::from(r.devices), "device", "devices"),
        output::plural(r.steps_completed, "step", "steps"),
        r.steps_attempted,
        output::seconds(r.step_modeled_seconds),
        output::seconds(r.wall_seconds_per_step),
        output::seconds(r.compile_seconds),
    );
    for (k, v) in &r.phases {
        text += &format!("  {k:<24} {}\n", output::seconds(*v));
    }
    let dcn: f64 = ["reduce_scatter.dcn", "all_gather.dcn"]
        .iter()
        .filter_map(|k| r.phases.get(*k))
        .sum();
    if dcn > 0.0 {
        text += &format!(
            "DCN phase (across slices) {} of the {} step\n",
            output::seconds(dcn),
            output::seconds(r.step_modeled_seconds)
        );
    }
    text += &format!(
        "HBM per device (max) {}; links moved {}\n",
        output::bytes(r.hbm_bytes_per_device),
        output::bytes(r.link_bytes)
    );
    for f in &r.failures {
        text += &format!(
            "  step {} failed at {:.6} s during {}: {}\n",
            f.step, f.at_seconds, f.phase, f.cause
        );
    }
    for rec in &r.recoveries {
        text += &format!(
            "  recovered by {} from step {}: lost devices {:?}, {} lost, {} modeled\n",
            rec.policy,
            rec.failed_step,
            rec.lost_devices,
            output::plural(rec.lost_steps, "step", "steps"),
            output::seconds(rec.recovery_seconds)
        );
        for [failed, spare] in &rec.swapped_cubes {
            text += &format!("    cube {failed} swapped for spare cube {spare}\n");
        }
    }
    let ranks = if r.ranks > 1 {
        format!(" (merged from {} ranks)", r.ranks)
    } else {
        String::new()
    };
    text += &format!(
        "goodput {:.1} % of {} simulated ({} devices at the end); {} wall\nworld sha256 {}{ranks}\n",
        r.goodput * 100.0,
        output::seconds(r.simulated_seconds),
        r.devices_at_end,
        output::seconds(r.wall_seconds),
        r.world_sha256
    );
    output::print_text(&text)
}
