//! Expert parallelism in a model's step: the mesh's `expert` axis splits a
//! mixture's experts over its `X` devices (MaxText's `exp` on `expert`,
//! `ici_/dcn_expert_parallelism`), each device holding `E/X` of them, and
//! shards every other weight over it as over `fsdp` (MaxText's `embed` on
//! `fsdp` and `expert`; [`crate::sharding::strategy::bucket_plan_with_experts`]).
//! The tokens stay sharded over it as over `fsdp` (`activation_batch`), so
//! attention runs as it does without the axis.
//!
//! **The all-to-alls.** Each MoE layer sends every token's routed rows to
//! the devices holding their experts and the results back: two all-to-alls
//! a forward pass of `T · r · D` elements of the activations' type per
//! device (`T` the device's tokens, `r` the routed rows a token takes:
//! `k` dropless, the capacity's `E·C/S` dropping,
//! [`crate::model::MixtureOfExperts::routed_rows_per_token`]; `D` the
//! embedding), each timed on the expert axis's links
//! ([`crate::cost_model::axis_all_to_all`]). The backward
//! runs their transposes (two more), plus the recomputed forward's under
//! the remat policy, as the tensor axis's collectives are counted
//! ([`super::tensor`]). On a model whose first layers are dense (or whose
//! mixtures are interleaved) only the MoE layers send: the step's layer is
//! the average one, so it carries their share.
//!
//! **Ring of experts** (`use_ring_of_experts`): the layer's input is
//! all-gathered over the axis (`X·T·D` elements a device, where the
//! dispatch sends `T·r·D`) and the output reduce-scattered back, in place
//! of the two all-to-alls; the receive buffer is the gathered input.
//! It moves more bytes whenever `X > r`, but on a ring's neighbours only.
//!
//! **Overlap.** The routed experts' matmuls need the dispatched tokens and
//! the next layer needs the combined ones, so the all-to-alls are on the
//! layer's critical path; the only matmuls that do not depend on them are
//! the shared experts' (every token runs them, from the layer's input), and
//! XLA's asynchronous collectives run the all-to-alls under those. What the
//! shared experts do not cover is exposed: with none, all of it.
//!
//! **HBM.** During an MoE layer a device holds its send buffer (`T·r·D`)
//! and its receive buffer, sized for the most it can be sent: dropless,
//! every token of the `X` devices routed to its `E/X` experts,
//! `T · min(k·X, E) · D` (MaxText's `ragged_all_to_all` output buffer);
//! dropping, the capacity's `T·r·D`.

use serde::Serialize;

use super::{LayerCompute, StepModelError};
use crate::cost_model::{AxisCollective, axis_all_to_all, axis_collective};
use crate::model::ModelConfig;
use crate::sharding::strategy::CollectiveKind;
use crate::sharding::{Mesh, MeshAxisName};
use crate::topology::Topology;

/// A layer's expert-parallel all-to-alls on one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ExpertParallel {
    /// Devices along `expert`.
    pub size: usize,
    /// Experts each device holds.
    pub experts_per_device: u64,
    /// One all-to-all of a layer's routed tokens (dispatch or combine);
    /// under `use_ring_of_experts`, the all-gather of its input.
    pub all_to_all: AxisCollective,
    /// A layer's forward all-to-alls, seconds.
    pub forward_seconds: f64,
    /// A layer's backward all-to-alls (with the recomputed forward's),
    /// seconds.
    pub backward_seconds: f64,
    /// Of the forward's, the seconds the shared experts' matmuls cover.
    pub forward_hidden_seconds: f64,
    /// Of the backward's, the seconds the shared experts' matmuls cover.
    pub backward_hidden_seconds: f64,
    /// The send and receive buffers during an MoE layer, bytes.
    pub buffer_bytes: u64,
    /// Of every parameter, the fraction that is expert weights (split over
    /// the axis).
    pub expert_share: f64,
}

