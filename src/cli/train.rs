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
use optirs_tpu::health::{DeviceState, Fault};
use optirs_tpu::sharding::ledger::{TimeKind, TimeLedger, TimeParts};
use optirs_tpu::sharding::{
    DEFAULT_BUCKET_BYTES, ParamSet, RecoveryPolicy, RecoveryRecord, Reduction, ShardedStep,
    ShardingError, StepPhase, SyntheticGradients,
};
use optirs_tpu::topology::{DEFAULT_PRESET, DeviceId, load_topology};
use optirs_tpu::tpu::sharded::{CheckpointWrite, Resumed, WriteOutcome};
use optirs_tpu::tpu::{ShardedOptimizer, ShardedStepReport, ShardingConfig};
use optirs_tpu::{OptimError, Pod, TPUConfig};
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
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
    /// Learning rate: any sign, representable as an f32 (the update runs
    /// in f32).
    #[arg(long, default_value_t = 1e-3, value_parser = parse_learning_rate,
          allow_negative_numbers = true)]
    lr: f64,
    /// The model's tensor sizes in elements, comma-separated (the default
    /// is the bundled 16.8 M-parameter transformer block).
    #[arg(long, value_delimiter = ',', value_name = "N[,N...]", value_parser = parse_count,
          allow_negative_numbers = true)]
    params: Vec<usize>,
    /// Steps to complete (lost steps are redone).
    #[arg(long, default_value_t = 20, value_parser = parse_count_u64,
          allow_negative_numbers = true)]
    steps: u64,
    /// Bucket size in bytes (25 MiB by default): the model's tensors are
    /// packed into buckets whose collectives and updates overlap.
    #[arg(long, default_value_t = DEFAULT_BUCKET_BYTES, value_parser = parse_count,
          allow_negative_numbers = true)]
    bucket_bytes: usize,
    /// Gradient reduction: mean or sum.
    #[arg(long, default_value = "mean")]
    reduction: Reduction,
    /// Kill a device at a simulated time, seconds from the start:
    /// `DEVICE@SECONDS` (repeatable, each device at most once). A kill due
    /// after the run ends is an error once the run shows its end.
    #[arg(long, value_name = "DEVICE@SECONDS", value_parser = parse_timed_device)]
    kill: Vec<(u32, f64)>,
    /// Write a periodic checkpoint every this many simulated seconds
    /// (needed by rollback and spare-cube recovery), rounded to whole
    /// ticks; at least one tick.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds,
          allow_negative_numbers = true)]
    checkpoint_every: Option<f64>,
    /// Where the periodic checkpoints go: a directory, created if missing
    /// (only with --checkpoint-every; a fresh temporary directory by
    /// default).
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
    /// Simulated tick in milliseconds (default 0.01), within a pod file's
    /// bounds and at most the pod's heartbeat interval.
    #[arg(long, value_name = "MS", value_parser = parse_tick_ms,
          allow_negative_numbers = true)]
    tick_ms: Option<f64>,
    /// Seed of the synthetic gradients: a whole number from 0 (`1e3`
    /// reads as 1000, as every count does).
    #[arg(long, default_value_t = 0, value_parser = parse_seed,
          allow_negative_numbers = true)]
    seed: u64,
    /// Write a Chrome/Perfetto trace in simulated time: the run's steps,
    /// failed steps, waits, recoveries (by part) and checkpoint writes,
    /// and every device's compute and communication per bucket. Never
    /// overwrites; checked before the run.
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

    /// Refuses, before any work, what the command line alone shows the
    /// run cannot honour: an export path that exists or whose directory
    /// does not, `--checkpoint-dir` without `--checkpoint-every` (it would
    /// do nothing) or naming a file, a device killed twice, and kills no
    /// checkpoint can recover.
    pub(super) fn refuse_unusable(&self) -> Result<()> {
        output::refuse_existing(&[("--trace", self.trace.as_deref())])?;
        if let Some(trace) = &self.trace {
            refuse_missing_parent("--trace", trace)?;
        }
        if let Some(dir) = &self.checkpoint_dir {
            if self.checkpoint_every.is_none() {
                return Err(usage(format!(
                    "--checkpoint-dir {} does nothing without --checkpoint-every SECONDS: \
                     give the interval, or drop --checkpoint-dir",
                    dir.display()
                )));
            }
            refuse_non_directory("--checkpoint-dir", dir)?;
        }
        self.refuse_repeated_kills()?;
        self.refuse_unrecoverable_kills()
    }

    /// Refuses a device named by two `--kill`s: a device dies once (the
    /// second kill could never apply, as `run` says).
    fn refuse_repeated_kills(&self) -> Result<()> {
        let mut kills = self.kill.clone();
        kills.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        for pair in kills.windows(2) {
            let ((device, first), (_, second)) = (pair[0], pair[1]);
            if pair[0].0 == pair[1].0 {
                return Err(usage(format!(
                    "--kill {device}@{first} and --kill {device}@{second}: device {device} is \
                     killed at {} first, and a device dies once; keep one of them",
                    output::seconds(first)
                )));
            }
        }
        Ok(())
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
            return Err(usage(format!(
                "--kill with --recovery {} needs --checkpoint-every SECONDS (it restores the \
                 last checkpoint), or use --recovery redundant",
                self.recovery
            )));
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
                    return Err(usage(format!(
                        "--kill {device}@{seconds}: device {device} does not exist: {} has \
                         devices 0..{devices}",
                        self.pod
                    )));
                }
                Ok((
                    (seconds * 1e9).round() as u64,
                    Fault::KillDevice(DeviceId(device)),
                ))
            })
            .collect()
    }

    /// Refuses, after the run, the `--kill`s still pending in the pod's
    /// fault plan: due after the run's simulated end, they never happened
    /// (a run's end is only known once it has run). Each is named with the
    /// end.
    pub(super) fn refuse_kills_that_never_happened(&self, pod: &mut Pod) -> Result<()> {
        let end_ns = pod.clock().now_ns;
        let missed: Vec<String> = pod
            .faults_that_cannot_apply(0)
            .iter()
            .filter_map(|f| match f.scheduled.fault {
                Fault::KillDevice(DeviceId(device)) if f.scheduled.at_ns > end_ns => {
                    let asked = self
                        .kill
                        .iter()
                        .find(|&&(d, s)| {
                            d == device && (s * 1e9).round() as u64 == f.scheduled.at_ns
                        })
                        .map_or(f.scheduled.at_ns as f64 * 1e-9, |&(_, s)| s);
                    Some(format!("--kill {device}@{asked}"))
                }
                _ => None,
            })
            .collect();
        if missed.is_empty() {
            return Ok(());
        }
        let (was, it) = if missed.len() == 1 {
            ("it was", "it")
        } else {
            ("they were", "them")
        };
        bail!(
            "{} never happened: the run ended at {} of simulated time, before {was} due; \
             give a time within the run (the report above is of a run without {it})",
            missed.join(" and "),
            output::seconds(end_ns as f64 * 1e-9),
        )
    }
}

