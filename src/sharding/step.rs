//! One data-parallel step over the pod, as work in the pod's tick.
//!
//! [`launch_step`] (called by the host API) checks everything that can be
//! checked first (gradients, devices, links, HBM), then does the step's
//! communication on the real data at once: it charges every link the
//! reduce-scatter and all-gather cross (under fsdp the two gathers and the
//! reduce-scatter of `super::strategy_step`), and reduce-scatters the replicas'
//! gradients into one reduced copy in the collective's own order
//! ([`crate::collectives::ReduceGrid`]). It leaves a [`ShardedStep`] whose
//! completion time comes from the model of [`super::timing`].
//!
//! Then the pod's systems carry it:
//!
//! * [`watch_sharded_step`] (`Collectives`): a participant killed, paused
//!   or declared failed, or a used link cut, before the completion time
//!   fails the step, naming the device (or link) and the phase it was in;
//! * [`commit_sharded_step`] (`Execute`): at the completion time, every
//!   device runs the fused compiled update on its shard of every bucket,
//!   in place on the parameters (stored once: this is the all-gather's
//!   data landing) and on its own state shards; only now do parameters,
//!   state and count change, so a failed step changes none of them;
//! * [`release_step_memory`] (`Coalesce`): a finished step's transient
//!   HBM (each device's gradient buffers and, under fsdp, its gathered
//!   buckets: [`super::residency::step_buffers`]) goes back to the heaps, which
//!   coalesce the freed blocks with their neighbours. The host buffer of
//!   the reduced gradients is kept for the next step, which overwrites it
//!   (a model-sized buffer is faulted in once, not every step).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bevy_ecs::prelude::*;
use rayon::prelude::*;

use super::error::{FailureCause, ShardingError, UpdateError};
use super::gradients::GradientSource;
use super::layout::ShardLayout;
use super::mesh::Mesh;
use super::model::{
    RecoveryPolicy, ShardedModel, flat_of, flat_of_mut, flat_tensor, model_entity, model_mut,
    model_of,
};
use super::ranked::HeldElsewhere;
use super::residency::{StepBuffer, step_buffers};
use super::strategy_step::PerLength;
use super::timing::{StepPhase, StepTimeline};
use crate::clock::SimClock;
use crate::collectives::pod::{LinkCharge, charge_links};
use crate::exec::runtime::{Arg, NoCustomCalls, RunOutput, Runtime};
use crate::health::DeviceState;
use crate::ir::{DType, FloatElement, Tensor};
use crate::memory::ShardSlot;
use crate::memory::device::{release, reserve};
use crate::topology::{Device, DeviceId, DeviceIndex, Link, PodTopology};
use crate::transport::LinkState;

/// The compiled update for one shard length: `(params, grads, slots…,
/// count[, -lr])` → `(params, slots…)`, outputs over their inputs.
#[derive(Debug, Clone)]
pub struct ShardProgram {
    /// The runtime.
    pub runtime: Arc<Runtime>,
}

/// Where a step stands.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutcome {
    /// Launched; communication and compute in flight.
    Pending,
    /// Every device updated its shards.
    Completed {
        /// When, ns.
        at_ns: u64,
    },
    /// A device or link failed first; nothing changed.
    Failed {
        /// When, ns.
        at_ns: u64,
        /// The phase in progress.
        phase: StepPhase,
        /// What failed.
        cause: FailureCause,
    },
}

/// The step in flight (or the last one, finished), in the pod's world.
/// Not persisted: a checkpoint taken while a step is in flight holds the
/// model as it was before the step.
#[derive(Resource, Debug)]
pub struct ShardedStep {
    /// Step number (1-based: the model's completed steps + 1).
    pub number: u64,
    /// Launch, ns.
    pub launched_at_ns: u64,
    /// Modeled completion, ns.
    pub completes_at_ns: u64,
    /// The modeled schedule.
    pub timeline: StepTimeline,
    /// Where it stands.
    pub outcome: StepOutcome,
    /// Bytes charged to the links.
    pub link_bytes: u64,
    /// The same by phase (`reduce_scatter.axis0`, `all_gather.dcn`,
    /// `replicate_state`, as [`StepPhase::key`] names them).
    pub phase_bytes: BTreeMap<String, u64>,
    /// HBM in use per participant while the step holds its buffers.
    pub hbm_bytes: Vec<(DeviceId, u64)>,
    /// Whether the step's transient HBM and data are released.
    pub released: bool,
    /// Transient blocks a (restored) heap no longer held at release.
    pub release_errors: u32,
    /// What the `Recovery` set did after a failure: the record, or why no
    /// policy could recover.
    pub recovery: Option<Result<super::model::RecoveryRecord, super::error::RecoveryFailure>>,
    links: Vec<Entity>,
    transient: Vec<(Entity, usize)>,
    reduced: Tensor,
    programs: Vec<ShardProgram>,
    program_of_bucket: Vec<usize>,
    learning_rate: Option<f64>,
    next_count: i32,
}

