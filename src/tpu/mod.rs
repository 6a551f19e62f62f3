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
//! * **Which step to call.** [`TPUOptimizer::tpu_step_in_place`] is the
//!   fast path: the params are donated (as with XLA's `donate_argnums`),
//!   nothing is allocated and the step runs at 1.2–1.4× the machine's
//!   streaming floor for SGD and Adam at 1e7 (`BENCHMARKS.md`).
//!   [`TPUOptimizer::tpu_step`] returns a fresh array; a large fresh
//!   output costs new pages from the kernel every step (zeroed, 2–3× the
//!   in-place time at 1e7) unless the caller hands the previous output
//!   back with [`TPUOptimizer::recycle`], which brings the fresh step to
//!   about 1.2× the in-place one.
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
mod cache;
mod config;
pub mod graph;
pub mod hbm;
pub mod profile;
pub mod sharded;
pub mod state;
mod step;
mod world_state;

use std::marker::PhantomData;
use std::sync::Arc;

use bevy_ecs::prelude::*;
use ndarray::{Array, Dimension, IxDyn};

use crate::error::Result;
use crate::exec::runtime::Element;
use crate::ir::Tensor;
use crate::memory::HbmUsage;
use crate::optimizers::{FloatElement, Optimizer, UpdateRule};
use crate::persist::WorldSnapshot;
use crate::pod::Pod;

pub use bench::{OptimizerBench, bench_optimizer};
pub use config::{DEFAULT_CACHE_CAPACITY, TPUConfig, TPUVersion};
pub use profile::{
    CacheStats, HbmSnapshot, MEMORY_TIMELINE_CAPACITY, MemoryEvent, MemoryEventKind, TpuProfile,
};
pub use sharded::{ShardedOptimizer, ShardedStepReport, ShardingConfig};
pub use world_state::tpu_registry;

use cache::ProgramCache;
use state::{OptimizerCount, OptimizerSlot};
use world_state::Place;

/// Arrays [`TPUOptimizer::recycle`] keeps for the next fresh outputs.
pub const MAX_SPARE_OUTPUTS: usize = 2;

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
    resident_slots: hbm::ResidentSlots,
    /// The base's learning rate (bits) and the run-time learning-rate
    /// scalar its rule applies (`None`: the rule has none, or no rule).
    learning_rate: Option<(u64, Option<A>)>,
    /// Device names for the memory profile, formatted once.
    device_labels: Vec<(Entity, Option<u32>, Arc<str>)>,
    /// Outputs handed back with [`TPUOptimizer::recycle`], which the next
    /// fresh-output steps write into.
    spare_outputs: Vec<crate::memory::buffers::SpareBuffer>,
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

