//! The sharded model in the world: [`ShardedModel`] (layout, the
//! parameters stored once, the step count) and, per device, its
//! [`ShardSlot`]s and [`ReplicaParams`], resident in that device's heap.

use bevy_ecs::prelude::*;
use ndarray::{ArrayD, IxDyn};
use serde::{Deserialize, Serialize};

use super::error::{ShardingError, UnknownName};
use super::layout::ShardLayout;
use super::mesh::{Mesh, Strategy};
use super::params::ParamSet;
use super::residency::{ResidencyInput, hbm_bytes_per_device};
use crate::collectives::ReduceOp;
use crate::ir::{FloatElement, Tensor};
use crate::memory::shards::{release_shard, reserve_shards};
use crate::memory::{HeldParams, ReplicaParams, ShardSlot};
use crate::topology::DeviceId;

/// How per-replica gradients are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Reduction {
    /// The sum over replicas.
    Sum,
    /// The sum over replicas divided once by the replica count (the
    /// gradient of the mean loss, as data parallelism usually wants).
    #[default]
    Mean,
}

impl Reduction {
    /// The collectives' operation.
    pub fn op(self) -> ReduceOp {
        match self {
            Reduction::Sum => ReduceOp::Sum,
            Reduction::Mean => ReduceOp::Mean,
        }
    }
}

impl std::str::FromStr for Reduction {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        match s {
            "sum" => Ok(Reduction::Sum),
            "mean" => Ok(Reduction::Mean),
            other => Err(UnknownName {
                what: "reduction",
                name: other.to_owned(),
                known: "sum, mean",
            }),
        }
    }
}

/// A model sharded over the pod (a component of one entity; a pod holds at
/// most one): its layout, its parameters (stored once:
/// every replica holds the same values; each device's HBM is charged for
/// its replica through [`ReplicaParams`]), its optimizer's step count.
#[derive(Component, Debug, Clone, PartialEq)]
pub struct ShardedModel {
    /// The optimizer's name (`adam`).
    pub optimizer: String,
    /// Optimizer-state slot names, in slot order.
    pub slots: Vec<String>,
    /// Packing and sharding.
    pub layout: ShardLayout,
    /// The parameters, flat and padded ([`ShardLayout::padded_elements`]).
    pub params: Tensor,
    /// optax's step count.
    pub count: i32,
    /// Steps completed.
    pub steps_completed: u64,
    /// Steps that failed in flight.
    pub steps_failed: u64,
    /// How gradients are reduced.
    pub reduction: Reduction,
    /// The configured bucket size in bytes (kept for re-sharding).
    pub bucket_bytes: usize,
    /// What the `Recovery` set does when a step fails.
    pub recovery: RecoveryPolicy,
    /// Every recovery so far, oldest first.
    pub recoveries: Vec<RecoveryRecord>,
    /// The next step may not start before this simulated time (a recovery
    /// in progress), ns.
    pub recovering_until_ns: u64,
    /// How parameters, gradients and state are split over the devices
    /// (what each device's HBM holds: [`super::residency`]); the values
    /// and the arithmetic are the same under every strategy.
    pub strategy: Strategy,
    /// Under fsdp, the buckets gathered ahead of the one in use.
    pub prefetch: usize,
    /// The mesh the model is laid out on, `None` for the pod's default
    /// ([`Mesh::default_for`]; also after a re-shard onto a ring of
    /// survivors, which has no mesh axes).
    pub mesh: Option<Mesh>,
}

/// What the `Recovery` set does after a step failed because devices were
/// lost (killed, paused or declared failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum RecoveryPolicy {
    /// Restore the model from the newest periodic checkpoint, exclude the
    /// lost devices and re-shard onto the survivors (the steps since the
    /// checkpoint are lost).
    #[default]
    Rollback,
    /// Keep a copy of every device's state shards on its successor in the
    /// ring (costs HBM and a transfer per step): a lost device's copy is
    /// promoted and the survivors re-shard, no step is lost. Losing a
    /// device and its successor together is unrecoverable.
    Redundant,
    /// On a cube-built pod (`cubes: (spares: N)` in the pod file): swap
    /// each failed cube for a spare through the optical circuit switches
    /// (their reconfiguration time, [`crate::topology::CubeLayout`]), so
    /// the slice keeps every device and its shape, and restart the step
    /// from the newest periodic checkpoint, as a rollback does (the steps
    /// since are lost). An error when no spare is left.
    SpareCube,
}

