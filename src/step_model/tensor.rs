//! Tensor parallelism in a model's step: the mesh's `tensor` axis splits
//! every layer's heads and MLP width (Megatron's column and row split, as
//! MaxText's logical rules put `heads` and `mlp` on `tensor`), so each
//! device holds `1/t` of every weight matrix and runs `1/t` of the layer's
//! matmuls for the `t` devices' tokens together.
//!
//! **Collectives.** MaxText shards the activations' embedding over
//! `tensor` too (`activation_embed`), so a layer's input is all-gathered
//! over the axis before its first matmuls and its output reduce-scattered
//! after the last (sequence-parallel style): `[t · T, embed]` elements of
//! the activation type per device, `T` the device's tokens. A parallel
//! block (MaxText's `default`) does this once per pass, attention and MLP
//! sharing the gathered input and one sum; a sequential one (`llama2`,
//! `gpt3`) twice. The backward runs the transposes (a reduce-scatter for
//! each gather and the reverse), plus the recomputed forward's under the
//! remat policy. Each is timed with the mesh's own rounds on the tensor
//! axis's links ([`axis_collective`]).
//!
//! **Overlap.** MaxText's scripts run XLA's asynchronous collective fusion
//! (`--xla_tpu_enable_async_collective_fusion`,
//! `--xla_tpu_overlap_compute_collective_tc`), which runs these
//! collectives on the tensor axis's links while the layer's matmuls run, so
//! a pass lasts the longer of its compute and its tensor-parallel
//! collectives; what exceeds the compute is exposed.

use serde::Serialize;

use super::StepModelError;
use crate::cost_model::{AxisCollective, axis_collective};
use crate::model::ModelConfig;
use crate::sharding::strategy::CollectiveKind;
use crate::sharding::{Mesh, MeshAxisName};
use crate::topology::Topology;

/// A layer's tensor-parallel collectives on one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TensorParallel {
    /// Devices along `tensor`.
    pub size: usize,
    /// All-gathers (and as many reduce-scatters) in a layer's forward.
    pub per_pass: usize,
    /// One all-gather of a layer's input.
    pub gather: AxisCollective,
    /// One reduce-scatter of a layer's output.
    pub scatter: AxisCollective,
    /// A layer's forward collectives, seconds.
    pub forward_seconds: f64,
    /// A layer's backward collectives (with the recomputed forward's),
    /// seconds.
    pub backward_seconds: f64,
}

/// `config`'s tensor-parallel collectives on `mesh` (none when `tensor` is
/// 1), with `recompute` of the forward rerun in the backward. Errors: a
/// dimension `tensor` does not divide, or a tensor axis across slices.
pub fn tensor_parallel(
    config: &ModelConfig,
    topology: &Topology,
    mesh: &Mesh,
    recompute: f64,
) -> Result<Option<TensorParallel>, StepModelError> {
    let t = mesh.size(MeshAxisName::Tensor);
    if t <= 1 {
        return Ok(None);
    }
    // Each MLP width a layer has: the dense layers' and the mixture's.
    let (dense_layers, moe_layers) = config.dense_and_moe_layers();
    let mut dims = vec![("heads", config.heads), ("kv_heads", config.kv_heads)];
    if dense_layers > 0 {
        dims.push(("mlp_dim", config.mlp_dim));
    }
    if let Some(m) = config.moe.filter(|_| moe_layers > 0) {
        dims.push(("moe_mlp_dim", m.moe_mlp_dim));
    }
    for (field, n) in dims {
        if !n.is_multiple_of(t as u64) {
            return Err(StepModelError::Field {
                field,
                value: n.to_string(),
                problem: format!(
                    "tensor={t} splits {field} over its devices: {n} is not a multiple of {t}"
                ),
            });
        }
    }
    if mesh.crosses_slices(MeshAxisName::Tensor) {
        return Err(StepModelError::Field {
            field: "mesh",
            value: mesh.to_string(),
            problem: "the tensor axis crosses the slices: its per-layer collectives would run \
                      over the DCN, which the step model does not take"
                .into(),
        });
    }
    let elements = (config.tokens_per_device() * t as f64).ceil() * config.embed as f64;
    let elements = elements as usize;
    let elem = config.activation_dtype.byte_size() as usize;
    let on = |kind| axis_collective(topology, mesh, MeshAxisName::Tensor, kind, elements, elem);
    let gather = on(CollectiveKind::AllGather)?;
    let scatter = on(CollectiveKind::ReduceScatter)?;
    let per_pass = if config.decoder_block.is_parallel() {
        1
    } else {
        2
    };
    let pass = per_pass as f64 * (gather.seconds + scatter.seconds);
    Ok(Some(TensorParallel {
        size: t,
        per_pass,
        gather,
        scatter,
        forward_seconds: pass,
        backward_seconds: pass * (1.0 + recompute),
    }))
}

/// `tensors` with each split `t` ways (rounded up): what one device's
/// tensor-parallel slice of the model holds before fsdp shards it.
pub fn split_tensors(tensors: &[(String, Vec<usize>)], t: usize) -> Vec<(String, Vec<usize>)> {
    tensors
        .iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            (name.clone(), vec![n.div_ceil(t.max(1))])
        })
        .collect()
}