/// Refuses an output file whose directory does not exist (or is not a
/// directory), before any work: the write at the end would fail.
fn refuse_missing_parent(flag: &str, path: &Path) -> Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match std::fs::metadata(parent) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(usage(format!(
            "{flag} {}: {} is a file, not a directory",
            path.display(),
            parent.display()
        ))),
        Err(_) => Err(usage(format!(
            "{flag} {}: the directory {} does not exist",
            path.display(),
            parent.display()
        ))),
    }
}

/// Refuses a directory flag naming something that is not a directory, or
/// that cannot be created because a file stands where one of its parents
/// should be.
fn refuse_non_directory(flag: &str, dir: &Path) -> Result<()> {
    for existing in dir.ancestors().filter(|a| !a.as_os_str().is_empty()) {
        let Ok(meta) = std::fs::metadata(existing) else {
            continue;
        };
        if meta.is_dir() {
            return Ok(());
        }
        return Err(usage(if existing == dir {
            format!("{flag} {}: is a file, not a directory", dir.display())
        } else {
            format!(
                "{flag} {}: cannot be created: {} is a file, not a directory",
                dir.display(),
                existing.display()
            )
        }));
    }
    Ok(())
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
        self.refuse_unusable()
    }
}

#[derive(Serialize, Debug, Clone)]
struct FailureRow {
    step: u64,
    device: Option<u32>,
    /// When the failed attempt was launched.
    launched_at_seconds: f64,
    /// When the device was killed (a kill's failure only).
    killed_at_seconds: Option<f64>,
    /// When the step saw the failure and stopped.
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
    /// When the recovery started (the failure seen).
    started_at_seconds: f64,
    /// The sum of the three parts below.
    recovery_seconds: f64,
    /// Reading the checkpoint restored (rollback, spare-cube).
    read_seconds: f64,
    /// The optical switches swapping cubes (spare-cube).
    reconfigure_seconds: f64,
    /// Moving the new state shards to their devices.
    reshard_seconds: f64,
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

/// A learning rate: finite, and still itself in f32, where the update
/// runs (`1e300` would be infinite there and `1e-300` zero).
fn parse_learning_rate(text: &str) -> Result<f64, String> {
    let lr = parse_finite(text)?;
    let single = lr as f32;
    if single.is_infinite() || (lr != 0.0 && single == 0.0) {
        return Err(format!(
            "`{text}` is outside the f32 range the update runs in: give a learning rate \
             between {} and {} in magnitude, or 0",
            number(f64::from(f32::from_bits(1))),
            number(f64::from(f32::MAX))
        ));
    }
    Ok(lr)
}

/// A seed: 0, or any whole number [`parse_count_u64`] reads.
fn parse_seed(text: &str) -> Result<u64, String> {
    if text.trim() == "0" {
        return Ok(0);
    }
    parse_count_u64(text).map_err(|_| {
        format!(
            "`{text}` is not a seed: give a whole number from 0 to {}",
            u64::MAX
        )
    })
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
    args.refuse_unusable()?;
    let sizes = model_sizes(&args);
    if args.modeled_only {
        return modeled_only(&args, &sizes);
    }
    let building = progress::spinner(args.json, &format!("building the pod {}", args.pod));
    let topology = checked_topology(&args, &sizes)?;
    let mut pod = Pod::from_topology(topology)?;
    let kills = args.kills(pod.topology().num_devices())?;
    super::interrupt::install();
    for &(at_ns, fault) in &kills {
        pod.schedule_fault(at_ns, fault);
    }
    let config = TPUConfig::for_pod(pod.topology());
    building.set_message(compiling_message(&sizes, pod.topology().num_devices()));
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
    building.finish_and_clear();
    let outcome = run_steps_from(&mut opt, &args, args.json, start_ns, resumed)?;
    let world_sha256 = opt.pod_mut().world_sha256()?;
    let report = outcome.report(&opt, &args, world_sha256, 1)?;
    if let Some(path) = &args.trace {
        let writes = outcome.checkpoint_write_spans();
        let end_ns = opt.pod().clock().now_ns;
        write_trace(path, &report.trace_input(&outcome.reports, &writes, end_ns))?;
    }
    print_report(&report, args.json)?;
    args.refuse_kills_that_never_happened(opt.pod_mut())
}

/// What the spinner says while the model is placed: its shards on every
/// device and its update compiled.
fn compiling_message(sizes: &[usize], devices: u32) -> String {
    let params: u128 = sizes.iter().map(|&n| n as u128).sum();
    format!(
        "sharding {params} parameters over {} and compiling the update",
        output::plural(u64::from(devices), "device", "devices")
    )
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
        let readable = |bytes: u128| output::bytes(u64::try_from(bytes).unwrap_or(u64::MAX));
        bail!(
            "--params totals {total} parameters, about {} on this host with optimizer state, \
             but {} is available; train a smaller model (or --modeled-only)",
            readable(host_bytes),
            readable(available)
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
                    failures.push(failure_row(opt, &args.kill, step, phase, at_ns, &cause));
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
    /// The run's checkpoint writes as (start ns, seconds), for the trace.
    fn checkpoint_write_spans(&self) -> Vec<(u64, f64)> {
        self.writes
            .iter()
            .map(|w| {
                let ns = w.ended_at_ns.saturating_sub(w.started_at_ns);
                (w.started_at_ns, ns as f64 * 1e-9)
            })
            .collect()
    }

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
                    note: (args.recovery == RecoveryPolicy::SpareCube
                        && r.policy == RecoveryPolicy::Rollback)
                        .then(|| {
                            "no spare cube was free: rolled back onto the survivors, as \
                             `goodput` models it"
                                .to_string()
                        }),
                    ..recovery_row(r)
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

/// A failed attempt as the report and the trace show it: when it was
/// launched (the pod's step resource still holds the failed step) and,
/// for a killed device, when it died (the world's ground truth; after a
/// cube swap has revived the device's id, the `kills` entry that was due),
/// so the wait until the step saw it shows.
fn failure_row(
    opt: &ShardedOptimizer<Base>,
    kills: &[(u32, f64)],
    step: u64,
    phase: StepPhase,
    at_ns: u64,
    cause: &optirs_tpu::sharding::FailureCause,
) -> FailureRow {
    let pod = opt.pod();
    let launched_at_ns = pod
        .world()
        .get_resource::<ShardedStep>()
        .filter(|s| s.number == step)
        .map_or(at_ns, |s| s.launched_at_ns);
    let fault_at_ns = cause
        .device()
        .and_then(|d| pod.device_entity(d.0).ok())
        .and_then(|e| pod.world().get::<DeviceState>(e).copied())
        .and_then(|state| match state {
            DeviceState::Killed { at_ns } => Some(at_ns),
            _ => None,
        })
        .or_else(|| match cause {
            optirs_tpu::sharding::FailureCause::DeviceKilled(d) => kills
                .iter()
                .map(|&(device, seconds)| (device, (seconds * 1e9).round() as u64))
                .filter(|&(device, due)| device == d.0 && due <= at_ns)
                .map(|(_, due)| due)
                .max(),
            _ => None,
        });
    FailureRow {
        step,
        device: cause.device().map(|d| d.0),
        launched_at_seconds: launched_at_ns as f64 * 1e-9,
        killed_at_seconds: fault_at_ns.map(|ns| ns as f64 * 1e-9),
        at_seconds: at_ns as f64 * 1e-9,
        phase: phase.key(),
        cause: cause.to_string(),
    }
}

/// A recovery as the report shows it, its time broken into the parts
/// that add up to it.
fn recovery_row(r: &RecoveryRecord) -> RecoveryRow {
    RecoveryRow {
        policy: r.policy.to_string(),
        failed_step: r.failed_step,
        lost_devices: r.lost_devices.iter().map(|d| d.0).collect(),
        lost_steps: r.lost_steps,
        started_at_seconds: r.failed_at_ns as f64 * 1e-9,
        recovery_seconds: r.recovery_seconds,
        read_seconds: r.read_seconds,
        reconfigure_seconds: r.reconfigure_seconds,
        reshard_seconds: r.reshard_seconds,
        swapped_cubes: r.swapped_cubes.clone(),
        note: None,
    }
}

impl TrainReport {
    /// The trace of this run: its steps' `reports` (the report keeps no
    /// spans) and the periodic checkpoint `writes` with it.
    fn trace_input<'a>(
        &'a self,
        reports: &'a [ShardedStepReport],
        writes: &'a [(u64, f64)],
        end_ns: u64,
    ) -> TraceInput<'a> {
        TraceInput {
            reports,
            failures: &self.failures,
            recoveries: &self.recoveries,
            checkpoint_writes: writes,
            devices: self.devices,
            tick_ns: self.tick_ns,
            end_ns,
        }
    }
}

/// What a train trace draws: the steps, the failed attempts, the
/// recoveries and checkpoint writes, in simulated time.
struct TraceInput<'a> {
    reports: &'a [ShardedStepReport],
    failures: &'a [FailureRow],
    recoveries: &'a [RecoveryRow],
    checkpoint_writes: &'a [(u64, f64)],
    devices: u32,
    tick_ns: u64,
    /// The run's simulated end: the timeline is drawn up to it.
    end_ns: u64,
}