impl std::str::FromStr for RecoveryPolicy {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        match s {
            "rollback" => Ok(RecoveryPolicy::Rollback),
            "redundant" => Ok(RecoveryPolicy::Redundant),
            "spare-cube" => Ok(RecoveryPolicy::SpareCube),
            other => Err(UnknownName {
                what: "recovery policy",
                name: other.to_owned(),
                known: "rollback, redundant, spare-cube",
            }),
        }
    }
}

impl std::fmt::Display for RecoveryPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RecoveryPolicy::Rollback => "rollback",
            RecoveryPolicy::Redundant => "redundant",
            RecoveryPolicy::SpareCube => "spare-cube",
        })
    }
}

/// One recovery of the `Recovery` set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecoveryRecord {
    /// The policy applied.
    pub policy: RecoveryPolicy,
    /// The step that failed.
    pub failed_step: u64,
    /// The devices lost (now excluded).
    pub lost_devices: Vec<DeviceId>,
    /// Completed steps undone (a rollback's steps since its checkpoint).
    pub lost_steps: u64,
    /// Modeled recovery time, seconds (module docs of `recovery`): the sum
    /// of `read_seconds`, `reconfigure_seconds` and `reshard_seconds`.
    pub recovery_seconds: f64,
    /// Of it, reading the checkpoint restored (0 from redundant copies).
    #[serde(default)]
    pub read_seconds: f64,
    /// Of it, the optical switches' reconfiguration that swaps cubes
    /// (spare-cube only).
    #[serde(default)]
    pub reconfigure_seconds: f64,
    /// Of it, moving the new state shards to their devices.
    #[serde(default)]
    pub reshard_seconds: f64,
    /// When the failure was seen, ns.
    pub failed_at_ns: u64,
    /// Devices the model runs on afterwards.
    pub devices_after: usize,
    /// Cubes swapped, `[failed, spare]` (spare-cube recoveries only).
    #[serde(default)]
    pub swapped_cubes: Vec<[u32; 2]>,
}

impl ShardedModel {
    /// Bytes a checkpoint of the model writes and a rollback reads back:
    /// the parameters and every optimizer-state slot.
    pub fn checkpoint_bytes(&self) -> u64 {
        (self.layout.elements * self.layout.element_bytes()) as u64 * (1 + self.slots.len() as u64)
    }

    /// Simulated seconds to write (or read back) a checkpoint of the
    /// model on a pod of `hosts` hosts: its bytes through
    /// [`crate::hardware::checkpoint_io_seconds`], the cost `goodput`
    /// charges for each write and read.
    pub fn checkpoint_io_seconds(&self, hosts: u32) -> f64 {
        crate::hardware::checkpoint_io_seconds(self.checkpoint_bytes() as f64, hosts)
    }

    /// `adam over 2 tensors [100000, 17] of f32, 26214400-byte buckets,
    /// mean reduction, rollback recovery`: the model in errors that
    /// compare two of them.
    pub fn describe(&self) -> String {
        let sizes: Vec<String> = self
            .layout
            .tensors
            .iter()
            .map(|t| format!("{}{:?}", t.name, t.shape))
            .collect();
        format!(
            "{} over {} of {} ({}), {}-byte buckets, {:?} reduction, {} recovery",
            self.optimizer,
            if sizes.len() == 1 {
                "1 tensor".to_string()
            } else {
                format!("{} tensors", sizes.len())
            },
            self.layout.dtype,
            sizes.join(", "),
            self.bucket_bytes,
            self.reduction,
            self.recovery
        )
    }