impl ShardedStep {
    /// Step `number`, failed at its launch at `now_ns` because of `cause`:
    /// nothing reserved, charged or changed, released, awaiting recovery.
    fn failed_at_launch(number: u64, now_ns: u64, cause: FailureCause) -> ShardedStep {
        ShardedStep {
            number,
            launched_at_ns: now_ns,
            completes_at_ns: now_ns,
            timeline: StepTimeline::default(),
            outcome: StepOutcome::Failed {
                at_ns: now_ns,
                phase: StepPhase::Launch,
                cause,
            },
            link_bytes: 0,
            phase_bytes: BTreeMap::new(),
            hbm_bytes: Vec::new(),
            released: true,
            release_errors: 0,
            recovery: None,
            links: Vec::new(),
            transient: Vec::new(),
            reduced: flat_tensor::<f32>(Vec::new()),
            programs: Vec::new(),
            program_of_bucket: Vec::new(),
            learning_rate: None,
            next_count: 0,
        }
    }

    /// Whether the step is still in flight.
    pub fn is_pending(&self) -> bool {
        self.outcome == StepOutcome::Pending
    }
}

/// What the host passes to [`launch_step`].
pub struct LaunchRequest<'a, A> {
    /// The replicas' gradients.
    pub gradients: &'a dyn GradientSource<A>,
    /// The compiled update per shard length.
    pub programs: &'a BTreeMap<usize, ShardProgram>,
    /// The run-time learning-rate scalar (`-lr`), when the rule takes one.
    pub learning_rate: Option<A>,
    /// Told the fraction of the gradients' reduction done (0 to 1) as its
    /// chunks complete, for a host showing progress inside a long launch.
    pub progress: Option<&'a (dyn Fn(f64) + Sync)>,
}

/// Per participant, the entity of its device.
fn participant_entities(world: &World, devices: &[DeviceId]) -> Result<Vec<Entity>, ShardingError> {
    let index = world.resource::<DeviceIndex>();
    devices
        .iter()
        .map(|&d| {
            index.get(d).ok_or_else(|| ShardingError::Devices {
                reason: format!("{d} is not in the pod"),
            })
        })
        .collect()
}

/// Why a participant cannot take part, if it cannot.
fn device_trouble(
    world: &World,
    entity: Entity,
    id: DeviceId,
    before_ns: u64,
    declared_failed: &BTreeSet<DeviceId>,
) -> Option<FailureCause> {
    match world.get::<DeviceState>(entity) {
        Some(DeviceState::Killed { at_ns }) if *at_ns < before_ns => {
            return Some(FailureCause::DeviceKilled(id));
        }
        Some(DeviceState::Paused) => return Some(FailureCause::DevicePaused(id)),
        _ => {}
    }
    if declared_failed.contains(&id) {
        return Some(FailureCause::DeviceFailed(id));
    }
    None
}

