//! A pod split over ranks: each rank's part of the world, and the
//! canonical merge of the parts into the world one process would hold.
//!
//! Every rank spawns the pod's whole topology (devices, hosts, links: the
//! skeleton routing and entity ids need, as every JAX process knows the
//! global device list), then keeps the state of what it runs:
//!
//! | state | held by |
//! |---|---|
//! | a device's heartbeat schedule and clock (`Heartbeat`, `DeviceClock`, `ClockSync`) | the rank of the device's host |
//! | the coordination service's view (`Health`, `LastHeard`, `KnownFailures`, the monitor's tallies, metrics, checks and history, failure log, barriers) | rank 0 |
//! | the scenario every rank is given (topology, seed, clock, fault plan, device liveness and jitter, link state) | every rank, identical |
//! | messages in flight | the sender's rank |
//!
//! [`merge_parts`] is the canonical merge: a component column is the union
//! of the parts' rows by entity, and a row several parts hold must be the
//! same bytes in all of them (or the merge fails naming the column and the
//! parts); each resource follows its rule in [`RESOURCE_RULES`]; the
//! transport's in-flight messages and counts are combined. The digest of
//! the merged world is the single-process `world_sha256`, for any rank
//! count (`tests/ranks.rs` checks it on every preset the host counts
//! allow).

use super::Pod;
use crate::checkpoint::{CheckpointError, verify_checkpoint};
use crate::clock_sync::{ClockSync, DeviceClock};
use crate::error::{OptimError, Result};
use crate::health::{Health, Heartbeat, KnownFailures, LastHeard};
use crate::monitor::{DeviceHistory, DeviceMetrics, HealthChecks, HeartbeatTally, LinkMetrics};
use crate::persist::{Column, SnapshotError, SnapshotRegistry, WorldSnapshot};
use crate::topology::{Device, Link, Topology};
use crate::transport::cluster::{
    self, ClusterBackend, DEFAULT_RANK_TIMEOUT, Mailbox, RankLayout, SharedMailbox,
};
use crate::transport::{
    ClusterError, DELIVERY_LOG_CAPACITY, StoredEnvelope, StoredTransport, merge_envelope_parts,
    merge_transport_parts,
};
use bevy_ecs::prelude::*;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

/// Takes from this rank's world the state other ranks hold (see the
/// module table): other ranks' devices' schedules and clocks, messages
/// other ranks sent or receive, and, off rank 0, the service's view. Run
/// on a fresh world and on a restored whole one alike.
fn localize(world: &mut World, layout: &RankLayout) {
    let devices: Vec<(Entity, crate::topology::DeviceId)> = world
        .query::<(Entity, &Device)>()
        .iter(world)
        .map(|(e, d)| (e, d.id))
        .collect();
    for (entity, id) in devices {
        let mut entity = world.entity_mut(entity);
        if !layout.is_local(id) {
            entity.remove::<(Heartbeat, DeviceClock, ClockSync)>();
        }
        if !layout.runs_service() {
            entity.remove::<(
                Health,
                LastHeard,
                KnownFailures,
                HeartbeatTally,
                HealthChecks,
                DeviceMetrics,
            )>();
        }
    }
    world
        .resource_mut::<crate::transport::Transport>()
        .retain_senders(|from| layout.is_local(from));
    let ours = |e: &crate::transport::Envelope| layout.owner(e.to) == layout.rank();
    world
        .resource_mut::<crate::transport::Inbox>()
        .messages
        .retain(ours);
    world
        .resource_mut::<crate::transport::DeliveryLog>()
        .recent
        .retain(ours);
    if !layout.runs_service() {
        world
            .resource_mut::<crate::transport::Transport>()
            .clear_counts();
        world.insert_resource(crate::health::FailureLog::default());
        world.insert_resource(crate::health::FailureEpoch::default());
        let links: Vec<Entity> = world
            .query_filtered::<Entity, With<Link>>()
            .iter(world)
            .collect();
        for link in links {
            world.entity_mut(link).remove::<LinkMetrics>();
        }
        let capacity = world
            .resource::<crate::monitor::MonitorConfig>()
            .history_len;
        world.insert_resource(DeviceHistory::new(0, capacity));
    }
}

