//! Checkpoints of a pod split over ranks, and the canonical merge of the
//! ranks' parts of one world.
//!
//! A split checkpoint is one directory:
//!
//! ```text
//! NAME/
//!   ranks.ron    the commit record: pod, tick, each part's rank, hosts and manifest digest; self-digested
//!   rank-0000/   rank 0's part: an ordinary checkpoint (manifest.ron, world.bin, tensors.safetensors)
//!   rank-0001/ …
//! ```
//!
//! The parts stage in a temporary directory ([`stage_split`],
//! [`write_split_part`]); [`commit_split`] writes the record only after
//! every part is durable and renames the directory into place.
//! [`read_split_checkpoint`] verifies every byte and merges the parts with
//! [`merge_parts`] into the world one process holds, so a checkpoint
//! written with any rank count restores with any other, or in one process.
//! The protocol that has every rank take part lives in `pod::ranks`.

use super::error::CheckpointError;
use super::read::read;
use super::store::{
    MANIFEST, io_error, parse_digested, render_digested, render_manifest, sync_dir,
    verify_checkpoint, write_checkpoint,
};
use crate::memory::ShardSlot;
use crate::persist::{Column, SnapshotError, SnapshotRegistry, StoredTensor, WorldSnapshot, hex};
use crate::topology::PodTopology;
use crate::transport::ClusterError;
use crate::transport::cluster::{self, RankContext, RankLayout};
use crate::transport::{
    DELIVERY_LOG_CAPACITY, StoredEnvelope, StoredTransport, merge_envelope_parts,
    merge_transport_parts,
};
use bevy_ecs::prelude::*;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// How the parts' copies of a resource become the merged world's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceRule {
    /// Every rank holds the same value (the scenario); they must agree.
    Replicated,
    /// The coordination service's state: rank 0's.
    Service,
    /// The transport: in-flight messages and counts combined.
    Transport,
    /// A list of delivered messages: all parts' in delivery order, the
    /// newest `Some(n)` if bounded.
    Envelopes(Option<usize>),
}

/// The rule of every resource the engine persists. A resource without a
/// rule cannot be merged: [`merge_parts`] refuses it, so a new resource is
/// classified here when it is registered.
pub const RESOURCE_RULES: &[(&str, ResourceRule)] = &[
    ("barrier.BarrierRegistry", ResourceRule::Service),
    ("health.FailureEpoch", ResourceRule::Service),
    ("health.FailureLog", ResourceRule::Service),
    ("health.FaultPlan", ResourceRule::Replicated),
    ("health.HeartbeatConfig", ResourceRule::Replicated),
    ("monitor.DeviceHistory", ResourceRule::Service),
    ("monitor.HealthThresholds", ResourceRule::Replicated),
    ("monitor.MonitorConfig", ResourceRule::Replicated),
    ("monitor.MonitorState", ResourceRule::Service),
    ("pod.SimClock", ResourceRule::Replicated),
    ("pod.SimRng", ResourceRule::Replicated),
    ("topology.DeviceIndex", ResourceRule::Replicated),
    ("topology.PodTopology", ResourceRule::Replicated),
    (
        "transport.DeliveryLog",
        ResourceRule::Envelopes(Some(DELIVERY_LOG_CAPACITY)),
    ),
    ("transport.Inbox", ResourceRule::Envelopes(None)),
    ("transport.Transport", ResourceRule::Transport),
    ("xla.DisabledPasses", ResourceRule::Replicated),
];

