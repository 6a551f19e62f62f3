//! [`ShardedOptimizer`]: a whole model's optimizer sharded over every
//! device of a pod, the host side of [`crate::sharding`]: it builds the
//! layout, compiles one fused update per shard length, launches each step
//! and steps the pod until the step's systems finish it.
//!
//! ```
//! use ndarray::{ArrayD, IxDyn};
//! use optirs_tpu::optimizers::Adam;
//! use optirs_tpu::sharding::{ParamSet, SyntheticGradients};
//! use optirs_tpu::tpu::{ShardedOptimizer, ShardingConfig};
//! use optirs_tpu::{Pod, TPUConfig, TPUVersion};
//!
//! let pod = Pod::from_preset("v4-8")?; // 8 chips, 16 TensorCores
//! let params = ParamSet::new()
//!     .with("w", ArrayD::from_elem(IxDyn(&[3, 5]), 0.5f32))?
//!     .with("b", ArrayD::from_elem(IxDyn(&[5]), 0.0f32))?;
//! let config = TPUConfig { tpu_version: TPUVersion::V4, num_cores: 16, ..Default::default() };
//! let mut opt = ShardedOptimizer::new(Adam::new(1e-3f32), config, pod, params, ShardingConfig::default())?;
//! let grads = SyntheticGradients { seed: 7, step: 1, replicas: 8, scale: 1.0 };
//! let report = opt.step(&grads)?;
//! assert_eq!(report.step, 1);
//! assert_eq!(opt.step_count(), 1);
//! assert!(report.modeled_seconds > 0.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bevy_ecs::world::World;
use ndarray::IxDyn;
use serde::Serialize;

use crate::collectives::pod::{multislice_of, torus_of};
use crate::compiler;
use crate::error::{OptimError, Result};
use crate::exec::runtime::{Element, Runtime};
use crate::health::{DeviceState, Excluded};
use crate::memory::device as hbm;
use crate::optimizers::{FloatElement, Optimizer, UpdateRule};
use crate::persist::{SnapshotRegistry, WorldSnapshot};
use crate::pod::Pod;
use crate::pod::ranks::RankedPod;
use crate::sharding::Span;
use crate::sharding::model::{
    flat_tensor, gather_state, install_model, model_mut, model_of, replace_model,
};
use crate::sharding::step::{LaunchRequest, launch_step};
use crate::sharding::{
    DEFAULT_BUCKET_BYTES, GradientSource, ParamSet, RecoveryPolicy, RecoveryRecord,
    ReducedGradients, Reduction, ReplicaGradients, ShardLayout, ShardPlan, ShardProgram,
    ShardedModel, ShardedStep, ShardingError, SlotValues, StepOutcome,
};
use crate::topology::{DeviceId, HbmCapacity};

use super::{TPUConfig, graph};

/// How a model is bucketed and its gradients reduced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardingConfig {
    /// Bytes per bucket (rounded down to whole elements, a multiple of the
    /// device count); [`DEFAULT_BUCKET_BYTES`] by default.
    pub bucket_bytes: usize,
    /// Sum or mean of the replicas' gradients (mean by default).
    pub reduction: Reduction,
    /// What the pod does when a step fails (roll back by default).
    pub recovery: RecoveryPolicy,
}

impl Default for ShardingConfig {
    fn default() -> Self {
        ShardingConfig {
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            reduction: Reduction::Mean,
            recovery: RecoveryPolicy::Rollback,
        }
    }
}

/// What one sharded step did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShardedStepReport {
    /// Step number (1-based).
    pub step: u64,
    /// Launch, simulated ns.
    pub launched_at_ns: u64,
    /// Completion, simulated ns.
    pub completed_at_ns: u64,
    /// Modeled step time, seconds.
    pub modeled_seconds: f64,
    /// Modeled seconds per phase (`reduce_scatter.axis0`, `update`,
    /// `all_gather.axis0`, …, `exposed_communication`), summed over buckets.
    pub phases: BTreeMap<String, f64>,
    /// Bytes the step put on the links.
    pub link_bytes: u64,
    /// HBM in use on each device during the step.
    pub hbm_bytes_per_device: Vec<(u32, u64)>,
    /// Buckets.
    pub buckets: usize,
    /// Wall time on this CPU, seconds (launch, ticks and update).
    pub wall_seconds: f64,
    /// The modeled schedule: every bucket's phases, seconds from launch
    /// (the same on every device of the symmetric torus).
    #[serde(skip)]
    pub spans: Vec<Span>,
}

/// A model's optimizer sharded over a pod (module docs).
pub struct ShardedOptimizer<O, A = f32> {
    base: O,
    config: TPUConfig,
    sharding: ShardingConfig,
    pod: Driver,
    programs: BTreeMap<usize, ShardProgram>,
    compile_seconds: f64,
    checkpoints: Option<StepCheckpoints>,
    _element: PhantomData<fn() -> A>,
}

