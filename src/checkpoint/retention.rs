//! Which checkpoints a root keeps: their names sort by tick, and retention
//! removes the oldest beyond the configured count.

use std::path::Path;

use super::error::CheckpointError;

/// Checkpoint directory name for a tick: sorts by tick.
pub fn checkpoint_name(tick: u64) -> String {
    format!("tick-{tick:012}")
}

/// Removes the oldest `tick-*` checkpoints in `root` beyond `keep`.
pub fn enforce_retention(root: &Path, keep: usize) -> Result<(), CheckpointError> {
    let mut names: Vec<String> = std::fs::read_dir(root)
        .map_err(|source| CheckpointError::Io {
            path: root.to_path_buf(),
            source,
        })?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("tick-"))
        .collect();
    names.sort();
    let excess = names.len().saturating_sub(keep);
    for name in &names[..excess] {
        let path = root.join(name);
        std::fs::remove_dir_all(&path).map_err(|source| CheckpointError::Io { path, source })?;
    }
    Ok(())
}
