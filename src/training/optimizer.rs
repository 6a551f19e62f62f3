//! [`ShardedOptimizer`]: a whole model's optimizer sharded over every
//! device of a pod, the host side of [`crate::sharding`]: it builds the
//! layout, compiles one fused update per shard length, launches each step
//! and steps the pod until the step's systems finish it. It takes its
//! devices and generation from the pod it is given.
//!
//! ```
//! use ndarray::{ArrayD, IxDyn};
//! use optirs_tpu::Pod;
//! use optirs_tpu::optimizers::Adam;
//! use optirs_tpu::sharding::{ParamSet, SyntheticGradients};
//! use optirs_tpu::tpu::{ShardedOptimizer, ShardingConfig};
//!
//! let pod = Pod::from_preset("v4-16")?; // 8 chips, 16 TensorCores
//! let params = ParamSet::new()
//!     .with("w", ArrayD::from_elem(IxDyn(&[3, 5]), 0.5f32))?
//!     .with("b", ArrayD::from_elem(IxDyn(&[5]), 0.0f32))?;
//! let mut opt = ShardedOptimizer::on_pod(Adam::new(1e-3f32), pod, params, ShardingConfig::default())?;
//! let grads = SyntheticGradients { seed: 7, step: 1, replicas: 8, scale: 1.0 };
//! let report = opt.step(&grads)?;
//! assert_eq!(report.step, 1);
//! assert_eq!(opt.step_count(), 1);
//! assert!(report.modeled_seconds > 0.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::time::Instant;

use bevy_ecs::world::World;
use ndarray::IxDyn;
use serde::Serialize;

use crate::error::{OptimError, Result};
use crate::exec::runtime::Element;
use crate::exec::update_graph;
use crate::optimizers::{FloatElement, Optimizer};
use crate::pod::Pod;
use crate::pod::ranks::RankedPod;
use crate::sharding::Span;
use crate::sharding::model::{flat_tensor, gather_state, model_mut, model_of};
use crate::sharding::residency::DEFAULT_PREFETCH;
use crate::sharding::step::{LaunchRequest, launch_step};
use crate::sharding::world::{compile_update, layout_for, place_model};
use crate::sharding::{
    DEFAULT_BUCKET_BYTES, GradientSource, ParamSet, RecoveryPolicy, RecoveryRecord,
    ReducedGradients, Reduction, ReplicaGradients, ShardLayout, ShardProgram, ShardedModel,
    ShardedStep, ShardingError, SlotValues, StepOutcome,
};
use crate::sharding::{MeshSizes, Strategy};

use super::checkpoints::StepCheckpoints;
use super::driver::Driver;

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
    /// Every device's HBM, bytes, if not the pod's own figure (a smaller
    /// HBM to see a model not fit, a larger one to plan for a future
    /// part); `None` by default.
    pub hbm_bytes: Option<u64>,
    /// How parameters, gradients and state are split over the devices
    /// (replicated, ZeRO-1, by default); every strategy computes the same
    /// bits, only what each device's HBM holds and the step's collectives
    /// differ ([`crate::sharding::residency`]). A real run on a multislice
    /// pod or over ranks is replicated only.
    pub strategy: Strategy,
    /// Under fsdp, the buckets gathered ahead of the one in use (1 by
    /// default): at most `prefetch + 1` gathered buckets are held. 0
    /// gathers each bucket only when its use begins (the least HBM). The
    /// model of time has no forward or backward compute to hide a gather
    /// behind, so it changes what is held, not the modeled step time.
    pub prefetch: usize,
    /// The mesh's axis sizes (`None`: the pod's default, fsdp over each
    /// slice and data across the slices), laid out on the pod as
    /// [`crate::sharding::Mesh::lay_out`] does. Under zero2 and fsdp the
    /// state is replicated along `data`; a pod split over ranks runs the
    /// default mesh only.
    pub mesh: Option<MeshSizes>,
}

impl Default for ShardingConfig {
    fn default() -> Self {
        ShardingConfig {
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            reduction: Reduction::Mean,
            recovery: RecoveryPolicy::Rollback,
            hbm_bytes: None,
            strategy: Strategy::Replicated,
            prefetch: DEFAULT_PREFETCH,
            mesh: None,
        }
    }
}

