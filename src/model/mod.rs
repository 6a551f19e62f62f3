//! Transformer decoders as MaxText describes them, and what a training
//! step of one costs by MaxText's own count.
//!
//! - [`attention`]: the attention kernel and multi-head latent attention,
//!   and the widths every attention has.
//! - [`config`]: [`ModelConfig`] from RON (file, line and field in every
//!   error), its validation, the global batch, MaxText's
//!   `global_parameter_scale` rule.
//! - [`flops`]: MaxText's training FLOPs per device per step in each of its
//!   formula versions, and the parameter count.
//! - [`memory`]: activation bytes per layer by remat policy.
//! - [`programs`]: one decoder layer's forward and backward and the
//!   logits' as compiler programs, costed ([`layer_programs`]).
//! - [`published`]: MaxText's published v5e and v5p throughput tables.
//!
//! Bundled configs are embedded, so the binary finds them from any
//! directory. `docs/models.md` has the sources.

pub mod attention;
pub mod config;
pub mod error;
pub mod experts;
pub mod flops;
mod layer_graph;
pub mod memory;
pub mod programs;
pub mod published;
pub mod quantization;

pub use attention::MultiHeadLatentAttention;
pub use config::{
    AttentionKernel, DecoderBlock, ModelConfig, ModelDType, Placement, Quantization, RematPolicy,
    SlidingWindow, parameter_scales,
};
pub use error::ModelError;
pub use experts::MixtureOfExperts;
pub use flops::{
    FlopFormula, LayerMatmulFlops, MlpFlops, ParameterCount, TrainingFlops, active_parameter_count,
    calculate_tflops_training_per_device, layer_matmul_flops, mlp_flops, parameter_count,
    training_flops_per_device,
};
pub use memory::{
    ActivationMemory, activation_memory_per_layer, layer_working_set, logits_buffers,
};
pub use programs::{LayerPrograms, LayerWeight, ProgramCosts, layer_programs};
pub use published::{Published, PublishedRow, maxtext_published};

/// The bundled models' names, in `bundled` order.
pub const BUNDLED_NAMES: [&str; 23] = [
    "maxtext-v5e-16b",
    "maxtext-v5e-32b",
    "maxtext-v5e-64b",
    "maxtext-v5e-128b",
    "maxtext-v5p-32b",
    "maxtext-v5p-64b",
    "maxtext-v5p-128b",
    "maxtext-v5p-256b",
    "maxtext-v5p-512b",
    "maxtext-v5p-1024b",
    "llama2-7b",
    "llama2-70b",
    "gpt3-175b",
    "llama3.1-8b",
    "llama3.1-70b",
    "llama3.1-405b",
    "mistral-7b",
    "gemma3-12b",
    "mixtral-8x7b",
    "mixtral-8x22b",
    "deepseek3-671b",
    "llama4-17b-16e",
    "llama4-17b-128e",
];

const BUNDLED_TEXT: [&str; 23] = [
    include_str!("../../assets/models/maxtext-v5e-16b.ron"),
    include_str!("../../assets/models/maxtext-v5e-32b.ron"),
    include_str!("../../assets/models/maxtext-v5e-64b.ron"),
    include_str!("../../assets/models/maxtext-v5e-128b.ron"),
    include_str!("../../assets/models/maxtext-v5p-32b.ron"),
    include_str!("../../assets/models/maxtext-v5p-64b.ron"),
    include_str!("../../assets/models/maxtext-v5p-128b.ron"),
    include_str!("../../assets/models/maxtext-v5p-256b.ron"),
    include_str!("../../assets/models/maxtext-v5p-512b.ron"),
    include_str!("../../assets/models/maxtext-v5p-1024b.ron"),
    include_str!("../../assets/models/llama2-7b.ron"),
    include_str!("../../assets/models/llama2-70b.ron"),
    include_str!("../../assets/models/gpt3-175b.ron"),
    include_str!("../../assets/models/llama3.1-8b.ron"),
    include_str!("../../assets/models/llama3.1-70b.ron"),
    include_str!("../../assets/models/llama3.1-405b.ron"),
    include_str!("../../assets/models/mistral-7b.ron"),
    include_str!("../../assets/models/gemma3-12b.ron"),
    include_str!("../../assets/models/mixtral-8x7b.ron"),
    include_str!("../../assets/models/mixtral-8x22b.ron"),
    include_str!("../../assets/models/deepseek3-671b.ron"),
    include_str!("../../assets/models/llama4-17b-16e.ron"),
    include_str!("../../assets/models/llama4-17b-128e.ron"),
];

/// The RON text of a bundled model.
pub fn bundled_text(name: &str) -> Option<&'static str> {
    BUNDLED_NAMES
        .iter()
        .position(|n| *n == name)
        .map(|i| BUNDLED_TEXT[i])
}

/// A bundled model, parsed and validated.
pub fn bundled(name: &str) -> Result<ModelConfig, ModelError> {
    let text = bundled_text(name).ok_or_else(|| ModelError::UnknownModel {
        name: name.to_string(),
        known: BUNDLED_NAMES.join(", "),
    })?;
    let config = ModelConfig::from_ron_str(text, &format!("bundled model {name}"))?;
    if config.name != name {
        return Err(ModelError::Invalid {
            origin: format!("bundled model {name}"),
            line: None,
            field: "name".into(),
            problem: format!("the file names itself `{}`", config.name),
        });
    }
    Ok(config)
}