/// The canonical merge of the parts of one world, part `r` from rank `r`
/// (`pod::ranks` says which rank holds what). The parts must be of the same
/// tick, entity count and columns.
pub fn merge_parts(
    registry: &SnapshotRegistry,
    parts: &[WorldSnapshot],
) -> Result<WorldSnapshot, SnapshotError> {
    let first = parts.first().ok_or_else(|| SnapshotError::PartsDisagree {
        column: "<world>".into(),
        reason: "there are no parts".into(),
    })?;
    for (rank, part) in parts.iter().enumerate() {
        let same_shape = part.format_version == first.format_version
            && part.tick == first.tick
            && part.entity_count == first.entity_count
            && names(&part.components) == names(&first.components)
            && names(&part.resources) == names(&first.resources);
        if !same_shape {
            return Err(SnapshotError::PartsDisagree {
                column: "<world>".into(),
                reason: format!(
                    "part {rank} is tick {} with {} entities, part 0 tick {} with {} \
                     (or their columns differ)",
                    part.tick, part.entity_count, first.tick, first.entity_count
                ),
            });
        }
    }
    let tensors = merge_tensors(parts)?;
    let held = held_shard_rows(registry, parts)?;
    let components = first
        .components
        .iter()
        .enumerate()
        .map(|(i, column)| {
            let bytes: Vec<&[u8]> = match &held {
                Some(rows) if column.name == SHARD_SLOTS => rows.iter().map(|r| &r[..]).collect(),
                _ => parts.iter().map(|p| &p.components[i].bytes[..]).collect(),
            };
            Ok(Column {
                name: column.name.clone(),
                bytes: registry.merge_component(&column.name, &bytes)?,
            })
        })
        .collect::<Result<Vec<_>, SnapshotError>>()?;
    let resources = first
        .resources
        .iter()
        .enumerate()
        .map(|(i, column)| {
            let copies: Vec<&[u8]> = parts.iter().map(|p| &p.resources[i].bytes[..]).collect();
            Ok(Column {
                name: column.name.clone(),
                bytes: merge_resource(&column.name, &copies)?,
            })
        })
        .collect::<Result<Vec<_>, SnapshotError>>()?;
    Ok(WorldSnapshot {
        format_version: first.format_version,
        tick: first.tick,
        entity_count: first.entity_count,
        components,
        resources,
        tensors,
    })
}

/// A sharded model's state shards: every rank keeps every shard's entity
/// (so ids agree), but only the rank of the shard's device holds its
/// values. Each part's column reduced to the rows its rank holds, or
/// `None` for a world without the column or a single part.
fn held_shard_rows(
    registry: &SnapshotRegistry,
    parts: &[WorldSnapshot],
) -> Result<Option<Vec<Vec<u8>>>, SnapshotError> {
    const NAME: &str = SHARD_SLOTS;
    let has_column = parts[0].components.iter().any(|c| c.name == NAME);
    if parts.len() < 2 || !has_column {
        return Ok(None);
    }
    let topology = registry
        .decode_resource::<PodTopology>(&parts[0], "topology.PodTopology")?
        .0;
    let layout = RankLayout::new(&topology, parts.len() as u32, 0).map_err(|e| {
        SnapshotError::PartsUnfit {
            column: NAME.into(),
            source: Box::new(e),
        }
    })?;
    let rows = parts
        .iter()
        .enumerate()
        .map(|(rank, part)| {
            let rows = registry.decode_component::<ShardSlot>(part, NAME)?;
            let held: Vec<_> = rows
                .into_iter()
                .filter(|(_, slot)| layout.rank_of_device(slot.device()) == rank as u32)
                .collect();
            Ok(postcard::to_stdvec(&held).expect("stored values encode"))
        })
        .collect::<Result<Vec<_>, SnapshotError>>()?;
    Ok(Some(rows))
}

/// The column of a sharded model's state shards.
const SHARD_SLOTS: &str = "sharding.ShardSlot";

/// The union of the parts' tensors by name (a tensor's name is its row's,
/// and rows have one id on every rank); a tensor several parts hold (the
/// replicated parameters) must be the same in all.
fn merge_tensors(parts: &[WorldSnapshot]) -> Result<Vec<StoredTensor>, SnapshotError> {
    let mut merged: std::collections::BTreeMap<&str, (usize, &StoredTensor)> =
        std::collections::BTreeMap::new();
    for (rank, part) in parts.iter().enumerate() {
        for tensor in &part.tensors {
            match merged.get(tensor.name.as_str()) {
                None => {
                    merged.insert(&tensor.name, (rank, tensor));
                }
                Some((first, held)) => {
                    let same = held.dtype == tensor.dtype
                        && held.shape == tensor.shape
                        && held.data == tensor.data;
                    if !same {
                        return Err(SnapshotError::PartsDisagree {
                            column: format!("<tensor {}>", tensor.name),
                            reason: format!(
                                "parts {first} and {rank} both hold it, with different values"
                            ),
                        });
                    }
                }
            }
        }
    }
    Ok(merged.into_values().map(|(_, t)| t.clone()).collect())
}

fn names(columns: &[Column]) -> Vec<&str> {
    columns.iter().map(|c| c.name.as_str()).collect()
}

fn decode<S: serde::de::DeserializeOwned>(name: &str, bytes: &[u8]) -> Result<S, SnapshotError> {
    postcard::from_bytes(bytes).map_err(|source| SnapshotError::Undecodable {
        column: name.into(),
        source,
    })
}