/// Whether a real run can shard over `pod` as `sharding` asks: over ranks
/// only the replicated strategy on the pod's default mesh is built (the
/// others run in the closed-form model).
fn check_split(pod: &Pod, split: bool, sharding: &ShardingConfig) -> Result<()> {
    if !split {
        return Ok(());
    }
    let place = format!("a pod split over ranks ({})", pod.topology().name);
    if sharding.strategy != Strategy::Replicated {
        return Err(ShardingError::ModeledOnly {
            strategy: sharding.strategy,
            place,
        }
        .into());
    }
    if let Some(sizes) = sharding.mesh {
        let mesh = sizes.lay_out(pod.topology()).map_err(ShardingError::from)?;
        if mesh != crate::sharding::Mesh::default_for(pod.topology()) {
            return Err(ShardingError::MeshNotBuilt {
                mesh: mesh.to_string(),
                reason: format!("{place} runs the pod's default mesh"),
            }
            .into());
        }
    }
    Ok(())
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
    /// The same by phase (`reduce_scatter.axis0`, `all_gather.dcn`,
    /// `replicate_state`).
    pub phase_bytes: BTreeMap<String, u64>,
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
    pub(super) base: O,
    pub(super) sharding: ShardingConfig,
    pub(super) pod: Driver,
    pub(super) programs: BTreeMap<usize, ShardProgram>,
    pub(super) compile_seconds: f64,
    pub(super) checkpoints: Option<StepCheckpoints>,
    /// Told how far the step in flight is, between its ticks
    /// ([`ShardedOptimizer::on_step_progress`]).
    pub(super) step_progress: Option<StepProgress>,
    pub(super) _element: PhantomData<fn() -> A>,
}

/// A host's view of a step in flight: called with the part of the step
/// under way and the fraction of that part done, from 0 to 1.
pub type StepProgress = Box<dyn Fn(StepPart, f64) + Send + Sync>;

/// The parts of a step a host waits for, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepPart {
    /// The replicas' gradients made and reduce-scattered on the data,
    /// chunk by chunk (most of a large pod's wall time).
    Gradients,
    /// The step in flight in simulated time, tick by tick: its
    /// collectives and updates, to its completion.
    InFlight,
}

impl<O, A> std::fmt::Debug for ShardedOptimizer<O, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedOptimizer")
            .field("sharding", &self.sharding)
            .field("programs", &self.programs.len())
            .finish()
    }
}