/// The run's tracks: one process "run" above the devices, whose threads
/// never hold overlapping spans (Perfetto nests or drops those).
mod track {
    /// Steps, failed steps, recoveries and the waits between them: every
    /// simulated second of the run is in exactly one span here.
    pub const TIMELINE: u32 = 0;
    /// Kills and the wait until the step saw them.
    pub const FAULTS: u32 = 1;
    /// A recovery's parts, one after another.
    pub const RECOVERY_PARTS: u32 = 2;
    /// Periodic checkpoint writes.
    pub const CHECKPOINTS: u32 = 3;
}

/// A complete ("X") span in simulated seconds, on the trace's µs clock.
fn span(
    name: impl Into<String>,
    cat: &str,
    pid: u32,
    tid: u32,
    start_s: f64,
    seconds: f64,
    args: serde_json::Value,
) -> serde_json::Value {
    json!({
        "ph": "X",
        "name": name.into(),
        "cat": cat,
        "pid": pid,
        "tid": tid,
        "ts": start_s * 1e6,
        "dur": seconds.max(0.0) * 1e6,
        "args": args,
    })
}

/// The Chrome/Perfetto trace of a run (see [`TraceInput`], [`track`]):
/// a "run" process (pid = the device count, shown first) and one process
/// per device with a compute, a communication and (multislice) a DCN
/// thread, per bucket.
fn trace_of(input: &TraceInput<'_>) -> serde_json::Value {
    let run = input.devices;
    let mut events = vec![
        json!({"ph": "M", "name": "process_name", "pid": run, "args": {"name": "run"}}),
        json!({"ph": "M", "name": "process_sort_index", "pid": run, "args": {"sort_index": -1}}),
    ];
    for (tid, name) in [
        (track::TIMELINE, "steps, failures, recoveries, waits"),
        (track::FAULTS, "faults and detection"),
        (track::RECOVERY_PARTS, "recovery parts"),
        (track::CHECKPOINTS, "checkpoint writes"),
    ] {
        events.push(json!({"ph": "M", "name": "thread_name", "pid": run, "tid": tid, "args": {"name": name}}));
    }
    // The run's timeline: spans in time order, the gaps between them
    // drawn as waits.
    let mut timeline: Vec<serde_json::Value> = Vec::new();
    for r in input.reports {
        let start = r.launched_at_ns as f64 * 1e-9;
        // A step a later rollback took back: its time bought nothing.
        let undone = input.recoveries.iter().any(|rec| {
            r.completed_at_ns as f64 * 1e-9 <= rec.started_at_seconds
                && r.step < rec.failed_step
                && r.step + rec.lost_steps >= rec.failed_step
        });
        timeline.push(span(
            if undone {
                format!("step {} (undone by a rollback)", r.step)
            } else {
                format!("step {}", r.step)
            },
            "step",
            run,
            track::TIMELINE,
            start,
            r.modeled_seconds,
            json!({
                "step": r.step,
                "undone": undone,
                "modeled_seconds": r.modeled_seconds,
                "devices": r.hbm_bytes_per_device.len(),
            }),
        ));
    }
    for f in input.failures {
        timeline.push(span(
            format!("step {} failed: {}", f.step, f.cause),
            "failure",
            run,
            track::TIMELINE,
            f.launched_at_seconds,
            f.at_seconds - f.launched_at_seconds,
            json!({"step": f.step, "failed": true, "cause": f.cause, "phase": f.phase, "device": f.device}),
        ));
        if let Some(killed) = f.killed_at_seconds {
            let device = f.device.map_or_else(String::new, |d| format!(" {d}"));
            events.push(json!({
                "ph": "i", "s": "p", "name": format!("device{device} killed"), "cat": "failure",
                "pid": run, "tid": track::FAULTS, "ts": killed * 1e6,
                "args": {"device": f.device},
            }));
            if let Some(d) = f.device {
                events.push(json!({
                    "ph": "i", "s": "t", "name": "killed", "cat": "failure",
                    "pid": d, "tid": 0, "ts": killed * 1e6,
                }));
            }
            events.push(span(
                "detection wait",
                "wait",
                run,
                track::FAULTS,
                killed,
                f.at_seconds - killed,
                json!({"step": f.step, "cause": f.cause}),
            ));
        }
    }
    for rec in input.recoveries {
        let start = rec.started_at_seconds;
        timeline.push(span(
            format!("recovery ({})", rec.policy),
            "recovery",
            run,
            track::TIMELINE,
            start,
            rec.recovery_seconds,
            json!({
                "failed_step": rec.failed_step,
                "lost_devices": rec.lost_devices,
                "lost_steps": rec.lost_steps,
                "swapped_cubes": rec.swapped_cubes,
            }),
        ));
        let mut at = start;
        for (name, seconds) in recovery_parts(rec) {
            events.push(span(
                name,
                "recovery",
                run,
                track::RECOVERY_PARTS,
                at,
                seconds,
                json!({"failed_step": rec.failed_step}),
            ));
            at += seconds;
        }
    }
    // A checkpoint write stops training (it is synchronous): the timeline
    // shows it where it happened, and its own track below too.
    for &(at_ns, seconds) in input.checkpoint_writes {
        timeline.push(span(
            "checkpoint write",
            "checkpoint",
            run,
            track::TIMELINE,
            at_ns as f64 * 1e-9,
            seconds,
            json!({}),
        ));
    }
    timeline.sort_by(|a, b| {
        a["ts"]
            .as_f64()
            .unwrap_or(0.0)
            .total_cmp(&b["ts"].as_f64().unwrap_or(0.0))
    });
    // A gap up to a tick is the pod waiting for the tick that ends what
    // came before; a longer one is idle time.
    let wait = |from_us: f64, to_us: f64, before: &serde_json::Value| {
        let seconds = (to_us - from_us) * 1e-6;
        let name = if seconds <= input.tick_ns as f64 * 1e-9 + 1e-12 {
            "waiting for the tick"
        } else {
            "idle"
        };
        span(
            name,
            "wait",
            run,
            track::TIMELINE,
            from_us * 1e-6,
            seconds,
            json!({"before": before}),
        )
    };
    let mut free_at: Option<f64> = None;
    for event in timeline {
        let (ts, dur) = (
            event["ts"].as_f64().unwrap_or(0.0),
            event["dur"].as_f64().unwrap_or(0.0),
        );
        if let Some(free) = free_at.filter(|&free| ts > free) {
            events.push(wait(free, ts, &event["name"]));
        }
        free_at = Some(free_at.map_or(ts + dur, |free: f64| free.max(ts + dur)));
        events.push(event);
    }
    let end_us = input.end_ns as f64 * 1e-3;
    if let Some(free) = free_at.filter(|&free| end_us > free) {
        events.push(wait(free, end_us, &json!("the end of the run")));
    }
    for &(at_ns, seconds) in input.checkpoint_writes {
        events.push(span(
            "checkpoint write",
            "checkpoint",
            run,
            track::CHECKPOINTS,
            at_ns as f64 * 1e-9,
            seconds,
            json!({}),
        ));
    }
    // Every device's phases per bucket.
    let devices: Vec<u32> = input
        .reports
        .first()
        .map(|r| r.hbm_bytes_per_device.iter().map(|&(d, _)| d).collect())
        .unwrap_or_default();
    let dcn = input
        .reports
        .iter()
        .any(|r| r.spans.iter().any(|s| s.phase.is_dcn()));
    for &d in &devices {
        events.push(json!({"ph": "M", "name": "process_name", "pid": d, "args": {"name": format!("device {d}")}}));
        events.push(json!({"ph": "M", "name": "thread_name", "pid": d, "tid": 0, "args": {"name": "compute"}}));
        events.push(json!({"ph": "M", "name": "thread_name", "pid": d, "tid": 1, "args": {"name": "communication"}}));
        if dcn {
            events.push(json!({"ph": "M", "name": "thread_name", "pid": d, "tid": 2, "args": {"name": "DCN (across slices)"}}));
        }
    }
    for r in input.reports {
        let devices: Vec<u32> = r.hbm_bytes_per_device.iter().map(|&(d, _)| d).collect();
        for s in &r.spans {
            let (tid, cat) = if s.phase == StepPhase::Update {
                (0, "compute")
            } else if s.phase.is_dcn() {
                (2, "dcn")
            } else {
                (1, "communication")
            };
            for &d in &devices {
                events.push(span(
                    format!("{} bucket {}", s.phase.key(), s.bucket),
                    cat,
                    d,
                    tid,
                    r.launched_at_ns as f64 * 1e-9 + s.start_seconds,
                    s.end_seconds - s.start_seconds,
                    json!({"step": r.step}),
                ));
            }
        }
    }
    json!({"traceEvents": events, "displayTimeUnit": "ns"})
}

