//! [`TPUOptimizer`]: any [`Optimizer`] compiled, fused and executed the way
//! a TPU runtime would run it: compile once per program, reuse, reserve
//! device memory, execute, profile.
//!
//! * **Compile once.** An optimizer with an [`UpdateRule`] becomes a graph
//!   ([`graph::build_update_graph`]) that the compiler fuses into one loop
//!   kernel (Adam: one kernel that reads params, grads, `mu` and `nu` once
//!   and writes params, `mu` and `nu` once). The compiled program is keyed
//!   by (shape, dtype, optimizer kind and hyper-parameters) in a bounded LRU
//!   cache; the step count and the learning rate are program inputs, so
//!   every step of a run hits the cache, learning-rate schedules included
//!   (the other hyper-parameters are compiled in). An optimizer without a
//!   rule runs as a custom call to its own `step`.
//! * **State in the world.** Moments and the step count are entities
//!   ([`state::OptimizerSlot`], [`state::OptimizerCount`]) in the
//!   optimizer's own `World`, updated in place by the compiled program, so
//!   [`TPUOptimizer::snapshot`] carries them and [`TPUOptimizer::restore`]
//!   brings them back.
//! * **Device memory.** The state slots are resident in device 0's HBM heap
//!   ([`state::DeviceHeap`], sized from the generation's HBM or
//!   [`TPUConfig::hbm_bytes`]) from their creation until a reset; each
//!   execution reserves the rest of its program's planned heap for the
//!   step. Anything that does not fit is an error naming the device, the
//!   bytes requested, the free bytes and the largest free block. Every
//!   reservation updates the device's [`HbmUsage`] ([`hbm`]), which the
//!   monitor's memory check reads: build the optimizer with
//!   [`TPUOptimizer::on_pod`] to run it on a pod's devices and have the
//!   pod's monitor watch its state.
//! * **Profile.** [`TPUOptimizer::profile`] has compile and execute times,
//!   bytes moved, cache hits and misses, and HBM reservations with the peak
//!   taken while a reservation was held.
//!
//! The numbers are `Optimizer::step`'s, bit for bit: the graph keeps optax's
//! op order and the rounded scalars of the rule.
//!
//! ```
//! use ndarray::Array1;
//! use optirs_tpu::optimizers::SGD;
//! use optirs_tpu::{Optimizer, TPUConfig, TPUOptimizer, TPUVersion};
//! use optirs_tpu::coordination::{PodConfig, PodCoordinator};
//!
//! let params = Array1::from_vec(vec![1.0f32, 2.0, 3.0]);
//! let gradients = Array1::from_vec(vec![0.5f32, -1.0, 0.25]);
//!
//! let mut tpu_opt = TPUOptimizer::new(SGD::new(0.01f32), TPUConfig {
//!     tpu_version: TPUVersion::V4, num_cores: 8, ..Default::default() })?;
//! let updated = tpu_opt.tpu_step(&params, &gradients)?;   // compile once, reuse, execute, profile
//! assert_eq!(updated[0], 1.0 - 0.01 * 0.5);
//! // TPUOptimizer also implements Optimizer, so generic code can call step.
//! let again = tpu_opt.step(&updated, &gradients)?;
//! assert_eq!(tpu_opt.profile().cache.misses, 1);
//! assert_eq!(tpu_opt.profile().cache.hits, 1, "the second step reuses the program");
//! assert!(again[1] > updated[1]);
//!
//! let mut pod = PodCoordinator::new(PodConfig { num_devices: 8, ..Default::default() })?;
//! pod.synchronize_devices("step-0".to_string())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod bench;
pub mod graph;
pub mod hbm;
pub mod profile;
pub mod state;

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Instant;

use bevy_ecs::prelude::*;
use ndarray::{Array, ArrayD, Dimension, IxDyn};

use crate::compiler;
use crate::error::{OptimError, Result};
use crate::exec::runtime::{Arg, CustomCallHandler, Element, RunOutput, Runtime};
use crate::hardware::TpuGeneration;
use crate::ir::Tensor;
use crate::ir::{DType, TensorType};
use crate::memory::ALIGNMENT;
use crate::memory::HbmUsage;
use crate::memory::{Block, Heap};
use crate::optimizers::OptimizerError;
use crate::optimizers::{FloatElement, Optimizer, UpdateRule};
use crate::persist::{SnapshotRegistry, WorldSnapshot};
use crate::pod::Pod;
use crate::topology::{Device, DeviceId, HbmCapacity};

