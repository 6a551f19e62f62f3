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
//! [`merge_parts`](split::merge_parts) is the canonical merge: a component column is the union
//! of the parts' rows by entity, and a row several parts hold must be the
//! same bytes in all of them (or the merge fails naming the column and the
//! parts); each resource follows its rule in [`RESOURCE_RULES`](split::RESOURCE_RULES); the
//! transport's in-flight messages and counts are combined. The digest of
//! the merged world is the single-process `world_sha256`, for any rank
//! count (`tests/ranks.rs` checks it on every preset the host counts
//! allow).

use super::Pod;
use crate::checkpoint::split::{self, SplitManifest};
use crate::clock_sync::{ClockSync, DeviceClock};
use crate::error::{OptimError, Result};
use crate::health::{Health, Heartbeat, KnownFailures, LastHeard};
use crate::monitor::{DeviceHistory, DeviceMetrics, HealthChecks, HeartbeatTally, LinkMetrics};
use crate::persist::{SnapshotRegistry, WorldSnapshot};
use crate::topology::{Device, Link, Topology};
use crate::transport::ClusterError;
use crate::transport::cluster::{
    self, ClusterBackend, DEFAULT_RANK_TIMEOUT, Mailbox, RankContext, RankLayout, SharedMailbox,
};
use bevy_ecs::prelude::*;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    // A sharded model's state shards stay with their device's rank; the
    // others keep the entity (ids, heaps and bookkeeping alike on every
    // rank) with no values.
    crate::sharding::ranked::hold_own_shards(world, layout);
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
/// // Two ranks as two threads of this process; each owns one host of v4-16.
/// let topology = load_preset("v4-16")?;
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
        if topology.cubes.is_some() && layout.ranks() > 1 {
            // A cube's failure mark follows the coordination service's
            // health view, which only rank 0 holds.
            return Err(OptimError::from(crate::error::Unsupported {
                operation: format!(
                    "splitting the cube-built pod `{}` over ranks",
                    topology.name
                ),
                reason: "cube-built pods (`cubes`) run in one process for now: a cube's \
                         failure follows the coordination service's view, which only rank 0 \
                         holds"
                    .into(),
            }));
        }
        let mut pod = Pod::from_topology(topology)?;
        let start_digest = pod.world_sha256()?;
        localize(&mut pod.world, &layout);
        let mailbox: SharedMailbox = Arc::new(Mutex::new(mailbox));
        install_backend(&mut pod, &layout, &mailbox, timeout);
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
    /// `at` is since the pod started (a bare `u64` is nanoseconds).
    pub fn schedule_fault(
        &mut self,
        at: impl Into<crate::clock::SimDuration>,
        fault: crate::health::Fault,
    ) {
        self.pod.schedule_fault(at, fault);
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

    /// Runs until the clock has crossed `ticks` more tick boundaries, as
    /// [`Pod::run`] does (every rank stops at the same exact stops: they
    /// come from the world every rank holds alike).
    pub fn run(&mut self, ticks: u64) -> Result<()> {
        let target = self.pod.clock().tick.saturating_add(ticks);
        while self.pod.clock().tick < target {
            self.step()?;
        }
        Ok(())
    }

    /// Gathers every rank's part on rank 0 and merges them ([`merge_parts`](split::merge_parts)):
    /// rank 0 gets the whole world, the others `None`. Every rank waits for
    /// rank 0's verdict, so all fail alike if the parts do not merge.
    pub fn gather(&mut self) -> Result<Option<WorldSnapshot>> {
        let part = self.pod.snapshot()?;
        let parts =
            cluster::gather_parts(&self.mailbox, &self.layout, part.to_wire(), self.timeout)
                .map_err(cluster_error)?;
        let Some(parts) = parts else {
            cluster::finish(&self.mailbox, &self.layout, Ok(()), self.timeout)
                .map_err(cluster_error)?;
            return Ok(None);
        };
        let merged = parts
            .iter()
            .map(|bytes| WorldSnapshot::from_wire(bytes))
            .collect::<Result<Vec<_>, _>>()
            .and_then(|parts| {
                let registry = self.pod.world.resource::<SnapshotRegistry>();
                split::merge_parts(registry, &parts)
            });
        let verdict = merged.as_ref().map(|_| ()).map_err(|e| e.to_string());
        cluster::finish(&self.mailbox, &self.layout, verdict, self.timeout)
            .map_err(cluster_error)?;
        Ok(Some(merged?))
    }
}