fn merge_resource(name: &str, copies: &[&[u8]]) -> Result<Vec<u8>, SnapshotError> {
    let rule = RESOURCE_RULES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, rule)| *rule)
        .ok_or_else(|| SnapshotError::PartsDisagree {
            column: name.into(),
            reason: "it has no rule for merging ranks' parts (checkpoint::split::RESOURCE_RULES)"
                .into(),
        })?;
    match rule {
        ResourceRule::Service => Ok(copies[0].to_vec()),
        ResourceRule::Replicated => {
            if let Some(rank) = copies.iter().position(|c| *c != copies[0]) {
                return Err(SnapshotError::PartsDisagree {
                    column: name.into(),
                    reason: format!("every rank holds it, and rank {rank}'s differs from rank 0's"),
                });
            }
            Ok(copies[0].to_vec())
        }
        ResourceRule::Transport => {
            let parts = copies
                .iter()
                .map(|c| decode::<StoredTransport>(name, c))
                .collect::<Result<Vec<_>, _>>()?;
            let merged = merge_transport_parts(parts).map_err(|e| SnapshotError::PartsUnfit {
                column: name.into(),
                source: Box::new(e),
            })?;
            Ok(postcard::to_stdvec(&merged).expect("stored values encode"))
        }
        ResourceRule::Envelopes(keep) => {
            let parts = copies
                .iter()
                .map(|c| decode::<Vec<StoredEnvelope>>(name, c))
                .collect::<Result<Vec<_>, _>>()?;
            let merged = merge_envelope_parts(parts, keep);
            Ok(postcard::to_stdvec(&merged).expect("stored values encode"))
        }
    }
}

/// The commit record of a split pod's checkpoint, in its directory.
pub const SPLIT_MANIFEST: &str = "ranks.ron";
const SPLIT_DIGEST_PREFIX: &str = "// ranks-sha256: ";

/// A checkpoint of a pod split over ranks: every rank's part, each an
/// ordinary verified checkpoint directory (`rank-0000`, …), and this
/// record, which rank 0 writes only after every part is durable (Orbax's
/// commit-marker pattern), then renames the whole directory into place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename = "SplitCheckpoint", deny_unknown_fields)]
pub struct SplitManifest {
    /// Snapshot format version.
    pub format_version: u32,
    /// The checkpoint's name (its directory name).
    pub name: String,
    /// Pod name.
    pub pod: String,
    /// Tick at capture.
    pub tick: u64,
    /// The parts, one per rank, in rank order.
    pub parts: Vec<SplitPart>,
}

/// One rank's part of a [`SplitManifest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitPart {
    /// The rank that wrote it.
    pub rank: u32,
    /// Its hosts, `first..=last`.
    pub hosts: String,
    /// Its directory, inside the checkpoint.
    pub dir: String,
    /// SHA-256 of the part's own manifest, binding the part to this commit.
    pub manifest_sha256: String,
}

/// The directory of rank `rank`'s part inside a split checkpoint.
pub fn part_dir(rank: u32) -> String {
    format!("rank-{rank:04}")
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn render_split(manifest: &SplitManifest) -> String {
    render_digested(manifest, SPLIT_DIGEST_PREFIX)
}

pub(super) fn parse_split(path: &Path, text: &[u8]) -> Result<SplitManifest, CheckpointError> {
    let bad = |reason: String| CheckpointError::Manifest {
        path: path.to_path_buf(),
        reason,
    };
    let manifest: SplitManifest =
        parse_digested(path, text, SPLIT_DIGEST_PREFIX, |m: &SplitManifest| {
            m.format_version
        })?;
    for (i, part) in manifest.parts.iter().enumerate() {
        if part.rank != i as u32 || part.dir != part_dir(part.rank) {
            return Err(bad(format!(
                "part {i} is `{}` of rank {}",
                part.dir, part.rank
            )));
        }
    }
    if manifest.parts.is_empty() {
        return Err(bad("it lists no parts".into()));
    }
    Ok(manifest)
}

/// Whether `dir` holds a split pod's checkpoint (not a one-process one).
pub fn is_split_checkpoint(dir: &Path) -> bool {
    dir.join(SPLIT_MANIFEST).is_file()
}

/// Verifies every byte of a split pod's checkpoint — the commit record,
/// then every part as a checkpoint of its own, each bound to the record by
/// its manifest's digest — and merges the parts into the world one process
/// holds ([`merge_parts`]). Restore it with any rank count, or into one
/// process with `Pod::from_snapshot`.
pub fn read_split_checkpoint(
    dir: &Path,
    registry: &SnapshotRegistry,
) -> Result<(SplitManifest, WorldSnapshot), CheckpointError> {
    let path = dir.join(SPLIT_MANIFEST);
    let text = read(&path)?;
    let manifest = parse_split(&path, &text)?;
    let mut entries: Vec<String> = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
        let entry = entry.map_err(io_error(dir))?;
        entries.push(entry.file_name().to_string_lossy().into_owned());
    }
    entries.sort();
    for name in entries {
        let listed = name == SPLIT_MANIFEST || manifest.parts.iter().any(|p| p.dir == name);
        if !listed {
            return Err(CheckpointError::Unlisted {
                path: dir.join(name),
            });
        }
    }
    let mut parts = Vec::with_capacity(manifest.parts.len());
    for part in &manifest.parts {
        let part_path = dir.join(&part.dir);
        let (part_manifest, snapshot) = verify_checkpoint(&part_path, registry)?;
        let own = part_path.join(MANIFEST);
        let own_digest = sha256_hex(&read(&own)?);
        if own_digest != part.manifest_sha256 || part_manifest.tick != manifest.tick {
            return Err(CheckpointError::Manifest {
                path: path.clone(),
                reason: format!(
                    "part `{}` is not the one this checkpoint committed (its manifest or tick \
                     differs)",
                    part.dir
                ),
            });
        }
        parts.push(snapshot);
    }
    let merged = merge_parts(registry, &parts).map_err(|error| CheckpointError::Snapshot {
        path: path.clone(),
        error,
    })?;
    Ok((manifest, merged))
}