pub use bench::{OptimizerBench, bench_optimizer};
pub use profile::{CacheStats, HbmSnapshot, MemoryEvent, MemoryEventKind, TpuProfile};
use state::{DeviceHeap, OptimizerCount, OptimizerSlot};

/// The TPU generation of a [`TPUConfig`] (the crate's [`TpuGeneration`]).
pub type TPUVersion = TpuGeneration;

/// Programs kept compiled by default.
pub const DEFAULT_CACHE_CAPACITY: usize = 16;

/// What a [`TPUOptimizer`] runs on.
#[derive(Debug, Clone, PartialEq)]
pub struct TPUConfig {
    /// Chip generation.
    pub tpu_version: TPUVersion,
    /// TensorCores: a positive multiple of the generation's cores per chip,
    /// at most its largest pod.
    pub num_cores: usize,
    /// HBM per chip in bytes; `None` takes the generation's figure.
    pub hbm_bytes: Option<u64>,
    /// Compiled programs kept (least recently used evicted first), ≥ 1.
    pub cache_capacity: usize,
}

impl Default for TPUConfig {
    fn default() -> Self {
        TPUConfig {
            tpu_version: TPUVersion::V4,
            num_cores: 8,
            hbm_bytes: None,
            cache_capacity: DEFAULT_CACHE_CAPACITY,
        }
    }
}

impl TPUConfig {
    /// Checks the configuration against the generation's figures; returns
    /// the number of chips.
    pub fn validate(&self) -> Result<usize> {
        let spec = self.tpu_version.spec();
        let per_chip = spec.cores_per_chip as usize;
        let invalid = |m: String| Err(OptimError::InvalidConfig(m));
        if self.num_cores == 0 {
            return invalid("num_cores is 0; a TPU optimizer needs at least one core".into());
        }
        if !self.num_cores.is_multiple_of(per_chip) {
            return invalid(format!(
                "num_cores = {} is not a multiple of {per_chip}, the TensorCores per {} chip; \
                 use {} or {}",
                self.num_cores,
                spec.name,
                self.num_cores / per_chip * per_chip.max(1),
                self.num_cores.next_multiple_of(per_chip)
            ));
        }
        let chips = self.num_cores / per_chip;
        if chips > spec.max_pod_chips as usize {
            return invalid(format!(
                "num_cores = {} needs {chips} {} chips, but the largest {} pod has {} chips ({} cores)",
                self.num_cores,
                spec.name,
                spec.name,
                spec.max_pod_chips,
                spec.max_pod_chips as usize * per_chip
            ));
        }
        if self.hbm_bytes == Some(0) {
            return invalid("hbm_bytes is 0; leave it None for the generation's HBM".into());
        }
        if self.cache_capacity == 0 {
            return invalid("cache_capacity is 0; at least one compiled program must fit".into());
        }
        Ok(chips)
    }
}

/// The cache key: what a compiled program depends on.
#[derive(Debug, Clone, PartialEq)]
struct ProgramKey {
    shape: Vec<usize>,
    dtype: DType,
    optimizer: String,
    /// Hyper-parameter bits, in the rule's order (empty for opaque optimizers).
    hyper: Vec<(&'static str, u64)>,
}

struct CacheEntry {
    key: ProgramKey,
    runtime: Arc<Runtime>,
    /// Bytes one run reads and writes (parameters plus results).
    bytes: u64,
    /// Whether the program is the optimizer's rule (else its `step` as a custom call).
    rule: bool,
    last_used: u64,
}

/// A bounded LRU cache of compiled programs.
struct ProgramCache {
    capacity: usize,
    entries: Vec<CacheEntry>,
    clock: u64,
    hits: u64,
    misses: u64,
    evictions: u64,
}

impl ProgramCache {
    fn lookup(&mut self, key: &ProgramKey) -> Option<(Arc<Runtime>, u64, bool)> {
        self.clock += 1;
        let clock = self.clock;
        match self.entries.iter_mut().find(|e| &e.key == key) {
            Some(e) => {
                e.last_used = clock;
                self.hits += 1;
                Some((e.runtime.clone(), e.bytes, e.rule))
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    fn insert(&mut self, key: ProgramKey, runtime: Arc<Runtime>, bytes: u64, rule: bool) {
        if self.entries.len() >= self.capacity
            && let Some(lru) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(i, _)| i)
        {
            self.entries.swap_remove(lru);
            self.evictions += 1;
        }
        self.entries.push(CacheEntry {
            key,
            runtime,
            bytes,
            rule,
            last_used: self.clock,
        });
    }

    fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits,
            misses: self.misses,
            evictions: self.evictions,
            entries: self.entries.len(),
            capacity: self.capacity,
        }
    }
}

/// The components of a TPU optimizer's world that a snapshot carries.
pub fn tpu_registry() -> SnapshotRegistry {
    let mut registry = SnapshotRegistry::default();
    registry
        .component::<Device>("topology.Device")
        .component::<HbmCapacity>("topology.HbmCapacity")
        .component::<OptimizerSlot>("tpu.OptimizerSlot")
        .component::<OptimizerCount>("tpu.OptimizerCount");
    registry
}

/// Where an optimizer's devices and state live.
enum Place {
    /// A world of its own with one device entity per chip.
    Own(World),
    /// The devices of a pod, monitored by the pod's `Step` schedule.
    Pod(Pod),
}

impl Place {
    fn world(&self) -> &World {
        match self {
            Place::Own(world) => world,
            Place::Pod(pod) => pod.world(),
        }
    }

