//! Which checkpoints a root keeps.
//!
//! Retention deletes only checkpoints it can identify as written by
//! periodic or managed saves: a directory (not a link) whose manifest (or,
//! for a split pod's checkpoint, whose commit record)
//! parses and verifies its own digest, records the directory's name, and
//! whose name is [`checkpoint_name`] of the tick the manifest records. They
//! are ordered by that recorded tick, never by the name's text. Anything
//! else in the root — a directory without a manifest (`tick-best/`), a
//! checkpoint saved under another name, a file, a link — is never touched,
//! and the checkpoint just committed is never removed. A checkpoint that
//! cannot be removed is reported in the [`RetentionReport`]; it does not
//! undo the checkpoint just written.

use std::fs;
use std::path::{Path, PathBuf};

use super::read::read;
use super::split::{SPLIT_MANIFEST, is_split_checkpoint, parse_split};
use super::store::{MANIFEST, parse_manifest};

/// Checkpoint directory name for a tick: sorts by tick.
pub fn checkpoint_name(tick: u64) -> String {
    format!("tick-{tick:012}")
}

/// What [`enforce_retention`] did in one root.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RetentionReport {
    /// Checkpoints removed, oldest first.
    pub removed: Vec<PathBuf>,
    /// What could not be done (a root that cannot be read, a checkpoint
    /// that cannot be removed), each naming the path and why.
    pub problems: Vec<String>,
}

/// The tick a managed checkpoint records, or `None` for anything retention
/// must leave alone.
fn managed_tick(dir: &Path, name: &str) -> Option<u64> {
    let (recorded, tick) = if is_split_checkpoint(dir) {
        let path = dir.join(SPLIT_MANIFEST);
        let manifest = parse_split(&path, &read(&path).ok()?).ok()?;
        (manifest.name, manifest.tick)
    } else {
        let path = dir.join(MANIFEST);
        let manifest = parse_manifest(&path, &read(&path).ok()?).ok()?;
        (manifest.name, manifest.tick)
    };
    (recorded == name && checkpoint_name(tick) == name).then_some(tick)
}

/// Keeps the newest `keep` managed checkpoints in `root` (by recorded
/// tick), counting `current` — the checkpoint just committed, which is
/// never removed — and removes the older managed ones.
pub fn enforce_retention(root: &Path, keep: usize, current: &str) -> RetentionReport {
    enforce_retention_sparing(root, keep, current, &[])
}

/// [`enforce_retention`] that also leaves the checkpoints named in
/// `spared` as they are, without counting them among the `keep` (a
/// resumed run spares the checkpoints that do not verify, so they stay on
/// disk to be looked at and never take a good one's place).
pub fn enforce_retention_sparing(
    root: &Path,
    keep: usize,
    current: &str,
    spared: &[String],
) -> RetentionReport {
    let mut report = RetentionReport::default();
    let entries = match fs::read_dir(root) {
        Ok(entries) => entries,
        Err(error) => {
            report.problems.push(format!(
                "{}: cannot read the root to apply retention: {error}",
                root.display()
            ));
            return report;
        }
    };
    let mut managed: Vec<(u64, String)> = Vec::new();
    for entry in entries.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if name == current || name.starts_with('.') || !is_dir || spared.contains(&name) {
            continue;
        }
        if let Some(tick) = managed_tick(&entry.path(), &name) {
            managed.push((tick, name));
        }
    }
    managed.sort();
    // `current` takes one of the `keep` places.
    let excess = managed.len().saturating_sub(keep.saturating_sub(1));
    for (_, name) in &managed[..excess] {
        let path = root.join(name);
        match fs::remove_dir_all(&path) {
            Ok(()) => report.removed.push(path),
            Err(error) => report.problems.push(format!(
                "{}: could not remove the old checkpoint: {error}",
                path.display()
            )),
        }
    }
    report
}