/// Checkpoints written at step boundaries ([`ShardedOptimizer::enable_step_checkpoints`]).
#[derive(Debug, Clone)]
struct StepCheckpoints {
    every_ns: u64,
    root: PathBuf,
    keep: usize,
    /// When the last write started (or the run did), ns.
    last_started_ns: u64,
    /// The tick label of the newest checkpoint written.
    last_label: Option<u64>,
}

/// One checkpoint write at a step boundary.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointWrite {
    /// The model was captured, and the write began, ns.
    pub started_at_ns: u64,
    /// The write ended (its modeled end, or the loss that voided it), ns.
    pub ended_at_ns: u64,
    /// Where it went.
    pub outcome: WriteOutcome,
}

/// How a checkpoint write ended.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteOutcome {
    /// On disk, verified by its manifest.
    Written {
        /// The checkpoint's directory.
        path: PathBuf,
        /// What retention could not do (each names the path).
        retention_problems: Vec<String>,
    },
    /// A device of the model was lost before the write's end: nothing
    /// reached disk.
    Voided {
        /// The device lost.
        device: DeviceId,
    },
}

/// The checkpoint a run resumed from ([`ShardedOptimizer::resume`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Resumed {
    /// Its directory.
    pub path: PathBuf,
    /// The steps it holds.
    pub steps_completed: u64,
    /// Its simulated time, ns.
    pub at_ns: u64,
}

impl<O, A> std::fmt::Debug for ShardedOptimizer<O, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedOptimizer")
            .field("config", &self.config)
            .field("sharding", &self.sharding)
            .field("programs", &self.programs.len())
            .finish()
    }
}

/// The pod a sharded optimizer steps: all of it in this process, or this
/// rank's part of a pod split over ranks.
enum Driver {
    One(Pod),
    Ranked(RankedPod),
}

impl Driver {
    fn pod(&self) -> &Pod {
        match self {
            Driver::One(pod) => pod,
            Driver::Ranked(ranked) => ranked.pod(),
        }
    }

    fn pod_mut(&mut self) -> &mut Pod {
        match self {
            Driver::One(pod) => pod,
            Driver::Ranked(ranked) => ranked.pod_mut(),
        }
    }

    fn world(&self) -> &bevy_ecs::world::World {
        self.pod().world()
    }

    fn world_mut(&mut self) -> &mut bevy_ecs::world::World {
        self.pod_mut().world_mut()
    }

    fn clock(&self) -> &crate::clock::SimClock {
        self.pod().clock()
    }

    /// Advances to simulated time `until_ns` exactly, or until `done`
    /// holds; in one process idle ticks are skipped (bit for bit the same
    /// world), so waiting out a long recovery — a cube swap's seconds at
    /// microsecond ticks — costs only the ticks where something happens.
    /// A split pod steps every tick in lockstep (its exact stops, a step's
    /// end or a recovery's, are the same on every rank).
    fn advance_until(&mut self, until_ns: u64, done: impl Fn(&World) -> bool) -> Result<()> {
        match self {
            Driver::One(pod) => pod.advance_until(until_ns, done).map(|_| ()),
            Driver::Ranked(ranked) => {
                // The host's target is an exact stop, as in one process:
                // the last tick ends at `until_ns`, on a boundary or not.
                fn set_target(ranked: &mut RankedPod, target: Option<u64>) -> Option<u64> {
                    let world = ranked.pod_mut().world_mut();
                    let mut stops = world.resource_mut::<crate::clock::ExactStops>();
                    std::mem::replace(&mut stops.host_ns, target)
                }
                let previous = set_target(ranked, Some(until_ns));
                let mut stepped = Ok(());
                while ranked.pod().clock().now_ns < until_ns && !done(ranked.pod().world()) {
                    stepped = ranked.step().map(|_| ());
                    if stepped.is_err() {
                        break;
                    }
                }
                set_target(ranked, previous);
                stepped
            }
        }
    }

    fn snapshot(&mut self) -> Result<WorldSnapshot> {
        self.whole("a snapshot")?;
        self.pod_mut().snapshot()
    }

    fn restore_snapshot(&mut self, snapshot: &WorldSnapshot) -> Result<()> {
        self.whole("restoring a snapshot")?;
        self.pod_mut().restore_snapshot(snapshot)
    }

    /// Refuses what needs the whole world in this process.
    fn whole(&self, operation: &str) -> Result<()> {
        match self {
            Driver::One(_) => Ok(()),
            Driver::Ranked(ranked) => Err(OptimError::from(crate::error::Unsupported {
                operation: format!("{operation} of a sharded optimizer split over ranks"),
                reason: format!(
                    "rank {} holds only its devices' state shards; gather the world on rank 0 \
                     (`ranked_mut().gather()`) or write a split checkpoint \
                     (`ranked_mut().save_checkpoint(..)`)",
                    ranked.layout().rank()
                ),
            })),
        }
    }
}