/// Reads a checkpoint of either kind: a split pod's (merged) or one
/// process's.
pub fn read_any_checkpoint(
    dir: &Path,
    registry: &SnapshotRegistry,
) -> Result<WorldSnapshot, CheckpointError> {
    if is_split_checkpoint(dir) {
        Ok(read_split_checkpoint(dir, registry)?.1)
    } else {
        Ok(verify_checkpoint(dir, registry)?.1)
    }
}

/// Rank 0's start of a split save of `root/name`: a plain, new name, stale
/// temporaries from crashed saves removed, and an empty staging directory
/// (returned) that every rank writes its part into.
pub fn stage_split(root: &Path, name: &str) -> Result<PathBuf, CheckpointError> {
    super::store::prepare_write(root, name)?;
    let staging = staging_dir(root, name);
    fs::create_dir_all(&staging).map_err(io_error(&staging))?;
    Ok(staging)
}

/// Where the parts of `root/name` stage until the commit (a temporary that
/// a later save's cleanup removes if this one crashed).
pub fn staging_dir(root: &Path, name: &str) -> PathBuf {
    root.join(format!(".tmp-split-{name}"))
}

/// Writes rank `rank`'s part into `staging` as an ordinary atomic
/// checkpoint and returns the SHA-256 of its manifest, which the commit
/// record binds. Each rank writes under a root of its own, then moves its
/// part in: a save removes stale temporaries in its root, which must not
/// be another rank's write in progress.
pub fn write_split_part(
    staging: &Path,
    rank: u32,
    pod: &str,
    part: &WorldSnapshot,
) -> Result<String, CheckpointError> {
    let own_root = staging.join(format!(".{}", part_dir(rank)));
    let manifest = write_checkpoint(&own_root, &part_dir(rank), pod, part, &mut |_| Ok(()))?;
    let placed = staging.join(part_dir(rank));
    fs::rename(own_root.join(part_dir(rank)), &placed).map_err(io_error(&placed))?;
    fs::remove_dir(&own_root).map_err(io_error(&own_root))?;
    Ok(sha256_hex(render_manifest(&manifest).as_bytes()))
}

/// Commits a split save once every part is durable: writes and syncs the
/// record, syncs the staging directory, renames it to `root/name` and syncs
/// `root` (Orbax's commit-marker pattern). Before the rename nothing is
/// visible under the name.
pub fn commit_split(
    root: &Path,
    staging: &Path,
    manifest: &SplitManifest,
) -> Result<(), CheckpointError> {
    let target = root.join(&manifest.name);
    let write = || -> std::io::Result<()> {
        let mut file = fs::File::create(staging.join(SPLIT_MANIFEST))?;
        file.write_all(render_split(manifest).as_bytes())?;
        file.sync_all()?;
        sync_dir(staging)?;
        fs::rename(staging, &target)?;
        sync_dir(root)
    };
    write().map_err(io_error(&target))
}

