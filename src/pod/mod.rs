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

pub use crate::clock::{self, SimClock};

use crate::barrier::{self, BarrierOutcome, BarrierRegistry};
use crate::checkpoint::engine_registry;
use crate::checkpoint::{PeriodicCheckpoints, write_periodic_checkpoint};
use crate::compiler::{self, CompileReport};
use crate::error::{OptimError, Result};
use crate::health::{self, FailureLog, FailureRecord, Fault, Health};
use crate::persist::{SnapshotRegistry, WorldSnapshot};
use crate::rng::SimRng;
use crate::schedule::StepSystems;
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

/// Seed of the world's random stream (jitter) unless the host picks one.
pub const DEFAULT_SEED: u64 = 0x005e_ed0f_7b0d;

/// A TPU pod simulated in one `bevy_ecs::World`.
///
/// Build it from a preset, a pod file or RON text; drive it with
/// [`Pod::step`] and [`Pod::run`]; read it through [`Pod::world`].
pub struct Pod {
    world: World,
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
        crate::monitor::install(&mut world);
        barrier::install(&mut world);
        crate::collectives::pod::install(&mut world);
        crate::clock_sync::systems::install(&mut world);
        compiler::install(&mut world);
        world.insert_resource(engine_registry());
        world.resource_mut::<Schedules>().add_systems(
            Step,
            write_periodic_checkpoint.in_set(StepSystems::Checkpoint),
        );
        for label in [Step.intern(), Compile.intern()] {
            world.schedule_scope(label, |world, schedule| match schedule.initialize(world) {
                Ok(_) => Ok(()),
                Err(error) => Err(OptimError::Schedule(format!(
                    "{label:?}: {}",
                    error.to_string(schedule.graph(), world)
                ))),
            })?;
        }
        Ok(Pod { world })
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

    /// Runs one tick of the [`Step`] schedule.
    pub fn step(&mut self) {
        self.world.run_schedule(Step);
    }

    /// Runs `ticks` ticks.
    pub fn run(&mut self, ticks: u64) {
        for _ in 0..ticks {
            self.step();
        }
    }

    /// Steps until `done` holds (checked before each tick) or `max_ticks`
    /// ticks have run. Returns the ticks run when `done` held, or `None`.
    pub fn run_until(
        &mut self,
        max_ticks: u64,
        mut done: impl FnMut(&World) -> bool,
    ) -> Option<u64> {
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

    /// Kills a device now.
    pub fn kill_device(&mut self, device: u32) -> Result<()> {
        self.inject(Fault::KillDevice(DeviceId(device)))
    }

    /// Schedules a fault at simulated time `at_ns`.
    pub fn schedule_fault(&mut self, at_ns: u64, fault: Fault) {
        health::schedule_fault(&mut self.world, at_ns, fault);
    }

    /// The entity of a device id.
    pub fn device_entity(&self, device: u32) -> Result<Entity> {
        self.world
            .resource::<DeviceIndex>()
            .get(DeviceId(device))
            .ok_or(OptimError::Fault(health::FaultError::UnknownDevice(
                DeviceId(device),
            )))
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
    pub fn health(&self, device: u32) -> Option<Health> {
        let entity = self.world.resource::<DeviceIndex>().get(DeviceId(device))?;
        self.world.get::<Health>(entity).copied()
    }

    /// Every failure detected so far, in order.
    pub fn failures(&self) -> &[FailureRecord] {
        &self.world.resource::<FailureLog>().records
    }

    /// Creates a barrier (or its next generation). `participants: None` is
    /// every device; with `auto_arrive`, running participants arrive by
    /// themselves. Returns the barrier id.
    pub fn create_barrier(
        &mut self,
        name: &str,
        participants: Option<Vec<DeviceId>>,
        timeout_ns: Option<u64>,
        auto_arrive: bool,
    ) -> Result<u64> {
        Ok(barrier::create_barrier(
            &mut self.world,
            name,
            participants,
            timeout_ns,
            auto_arrive,
        )?)
    }

    /// A participant arrives at a barrier.
    pub fn arrive(&mut self, barrier_id: u64, device: u32) -> Result<()> {
        Ok(barrier::arrive(
            &mut self.world,
            barrier_id,
            DeviceId(device),
        )?)
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

    /// Steps until the barrier completes or fails (it always does: a missing
    /// participant is detected as failed within the heartbeat timeout).
    pub fn wait_for_barrier(&mut self, barrier_id: u64) -> Result<BarrierOutcome> {
        let entity = *self
            .world
            .resource::<BarrierRegistry>()
            .by_id
            .get(barrier_id as usize)
            .ok_or(barrier::BarrierError::UnknownBarrier(barrier_id))?;
        loop {
            match self.world.get::<BarrierOutcome>(entity) {
                Some(BarrierOutcome::Pending) => self.step(),
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

    /// Sends `bytes` of data from one device to another over the links.
    /// Returns the simulated delivery time, ns.
    pub fn send_data(&mut self, from: u32, to: u32, bytes: u64) -> Result<u64> {
        Ok(transport::send_data(
            &mut self.world,
            DeviceId(from),
            DeviceId(to),
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

    /// SHA-256 of the canonical snapshot bytes: equal for equal worlds.
    pub fn world_sha256(&mut self) -> Result<String> {
        Ok(self.snapshot()?.sha256_hex())
    }

    /// Replaces the world's engine entities and resources with the
    /// snapshot's, in place: the schedules keep running on the same world.
    /// The snapshot is decoded and checked first; on `Err` nothing changed.
    /// Device heaps are not persisted: they are rebuilt with the restored
    /// optimizer state resident, and `HbmUsage` follows them.
    pub fn restore_snapshot(&mut self, snapshot: &WorldSnapshot) -> Result<()> {
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
            return Err(OptimError::InvalidConfig(
                "periodic checkpoints need every_ticks >= 1, a root and max_checkpoints >= 1"
                    .into(),
            ));
        }
        self.world.insert_resource(PeriodicCheckpoints {
            every_ticks,
            roots,
            max_checkpoints,
            written: 0,
            last_error: None,
        });
        Ok(())
    }
}
