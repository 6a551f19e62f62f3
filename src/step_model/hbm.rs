//! A device's HBM at the peak of a model's training step, by kind, each
//! kind in its own element type: what decides whether a layout fits.
//!
//! The peak is at the start of the backward pass, where every layer's saved
//! activations are held at once:
//!
//! ```text
//! peak = params + grads + state + master + redundant    (resident; replicated and zero2 keep
//!                                                        a compute-type replica beside an f32 master shard)
//!      + gathered weights + a weight's gradient          (in flight, the compute type)
//!      + saved activations (the scan carry included)     (model::memory, the activations' type)
//!      + max(logits buffers, one layer's working set)    (the loss, then each layer's backward,
//!                                                        with an expert axis's all-to-all buffers)
//!      + a pipeline's loop state                         (with a stage axis)
//! ```
//!
//! **Weights in flight.** XLA gathers each weight of a layer when its
//! matmul comes (one all-gather per weight, scheduled ahead by the
//! latency-hiding scheduler), and reduce-scatters each weight's gradient
//! as the backward produces it; so what a step holds in flight is
//! matrices, not layers: fsdp's `prefetch + 1` gathered weights and one
//! gradient, each the layer's largest matrix in the compute type (the
//! step's timing gathers a layer's worth per use, the same bytes). The
//! output matrix (`vocab × embed`), gathered for the logits with its
//! gradient, is held with the logits.
//!
//! The logits and their gradient are freed once the logits'
//! backward has run, before the first layer's backward rematerializes its
//! intermediates, so the two transients do not add. The saved activations
//! follow the remat policy ([`crate::model::memory`]) and, like every
//! activation, are `tokens_per_device × width` on each device whatever the
//! tensor axis. Every published MaxText run fits with this account
//! (`tests/validation.rs` reports each margin).

use serde::Serialize;

use crate::cost_model::StrategyStep;
use crate::model::{
    ModelConfig, ModelDType, activation_memory_per_layer, layer_working_set, logits_buffers,
    parameter_count,
};
use crate::sharding::{MeshAxisName, Strategy};
use crate::units::bytes as binary_bytes;

/// The most elements of one weight matrix of a layer: the query or output
/// projection (`embed × heads × head_dim`, or MLA's largest) or an MLP
/// matrix (`embed × mlp_dim`, or a mixture's stacked experts), the widest
/// layer's where they differ.
pub fn largest_layer_matrix(config: &ModelConfig) -> u64 {
    largest_layer_matrix_on(config, 1)
}

/// [`largest_layer_matrix`] on a mesh whose `expert` axis holds
/// `experts_split` ways of a mixture's stacked experts.
fn largest_layer_matrix_on(config: &ModelConfig, experts_split: u64) -> u64 {
    let (dense, moe) = config.dense_and_moe_layers();
    let dense_mlp = if dense > 0 {
        config.embed * config.mlp_dim
    } else {
        0
    };
    let experts = match &config.moe {
        Some(m) if moe > 0 => {
            (m.num_experts * config.embed * m.moe_mlp_dim).div_ceil(experts_split.max(1))
        }
        _ => 0,
    };
    config
        .largest_attention_matrix()
        .max(dense_mlp)
        .max(experts)
}

/// Buffers beside the model's own: an expert axis's all-to-all buffers
/// during an MoE layer ([`super::expert_parallel`]) and a pipeline's loop
/// state ([`super::pipeline`]), bytes per device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Buffers {
    /// The all-to-all send and receive buffers.
    pub all_to_all: u64,
    /// The pipeline's loop state.
    pub pipeline_loop: u64,
}

/// HBM per device by kind at the step's peak, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ModelHbm {
    /// Parameters: under fsdp the shard (`weight_dtype`); replicated and
    /// zero2 a replica in the compute type (`dtype`) when it is narrower.
    pub params: u64,
    /// Gradient buffers: the whole model (replicated) or the shard.
    pub grads: u64,
    /// Optimizer state: every slot's shard (`f32`).
    pub state: u64,
    /// replicated and zero2: the parameters' shard in their own type, the
    /// master copy beside the compute-type replica (ZeRO's mixed
    /// precision; 0 under fsdp, whose shard is the parameters).
    pub master: u64,
    /// The redundant policy's copies of a peer's shards.
    pub redundant: u64,
    /// fsdp's gathered buckets in flight (one layer each).
    pub gathered: u64,
    /// The gradient bucket being reduce-scattered (zero2, fsdp).
    pub gradient_bucket: u64,
    /// Every layer's saved activations under the remat policy, the scan's
    /// carry included.
    pub activations: u64,
    /// The logits and their gradient (the activations' type: the f32 cast
    /// fuses into the loss), at the loss.
    pub logits: u64,
    /// One layer's rematerialized intermediates and gradients, during its
    /// backward pass.
    pub layer_working: u64,
    /// An expert axis's all-to-all buffers during an MoE layer (with its
    /// working set).
    pub all_to_all_buffers: u64,
    /// A pipeline's loop state (with a stage axis).
    pub pipeline_buffers: u64,
    /// The peak: all but the two transients, plus the larger of them.
    pub total: u64,
    /// A device's HBM.
    pub capacity: u64,
    /// `capacity − total`: what is left at the peak (negative: over).
    pub margin: i64,
}

impl ModelHbm {
    /// Whether the peak fits the device.
    pub fn fits(&self) -> bool {
        self.total <= self.capacity
    }
}