    /// The residency figures of the model as it is laid out now.
    pub fn residency(&self) -> ResidencyInput {
        ResidencyInput::of_layout(
            &self.layout,
            self.strategy,
            self.slots.len(),
            self.prefetch,
            self.recovery == RecoveryPolicy::Redundant,
        )
    }

    /// The parameters as a [`ParamSet`] (a copy).
    pub fn param_set<A: FloatElement>(&self) -> Result<ParamSet<A>, ShardingError> {
        let flat = flat_of::<A>(&self.params)?;
        let mut set = ParamSet::new();
        for spec in &self.layout.tensors {
            let values = flat[spec.offset..spec.offset + spec.len()].to_vec();
            let array = ArrayD::from_shape_vec(IxDyn(&spec.shape), values).map_err(|e| {
                ShardingError::InvalidState {
                    reason: format!("tensor `{}`: {e}", spec.name),
                }
            })?;
            set.insert(spec.name.clone(), array)?;
        }
        Ok(set)
    }

    /// The flat parameters (model elements only).
    pub fn flat_params<A: FloatElement>(&self) -> Result<&[A], ShardingError> {
        Ok(&flat_of::<A>(&self.params)?[..self.layout.elements])
    }
}

/// The flat values of a 1-D tensor of `A`.
pub(crate) fn flat_of<A: FloatElement>(t: &Tensor) -> Result<&[A], ShardingError> {
    A::array_ref(t)
        .and_then(|a| a.as_slice())
        .ok_or_else(|| ShardingError::InvalidState {
            reason: format!(
                "a tensor holds {}, expected flat {}",
                t.tensor_type(),
                A::DTYPE
            ),
        })
}

/// The flat values of a 1-D tensor of `A`, to write.
pub(crate) fn flat_of_mut<A: FloatElement>(t: &mut Tensor) -> Result<&mut [A], ShardingError> {
    let ty = t.tensor_type();
    A::array_mut(t)
        .and_then(|a| a.as_slice_mut())
        .ok_or_else(|| ShardingError::InvalidState {
            reason: format!("a tensor holds {ty}, expected flat {}", A::DTYPE),
        })
}

/// A flat tensor of `values`.
pub(crate) fn flat_tensor<A: FloatElement>(values: Vec<A>) -> Tensor {
    let n = values.len();
    A::into_tensor(ArrayD::from_shape_vec(IxDyn(&[n]), values).expect("1-D of its length"))
}

/// Puts `model` in the world with every device's state shards (from
/// `state`: per slot, the flat padded state, or the slot's initial value)
/// and parameter replica, reserved in each device's heap. On `Err` (a
/// device out of HBM, naming it and the bytes) the world is as before.
pub fn install_model<A: FloatElement>(
    world: &mut World,
    model: ShardedModel,
    state: SlotValues<A>,
) -> Result<(), ShardingError> {
    check_policy(world, model.recovery)?;
    if model.recovery == RecoveryPolicy::Redundant && model.layout.is_mirrored() {
        return Err(ShardingError::MeshNotBuilt {
            mesh: model
                .mesh
                .as_ref()
                .map_or_else(|| "the default mesh".into(), |m| m.to_string()),
            reason: "the redundant policy's copies with a data axis that already replicates \
                     the state are not built; use rollback or spare-cube"
                .into(),
        });
    }
    if model_entity(world).is_some() {
        remove_model(world)?;
    }
    let layout = &model.layout;
    let mut spawned = Vec::new();
    let peers = layout.peers();
    let residency = model.residency();
    let (param_bytes, held) = match model.strategy {
        Strategy::Replicated | Strategy::Zero2 => (
            layout.elements * layout.element_bytes(),
            HeldParams::Replica,
        ),
        Strategy::Fsdp => (
            layout.shard_elements() * layout.element_bytes(),
            HeldParams::Shard,
        ),
    };
    for (r, &device) in layout.participants.iter().enumerate() {
        spawned.push(
            world
                .spawn((
                    ReplicaParams {
                        device,
                        bytes: param_bytes as u64,
                    },
                    held,
                ))
                .id(),
        );
        // Under fsdp a device's parameter shard lives nowhere else: the
        // redundant policy keeps its copy on the successor, with the state.
        if model.strategy == Strategy::Fsdp && residency.redundant {
            spawned.push(
                world
                    .spawn((
                        ReplicaParams {
                            device: layout.participants[peers[r]],
                            bytes: param_bytes as u64,
                        },
                        HeldParams::CopyOf(device),
                    ))
                    .id(),
            );
        }
    }
    debug_assert_eq!(
        super::residency::aligned(param_bytes),
        hbm_bytes_per_device(&residency).params
    );
    spawned.extend(spawn_state_shards(world, &model, &state));
    if let Err(e) = reserve_shards(world) {
        for e in spawned {
            world.despawn(e);
        }
        return Err(e.into());
    }
    world.spawn(model);
    Ok(())
}

