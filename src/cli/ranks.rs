//! `mpirun -n R optirs-tpu run POD …`: the pod split over the ranks MPI
//! started, each stepping its own hosts; rank 0 prints the report of the
//! merged world.

use super::run::RunArgs;
use super::train::TrainArgs;
use anyhow::{Result, bail};
use optirs_tpu::sharding::RecoveryPolicy;

/// The rank and size a launcher gave this process, from its environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    /// This process's rank.
    pub rank: u32,
    /// Processes in the job.
    pub size: u32,
}

/// The launchers' variables: OpenMPI's, then PMI's (MPICH, Slurm).
const SIZE_VARS: [(&str, &str); 2] = [
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
    ("PMI_SIZE", "PMI_RANK"),
];

/// The launch this process is part of, if `mpirun` (or another MPI
/// launcher) started it. Without the `mpi` feature, a job of more than one
/// process is an error on every rank: each would otherwise run the whole
/// pod alone and print a report as if it were the pod.
pub fn launched() -> Result<Option<Launch>> {
    let Some(launch) = SIZE_VARS.iter().find_map(|(size, rank)| {
        let size = std::env::var(size).ok()?.parse().ok()?;
        let rank = std::env::var(rank).ok()?.parse().ok()?;
        Some(Launch { rank, size })
    }) else {
        return Ok(None);
    };
    if cfg!(feature = "mpi") {
        return Ok(Some(launch));
    }
    if launch.size > 1 {
        bail!(
            "started by an MPI launcher as rank {} of {}, but this optirs-tpu was built \
             without the `mpi` feature, so it cannot join the other ranks; build it with \
             `cargo build --release --features mpi` (it needs the system's OpenMPI), or run \
             one process without mpirun",
            launch.rank,
            launch.size
        );
    }
    Ok(None)
}

/// Refuses a command other than `run` and `train` in a job of several
/// ranks.
pub fn refuse_split(command: &str) -> Result<()> {
    match launched()? {
        Some(launch) if launch.size > 1 => bail!(
            "`optirs-tpu {command}` runs as one process; of the commands, only `run` and \
             `train` split a pod over MPI ranks (this is rank {} of {})",
            launch.rank,
            launch.size
        ),
        _ => Ok(()),
    }
}

/// `train` split over the ranks of `launch`: refused with `--resume` (a
/// split run does not resume from its split checkpoints yet), then run on
/// every rank.
pub fn train(args: TrainArgs, launch: Launch) -> Result<()> {
    if args.resumes() {
        bail!(
            "`train --resume` runs as one process: a training run split over MPI ranks \
             does not resume from its split checkpoints yet; resume without mpirun"
        );
    }
    train_split(args, launch)
}

#[cfg(not(feature = "mpi"))]
fn train_split(_: TrainArgs, launch: Launch) -> Result<()> {
    // `launched` returns a launch only with the feature.
    bail!(
        "rank {} of {}: built without the `mpi` feature",
        launch.rank,
        launch.size
    )
}

#[cfg(not(feature = "mpi"))]
pub fn run(_: RunArgs, launch: Launch) -> Result<()> {
    // `launched` returns a launch only with the feature.
    bail!(
        "rank {} of {}: built without the `mpi` feature",
        launch.rank,
        launch.size
    )
}

// What the `mpi` feature's split run asks of `train`'s arguments.
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
             every {:?} s into {:?}, collectives' data {}",
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
            self.checkpoint_dir,
            if self.no_shared_memory {
                "by messages"
            } else {
                "in shared memory on one node"
            }
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