/// The devices a model is sharded over and how: the whole torus when every
/// device is up and not excluded, otherwise a ring of the others. On a
/// multislice pod every device, hierarchically (ICI inside each slice, DCN
/// across); a multislice pod with a device down is refused (a ring across
/// slices is not built).
pub fn participants(pod: &mut Pod) -> Result<(Vec<DeviceId>, ShardPlan)> {
    let multislice = pod.topology().slices > 1;
    let (shape, plan) = if multislice {
        let ms = multislice_of(pod.topology())?;
        let plan = ShardPlan::Multislice {
            dims: ms.slice().dims().to_vec(),
            wraparound: ms.slice().wraparound().to_vec(),
            slices: ms.slices(),
        };
        (ms.grid(), plan)
    } else {
        let shape = torus_of(pod.topology())?;
        let plan = ShardPlan::Torus {
            dims: shape.dims().to_vec(),
            wraparound: shape.wraparound().to_vec(),
        };
        (shape, plan)
    };
    let world = pod.world_mut();
    let mut q = world.query::<(&crate::topology::Device, &DeviceState, Option<&Excluded>)>();
    let mut up: Vec<DeviceId> = q
        .iter(world)
        .filter(|(_, s, x)| !matches!(s, DeviceState::Killed { .. }) && x.is_none())
        .map(|(d, _, _)| d.id)
        .collect();
    up.sort();
    if up.len() == shape.device_count() {
        return Ok((up, plan));
    }
    if multislice {
        return Err(ShardingError::Devices {
            reason: format!(
                "{} of {} devices are up: a sharded model on a multislice pod spans every \
                 device (re-sharding around a lost device across slices is not built)",
                up.len(),
                shape.device_count()
            ),
        }
        .into());
    }
    let ring: Vec<DeviceId> = shape
        .snake_ring()
        .into_iter()
        .map(|d| DeviceId(d as u32))
        .filter(|d| up.binary_search(d).is_ok())
        .collect();
    Ok((up, ShardPlan::Ring { ring }))
}

