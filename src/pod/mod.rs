//! The host-facing [`Pod`]: one `World` with the pod's entities and the
//! engine's schedules.
//!
//! ```
//! use optirs_tpu::pod::Pod;
//!
//! let mut pod = Pod::from_preset("v5e-16")?;
//! pod.run(100);
//! assert_eq!(pod.clock().tick, 100);
//! assert_eq!(pod.clock().now_ns, 100 * pod.topology().tick_ns);
//! # Ok::<(), optirs_tpu::OptimError>(())
//! ```

mod clock_sync;
mod collectives;
pub mod ranks;
pub mod skip;

pub use skip::SkipStats;

pub use crate::clock::{self, SimClock, SimDuration, Ticks};

use crate::barrier::{self, BarrierOutcome, BarrierRegistry, BarrierSpec};
use crate::checkpoint::PeriodicCheckpoints;
use crate::checkpoint::engine_registry;
use crate::compiler::{self, CompileReport};
use crate::error::{OptimError, Result};
use crate::health::{self, FailureLog, FailureRecord, Fault, Health};
use crate::persist::{SnapshotRegistry, WorldSnapshot};
use crate::rng::SimRng;
use crate::schedule::{Compile, Step, init_schedules};
use crate::topology::{DeviceId, DeviceIndex};
use crate::topology::{
    PodTopology, Topology, TopologyFigures, compute_figures, load_preset, load_topology,
    load_topology_file, parse_topology, spawn_topology,
};
use crate::transport;
use bevy_ecs::prelude::*;
use bevy_ecs::schedule::ScheduleLabel;
use bevy_ecs::schedule::Schedules;
use std::path::Path;

/// `v4-16 (v4 2x2x2)`, `p (v5e 16x16, 2 slices)`: a pod in errors.
fn describe_pod(topology: &Topology) -> String {
    let slices = if topology.slices == 1 {
        String::new()
    } else {
        format!(", {} slices", topology.slices)
    };
    format!(
        "{} ({} {}{slices})",
        topology.name,
        topology.generation,
        topology.shape_string()
    )
}

/// Refuses a snapshot of another pod: the entities it would restore are
/// another topology's.
fn check_same_topology(theirs: &Topology, ours: &Topology) -> Result<()> {
    let same = theirs.name == ours.name
        && theirs.generation == ours.generation
        && theirs.dims == ours.dims
        && theirs.ndims == ours.ndims
        && theirs.slices == ours.slices
        && theirs.wraparound == ours.wraparound
        && theirs.host_bounds == ours.host_bounds;
    if same {
        Ok(())
    } else {
        Err(crate::persist::SnapshotError::OtherTopology {
            snapshot: describe_pod(theirs),
            live: describe_pod(ours),
        }
        .into())
    }
}

/// Checks that the heaps of the snapshot's world can be rebuilt (its
/// optimizer state fits its state device's HBM), before the world is
/// replaced.
fn check_heaps(registry: &SnapshotRegistry, snapshot: &WorldSnapshot) -> Result<()> {
    use crate::memory::{MemoryError, OptimizerSlot};
    use crate::topology::{Device, HbmCapacity};
    let ctx = crate::persist::LoadContext::checking(snapshot.entity_count, &snapshot.tensors);
    let mut slots = registry
        .decode_component::<OptimizerSlot>(snapshot, "tpu.OptimizerSlot")?
        .into_iter()
        .map(|(_, s)| Ok((s.index(), s.tensor_bytes(&ctx)?, s.name().to_string())))
        .collect::<Result<Vec<_>, crate::persist::SnapshotError>>()?;
    if slots.is_empty() {
        return Ok(());
    }
    let devices = registry.decode_component::<Device>(snapshot, "topology.Device")?;
    let device = match devices.iter().find(|(_, d)| d.id.0 == 0) {
        None => None,
        Some((dense, d)) => {
            let name = format!("{} ({})", d.id, d.generation);
            let capacities =
                registry.decode_component::<HbmCapacity>(snapshot, "topology.HbmCapacity")?;
            match capacities.iter().find(|(e, _)| e == dense) {
                Some((_, capacity)) => Some((name, capacity.0)),
                None => return Err(MemoryError::NoHeap { device: name }.into()),
            }
        }
    };
    Ok(crate::memory::device::check_rebuild(device, &mut slots)?)
}