/// Launches step `model.steps_completed + 1` (module docs). Every check
/// comes first; on `Err` nothing in the world changed.
pub fn launch_step<'w, A: FloatElement>(
    world: &'w mut World,
    request: LaunchRequest<'_, A>,
) -> Result<&'w ShardedStep, ShardingError> {
    let model = model_of(world).ok_or(ShardingError::NoModel)?;
    if let Some(step) = world.get_resource::<ShardedStep>()
        && step.is_pending()
    {
        return Err(ShardingError::StepInFlight { step: step.number });
    }
    let layout = model.layout.clone();
    let slots = model.slots.len();
    let number = model.steps_completed + 1;
    let next_count = model.count.saturating_add(1);
    check_gradients(&layout, request.gradients)?;
    let entities = participant_entities(world, &layout.participants)?;
    let now = world.resource::<SimClock>().now_ns;
    let declared = crate::health::declared_failed(world, &layout.participants)?;
    for (&entity, &id) in entities.iter().zip(&layout.participants) {
        if let Some(cause) = device_trouble(world, entity, id, u64::MAX, &declared) {
            // Lost before launch (at the previous step's end, or in a
            // wait): the step fails at once, with nothing reserved, and
            // the recovery policy handles it like any failed step.
            world.insert_resource(ShardedStep::failed_at_launch(number, now, cause));
            return Ok(world.resource::<ShardedStep>());
        }
    }
    // One program and one traffic record per distinct bucket length.
    let ProgramsByLength {
        lengths,
        programs,
        of_bucket: program_of_bucket,
    } = programs_by_length(&layout, request.programs)?;
    let redundant = model_of(world).is_some_and(|m| m.recovery == RecoveryPolicy::Redundant);
    let model = model_of(world).ok_or(ShardingError::NoModel)?;
    let residency = model.residency();
    let mesh = step_mesh(world, model);
    // The step's collectives under the model's strategy (on its mesh).
    let (combined, per_length) = PerLength::of(
        world,
        (residency.strategy, mesh.as_ref()),
        &layout,
        &lengths,
        (slots, redundant),
    )?;
    // The reduce-scatter, on the real data: the last fallible part of a
    // split pod's launch that involves the other ranks, so it comes before
    // anything in this world changes.
    let phase_bytes = super::traffic::bytes_by_phase(&combined);
    let reduced = reduce_into_last_buffer(world, &layout, &request, number)?;
    // HBM: the step's buffers under the model's strategy, on every device.
    let transient = reserve_gradients(world, &entities, &step_buffers(&residency), number)?;
    let hbm_bytes = hbm_in_use(world, &entities, &layout.participants);
    let charge: LinkCharge = match charge_links(world, &combined) {
        Ok(c) => c,
        Err(e) => {
            for (device, offset) in transient {
                release(world, device, offset)?;
            }
            return Err(e.into());
        }
    };
    // The model of time.
    let hbm_per_s = world
        .get::<Device>(entities[0])
        .map_or(1e12, |d| d.generation.spec().hbm_bytes_per_s);
    let timeline = per_length.timeline(
        &layout,
        &lengths,
        &program_of_bucket,
        &charge,
        (slots, hbm_per_s, residency.prefetch),
    );
    let completes_at_ns = now + (timeline.step_seconds * 1e9).ceil() as u64;
    world.insert_resource(ShardedStep {
        number,
        launched_at_ns: now,
        completes_at_ns,
        timeline,
        outcome: StepOutcome::Pending,
        link_bytes: charge.link_bytes,
        phase_bytes,
        hbm_bytes,
        released: false,
        release_errors: 0,
        recovery: None,
        links: charge.links,
        transient,
        reduced: flat_tensor(reduced),
        programs,
        program_of_bucket,
        learning_rate: request.learning_rate.map(|v| v.as_f64()),
        next_count,
    });
    Ok(world.resource::<ShardedStep>())
}

/// Whether `gradients` are of the model's element type and shapes.
fn check_gradients<A: FloatElement>(
    layout: &ShardLayout,
    gradients: &dyn GradientSource<A>,
) -> Result<(), ShardingError> {
    if A::DTYPE != layout.dtype {
        return Err(ShardingError::GradientMismatch {
            replica: 0,
            reason: format!("{} values, but the model holds {}", A::DTYPE, layout.dtype),
        });
    }
    gradients.check(layout)
}

/// The mesh whose plans the step's collectives follow: the model's, or
/// the pod's default when the layout replicates the state along it
/// (`None`: the whole-grid collectives of the default mesh).
fn step_mesh(world: &World, model: &ShardedModel) -> Option<Mesh> {
    model.mesh.clone().or_else(|| {
        model
            .layout
            .is_mirrored()
            .then(|| Mesh::default_for(&world.resource::<PodTopology>().0))
    })
}