impl<O, A> ShardedOptimizer<O, A>
where
    O: Optimizer<A, IxDyn>,
    A: FloatElement + Element,
{
    /// Shards `params` and `base`'s state over every device of `pod`.
    /// `config.num_cores` must name all the pod's chips (the collectives
    /// span the whole torus) and `config.tpu_version` its generation;
    /// `config.hbm_bytes`, if set, becomes every device's HBM.
    pub fn new(
        base: O,
        config: TPUConfig,
        pod: Pod,
        params: ParamSet<A>,
        sharding: ShardingConfig,
    ) -> Result<Self> {
        Self::build(base, config, Driver::One(pod), params, sharding)
    }

    /// [`ShardedOptimizer::new`] on this rank's part of a pod split over
    /// ranks ([`RankedPod`]): every rank calls it with the same model and
    /// configuration (the parameters are the replicated initial values),
    /// then steps in lockstep with the others. Each rank keeps its own
    /// devices' state shards; a step reduce-scatters the gradients its
    /// replicas give and all-gathers the updated parameters across the
    /// ranks ([`crate::sharding::ranked`]), bit for bit the one-process
    /// step.
    pub fn new_ranked(
        base: O,
        config: TPUConfig,
        pod: RankedPod,
        params: ParamSet<A>,
        sharding: ShardingConfig,
    ) -> Result<Self> {
        let mut opt = Self::build(base, config, Driver::Ranked(pod), params, sharding)?;
        if let Driver::Ranked(ranked) = &mut opt.pod {
            ranked.hold_own_shards();
        }
        Ok(opt)
    }

    fn build(
        base: O,
        config: TPUConfig,
        mut driver: Driver,
        params: ParamSet<A>,
        sharding: ShardingConfig,
    ) -> Result<Self> {
        let pod = driver.pod_mut();
        let chips = config.validate()?;
        let topology = pod.topology();
        if topology.generation != config.tpu_version {
            return Err(OptimError::invalid_config(format!(
                "the optimizer is configured for {}, but {} is a {} pod",
                config.tpu_version, topology.name, topology.generation
            )));
        }
        let devices = topology.num_devices() as usize;
        if chips != devices {
            let per_chip = config.tpu_version.spec().cores_per_chip as usize;
            return Err(OptimError::invalid_config(format!(
                "num_cores = {} names {chips} chips, but a sharded model spans every chip of \
                 {} ({devices} chips): use num_cores = {}",
                config.num_cores,
                topology.name,
                devices * per_chip
            )));
        }
        let rule = base
            .update_rule()
            .ok_or_else(|| ShardingError::NoUpdateRule {
                optimizer: base.name().to_owned(),
            })?;
        let slots: Vec<String> = rule.slot_names().iter().map(|s| s.to_string()).collect();
        let initial = rule.initial_slot_values();
        let (participants, plan) = participants(pod)?;
        let layout = ShardLayout::new(
            <A as Element>::DTYPE,
            &params.shapes(),
            sharding.bucket_bytes,
            participants,
            plan,
        )?;
        let world = pod.world_mut();
        if let Some(bytes) = config.hbm_bytes {
            let mut q = world.query_filtered::<bevy_ecs::prelude::Entity, bevy_ecs::prelude::With<crate::topology::Device>>();
            let all: Vec<_> = q.iter(world).collect();
            for device in all {
                world.entity_mut(device).insert(HbmCapacity(bytes));
            }
        }
        let entities: Vec<_> = layout
            .participants
            .iter()
            .filter_map(|&d| world.resource::<crate::topology::DeviceIndex>().get(d))
            .collect();
        hbm::mark(world, &entities);
        hbm::rebuild_heaps(world)?;
        let mut flat = params.to_flat();
        flat.resize(layout.padded_elements(), A::ZERO);
        let model = ShardedModel {
            optimizer: base.name().to_owned(),
            slots,
            layout,
            params: flat_tensor(flat),
            count: 0,
            steps_completed: 0,
            steps_failed: 0,
            reduction: sharding.reduction,
            bucket_bytes: sharding.bucket_bytes,
            recovery: sharding.recovery,
            recoveries: Vec::new(),
            recovering_until_ns: 0,
        };
        install_model(world, model, SlotValues::Initial(initial))?;
        let mut opt = ShardedOptimizer {
            base,
            config,
            sharding,
            pod: driver,
            programs: BTreeMap::new(),
            compile_seconds: 0.0,
            checkpoints: None,
            _element: PhantomData,
        };
        opt.compile_programs()?;
        Ok(opt)
    }

    /// Compiles the update for every shard length the layout has.
    fn compile_programs(&mut self) -> Result<()> {
        let mut lengths: Vec<usize> = self.layout()?.buckets.iter().map(|b| b.shard_len).collect();
        let rule = self
            .base
            .update_rule()
            .ok_or_else(|| ShardingError::NoUpdateRule {
                optimizer: self.base.name().to_owned(),
            })?;
        lengths.sort_unstable();
        lengths.dedup();
        self.programs.retain(|len, _| lengths.contains(len));
        for len in lengths {
            if self.programs.contains_key(&len) {
                continue;
            }
            let started = Instant::now();
            let runtime = compile_update(rule, len)?;
            self.compile_seconds += started.elapsed().as_secs_f64();
            self.programs.insert(len, ShardProgram { runtime });
        }
        Ok(())
    }

    /// The model's layout.
    pub fn layout(&self) -> Result<&ShardLayout> {
        Ok(&self.model()?.layout)
    }

    fn model(&self) -> Result<&ShardedModel> {
        Ok(model_of(self.pod.world()).ok_or(ShardingError::NoModel)?)
    }

    /// One data-parallel step with the replicas' gradients from `grads`:
    /// launched, then the pod is stepped until the step's systems complete
    /// it. On `Err` no parameter, state or count changed; a failure in
    /// flight is [`ShardingError::StepFailed`], naming the device (or link)
    /// and the phase.
    pub fn step(&mut self, grads: &dyn GradientSource<A>) -> Result<ShardedStepReport> {
        let started = Instant::now();
        self.wait_for_recovery()?;
        self.compile_programs()?;
        let learning_rate = self
            .base
            .update_rule()
            .and_then(|r| graph::learning_rate_scalar(r));
        let request = LaunchRequest {
            gradients: grads,
            programs: &self.programs,
            learning_rate,
        };
        let launched = launch_step(self.pod.world_mut(), request)?;
        let (number, completes_at_ns, failed_at_launch) = (
            launched.number,
            launched.completes_at_ns,
            !launched.is_pending(),
        );
        if failed_at_launch {
            // Failed at launch: the recovery policy runs now, as the
            // `Recovery` set would after a failure in flight.
            crate::recovery::recover_sharded_model(self.pod.world_mut());
        }
        let pending = |w: &World| {
            w.get_resource::<ShardedStep>()
                .is_none_or(|s| s.is_pending())
        };
        self.pod.advance_until(completes_at_ns, |w| !pending(w))?;
        loop {
            let world = self.pod.world();
            let step = world
                .get_resource::<ShardedStep>()
                .ok_or(ShardingError::NoModel)?;
            match &step.outcome {
                StepOutcome::Pending => {
                    // Due now: its systems complete it in the next run of
                    // the schedule, at this same time.
                    let clock = self.pod.clock();
                    if clock.now_ns > completes_at_ns {
                        return Err(ShardingError::Stalled {
                            step: number,
                            completes_at_ns,
                            now_ns: clock.now_ns,
                        }
                        .into());
                    }
                    self.pod
                        .advance_until(completes_at_ns.saturating_add(1), |w| !pending(w))?;
                }
                StepOutcome::Completed { at_ns } => {
                    let model = self.model()?;
                    return Ok(ShardedStepReport {
                        step: number,
                        launched_at_ns: step.launched_at_ns,
                        completed_at_ns: *at_ns,
                        modeled_seconds: step.timeline.step_seconds,
                        phases: step.timeline.phases.clone(),
                        link_bytes: step.link_bytes,
                        hbm_bytes_per_device: step
                            .hbm_bytes
                            .iter()
                            .map(|(d, b)| (d.0, *b))
                            .collect(),
                        buckets: model.layout.buckets.len(),
                        wall_seconds: started.elapsed().as_secs_f64(),
                        spans: step.timeline.spans.clone(),
                    });
                }
                StepOutcome::Failed {
                    at_ns,
                    phase,
                    cause,
                } => {
                    let error = ShardingError::StepFailed {
                        step: number,
                        phase: *phase,
                        at_ns: *at_ns,
                        cause: cause.clone(),
                    };
                    let error = match step.recovery.clone() {
                        Some(Err(reason)) => ShardingError::Unrecoverable {
                            step: number,
                            cause: cause.clone(),
                            reason,
                        },
                        _ => error,
                    };
                    if let Some(mut model) = model_mut(self.pod.world_mut()) {
                        model.steps_failed += 1;
                    }
                    return Err(error.into());
                }
            }
        }
    }

    /// Steps the pod until a recovery in progress is over (its modeled
    /// time has passed).
    fn wait_for_recovery(&mut self) -> Result<()> {
        let until = self.model()?.recovering_until_ns;
        self.pod.advance_until(until, |_| false)
    }

    /// Every recovery so far (policy, lost devices and steps, modeled
    /// seconds), oldest first.
    pub fn recoveries(&self) -> Vec<RecoveryRecord> {
        self.model()
            .map_or_else(|_| Vec::new(), |m| m.recoveries.clone())
    }

    /// Steps completed (a rollback lowers it to the checkpoint's).
    pub fn steps_completed(&self) -> u64 {
        self.model().map_or(0, |m| m.steps_completed)
    }

    /// [`ShardedOptimizer::step`] with one host-computed gradient set per
    /// replica (device id order).
    pub fn step_replicas(&mut self, grads: &[ParamSet<A>]) -> Result<ShardedStepReport> {
        self.step(&ReplicaGradients(grads))
    }

    /// [`ShardedOptimizer::step`] with a gradient the host already reduced
    /// over the replicas ([`ReducedGradients`]).
    pub fn step_reduced(&mut self, grads: &ParamSet<A>) -> Result<ShardedStepReport> {
        self.step(&ReducedGradients(grads))
    }

    /// The parameters (every replica holds these).
    pub fn params(&self) -> Result<ParamSet<A>> {
        Ok(self.model()?.param_set()?)
    }

    /// The parameters, flat in model order.
    pub fn flat_params(&self) -> Result<Vec<A>> {
        Ok(self.model()?.flat_params::<A>()?.to_vec())
    }

    /// optax's step count.
    pub fn step_count(&self) -> i32 {
        self.model().map_or(0, |m| m.count)
    }

    /// Optimizer-state slot `name` gathered from every device's shard,
    /// flat in model order (`None` for a slot the optimizer does not have).
    pub fn state(&mut self, name: &str) -> Result<Option<Vec<A>>> {
        let model = self.model()?;
        let Some(index) = model.slots.iter().position(|s| s == name) else {
            return Ok(None);
        };
        let elements = model.layout.elements;
        self.pod.whole("gathering optimizer state")?;
        let mut flat = gather_state::<A>(self.pod.world_mut())?;
        let mut slot = flat.swap_remove(index);
        slot.truncate(elements);
        Ok(Some(slot))
    }

    /// A snapshot of the whole pod: devices, health, the model, every
    /// device's state shards (tensors in the safetensors side file when
    /// written as a checkpoint).
    pub fn snapshot(&mut self) -> Result<WorldSnapshot> {
        self.pod.snapshot()
    }

    /// Restores a snapshot of this same pod (verified first; another pod or
    /// topology is an error naming both): the run resumes bit for bit.
    pub fn restore(&mut self, snapshot: &WorldSnapshot) -> Result<()> {
        self.pod.restore_snapshot(snapshot)?;
        if model_of(self.pod.world()).is_none() {
            return Err(ShardingError::Recovery {
                reason: "the snapshot holds no sharded model".into(),
            }
            .into());
        }
        self.compile_programs()
    }

    /// Loads the model of a snapshot taken on any pod (another device
    /// count, another topology) and re-shards it over this optimizer's
    /// devices, as Orbax and DCP re-shard on load: parameters, state and
    /// count come from the snapshot; this pod's time and health stay. The
    /// snapshot is verified and its model checked (same tensors, element
    /// type and optimizer) before anything changes; on `Err` nothing did.
    pub fn restore_resharded(&mut self, snapshot: &WorldSnapshot) -> Result<()> {
        self.pod.whole("re-sharding a snapshot")?;
        let registry = self.pod.world().resource::<SnapshotRegistry>();
        registry.verify(snapshot)?;
        let mut scratch = bevy_ecs::world::World::new();
        registry.restore(&mut scratch, snapshot)?;
        let theirs = model_of(&scratch)
            .ok_or_else(|| ShardingError::Recovery {
                reason: "the snapshot holds no sharded model".into(),
            })?
            .clone();
        let ours = self.model()?.clone();
        let mismatch = if theirs.layout.tensors != ours.layout.tensors {
            Some("its tensors (names and shapes) differ from this model's".to_string())
        } else if theirs.layout.dtype != ours.layout.dtype {
            Some(format!(
                "it holds {} values, this model {}",
                theirs.layout.dtype, ours.layout.dtype
            ))
        } else if theirs.optimizer != ours.optimizer || theirs.slots != ours.slots {
            Some(format!(
                "it was trained with {}, this optimizer is {}",
                theirs.optimizer, ours.optimizer
            ))
        } else {
            None
        };
        if let Some(reason) = mismatch {
            return Err(ShardingError::Recovery {
                reason: format!("the snapshot's model does not fit: {reason}"),
            }
            .into());
        }
        let state = gather_state::<A>(&mut scratch)?;
        let elements = ours.layout.elements;
        let layout = ours.layout.clone();
        let padded = layout.padded_elements();
        let resize = |mut v: Vec<A>| {
            v.truncate(elements);
            v.resize(padded, A::ZERO);
            v
        };
        let params = resize(theirs.flat_params::<A>()?.to_vec());
        let state: Vec<Vec<A>> = state.into_iter().map(resize).collect();
        let next = ShardedModel {
            params: flat_tensor(params),
            count: theirs.count,
            steps_completed: theirs.steps_completed,
            steps_failed: theirs.steps_failed,
            recoveries: theirs.recoveries.clone(),
            recovering_until_ns: 0,
            ..ours
        };
        replace_model(self.pod.world_mut(), next, SlotValues::Flat(state))?;
        self.compile_programs()
    }

    /// Writes a checkpoint of the whole pod into `root` at the end of a
    /// step ([`ShardedOptimizer::checkpoint_if_due`]) once `every_ns` of
    /// simulated time have passed since the last write began, keeping the
    /// newest `keep`. A write costs simulated time, the model's bytes over
    /// the storage bandwidth ([`ShardedModel::checkpoint_io_seconds`]), and
    /// the model waits for it; the pod's rollback reads these checkpoints
    /// (and, before the first, the model as it is now, kept in memory).
    /// One process only (a split pod writes split periodic checkpoints).
    pub fn enable_step_checkpoints(
        &mut self,
        every_ns: u64,
        root: PathBuf,
        keep: usize,
    ) -> Result<()> {
        if every_ns == 0 || keep == 0 {
            return Err(OptimError::invalid_config(
                "checkpoints at step boundaries need an interval of at least 1 ns and keep >= 1",
            ));
        }
        // The `Recovery` set's rollback reads the roots from here; the
        // periodic system stays off (`every_ticks` 0).
        self.pod
            .world_mut()
            .insert_resource(crate::checkpoint::PeriodicCheckpoints {
                every_ticks: 0,
                roots: vec![root.clone()],
                max_checkpoints: keep,
                written: 0,
                last_error: None,
                retention_problems: Vec::new(),
            });
        let start = crate::sharding::model::StartingModel::capture::<A>(self.pod.world_mut())?;
        self.pod.world_mut().insert_resource(start);
        self.checkpoints = Some(StepCheckpoints {
            every_ns,
            root,
            keep,
            last_started_ns: self.pod.clock().now_ns,
            last_label: None,
        });
        Ok(())
    }

    /// Simulated seconds one checkpoint write (or read) of the model takes
    /// on this pod.
    pub fn checkpoint_seconds(&self) -> Result<f64> {
        let hosts = self.pod.pod().topology().num_hosts();
        Ok(self.model()?.checkpoint_io_seconds(hosts))
    }

    /// At a step boundary: writes a checkpoint if one is due
    /// ([`ShardedOptimizer::enable_step_checkpoints`]). The model is
    /// captured now; the pod advances to the write's modeled end (skipping
    /// idle ticks), and only then does the checkpoint reach disk. A device
    /// of the model lost before that voids the write. A disk error is an
    /// `Err` naming the path.
    pub fn checkpoint_if_due(&mut self) -> Result<Option<CheckpointWrite>> {
        let Some(config) = &self.checkpoints else {
            return Ok(None);
        };
        let now = self.pod.clock().now_ns;
        if now.saturating_sub(config.last_started_ns) < config.every_ns {
            return Ok(None);
        }
        // Two writes ending in one tick get consecutive labels, so the
        // newest is always the one rollback and retention take.
        let tick = self.pod.clock().tick;
        let label = config.last_label.map_or(tick, |l| tick.max(l + 1));
        let (root, keep) = (config.root.clone(), config.keep);
        let seconds = self.checkpoint_seconds()?;
        if let Driver::Ranked(_) = self.pod {
            return self.split_checkpoint(now, label, seconds, root, keep);
        }
        let snapshot = self.pod.pod_mut().snapshot_labeled(label)?;
        if let Some(c) = &mut self.checkpoints {
            c.last_started_ns = now;
        }
        let ends_at = now.saturating_add((seconds * 1e9).ceil() as u64);
        self.pod.advance_until(ends_at, |w| {
            crate::sharding::recovery::lost_participant(w).is_some()
        })?;
        let ended_at_ns = self.pod.clock().now_ns;
        if let Some(device) = crate::sharding::recovery::lost_participant(self.pod.world()) {
            return Ok(Some(CheckpointWrite {
                started_at_ns: now,
                ended_at_ns,
                outcome: WriteOutcome::Voided { device },
            }));
        }
        let name = crate::checkpoint::checkpoint_name(label);
        let pod_name = self.pod.pod().topology().name.clone();
        crate::checkpoint::write_checkpoint(&root, &name, &pod_name, &snapshot, &mut |_| Ok(()))?;
        let retention = crate::checkpoint::enforce_retention(&root, keep, &name);
        if let Some(c) = &mut self.checkpoints {
            c.last_label = Some(label);
        }
        Ok(Some(CheckpointWrite {
            started_at_ns: now,
            ended_at_ns,
            outcome: WriteOutcome::Written {
                path: root.join(name),
                retention_problems: retention.problems,
            },
        }))
    }

    /// [`ShardedOptimizer::checkpoint_if_due`] on a pod split over ranks:
    /// every rank writes its part of the world as it is now (rank 0 the
    /// commit record), then the ranks wait out the write's modeled time in
    /// lockstep. A loss before its end voids the write: rank 0 removes the
    /// checkpoint, so rollback and retention never see it, as in one
    /// process. The loss is read from the scenario every rank holds alike
    /// (device liveness), so every rank stops and decides together.
    fn split_checkpoint(
        &mut self,
        now: u64,
        label: u64,
        seconds: f64,
        root: PathBuf,
        keep: usize,
    ) -> Result<Option<CheckpointWrite>> {
        let name = crate::checkpoint::checkpoint_name(label);
        let Driver::Ranked(ranked) = &mut self.pod else {
            return Err(OptimError::invalid_config(
                "a split checkpoint needs a split pod",
            ));
        };
        let service = ranked.layout().runs_service();
        ranked.save_checkpoint_labeled(&root, &name, label)?;
        if let Some(c) = &mut self.checkpoints {
            c.last_started_ns = now;
        }
        let ends_at = now.saturating_add((seconds * 1e9).ceil() as u64);
        self.pod.advance_until(ends_at, |w| {
            crate::sharding::recovery::stopped_participant(w).is_some()
        })?;
        let ended_at_ns = self.pod.clock().now_ns;
        if let Some(device) = crate::sharding::recovery::stopped_participant(self.pod.world()) {
            if service {
                std::fs::remove_dir_all(root.join(&name)).map_err(|e| {
                    OptimError::invalid_config(format!(
                        "removing the voided checkpoint {}: {e}",
                        root.join(&name).display()
                    ))
                })?;
            }
            return Ok(Some(CheckpointWrite {
                started_at_ns: now,
                ended_at_ns,
                outcome: WriteOutcome::Voided { device },
            }));
        }
        let retention_problems = if service {
            crate::checkpoint::enforce_retention(&root, keep, &name).problems
        } else {
            Vec::new()
        };
        if let Some(c) = &mut self.checkpoints {
            c.last_label = Some(label);
        }
        Ok(Some(CheckpointWrite {
            started_at_ns: now,
            ended_at_ns,
            outcome: WriteOutcome::Written {
                path: root.join(name),
                retention_problems,
            },
        }))
    }

    /// Refuses a checkpoint root that holds another model's checkpoints
    /// (other tensors, element type, optimizer, reduction, buckets,
    /// recovery policy, or another pod), naming both, before any step: a
    /// run must not mix its checkpoints with another's, nor let retention
    /// delete its own for them. Checkpoints that do not verify are left to
    /// rollback, which skips them.
    pub fn check_checkpoint_root(&self, root: &Path) -> Result<()> {
        if !root.exists() {
            return Ok(());
        }
        let ours = self.model()?;
        let our_pod = self.pod.pod().topology().name.clone();
        let registry = self.pod.world().resource::<SnapshotRegistry>();
        for listing in crate::checkpoint::list_checkpoints(root, registry)? {
            if listing.problem.is_some() {
                continue;
            }
            let (manifest, snapshot) =
                crate::checkpoint::verify_checkpoint(&listing.path, registry)?;
            let theirs = model_in(registry, &snapshot)?;
            let same = theirs.as_ref().is_some_and(|m| same_model(m, ours));
            if !same || manifest.pod != our_pod {
                let held = theirs.map_or_else(|| "no sharded model".to_string(), |m| m.describe());
                return Err(ShardingError::OtherRun {
                    path: listing.path.clone(),
                    theirs: format!("{held} on {}", manifest.pod),
                    ours: format!("{} on {our_pod}", ours.describe()),
                }
                .into());
            }
        }
        Ok(())
    }

    /// Continues a run from the newest verified checkpoint in `root`: the
    /// whole pod (model, state, count, clock, health, faults still to
    /// come) is restored, then the pod waits out that checkpoint's write as
    /// the run did, so the run goes on bit for bit as if never stopped.
    /// Checkpoints are then written as before (enable them first). Another
    /// model's checkpoint is refused ([`ShardedOptimizer::check_checkpoint_root`]).
    pub fn resume(&mut self, root: &Path) -> Result<Resumed> {
        self.pod.whole("resuming from a checkpoint")?;
        self.check_checkpoint_root(root)?;
        let registry = self.pod.world().resource::<SnapshotRegistry>();
        let listings = crate::checkpoint::list_checkpoints(root, registry)?;
        let Some(newest) = listings.iter().find(|l| l.problem.is_none()) else {
            let problems: Vec<String> = listings.iter().filter_map(|l| l.problem.clone()).collect();
            return Err(ShardingError::NothingToResume {
                root: root.to_path_buf(),
                problems: if problems.is_empty() {
                    String::new()
                } else {
                    format!(": {}", problems.join("; "))
                },
            }
            .into());
        };
        let path = newest.path.clone();
        let (_, snapshot) = crate::checkpoint::verify_checkpoint(&path, registry)?;
        self.restore(&snapshot)?;
        let now = self.pod.clock().now_ns;
        let seconds = self.checkpoint_seconds()?;
        if let Some(c) = &mut self.checkpoints {
            c.last_started_ns = now;
            c.last_label = Some(snapshot.tick);
        }
        let ends_at = now.saturating_add((seconds * 1e9).ceil() as u64);
        self.pod.advance_until(ends_at, |w| {
            crate::sharding::recovery::lost_participant(w).is_some()
        })?;
        Ok(Resumed {
            path,
            steps_completed: self.steps_completed(),
            at_ns: now,
        })
    }

    /// The pod (this rank's part of it when split over ranks).
    pub fn pod(&self) -> &Pod {
        self.pod.pod()
    }

    /// The pod, to step, inject faults into or checkpoint (when split over
    /// ranks, this rank's part: step and checkpoint it through
    /// [`ShardedOptimizer::ranked_mut`], so the ranks stay in lockstep).
    pub fn pod_mut(&mut self) -> &mut Pod {
        self.pod.pod_mut()
    }

    /// This rank's part of a pod split over ranks (`None` in one process).
    pub fn ranked(&self) -> Option<&RankedPod> {
        match &self.pod {
            Driver::One(_) => None,
            Driver::Ranked(ranked) => Some(ranked),
        }
    }

    /// This rank's part of a pod split over ranks, to gather, checkpoint or
    /// restore together with the others.
    pub fn ranked_mut(&mut self) -> Option<&mut RankedPod> {
        match &mut self.pod {
            Driver::One(_) => None,
            Driver::Ranked(ranked) => Some(ranked),
        }
    }

    /// Seconds spent compiling update programs.
    pub fn compile_seconds(&self) -> f64 {
        self.compile_seconds
    }

    /// Compiled update programs (one per distinct shard length).
    pub fn programs(&self) -> usize {
        self.programs.len()
    }

    /// The sharding configuration.
    pub fn sharding(&self) -> &ShardingConfig {
        &self.sharding
    }

    /// The wrapped optimizer.
    pub fn base(&self) -> &O {
        &self.base
    }
}

