//! A sharded optimizer's checkpoints: snapshots and restores of its pod,
//! re-sharding a snapshot from another pod, checkpoints written at step
//! boundaries at their modeled cost ([`ShardedOptimizer::checkpoint_if_due`]),
//! the check that a checkpoint root holds this run's checkpoints only, and
//! resuming a run from its newest one.

use std::path::{Path, PathBuf};

use bevy_ecs::world::World;
use ndarray::IxDyn;

use crate::error::{OptimError, Result};
use crate::exec::runtime::Element;
use crate::optimizers::{FloatElement, Optimizer};
use crate::persist::{SnapshotRegistry, WorldSnapshot};
use crate::sharding::model::{flat_tensor, gather_state, model_of, replace_model};
use crate::sharding::{ShardedModel, ShardingError, SlotValues};
use crate::topology::DeviceId;

use super::driver::Driver;
use super::optimizer::ShardedOptimizer;

/// Checkpoints written at step boundaries ([`ShardedOptimizer::enable_step_checkpoints`]).
#[derive(Debug, Clone)]
pub(super) struct StepCheckpoints {
    every_ns: u64,
    root: PathBuf,
    keep: usize,
    /// When the last write started (or the run did), ns.
    last_started_ns: u64,
    /// The tick label of the newest checkpoint written (after a resume,
    /// the highest label in the root, damaged checkpoints' too, so no
    /// name is written twice).
    last_label: Option<u64>,
    /// Checkpoints retention leaves alone: after a resume, those in the
    /// root that did not verify.
    spared: Vec<String>,
}

/// One checkpoint write at a step boundary.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointWrite {
    /// The model was captured, and the write began, ns.
    pub started_at_ns: u64,
    /// The write ended (its modeled end, or the loss that voided it), ns.
    pub ended_at_ns: u64,
    /// Where it went.
    pub outcome: WriteOutcome,
}

/// How a checkpoint write ended.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteOutcome {
    /// On disk, verified by its manifest.
    Written {
        /// The checkpoint's directory.
        path: PathBuf,
        /// What retention could not do (each names the path).
        retention_problems: Vec<String>,
    },
    /// A device of the model was lost before the write's end: nothing
    /// reached disk.
    Voided {
        /// The device lost.
        device: DeviceId,
    },
}

/// The checkpoint a run resumed from ([`ShardedOptimizer::resume`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Resumed {
    /// Its directory.
    pub path: PathBuf,
    /// The steps it holds.
    pub steps_completed: u64,
    /// Its simulated time, ns.
    pub at_ns: u64,
    /// Newer checkpoints in the root that did not verify, skipped.
    pub skipped: Vec<SkippedCheckpoint>,
    /// The run's record at that checkpoint (`None` for a checkpoint
    /// written without one).
    pub record: Option<super::RunRecord>,
}

/// A checkpoint a resume passed over because it did not verify; it is
/// left on disk as it was.
#[derive(Debug, Clone, PartialEq)]
pub struct SkippedCheckpoint {
    /// Its directory.
    pub path: PathBuf,
    /// Why it did not verify.
    pub problem: String,
}