impl RankedPod {
    /// All-reduce over every device of the pod's torus, its devices' buffers
    /// spread over the ranks: `local[d]` is device `d`'s buffer on the rank
    /// that runs it, `None` elsewhere. The data moves now, along the torus
    /// all-reduce's own schedule ([`crate::collectives::ranked`]: hops
    /// inside a rank in memory, across ranks by MPI point to point); the
    /// links are charged and the collective completes in simulated time
    /// exactly as [`Pod::all_reduce`] does in one process, so the buffers'
    /// bits, the report and the merged world are the one-process ones.
    /// Every rank calls it with the same length and `op`.
    pub fn all_reduce<T: crate::collectives::Element>(
        &mut self,
        local: &mut [Option<Vec<T>>],
        op: crate::collectives::ReduceOp,
    ) -> Result<crate::collectives::pod::CollectiveReport> {
        use crate::collectives::{ReduceGrid, torus_all_reduce_traffic};
        let shape = self.single_slice_torus("all-reduce")?;
        let checked = self.check_local(local)?;
        let traffic = torus_all_reduce_traffic(&shape, checked.len, T::BYTES);
        let grid = ReduceGrid::torus(shape.dims());
        let members: Vec<usize> = (0..local.len()).collect();
        self.ranked_collective(
            crate::collectives::pod::CollectiveKind::AllReduce,
            local,
            checked,
            &traffic,
            &grid,
            &members,
            |ranked, ctx| {
                ranked.reduce_scatter(ctx, op)?;
                ranked.all_gather(ctx)
            },
        )
    }

    /// [`Pod::reduce_scatter`] with the devices' buffers spread over the
    /// ranks (`local[d]` on device `d`'s rank, `None` elsewhere): along the
    /// snake ring, position `i` (device `ring[i]`) ends with the reduction
    /// of chunk `i`; its other elements keep their input values. The same
    /// bits, report and merged world as in one process.
    pub fn reduce_scatter<T: crate::collectives::Element>(
        &mut self,
        local: &mut [Option<Vec<T>>],
        op: crate::collectives::ReduceOp,
    ) -> Result<(crate::collectives::pod::CollectiveReport, Vec<usize>)> {
        use crate::collectives::{ReduceGrid, chunk_range, ring_reduce_scatter_traffic};
        let shape = self.single_slice_torus("reduce-scatter")?;
        let checked = self.check_local(local)?;
        let len = checked.len;
        let ring = shape.snake_ring();
        let traffic = ring_reduce_scatter_traffic(&ring, len, T::BYTES).routed_on(&shape);
        let grid = ReduceGrid::ring(&ring);
        let inputs: Vec<Option<Vec<T>>> = local.to_vec();
        let report = self.ranked_collective(
            crate::collectives::pod::CollectiveKind::ReduceScatter,
            local,
            checked,
            &traffic,
            &grid,
            &ring,
            |ranked, ctx| ranked.reduce_scatter(ctx, op).map(|_| ()),
        )?;
        // The ring leaves partial sums outside each owner's chunk; the
        // collective leaves the inputs there.
        let n = ring.len();
        for (pos, &device) in ring.iter().enumerate() {
            if let (Some(buffer), Some(input)) = (&mut local[device], &inputs[device]) {
                let own = chunk_range(len, n, pos);
                buffer[..own.start].copy_from_slice(&input[..own.start]);
                buffer[own.end..].copy_from_slice(&input[own.end..]);
            }
        }
        Ok((report, ring))
    }

    /// [`Pod::all_gather`] with the devices' buffers spread over the ranks:
    /// along the snake ring, position `i` (device `ring[i]`) contributes
    /// chunk `i` of its buffer and every device ends with every chunk.
    pub fn all_gather<T: crate::collectives::Element>(
        &mut self,
        local: &mut [Option<Vec<T>>],
    ) -> Result<(crate::collectives::pod::CollectiveReport, Vec<usize>)> {
        use crate::collectives::{ReduceGrid, ring_all_gather_traffic};
        let shape = self.single_slice_torus("all-gather")?;
        let checked = self.check_local(local)?;
        let len = checked.len;
        let ring = shape.snake_ring();
        let traffic = ring_all_gather_traffic(&ring, len, T::BYTES).routed_on(&shape);
        let grid = ReduceGrid::ring(&ring);
        let report = self.ranked_collective(
            crate::collectives::pod::CollectiveKind::AllGather,
            local,
            checked,
            &traffic,
            &grid,
            &ring,
            |ranked, ctx| ranked.all_gather(ctx),
        )?;
        Ok((report, ring))
    }