/// Writes this rank's part of a pod split over ranks into the split
/// checkpoint `root/name`, together with every other rank (each calls it at
/// the same point): rank 0 stages the directory, every rank writes its
/// part as an ordinary atomic checkpoint, and rank 0 commits the record
/// once every part is durable (Orbax's commit-marker pattern). Until then
/// the parts sit in a temporary directory, so a save that fails anywhere
/// leaves the committed checkpoints as they were. Every rank returns the
/// same outcome (rank 0's verdict); rank 0 also gets the record.
pub fn save_split(
    world: &mut World,
    ctx: &RankContext,
    root: &Path,
    name: &str,
) -> Result<Option<SplitManifest>, ClusterError> {
    let tick = world.resource::<crate::clock::SimClock>().tick;
    save_split_labeled(world, ctx, root, name, tick)
}

/// [`save_split`] with the checkpoint labeled `label` instead of the
/// current tick (a sharded optimizer labels two writes in one tick apart,
/// as one process does).
pub fn save_split_labeled(
    world: &mut World,
    ctx: &RankContext,
    root: &Path,
    name: &str,
    label: u64,
) -> Result<Option<SplitManifest>, ClusterError> {
    let layout = &ctx.layout;
    let staged = if layout.runs_service() {
        stage_split(root, name)
            .map(|_| ())
            .map_err(|e| e.to_string())
    } else {
        Ok(())
    };
    cluster::finish(&ctx.mailbox, layout, staged, ctx.timeout)?;
    let staging = staging_dir(root, name);
    let rank = layout.rank();
    let pod = world.resource::<PodTopology>().0.name.clone();
    let tick = label;
    let written: Result<String, String> = world
        .resource_scope(|world, registry: Mut<SnapshotRegistry>| registry.capture(world, tick))
        .map_err(|e| e.to_string())
        .and_then(|part| write_split_part(&staging, rank, &pod, &part).map_err(|e| e.to_string()));
    let report = postcard::to_stdvec(&written).expect("a report encodes");
    let Some(reports) = cluster::gather_parts(&ctx.mailbox, layout, report, ctx.timeout)? else {
        cluster::finish(&ctx.mailbox, layout, Ok(()), ctx.timeout)?;
        return Ok(None);
    };
    let committed = manifest_of(layout, name, &pod, tick, &reports).and_then(|manifest| {
        commit_split(root, &staging, &manifest)?;
        Ok(manifest)
    });
    if committed.is_err() {
        let _ = fs::remove_dir_all(&staging);
    }
    // The other ranks get rank 0's verdict as its message.
    let verdict = committed.as_ref().map(|_| ()).map_err(|e| e.to_string());
    cluster::finish(&ctx.mailbox, layout, verdict, ctx.timeout)?;
    Ok(committed.ok())
}

/// Why rank 0 could not commit a split save.
#[derive(Debug, thiserror::Error)]
enum CommitFailure {
    /// A rank's report did not decode.
    #[error("rank {rank}'s report: {source}")]
    Report {
        /// The rank.
        rank: u32,
        /// The decoder's error.
        #[source]
        source: postcard::Error,
    },
    /// A rank could not write its part, and said why.
    #[error("rank {rank} could not write its part: {reason}")]
    Part {
        /// The rank.
        rank: u32,
        /// Its message.
        reason: String,
    },
    /// The commit record could not be written or renamed into place.
    #[error(transparent)]
    Commit(#[from] CheckpointError),
}

/// The commit record of the parts the ranks reported writing, or why one
/// could not be written.
fn manifest_of(
    layout: &RankLayout,
    name: &str,
    pod: &str,
    tick: u64,
    reports: &[Vec<u8>],
) -> Result<SplitManifest, CommitFailure> {
    let mut parts = Vec::with_capacity(reports.len());
    for (rank, report) in reports.iter().enumerate() {
        let rank = rank as u32;
        // A report is the rank's digest, or its message (on the wire).
        let written: Result<String, String> = postcard::from_bytes(report)
            .map_err(|source| CommitFailure::Report { rank, source })?;
        let digest = written.map_err(|reason| CommitFailure::Part { rank, reason })?;
        parts.push(SplitPart {
            rank,
            hosts: layout.describe_hosts(rank),
            dir: part_dir(rank),
            manifest_sha256: digest,
        });
    }
    Ok(SplitManifest {
        format_version: crate::persist::FORMAT_VERSION,
        name: name.to_string(),
        pod: pod.to_string(),
        tick,
        parts,
    })
}
