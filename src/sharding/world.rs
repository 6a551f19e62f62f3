//! The world work of building a sharded model, as world functions: which
//! devices it spans ([`participants`]), placing it on them with its state
//! resident in their HBM ([`place_model`]), and compiling the fused update
//! each shard runs ([`compile_update`]). The host API
//! (`optirs_tpu::training::ShardedOptimizer`) calls these; it holds no
//! world logic of its own.

use std::sync::Arc;

use bevy_ecs::prelude::{Entity, With};
use bevy_ecs::world::World;

use crate::collectives::pod::{multislice_of, torus_of};
use crate::compiler;
use crate::error::{OptimError, Result};
use crate::exec::runtime::{Element, Runtime};
use crate::exec::update_graph;
use crate::health::{DeviceState, Excluded};
use crate::memory::device as hbm;
use crate::optimizers::{FloatElement, UpdateRule};
use crate::topology::{Device, DeviceId, DeviceIndex, HbmCapacity, PodTopology};

use super::model::install_model;
use super::{
    Mesh, MeshAxisName, PhysicalAxis, ShardLayout, ShardPlan, ShardedModel, ShardingError,
    SlotValues,
};

/// The devices a model is sharded over and how: the whole torus when every
/// device is up and not excluded, otherwise a ring of the others. On a
/// multislice pod every device, hierarchically (ICI inside each slice, DCN
/// across); a multislice pod with a device down is refused (a ring across
/// slices is not built).
pub fn participants(world: &mut World) -> Result<(Vec<DeviceId>, ShardPlan)> {
    let topology = &world.resource::<PodTopology>().0;
    let multislice = topology.slices > 1;
    let (shape, plan) = if multislice {
        let ms = multislice_of(topology)?;
        let plan = ShardPlan::Multislice {
            dims: ms.slice().dims().to_vec(),
            wraparound: ms.slice().wraparound().to_vec(),
            slices: ms.slices(),
        };
        (ms.grid(), plan)
    } else {
        let shape = torus_of(topology)?;
        let plan = ShardPlan::Torus {
            dims: shape.dims().to_vec(),
            wraparound: shape.wraparound().to_vec(),
        };
        (shape, plan)
    };
    let mut q = world.query::<(&Device, &DeviceState, Option<&Excluded>)>();
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

/// The layout of `tensors` (of `dtype`, in buckets of `bucket_bytes`)
/// under `strategy` on the mesh `sizes` (the pod's default if `None`), and
/// the mesh to keep in the model (`None` when it is the default): the
/// participants and plan of [`participants`]; under zero2 and fsdp the
/// state is replicated along the mesh's data axis
/// ([`ShardLayout::on_mesh`]). A mesh that does not lay out on the pod is
/// [`ShardingError::Mesh`]; a mesh other than the default on a ring of
/// survivors is [`ShardingError::MeshNotBuilt`].
pub fn layout_for(
    world: &mut World,
    (strategy, sizes): (
        crate::sharding::Strategy,
        Option<crate::sharding::MeshSizes>,
    ),
    dtype: crate::ir::DType,
    tensors: &[(String, Vec<usize>)],
    bucket_bytes: usize,
) -> Result<(ShardLayout, Option<Mesh>)> {
    let topology = world.resource::<PodTopology>().0.clone();
    let default = Mesh::default_for(&topology);
    let mesh = match sizes {
        Some(sizes) => sizes.lay_out(&topology).map_err(ShardingError::from)?,
        None => default.clone(),
    };
    let (participants, plan) = participants(world)?;
    let data: Vec<usize> = match &plan {
        ShardPlan::Ring { .. } if mesh != default => {
            return Err(ShardingError::MeshNotBuilt {
                mesh: mesh.to_string(),
                reason: format!(
                    "devices of {} are down or excluded, and a ring of the survivors has no \
                     mesh axes",
                    topology.name
                ),
            }
            .into());
        }
        ShardPlan::Ring { .. } => Vec::new(),
        ShardPlan::Torus { dims, .. } | ShardPlan::Multislice { dims, .. } => {
            let slice_axis = dims.len();
            mesh.axis(MeshAxisName::Data)
                .map(|a| {
                    a.physical
                        .iter()
                        .map(|p| match p {
                            PhysicalAxis::Torus(d) => *d,
                            PhysicalAxis::Slices => slice_axis,
                        })
                        .collect()
                })
                .unwrap_or_default()
        }
    };
    let replicated_state = matches!(
        strategy,
        crate::sharding::Strategy::Zero2 | crate::sharding::Strategy::Fsdp
    );
    let mirrored: &[usize] = if replicated_state { &data } else { &[] };
    let layout = ShardLayout::on_mesh(dtype, tensors, bucket_bytes, participants, plan, mirrored)?;
    Ok((layout, (mesh != default).then_some(mesh)))
}

/// Places `model` on its participants: every device's HBM becomes
/// `hbm_bytes` if given, the participants are marked as holding the
/// model's state and their heaps rebuilt, then the model and its state
/// shards (`slots`) are installed.
pub fn place_model<A: FloatElement>(
    world: &mut World,
    hbm_bytes: Option<u64>,
    model: ShardedModel,
    slots: SlotValues<A>,
) -> Result<()> {
    if let Some(bytes) = hbm_bytes {
        let mut q = world.query_filtered::<Entity, With<Device>>();
        let all: Vec<_> = q.iter(world).collect();
        for device in all {
            world.entity_mut(device).insert(HbmCapacity(bytes));
        }
    }
    let entities: Vec<_> = model
        .layout
        .participants
        .iter()
        .filter_map(|&d| world.resource::<DeviceIndex>().get(d))
        .collect();
    hbm::mark(world, &entities);
    hbm::rebuild_heaps(world)?;
    Ok(install_model(world, model, slots)?)
}

/// The fused update of `rule` over a flat shard of `len` elements, its
/// outputs over its inputs (params over param 0, slot `k` over param
/// `k + 2`).
pub fn compile_update<A: FloatElement + Element>(
    rule: &dyn UpdateRule<A>,
    len: usize,
) -> Result<Arc<Runtime>> {
    let mut world = compiler::compiler_world();
    let program = update_graph::build_update_graph(&mut world, rule, &[len]).map_err(|e| {
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