/// The replicas' gradients reduced (across the ranks of a split pod too)
/// into the previous step's buffer, taken back from the world: no fresh
/// pages every step.
fn reduce_into_last_buffer<A: FloatElement>(
    world: &mut World,
    layout: &ShardLayout,
    request: &LaunchRequest<'_, A>,
    number: u64,
) -> Result<Vec<A>, ShardingError> {
    let gradients = request.gradients;
    let buffer = world
        .get_resource_mut::<ShardedStep>()
        .map(|mut old| std::mem::replace(&mut old.reduced, flat_tensor::<A>(Vec::new())))
        .and_then(|t| A::from_tensor(t).ok())
        .map(|a| a.into_raw_vec_and_offset().0)
        .filter(|v| v.len() == layout.padded_elements());
    let op = model_of(world).map_or(crate::collectives::ReduceOp::Mean, |m| m.reduction.op());
    Ok(match super::ranked::context(world) {
        None => reduce_gradients(layout, buffer, gradients, op, request.progress),
        Some(ctx) => super::ranked::reduce_gradients(layout, buffer, gradients, op, &ctx, number)?,
    })
}

/// The step's programs, one per distinct bucket length.
struct ProgramsByLength {
    /// The distinct padded bucket lengths, ascending.
    lengths: Vec<usize>,
    /// The compiled update of each length's shards.
    programs: Vec<ShardProgram>,
    /// Each bucket's index into them.
    of_bucket: Vec<usize>,
}

/// The step's programs by bucket length (an error if one is not compiled).
fn programs_by_length(
    layout: &ShardLayout,
    compiled: &BTreeMap<usize, ShardProgram>,
) -> Result<ProgramsByLength, ShardingError> {
    let mut lengths: Vec<usize> = layout.buckets.iter().map(|b| b.padded_len).collect();
    lengths.sort_unstable();
    lengths.dedup();
    let mut programs = Vec::with_capacity(lengths.len());
    for len in &lengths {
        let shard = len / layout.shards();
        let program = compiled
            .get(&shard)
            .ok_or_else(|| ShardingError::InvalidState {
                reason: format!("no compiled update for shards of {shard} elements"),
            })?;
        programs.push(program.clone());
    }
    let program_of_bucket: Vec<usize> = layout
        .buckets
        .iter()
        .map(|b| lengths.binary_search(&b.padded_len).unwrap_or(0))
        .collect();
    Ok(ProgramsByLength {
        lengths,
        programs,
        of_bucket: program_of_bucket,
    })
}

/// HBM in use on each participant (with the step's buffers reserved).
fn hbm_in_use(world: &World, entities: &[Entity], devices: &[DeviceId]) -> Vec<(DeviceId, u64)> {
    entities
        .iter()
        .zip(devices)
        .map(|(&e, &d)| {
            (
                d,
                world.get::<crate::memory::HbmUsage>(e).map_or(0, |u| u.0),
            )
        })
        .collect()
}

/// Reserves each participant's `buffers` for step `number`
/// ([`super::residency::step_buffers`]); if one does not fit, the ones
/// reserved are released again.
fn reserve_gradients(
    world: &mut World,
    entities: &[Entity],
    buffers: &[StepBuffer],
    number: u64,
) -> Result<Vec<(Entity, usize)>, ShardingError> {
    let mut transient = Vec::with_capacity(entities.len() * buffers.len());
    for &entity in entities {
        for buffer in buffers {
            match reserve(
                world,
                entity,
                buffer.bytes.max(1),
                format_args!("{}", buffer.purpose(number)),
            ) {
                Ok(block) => transient.push((entity, block.offset)),
                Err(e) => {
                    for (device, offset) in transient {
                        release(world, device, offset)?;
                    }
                    return Err(e.into());
                }
            }
        }
    }
    Ok(transient)
}