/// Every participant's state shards: a primary's with their values (and
/// under the redundant policy their copy on its ring successor), a
/// replica's along the data axis as the HBM it charges
/// ([`HeldParams::StateOf`]). The spawned entities.
fn spawn_state_shards<A: FloatElement>(
    world: &mut World,
    model: &ShardedModel,
    state: &SlotValues<A>,
) -> Vec<Entity> {
    let layout = &model.layout;
    let peers = layout.peers();
    let mut spawned = Vec::new();
    let primaries = layout.primaries();
    let state_bytes = (layout.shard_elements() * layout.element_bytes()) as u64;
    for (index, name) in model.slots.iter().enumerate() {
        for (r, &peer) in peers.iter().enumerate() {
            let device = layout.participants[r];
            let primary = primaries[layout.shard_index[r]];
            if primary != r {
                // A replica along the data axis: its HBM holds the
                // primary's shard; the values are stored once, there.
                spawned.push(
                    world
                        .spawn((
                            ReplicaParams {
                                device,
                                bytes: state_bytes,
                            },
                            HeldParams::StateOf(layout.participants[primary]),
                        ))
                        .id(),
                );
                continue;
            }
            let shard = slot_shard(layout, state, index, r);
            if model.recovery == RecoveryPolicy::Redundant && layout.devices() > 1 {
                spawned.push(
                    world
                        .spawn(ShardSlot {
                            device: layout.participants[peer],
                            owner: device,
                            name: name.clone(),
                            index: index as u32,
                            tensor: flat_tensor(shard.clone()),
                        })
                        .id(),
                );
            }
            spawned.push(
                world
                    .spawn(ShardSlot {
                        device,
                        owner: device,
                        name: name.clone(),
                        index: index as u32,
                        tensor: flat_tensor(shard),
                    })
                    .id(),
            );
        }
    }
    spawned
}

/// Participant `r`'s shard of state slot `index`, bucket by bucket.
fn slot_shard<A: FloatElement>(
    layout: &ShardLayout,
    state: &SlotValues<A>,
    index: usize,
    r: usize,
) -> Vec<A> {
    let mut shard = Vec::with_capacity(layout.shard_elements());
    for b in 0..layout.buckets.len() {
        let range = layout.shard_range(r, b);
        match state {
            SlotValues::Initial(values) => {
                shard.extend(std::iter::repeat_n(values[index], range.len()));
            }
            SlotValues::Flat(flat) => shard.extend_from_slice(&flat[index][range]),
        }
    }
    shard
}

/// Whether the pod can apply `policy` ([`check_recovery_policy`] on its
/// topology), checked before any work.
fn check_policy(world: &World, policy: RecoveryPolicy) -> Result<(), ShardingError> {
    let topology = world
        .get_resource::<crate::topology::PodTopology>()
        .map(|t| &t.0);
    match topology {
        Some(topology) => check_recovery_policy(topology, policy),
        None if policy == RecoveryPolicy::SpareCube => Err(ShardingError::NoSpareCubes {
            pod: "the pod".to_string(),
        }),
        None => Ok(()),
    }
}

