//! `optirs-tpu train`: a model's optimizer sharded over a pod, stepped in
//! simulated time with seeded synthetic gradients, through failures. This
//! file parses and checks the arguments, turns them into the training
//! layer's [`RunPlan`] and prints; the run itself is
//! [`optirs_tpu::training`]'s.

use super::parse::number;
use super::parse::{
    parse_bucket_bytes, parse_count, parse_count_u64, parse_learning_rate, parse_prefetch,
    parse_rank_timeout, parse_seconds, parse_seed, parse_tick_ms, parse_timed_device, usage,
};
use super::train_print::{print_modeled_text, print_report, write_trace};
use super::{output, progress};
use anyhow::{Context, Result, bail};
use clap::Args;
use clap::builder::PossibleValuesParser;
use ndarray::{ArrayD, IxDyn};
use optirs_tpu::Pod;
use optirs_tpu::cost_model::{
    DataReduction, StrategyOptions, WideBytes, modeled_strategy_step, wide_map,
};
use optirs_tpu::health::Fault;
use optirs_tpu::sharding::{
    DEFAULT_BUCKET_BYTES, Mesh, ParamSet, RecoveryPolicy, Reduction, ShardingError, Strategy,
};
use optirs_tpu::topology::{DEFAULT_PRESET, load_topology};
use optirs_tpu::training::{Outcome, Resumed, RunError, RunPlan, ShardedOptimizer, ShardingConfig};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// `--steps` when not given.
const DEFAULT_TRAIN_STEPS: u64 = 20;
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
    pub(super) pod: String,
    /// One of sgd, momentum, nesterov, adam, adamw, rmsprop, adagrad.
    #[arg(long, default_value = "adam", ignore_case = true,
          value_parser = PossibleValuesParser::new(optirs_tpu::optimizers::NAMES))]
    pub(super) optimizer: String,
    /// Learning rate: any sign, representable as an f32 (the update runs
    /// in f32).
    #[arg(long, default_value_t = 1e-3, value_parser = parse_learning_rate,
          allow_negative_numbers = true)]
    pub(super) lr: f64,
    /// The model's tensor sizes in elements, comma-separated (the default
    /// is the bundled 16.8 M-parameter transformer block).
    #[arg(long, value_delimiter = ',', value_name = "N[,N...]", value_parser = parse_count,
          allow_negative_numbers = true)]
    pub(super) params: Vec<usize>,
    /// A transformer, by bundled name (maxtext-v5e-{16,32,64,128}b,
    /// maxtext-v5p-{32,64,128,256,512,1024}b, llama2-7b, llama2-70b,
    /// gpt3-175b, llama3.1-{8,70,405}b, mistral-7b, gemma3-12b,
    /// mixtral-8x7b, mixtral-8x22b, deepseek3-671b, llama4-17b-16e,
    /// llama4-17b-128e) or a RON model file (docs/models.md). With --modeled-only its whole step (layers on the MXU, the
    /// mesh's collectives overlapped); in a real run its parameters are the
    /// tensors whose optimizer step runs.
    #[arg(long, value_name = "NAME|FILE", conflicts_with = "params")]
    pub(super) model: Option<String>,
    /// Steps to complete (lost steps are redone).
    #[arg(long, default_value_t = DEFAULT_TRAIN_STEPS, value_parser = parse_count_u64,
          allow_negative_numbers = true)]
    pub(super) steps: u64,
    /// Bucket size in bytes (25 MiB by default): the model's tensors are
    /// packed into buckets whose collectives and updates overlap.
    #[arg(long, default_value_t = DEFAULT_BUCKET_BYTES, value_parser = parse_bucket_bytes,
          allow_negative_numbers = true)]
    pub(super) bucket_bytes: usize,
    /// Gradient reduction: mean or sum.
    #[arg(long, default_value = "mean")]
    pub(super) reduction: Reduction,
    /// Kill a device at a simulated time, seconds from the start:
    /// `DEVICE@SECONDS` (repeatable, each device at most once). A kill due
    /// after the run ends is an error once the run shows its end.
    #[arg(long, value_name = "DEVICE@SECONDS", value_parser = parse_timed_device)]
    pub(super) kill: Vec<(u32, f64)>,
    /// Write a periodic checkpoint every this many simulated seconds
    /// (needed by rollback and spare-cube recovery), rounded to whole
    /// ticks; at least one tick.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds,
          allow_negative_numbers = true)]
    pub(super) checkpoint_every: Option<f64>,
    /// Where the periodic checkpoints go: a directory, created if missing
    /// (only with --checkpoint-every; a fresh temporary directory by
    /// default).
    #[arg(long, value_name = "DIR")]
    pub(super) checkpoint_dir: Option<PathBuf>,
    /// Continue the run whose checkpoints are in DIR from its newest
    /// verified one, to `--steps` steps in all (the same arguments as the
    /// run; its checkpoints go on into DIR unless `--checkpoint-dir`
    /// says otherwise).
    #[arg(long, value_name = "DIR")]
    pub(super) resume: Option<PathBuf>,
    /// What to do when a step fails: rollback, redundant or spare-cube
    /// (a cube-built pod with `cubes: (spares: N)`).
    #[arg(long, default_value = "rollback")]
    pub(super) recovery: RecoveryPolicy,
    /// Simulated tick in milliseconds (default 0.01), within a pod file's
    /// bounds and at most the pod's heartbeat interval.
    #[arg(long, value_name = "MS", value_parser = parse_tick_ms,
          allow_negative_numbers = true)]
    pub(super) tick_ms: Option<f64>,
    /// Seed of the synthetic gradients: a whole number from 0 (`1e3`
    /// reads as 1000, as every count does).
    #[arg(long, default_value_t = 0, value_parser = parse_seed,
          allow_negative_numbers = true)]
    pub(super) seed: u64,
    /// Write a Chrome/Perfetto trace in simulated time: the run's steps,
    /// failed steps, waits, recoveries (by part) and checkpoint writes,
    /// and every device's compute and communication per bucket (under
    /// fsdp, each bucket's gathers, uses, frees and reduce-scatter). Never
    /// overwrites; checked before the run.
    #[arg(long, value_name = "FILE")]
    pub(super) trace: Option<PathBuf>,
    /// Model the step only, in closed form, without data or a pod in
    /// memory (for models and pods this machine cannot hold).
    #[arg(long)]
    pub(super) modeled_only: bool,
    /// How the model is split over the mesh: replicated (ZeRO-1: the state
    /// sharded), zero2 (gradients too) or fsdp (ZeRO-3: parameters too,
    /// gathered per bucket). Under zero2 and fsdp the state is the same
    /// along the mesh's data axis (hybrid sharding across slices).
    ///
    /// `auto` (the default with --model --modeled-only) searches every
    /// strategy, mesh and prefetch for the fastest layout that fits, as
    /// `plan` does with the model's remat policy and batch; an explicit
    /// --strategy or --mesh narrows the search (replicated otherwise).
    #[arg(long, value_name = "STRATEGY")]
    pub(super) strategy: Option<StrategyChoice>,
    /// With --model --modeled-only: the remat policy, if not the model's
    /// (MaxText's names; `plan` prints it in each layout's command).
    #[arg(long, value_name = "POLICY", requires = "model",
          value_parser = super::plan::parse_remat_name)]
    pub(super) remat: Option<String>,
    /// With --model --modeled-only: sequences a step over the whole pod,
    /// if not the model's per-device batch times the chips.
    #[arg(long, value_name = "N", requires = "model", value_parser = parse_count_u64)]
    pub(super) global_batch: Option<u64>,
    /// The device mesh, `data=D,stage=P,fsdp=F,tensor=T,expert=E` in any
    /// order (an axis left out is 1, one may be -1 for the rest), each axis
    /// whole torus axes or the slices. Default: fsdp over every chip of a
    /// slice, data over the slices. tensor, expert and stage above 1 with
    /// --model --modeled-only only (a transformer splits its heads and MLP,
    /// its experts and its layers; --params tensors do not). Under mpirun
    /// the default mesh only.
    #[arg(long, value_name = "SPEC")]
    pub(super) mesh: Option<String>,
    /// fsdp: parameter gathers run ahead of the bucket in use (default 1;
    /// 0 gathers each bucket once the previous one is freed), so
    /// `N + 1` gathered buckets are in flight.
    #[arg(long, value_name = "N", value_parser = parse_prefetch,
          allow_negative_numbers = true)]
    pub(super) prefetch: Option<usize>,
    /// With --model --modeled-only: when the gradients' all-reduce over the
    /// mesh's data axis (across the slices) runs: after-backward (default:
    /// what MaxText's published multislice runs show, docs/validation.md)
    /// or overlapped (behind the backward, as the reduce-scatters).
    #[arg(long, value_name = "WHEN")]
    pub(super) data_reduction: Option<DataReduction>,
    /// With --model --modeled-only and a stage axis in --mesh: microbatches
    /// a step, a multiple of the stages (default: one per stage; MaxText's
    /// num_pipeline_microbatches).
    #[arg(long, value_name = "M")]
    pub(super) microbatches: Option<usize>,
    /// With --model --modeled-only and a stage axis in --mesh: rounds of the
    /// stages, a circular pipeline (default 1; MaxText's
    /// num_pipeline_repeats).
    #[arg(long, value_name = "R")]
    pub(super) repeats: Option<usize>,
    /// Under `mpirun`: how long a rank waits for another before it stops,
    /// naming the lost rank and its hosts (rank 0 waits this long, the
    /// others twice as long). 30 s if not given; refused in one process,
    /// which waits for no other rank.
    #[arg(long, value_name = "SECONDS", value_parser = parse_rank_timeout)]
    pub(super) rank_timeout: Option<f64>,
    /// Under `mpirun`, with every rank on one node: move the step's
    /// collectives' bytes between ranks by MPI messages instead of reading
    /// them in place in an MPI-3 shared-memory window (as ranks on several
    /// nodes do). The results are the same bits either way.
    #[arg(long)]
    pub(super) no_shared_memory: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub(super) json: bool,
}