impl<O, A> ShardedOptimizer<O, A>
where
    O: Optimizer<A, IxDyn>,
    A: FloatElement + Element,
{
    /// A snapshot of the whole pod: devices, health, the model, every
    /// device's state shards (tensors in the safetensors side file when
    /// written as a checkpoint).
    pub fn snapshot(&mut self) -> Result<WorldSnapshot> {
        self.pod.snapshot()
    }

    /// Restores a snapshot of this same pod (verified first; another pod or
    /// topology is an error naming both): the run resumes bit for bit. A
    /// snapshot taken under another strategy (or fsdp prefetch) than this
    /// optimizer's is re-sharded onto this optimizer's after the restore:
    /// the same values, held as [`super::ShardingConfig::strategy`] says
    /// (if they do not fit so, the error says where, and the snapshot's
    /// model stays as restored).
    pub fn restore(&mut self, snapshot: &WorldSnapshot) -> Result<()> {
        // Another strategy re-shards after the restore; if that does not
        // fit, the world goes back to this one.
        let previous = if self.held_otherwise(snapshot)? {
            Some(self.pod.snapshot()?)
        } else {
            None
        };
        self.pod.restore_snapshot(snapshot)?;
        if model_of(self.pod.world()).is_none() {
            return Err(ShardingError::Recovery {
                reason: "the snapshot holds no sharded model".into(),
            }
            .into());
        }
        if let Err(e) = self.hold_as_configured() {
            if let Some(previous) = previous {
                self.pod.restore_snapshot(&previous)?;
                self.compile_programs()?;
            }
            return Err(e);
        }
        self.compile_programs()
    }

    /// Whether `snapshot`'s model is held under another strategy or
    /// prefetch than this optimizer's (read without restoring it).
    fn held_otherwise(&self, snapshot: &WorldSnapshot) -> Result<bool> {
        let registry = self.pod.world().resource::<SnapshotRegistry>();
        let stored = registry
            .decode_component::<ShardedModel>(snapshot, "sharding.ShardedModel")
            .unwrap_or_default();
        let mesh = self.configured_mesh()?;
        Ok(stored.iter().any(|(_, m)| {
            m.strategy() != self.sharding.strategy
                || m.prefetch() != self.sharding.prefetch
                || m.mesh() != mesh.as_ref()
        }))
    }

    /// The mesh this optimizer is configured for, as a model keeps it
    /// (`None` for the pod's default).
    fn configured_mesh(&self) -> Result<Option<crate::sharding::Mesh>> {
        let topology = self.pod.pod().topology();
        let Some(sizes) = self.sharding.mesh else {
            return Ok(None);
        };
        let mesh = sizes.lay_out(topology).map_err(ShardingError::from)?;
        Ok((mesh != crate::sharding::Mesh::default_for(topology)).then_some(mesh))
    }

    /// Re-installs the model under this optimizer's strategy and prefetch
    /// if it holds others (the values unchanged).
    fn hold_as_configured(&mut self) -> Result<()> {
        let model = self.model()?.clone();
        let (strategy, prefetch) = (self.sharding.strategy, self.sharding.prefetch);
        let mesh = self.configured_mesh()?;
        if model.strategy == strategy && model.prefetch == prefetch && model.mesh == mesh {
            return Ok(());
        }
        self.pod.whole("re-sharding onto another strategy")?;
        let state = gather_state::<A>(self.pod.world_mut())?;
        let tensors: Vec<(String, Vec<usize>)> = model
            .layout
            .tensors
            .iter()
            .map(|t| (t.name.clone(), t.shape.clone()))
            .collect();
        let (layout, mesh) = crate::sharding::world::layout_for(
            self.pod.world_mut(),
            (strategy, self.sharding.mesh),
            model.layout.dtype,
            &tensors,
            model.bucket_bytes,
        )?;
        let resize = |v: Vec<A>| layout.fit_padded(v, A::ZERO);
        let state: Vec<Vec<A>> = state.into_iter().map(resize).collect();
        let params = resize(model.flat_params::<A>()?.to_vec());
        let next = ShardedModel {
            strategy,
            prefetch,
            mesh,
            layout,
            params: flat_tensor(params),
            ..model
        };
        Ok(replace_model(
            self.pod.world_mut(),
            next,
            SlotValues::Flat(state),
        )?)
    }

    /// Loads the model of a snapshot taken on any pod (another device
    /// count, another topology) and re-shards it over this optimizer's
    /// devices, as Orbax and DCP re-shard on load: parameters, state and
    /// count come from the snapshot; this pod's time and health stay. The
    /// snapshot is verified and its model checked (same tensors, element
    /// type and optimizer) before anything changes; on `Err` nothing did.
    /// The model takes this optimizer's strategy
    /// ([`super::ShardingConfig::strategy`]), whichever the snapshot was
    /// taken under; a pod that cannot hold it so is an out-of-HBM error.
    pub fn restore_resharded(&mut self, snapshot: &WorldSnapshot) -> Result<()> {
        self.pod.whole("re-sharding a snapshot")?;
        let registry = self.pod.world().resource::<SnapshotRegistry>();
        registry.verify(snapshot)?;
        let mut scratch = bevy_ecs::world::World::new();
        registry.restore(&mut scratch, snapshot)?;
        let theirs = model_of(&scratch)
            .ok_or_else(|| ShardingError::Recovery {
                reason: "the snapshot holds no sharded model".into(),
            })?
            .clone();
        let ours = self.model()?.clone();
        let mismatch = if theirs.layout.tensors != ours.layout.tensors {
            Some("its tensors (names and shapes) differ from this model's".to_string())
        } else if theirs.layout.dtype != ours.layout.dtype {
            Some(format!(
                "it holds {} values, this model {}",
                theirs.layout.dtype, ours.layout.dtype
            ))
        } else if theirs.optimizer != ours.optimizer || theirs.slots != ours.slots {
            Some(format!(
                "it was trained with {}, this optimizer is {}",
                theirs.optimizer, ours.optimizer
            ))
        } else {
            None
        };
        if let Some(reason) = mismatch {
            return Err(ShardingError::Recovery {
                reason: format!("the snapshot's model does not fit: {reason}"),
            }
            .into());
        }
        let state = gather_state::<A>(&mut scratch)?;
        let layout = ours.layout.clone();
        let resize = |v: Vec<A>| layout.fit_padded(v, A::ZERO);
        let params = resize(theirs.flat_params::<A>()?.to_vec());
        let state: Vec<Vec<A>> = state.into_iter().map(resize).collect();
        let next = ShardedModel {
            params: flat_tensor(params),
            count: theirs.count,
            steps_completed: theirs.steps_completed,
            steps_failed: theirs.steps_failed,
            recoveries: theirs.recoveries.clone(),
            recovering_until_ns: 0,
            // The values are the snapshot's whatever its strategy; what
            // each device holds is this optimizer's.
            strategy: self.sharding.strategy,
            prefetch: self.sharding.prefetch,
            ..ours
        };
        replace_model(self.pod.world_mut(), next, SlotValues::Flat(state))?;
        self.compile_programs()
    }

    /// Writes a checkpoint of the whole pod into `root` at the end of a
    /// step ([`ShardedOptimizer::checkpoint_if_due`]) once `every_ns` of
    /// simulated time have passed since the last write began, keeping the
    /// newest `keep`. A write costs simulated time, the model's bytes over
    /// the storage bandwidth ([`ShardedModel::checkpoint_io_seconds`]), and
    /// the model waits for it; the pod's rollback reads these checkpoints
    /// (and, before the first, the model as it is now, kept in memory).
    /// One process only (a split pod writes split periodic checkpoints).
    pub fn enable_step_checkpoints(
        &mut self,
        every_ns: u64,
        root: PathBuf,
        keep: usize,
    ) -> Result<()> {
        if every_ns == 0 || keep == 0 {
            return Err(OptimError::invalid_config(
                "checkpoints at step boundaries need an interval of at least 1 ns and keep >= 1",
            ));
        }
        // The `Recovery` set's rollback reads the roots from here; the
        // periodic system stays off (`every_ticks` 0).
        self.pod
            .world_mut()
            .insert_resource(crate::checkpoint::PeriodicCheckpoints {
                every_ticks: 0,
                roots: vec![root.clone()],
                max_checkpoints: keep,
                written: 0,
                last_error: None,
                retention_problems: Vec::new(),
            });
        let start = crate::sharding::model::StartingModel::capture::<A>(self.pod.world_mut())?;
        self.pod.world_mut().insert_resource(start);
        self.checkpoints = Some(StepCheckpoints {
            every_ns,
            root,
            keep,
            last_started_ns: self.pod.clock().now_ns,
            last_label: None,
            spared: Vec::new(),
        });
        Ok(())
    }

    /// Simulated seconds one checkpoint write (or read) of the model takes
    /// on this pod.
    pub fn checkpoint_seconds(&self) -> Result<f64> {
        let hosts = self.pod.pod().topology().num_hosts();
        Ok(self.model()?.checkpoint_io_seconds(hosts))
    }

    /// At a step boundary: writes a checkpoint if one is due
    /// ([`ShardedOptimizer::enable_step_checkpoints`]). The model is
    /// captured now; the pod advances to the write's modeled end (skipping
    /// idle ticks), and only then does the checkpoint reach disk. A device
    /// of the model lost before that voids the write. A disk error is an
    /// `Err` naming the path.
    pub fn checkpoint_if_due(&mut self) -> Result<Option<CheckpointWrite>> {
        self.checkpoint_if_due_recording(None)
    }

    /// [`ShardedOptimizer::checkpoint_if_due`] whose checkpoint also
    /// carries the host's record of the run (`record` is asked for it
    /// only when a checkpoint is due; one process only).
    pub fn checkpoint_if_due_recording(
        &mut self,
        record: Option<&dyn Fn() -> Vec<u8>>,
    ) -> Result<Option<CheckpointWrite>> {
        let Some(config) = &self.checkpoints else {
            return Ok(None);
        };
        let now = self.pod.clock().now_ns;
        if now.saturating_sub(config.last_started_ns) < config.every_ns {
            return Ok(None);
        }
        // Two writes ending in one tick get consecutive labels, so the
        // newest is always the one rollback and retention take.
        let tick = self.pod.clock().tick;
        let label = config.last_label.map_or(tick, |l| tick.max(l + 1));
        let (root, keep, spared) = (config.root.clone(), config.keep, config.spared.clone());
        let seconds = self.checkpoint_seconds()?;
        if let Driver::Ranked(_) = self.pod {
            return self.split_checkpoint(now, label, seconds, root, keep);
        }
        let snapshot = self.pod.pod_mut().snapshot_labeled(label)?;
        let record = record.map(|f| f());
        let (ended_at_ns, lost) = self.wait_out_write(
            now,
            seconds,
            crate::sharding::participants::lost_participant,
        )?;
        if let Some(device) = lost {
            return Ok(Some(CheckpointWrite {
                started_at_ns: now,
                ended_at_ns,
                outcome: WriteOutcome::Voided { device },
            }));
        }
        let name = crate::checkpoint::checkpoint_name(label);
        let pod_name = self.pod.pod().topology().name.clone();
        crate::checkpoint::write_checkpoint_with(
            &root,
            &name,
            &pod_name,
            &snapshot,
            record.as_deref(),
            &mut |_| Ok(()),
        )?;
        let retention = crate::checkpoint::enforce_retention_sparing(&root, keep, &name, &spared);
        if let Some(c) = &mut self.checkpoints {
            c.last_label = Some(label);
        }
        Ok(Some(CheckpointWrite {
            started_at_ns: now,
            ended_at_ns,
            outcome: WriteOutcome::Written {
                path: root.join(name),
                retention_problems: retention.problems,
            },
        }))
    }

    /// Waits out a write started at `now` that takes `seconds`, stopping
    /// early when `lost` names a participant (the write is then void).
    /// Returns when the wait ended and the participant lost, if any.
    fn wait_out_write(
        &mut self,
        now: u64,
        seconds: f64,
        lost: fn(&World) -> Option<DeviceId>,
    ) -> Result<(u64, Option<DeviceId>)> {
        if let Some(c) = &mut self.checkpoints {
            c.last_started_ns = now;
        }
        let ends_at = now.saturating_add((seconds * 1e9).ceil() as u64);
        self.pod.advance_until(ends_at, |w| lost(w).is_some())?;
        Ok((self.pod.clock().now_ns, lost(self.pod.world())))
    }

    /// [`ShardedOptimizer::checkpoint_if_due`] on a pod split over ranks:
    /// every rank writes its part of the world as it is now (rank 0 the
    /// commit record), then the ranks wait out the write's modeled time in
    /// lockstep. A loss before its end voids the write: rank 0 removes the
    /// checkpoint, so rollback and retention never see it, as in one
    /// process. The loss is read from the scenario every rank holds alike
    /// (device liveness), so every rank stops and decides together.
    fn split_checkpoint(
        &mut self,
        now: u64,
        label: u64,
        seconds: f64,
        root: PathBuf,
        keep: usize,
    ) -> Result<Option<CheckpointWrite>> {
        let name = crate::checkpoint::checkpoint_name(label);
        let Driver::Ranked(ranked) = &mut self.pod else {
            return Err(OptimError::invalid_config(
                "a split checkpoint needs a split pod",
            ));
        };
        let service = ranked.layout().runs_service();
        ranked.save_checkpoint_labeled(&root, &name, label)?;
        let (ended_at_ns, lost) = self.wait_out_write(
            now,
            seconds,
            crate::sharding::participants::stopped_participant,
        )?;
        if let Some(device) = lost {
            if service {
                std::fs::remove_dir_all(root.join(&name)).map_err(|e| {
                    OptimError::invalid_config(format!(
                        "removing the voided checkpoint {}: {e}",
                        root.join(&name).display()
                    ))
                })?;
            }
            return Ok(Some(CheckpointWrite {
                started_at_ns: now,
                ended_at_ns,
                outcome: WriteOutcome::Voided { device },
            }));
        }
        let retention_problems = if service {
            crate::checkpoint::enforce_retention(&root, keep, &name).problems
        } else {
            Vec::new()
        };
        if let Some(c) = &mut self.checkpoints {
            c.last_label = Some(label);
        }
        Ok(Some(CheckpointWrite {
            started_at_ns: now,
            ended_at_ns,
            outcome: WriteOutcome::Written {
                path: root.join(name),
                retention_problems,
            },
        }))
    }

    /// Refuses a checkpoint root that holds another model's checkpoints
    /// (other tensors, element type, optimizer, reduction, buckets,
    /// recovery policy, or another pod), naming both, before any step: a
    /// run must not mix its checkpoints with another's, nor let retention
    /// delete its own for them. Checkpoints that do not verify are left to
    /// rollback, which skips them.
    pub fn check_checkpoint_root(&self, root: &Path) -> Result<()> {
        if !root.exists() {
            return Ok(());
        }
        let ours = self.model()?;
        let our_pod = self.pod.pod().topology().name.clone();
        let registry = self.pod.world().resource::<SnapshotRegistry>();
        for listing in crate::checkpoint::list_checkpoints(root, registry)? {
            if listing.problem.is_some() {
                continue;
            }
            let (manifest, snapshot) =
                crate::checkpoint::verify_checkpoint(&listing.path, registry)?;
            let theirs = model_in(registry, &snapshot)?;
            let same = theirs.as_ref().is_some_and(|m| same_model(m, ours));
            if !same || manifest.pod != our_pod {
                let held = theirs.map_or_else(|| "no sharded model".to_string(), |m| m.describe());
                return Err(ShardingError::OtherRun {
                    path: listing.path.clone(),
                    theirs: format!("{held} on {}", manifest.pod),
                    ours: format!("{} on {our_pod}", ours.describe()),
                }
                .into());
            }
        }
        Ok(())
    }

    /// Continues a run from the newest verified checkpoint in `root`: the
    /// whole pod (model, state, count, clock, health, faults still to
    /// come) is restored, then the pod waits out that checkpoint's write as
    /// the run did, so the run goes on bit for bit as if never stopped.
    /// Checkpoints are then written as before (enable them first), under
    /// names after every one in the root. Newer checkpoints that do not
    /// verify are skipped ([`Resumed::skipped`] says why); every checkpoint
    /// that does not verify is left on disk as it is: retention spares it
    /// and no write takes its name.
    /// Another model's checkpoint is refused
    /// ([`ShardedOptimizer::check_checkpoint_root`]). On `Err` the pod is
    /// as it was.
    pub fn resume(&mut self, root: &Path) -> Result<Resumed> {
        self.pod.whole("resuming from a checkpoint")?;
        self.check_checkpoint_root(root)?;
        let registry = self.pod.world().resource::<SnapshotRegistry>();
        let listings = crate::checkpoint::list_checkpoints(root, registry)?;
        let Some(newest) = listings.iter().find(|l| l.problem.is_none()) else {
            let problems: Vec<String> = listings.iter().filter_map(|l| l.problem.clone()).collect();
            return Err(ShardingError::NothingToResume {
                root: root.to_path_buf(),
                problems: if problems.is_empty() {
                    String::new()
                } else {
                    format!(": {}", problems.join("; "))
                },
            }
            .into());
        };
        let path = newest.path.clone();
        let skipped = skipped_newer(&listings, newest.tick);
        let highest = highest_label(&listings);
        let (manifest, snapshot) = crate::checkpoint::verify_checkpoint(&path, registry)?;
        let record = crate::checkpoint::read_run_record(&path, &manifest)?
            .map(|bytes| {
                let what = path.join(crate::checkpoint::RUN_FILE);
                super::RunRecord::from_bytes(&bytes, &what.display().to_string())
            })
            .transpose()?;
        self.restore(&snapshot)?;
        let now = self.pod.clock().now_ns;
        let seconds = self.checkpoint_seconds()?;
        if let Some(c) = &mut self.checkpoints {
            c.last_label = Some(snapshot.tick.max(highest));
            // Every checkpoint that does not verify stays as it is.
            c.spared = listings
                .iter()
                .filter(|l| l.problem.is_some())
                .map(|l| l.name.clone())
                .collect();
        }
        self.wait_out_write(
            now,
            seconds,
            crate::sharding::participants::lost_participant,
        )?;
        Ok(Resumed {
            path,
            steps_completed: self.steps_completed(),
            at_ns: now,
            skipped,
            record,
        })
    }
}