/// Checks that every device's sharded-model memory in the snapshot (its
/// parameter replica and state shards) fits a fresh heap of its
/// [`crate::topology::HbmCapacity`], in the order the rebuild reserves it
/// (after device 0's single-device optimizer state), before the world is
/// replaced.
fn check_shard_heaps(registry: &SnapshotRegistry, snapshot: &WorldSnapshot) -> Result<()> {
    use crate::memory::device::check_fits;
    use crate::memory::shards::shard_purpose;
    use crate::memory::{MemoryError, OptimizerSlot, ReplicaParams, ShardSlot};
    use crate::topology::{Device, DeviceId, HbmCapacity};
    use std::collections::BTreeMap;
    let ctx = crate::persist::LoadContext::checking(snapshot.entity_count, &snapshot.tensors);
    let replicas =
        registry.decode_component::<ReplicaParams>(snapshot, "sharding.ReplicaParams")?;
    let slots = registry.decode_component::<ShardSlot>(snapshot, "sharding.ShardSlot")?;
    if replicas.is_empty() && slots.is_empty() {
        return Ok(());
    }
    let mut needs: BTreeMap<DeviceId, Vec<(usize, String)>> = BTreeMap::new();
    for (_, s) in registry.decode_component::<OptimizerSlot>(snapshot, "tpu.OptimizerSlot")? {
        needs.entry(DeviceId(0)).or_default().push((
            s.tensor_bytes(&ctx)?,
            format!("the optimizer state `{}`", s.name()),
        ));
    }
    let mut replicas: Vec<ReplicaParams> = replicas.into_iter().map(|(_, r)| r).collect();
    replicas.sort_by_key(|r| r.device);
    for r in replicas {
        needs
            .entry(r.device)
            .or_default()
            .push((r.bytes as usize, crate::memory::params_purpose(None)));
    }
    let mut slots: Vec<_> = slots.into_iter().map(|(_, s)| s).collect();
    slots.sort_by_key(|s| (s.device(), s.index()));
    for s in slots {
        needs.entry(s.device()).or_default().push((
            s.tensor_bytes(&ctx)?,
            shard_purpose(s.device(), s.owner(), s.name()),
        ));
    }
    let devices = registry.decode_component::<Device>(snapshot, "topology.Device")?;
    let capacities = registry.decode_component::<HbmCapacity>(snapshot, "topology.HbmCapacity")?;
    for (id, list) in needs {
        let Some((dense, d)) = devices.iter().find(|(_, d)| d.id == id) else {
            return Err(MemoryError::NoHeap {
                device: id.to_string(),
            }
            .into());
        };
        let name = format!("{} ({})", d.id, d.generation);
        let Some((_, capacity)) = capacities.iter().find(|(e, _)| e == dense) else {
            return Err(MemoryError::NoHeap { device: name }.into());
        };
        check_fits(&name, capacity.0, &list)?;
    }
    Ok(())
}

/// Seed of the world's random stream (jitter) unless the host picks one.
pub const DEFAULT_SEED: u64 = 0x005e_ed0f_7b0d;

/// A TPU pod simulated in one `bevy_ecs::World`.
///
/// Build it from a preset, a pod file or RON text; drive it with
/// [`Pod::step`] and [`Pod::run`]; read it through [`Pod::world`].
pub struct Pod {
    world: World,
    /// Batches of host systems added so far (each its own set).
    host_batches: u64,
    /// Systems in the built `Step` schedule as the engine installed it;
    /// any other count means systems whose events nobody reports.
    engine_systems: usize,
}