impl<O, A> TPUOptimizer<O, A>
where
    O: Optimizer<A, IxDyn>,
    A: FloatElement + Element,
{
    /// Wraps `base` after checking `config`; spawns one device entity per
    /// chip, each with its HBM heap.
    pub fn new(base: O, config: TPUConfig) -> Result<Self> {
        let chips = config.validate()?;
        let (world, devices) = world_state::own_devices(&config, chips)?;
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
        let devices = world_state::pod_devices(&config, chips, &mut pod)?;
        Ok(Self::with_place(base, config, Place::Pod(pod), devices))
    }

    fn with_place(base: O, config: TPUConfig, mut place: Place, devices: Vec<Entity>) -> Self {
        let cache = ProgramCache::new(config.cache_capacity);
        let counts = place.world_mut().query();
        let slots = place.world_mut().query();
        let resident_slots = place.world_mut().query_filtered();
        TPUOptimizer {
            base,
            config,
            counts,
            slots,
            resident_slots,
            place,
            devices,
            cache,
            profile: TpuProfile::default(),
            learning_rate: None,
            device_labels: Vec::new(),
            spare_outputs: Vec::new(),
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
        self.device_entity_by_id(id)
            .and_then(|e| self.place.world().get::<HbmUsage>(e))
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
        self.stored_count()
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
        self.adopt_restored_world()?;
        self.step_fresh(params, grads)
    }

    /// Hands back an array a [`TPUOptimizer::tpu_step`] returned (or any
    /// array of the element type) that the caller no longer needs: the
    /// next fresh-output step writes its result into that memory instead of
    /// new pages, as XLA's allocator reuses a dropped buffer. At most
    /// [`MAX_SPARE_OUTPUTS`] are kept (the newest); an array not in
    /// standard layout is dropped.
    ///
    /// ```
    /// # use ndarray::Array1;
    /// # use optirs_tpu::optimizers::SGD;
    /// # use optirs_tpu::{TPUConfig, TPUOptimizer};
    /// let mut opt = TPUOptimizer::new(SGD::new(0.1f32), TPUConfig::default())?;
    /// let g = Array1::from_elem(1 << 20, 1e-3f32);
    /// let mut p = Array1::from_elem(1 << 20, 1.0f32);
    /// for _ in 0..3 {
    ///     let next = opt.tpu_step(&p, &g)?;
    ///     opt.recycle(std::mem::replace(&mut p, next)); // the old params' pages are reused
    /// }
    /// # Ok::<(), optirs_tpu::OptimError>(())
    /// ```
    pub fn recycle<D: Dimension>(&mut self, array: Array<A, D>) {
        if !array.is_standard_layout() {
            return;
        }
        let (v, offset) = array.into_raw_vec_and_offset();
        if offset.unwrap_or(0) != 0 {
            return;
        }
        self.spare_outputs.push(Box::new(v));
        if self.spare_outputs.len() > MAX_SPARE_OUTPUTS {
            self.spare_outputs.remove(0);
        }
    }

    /// One step that overwrites `params` (a donated buffer: the program
    /// writes the new params over the old ones).
    pub fn tpu_step_in_place<D: Dimension>(
        &mut self,
        params: &mut Array<A, D>,
        grads: &Array<A, D>,
    ) -> Result<()> {
        self.adopt_restored_world()?;
        self.step_donated(params, grads)
    }

    /// Drops the optimizer state (the next step starts at count 0) and
    /// releases its HBM.
    pub fn reset_state(&mut self) {
        self.drop_state();
    }

    /// A snapshot of the world: devices and optimizer state (the whole pod
    /// for an optimizer on a pod).
    pub fn snapshot(&mut self) -> Result<WorldSnapshot> {
        self.capture()
    }

    /// Shards a whole model's update over every device of the pod this
    /// optimizer was built on ([`TPUOptimizer::on_pod`]): the same base
    /// optimizer and configuration, as a [`ShardedOptimizer`]. Single-tensor
    /// state this optimizer held on the pod is released first. An optimizer
    /// with its own devices (built with [`TPUOptimizer::new`]) has no pod to
    /// shard over: an error.
    pub fn into_sharded(
        mut self,
        params: crate::sharding::ParamSet<A>,
        sharding: ShardingConfig,
    ) -> Result<ShardedOptimizer<O, A>> {
        if matches!(self.place, Place::Own(_)) {
            return Err(crate::error::OptimError::invalid_config(
                "this optimizer runs on its own devices; build it with TPUOptimizer::on_pod to \
                 shard a model over a pod",
            ));
        }
        self.drop_state();
        let TPUOptimizer {
            base,
            config,
            place,
            ..
        } = self;
        let Place::Pod(pod) = place else {
            unreachable!("checked above")
        };
        ShardedOptimizer::with_config(base, config, pod, params, sharding)
    }

    /// Restores a snapshot taken by [`TPUOptimizer::snapshot`]; verified
    /// before the world is touched. The device heaps are rebuilt with the
    /// restored state resident, and [`HbmUsage`] follows them.
    pub fn restore(&mut self, snapshot: &WorldSnapshot) -> Result<()> {
        self.restore_world(snapshot)
    }
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
        self.tpu_step(params, grads)
    }

    fn step_in_place(
        &mut self,
        params: &mut Array<A, D>,
        grads: &Array<A, D>,
    ) -> crate::optimizers::Result<()> {
        self.tpu_step_in_place(params, grads)
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