/// Every bucket's reduced gradient, each chunk the whole grid's
/// reduce-scatter gives a device folded in that device's order from the
/// source ([`ShardLayout::reduction_chunks`]), chunks in parallel.
fn reduce_gradients<A: FloatElement>(
    layout: &ShardLayout,
    buffer: Option<Vec<A>>,
    source: &dyn GradientSource<A>,
    op: crate::collectives::ReduceOp,
    progress: Option<&(dyn Fn(f64) + Sync)>,
) -> Vec<A> {
    // Every element is written below (padding included).
    let mut reduced = buffer.unwrap_or_else(|| vec![A::ZERO; layout.padded_elements()]);
    let (grid, positions) = layout.grid();
    let elements = layout.elements;
    let tasks = layout.reduction_chunks(&mut reduced);
    let (total, done) = (tasks.len().max(1) as f64, AtomicUsize::new(0));
    let chunk_done = || {
        if let Some(report) = progress {
            report((done.fetch_add(1, Ordering::Relaxed) + 1) as f64 / total);
        }
    };
    if source.is_reduced() {
        tasks.into_par_iter().for_each(|(_, start, out)| {
            let real = elements.saturating_sub(start).min(out.len());
            source.fill(0, start, &mut out[..real]);
            out[real..].fill(A::ZERO);
            chunk_done();
        });
        return reduced;
    }
    tasks.into_par_iter().for_each(|(r, start, out)| {
        let mut fill = |member: usize, offset: usize, buf: &mut [A]| {
            let replica = layout
                .replica_of(DeviceId(member as u32))
                .expect("the grid's members are the participants");
            let from = start + offset;
            let real = elements.saturating_sub(from).min(buf.len());
            source.fill(replica, from, &mut buf[..real]);
            buf[real..].fill(A::ZERO);
        };
        grid.reduce_for(positions[r], op, out, &mut fill);
        chunk_done();
    });
    reduced
}

/// Whether the step in flight has a participant killed, paused or
/// declared failed (by this process's detector), or a link cut: the next
/// tick's [`watch_sharded_step`] fails it.
pub(super) fn in_trouble(world: &World) -> bool {
    let (Some(step), Some(model)) = (world.get_resource::<ShardedStep>(), model_of(world)) else {
        return false;
    };
    let index = world.resource::<DeviceIndex>();
    let device_down = model.layout.participants.iter().any(|&id| {
        index.get(id).is_some_and(|e| {
            world.get::<DeviceState>(e).is_some_and(|s| !s.is_running())
                || world
                    .get::<crate::health::Health>(e)
                    .is_some_and(|h| h.is_failed())
        })
    });
    device_down
        || step
            .links
            .iter()
            .any(|&e| world.get::<LinkState>(e).is_some_and(|s| !s.up))
}

/// Fails the step in flight when a participant is killed (before the
/// completion time), paused or declared failed, or a link it uses is cut.
pub fn watch_sharded_step(world: &mut World) {
    let pending = world
        .get_resource::<ShardedStep>()
        .is_some_and(|s| s.is_pending());
    let Some(model) = model_of(world).filter(|_| pending) else {
        return;
    };
    let participants = model.layout.participants.clone();
    // Rank 0's detector is the only one that declares failures; a split
    // pod takes its list here, every tick a step is in flight.
    let declared = match crate::health::declared_failed(world, &participants) {
        Ok(declared) => declared,
        Err(e) => {
            fail_ranks(world, e.into());
            return;
        }
    };
    let step = world.resource::<ShardedStep>();
    let index = world.resource::<DeviceIndex>();
    let mut cause = participants.iter().find_map(|&id| {
        let entity = index.get(id)?;
        device_trouble(world, entity, id, step.completes_at_ns, &declared)
    });
    if cause.is_none() {
        let id = |e: Entity| world.get::<Device>(e).map_or(DeviceId(u32::MAX), |d| d.id);
        cause = step.links.iter().find_map(|&entity| {
            let link = world.get::<Link>(entity)?;
            let up = world.get::<LinkState>(entity).is_none_or(|s| s.up);
            (!up).then(|| FailureCause::LinkCut {
                src: id(link.a),
                dst: id(link.b),
            })
        });
    }
    if let Some(cause) = cause {
        let now = world.resource::<SimClock>().now_ns;
        let mut step = world.resource_mut::<ShardedStep>();
        let seconds = now.saturating_sub(step.launched_at_ns) as f64 * 1e-9;
        let phase = step.timeline.phase_at(seconds);
        step.outcome = StepOutcome::Failed {
            at_ns: now,
            phase,
            cause,
        };
    }
}

/// Records that the ranks could not go on together: the split pod's step
/// ends with it (`RankedPod::step` returns the transport's failure).
fn fail_ranks(world: &mut World, error: ShardingError) {
    let error = match error {
        ShardingError::Cluster(e) => crate::transport::TransportError::Cluster(e),
        other => crate::transport::TransportError::Cluster(
            crate::transport::ClusterError::Transport(other.to_string()),
        ),
    };
    if let Some(ctx) = super::ranked::context(world)
        && let crate::transport::TransportError::Cluster(e) = &error
    {
        ctx.abort(e);
    }
    world
        .resource_mut::<crate::transport::Network>()
        .fail(error);
}

