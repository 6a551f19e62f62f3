//! Fault tolerance on top of verified checkpoints: [`FaultToleranceManager`].
//!
//! ```
//! use optirs_tpu::Pod;
//! use optirs_tpu::fault_tolerance::{FaultToleranceConfig, FaultToleranceManager};
//!
//! let dir = tempfile::tempdir()?;
//! let manager = FaultToleranceManager::new(FaultToleranceConfig {
//!     storage_roots: vec![dir.path().join("a"), dir.path().join("b")],
//!     ..Default::default()
//! })?;
//! let mut pod = Pod::from_preset("v4-16")?;
//! pod.run(10);
//! let saved = manager.create_checkpoint(&mut pod)?;   // written to both roots
//! pod.run(50);
//! let back = manager.rollback(&mut pod)?;             // newest that verifies
//! assert_eq!((back.tick, pod.clock().tick), (saved.tick, 10));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub use crate::checkpoint::{
    PeriodicCheckpoints, checkpoint_name, enforce_retention, write_periodic_checkpoint,
};
pub use crate::health::Excluded;

use crate::checkpoint::{
    CheckpointError, CheckpointListing, list_checkpoints, verify_checkpoint, write_checkpoint,
};
use crate::error::{OptimError, Result};
use crate::health::{DeviceState, Fault, Health};
use crate::persist::SnapshotRegistry;
use crate::pod::Pod;
use crate::topology::{Device, DeviceId};
use bevy_ecs::prelude::*;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What to do when a device fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecoveryPolicy {
    /// Restore the newest checkpoint that verifies; the dead devices stay
    /// dead (and known failed) in the restored world.
    RollBack,
    /// Keep going without the failed devices: they are excluded from
    /// barriers over "every device" from now on.
    ExcludeAndRebalance,
}

/// How the manager stores checkpoints and recovers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultToleranceConfig {
    /// Directories to write every checkpoint to (replication); restore reads
    /// them in order and takes the first copy that verifies.
    pub storage_roots: Vec<PathBuf>,
    /// Checkpoints kept per root, counting the one just written; the
    /// oldest (by the tick their manifest records) are removed first. Only
    /// checkpoints the manager or periodic saves wrote are counted or
    /// removed (see [`enforce_retention`]). At least 1.
    pub max_checkpoints: usize,
    /// What [`FaultToleranceManager::recover`] does.
    pub recovery: RecoveryPolicy,
}

impl Default for FaultToleranceConfig {
    fn default() -> Self {
        FaultToleranceConfig {
            storage_roots: vec![PathBuf::from("checkpoints")],
            max_checkpoints: 5,
            recovery: RecoveryPolicy::RollBack,
        }
    }
}

/// A checkpoint written or restored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckpointInfo {
    /// Directory name (`tick-000000001200`).
    pub name: String,
    /// Tick it holds.
    pub tick: u64,
    /// Where it was written or read.
    pub paths: Vec<PathBuf>,
    /// Older checkpoints retention removed after the write.
    pub removed: Vec<PathBuf>,
    /// What retention could not do after the write (the checkpoint itself
    /// was written): each problem names the path and why.
    pub retention_problems: Vec<String>,
}

impl CheckpointInfo {
    fn read_from(name: &str, tick: u64, path: PathBuf) -> CheckpointInfo {
        CheckpointInfo {
            name: name.to_string(),
            tick,
            paths: vec![path],
            removed: Vec::new(),
            retention_problems: Vec::new(),
        }
    }
}

/// What [`FaultToleranceManager::recover`] did.
#[derive(Debug, Default)]
pub struct RecoveryReport {
    /// Devices found failed.
    pub failed: Vec<DeviceId>,
    /// The checkpoint rolled back to, under [`RecoveryPolicy::RollBack`].
    pub rolled_back_to: Option<CheckpointInfo>,
    /// Devices excluded, under [`RecoveryPolicy::ExcludeAndRebalance`].
    pub excluded: Vec<DeviceId>,
    /// Steps that could not be done, with why (for example, live migration,
    /// which needs a TPU runtime). They do not abort the rest.
    pub errors: Vec<String>,
}

/// Checkpoints, rollback, replication and recovery for a [`Pod`].
#[derive(Debug, Clone)]
pub struct FaultToleranceManager {
    config: FaultToleranceConfig,
}