    fn world_mut(&mut self) -> &mut World {
        match self {
            Place::Own(world) => world,
            Place::Pod(pod) => pod.world_mut(),
        }
    }
}

/// An optimizer compiled and run as a TPU program (see the module docs).
pub struct TPUOptimizer<O, A = f32> {
    base: O,
    config: TPUConfig,
    place: Place,
    devices: Vec<Entity>,
    cache: ProgramCache,
    profile: TpuProfile,
    /// Cached queries (building a query state costs more than a small step).
    counts: QueryState<(Entity, &'static mut OptimizerCount)>,
    slots: QueryState<&'static mut OptimizerSlot>,
    /// The base's learning rate (bits) and the run-time learning-rate
    /// scalar its rule applies (`None`: the rule has none, or no rule).
    learning_rate: Option<(u64, Option<A>)>,
    /// Device names for the memory profile, formatted once.
    device_labels: Vec<(Entity, Option<u32>, String)>,
    _element: PhantomData<fn() -> A>,
}

impl<O, A> std::fmt::Debug for TPUOptimizer<O, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TPUOptimizer")
            .field("config", &self.config)
            .field("cache", &self.cache.stats())
            .finish()
    }
}

/// Runs the opaque optimizer's `step` for the `optirs.step` custom call.
struct StepCall<'o, O, A> {
    base: &'o mut O,
    _element: PhantomData<fn() -> A>,
}

impl<O: Optimizer<A, IxDyn>, A: FloatElement + Element> CustomCallHandler for StepCall<'_, O, A> {
    fn call(&mut self, target: &str, args: &[&Tensor], _: &TensorType) -> Result<Tensor, String> {
        if target != graph::STEP_TARGET {
            return Err(format!("unknown target (known: {})", graph::STEP_TARGET));
        }
        let [p, g] = args else {
            return Err(format!(
                "takes params and grads, got {} operands",
                args.len()
            ));
        };
        let as_array = |t: &Tensor| {
            A::from_tensor((*t).clone()).map_err(|t| format!("operand is {}", t.tensor_type()))
        };
        let (p, g): (ArrayD<A>, ArrayD<A>) = (as_array(p)?, as_array(g)?);
        self.base
            .step(&p, &g)
            .map(A::into_tensor)
            .map_err(|e| e.to_string())
    }
}