/// One rank's part of a pod split over ranks, stepped in lockstep with the
/// others through a [`Mailbox`].
///
/// ```
/// use optirs_tpu::pod::ranks::RankedPod;
/// use optirs_tpu::topology::load_preset;
/// use optirs_tpu::transport::cluster::thread_mailboxes;
///
/// // Two ranks as two threads of this process; each owns one host of v4-8.
/// let topology = load_preset("v4-8")?;
/// let digests: Vec<Option<String>> = std::thread::scope(|s| {
///     let ranks: Vec<_> = thread_mailboxes(2)
///         .into_iter()
///         .map(|mailbox| {
///             let topology = topology.clone();
///             s.spawn(move || -> optirs_tpu::Result<Option<String>> {
///                 let mut pod = RankedPod::new(topology, Box::new(mailbox))?;
///                 pod.handshake("100 ticks")?;
///                 pod.run(100)?;
///                 Ok(pod.gather()?.map(|world| world.sha256_hex()))
///             })
///         })
///         .collect();
///     ranks.into_iter().map(|r| r.join().unwrap().unwrap()).collect()
/// });
/// let mut one = optirs_tpu::Pod::from_topology(topology)?;
/// one.run(100);
/// assert_eq!(digests[0].as_deref(), Some(one.world_sha256()?.as_str()));
/// assert_eq!(digests[1], None); // only rank 0 holds the merged world
/// # Ok::<(), optirs_tpu::OptimError>(())
/// ```
pub struct RankedPod {
    pod: Pod,
    layout: RankLayout,
    mailbox: SharedMailbox,
    timeout: Duration,
    /// Digest of the whole world before it was split (the same on every
    /// rank started with the same pod and binary).
    start_digest: String,
}

impl std::fmt::Debug for RankedPod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankedPod")
            .field("rank", &self.layout.rank())
            .field("ranks", &self.layout.ranks())
            .field("pod", &self.pod)
            .finish()
    }
}

impl RankedPod {
    /// This rank's part of `topology`, with [`DEFAULT_RANK_TIMEOUT`].
    pub fn new(topology: Topology, mailbox: Box<dyn Mailbox>) -> Result<RankedPod> {
        RankedPod::with_timeout(topology, mailbox, DEFAULT_RANK_TIMEOUT)
    }

    /// This rank's part of `topology`; every wait for another rank gives up
    /// after `timeout` (twice that for rank 0, which itself waits for the
    /// others), naming the rank.
    pub fn with_timeout(
        topology: Topology,
        mailbox: Box<dyn Mailbox>,
        timeout: Duration,
    ) -> Result<RankedPod> {
        let layout = RankLayout::new(&topology, mailbox.ranks(), mailbox.rank())
            .map_err(crate::transport::TransportError::from)?;
        let mut pod = Pod::from_topology(topology)?;
        let start_digest = pod.world_sha256()?;
        localize(&mut pod.world, &layout);
        let links: Vec<Entity> = pod
            .world
            .query_filtered::<Entity, With<Link>>()
            .iter(&pod.world)
            .collect();
        let mailbox: SharedMailbox = Arc::new(Mutex::new(mailbox));
        pod.set_transport_backend(Box::new(ClusterBackend::new(
            layout.clone(),
            Arc::clone(&mailbox),
            links,
            timeout,
        )));
        Ok(RankedPod {
            pod,
            layout,
            mailbox,
            timeout,
            start_digest,
        })
    }

    /// Which rank owns which hosts.
    pub fn layout(&self) -> &RankLayout {
        &self.layout
    }

    /// This rank's part of the world (read it; step through [`RankedPod::step`]).
    pub fn pod(&self) -> &Pod {
        &self.pod
    }