/// Joins the job's MPI ranks and runs `rank_main` with this rank's
/// mailbox. An error is printed (one write, naming the rank) before the
/// ranks' final fence, and the process exits 1: the launcher cannot cut
/// one rank's reason off by ending the job on another's exit.
#[cfg(feature = "mpi")]
fn on_mpi(
    launch: Launch,
    rank_main: impl FnOnce(optirs_tpu::transport::mpi::MpiMailbox) -> Result<()>,
) -> Result<()> {
    use super::output;
    use optirs_tpu::transport::mpi::MpiMailbox;
    let Some((mailbox, session)) = MpiMailbox::initialize() else {
        bail!("MPI was already initialized in this process");
    };
    if (mailbox_size(&mailbox), mailbox_rank(&mailbox)) != (launch.size, launch.rank) {
        bail!(
            "the launcher says rank {} of {}, MPI says rank {} of {}",
            launch.rank,
            launch.size,
            mailbox_rank(&mailbox),
            mailbox_size(&mailbox)
        );
    }
    if let Err(error) = rank_main(mailbox) {
        // One write, so the launcher does not cut it with another rank's;
        // then the ranks' final fence (skipped if a rank was lost, whom it
        // would wait for), so no rank leaves, and the launcher ends the
        // job, before every rank has said why.
        let line = format!(
            "error: rank {}: {}\n",
            launch.rank,
            output::error_message(&error)
        );
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
        drop(session);
        std::process::exit(1);
    }
    drop(session);
    Ok(())
}

/// `mpirun -n R optirs-tpu train POD …`: the model's optimizer sharded
/// over the pod split across the ranks; each rank holds its devices'
/// state shards and computes its replicas' gradients; rank 0 prints the
/// report of the merged world.
#[cfg(feature = "mpi")]
fn train_split(args: TrainArgs, launch: Launch) -> Result<()> {
    use super::train::{base_optimizer, checked_topology, model_sizes, run_steps, sharding_of};
    use super::train_print::print_report;
    use optirs_tpu::pod::ranks::RankedPod;
    use optirs_tpu::training::ShardedOptimizer;
    on_mpi(launch, |mailbox| {
        args.refuse_split_only()?;
        let sizes = model_sizes(&args)?;
        let topology = checked_topology(&args, &sizes)?;
        let timeout = super::parse::rank_timeout(args.rank_timeout);
        let devices = topology.num_devices();
        let mailbox = if args.no_shared_memory {
            mailbox.without_shared_memory()
        } else {
            mailbox
        };
        let mut pod = RankedPod::with_timeout(topology, Box::new(mailbox), timeout)?;
        pod.handshake(&args.describe(&sizes))?;
        for (at_ns, fault) in args.kills(devices)? {
            pod.schedule_fault(at_ns, fault);
        }
        // (Under mpirun --checkpoint-every comes with a --checkpoint-dir
        // every rank sees: refused above otherwise, so no temporary one.)
        let mut no_temporary = None;
        let checkpoints = args.checkpoints(1, &mut no_temporary)?;
        let rank = pod.layout().rank();
        let sharding = sharding_of(&args, pod.pod().topology())?;
        let mut opt = ShardedOptimizer::on_ranked_pod(
            base_optimizer(&args)?,
            pod,
            super::train::model_of(&sizes)?,
            sharding,
        )?;
        // (At a 1 ns "tick", the interval comes back in ns.)
        if let Some((every_ns, dir)) = checkpoints {
            // Another model's checkpoints there are refused before any
            // step, naming both, as in one process (every rank reads the
            // same directory, so every rank refuses alike).
            opt.check_checkpoint_root(&dir)?;
            // Split checkpoints at step boundaries, each costing its
            // modeled write time, as one process writes them: every rank
            // its part, rank 0 the record.
            opt.enable_step_checkpoints(every_ns, dir, 3)?;
        }
        let outcome = run_steps(&mut opt, &args, args.json() || rank != 0)?;
        let merged = opt.ranked_mut().expect("split").gather()?;
        let Some(merged) = merged else {
            return Ok(());
        };
        let report = outcome.report(&opt, &args.plan(), merged.sha256_hex(), launch.size)?;
        print_report(&report, args.json())
    })
}