/// `--strategy`: a strategy, or `auto` (a search for the fastest layout
/// that fits, with --model --modeled-only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrategyChoice {
    /// Search (`plan`'s, narrowed by the other flags).
    Auto,
    /// This strategy.
    Given(Strategy),
}

impl std::str::FromStr for StrategyChoice {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "auto" => Ok(StrategyChoice::Auto),
            _ => text
                .parse::<Strategy>()
                .map(StrategyChoice::Given)
                .map_err(|e| format!("{e} (or `auto`: the fastest layout that fits, by search)")),
        }
    }
}

impl TrainArgs {
    /// The strategy a run uses: the given one, replicated by default.
    /// (`auto` is resolved by the search before a modeled step, and
    /// refused elsewhere, [`TrainArgs::refuse_unusable`].)
    pub(super) fn strategy(&self) -> Strategy {
        match self.strategy {
            Some(StrategyChoice::Given(s)) => s,
            _ => Strategy::Replicated,
        }
    }

    /// Whether the layout is searched: `--strategy auto`, or no strategy
    /// and no mesh for a transformer's modeled step.
    pub(super) fn searches_layout(&self) -> bool {
        match self.strategy {
            Some(StrategyChoice::Auto) => true,
            Some(StrategyChoice::Given(_)) => false,
            None => self.model.is_some() && self.modeled_only && self.mesh.is_none(),
        }
    }

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