/// A schedule that cannot be built is an error of kind
/// [`ErrorKind::Schedule`](crate::error::ErrorKind::Schedule), kept whole
/// (`schedule` and `error` share the bottom layer, so the conversion lives
/// with the pod that builds the schedules).
impl From<crate::schedule::ScheduleError> for OptimError {
    fn from(error: crate::schedule::ScheduleError) -> Self {
        OptimError::new(crate::error::ErrorKind::Schedule, error)
    }
}

impl std::fmt::Debug for Pod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let topology = self.topology();
        f.debug_struct("Pod")
            .field("name", &topology.name)
            .field("devices", &topology.num_devices())
            .field("clock", self.clock())
            .finish()
    }
}

impl Pod {
    /// Builds a pod from a bundled preset (`"v5e-256"`).
    pub fn from_preset(name: &str) -> Result<Pod> {
        Pod::from_topology(load_preset(name)?)
    }

    /// Builds a pod from a RON pod file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Pod> {
        Pod::from_topology(load_topology_file(path.as_ref())?)
    }

    /// Builds a pod from RON text; `origin` names it in errors.
    pub fn from_ron_str(text: &str, origin: &str) -> Result<Pod> {
        Pod::from_topology(parse_topology(text, origin)?)
    }

    /// Builds a pod from a preset name or, failing that, a file path.
    pub fn load(spec: &str) -> Result<Pod> {
        Pod::from_topology(load_topology(spec)?)
    }

    /// Builds a pod from a validated topology: spawns its entities, installs
    /// every domain's systems and checks that the schedules build (an
    /// ambiguous system order is an error here, not a surprise later).
    pub fn from_topology(topology: Topology) -> Result<Pod> {
        let mut world = World::new();
        init_schedules(&mut world);
        crate::clock::install(&mut world, topology.tick_ns);
        world.insert_resource(SimRng::new(DEFAULT_SEED));
        spawn_topology(&mut world, &topology);
        transport::install(&mut world);
        health::install(&mut world);
        // A scheduled fault happens at its own time, inside a tick if need be.
        crate::clock::register_exact_stop(&mut world, |w| {
            w.get_resource::<health::FaultPlan>()
                .and_then(|plan| plan.pending.first().map(|f| f.at_ns))
        });
        crate::monitor::install(&mut world);
        barrier::install(&mut world);
        crate::collectives::pod::install(&mut world);
        crate::sharding::install(&mut world);
        crate::clock_sync::systems::install(&mut world);
        compiler::install(&mut world);
        // Recovery's system before the periodic checkpoint's, as the
        // schedule has always been built.
        crate::recovery::install(&mut world);
        crate::checkpoint::install(&mut world);
        for label in [Step.intern(), Compile.intern()] {
            crate::schedule::build(&mut world, label)?;
        }
        let engine_systems = world
            .resource::<Schedules>()
            .get(Step)
            .map_or(0, |s| s.systems_len());
        Ok(Pod {
            world,
            host_batches: 0,
            engine_systems,
        })
    }

    /// Builds a pod holding exactly the world of `snapshot` (its topology is
    /// read from the snapshot itself).
    pub fn from_snapshot(snapshot: &WorldSnapshot) -> Result<Pod> {
        let registry = engine_registry();
        registry.verify(snapshot)?;
        let topology: PodTopology = registry.decode_resource(snapshot, "topology.PodTopology")?;
        let mut pod = Pod::from_topology(topology.0)?;
        pod.restore_snapshot(snapshot)?;
        Ok(pod)
    }

    /// Adds host systems to the [`Step`] schedule (order them against the
    /// [`StepSystems`](crate::schedule::StepSystems) sets, and each other)
    /// and builds it at once. A batch
    /// that makes the schedule ambiguous (two systems with conflicting data
    /// access and no order between them) or otherwise unbuildable is taken
    /// out again and refused with an error of kind
    /// [`ErrorKind::Schedule`](crate::error::ErrorKind::Schedule), whose message
    /// names both systems; the pod keeps its previous schedule and steps as
    /// before.
    ///
    /// ```
    /// use bevy_ecs::prelude::*;
    /// use optirs_tpu::pod::Pod;
    /// use optirs_tpu::schedule::StepSystems;
    ///
    /// #[derive(Resource, Default)]
    /// struct Count(u64);
    /// fn bump(mut count: ResMut<Count>) { count.0 += 1; }
    /// fn reset(mut count: ResMut<Count>) { count.0 = 0; }
    ///
    /// let mut pod = Pod::from_preset("v5e-16")?;
    /// pod.world_mut().init_resource::<Count>();
    /// pod.add_systems(bump.in_set(StepSystems::Monitor))?;
    /// let error = pod.add_systems(reset.in_set(StepSystems::Monitor)).unwrap_err();
    /// assert!(error.to_string().contains("bump") && error.to_string().contains("reset"));
    /// pod.step();
    /// assert_eq!(pod.world().resource::<Count>().0, 1);
    /// # Ok::<(), optirs_tpu::OptimError>(())
    /// ```
    pub fn add_systems<M>(
        &mut self,
        systems: impl bevy_ecs::schedule::IntoScheduleConfigs<bevy_ecs::system::ScheduleSystem, M>,
    ) -> Result<()> {
        let set = crate::schedule::HostSystems(self.host_batches);
        self.host_batches += 1;
        self.world
            .resource_mut::<Schedules>()
            .add_systems(Step, systems.in_set(set));
        match crate::schedule::build(&mut self.world, Step) {
            Ok(()) => Ok(()),
            Err(message) => {
                crate::schedule::remove_host_systems(&mut self.world, Step, set)?;
                Err(message.into())
            }
        }
    }

    /// Builds the [`Step`] and [`Compile`] schedules now and returns their
    /// build error, if any, for hosts that added systems through
    /// [`Pod::world_mut`] (whose ambiguity would otherwise make the next
    /// [`Pod::step`] panic). The message names both systems of an
    /// ambiguous pair.
    pub fn validate_schedules(&mut self) -> Result<()> {
        for label in [Step.intern(), Compile.intern()] {
            crate::schedule::build(&mut self.world, label)?;
        }
        Ok(())
    }

    /// Runs one tick of the [`Step`] schedule.
    ///
    /// Panics if systems added through [`Pod::world_mut`] make the schedule
    /// ambiguous: add them with [`Pod::add_systems`], or call
    /// [`Pod::validate_schedules`] first.
    pub fn step(&mut self) {
        self.world.run_schedule(Step);
    }

    /// Runs until the clock has crossed `ticks` more tick boundaries (a
    /// tick that ends at an exact stop inside it, such as a scheduled
    /// fault or a step's modeled end, is followed by the rest of the tick).
    pub fn run(&mut self, ticks: u64) {
        let target = self.clock().tick.saturating_add(ticks);
        while self.clock().tick < target {
            self.step();
        }
    }

    /// Steps until `done` holds (checked before each tick) or `max_ticks`
    /// ticks have run: a step budget ([`Ticks`]; a bare `u64` converts), not
    /// a time. Returns the ticks run when `done` held, or `None`. Each
    /// [`Pod::step`] counts, including one that ends at an exact stop
    /// inside a tick.
    ///
    /// ```
    /// use optirs_tpu::clock::Ticks;
    /// use optirs_tpu::Pod;
    ///
    /// let mut pod = Pod::from_preset("v5e-16")?;
    /// let ran = pod.run_until(Ticks(50), |world| {
    ///     world.resource::<optirs_tpu::clock::SimClock>().tick == 10
    /// });
    /// assert_eq!(ran, Some(10));
    /// # Ok::<(), optirs_tpu::OptimError>(())
    /// ```
    pub fn run_until(
        &mut self,
        max_ticks: impl Into<Ticks>,
        mut done: impl FnMut(&World) -> bool,
    ) -> Option<u64> {
        let Ticks(max_ticks) = max_ticks.into();
        for ticks in 0..=max_ticks {
            if done(&self.world) {
                return Some(ticks);
            }
            if ticks < max_ticks {
                self.step();
            }
        }
        None
    }

    /// The simulated clock.
    pub fn clock(&self) -> &SimClock {
        self.world.resource::<SimClock>()
    }

    /// The topology the pod was built from.
    pub fn topology(&self) -> &Topology {
        &self.world.resource::<PodTopology>().0
    }

    /// Figures computed from the pod's entities.
    pub fn figures(&mut self) -> TopologyFigures {
        compute_figures(&mut self.world)
    }

    /// The world, read-only.
    pub fn world(&self) -> &World {
        &self.world
    }

    /// The world, for hosts that add their own systems or entities.
    pub fn world_mut(&mut self) -> &mut World {
        &mut self.world
    }

    /// Reseeds the world's random stream (jitter draws).
    pub fn set_seed(&mut self, seed: u64) {
        self.world.insert_resource(SimRng::new(seed));
    }

    /// Injects a fault now.
    pub fn inject(&mut self, fault: Fault) -> Result<()> {
        Ok(health::apply_fault(&mut self.world, fault)?)
    }

    /// Kills a device now (a [`DeviceId`] or its bare number).
    pub fn kill_device(&mut self, device: impl Into<DeviceId>) -> Result<()> {
        self.inject(Fault::KillDevice(device.into()))
    }

    /// Schedules a fault at simulated time `at` since the pod started
    /// (`SimDuration::from_secs(3)`; a bare `u64` is nanoseconds, as this
    /// call always took). It applies at that time exactly, inside a tick if
    /// need be.
    pub fn schedule_fault(&mut self, at: impl Into<SimDuration>, fault: Fault) {
        health::schedule_fault(&mut self.world, at.into().as_nanos(), fault);
    }

    /// The scheduled faults that can never apply if the pod runs `ticks`
    /// more ticks (see [`health::faults_that_cannot_apply`]): due after the
    /// last tick, aimed at a device killed before them, or naming a device
    /// or link the pod does not have.
    pub fn faults_that_cannot_apply(&mut self, ticks: u64) -> Vec<health::UnappliableFault> {
        // `ticks` more boundaries on the tick grid (now may be off it).
        let clock = self.clock();
        let end_ns = (clock.now_ns / clock.tick_ns.max(1))
            .saturating_add(ticks)
            .saturating_mul(clock.tick_ns);
        health::faults_that_cannot_apply(&mut self.world, end_ns)
    }

    /// The entity of a device id (or its bare number).
    pub fn device_entity(&self, device: impl Into<DeviceId>) -> Result<Entity> {
        let device = device.into();
        self.world
            .resource::<DeviceIndex>()
            .get(device)
            .ok_or(OptimError::from(health::FaultError::UnknownDevice(device)))
    }

    /// A load balancer over the devices that are running, not declared
    /// failed and not excluded after a failure.
    pub fn load_balancer(
        &mut self,
        policy: crate::load_balance::Policy,
    ) -> crate::load_balance::LoadBalancer {
        let world = &mut self.world;
        let mut healthy: Vec<DeviceId> = world
            .query_filtered::<(&crate::topology::Device, &health::DeviceState, &Health), Without<crate::health::Excluded>>()
            .iter(world)
            .filter(|(_, state, health)| state.is_running() && !health.is_failed())
            .map(|(device, _, _)| device.id)
            .collect();
        healthy.sort();
        crate::load_balance::LoadBalancer::new(policy, healthy)
    }

    /// What the coordination service believes about a device.
    pub fn health(&self, device: impl Into<DeviceId>) -> Option<Health> {
        let entity = self.world.resource::<DeviceIndex>().get(device.into())?;
        self.world.get::<Health>(entity).copied()
    }

    /// Every failure detected so far, in order.
    pub fn failures(&self) -> &[FailureRecord] {
        &self.world.resource::<FailureLog>().records
    }

    /// Creates a barrier (or its next generation) as `spec` says
    /// ([`BarrierSpec`]: every device unless `.participants(…)`, arrivals
    /// by the host unless `.auto_arrive()`, failing
    /// [`barrier::DEFAULT_TIMEOUT_NS`] (60 s of simulated time) from now
    /// unless `.timeout(…)`). A name alone is that default barrier.
    /// Returns the barrier id.
    ///
    /// ```
    /// use optirs_tpu::barrier::BarrierSpec;
    /// use optirs_tpu::Pod;
    ///
    /// let mut pod = Pod::from_preset("v5e-16")?;
    /// let id = pod.create_barrier(BarrierSpec::named("step-0").participants([0, 1]))?;
    /// pod.arrive(id, 0)?;
    /// pod.arrive(id, 1)?;
    /// assert!(pod.wait_for_barrier(id)?.finished_at().is_some());
    /// # Ok::<(), optirs_tpu::OptimError>(())
    /// ```
    pub fn create_barrier(&mut self, spec: impl Into<BarrierSpec>) -> Result<u64> {
        Ok(spec.into().create(&mut self.world)?)
    }

    /// A participant (a [`DeviceId`] or its bare number) arrives at a
    /// barrier.
    pub fn arrive(&mut self, barrier_id: u64, device: impl Into<DeviceId>) -> Result<()> {
        Ok(barrier::arrive(&mut self.world, barrier_id, device.into())?)
    }

    /// Where a barrier stands.
    pub fn barrier_outcome(&self, barrier_id: u64) -> Option<&BarrierOutcome> {
        let entity = *self
            .world
            .resource::<BarrierRegistry>()
            .by_id
            .get(barrier_id as usize)?;
        self.world.get::<BarrierOutcome>(entity)
    }

    /// Steps until the barrier completes or fails, and returns how it
    /// ended. The wait is bounded: a participant that is killed or paused is
    /// declared failed within the heartbeat timeout (failing the barrier),
    /// and every barrier has a deadline (its timeout, or
    /// [`barrier::DEFAULT_TIMEOUT_NS`] when it was created without one), so
    /// a live participant that never arrives fails it by then. Should the
    /// barrier still be pending one tick past its deadline (its systems were
    /// taken out of the schedule), the wait returns
    /// [`barrier::BarrierError::Stalled`] instead of stepping on.
    pub fn wait_for_barrier(&mut self, barrier_id: u64) -> Result<BarrierOutcome> {
        let entity = *self
            .world
            .resource::<BarrierRegistry>()
            .by_id
            .get(barrier_id as usize)
            .ok_or(barrier::BarrierError::UnknownBarrier(barrier_id))?;
        loop {
            match self.world.get::<BarrierOutcome>(entity) {
                Some(BarrierOutcome::Pending) => {
                    let clock = self.clock();
                    let now_ns = clock.now_ns;
                    let tick_ns = clock.tick_ns;
                    let barrier = self
                        .world
                        .get::<barrier::Barrier>(entity)
                        .ok_or(barrier::BarrierError::UnknownBarrier(barrier_id))?;
                    let deadline_ns = barrier.deadline();
                    if now_ns > deadline_ns.saturating_add(tick_ns) {
                        return Err(barrier::BarrierError::Stalled {
                            name: barrier.name.clone(),
                            deadline_ns,
                            now_ns,
                        }
                        .into());
                    }
                    self.step();
                }
                Some(outcome) => return Ok(outcome.clone()),
                None => return Err(barrier::BarrierError::UnknownBarrier(barrier_id).into()),
            }
        }
    }

    /// Moves this pod's messages to other processes through `backend`
    /// (see [`transport::TransportBackend`]); the default,
    /// [`transport::InProcess`], runs the whole pod here.
    pub fn set_transport_backend(&mut self, backend: Box<dyn transport::TransportBackend>) {
        self.world.insert_resource(transport::Network::new(backend));
    }

    /// Sends `bytes` of data from one device to another over the links
    /// (device ids or their bare numbers). Returns the simulated delivery
    /// time, ns (`SimDuration::from_nanos` types it).
    pub fn send_data(
        &mut self,
        from: impl Into<DeviceId>,
        to: impl Into<DeviceId>,
        bytes: u64,
    ) -> Result<u64> {
        Ok(transport::send_data(
            &mut self.world,
            from.into(),
            to.into(),
            bytes,
        )?)
    }

    /// Parses a RON program (`docs/programs.md`), spawns it into the pod's
    /// world and runs the [`Compile`] schedule. The program's graph, kernels,
    /// buffers and executable stay in the world (and in its checkpoints);
    /// `name` is used in error positions.
    pub fn compile_program_str(&mut self, name: &str, text: &str) -> Result<CompileReport> {
        let program = compiler::load_program_str(&mut self.world, name, text)?;
        Ok(compiler::compile(&mut self.world, program)?)
    }

    /// [`Pod::compile_program_str`] on a program file; errors name the file.
    pub fn compile_program_file(&mut self, path: impl AsRef<Path>) -> Result<CompileReport> {
        Ok(compiler::compile_file(&mut self.world, path.as_ref())?)
    }

    /// Captures the whole engine world: every registered component of every
    /// engine entity, and every registered resource.
    pub fn snapshot(&mut self) -> Result<WorldSnapshot> {
        let tick = self.clock().tick;
        Ok(self
            .world
            .resource_scope(|world, registry: Mut<SnapshotRegistry>| {
                registry.capture(world, tick)
            })?)
    }

    /// [`Pod::snapshot`] recorded under tick `label` instead of the
    /// clock's (checkpoints written twice in one tick keep distinct,
    /// ordered labels); the world captured is the same.
    pub fn snapshot_labeled(&mut self, label: u64) -> Result<WorldSnapshot> {
        Ok(self
            .world
            .resource_scope(|world, registry: Mut<SnapshotRegistry>| {
                registry.capture(world, label)
            })?)
    }

    /// SHA-256 of the canonical snapshot bytes: equal for equal worlds.
    pub fn world_sha256(&mut self) -> Result<String> {
        Ok(self.snapshot()?.sha256_hex())
    }

    /// Replaces the world's engine entities and resources with the
    /// snapshot's, in place: the schedules keep running on the same world.
    ///
    /// Everything that can fail runs before the world changes; on `Err`
    /// nothing changed. The snapshot must be of this pod's topology (same
    /// name, generation, shape, slices, wraparound and hosts: a snapshot of
    /// another pod is [`SnapshotError::OtherTopology`], naming both), every
    /// column is decoded and checked, and the restored optimizer state must
    /// fit the HBM of its device. Device heaps are not persisted: they are
    /// then rebuilt with the restored optimizer state resident, and
    /// `HbmUsage` follows them.
    ///
    /// [`SnapshotError::OtherTopology`]: crate::persist::SnapshotError::OtherTopology
    pub fn restore_snapshot(&mut self, snapshot: &WorldSnapshot) -> Result<()> {
        let registry = self.world.resource::<SnapshotRegistry>();
        let theirs: PodTopology = registry.decode_resource(snapshot, "topology.PodTopology")?;
        check_same_topology(&theirs.0, self.topology())?;
        check_heaps(registry, snapshot)?;
        check_shard_heaps(registry, snapshot)?;
        self.world
            .resource_scope(|world, registry: Mut<SnapshotRegistry>| {
                registry.restore(world, snapshot)
            })?;
        Ok(crate::memory::device::rebuild_heaps(&mut self.world)?)
    }

    /// Writes a checkpoint every `every_ticks` ticks to each root, from a
    /// system in the `Step` schedule's last set, keeping the newest
    /// `max_checkpoints` per root. Write errors do not stop the pod; they are
    /// kept in the [`PeriodicCheckpoints`] resource.
    pub fn enable_periodic_checkpoints(
        &mut self,
        every_ticks: u64,
        roots: Vec<std::path::PathBuf>,
        max_checkpoints: usize,
    ) -> Result<()> {
        if every_ticks == 0 || roots.is_empty() || max_checkpoints == 0 {
            return Err(OptimError::invalid_config(
                "periodic checkpoints need every_ticks >= 1, a root and max_checkpoints >= 1",
            ));
        }
        self.world.insert_resource(PeriodicCheckpoints {
            every_ticks,
            roots,
            max_checkpoints,
            written: 0,
            last_error: None,
            retention_problems: Vec::new(),
        });
        Ok(())
    }
}
