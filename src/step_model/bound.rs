//! The least a layout's step can take, from its passes alone: what a
//! search over layouts ([`crate::plan`]) prunes by without modeling the
//! collectives.
//!
//! Every layer's forward and backward pass and the logits run one after
//! another on each device's MXU in any strategy's step
//! ([`crate::cost_model::strategy`]'s training order puts them on one
//! compute stream); the collectives and the update only add to it. So the
//! passes' seconds are a lower bound on the step under every strategy,
//! prefetch and data-reduction schedule of the same mesh, model and remat
//! policy (`tests/plan.rs` holds every modeled step to it). The HBM
//! floor ([`hbm_floor`]) is likewise the part of the peak no timing
//! changes; and the model's parameters become buckets here
//! (`model_buckets`) for both the floor and the step.

use super::{
    ModelStepOptions, StepModelError, checked, parameter_count, passes, recomputed_fraction,
};
use crate::ir::DType;
use crate::model::ModelConfig;
use crate::sharding::MeshAxisName;
use crate::sharding::bucket_runs::BucketRuns;
use crate::topology::Topology;

/// The seconds of `config`'s layers' passes and its logits on `options`'
/// mesh, which no step of the layout is shorter than (module docs).
///
/// On a pipelined mesh (a `stage` axis) the bound is the stage's: its
/// layers' passes over the stage's batch and the logits over the whole
/// model's, as its step runs them ([`super::pipeline::stage_config`]),
/// plus the bubble of `options`' schedule, `(P − 1)/(R·M)` of the stage's
/// layer passes; the permutes and reshards only add to it
/// ([`super::pipeline::pipelined`]). `None` for a schedule the step model
/// refuses (modeling it gives the refusal).
pub fn passes_lower_bound(
    config: &ModelConfig,
    topology: &Topology,
    options: &ModelStepOptions,
) -> Result<Option<f64>, StepModelError> {
    let chips = u64::from(topology.num_devices());
    let (stage, bubble_share) =
        match super::pipeline::pipeline_of(config, chips, &options.mesh, options.pipeline) {
            Ok(None) => (None, 0.0),
            Ok(Some((p, m, r))) => (
                Some(super::pipeline::stage_config(config, p)),
                (p - 1) as f64 / (r * m) as f64,
            ),
            Err(_) => return Ok(None),
        };
    let inside = stage.as_ref().unwrap_or(config);
    let (efficiency, _) = checked(inside, topology, options)?;
    let recompute = recomputed_fraction(inside, inside.remat);
    let (layer, _, _) = passes((inside, config), topology, options, (efficiency, recompute))?;
    let layers = parameter_count(inside).layers as f64;
    let layer_passes = (layer.forward.elapsed() + layer.backward.elapsed()) * layers;
    Ok(Some(
        layer_passes * (1.0 + bubble_share) + layer.logits.seconds,
    ))
}

/// The HBM `options`' layout holds at least at its step's peak: the
/// strategy's weights, gradients, optimizer state, master copy and
/// redundant copies (less what the model keeps in host memory) and the
/// saved activations, as [`super::hbm::model_hbm`] counts them, without
/// the step's timeline (a pipeline's: its stage's); `None` for a pipeline
/// the step model refuses. A layout whose floor is above a chip's HBM fits
/// under no timing.
pub fn hbm_floor(
    config: &ModelConfig,
    topology: &Topology,
    options: &ModelStepOptions,
) -> Result<Option<u64>, StepModelError> {
    use crate::sharding::strategy::{ModelSize, StrategyMemory};
    let chips = u64::from(topology.num_devices());
    // A pipeline's stage holds its layers on its devices' share of the
    // batch, as its step models it ([`super::pipeline::stage_config`]).
    let staged;
    let config = match super::pipeline::pipeline_of(config, chips, &options.mesh, options.pipeline)
    {
        Ok(Some(schedule)) => {
            staged = super::pipeline::stage_config(config, schedule.0);
            &staged
        }
        Ok(None) => config,
        Err(_) => return Ok(None),
    };
    let mesh = &options.mesh;
    let t = mesh.size(MeshAxisName::Tensor).max(1);
    let expert_share = match (&config.moe, mesh.size(MeshAxisName::Expert)) {
        (Some(_), x) if x > 1 => {
            let weights = crate::model::MixtureOfExperts::routed_weights_of(config) as f64;
            (weights / parameter_count(config).total().max(1) as f64).clamp(0.0, 1.0)
        }
        _ => 0.0,
    };
    let (_, _, runs) = model_buckets(config, topology, t)?;
    let slots = options.optimizer.slots;
    let model = ModelSize::of_runs(&runs, crate::ir::DType::F32.byte_size(), slots)
        .with_precision(super::precision(config, slots))
        .with_expert_share(expert_share);
    let m = StrategyMemory::of(
        options.strategy,
        mesh,
        &model,
        options.prefetch,
        options.recovery,
    );
    let state = if config.optimizer_memory_host_offload {
        0
    } else {
        m.state
    };
    let (params, master) = if config.parameter_memory_host_offload {
        (0, 0)
    } else {
        (m.params, m.master)
    };
    Ok(Some(
        [
            params,
            m.grads,
            state,
            master,
            m.redundant_state,
            super::hbm::saved_activation_bytes(config),
        ]
        .iter()
        .fold(0u64, |sum, &b| sum.saturating_add(b)),
    ))
}

/// The MXU efficiency a step on `topology` is modeled at when none is
/// given: the generation's fitted constant, or the default for one without
/// (what [`super::model_step`] uses; a search passes it explicitly so
/// that each layout is modeled once, not at the fitted range's ends too).
pub fn default_efficiency(topology: &Topology) -> f64 {
    super::calibration::mxu_efficiency(topology.generation)
        .unwrap_or(super::calibration::DEFAULT_MXU_EFFICIENCY)
}

/// `config`'s parameters as the strategy step takes them: each device's
/// `1/t` of every layer and of the rest, the elements in all, one layer a
/// bucket (its bytes), and the buckets over the pod's devices.
pub(super) fn model_buckets(
    config: &ModelConfig,
    topology: &Topology,
    t: usize,
) -> Result<(usize, usize, BucketRuns), StepModelError> {
    let counts = parameter_count(config);
    let per_layer = counts.per_layer().div_ceil(t as u64);
    let rest = counts.outside_layers().div_ceil(t as u64);
    let elements = per_layer
        .checked_mul(counts.layers)
        .and_then(|e| e.checked_add(rest))
        .unwrap_or(u64::MAX);
    let elements = usize::try_from(elements).unwrap_or(usize::MAX);
    let bucket_bytes = (per_layer as usize)
        .saturating_mul(DType::F32.byte_size())
        .max(1);
    let runs = BucketRuns::new(
        elements,
        DType::F32,
        bucket_bytes,
        topology.num_devices() as usize,
    )?;
    Ok((elements, bucket_bytes, runs))
}