/// `config`'s expert-parallel all-to-alls on `mesh` (none when `expert` is
/// 1), with `recompute` of the forward rerun in the backward and the
/// layer's compute `layer` (the shared experts' share of it covers the
/// all-to-alls). Errors: an expert axis on a dense model, or an expert
/// count the axis does not divide.
pub fn expert_parallel(
    config: &ModelConfig,
    topology: &Topology,
    mesh: &Mesh,
    recompute: f64,
    layer: &LayerCompute,
) -> Result<Option<ExpertParallel>, StepModelError> {
    let x = mesh.size(MeshAxisName::Expert);
    if x <= 1 {
        return Ok(None);
    }
    let Some(moe) = &config.moe else {
        return Err(StepModelError::Field {
            field: "mesh",
            value: mesh.to_string(),
            problem: format!(
                "expert={x} splits a mixture's experts over its devices, but {} is dense (it \
                 sets no moe): use fsdp or data for these devices",
                config.name
            ),
        });
    };
    if !moe.num_experts.is_multiple_of(x as u64) {
        return Err(StepModelError::Field {
            field: "num_experts",
            value: moe.num_experts.to_string(),
            problem: format!(
                "expert={x} splits the experts over its devices: {} is not a multiple of {x}",
                moe.num_experts
            ),
        });
    }
    // The step model's layer is the average one ([`crate::model`]): the
    // all-to-alls and the shared experts are the MoE layers' share of it.
    let (_, moe_layers) = config.dense_and_moe_layers();
    let share = moe_layers as f64 / config.layers.max(1) as f64;
    let tokens = config.tokens_per_device();
    let rows = moe.routed_rows_per_token(config.seq_len);
    let embed = config.embed as f64;
    let elem = config.activation_dtype.byte_size() as usize;
    let send = (tokens * rows * embed).ceil();
    let (all_to_all, pass) = if moe.use_ring_of_experts {
        // Ring of experts: the layer's input gathered over the axis and
        // the output reduce-scattered back, [X·T, D] each.
        let gathered = (tokens * x as f64 * embed).ceil() as usize;
        let on = |kind| axis_collective(topology, mesh, MeshAxisName::Expert, kind, gathered, elem);
        let gather = on(CollectiveKind::AllGather)?;
        let scatter = on(CollectiveKind::ReduceScatter)?;
        (gather, gather.seconds + scatter.seconds)
    } else {
        let a2a = axis_all_to_all(topology, mesh, MeshAxisName::Expert, send as usize, elem)?;
        (a2a, 2.0 * a2a.seconds)
    };
    let forward = pass * share;
    let backward = forward * (1.0 + recompute);
    // The shared experts' matmuls, from the layer's input: their share of
    // the layer's matmul FLOPs, at the pass's rate.
    let shared_flops = 2.0
        * tokens
        * embed
        * moe.moe_mlp_dim as f64
        * (config.mlp_activations.len() + 1) as f64
        * moe.shared_experts as f64
        * share;
    let covered = |pass: &super::PassCompute, flops: f64| {
        if pass.flops > 0.0 {
            pass.seconds * (flops / pass.flops).min(1.0)
        } else {
            0.0
        }
    };
    let forward_hidden = covered(&layer.forward, shared_flops).min(forward);
    let backward_hidden = covered(&layer.backward, 2.0 * shared_flops).min(backward);
    let receive = match moe.capacity(config.seq_len) {
        _ if moe.use_ring_of_experts => tokens * x as f64 * embed,
        None => tokens * (moe.num_experts_per_tok * x as u64).min(moe.num_experts) as f64 * embed,
        Some(_) => send,
    };
    let counts = crate::model::parameter_count(config);
    let expert_weights = crate::model::MixtureOfExperts::routed_weights_of(config) as f64;
    Ok(Some(ExpertParallel {
        size: x,
        experts_per_device: moe.num_experts / x as u64,
        all_to_all,
        forward_seconds: forward,
        backward_seconds: backward,
        forward_hidden_seconds: forward_hidden,
        backward_hidden_seconds: backward_hidden,
        buffer_bytes: ((send + receive) * elem as f64).ceil() as u64,
        expert_share: (expert_weights / counts.total().max(1) as f64).clamp(0.0, 1.0),
    }))
}