/// Writes the run's trace ([`trace_of`]) into a new file.
fn write_trace(path: &Path, input: &TraceInput<'_>) -> Result<()> {
    output::write_new("--trace", path, &serde_json::to_string(&trace_of(input))?)
}

/// A recovery's parts in the order they run, each with its seconds; they
/// add up to its `recovery_seconds`. Parts that take no time are left out.
fn recovery_parts(rec: &RecoveryRow) -> Vec<(&'static str, f64)> {
    [
        ("checkpoint read", rec.read_seconds),
        ("cube swap", rec.reconfigure_seconds),
        ("re-shard", rec.reshard_seconds),
    ]
    .into_iter()
    .filter(|&(_, seconds)| seconds > 0.0)
    .collect()
}

/// Where a phase runs in a step: the reduce-scatter passes (axes in
/// order, then across slices), the update, the all-gather passes (the
/// reverse), the state replication; `exposed_communication`, a summary,
/// last.
fn execution_rank(key: &str) -> (u8, i64) {
    let axis = |pass: &str| -> i64 {
        match pass {
            "dcn" => i64::from(u32::MAX),
            other => other
                .strip_prefix("axis")
                .and_then(|n| n.parse::<i64>().ok())
                .unwrap_or(i64::from(u32::MAX) - 1),
        }
    };
    if let Some(pass) = key.strip_prefix("reduce_scatter.") {
        (0, axis(pass))
    } else if key == "update" {
        (1, 0)
    } else if let Some(pass) = key.strip_prefix("all_gather.") {
        (2, -axis(pass))
    } else if key == "replicate_state" {
        (3, 0)
    } else if key == "exposed_communication" {
        (5, 0)
    } else {
        (4, 0)
    }
}

