//! `train`'s refusals: what the command line (and the pod it names) shows
//! the run cannot honour or build, refused before the first step.

use super::output;
use super::parse::usage;
use super::train::TrainArgs;
use anyhow::{Result, bail};
use optirs_tpu::Pod;
use optirs_tpu::health::Fault;
use optirs_tpu::sharding::{RecoveryPolicy, Strategy};
use optirs_tpu::topology::{DeviceId, load_topology};

impl TrainArgs {
    /// Refuses, before any work, what the command line alone shows the
    /// run cannot honour: an export path that exists or whose directory
    /// does not, `--checkpoint-dir` without `--checkpoint-every` (it would
    /// do nothing) or naming a file, a device killed twice, and kills no
    /// checkpoint can recover.
    pub(super) fn refuse_unusable(&self) -> Result<()> {
        output::refuse_existing(&[("--trace", self.trace.as_deref())])?;
        if let Some(trace) = &self.trace {
            output::refuse_missing_parent("--trace", trace)?;
        }
        if let Some(dir) = &self.checkpoint_dir {
            if self.checkpoint_every.is_none() {
                return Err(usage(format!(
                    "--checkpoint-dir {} does nothing without --checkpoint-every SECONDS: \
                     give the interval, or drop --checkpoint-dir",
                    dir.display()
                )));
            }
            output::refuse_non_directory("--checkpoint-dir", dir)?;
            output::check_dir("--checkpoint-dir", dir)?;
        }
        if let Some(when) = self.data_reduction
            && !(self.model.is_some() && self.modeled_only)
        {
            return Err(usage(format!(
                "--data-reduction {} places a transformer's all-reduce over data in its modeled \
                 step: it needs --model NAME --modeled-only (a real run and --params overlap it \
                 behind the backward)",
                when.name()
            )));
        }
        let modeled_model = self.model.is_some() && self.modeled_only;
        let model_flags = [
            (
                "--strategy auto",
                self.strategy == Some(super::train::StrategyChoice::Auto),
            ),
            ("--remat", self.remat.is_some()),
            ("--global-batch", self.global_batch.is_some()),
        ];
        if let Some((flag, _)) = model_flags.iter().find(|(_, given)| *given)
            && !modeled_model
        {
            return Err(usage(format!(
                "{flag} sets a transformer's modeled step: it needs --model NAME --modeled-only \
                 (a real run and --params take --strategy replicated, zero2 or fsdp)"
            )));
        }
        let pipeline = [
            ("--microbatches", self.microbatches),
            ("--repeats", self.repeats),
        ];
        if let Some((flag, Some(n))) = pipeline.iter().find(|(_, n)| n.is_some())
            && !(self.model.is_some() && self.modeled_only)
        {
            return Err(usage(format!(
                "{flag} {n} schedules a pipelined transformer's modeled step: it needs --model \
                 NAME --modeled-only and a stage axis in --mesh"
            )));
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
        let missed: Vec<String> = optirs_tpu::training::run::kills_never_happened(pod, &self.kill)
            .iter()
            .map(|(device, asked)| format!("--kill {device}@{asked}"))
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

    /// Refuses `--resume` where it cannot continue a run: with
    /// `--modeled-only`, without the run's `--checkpoint-every`, or from a
    /// directory that is not there.
    pub(super) fn refuse_misused_resume(&self) -> Result<()> {
        if let Some(dir) = &self.resume {
            if self.modeled_only {
                return Err(usage(
                    "--modeled-only models one step: --resume needs a real run".to_string(),
                ));
            }
            if self.checkpoint_every.is_none() {
                return Err(usage(
                    "--resume continues a run that writes checkpoints: give the run's \
                     --checkpoint-every SECONDS too"
                        .to_string(),
                ));
            }
            output::refuse_missing("--resume", dir, "directory of checkpoints")?;
        }
        Ok(())
    }

    /// Refuses, before any work, a layout the run cannot honour:
    /// `--prefetch` without fsdp (it would do nothing), a `--mesh` that
    /// does not lay out on the pod, in a real run the redundant policy's
    /// copies on a data axis that replicates the state, and the recoveries
    /// the run could not build ([`TrainArgs::refuse_unbuilt_recovery`]).
    pub(super) fn refuse_unbuilt_layout(&self) -> Result<()> {
        if let Some(n) = self.prefetch
            && self.strategy() != Strategy::Fsdp
            && !self.searches_layout()
        {
            return Err(usage(format!(
                "--prefetch {n} sets how many gathered buckets fsdp keeps in flight; \
                 --strategy {} gathers no parameters before use: drop --prefetch or use \
                 --strategy fsdp",
                self.strategy()
            )));
        }
        let topology = load_topology(&self.pod)?;
        self.refuse_unbuilt_recovery(&topology)?;
        let mesh = self.mesh_on(&topology)?;
        let replicates_state = self.strategy() != Strategy::Replicated
            && mesh.size(optirs_tpu::sharding::MeshAxisName::Data) > 1;
        if !self.modeled_only && replicates_state && self.recovery == RecoveryPolicy::Redundant {
            return Err(usage(format!(
                "--recovery redundant with --strategy {} on the mesh {mesh}: the data axis \
                 already holds every state shard {} times, and copies on top of it are not \
                 built; use --recovery rollback or spare-cube (or --modeled-only)",
                self.strategy(),
                mesh.size(optirs_tpu::sharding::MeshAxisName::Data)
            )));
        }
        Ok(())
    }

    /// `--modeled-only` models failure-free steps in closed form: what
    /// needs a real run is a usage error (`--trace` too unless `traced`:
    /// a model's step draws its layers).
    pub(super) fn refuse_real_run_only(&self, traced: bool) -> Result<()> {
        if (self.trace.is_some() && !traced)
            || !self.kill.is_empty()
            || self.checkpoint_every.is_some()
            || self.checkpoint_dir.is_some()
        {
            return Err(usage(
                "--modeled-only models failure-free steps in closed form: --trace, --kill, \
                 --checkpoint-every and --checkpoint-dir need a real run (drop --modeled-only)",
            ));
        }
        Ok(())
    }

    /// Refuses, before the first step, a recovery the run could not
    /// build: `--recovery spare-cube` on a pod without spare cubes; a
    /// `--kill` on a multislice pod under rollback or redundant (both
    /// re-shard onto a ring of the survivors, and a ring across slices is
    /// not built), or under spare-cube with more of the slices' cubes
    /// killed than there are spares (the recovery that finds none left
    /// falls back to a rollback onto the survivors); and kills of every
    /// device under rollback or redundant (no survivor to re-shard onto).
    pub(super) fn refuse_unbuilt_recovery(
        &self,
        topology: &optirs_tpu::topology::Topology,
    ) -> Result<()> {
        optirs_tpu::sharding::model::check_recovery_policy(topology, self.recovery)
            .map_err(|e| usage(e.to_string()))?;
        if self.kill.is_empty() {
            return Ok(());
        }
        let kills = self.kill_flags();
        let reshards = matches!(
            self.recovery,
            RecoveryPolicy::Rollback | RecoveryPolicy::Redundant
        );
        let mut killed: Vec<u32> = self.kill.iter().map(|&(d, _)| d).collect();
        killed.sort_unstable();
        killed.dedup();
        if reshards && killed.len() as u64 >= u64::from(topology.num_devices()) {
            return Err(usage(format!(
                "{kills} with --recovery {}: every device of {} is killed, and a recovery \
                 re-shards onto the survivors; leave at least one device alive",
                self.recovery, topology.name
            )));
        }
        if topology.slices <= 1 {
            return Ok(());
        }
        if reshards {
            return Err(usage(format!(
                "{kills} with --recovery {} on {} ({} slices): the recovery re-shards onto a \
                 ring of the survivors, and a ring across slices is not built; drop --kill, or \
                 train on one slice",
                self.recovery, topology.name, topology.slices
            )));
        }
        let (cubes, spares) = match topology.cubes {
            Some(layout) => {
                let mut cubes: Vec<u32> = killed
                    .iter()
                    .filter_map(|&d| topology.home_cube(d).map(|c| c.cube))
                    .collect();
                cubes.sort_unstable();
                cubes.dedup();
                (cubes.len(), layout.spares as usize)
            }
            None => (0, 0),
        };
        if cubes > spares {
            return Err(usage(format!(
                "{kills} with --recovery spare-cube on {} ({} slices): the kills reach {} \
                 cubes and the pod has {}, so a recovery finds no spare and rolls \
                 back onto a ring of the survivors, which is not built across slices; kill \
                 devices of at most {}, or give the pod file more spares",
                topology.name,
                topology.slices,
                cubes,
                output::plural(spares as u64, "spare", "spares"),
                output::plural(spares as u64, "cube", "cubes")
            )));
        }
        Ok(())
    }

    /// The `--kill`s as written (`--kill 20@0.00005 --kill 3@1`).
    fn kill_flags(&self) -> String {
        let flags: Vec<String> = self
            .kill
            .iter()
            .map(|&(device, seconds)| format!("--kill {device}@{seconds}"))
            .collect();
        flags.join(" ")
    }
}