/// Whether a pod of `topology` can apply `policy`: a spare-cube recovery
/// needs a pod built of cubes with spares. The one check a real model and
/// the closed-form step (`cost_model::replicated`, a layer above) both apply.
pub fn check_recovery_policy(
    topology: &crate::topology::Topology,
    policy: RecoveryPolicy,
) -> Result<(), ShardingError> {
    if policy == RecoveryPolicy::SpareCube && topology.cubes.map_or(0, |c| c.spares) == 0 {
        return Err(ShardingError::NoSpareCubes {
            pod: topology.name.clone(),
        });
    }
    Ok(())
}

/// The entity holding the pod's [`ShardedModel`], if it has one.
pub fn model_entity(world: &mut World) -> Option<Entity> {
    let mut q = world.query_filtered::<Entity, With<ShardedModel>>();
    q.iter(world).next()
}

/// The pod's [`ShardedModel`], if it has one.
pub fn model_of(world: &World) -> Option<&ShardedModel> {
    world
        .try_query::<&ShardedModel>()
        .and_then(|mut q| q.iter(world).next())
}

/// The pod's [`ShardedModel`], to change.
pub fn model_mut(world: &mut World) -> Option<Mut<'_, ShardedModel>> {
    let e = model_entity(world)?;
    world.get_mut::<ShardedModel>(e)
}

/// Replaces the pod's model with `next` ([`install_model`]); if `next`
/// does not fit (a device out of HBM), the previous model is put back as
/// it was and the error returned.
pub fn replace_model<A: FloatElement>(
    world: &mut World,
    next: ShardedModel,
    state: SlotValues<A>,
) -> Result<(), ShardingError> {
    let previous = take_model(world);
    if let Err(e) = install_model(world, next, state) {
        put_back(world, previous)?;
        return Err(e);
    }
    Ok(())
}

/// The model's entities, removed from the world with their HBM released.
struct TakenModel {
    model: ShardedModel,
    slots: Vec<ShardSlot>,
    replicas: Vec<(ReplicaParams, Option<HeldParams>)>,
}

fn take_model(world: &mut World) -> Option<TakenModel> {
    let model = model_of(world)?.clone();
    let mut q = world.query::<&ShardSlot>();
    let slots = q.iter(world).cloned().collect();
    let mut q = world.query::<(&ReplicaParams, Option<&HeldParams>)>();
    let replicas = q
        .iter(world)
        .map(|(r, h)| (r.clone(), h.copied()))
        .collect();
    remove_model(world).ok()?;
    Some(TakenModel {
        model,
        slots,
        replicas,
    })
}

fn put_back(world: &mut World, taken: Option<TakenModel>) -> Result<(), ShardingError> {
    let Some(taken) = taken else {
        return Ok(());
    };
    for (r, held) in taken.replicas {
        let mut e = world.spawn(r);
        if let Some(held) = held {
            e.insert(held);
        }
    }
    for s in taken.slots {
        world.spawn(s);
    }
    world.spawn(taken.model);
    reserve_shards(world)?;
    Ok(())
}

/// The model as the run started (parameters, every slot's flat padded
/// state, count), kept in memory so that a rollback before the first
/// checkpoint restarts from it, as a job restarting from its
/// initialization would. Not state: the host captures it when it turns
/// checkpoints on.
#[derive(Resource, Debug, Clone)]
pub struct StartingModel {
    /// Flat padded parameters.
    pub params: Tensor,
    /// Per slot, the flat padded state.
    pub state: Vec<Tensor>,
    /// optax's count.
    pub count: i32,
    /// Completed steps it corresponds to.
    pub steps_completed: u64,
}