/// The sharded model a snapshot holds, if any.
fn model_in(registry: &SnapshotRegistry, snapshot: &WorldSnapshot) -> Result<Option<ShardedModel>> {
    let mut scratch = World::new();
    registry.restore(&mut scratch, snapshot)?;
    Ok(model_of(&scratch).cloned())
}

/// Whether two models are the same run's: what a checkpoint restores into
/// must have the same tensors, element type, optimizer, reduction, buckets
/// and recovery policy.
fn same_model(a: &ShardedModel, b: &ShardedModel) -> bool {
    a.layout.tensors == b.layout.tensors
        && a.layout.dtype == b.layout.dtype
        && a.optimizer == b.optimizer
        && a.slots == b.slots
        && a.reduction == b.reduction
        && a.bucket_bytes == b.bucket_bytes
        && a.recovery == b.recovery
}

/// The fused update of `rule` over a flat shard of `len` elements, its
/// outputs over its inputs (params over param 0, slot `k` over param
/// `k + 2`).
pub fn compile_update<A: FloatElement + Element>(
    rule: &dyn UpdateRule<A>,
    len: usize,
) -> Result<Arc<Runtime>> {
    let mut world = compiler::compiler_world();
    let program = graph::build_update_graph(&mut world, rule, &[len]).map_err(|e| {
        OptimError::from(ShardingError::InvalidState {
            reason: format!("the update rule has no graph: {}", e.0),
        })
    })?;
    let report = compiler::compile(&mut world, program)?;
    let aliases: Vec<(usize, usize)> = (0..report.executable.outputs.len())
        .map(|o| (o, if o == 0 { 0 } else { o + 1 }))
        .collect();
    Ok(Arc::new(Runtime::with_aliases(
        report.executable.clone(),
        &aliases,
    )))
}