    /// The pod's torus, refusing a multislice pod (whose hierarchical
    /// collectives run in one process).
    fn single_slice_torus(&self, what: &str) -> Result<crate::collectives::TorusShape> {
        let topology = self.pod.topology();
        if topology.slices > 1 {
            return Err(OptimError::from(crate::error::Unsupported {
                operation: format!("a hierarchical {what} over a multislice pod split over ranks"),
                reason: "split pods run the single-slice collectives; run a multislice \
                         pod's collectives in one process (a split multislice model trains: \
                         `ShardedOptimizer::new_ranked`)"
                    .into(),
            }));
        }
        Ok(crate::collectives::pod::torus_of(topology)?)
    }

    /// Checks that this rank was given exactly its devices' buffers, all
    /// of one length.
    fn check_local<T>(&mut self, local: &[Option<Vec<T>>]) -> Result<CheckedBuffers> {
        use crate::collectives::CollectiveError;
        let participants =
            crate::collectives::pod::check_participants(&mut self.pod.world, local.len())?;
        let mut len = None;
        for (d, buffer) in local.iter().enumerate() {
            let device = crate::topology::DeviceId(d as u32);
            if buffer.is_some() != self.layout.is_local(device) {
                return Err(OptimError::invalid_config(format!(
                    "a collective on rank {}: {device} runs on rank {}, but this rank was {} \
                     buffer for it (give exactly this rank's devices' buffers)",
                    self.layout.rank(),
                    self.layout.rank_of_device(device),
                    if buffer.is_some() {
                        "given a"
                    } else {
                        "given no"
                    }
                )));
            }
            if let Some(b) = buffer {
                if len.is_some_and(|l| l != b.len()) {
                    return Err(CollectiveError::LengthMismatch {
                        rank: d,
                        len: b.len(),
                        first_rank: 0,
                        expected: len.unwrap_or(0),
                    }
                    .into());
                }
                len = Some(b.len());
            }
        }
        Ok(CheckedBuffers {
            participants,
            len: len.unwrap_or(0),
        })
    }

    /// Launches a collective of `traffic` (links charged, completion in
    /// simulated time), moves the data with `run` over `grid` (whose
    /// position `p` is device `members[p]`), and steps until it completes.
    #[allow(clippy::too_many_arguments)]
    fn ranked_collective<T: crate::collectives::Element>(
        &mut self,
        kind: crate::collectives::pod::CollectiveKind,
        local: &mut [Option<Vec<T>>],
        checked: CheckedBuffers,
        traffic: &crate::collectives::Traffic,
        grid: &crate::collectives::ReduceGrid,
        members: &[usize],
        run: impl FnOnce(
            &mut crate::collectives::ranked::RankedGrid<'_, '_, T>,
            &RankContext,
        ) -> std::result::Result<(), ClusterError>,
    ) -> Result<crate::collectives::pod::CollectiveReport> {
        let report = crate::collectives::pod::launch(
            &mut self.pod.world,
            kind,
            (checked.len * T::BYTES) as u64,
            checked.participants,
            traffic,
        )?;
        let ctx = self.pod.world.resource::<RankContext>().clone();
        let rank_of: Vec<u32> = members
            .iter()
            .map(|&d| {
                self.layout
                    .rank_of_device(crate::topology::DeviceId(d as u32))
            })
            .collect();
        let mut by_device: Vec<Option<&mut [T]>> = local
            .iter_mut()
            .map(|b| b.as_mut().map(|v| v.as_mut_slice()))
            .collect();
        let mut slots: Vec<Option<&mut [T]>> =
            members.iter().map(|&d| by_device[d].take()).collect();
        let mut ranked = crate::collectives::ranked::RankedGrid {
            grid,
            rank_of: &rank_of,
            local: &mut slots,
            tag: report.launched_at_ns ^ 0x5a11 ^ ((kind as u64) << 40),
            window: None,
        };
        run(&mut ranked, &ctx).map_err(cluster_error)?;
        loop {
            if crate::collectives::pod::poll_collective(self.pod.world(), &report)? {
                return Ok(report);
            }
            self.step()?;
        }
    }