#[cfg(feature = "mpi")]
pub fn run(args: RunArgs, launch: Launch) -> Result<()> {
    use super::run::{print_report, refuse_unappliable, report_after};
    use optirs_tpu::pod::ranks::RankedPod;
    use std::time::Instant;
    args.refuse_split_skip_idle()?;
    if args.trace().is_some() {
        return Err(super::parse::usage(
            "--trace is for one process: a trace of a pod split over ranks is not written yet",
        ));
    }
    on_mpi(launch, |mailbox| {
        let build_start = Instant::now();
        let topology = match (args.pod_spec(), &args.restore) {
            // The checkpoint names its pod.
            (None, Some(dir)) => {
                let registry = optirs_tpu::checkpoint::engine_registry();
                let snapshot = optirs_tpu::checkpoint::split::read_any_checkpoint(dir, &registry)?;
                let topology: optirs_tpu::topology::PodTopology =
                    registry.decode_resource(&snapshot, "topology.PodTopology")?;
                topology.0
            }
            (spec, _) => optirs_tpu::topology::load_topology(
                spec.unwrap_or(optirs_tpu::topology::DEFAULT_PRESET),
            )?,
        };
        args.check_length(topology.tick_ns)?;
        let plan = args.faults(&topology)?;
        let every = args.checkpoint_ticks(topology.tick_ns)?;
        let timeout = super::parse::rank_timeout(args.rank_timeout);
        let mut pod = RankedPod::with_timeout(topology, Box::new(mailbox), timeout)?;
        if let Some(dir) = &args.restore {
            pod.restore_checkpoint(dir)?;
        }
        pod.handshake(&format!(
            "{} ticks, faults {plan:?}, checkpoints every {every:?} ticks into {:?} keeping {}, \
             restored from {:?}",
            args.steps(),
            args.checkpoint_dir,
            args.keep_checkpoints,
            args.restore
        ))?;
        for &(at_ns, fault) in &plan {
            pod.schedule_fault(at_ns, fault);
        }
        let build_seconds = build_start.elapsed().as_secs_f64();
        let unappliable = pod.faults_that_cannot_apply(args.steps());
        refuse_unappliable(&unappliable, args.steps(), pod.pod().clock().tick_ns)?;
        let rank = pod.layout().rank();
        let bar = super::progress::bar(args.steps(), args.json() || rank != 0, "run");
        let start = Instant::now();
        let mut step_wall_ns = Vec::with_capacity(args.steps().min(1 << 16) as usize);
        for done in 1..=args.steps() {
            let tick = Instant::now();
            // One tick to its boundary, through any fault inside it.
            pod.run(1)?;
            if let (Some(every), Some(root)) = (every, &args.checkpoint_dir) {
                let now = pod.pod().clock().tick;
                if now % every == 0 {
                    let name = optirs_tpu::checkpoint::checkpoint_name(now);
                    pod.save_checkpoint(root, &name)?;
                    if rank == 0 {
                        let keep = args.keep_checkpoints;
                        let report = optirs_tpu::checkpoint::enforce_retention(root, keep, &name);
                        if let Some(problem) = report.problems.first() {
                            bail!("checkpoint retention: {problem}");
                        }
                    }
                }
            }
            if step_wall_ns.len() < 1 << 16 {
                step_wall_ns.push(tick.elapsed().as_nanos() as u64);
            }
            if done % 64 == 0 {
                bar.set_position(done);
            }
        }
        let wall_seconds = start.elapsed().as_secs_f64();
        bar.finish_and_clear();
        let merged = pod.gather()?;
        let Some(merged) = merged else {
            return Ok(());
        };
        let mut whole = optirs_tpu::Pod::from_snapshot(&merged)?;
        let mut report = report_after(
            &mut whole,
            args.steps(),
            build_seconds,
            wall_seconds,
            Some(&step_wall_ns),
        )?;
        report.ranks = launch.size;
        print_report(&report, args.json())
    })
}

#[cfg(feature = "mpi")]
fn mailbox_size(mailbox: &optirs_tpu::transport::mpi::MpiMailbox) -> u32 {
    use optirs_tpu::transport::cluster::Mailbox;
    mailbox.ranks()
}

#[cfg(feature = "mpi")]
fn mailbox_rank(mailbox: &optirs_tpu::transport::mpi::MpiMailbox) -> u32 {
    use optirs_tpu::transport::cluster::Mailbox;
    mailbox.rank()
}