impl FaultToleranceManager {
    /// Checks the configuration; the roots are created on first write.
    pub fn new(config: FaultToleranceConfig) -> Result<FaultToleranceManager> {
        if config.storage_roots.is_empty() {
            return Err(OptimError::invalid_config(
                "fault tolerance needs at least one storage root",
            ));
        }
        if config.max_checkpoints == 0 {
            return Err(OptimError::invalid_config(
                "max_checkpoints must be at least 1",
            ));
        }
        Ok(FaultToleranceManager { config })
    }

    /// The configuration.
    pub fn config(&self) -> &FaultToleranceConfig {
        &self.config
    }

    /// Writes the pod's world to every storage root, then enforces retention.
    pub fn create_checkpoint(&self, pod: &mut Pod) -> Result<CheckpointInfo> {
        let snapshot = pod.snapshot()?;
        let name = checkpoint_name(snapshot.tick);
        let pod_name = pod.topology().name.clone();
        let mut info = CheckpointInfo {
            name: name.clone(),
            tick: snapshot.tick,
            paths: Vec::new(),
            removed: Vec::new(),
            retention_problems: Vec::new(),
        };
        for root in &self.config.storage_roots {
            write_checkpoint(root, &name, &pod_name, &snapshot, &mut |_| Ok(()))?;
            info.paths.push(root.join(&name));
            let retention = enforce_retention(root, self.config.max_checkpoints, &name);
            info.removed.extend(retention.removed);
            info.retention_problems.extend(retention.problems);
        }
        Ok(info)
    }

    /// Restores checkpoint `name` from the first root whose copy verifies.
    pub fn restore_checkpoint(&self, pod: &mut Pod, name: &str) -> Result<CheckpointInfo> {
        crate::checkpoint::check_name(name)?;
        let mut problems = Vec::new();
        for root in &self.config.storage_roots {
            let dir = root.join(name);
            match restore_dir(pod, &dir) {
                Ok(tick) => return Ok(CheckpointInfo::read_from(name, tick, dir)),
                Err(error) => problems.push(error.to_string()),
            }
        }
        Err(CheckpointError::NoValidCheckpoint(problems.join("; ")).into())
    }

    /// Restores the newest checkpoint, over all roots, that verifies;
    /// corrupt ones are skipped.
    pub fn rollback(&self, pod: &mut Pod) -> Result<CheckpointInfo> {
        let registry = pod.world().resource::<SnapshotRegistry>();
        let mut candidates: Vec<(u64, String, PathBuf)> = Vec::new();
        let mut problems = Vec::new();
        for root in &self.config.storage_roots {
            let Ok(listings) = list_checkpoints(root, registry) else {
                problems.push(format!("{}: unreadable", root.display()));
                continue;
            };
            for CheckpointListing {
                name,
                path,
                tick,
                problem,
            } in listings
            {
                match (tick, problem) {
                    (Some(tick), None) => candidates.push((tick, name, path)),
                    (_, Some(problem)) => problems.push(problem),
                    (None, None) => {}
                }
            }
        }
        candidates.sort_by_key(|c| std::cmp::Reverse(c.0));
        for (tick, name, path) in candidates {
            match restore_dir(pod, &path) {
                Ok(_) => return Ok(CheckpointInfo::read_from(&name, tick, path)),
                Err(error) => problems.push(error.to_string()),
            }
        }
        Err(CheckpointError::NoValidCheckpoint(if problems.is_empty() {
            "no checkpoints written yet".into()
        } else {
            problems.join("; ")
        })
        .into())
    }

    /// Copies checkpoint `name` (from the first root whose copy verifies)
    /// into `root`, verified and committed atomically like any checkpoint.
    /// The name is checked before any path is read: only a plain name the
    /// manager would write is accepted.
    pub fn replicate(&self, pod: &Pod, name: &str, root: &Path) -> Result<PathBuf> {
        crate::checkpoint::check_name(name)?;
        let registry = pod.world().resource::<SnapshotRegistry>();
        let mut problems = Vec::new();
        for source in &self.config.storage_roots {
            match verify_checkpoint(&source.join(name), registry) {
                Ok((manifest, snapshot)) => {
                    write_checkpoint(root, name, &manifest.pod, &snapshot, &mut |_| Ok(()))?;
                    return Ok(root.join(name));
                }
                Err(error) => problems.push(error.to_string()),
            }
        }
        Err(CheckpointError::NoValidCheckpoint(problems.join("; ")).into())
    }