/// The element types the account charges each kind in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HbmTypes {
    /// Parameters (`weight_dtype`).
    pub params: ModelDType,
    /// Gradient shards (`grad_dtype`, else the parameters').
    pub grads: ModelDType,
    /// Adam's first moment (`mu_dtype`, else the parameters'); the other
    /// slots are in the parameters' type, as optax keeps them.
    pub state: ModelDType,
    /// Activations (`dtype`).
    pub activations: ModelDType,
    /// The logits and the loss.
    pub logits: ModelDType,
}

impl HbmTypes {
    /// The types of `config`'s step.
    pub fn of(config: &ModelConfig) -> HbmTypes {
        HbmTypes {
            params: config.weight_dtype,
            grads: config.grad_type(),
            state: config.mu_type(),
            activations: config.activation_dtype,
            logits: config.activation_dtype,
        }
    }
}

/// `config`'s peak HBM on a device of `capacity` bytes under the strategy
/// of `step` (module docs), one layer's backward on `working`'s batch (a
/// pipeline's microbatch), its logits on `outside`'s batch (the whole
/// model's when `config` is a pipeline stage's).
pub fn model_hbm(
    (config, outside, working): (&ModelConfig, &ModelConfig, &ModelConfig),
    step: &StrategyStep,
    capacity: u64,
    buffers: Buffers,
) -> ModelHbm {
    let activations = saved_activation_bytes(config);
    let tensor = step.mesh.size(MeshAxisName::Tensor).max(1) as f64;
    let compute = config.activation_dtype.byte_size() as f64;
    // A weight in flight, gathered or its gradient before the
    // reduce-scatter: the largest matrix of a layer (module docs).
    let experts_split = step.mesh.size(MeshAxisName::Expert) as u64;
    let matrix =
        (largest_layer_matrix_on(config, experts_split) as f64 * compute / tensor).ceil() as u64;
    let (gathered, gradient_bucket) = match step.strategy {
        Strategy::Fsdp => ((step.prefetch as u64 + 1) * matrix, matrix),
        Strategy::Zero2 => (0, matrix),
        Strategy::Replicated => (0, 0),
    };
    // The logits' buffers, and under fsdp the output matrix gathered for
    // them and its gradient.
    let output_matrix = match step.strategy {
        Strategy::Fsdp => 2.0 * (config.vocab * config.embed) as f64 * compute / tensor,
        Strategy::Zero2 | Strategy::Replicated => 0.0,
    };
    let logits = (logits_buffers(outside) + output_matrix).ceil() as u64;
    let layer_working = layer_working_set(working).ceil() as u64;
    let layer_transient = layer_working.saturating_add(buffers.all_to_all);
    let mut m = step.memory;
    m.gathered_buckets = gathered;
    m.gradient_bucket = gradient_bucket;
    // What lives in the host's memory instead (`super::offload`).
    if config.optimizer_memory_host_offload {
        m.state = 0;
    }
    if config.parameter_memory_host_offload {
        m.params = 0;
        m.master = 0;
    }
    let total = [
        m.params,
        m.grads,
        m.state,
        m.master,
        m.redundant_state,
        m.gathered_buckets,
        m.gradient_bucket,
        activations,
        buffers.pipeline_loop,
        logits.max(layer_transient),
    ]
    .iter()
    .fold(0u64, |sum, &b| sum.saturating_add(b));
    ModelHbm {
        params: m.params,
        grads: m.grads,
        state: m.state,
        master: m.master,
        redundant: m.redundant_state,
        gathered: m.gathered_buckets,
        gradient_bucket: m.gradient_bucket,
        activations,
        logits,
        layer_working,
        all_to_all_buffers: buffers.all_to_all,
        pipeline_buffers: buffers.pipeline_loop,
        total,
        capacity,
        margin: i64::try_from(i128::from(capacity) - i128::from(total)).unwrap_or(i64::MIN),
    }
}

/// Every layer's saved activations under `config`'s remat policy on one
/// device (the scan's carry included): the part of the peak no strategy,
/// prefetch or reduction schedule changes.
pub fn saved_activation_bytes(config: &ModelConfig) -> u64 {
    let layers = parameter_count(config).layers as f64;
    (activation_memory_per_layer(config).device_bytes * layers).ceil() as u64
}

/// What does not fit, and by how much: the one message `train` prints and
/// `goodput` refuses with.
pub fn not_fitting(config: &ModelConfig, hbm: &ModelHbm) -> Option<String> {
    (!hbm.fits()).then(|| {
        format!(
            "{} per device at the step's peak (weights, gradients and state {}, fsdp buffers {}, \
             activations {} under remat {}, logits or a layer's backward {}{}) of {}: {} over",
            binary_bytes(hbm.total),
            binary_bytes(hbm.params + hbm.grads + hbm.state + hbm.master + hbm.redundant),
            binary_bytes(hbm.gathered + hbm.gradient_bucket),
            binary_bytes(hbm.activations),
            config.remat.name(),
            binary_bytes(
                hbm.logits
                    .max(hbm.layer_working.saturating_add(hbm.all_to_all_buffers))
            ),
            if hbm.pipeline_buffers > 0 {
                format!(", pipeline loop {}", binary_bytes(hbm.pipeline_buffers))
            } else {
                String::new()
            },
            binary_bytes(hbm.capacity),
            binary_bytes(hbm.total - hbm.capacity)
        )
    })
}