/// The report's phases in the step's execution order ([`execution_rank`]).
fn phases_in_execution_order(phases: &BTreeMap<String, f64>) -> Vec<(&str, f64)> {
    let mut ordered: Vec<(&str, f64)> = phases.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    ordered.sort_by_key(|&(k, _)| execution_rank(k));
    ordered
}

/// `device 5`, `devices 5 and 6`, `devices 1, 2 and 3`, `no device`.
fn devices_text(devices: &[u32]) -> String {
    let ids: Vec<String> = devices.iter().map(u32::to_string).collect();
    match ids.as_slice() {
        [] => "no device".into(),
        [one] => format!("device {one}"),
        [init @ .., last] => format!("devices {} and {last}", init.join(", ")),
    }
}

/// Where the simulated time of a run went, from the run's time ledger
/// (every nanosecond charged once, so the shares add up to 100 %): the
/// steps that count (the goodput), steps a rollback undid, steps cut off
/// by a failure, checkpoint writes, recoveries and the rest. Empty for a
/// run that spent all its time in steps that count.
fn time_breakdown(r: &TrainReport) -> String {
    let t = &r.time_ns;
    if t.total_ns == 0 || t.productive_ns == t.total_ns {
        return String::new();
    }
    // A share that rounds to 0.0 % but is not 0 reads "<0.1 %".
    let share = |ns: u64| {
        let percent = ns as f64 / t.total_ns as f64 * 100.0;
        if ns > 0 && percent < 0.05 {
            "<0.1".to_string()
        } else {
            format!("{percent:.1}")
        }
    };
    let mut parts = vec![format!("{} % in steps that count", share(t.productive_ns))];
    for (ns, what) in [
        (t.undone_ns, "in steps a rollback undid"),
        (t.cut_off_ns, "in failed steps"),
        (t.checkpoint_write_ns, "writing checkpoints"),
        (t.recovery_ns, "recovering"),
        (t.other_ns, "waiting"),
    ] {
        if ns > 0 {
            parts.push(format!("{} % {what}", share(ns)));
        }
    }
    format!("time: {}\n", parts.join(", "))
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
    for (k, v) in phases_in_execution_order(&r.phases) {
        text += &format!("  {k:<24} {}\n", output::seconds(v));
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
        let seen = f.killed_at_seconds.map_or_else(String::new, |killed| {
            format!(
                " (killed at {}, seen {} later)",
                output::seconds(killed),
                output::seconds(f.at_seconds - killed)
            )
        });
        text += &format!(
            "  step {} failed at {} during {}: {}{seen}\n",
            f.step,
            output::seconds(f.at_seconds),
            f.phase,
            f.cause
        );
    }
    for rec in &r.recoveries {
        let parts: Vec<String> = recovery_parts(rec)
            .iter()
            .map(|(name, seconds)| format!("{name} {}", output::seconds(*seconds)))
            .collect();
        text += &format!(
            "  recovered by {} from step {} in {} modeled ({}): lost {}, {} lost\n",
            rec.policy,
            rec.failed_step,
            output::seconds(rec.recovery_seconds),
            parts.join(" + "),
            devices_text(&rec.lost_devices),
            output::plural(rec.lost_steps, "step", "steps"),
        );
        for [failed, spare] in &rec.swapped_cubes {
            text += &format!("    cube {failed} swapped for spare cube {spare}\n");
        }
    }
    text += &time_breakdown(r);
    let ranks = if r.ranks > 1 {
        format!(" (merged from {} ranks)", r.ranks)
    } else {
        String::new()
    };
    text += &format!(
        "goodput {:.1} % of {} simulated ({} at the end); {} wall\nworld sha256 {}{ranks}\n",
        r.goodput * 100.0,
        output::seconds(r.simulated_seconds),
        output::plural(r.devices_at_end as u64, "device", "devices"),
        output::seconds(r.wall_seconds),
        r.world_sha256
    );
    output::print_text(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use optirs_tpu::sharding::Span;

    fn step(number: u64, launched_at_ns: u64, modeled_seconds: f64) -> ShardedStepReport {
        let half = modeled_seconds / 2.0;
        ShardedStepReport {
            step: number,
            launched_at_ns,
            completed_at_ns: launched_at_ns + (modeled_seconds * 1e9).ceil() as u64,
            modeled_seconds,
            phases: BTreeMap::new(),
            link_bytes: 0,
            hbm_bytes_per_device: vec![(0, 1), (1, 1)],
            buckets: 1,
            wall_seconds: 0.0,
            spans: vec![
                Span {
                    bucket: 0,
                    phase: StepPhase::ReduceScatter { axis: 0 },
                    start_seconds: 0.0,
                    end_seconds: half,
                },
                Span {
                    bucket: 0,
                    phase: StepPhase::Update,
                    start_seconds: half,
                    end_seconds: modeled_seconds,
                },
            ],
        }
    }

    /// A spare-cube run drawn by hand: steps 1 and 2, step 3 killed, a
    /// recovery of three parts that rolls back step 2, steps 2 and 3 again.
    #[test]
    fn the_trace_accounts_for_every_second_and_marks_undone_steps() {
        let us = 1_000u64;
        let reports = [
            step(1, 0, 8e-6),
            step(2, 10 * us, 8e-6),
            step(2, 1_100 * us, 8e-6),
            step(3, 1_110 * us, 8e-6),
        ];
        let failures = [FailureRow {
            step: 3,
            device: Some(1),
            launched_at_seconds: 20e-6,
            killed_at_seconds: Some(23e-6),
            at_seconds: 25e-6,
            phase: "update".into(),
            cause: "device 1 was killed".into(),
        }];
        let recoveries = [RecoveryRow {
            policy: "spare-cube".into(),
            failed_step: 3,
            lost_devices: vec![1],
            lost_steps: 1,
            started_at_seconds: 25e-6,
            recovery_seconds: 1070e-6,
            read_seconds: 50e-6,
            reconfigure_seconds: 1000e-6,
            reshard_seconds: 20e-6,
            swapped_cubes: vec![[0, 1]],
            note: None,
        }];
        // A write after step 1, up to step 2's launch.
        let writes = [(9 * us, 1e-6)];
        let input = TraceInput {
            reports: &reports,
            failures: &failures,
            recoveries: &recoveries,
            checkpoint_writes: &writes,
            devices: 2,
            tick_ns: 10 * us,
            end_ns: 1_120 * us,
        };
        let trace = trace_of(&input);
        let events = trace["traceEvents"].as_array().unwrap();
        let on = |tid: u32| -> Vec<&serde_json::Value> {
            let mut spans: Vec<_> = events
                .iter()
                .filter(|e| e["ph"] == "X" && e["pid"] == 2 && e["tid"] == tid)
                .collect();
            spans.sort_by(|a, b| {
                a["ts"]
                    .as_f64()
                    .unwrap()
                    .total_cmp(&b["ts"].as_f64().unwrap())
            });
            spans
        };
        // The timeline runs from 0 to the end without a hole or overlap.
        let timeline = on(track::TIMELINE);
        let mut at = 0.0;
        for e in &timeline {
            let ts = e["ts"].as_f64().unwrap();
            assert!((ts - at).abs() < 1e-6, "{e} starts at {ts}, not {at}");
            at = ts + e["dur"].as_f64().unwrap();
        }
        assert!((at - 1120.0).abs() < 1e-6, "ends at {at}");
        let names: Vec<&str> = timeline
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "step 1",
                "waiting for the tick",
                "checkpoint write",
                "step 2 (undone by a rollback)",
                "waiting for the tick",
                "step 3 failed: device 1 was killed",
                "recovery (spare-cube)",
                "waiting for the tick",
                "step 2",
                "waiting for the tick",
                "step 3",
                "waiting for the tick",
            ]
        );
        // The recovery's parts, in order, add up to it.
        let parts = on(track::RECOVERY_PARTS);
        let names: Vec<&str> = parts.iter().map(|e| e["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["checkpoint read", "cube swap", "re-shard"]);
        assert_eq!(parts[0]["ts"].as_f64().unwrap(), 25.0);
        let sum: f64 = parts.iter().map(|e| e["dur"].as_f64().unwrap()).sum();
        assert!((sum - 1070.0).abs() < 1e-6);
        // The kill and the wait until the step saw it.
        let detection = on(track::FAULTS);
        assert_eq!(detection[0]["name"], "detection wait");
        assert!((detection[0]["ts"].as_f64().unwrap() - 23.0).abs() < 1e-9);
        assert!((detection[0]["dur"].as_f64().unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(on(track::CHECKPOINTS).len(), 1);
        // Each device's phases, per bucket.
        for device in 0..2 {
            assert_eq!(
                events
                    .iter()
                    .filter(|e| e["pid"] == device && e["ph"] == "X")
                    .count(),
                reports.len() * 2
            );
        }
    }

    #[test]
    fn phases_read_in_the_order_the_step_runs_them() {
        let phases: BTreeMap<String, f64> = [
            "all_gather.axis0",
            "all_gather.axis1",
            "all_gather.dcn",
            "exposed_communication",
            "reduce_scatter.axis0",
            "reduce_scatter.axis1",
            "reduce_scatter.dcn",
            "replicate_state",
            "update",
        ]
        .into_iter()
        .map(|k| (k.to_string(), 1.0))
        .collect();
        let order: Vec<&str> = phases_in_execution_order(&phases)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            order,
            [
                "reduce_scatter.axis0",
                "reduce_scatter.axis1",
                "reduce_scatter.dcn",
                "update",
                "all_gather.dcn",
                "all_gather.axis1",
                "all_gather.axis0",
                "replicate_state",
                "exposed_communication",
            ]
        );
        assert_eq!(devices_text(&[]), "no device");
        assert_eq!(devices_text(&[5]), "device 5");
        assert_eq!(devices_text(&[1, 2, 3]), "devices 1, 2 and 3");
    }
}