    /// The mesh `--mesh` gives on `topology` (the default mesh without it);
    /// a mesh that does not lay out is a usage error. A transformer's
    /// modeled step (`--model --modeled-only`) splits its heads and MLP
    /// along `tensor`, so only there is `tensor` above 1 taken.
    pub(super) fn mesh_on(&self, topology: &optirs_tpu::topology::Topology) -> Result<Mesh> {
        let Some(spec) = &self.mesh else {
            return Ok(Mesh::default_for(topology));
        };
        let parsed = if self.model.is_some() && self.modeled_only {
            Mesh::parse_split(spec, topology)
        } else {
            Mesh::parse(spec, topology)
        };
        parsed.map_err(|e| usage(format!("--mesh {spec}: {e}")))
    }

    /// `--resume` was given.
    pub(super) fn resumes(&self) -> bool {
        self.resume.is_some()
    }

    /// What the run does, for the training layer's loop and report.
    pub(super) fn plan(&self) -> RunPlan {
        RunPlan {
            steps: self.steps,
            seed: self.seed,
            kills: self.kill.clone(),
            optimizer: self.optimizer.to_ascii_lowercase(),
        }
    }
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

/// `train` in this process (`mod.rs` sends a run split over MPI ranks to
/// [`super::ranks::train`], after [`TrainArgs::refuse_misused_resume`]).
pub fn train(args: TrainArgs) -> Result<()> {
    if args.no_shared_memory {
        return Err(usage(
            "--no-shared-memory: a run in one process moves no collectives' data between \
             ranks; the flag chooses how a pod split over MPI ranks does (`mpirun -n R \
             optirs-tpu train … --no-shared-memory`)"
                .to_string(),
        ));
    }
    super::parse::refuse_rank_timeout_in_one_process(args.rank_timeout, "train")?;
    args.refuse_unusable()?;
    if let (Some(spec), true) = (&args.model, args.modeled_only) {
        if args.steps != DEFAULT_TRAIN_STEPS {
            return Err(usage(format!(
                "--steps {}: --model --modeled-only models one step in closed form, so a step \
                 count does nothing; drop --steps (goodput --model models a whole run)",
                args.steps
            )));
        }
        let config = super::model_step::load_model(spec)?;
        let topology = checked_topology(&args, &[])?;
        args.refuse_real_run_only(true)?;
        let config = super::plan::with_model_flags(
            &config,
            (args.remat.as_deref(), args.global_batch),
            topology.num_devices(),
        )?;
        return super::model_step::modeled(&args, &config, &topology);
    }
    let sizes = model_sizes(&args)?;
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
    building.set_message(compiling_message(&sizes, pod.topology().num_devices()));
    let sharding = sharding_of(&args, pod.topology())?;
    let mut opt =
        ShardedOptimizer::on_pod(base_optimizer(&args)?, pod, model_of(&sizes)?, sharding)?;
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
            refuse_steps_done(args.steps, &resumed)?;
            refuse_other_faults(&mut opt, &kills, resumed.at_ns)?;
            say_skipped(&resumed);
            Some(resumed)
        }
        None => None,
    };
    let start_ns = resumed.as_ref().map(|r| r.at_ns);
    building.finish_and_clear();
    let outcome = run_steps_from(&mut opt, &args, args.json, start_ns, resumed)?;
    let world_sha256 = opt.pod_mut().world_sha256()?;
    let report = outcome.report(&opt, &args.plan(), world_sha256, 1)?;
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
fn refuse_earlier_run(dir: &Path) -> Result<()> {
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

/// Refuses `--steps` at or below the steps the resumed checkpoint holds:
/// there would be nothing to run.
fn refuse_steps_done(steps: u64, resumed: &Resumed) -> Result<()> {
    if steps <= resumed.steps_completed {
        return Err(usage(format!(
            "--steps {steps}: the run resumed from {} has {} completed already; give \
             --steps above {} to continue it",
            resumed.path.display(),
            output::plural(resumed.steps_completed, "step", "steps"),
            resumed.steps_completed
        )));
    }
    Ok(())
}

/// Says on stderr which newer checkpoints the resume passed over, and why
/// (the report lists them too).
fn say_skipped(resumed: &Resumed) {
    for skipped in &resumed.skipped {
        eprintln!(
            "--resume: skipped {} (it does not verify: {}); left as it is, resuming from {}",
            skipped.path.display(),
            skipped.problem,
            resumed.path.display()
        );
    }
}

/// Refuses `--kill`s that are not the resumed run's faults still to come
/// (the checkpoint carries them): a resumed run is the same run.
fn refuse_other_faults(
    opt: &mut ShardedOptimizer<Base>,
    kills: &[(u64, Fault)],
    resumed_at_ns: u64,
) -> Result<()> {
    let (pending, given) =
        optirs_tpu::training::run::kills_to_come(opt.pod(), kills, resumed_at_ns);
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

/// The model's tensor sizes: `--params`, `--model`'s tensors, or the
/// bundled default.
pub(super) fn model_sizes(args: &TrainArgs) -> Result<Vec<usize>> {
    if let Some(spec) = &args.model {
        return Ok(super::model_step::tensor_sizes(
            &super::model_step::load_model(spec)?,
        ));
    }
    Ok(if args.params.is_empty() {
        DEFAULT_MODEL.to_vec()
    } else {
        args.params.clone()
    })
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
    let available = optirs_tpu::training::host_memory_budget();
    if host_bytes > available {
        let readable = |bytes: u128| output::bytes(u64::try_from(bytes).unwrap_or(u64::MAX));
        let what = match &args.model {
            Some(model) => format!("--model {model} has"),
            None => "--params totals".to_string(),
        };
        bail!(
            "{what} {total} parameters, about {} on this host with optimizer state, \
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
pub(super) fn sharding_of(
    args: &TrainArgs,
    topology: &optirs_tpu::topology::Topology,
) -> Result<ShardingConfig> {
    let mesh = match &args.mesh {
        Some(_) => Some(args.mesh_on(topology)?.sizes()),
        None => None,
    };
    Ok(ShardingConfig {
        bucket_bytes: args.bucket_bytes,
        reduction: args.reduction,
        recovery: args.recovery,
        hbm_bytes: None,
        strategy: args.strategy(),
        prefetch: args
            .prefetch
            .unwrap_or(optirs_tpu::sharding::residency::DEFAULT_PREFETCH),
        mesh,
    })
}

/// Steps until `--steps` steps completed (the training layer's loop),
/// with the progress bar (`quiet` hides it) and SIGINT/SIGTERM as the
/// stop at a step boundary.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(super) fn run_steps(
    opt: &mut ShardedOptimizer<Base>,
    args: &TrainArgs,
    quiet: bool,
) -> Result<Outcome> {
    run_steps_from(opt, args, quiet, None, None)
}

/// [`run_steps`] whose time is counted from `start_ns` (the resumed
/// checkpoint's time; now by default).
fn run_steps_from(
    opt: &mut ShardedOptimizer<Base>,
    args: &TrainArgs,
    quiet: bool,
    start_ns: Option<u64>,
    resumed: Option<Resumed>,
) -> Result<Outcome> {
    let bar = progress::steps_bar(args.steps, quiet, "train");
    show_step_progress(opt, &bar);
    let stop = super::interrupt::requested;
    let mut on_step = |done: u64| bar.set_position(done * progress::UNITS_PER_STEP);
    let ran = optirs_tpu::training::run_steps_from(
        opt,
        &args.plan(),
        start_ns,
        resumed,
        &stop,
        &mut on_step,
    );
    opt.on_step_progress(None);
    match ran {
        Ok(outcome) => {
            bar.finish_and_clear();
            Ok(outcome)
        }
        Err(RunError::Stopped {
            steps_completed,
            steps,
            at_seconds,
        }) => {
            bar.finish_and_clear();
            bail!(
                "stopped by a signal at a step boundary with {steps_completed} of {steps} steps \
                 completed, at {} simulated (a --checkpoint-dir run continues with --resume)",
                output::seconds(at_seconds)
            )
        }
        Err(RunError::Failed(e)) => Err(e.into()),
        Err(e) => Err(e.into()),
    }
}

/// Moves `bar` inside each step: the gradients' reduction (most of a
/// large pod's wall time) fills the first [`GRADIENTS_SHARE`] of a step,
/// the step in flight in simulated time the rest. A hidden bar is left
/// alone: nothing is drawn, nothing is asked.
fn show_step_progress(opt: &mut ShardedOptimizer<Base>, bar: &indicatif::ProgressBar) {
    if bar.is_hidden() {
        return;
    }
    let bar = bar.clone();
    opt.on_step_progress(Some(Box::new(move |part, fraction| {
        let whole = bar.position() / progress::UNITS_PER_STEP * progress::UNITS_PER_STEP;
        let position = whole + progress::within_step(part, fraction);
        if position > bar.position() {
            bar.set_position(position);
        }
    })));
}

/// Each mesh axis with its size and physical axes (`axis0` … `dcn`).
fn mesh_axes_json(mesh: &optirs_tpu::sharding::Mesh) -> Vec<serde_json::Value> {
    mesh.axes
        .iter()
        .map(|a| {
            json!({
                "name": a.name,
                "size": a.size,
                "physical": a.physical.iter().map(|p| p.key()).collect::<Vec<_>>(),
            })
        })
        .collect()
}

/// `--modeled-only`: the closed-form step of the model under `--strategy`
/// on `--mesh` and `--recovery` (the redundant copies' HBM and
/// `replicate_state` time), after the checks a real run makes before its
/// first step, with its messages; then what one closed-form, failure-free
/// step cannot model is refused.
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
    let mesh = args.mesh_on(&topology)?;
    let tensors: Vec<(String, Vec<usize>)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| (format!("param{i}"), vec![n]))
        .collect();
    // The optimizer's order, the reduction overlapped as the real run it
    // stands for does (which `tests/modeled.rs` holds it to).
    let options = StrategyOptions {
        mesh,
        prefetch: args.prefetch.unwrap_or(1),
        recovery: args.recovery,
        ..StrategyOptions::new(args.strategy(), &topology)
    };
    let modeling = Instant::now();
    let step = modeled_strategy_step(
        &topology,
        &tensors,
        optirs_tpu::ir::DType::F32,
        slots,
        args.bucket_bytes,
        &options,
    )
    .map_err(|e| match e {
        // The closed form's own limits: the input is what has to change.
        ShardingError::TooLargeToModel { .. } | ShardingError::Prefetch { .. } => {
            usage(format!("--params: {e}"))
        }
        other => optirs_tpu::OptimError::from(other).into(),
    })?;
    let wall_seconds = modeling.elapsed().as_secs_f64();
    args.refuse_real_run_only(false)?;
    let not_fitting = step.fits(topology.hbm_bytes).err();
    // Failure-free steps one after another: no checkpoint, no recovery.
    let simulated_seconds = step.step_seconds * args.steps as f64;
    let report = json!({
        "pod": topology.name,
        "chips": step.devices,
        "optimizer": args.optimizer.to_ascii_lowercase(),
        "recovery": args.recovery.to_string(),
        "strategy": args.strategy().name(),
        "mesh": step.mesh.to_string(),
        "mesh_axes": mesh_axes_json(&step.mesh),
        "prefetch": (args.strategy() == Strategy::Fsdp).then_some(step.prefetch),
        "params": sizes.iter().map(|&n| n as u128).sum::<u128>(),
        "buckets": step.buckets,
        "bucket_bytes": args.bucket_bytes,
        "steps": args.steps,
        "step_seconds": step.step_seconds,
        "simulated_seconds": simulated_seconds,
        "phases": step.phases,
        "phase_bytes": wide_map(&step.phase_bytes),
        "axes": step.axes,
        "hbm_bytes_per_device": step.hbm_bytes_per_device,
        "hbm_by_kind": step.memory,
        "hbm_capacity_bytes": topology.hbm_bytes,
        "fits_in_hbm": not_fitting.is_none(),
        "not_fitting": not_fitting.as_ref().map(|e| e.to_string()),
        "link_bytes": WideBytes(step.link_bytes),
        "topology_seconds": loaded,
        "wall_seconds": wall_seconds,
    });
    if args.json {
        return output::print_json(&report);
    }
    print_modeled_text(
        &topology,
        &step,
        sizes.iter().map(|&n| n as u128).sum(),
        &args.optimizer.to_ascii_lowercase(),
        (simulated_seconds, wall_seconds),
        args.steps,
    )
}