impl<O, A> ShardedOptimizer<O, A>
where
    O: Optimizer<A, IxDyn>,
    A: FloatElement + Element,
{
    /// Shards `params` and `base`'s state over every device of `pod`, in
    /// the pod's generation; `sharding.hbm_bytes`, if set, becomes every
    /// device's HBM.
    pub fn on_pod(
        base: O,
        pod: Pod,
        params: ParamSet<A>,
        sharding: ShardingConfig,
    ) -> Result<Self> {
        Self::build(base, Driver::One(pod), params, sharding)
    }

    /// [`ShardedOptimizer::on_pod`] on this rank's part of a pod split
    /// over ranks ([`RankedPod`]): every rank calls it with the same model
    /// and configuration (the parameters are the replicated initial
    /// values), then steps in lockstep with the others. Each rank keeps
    /// its own devices' state shards; a step reduce-scatters the gradients
    /// its replicas give and all-gathers the updated parameters across the
    /// ranks ([`crate::sharding::ranked`]), bit for bit the one-process
    /// step.
    pub fn on_ranked_pod(
        base: O,
        pod: RankedPod,
        params: ParamSet<A>,
        sharding: ShardingConfig,
    ) -> Result<Self> {
        let mut opt = Self::build(base, Driver::Ranked(pod), params, sharding)?;
        if let Driver::Ranked(ranked) = &mut opt.pod {
            ranked.hold_own_shards();
        }
        Ok(opt)
    }

    fn build(
        base: O,
        mut driver: Driver,
        params: ParamSet<A>,
        sharding: ShardingConfig,
    ) -> Result<Self> {
        if sharding.hbm_bytes == Some(0) {
            return Err(OptimError::invalid_config(
                "hbm_bytes is 0; leave it None for the generation's HBM",
            ));
        }
        let split = matches!(driver, Driver::Ranked(_));
        let pod = driver.pod_mut();
        check_split(pod, split, &sharding)?;
        let rule = base
            .update_rule()
            .ok_or_else(|| ShardingError::NoUpdateRule {
                optimizer: base.name().to_owned(),
            })?;
        let slots: Vec<String> = rule.slot_names().iter().map(|s| s.to_string()).collect();
        let initial = rule.initial_slot_values();
        let world = pod.world_mut();
        let (layout, mesh) = layout_for(
            world,
            (sharding.strategy, sharding.mesh),
            <A as Element>::DTYPE,
            &params.shapes(),
            sharding.bucket_bytes,
        )?;
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
            strategy: sharding.strategy,
            prefetch: sharding.prefetch,
            mesh,
        };
        place_model(
            world,
            sharding.hbm_bytes,
            model,
            SlotValues::Initial(initial),
        )?;
        let mut opt = ShardedOptimizer {
            base,
            sharding,
            pod: driver,
            programs: BTreeMap::new(),
            compile_seconds: 0.0,
            checkpoints: None,
            step_progress: None,
            _element: PhantomData,
        };
        opt.compile_programs()?;
        Ok(opt)
    }

    /// Compiles the update for every shard length the layout has.
    pub(super) fn compile_programs(&mut self) -> Result<()> {
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

    pub(super) fn model(&self) -> Result<&ShardedModel> {
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
        let start_ns = self.pod.clock().now_ns;
        let (number, completes_at_ns, failed_at_launch) = self.launch(grads)?;
        if failed_at_launch {
            // Failed at launch: the recovery policy runs now, as the
            // `Recovery` set would after a failure in flight.
            crate::recovery::recover_sharded_model(self.pod.world_mut());
        }
        let pending = |w: &World| {
            w.get_resource::<ShardedStep>()
                .is_none_or(|s| s.is_pending())
        };
        self.advance_reporting(start_ns, completes_at_ns)?;
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
                        phase_bytes: step.phase_bytes.clone(),
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

    /// Launches the next step with `grads` (the [`StepProgress`] told of
    /// the gradients' reduction): its number, its completion time, and
    /// whether it failed at launch.
    fn launch(&mut self, grads: &dyn GradientSource<A>) -> Result<(u64, u64, bool)> {
        let learning_rate = self
            .base
            .update_rule()
            .and_then(|r| update_graph::learning_rate_scalar(r));
        let report = self.step_progress.as_deref();
        let reduced = |fraction: f64| {
            if let Some(report) = report {
                report(StepPart::Gradients, fraction);
            }
        };
        let request = LaunchRequest {
            gradients: grads,
            programs: &self.programs,
            learning_rate,
            progress: report.map(|_| &reduced as &(dyn Fn(f64) + Sync)),
        };
        let launched = launch_step(self.pod.world_mut(), request)?;
        Ok((
            launched.number,
            launched.completes_at_ns,
            !launched.is_pending(),
        ))
    }

    /// Tells `f` how far each step is (its [`StepPart`] and the fraction
    /// of that part done: chunks of the gradients reduced, then the step's
    /// simulated time passed, between its ticks), so a host can show
    /// progress inside a long step; `None` stops telling.
    pub fn on_step_progress(&mut self, f: Option<StepProgress>) {
        self.step_progress = f;
    }

    /// Steps the pod from a step's launch at `start_ns` until it is no
    /// longer pending or `completes_at_ns` is reached, telling the
    /// [`StepProgress`] how far it is between ticks.
    fn advance_reporting(&mut self, start_ns: u64, completes_at_ns: u64) -> Result<()> {
        let span = completes_at_ns.saturating_sub(start_ns).max(1) as f64;
        let progress = self.step_progress.as_deref();
        let passed = |w: &World| {
            let now_ns = w.resource::<crate::clock::SimClock>().now_ns;
            (now_ns.saturating_sub(start_ns) as f64 / span).min(1.0)
        };
        self.pod.advance_until(completes_at_ns, |w| {
            if let Some(report) = progress {
                report(StepPart::InFlight, passed(w));
            }
            w.get_resource::<ShardedStep>()
                .is_some_and(|s| !s.is_pending())
        })?;
        // The last stretch may be jumped over (idle ticks): say where it ended.
        if let Some(report) = progress {
            report(StepPart::InFlight, passed(self.pod.world()));
        }
        Ok(())
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