/// Runs the update on every shard once the step's time has come (module
/// docs): the only place a step changes parameters, state and count.
pub fn commit_sharded_step(world: &mut World) {
    let due = world.get_resource::<ShardedStep>().is_some_and(|s| {
        s.is_pending() && world.resource::<SimClock>().now_ns >= s.completes_at_ns
    });
    if !due {
        return;
    }
    let Some(mut step) = world.remove_resource::<ShardedStep>() else {
        return;
    };
    let now = world.resource::<SimClock>().now_ns;
    let dtype = model_of(world).map(|m| m.layout.dtype);
    let result = match dtype {
        Some(DType::F32) => commit_typed::<f32>(world, &step),
        Some(DType::F64) => commit_typed::<f64>(world, &step),
        _ => Err(ShardingError::NoModel),
    };
    match result {
        Ok(()) => {
            step.outcome = StepOutcome::Completed { at_ns: now };
            if let Some(mut model) = model_mut(world) {
                model.count = step.next_count;
                model.steps_completed += 1;
            }
        }
        Err(ShardingError::Cluster(e)) => {
            // A rank was lost mid-step: the job cannot go on together.
            fail_ranks(world, ShardingError::Cluster(e));
        }
        Err(e) => {
            // Programs and arguments were checked at launch, so this is
            // an engine fault; the step fails with its message.
            step.outcome = StepOutcome::Failed {
                at_ns: now,
                phase: StepPhase::Update,
                cause: FailureCause::UpdateFailed(UpdateError(Arc::new(e))),
            };
        }
    }
    world.insert_resource(step);
}

fn commit_typed<A: FloatElement>(
    world: &mut World,
    step: &ShardedStep,
) -> Result<(), ShardingError> {
    let entity = model_entity(world).ok_or(ShardingError::NoModel)?;
    let mut model = world
        .entity_mut(entity)
        .take::<ShardedModel>()
        .ok_or(ShardingError::NoModel)?;
    let ranks = super::ranked::context(world);
    let result = (|| -> Result<(), ShardingError> {
        let ShardedModel { layout, params, .. } = &mut model;
        let n = layout.devices();
        let grads = flat_of::<A>(&step.reduced)?;
        let params = flat_of_mut::<A>(params)?;
        // Each replica's state shards, by slot index (a split pod's rank:
        // its own devices' only).
        let mut q = world.query_filtered::<&mut ShardSlot, Without<HeldElsewhere>>();
        let mut state: Vec<Vec<Option<Mut<'_, ShardSlot>>>> = (0..n).map(|_| Vec::new()).collect();
        for slot in q.iter_mut(world) {
            if slot.owner != slot.device {
                continue;
            }
            if let Some(r) = layout.replica_of(slot.device) {
                let i = slot.index as usize;
                if state[r].len() <= i {
                    state[r].resize_with(i + 1, || None);
                }
                state[r][i] = Some(slot);
            }
        }
        // Per replica: its (bucket, params shard, grads shard).
        let mut shards: Vec<Vec<ShardWork<'_, A>>> = (0..n).map(|_| Vec::new()).collect();
        for (b, r, p) in layout.shards_of(params) {
            shards[r].push((b, p, &grads[layout.shard_range(r, b)]));
        }
        let count = Tensor::scalar(DType::I32, f64::from(step.next_count));
        let lr = step.learning_rate.map(|v| Tensor::scalar(A::DTYPE, v));
        let mut work = Vec::with_capacity(n);
        for (r, (replica_shards, slots)) in shards.into_iter().zip(state.iter_mut()).enumerate() {
            if ranks
                .as_ref()
                .is_some_and(|ctx| !ctx.layout.is_local(layout.participants[r]))
            {
                continue;
            }
            let mut slot_values: Vec<&mut [A]> = Vec::with_capacity(slots.len());
            for (i, slot) in slots.iter_mut().enumerate() {
                let slot = slot.as_mut().ok_or_else(|| ShardingError::InvalidState {
                    reason: format!("{} has no shard of slot {i}", layout.participants[r]),
                })?;
                slot_values.push(flat_of_mut::<A>(&mut slot.tensor)?);
            }
            work.push((replica_shards, slot_values));
        }
        work.into_par_iter()
            .try_for_each(|(replica_shards, mut slot_values)| {
                for (b, p, g) in replica_shards {
                    let bucket = &layout.buckets[b];
                    let program = &step.programs[step.program_of_bucket[b]];
                    run_shard(
                        &program.runtime,
                        p,
                        g,
                        &mut slot_values,
                        bucket.shard_offset..bucket.shard_offset + bucket.shard_len,
                        &count,
                        lr.as_ref(),
                    )?;
                }
                Ok::<(), ShardingError>(())
            })?;
        // The all-gather's data landing: on one process the update wrote
        // the one copy of the parameters; a split pod's ranks swap shards.
        if let Some(ctx) = &ranks {
            super::ranked::gather_params(layout, params, ctx, step.number)?;
        }
        Ok(())
    })();
    world.entity_mut(entity).insert(model);
    result?;
    refresh_copies::<A>(world)?;
    match &ranks {
        Some(ctx) => super::ranked::refresh_remote_copies::<A>(world, ctx, step.number),
        None => Ok(()),
    }
}