impl StartingModel {
    /// Captures the world's model as it is now.
    /// On a pod split over ranks every rank takes every rank's shards
    /// (each holds only its own devices'), so all capture the same model.
    pub fn capture<A: FloatElement>(world: &mut World) -> Result<StartingModel, ShardingError> {
        let model = model_of(world).ok_or(ShardingError::NoModel)?.clone();
        let state = match super::ranked::context(world) {
            Some(ctx) => {
                let all = super::ranked::all_slots::<A>(world, &ctx, model.steps_completed)?;
                let slots: Vec<&ShardSlot> = all.iter().collect();
                gather_slots(&model, &slots, &[])?
            }
            None => gather_state::<A>(world)?,
        };
        Ok(StartingModel {
            params: model.params.clone(),
            state: state.into_iter().map(flat_tensor).collect(),
            count: model.count,
            steps_completed: model.steps_completed,
        })
    }
}

/// The state a model is installed with.
#[derive(Debug, Clone)]
pub enum SlotValues<A> {
    /// Every element at the slot's initial value (a fresh optimizer).
    Initial(Vec<A>),
    /// Per slot, the flat padded state (a re-shard or a restore).
    Flat(Vec<Vec<A>>),
}

/// Removes the model, its shards and replicas, releasing their HBM.
pub fn remove_model(world: &mut World) -> Result<(), ShardingError> {
    let mut q = world.query_filtered::<Entity, Or<(With<ShardSlot>, With<ReplicaParams>)>>();
    let entities: Vec<Entity> = q.iter(world).collect();
    for e in entities {
        release_shard(world, e)?;
        world.despawn(e);
    }
    if let Some(e) = model_entity(world) {
        world.despawn(e);
    }
    Ok(())
}

/// Every slot's state gathered from the devices' primary shards into flat
/// padded vectors (slot order), the form a re-shard or checkpoint reads.
pub fn gather_state<A: FloatElement>(world: &mut World) -> Result<Vec<Vec<A>>, ShardingError> {
    let model = model_of(world).ok_or(ShardingError::NoModel)?.clone();
    let mut q = world.query::<&ShardSlot>();
    let slots: Vec<&ShardSlot> = q.iter(world).collect();
    gather_slots(&model, &slots, &[])
}

/// [`gather_state`] over `slots`, taking the shards of the devices in
/// `lost` from their copies (`owner` = the lost device) instead.
pub fn gather_slots<A: FloatElement>(
    model: &ShardedModel,
    slots: &[&ShardSlot],
    lost: &[DeviceId],
) -> Result<Vec<Vec<A>>, ShardingError> {
    let layout = &model.layout;
    let mut flat: Vec<Vec<A>> = vec![vec![A::ZERO; layout.padded_elements()]; model.slots.len()];
    let mut seen = vec![vec![false; layout.shards()]; model.slots.len()];
    for slot in slots {
        let wanted = if lost.contains(&slot.owner) {
            slot.device != slot.owner && !lost.contains(&slot.device)
        } else {
            slot.owner == slot.device
        };
        if !wanted {
            continue;
        }
        let (Some(r), Some(seen_slot)) = (
            layout.replica_of(slot.owner),
            seen.get_mut(slot.index as usize),
        ) else {
            continue;
        };
        let values = flat_of::<A>(&slot.tensor)?;
        if values.len() != layout.shard_elements() {
            return Err(ShardingError::InvalidState {
                reason: format!(
                    "{}'s shard of `{}` has {} elements, the layout gives {}",
                    slot.owner,
                    slot.name,
                    values.len(),
                    layout.shard_elements()
                ),
            });
        }
        for (b, bucket) in layout.buckets.iter().enumerate() {
            let range = layout.shard_range(r, b);
            flat[slot.index as usize][range].copy_from_slice(
                &values[bucket.shard_offset..bucket.shard_offset + bucket.shard_len],
            );
        }
        seen_slot[layout.shard_index[r]] = true;
    }
    if let Some((s, k)) = seen
        .iter()
        .enumerate()
        .find_map(|(s, v)| v.iter().position(|x| !x).map(|k| (s, k)))
    {
        return Err(ShardingError::InvalidState {
            reason: format!(
                "no surviving copy of {}'s shard of `{}`",
                layout.participants[layout.primaries()[k]],
                model.slots[s]
            ),
        });
    }
    Ok(flat)
}