/// The checkpoints of `listings` (newest first) that did not verify and
/// are newer than the one at `chosen_tick`, or of no readable tick.
fn skipped_newer(
    listings: &[crate::checkpoint::CheckpointListing],
    chosen_tick: Option<u64>,
) -> Vec<SkippedCheckpoint> {
    listings
        .iter()
        .filter(|l| l.tick.is_none_or(|t| chosen_tick.is_none_or(|c| t >= c)))
        .filter_map(|l| {
            l.problem.as_ref().map(|problem| SkippedCheckpoint {
                path: l.path.clone(),
                problem: problem.clone(),
            })
        })
        .collect()
}

/// The highest tick label any entry of `listings` holds, by its manifest
/// or its name (`tick-000000000077`), damaged or not.
fn highest_label(listings: &[crate::checkpoint::CheckpointListing]) -> u64 {
    listings
        .iter()
        .flat_map(|l| {
            let named = l
                .name
                .strip_prefix("tick-")
                .and_then(|digits| digits.parse::<u64>().ok());
            [l.tick, named]
        })
        .flatten()
        .max()
        .unwrap_or(0)
}

/// The sharded model a snapshot holds, if any.
fn model_in(registry: &SnapshotRegistry, snapshot: &WorldSnapshot) -> Result<Option<ShardedModel>> {
    let mut scratch = World::new();
    registry.restore(&mut scratch, snapshot)?;
    Ok(model_of(&scratch).cloned())
}

/// Whether two models are the same run's: what a checkpoint restores into
/// must have the same tensors, element type, optimizer, reduction, buckets
/// and recovery policy.
fn same_model(a: &ShardedModel, b: &ShardedModel) -> bool {
    a.layout.tensors == b.layout.tensors
        && a.layout.dtype == b.layout.dtype
        && a.optimizer == b.optimizer
        && a.slots == b.slots
        && a.reduction == b.reduction
        && a.bucket_bytes == b.bucket_bytes
        && a.recovery == b.recovery
}