/// Writes every redundant copy from its owner's (updated) primary shard.
fn refresh_copies<A: FloatElement>(world: &mut World) -> Result<(), ShardingError> {
    let mut q = world.query_filtered::<(Entity, &ShardSlot), Without<HeldElsewhere>>();
    let mut primaries = BTreeMap::new();
    let mut copies = Vec::new();
    for (e, s) in q.iter(world) {
        if s.owner == s.device {
            primaries.insert((s.owner, s.index), e);
        } else {
            copies.push((e, s.owner, s.index));
        }
    }
    for (copy, owner, index) in copies {
        let Some(&primary) = primaries.get(&(owner, index)) else {
            continue;
        };
        let values =
            flat_of::<A>(&world.get::<ShardSlot>(primary).expect("queried").tensor)?.to_vec();
        let mut slot = world.get_mut::<ShardSlot>(copy).expect("queried");
        flat_of_mut::<A>(&mut slot.tensor)?.copy_from_slice(&values);
    }
    Ok(())
}

/// A bucket index with one replica's params and reduced-gradient shards.
type ShardWork<'a, A> = (usize, &'a mut [A], &'a [A]);

/// One fused update of one shard, in place.
fn run_shard<A: FloatElement>(
    runtime: &Runtime,
    params: &mut [A],
    grads: &[A],
    slots: &mut [&mut [A]],
    range: std::ops::Range<usize>,
    count: &Tensor,
    lr: Option<&Tensor>,
) -> Result<(), ShardingError> {
    let mut args = Vec::with_capacity(slots.len() + 4);
    args.push(Arg::slice_mut(&mut *params));
    args.push(Arg::slice(grads));
    let mut views: Vec<&mut [A]> = slots.iter_mut().map(|s| &mut s[range.clone()]).collect();
    for s in views.iter_mut() {
        args.push(Arg::slice_mut(s));
    }
    args.push(Arg::tensor(count));
    if let Some(lr) = lr {
        args.push(Arg::tensor(lr));
    }
    let outs = runtime.run(args, &mut NoCustomCalls)?;
    // Outputs land in their donated arguments; a fresh one is copied back.
    for (o, out) in outs.into_iter().enumerate() {
        if let RunOutput::Owned(t) = out {
            let values = flat_of::<A>(&t)?;
            let target: &mut [A] = if o == 0 {
                &mut *params
            } else {
                &mut *views[o - 1]
            };
            target.copy_from_slice(values);
        }
    }
    Ok(())
}

/// Gives a finished step's transient HBM back to the heaps (which coalesce
/// freed neighbours).
pub fn release_step_memory(world: &mut World) {
    let finished = world
        .get_resource::<ShardedStep>()
        .is_some_and(|s| !s.is_pending() && !s.released);
    if !finished {
        return;
    }
    let Some(mut step) = world.remove_resource::<ShardedStep>() else {
        return;
    };
    for (device, offset) in std::mem::take(&mut step.transient) {
        // A block this step reserved, so the heap holds it; a world
        // restored under the step has new heaps without it.
        if release(world, device, offset).is_err() {
            step.release_errors += 1;
        }
    }
    step.released = true;
    world.insert_resource(step);
}