    /// Checks that every rank was started with the same pod, the same
    /// binary version and the same `run` (a description of everything else
    /// that must agree: ticks, faults, seed). Call it on every rank before
    /// the first step; a difference is an error on every rank naming the
    /// ranks and what each has.
    pub fn handshake(&mut self, run: &str) -> Result<()> {
        use sha2::{Digest, Sha256};
        let topology = self.pod.topology();
        let description = format!(
            "optirs-tpu {} with pod `{}` (world {}) and {run}",
            env!("CARGO_PKG_VERSION"),
            topology.name,
            &self.start_digest[..12]
        );
        let mut hasher = Sha256::new();
        hasher.update(env!("CARGO_PKG_VERSION").as_bytes());
        hasher.update([0]);
        hasher.update(self.start_digest.as_bytes());
        hasher.update([0]);
        hasher.update(run.as_bytes());
        let digest = crate::persist::hex(&hasher.finalize());
        cluster::handshake(
            &self.mailbox,
            &self.layout,
            &digest,
            &description,
            self.timeout,
        )
        .map_err(cluster_error)
    }

    /// Schedules a fault at a simulated time. Every rank must schedule the
    /// same faults (the handshake's `run` should name them): the fault plan
    /// is the scenario, and each rank applies it to what it holds.
    pub fn schedule_fault(&mut self, at_ns: u64, fault: crate::health::Fault) {
        self.pod.schedule_fault(at_ns, fault);
    }

    /// The scheduled faults that can never apply in a run of `ticks` ticks
    /// (the same on every rank: the plan and device liveness are the
    /// scenario every rank holds).
    pub fn faults_that_cannot_apply(&mut self, ticks: u64) -> Vec<crate::health::UnappliableFault> {
        self.pod.faults_that_cannot_apply(ticks)
    }

    /// Runs one tick on this rank, in lockstep with the others. A lost or
    /// out-of-step rank is an error (the same on every rank still there).
    pub fn step(&mut self) -> Result<()> {
        self.pod.step();
        match self
            .pod
            .world
            .resource::<crate::transport::Network>()
            .failure()
        {
            None => Ok(()),
            Some(error) => Err(error.clone().into()),
        }
    }

    /// Runs `ticks` ticks.
    pub fn run(&mut self, ticks: u64) -> Result<()> {
        (0..ticks).try_for_each(|_| self.step())
    }

    /// Gathers every rank's part on rank 0 and merges them ([`merge_parts`]):
    /// rank 0 gets the whole world, the others `None`. Every rank waits for
    /// rank 0's verdict, so all fail alike if the parts do not merge.
    pub fn gather(&mut self) -> Result<Option<WorldSnapshot>> {
        let part = self.pod.snapshot()?;
        if !part.tensors.is_empty() {
            return Err(OptimError::Unsupported {
                operation: "gathering a pod split over ranks that holds tensors".into(),
                reason: format!(
                    "rank {}'s part holds {} tensors (a model or optimizer state); a split \
                     pod runs the pod's control plane, not models yet",
                    self.layout.rank(),
                    part.tensors.len()
                ),
            });
        }
        let parts =
            cluster::gather_parts(&self.mailbox, &self.layout, part.to_bytes(), self.timeout)
                .map_err(cluster_error)?;
        let Some(parts) = parts else {
            cluster::finish(&self.mailbox, &self.layout, Ok(()), self.timeout)
                .map_err(cluster_error)?;
            return Ok(None);
        };
        let merged = parts
            .iter()
            .map(|bytes| WorldSnapshot::from_bytes(bytes))
            .collect::<Result<Vec<_>, _>>()
            .and_then(|parts| {
                let registry = self.pod.world.resource::<SnapshotRegistry>();
                merge_parts(registry, &parts)
            });
        let verdict = merged.as_ref().map(|_| ()).map_err(|e| e.to_string());
        cluster::finish(&self.mailbox, &self.layout, verdict, self.timeout)
            .map_err(cluster_error)?;
        Ok(Some(merged?))
    }
}

fn cluster_error(error: ClusterError) -> OptimError {
    crate::transport::TransportError::from(error).into()
}