    /// Every checkpoint in every root, verified, newest first per root.
    pub fn list(&self, pod: &Pod) -> Result<Vec<CheckpointListing>> {
        let registry = pod.world().resource::<SnapshotRegistry>();
        let mut all = Vec::new();
        for root in &self.config.storage_roots {
            if root.exists() {
                all.extend(list_checkpoints(root, registry)?);
            }
        }
        Ok(all)
    }

    /// Live migration of a running workload between chips needs a TPU
    /// runtime; this engine never links one, so it is always an error.
    pub fn migrate_workload(&self, from: DeviceId, to: DeviceId) -> Result<()> {
        Err(OptimError::from(crate::error::Unsupported {
            operation: format!("migrating the workload of {from} to {to}"),
            reason: "live migration moves device memory and execution state, which needs a \
                     vendor TPU runtime; roll back to a checkpoint or exclude the device instead"
                .into(),
        }))
    }

    /// Reacts to the devices the detector has declared failed, by the
    /// configured policy. Migration is attempted and reported, never fatal.
    pub fn recover(&self, pod: &mut Pod) -> RecoveryReport {
        let failed = failed_devices(pod);
        let mut report = RecoveryReport {
            failed: failed.clone(),
            ..Default::default()
        };
        if failed.is_empty() {
            return report;
        }
        let healthy = (0..pod.topology().num_devices())
            .map(DeviceId)
            .find(|d| !failed.contains(d));
        for &device in &failed {
            if let Some(target) = healthy
                && let Err(error) = self.migrate_workload(device, target)
            {
                report.errors.push(error.to_string());
            }
        }
        match self.config.recovery {
            RecoveryPolicy::RollBack => {
                let dead = killed_devices(pod);
                match self.rollback(pod) {
                    Ok(info) => {
                        report.rolled_back_to = Some(info);
                        // The hardware is still dead after a rollback.
                        mark_dead(pod, &dead, &failed);
                    }
                    Err(error) => report.errors.push(error.to_string()),
                }
            }
            RecoveryPolicy::ExcludeAndRebalance => {
                for &device in &failed {
                    if let Some(entity) = pod
                        .world()
                        .resource::<crate::topology::DeviceIndex>()
                        .get(device)
                    {
                        pod.world_mut().entity_mut(entity).insert(Excluded);
                    }
                }
                report.excluded = failed;
            }
        }
        report
    }
}

fn restore_dir(pod: &mut Pod, dir: &Path) -> Result<u64> {
    let registry = pod.world().resource::<SnapshotRegistry>();
    let (manifest, snapshot) = verify_checkpoint(dir, registry)?;
    if manifest.pod != pod.topology().name {
        return Err(CheckpointError::OtherPod {
            path: dir.to_path_buf(),
            checkpoint: manifest.pod,
            live: pod.topology().name.clone(),
        }
        .into());
    }
    // The snapshot's own topology is compared too, before anything changes.
    pod.restore_snapshot(&snapshot)?;
    Ok(manifest.tick)
}

fn failed_devices(pod: &mut Pod) -> Vec<DeviceId> {
    let world = pod.world_mut();
    let mut failed: Vec<DeviceId> = world
        .query_filtered::<(&Device, &Health), Without<Excluded>>()
        .iter(world)
        .filter(|(_, health)| health.is_failed())
        .map(|(device, _)| device.id)
        .collect();
    failed.sort();
    failed
}

fn killed_devices(pod: &mut Pod) -> Vec<DeviceId> {
    let world = pod.world_mut();
    let mut killed: Vec<DeviceId> = world
        .query::<(&Device, &DeviceState)>()
        .iter(world)
        .filter(|(_, state)| matches!(state, DeviceState::Killed { .. }))
        .map(|(device, _)| device.id)
        .collect();
    killed.sort();
    killed
}

/// After a rollback: dead chips are dead again, and known failed.
fn mark_dead(pod: &mut Pod, killed: &[DeviceId], failed: &[DeviceId]) {
    let now = pod.clock().now_ns;
    for &device in killed {
        let _ = pod.inject(Fault::KillDevice(device));
    }
    for &device in failed {
        if let Some(entity) = pod
            .world()
            .resource::<crate::topology::DeviceIndex>()
            .get(device)
        {
            pod.world_mut().entity_mut(entity).insert(Health::Failed {
                detected_at_ns: now,
            });
        }
    }
}