    /// Keeps only this rank's devices' state shards (after a model was
    /// installed on every rank alike).
    pub(crate) fn hold_own_shards(&mut self) {
        localize(&mut self.pod.world, &self.layout);
    }

    /// This rank's pod, to change (a sharded model on it).
    pub(crate) fn pod_mut(&mut self) -> &mut Pod {
        &mut self.pod
    }
}

/// What [`RankedPod`]'s collectives checked of this rank's buffers: the
/// participants and the buffers' one length.
struct CheckedBuffers {
    participants: Vec<crate::topology::DeviceId>,
    len: usize,
}

fn cluster_error(error: ClusterError) -> OptimError {
    crate::transport::TransportError::from(error).into()
}

impl RankedPod {
    /// Writes a checkpoint of the split pod as `root/name`
    /// ([`crate::checkpoint::split`]): every rank writes its part, and rank
    /// 0 commits them once all are durable. Until the commit the parts sit
    /// in a temporary directory, so a save that fails anywhere (a full
    /// disk, a lost rank) leaves the committed checkpoints as they were.
    /// Every rank returns the same outcome; rank 0 also gets the manifest.
    pub fn save_checkpoint(&mut self, root: &Path, name: &str) -> Result<Option<SplitManifest>> {
        let ctx = self.pod.world.resource::<RankContext>().clone();
        split::save_split(&mut self.pod.world, &ctx, root, name).map_err(cluster_error)
    }

    /// [`RankedPod::save_checkpoint`] labeled `label` rather than the
    /// current tick.
    pub fn save_checkpoint_labeled(
        &mut self,
        root: &Path,
        name: &str,
        label: u64,
    ) -> Result<Option<SplitManifest>> {
        let ctx = self.pod.world.resource::<RankContext>().clone();
        split::save_split_labeled(&mut self.pod.world, &ctx, root, name, label)
            .map_err(cluster_error)
    }

    /// Replaces the split pod's world with a checkpoint's (a split one,
    /// written with any rank count, or one process's): rank 0 verifies
    /// every byte and merges the parts, then every rank takes the same
    /// world and keeps its own part. Nothing changes on any rank unless the
    /// whole checkpoint verified.
    pub fn restore_checkpoint(&mut self, dir: &Path) -> Result<()> {
        let bytes = if self.layout.runs_service() {
            let registry = self.pod.world.resource::<SnapshotRegistry>();
            split::read_any_checkpoint(dir, registry)
                .map_err(|e| e.to_string())
                .map(|snapshot| snapshot.to_wire())
        } else {
            Ok(Vec::new())
        };
        let bytes = cluster::broadcast(&self.mailbox, &self.layout, bytes, self.timeout)
            .map_err(cluster_error)?;
        let snapshot = WorldSnapshot::from_wire(&bytes)?;
        self.pod.restore_snapshot(&snapshot)?;
        localize(&mut self.pod.world, &self.layout);
        install_backend(&mut self.pod, &self.layout, &self.mailbox, self.timeout);
        self.start_digest = snapshot.sha256_hex();
        Ok(())
    }
}

/// Hands `pod`'s transport to a [`ClusterBackend`] over `mailbox`, with the
/// pod's current link entities (a restore respawns them).
fn install_backend(pod: &mut Pod, layout: &RankLayout, mailbox: &SharedMailbox, timeout: Duration) {
    let links: Vec<Entity> = pod
        .world
        .query_filtered::<Entity, With<Link>>()
        .iter(&pod.world)
        .collect();
    pod.set_transport_backend(Box::new(ClusterBackend::new(
        layout.clone(),
        Arc::clone(mailbox),
        links,
        timeout,
    )));
    pod.world.insert_resource(RankContext {
        layout: layout.clone(),
        mailbox: Arc::clone(mailbox),
        timeout,
        buffers: Default::default(),
        segment: Default::default(),
    });
}
