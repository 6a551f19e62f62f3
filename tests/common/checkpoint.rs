//! A fault-tolerance manager over test roots, and verification against the
//! pod's own registry, for the checkpoint tests.

use optirs_tpu::Pod;
use optirs_tpu::checkpoint::{SnapshotRegistry, verify_checkpoint};
use optirs_tpu::fault_tolerance::{FaultToleranceConfig, FaultToleranceManager, RecoveryPolicy};
use std::path::{Path, PathBuf};

/// A manager writing to `roots`, keeping `keep` checkpoints per root.
pub fn manager(
    roots: Vec<PathBuf>,
    keep: usize,
    recovery: RecoveryPolicy,
) -> FaultToleranceManager {
    FaultToleranceManager::new(FaultToleranceConfig {
        storage_roots: roots,
        max_checkpoints: keep,
        recovery,
    })
    .unwrap()
}

/// Verifies the checkpoint at `dir` with the pod's registry; the error as text.
pub fn verify(pod: &Pod, dir: &Path) -> Result<(), String> {
    let registry = pod.world().resource::<SnapshotRegistry>();
    verify_checkpoint(dir, registry)
        .map(|_| ())
        .map_err(|e| e.to_string())
}