/// The canonical merge of the parts of one world, part `r` from rank `r`
/// (see the module docs). The parts must be of the same tick, entity count
/// and columns.
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
        if !part.tensors.is_empty() {
            return Err(SnapshotError::PartsDisagree {
                column: "<tensors>".into(),
                reason: format!("part {rank} holds tensors, which parts do not merge yet"),
            });
        }
    }
    let components = first
        .components
        .iter()
        .enumerate()
        .map(|(i, column)| {
            let bytes: Vec<&[u8]> = parts.iter().map(|p| &p.components[i].bytes[..]).collect();
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
        tensors: Vec::new(),
    })
}

fn names(columns: &[Column]) -> Vec<&str> {
    columns.iter().map(|c| c.name.as_str()).collect()
}

fn decode<S: serde::de::DeserializeOwned>(name: &str, bytes: &[u8]) -> Result<S, SnapshotError> {
    postcard::from_bytes(bytes).map_err(|e| SnapshotError::Corrupt {
        column: name.into(),
        reason: e.to_string(),
    })
}

fn merge_resource(name: &str, copies: &[&[u8]]) -> Result<Vec<u8>, SnapshotError> {
    let rule = RESOURCE_RULES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, rule)| *rule)
        .ok_or_else(|| SnapshotError::PartsDisagree {
            column: name.into(),
            reason: "it has no rule for merging ranks' parts (pod::ranks::RESOURCE_RULES)".into(),
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
            let merged =
                merge_transport_parts(parts).map_err(|reason| SnapshotError::PartsDisagree {
                    column: name.into(),
                    reason,
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
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

fn part_dir(rank: u32) -> String {
    format!("rank-{rank:04}")
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    crate::persist::hex(&Sha256::digest(bytes))
}

fn render_split(manifest: &SplitManifest) -> String {
    let body = ron::ser::to_string_pretty(manifest, ron::ser::PrettyConfig::default())
        .expect("a manifest always serializes");
    let body = format!("{body}\n");
    format!(
        "{body}{SPLIT_DIGEST_PREFIX}{}\n",
        sha256_hex(body.as_bytes())
    )
}

fn parse_split(path: &Path, text: &[u8]) -> std::result::Result<SplitManifest, CheckpointError> {
    let bad = |reason: String| CheckpointError::Manifest {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::str::from_utf8(text).map_err(|_| bad("it is not UTF-8".into()))?;
    let cut = text
        .trim_end_matches('\n')
        .rfind('\n')
        .ok_or_else(|| bad("it has no digest line".into()))?;
    let (body, last) = text.split_at(cut + 1);
    let digest = last
        .trim_end()
        .strip_prefix(SPLIT_DIGEST_PREFIX)
        .ok_or_else(|| bad(format!("the last line is not `{SPLIT_DIGEST_PREFIX}<hex>`")))?;
    if digest != sha256_hex(body.as_bytes()) {
        return Err(bad(
            "its digest does not match its text (edited or torn)".into()
        ));
    }
    let manifest: SplitManifest = ron::from_str(body).map_err(|e| bad(e.to_string()))?;
    if manifest.format_version != crate::persist::FORMAT_VERSION {
        return Err(bad(format!(
            "format version {} (this build reads {})",
            manifest.format_version,
            crate::persist::FORMAT_VERSION
        )));
    }
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

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |error| CheckpointError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// Whether `dir` holds a split pod's checkpoint (not a one-process one).
pub fn is_split_checkpoint(dir: &Path) -> bool {
    dir.join(SPLIT_MANIFEST).is_file()
}

/// Verifies every byte of a split pod's checkpoint — the commit record,
/// then every part as a checkpoint of its own, each bound to the record by
/// its manifest's digest — and merges the parts into the world one process
/// holds ([`merge_parts`]). Restore it with any rank count, or into one
/// process with [`Pod::from_snapshot`].
pub fn read_split_checkpoint(
    dir: &Path,
    registry: &SnapshotRegistry,
) -> std::result::Result<(SplitManifest, WorldSnapshot), CheckpointError> {
    let path = dir.join(SPLIT_MANIFEST);
    let text = std::fs::read(&path).map_err(io(&path))?;
    let manifest = parse_split(&path, &text)?;
    let mut entries: Vec<String> = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
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
        let own = part_path.join(crate::checkpoint::MANIFEST);
        let own_digest = sha256_hex(&std::fs::read(&own).map_err(io(&own))?);
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
) -> std::result::Result<WorldSnapshot, CheckpointError> {
    if is_split_checkpoint(dir) {
        Ok(read_split_checkpoint(dir, registry)?.1)
    } else {
        Ok(verify_checkpoint(dir, registry)?.1)
    }
}

impl RankedPod {
    /// Writes a checkpoint of the split pod as `root/name`: every rank
    /// writes its part, and rank 0 commits them once all are durable.
    /// Until the commit the parts sit in a temporary directory, so a save
    /// that fails anywhere (a full disk, a lost rank) leaves the committed
    /// checkpoints as they were. Every rank returns the same outcome; rank 0
    /// also gets the manifest.
    pub fn save_checkpoint(&mut self, root: &Path, name: &str) -> Result<Option<SplitManifest>> {
        let staging = root.join(format!(".tmp-split-{name}"));
        let prepared = if self.layout.runs_service() {
            prepare_split(root, name, &staging).map_err(|e| e.to_string())
        } else {
            Ok(())
        };
        cluster::finish(&self.mailbox, &self.layout, prepared, self.timeout)
            .map_err(cluster_error)?;
        let rank = self.layout.rank();
        let pod_name = self.pod.topology().name.clone();
        let written = self
            .pod
            .snapshot()
            .map_err(|e| e.to_string())
            .and_then(|part| {
                // Each rank writes under a root of its own (a save removes
                // stale temporaries in its root, which must not be another
                // rank's write in progress), then moves its part in.
                let own_root = staging.join(format!(".{}", part_dir(rank)));
                crate::checkpoint::write_checkpoint(
                    &own_root,
                    &part_dir(rank),
                    &pod_name,
                    &part,
                    &mut |_| Ok(()),
                )
                .map_err(|e| e.to_string())?;
                let place = || -> std::io::Result<()> {
                    std::fs::rename(own_root.join(part_dir(rank)), staging.join(part_dir(rank)))?;
                    std::fs::remove_dir(&own_root)
                };
                place().map_err(|e| format!("{}: {e}", staging.display()))
            })
            .and_then(|_| {
                let own = staging
                    .join(part_dir(rank))
                    .join(crate::checkpoint::MANIFEST);
                std::fs::read(&own)
                    .map(|bytes| sha256_hex(&bytes))
                    .map_err(|e| format!("{}: {e}", own.display()))
            });
        let report = postcard::to_stdvec(&written).expect("a report encodes");
        let gathered = cluster::gather_parts(&self.mailbox, &self.layout, report, self.timeout)
            .map_err(cluster_error)?;
        let Some(reports) = gathered else {
            cluster::finish(&self.mailbox, &self.layout, Ok(()), self.timeout)
                .map_err(cluster_error)?;
            return Ok(None);
        };
        let committed = self.commit_split(root, name, &staging, &reports);
        if committed.is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
        let verdict = committed.as_ref().map(|_| ()).map_err(|e| e.to_string());
        cluster::finish(&self.mailbox, &self.layout, verdict, self.timeout)
            .map_err(cluster_error)?;
        Ok(Some(committed?))
    }

    fn commit_split(
        &self,
        root: &Path,
        name: &str,
        staging: &Path,
        reports: &[Vec<u8>],
    ) -> Result<SplitManifest> {
        let mut parts = Vec::with_capacity(reports.len());
        for (rank, report) in reports.iter().enumerate() {
            let rank = rank as u32;
            let written: std::result::Result<String, String> = postcard::from_bytes(report)
                .map_err(|e| OptimError::InvalidConfig(format!("rank {rank}'s report: {e}")))?;
            let digest = written.map_err(|reason| {
                OptimError::InvalidConfig(format!("rank {rank} could not write its part: {reason}"))
            })?;
            parts.push(SplitPart {
                rank,
                hosts: self.layout.describe_hosts(rank),
                dir: part_dir(rank),
                manifest_sha256: digest,
            });
        }
        let manifest = SplitManifest {
            format_version: crate::persist::FORMAT_VERSION,
            name: name.to_string(),
            pod: self.pod.topology().name.clone(),
            tick: self.pod.clock().tick,
            parts,
        };
        let path = staging.join(SPLIT_MANIFEST);
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut file = std::fs::File::create(&path)?;
            file.write_all(render_split(&manifest).as_bytes())?;
            file.sync_all()?;
            std::fs::File::open(staging)?.sync_all()?;
            std::fs::rename(staging, root.join(name))?;
            std::fs::File::open(root)?.sync_all()
        };
        write().map_err(|error| CheckpointError::Io {
            path: root.join(name),
            error,
        })?;
        Ok(manifest)
    }

    /// Replaces the split pod's world with a checkpoint's (a split one,
    /// written with any rank count, or one process's): rank 0 verifies
    /// every byte and merges the parts, then every rank takes the same
    /// world and keeps its own part. Nothing changes on any rank unless the
    /// whole checkpoint verified.
    pub fn restore_checkpoint(&mut self, dir: &Path) -> Result<()> {
        let bytes = if self.layout.runs_service() {
            let registry = self.pod.world.resource::<SnapshotRegistry>();
            read_any_checkpoint(dir, registry)
                .map_err(|e| e.to_string())
                .and_then(|snapshot| {
                    if snapshot.tensors.is_empty() {
                        Ok(snapshot.to_bytes())
                    } else {
                        Err(format!(
                            "{} holds tensors (a model or optimizer state), which a split \
                             pod does not run yet",
                            dir.display()
                        ))
                    }
                })
        } else {
            Ok(Vec::new())
        };
        let bytes = cluster::broadcast(&self.mailbox, &self.layout, bytes, self.timeout)
            .map_err(cluster_error)?;
        let snapshot = WorldSnapshot::from_bytes(&bytes)?;
        self.pod.restore_snapshot(&snapshot)?;
        localize(&mut self.pod.world, &self.layout);
        let links: Vec<Entity> = self
            .pod
            .world
            .query_filtered::<Entity, With<Link>>()
            .iter(&self.pod.world)
            .collect();
        self.pod.set_transport_backend(Box::new(ClusterBackend::new(
            self.layout.clone(),
            Arc::clone(&self.mailbox),
            links,
            self.timeout,
        )));
        self.start_digest = snapshot.sha256_hex();
        Ok(())
    }
}

/// Rank 0's preparation of a split save: a plain, new name, stale
/// temporaries from crashed saves removed, an empty staging directory.
fn prepare_split(root: &Path, name: &str, staging: &Path) -> Result<()> {
    crate::checkpoint::check_name(name)?;
    std::fs::create_dir_all(root).map_err(io(root))?;
    let target = root.join(name);
    if std::fs::symlink_metadata(&target).is_ok() {
        return Err(CheckpointError::Exists { path: target }.into());
    }
    crate::checkpoint::remove_stale_temporaries(root);
    std::fs::create_dir_all(staging).map_err(io(staging))?;
    Ok(())
}

/// Keeps the newest `keep` split checkpoints under `root` written by
/// periodic saves (named `tick-N` for their tick), counting `current` (just
/// committed, never removed), and removes the older ones. Anything else
/// under `root` is left alone.
pub fn enforce_split_retention(root: &Path, keep: usize, current: &str) -> Result<()> {
    let mut managed: Vec<(u64, String)> = Vec::new();
    for entry in std::fs::read_dir(root).map_err(io(root))?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == current || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let record = entry.path().join(SPLIT_MANIFEST);
        let Ok(text) = std::fs::read(&record) else {
            continue;
        };
        if let Ok(manifest) = parse_split(&record, &text)
            && manifest.name == name
            && crate::checkpoint::checkpoint_name(manifest.tick) == name
        {
            managed.push((manifest.tick, name));
        }
    }
    managed.sort();
    let excess = managed.len().saturating_sub(keep.saturating_sub(1));
    for (_, name) in &managed[..excess] {
        let path = root.join(name);
        std::fs::remove_dir_all(&path).map_err(io(&path))?;
    }
    Ok(())
}