impl<O, A> TPUOptimizer<O, A>
where
    O: Optimizer<A, IxDyn>,
    A: FloatElement + Element,
{
    /// Wraps `base` after checking `config`; spawns one device entity per
    /// chip, each with its HBM heap.
    pub fn new(base: O, config: TPUConfig) -> Result<Self> {
        let chips = config.validate()?;
        let spec = config.tpu_version.spec();
        let hbm = config.hbm_bytes.unwrap_or(spec.hbm_bytes);
        let capacity = usize::try_from(hbm).map_err(|_| {
            OptimError::InvalidConfig(format!("hbm_bytes = {hbm} does not fit this host"))
        })?;
        let mut world = World::new();
        let devices = (0..chips as u32)
            .map(|id| {
                world
                    .spawn((
                        Device {
                            id: DeviceId(id),
                            generation: config.tpu_version,
                            cores: spec.cores_per_chip,
                        },
                        HbmCapacity(hbm),
                        DeviceHeap(Heap::new(capacity, ALIGNMENT)),
                        HbmUsage(0),
                    ))
                    .id()
            })
            .collect();
        Ok(Self::with_place(base, config, Place::Own(world), devices))
    }

    /// Wraps `base` to run on the first `config.num_cores` cores of `pod`:
    /// its state resides in the HBM of the pod's device 0, so the pod's
    /// monitor sees it. `config.tpu_version` must be the pod's generation;
    /// `config.hbm_bytes`, if set, becomes the HBM of the devices used
    /// (a small figure makes memory pressure testable). Optimizer state
    /// already in the pod (a restored snapshot) is adopted.
    pub fn on_pod(base: O, config: TPUConfig, mut pod: Pod) -> Result<Self> {
        let chips = config.validate()?;
        let topology = pod.topology();
        if topology.generation != config.tpu_version {
            return Err(OptimError::InvalidConfig(format!(
                "the optimizer is configured for {}, but {} is a {} pod",
                config.tpu_version, topology.name, topology.generation
            )));
        }
        if chips > topology.num_devices() as usize {
            return Err(OptimError::InvalidConfig(format!(
                "num_cores = {} needs {chips} chips, but {} has {}",
                config.num_cores,
                topology.name,
                topology.num_devices()
            )));
        }
        let devices: Vec<Entity> = (0..chips as u32)
            .map(|id| pod.device_entity(id))
            .collect::<Result<_>>()?;
        let world = pod.world_mut();
        if let Some(bytes) = config.hbm_bytes {
            for &device in &devices {
                world.entity_mut(device).insert(HbmCapacity(bytes));
            }
        }
        hbm::mark(world, &devices);
        hbm::rebuild_heaps(world)?;
        Ok(Self::with_place(base, config, Place::Pod(pod), devices))
    }

    fn with_place(base: O, config: TPUConfig, mut place: Place, devices: Vec<Entity>) -> Self {
        let cache = ProgramCache {
            capacity: config.cache_capacity,
            entries: Vec::new(),
            clock: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
        };
        let counts = place.world_mut().query();
        let slots = place.world_mut().query();
        TPUOptimizer {
            base,
            config,
            counts,
            slots,
            place,
            devices,
            cache,
            profile: TpuProfile::default(),
            learning_rate: None,
            device_labels: Vec::new(),
            _element: PhantomData,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &TPUConfig {
        &self.config
    }

    /// The wrapped optimizer (its hyper-parameters; a compiled optimizer's
    /// state lives in the world, not in it).
    pub fn base(&self) -> &O {
        &self.base
    }

    /// The world holding devices and optimizer state (the pod's, for an
    /// optimizer built with [`TPUOptimizer::on_pod`]).
    pub fn world(&self) -> &World {
        self.place.world()
    }

    /// The pod the optimizer runs on, if it was built with
    /// [`TPUOptimizer::on_pod`] (run it to advance simulated time).
    pub fn pod_mut(&mut self) -> Option<&mut Pod> {
        match &mut self.place {
            Place::Own(_) => None,
            Place::Pod(pod) => Some(pod),
        }
    }

    /// HBM bytes in use on device `id` as the monitor reads them
    /// ([`HbmUsage`]; 0 before anything was reserved there).
    pub fn hbm_usage(&self, id: u32) -> u64 {
        let world = self.place.world();
        self.devices
            .iter()
            .find(|&&e| world.get::<Device>(e).is_some_and(|d| d.id.0 == id))
            .and_then(|&e| world.get::<HbmUsage>(e))
            .map_or(0, |u| u.0)
    }

    /// What has been compiled, run and reserved so far.
    pub fn profile(&self) -> TpuProfile {
        let mut p = self.profile.clone();
        p.cache = self.cache.stats();
        p
    }

    /// HBM reservations and releases, oldest first (empty until a step ran).
    pub fn memory_export(&self) -> Vec<MemoryEvent> {
        self.profile.memory.timeline.iter().cloned().collect()
    }

    /// Steps taken (0 before the first step and after a reset).
    pub fn step_count(&mut self) -> i32 {
        self.count_state().map_or(0, |(_, c)| c.count)
    }

    /// The state slot `name` (e.g. Adam's `mu`), if the state exists.
    pub fn slot(&mut self, name: &str) -> Option<Tensor> {
        let world = self.place.world_mut();
        let mut q = world.query::<&OptimizerSlot>();
        q.iter(world)
            .find(|s| s.name == name)
            .map(|s| s.tensor.clone())
    }

    /// One step: the new params. Compiles on the first step of a shape
    /// (and after a change of a hyper-parameter other than the learning
    /// rate), then reuses the program.
    pub fn tpu_step<D: Dimension>(
        &mut self,
        params: &Array<A, D>,
        grads: &Array<A, D>,
    ) -> Result<Array<A, D>> {
        crate::optimizers::check_same_shape(params, grads)?;
        let shape = params.shape().to_vec();
        let out = self.execute(&shape, Arg::view(params), Arg::view(grads))?;
        let t = match out {
            RunOutput::Owned(t) => t,
            RunOutput::InArgument(_) => A::into_tensor(params.to_owned().into_dyn()),
        };
        into_array(t, params.raw_dim())
    }

    /// One step that overwrites `params` (a donated buffer: the program
    /// writes the new params over the old ones).
    pub fn tpu_step_in_place<D: Dimension>(
        &mut self,
        params: &mut Array<A, D>,
        grads: &Array<A, D>,
    ) -> Result<()> {
        crate::optimizers::check_same_shape(params, grads)?;
        let shape = params.shape().to_vec();
        let dim = params.raw_dim();
        let out = self.execute(&shape, Arg::donated(params), Arg::view(grads))?;
        if let RunOutput::Owned(t) = out {
            *params = into_array(t, dim)?;
        }
        Ok(())
    }

    /// Drops the optimizer state (the next step starts at count 0) and
    /// releases its HBM.
    pub fn reset_state(&mut self) {
        let world = self.place.world_mut();
        let entities: Vec<Entity> = world
            .query_filtered::<Entity, Or<(With<OptimizerSlot>, With<OptimizerCount>)>>()
            .iter(world)
            .collect();
        for e in entities {
            // A block that cannot be released was never this heap's: the
            // heap is rebuilt from the remaining state instead.
            if hbm::release_slot(world, e).is_err() {
                world.entity_mut(e).remove::<hbm::ResidentBlock>();
            }
            world.despawn(e);
        }
        self.base.reset();
    }

    /// A snapshot of the world: devices and optimizer state (the whole pod
    /// for an optimizer on a pod).
    pub fn snapshot(&mut self) -> Result<WorldSnapshot> {
        let tick = u64::try_from(self.step_count()).unwrap_or(0);
        match &mut self.place {
            Place::Own(world) => Ok(tpu_registry().capture(world, tick)?),
            Place::Pod(pod) => pod.snapshot(),
        }
    }

    /// Restores a snapshot taken by [`TPUOptimizer::snapshot`]; verified
    /// before the world is touched. The device heaps are rebuilt with the
    /// restored state resident, and [`HbmUsage`] follows them.
    pub fn restore(&mut self, snapshot: &WorldSnapshot) -> Result<()> {
        // On a pod the optimizer keeps to its first chips.
        let keep = match self.place {
            Place::Own(_) => usize::MAX,
            Place::Pod(_) => self.devices.len(),
        };
        match &mut self.place {
            Place::Own(world) => tpu_registry().restore(world, snapshot)?,
            Place::Pod(pod) => pod.restore_snapshot(snapshot)?,
        }
        let world = self.place.world_mut();
        let mut q = world.query::<(Entity, &Device)>();
        let mut found: Vec<(u32, Entity)> = q.iter(world).map(|(e, d)| (d.id.0, e)).collect();
        found.sort();
        found.truncate(keep);
        self.devices = found.into_iter().map(|(_, e)| e).collect();
        self.device_labels.clear();
        // The snapshot may predate the optimizer's use of its devices.
        hbm::mark(world, &self.devices);
        Ok(hbm::rebuild_heaps(world)?)
    }

    /// The rule's run-time learning-rate scalar, recomputed only when the
    /// base's learning rate changes.
    fn learning_rate_scalar(&mut self) -> Option<A> {
        let bits = self.base.learning_rate().as_f64().to_bits();
        match self.learning_rate {
            Some((b, v)) if b == bits => v,
            _ => {
                let v = self
                    .base
                    .update_rule()
                    .and_then(|r| graph::learning_rate_scalar(r));
                self.learning_rate = Some((bits, v));
                v
            }
        }
    }

    fn count_state(&mut self) -> Option<(Entity, OptimizerCount)> {
        self.counts
            .iter(self.place.world())
            .next()
            .map(|(e, c)| (e, c.clone()))
    }

    /// The compiled program for `shape` (from the cache or compiled now);
    /// a learning rate passed at run time (`lr_at_run_time`) is not part of
    /// the program, so not of its key.
    fn program(
        &mut self,
        shape: &[usize],
        lr_at_run_time: bool,
    ) -> Result<(Arc<Runtime>, u64, bool)> {
        let rule = self.base.update_rule();
        let key = ProgramKey {
            shape: shape.to_vec(),
            dtype: <A as Element>::DTYPE,
            optimizer: self.base.name().to_owned(),
            hyper: rule.map_or_else(Vec::new, |r| {
                r.hyper_parameters()
                    .iter()
                    .filter(|h| !(lr_at_run_time && h.name == "learning_rate"))
                    .map(|h| (h.name, h.value.to_bits()))
                    .collect()
            }),
        };
        if let Some(found) = self.cache.lookup(&key) {
            return Ok(found);
        }
        let started = Instant::now();
        let ty = TensorType::new(<A as Element>::DTYPE, shape.to_vec());
        let mut world = compiler::compiler_world();
        let (program, is_rule) = match rule.map(|r| graph::build_update_graph(&mut world, r, shape))
        {
            Some(Ok(p)) => (p, true),
            // No rule, or one the graph cannot express: the optimizer's own step.
            _ => {
                let mut fresh = compiler::compiler_world();
                let p = graph::build_custom_call_graph(&mut fresh, self.base.name(), &ty);
                world = fresh;
                (p, false)
            }
        };
        let report = compiler::compile(&mut world, program)?;
        // Output 0 (params) over parameter 0, output k (slot k - 1) over
        // parameter k + 1; the count and the grads are never written.
        let aliases: Vec<(usize, usize)> = if is_rule {
            (0..report.executable.outputs.len())
                .map(|o| (o, if o == 0 { 0 } else { o + 1 }))
                .collect()
        } else {
            vec![(0, 0)]
        };
        let runtime = Arc::new(Runtime::with_aliases(report.executable.clone(), &aliases));
        let exe = &report.executable;
        let param_bytes: usize = exe.parameters.iter().map(TensorType::byte_size).sum();
        let result_bytes: usize = exe
            .outputs
            .iter()
            .filter_map(|r| match r {
                compiler::executable::ValueRef::Buffer(b) => {
                    TensorType::parse(&exe.buffers[*b as usize].ty)
                }
                compiler::executable::ValueRef::Constant(_) => None,
            })
            .map(|t| t.byte_size())
            .sum();
        let bytes = (param_bytes + result_bytes) as u64;
        let seconds = started.elapsed().as_secs_f64();
        self.profile.compiles += 1;
        self.profile.compile_seconds += seconds;
        self.profile.last_compile_seconds = seconds;
        self.profile.last_program = exe.name.clone();
        self.profile.last_kernels = exe.kernels.len();
        self.cache.insert(key, runtime.clone(), bytes, is_rule);
        Ok((runtime, bytes, is_rule))
    }

    /// Makes sure the state exists for `shape`; returns the next count.
    fn prepare_state(
        &mut self,
        rule_slots: &[&'static str],
        initial: &[A],
        shape: &[usize],
    ) -> Result<i32> {
        if let Some((e, c)) = self.count_state() {
            if rule_slots.is_empty() {
                // No per-element state: any shape, like the base optimizer.
                if c.shape != shape
                    && let Some(mut stored) = self.place.world_mut().get_mut::<OptimizerCount>(e)
                {
                    stored.shape = shape.to_vec();
                }
            } else if c.shape != shape {
                return Err(OptimError::Optimizer(OptimizerError::StateShapeMismatch {
                    optimizer: self.base.name().to_owned(),
                    state: c.shape,
                    params: shape.to_vec(),
                }));
            }
            return Ok(c.count.saturating_add(1));
        }
        let world = self.place.world_mut();
        let mut spawned = Vec::with_capacity(rule_slots.len());
        for (i, name) in rule_slots.iter().enumerate() {
            let value = initial.get(i).copied().unwrap_or_else(A::zero);
            let slot = world.spawn(OptimizerSlot {
                name: (*name).to_owned(),
                index: i as u32,
                tensor: A::into_tensor(ArrayD::from_elem(IxDyn(shape), value)),
            });
            spawned.push(slot.id());
        }
        // The state is resident from now until it is dropped; a state that
        // does not fit is never created.
        let reserved = match hbm::reserve_state(world) {
            Ok(reserved) => reserved,
            Err(e) => {
                for slot in spawned {
                    world.despawn(slot);
                }
                return Err(e.into());
            }
        };
        for (device, block, name) in reserved {
            self.record_reserve(device, block, &format!("state `{name}`"));
        }
        self.place.world_mut().spawn(OptimizerCount {
            count: 0,
            shape: shape.to_vec(),
        });
        Ok(1)
    }

    fn execute(&mut self, shape: &[usize], params: Arg<'_>, grads: Arg<'_>) -> Result<RunOutput> {
        let neg_lr = self.learning_rate_scalar();
        let (runtime, bytes, compiled_rule) = self.program(shape, neg_lr.is_some())?;
        let mut next_count = 0;
        if compiled_rule {
            let (slots, initial) = match self.base.update_rule() {
                Some(r) => (r.slot_names(), r.initial_slot_values()),
                None => (&[][..], Vec::new()),
            };
            next_count = self.prepare_state(slots, &initial, shape)?;
        }
        // The plan's heap holds the state slots too (they are parameters,
        // updated in place); they are resident already, so the step
        // reserves the rest for its duration.
        let mut heap_bytes = runtime.executable().heap_bytes;
        if compiled_rule {
            heap_bytes = heap_bytes.saturating_sub(hbm::state_bytes(self.place.world_mut()));
        }
        let reservation = self.reserve(heap_bytes, &runtime.executable().name)?;
        let started = Instant::now();
        let result = self.run(&runtime, params, grads, compiled_rule, next_count, neg_lr);
        let seconds = started.elapsed().as_secs_f64();
        self.release(reservation)?;
        let out = result?;
        if compiled_rule
            && let Some((_, mut c)) = self.counts.iter_mut(self.place.world_mut()).next()
        {
            c.count = next_count;
        }
        self.profile.executions += 1;
        self.profile.execute_seconds += seconds;
        self.profile.last_execute_seconds = seconds;
        self.profile.bytes_moved += bytes;
        Ok(out)
    }

    fn run(
        &mut self,
        runtime: &Runtime,
        params: Arg<'_>,
        grads: Arg<'_>,
        compiled_rule: bool,
        next_count: i32,
        neg_lr: Option<A>,
    ) -> Result<RunOutput> {
        let TPUOptimizer {
            base,
            place,
            slots: slot_query,
            ..
        } = self;
        let world = place.world_mut();
        let mut handler = StepCall::<O, A> {
            base,
            _element: PhantomData,
        };
        if !compiled_rule {
            let mut outs = runtime.run(vec![params, grads], &mut handler)?;
            return Ok(outs.swap_remove(0));
        }
        let mut slots: Vec<Mut<'_, OptimizerSlot>> = slot_query.iter_mut(world).collect();
        slots.sort_by_key(|s| s.index);
        let mut args = Vec::with_capacity(slots.len() + 3);
        args.push(params);
        args.push(grads);
        if let Some(s) = slots
            .iter()
            .find(|s| s.tensor.dtype() != <A as Element>::DTYPE)
        {
            return Err(OptimError::Optimizer(OptimizerError::InvalidState {
                optimizer: base_name(handler.base),
                reason: format!("slot `{}` does not hold {}", s.name, <A as Element>::DTYPE),
            }));
        }
        for s in slots.iter_mut() {
            if let Some(a) = A::array_mut(&mut s.tensor) {
                args.push(Arg::donated(a));
            }
        }
        args.push(Arg::owned(Tensor::scalar(
            DType::I32,
            f64::from(next_count),
        )));
        if let Some(neg_lr) = neg_lr {
            args.push(Arg::owned(Tensor::scalar(
                <A as Element>::DTYPE,
                neg_lr.as_f64(),
            )));
        }
        let outs = runtime.run(args, &mut handler)?;
        let mut outs = outs.into_iter();
        let first = outs.next().ok_or_else(|| {
            OptimError::Optimizer(OptimizerError::InvalidState {
                optimizer: "tpu".into(),
                reason: "the program returned no params".into(),
            })
        })?;
        for (slot, out) in slots.iter_mut().zip(outs) {
            if let RunOutput::Owned(t) = out {
                slot.tensor = t;
            }
        }
        Ok(first)
    }

    fn reserve(&mut self, bytes: usize, program: &str) -> Result<Option<(Entity, usize)>> {
        if bytes == 0 {
            return Ok(None);
        }
        let Some(&device) = self.devices.first() else {
            return Err(OptimError::InvalidConfig(
                "the optimizer has no device".into(),
            ));
        };
        let world = self.place.world_mut();
        let block = hbm::reserve(
            world,
            device,
            bytes,
            format_args!("the program `{program}`"),
        )?;
        self.record_reserve(device, block, program);
        Ok(Some((device, block.offset)))
    }

    /// Adds a reservation to the memory profile; the peak is taken while it is held.
    fn record_reserve(&mut self, device: Entity, block: Block, holder: &str) {
        let name = self.device_label(device);
        let world = self.place.world();
        let Some(heap) = world.get::<DeviceHeap>(device) else {
            return;
        };
        let used = heap.0.used_bytes() as u64;
        let peak = self
            .profile
            .memory
            .peak
            .as_ref()
            .is_none_or(|p| used > p.used_bytes);
        // The snapshot (two strings) only when it is the new peak: this
        // runs on every step.
        let snapshot = peak.then(|| HbmSnapshot {
            device: name.clone(),
            program: holder.to_owned(),
            reserved_bytes: block.size as u64,
            used_bytes: used,
            free_bytes: heap.0.free_bytes() as u64,
            largest_free_bytes: heap.0.largest_free() as u64,
            capacity_bytes: heap.0.capacity() as u64,
        });
        self.profile.memory.record(MemoryEvent {
            kind: MemoryEventKind::Reserve,
            device: name,
            bytes: block.size as u64,
            offset: block.offset as u64,
            used_after: used,
        });
        if let Some(snapshot) = snapshot {
            self.profile.memory.peak = Some(snapshot);
        }
    }

    /// `device 0 (v4)`, formatted once per device (keyed by entity and
    /// device id, so a world restored under the optimizer cannot make a
    /// label stale).
    fn device_label(&mut self, device: Entity) -> String {
        let id = self.place.world().get::<Device>(device).map(|d| d.id.0);
        if let Some((_, _, name)) = self
            .device_labels
            .iter()
            .find(|(e, i, _)| *e == device && *i == id)
        {
            return name.clone();
        }
        let name = hbm::device_name(self.place.world(), device);
        self.device_labels.push((device, id, name.clone()));
        name
    }

    fn release(&mut self, reservation: Option<(Entity, usize)>) -> Result<()> {
        let Some((device, offset)) = reservation else {
            return Ok(());
        };
        let world = self.place.world_mut();
        let released = hbm::release(world, device, offset)?;
        let used_after = world
            .get::<DeviceHeap>(device)
            .map_or(0, |h| h.0.used_bytes() as u64);
        let device_name = self.device_label(device);
        self.profile.memory.record(MemoryEvent {
            kind: MemoryEventKind::Release,
            device: device_name,
            bytes: released as u64,
            offset: offset as u64,
            used_after,
        });
        Ok(())
    }
}

fn base_name<A, O: Optimizer<A, IxDyn>>(o: &O) -> String {
    o.name().to_owned()
}

fn into_array<A: Element, D: Dimension>(t: Tensor, dim: D) -> Result<Array<A, D>> {
    let ty = t.tensor_type();
    let a = A::from_tensor(t).map_err(|t| {
        OptimError::Optimizer(OptimizerError::InvalidState {
            optimizer: "tpu".into(),
            reason: format!(
                "the program returned {}, expected {}",
                t.tensor_type(),
                <A as Element>::DTYPE
            ),
        })
    })?;
    a.into_shape_with_order(dim).map_err(|e| {
        OptimError::Optimizer(OptimizerError::InvalidState {
            optimizer: "tpu".into(),
            reason: format!("the program returned {ty}: {e}"),
        })
    })
}

impl<O, A, D> Optimizer<A, D> for TPUOptimizer<O, A>
where
    O: Optimizer<A, IxDyn>,
    A: FloatElement + Element,
    D: Dimension,
{
    fn step(
        &mut self,
        params: &Array<A, D>,
        grads: &Array<A, D>,
    ) -> crate::optimizers::Result<Array<A, D>> {
        Ok(self.tpu_step(params, grads)?)
    }

    fn step_in_place(
        &mut self,
        params: &mut Array<A, D>,
        grads: &Array<A, D>,
    ) -> crate::optimizers::Result<()> {
        Ok(self.tpu_step_in_place(params, grads)?)
    }

    fn learning_rate(&self) -> A {
        self.base.learning_rate()
    }

    fn set_learning_rate(&mut self, lr: A) {
        self.base.set_learning_rate(lr);
    }

    fn name(&self) -> &str {
        self.base.name()
    }

    fn reset(&mut self) {
        self.reset_state();
    }

    fn update_rule(&self) -> Option<&dyn UpdateRule<A>> {
        self.base.update_rule()
    }
}
