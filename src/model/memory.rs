//! Activation memory a training step keeps per decoder layer, by remat
//! policy: what the backward pass reads that the policy saves, per token,
//! times the tokens on a device, times the activation dtype's size.
//!
//! A remat policy (`jax.checkpoint`'s) chooses among the *residuals*, the
//! forward values the backward pass reads; a value nothing in the backward
//! reads is neither saved nor recomputed, whatever the policy names. So
//! the output projection of a parallel block (MaxText's `default`: it is
//! only added to the residual) and every block's `mlpwo` (likewise) are
//! never kept; a sequential block's output projection is (the
//! post-attention norm's input is the residual plus it).
//!
//! Per token, in elements (`e` embed, `h`/`kv` heads, `d` head_dim, `m`
//! mlp_dim, `n` MLP input matrices):
//!
//! | tensor | elements | saved by |
//! |---|---|---|
//! | layer input (scan carry) | `e` | every policy |
//! | `query_proj`, `key_proj`, `value_proj` | `(h + 2 kv) d` | minimal, minimal_flash, save_dot_except_mlpwi, save_dot_except_mlp, save_qkv_proj, none (host: qkv_proj_offloaded, minimal_offloaded) |
//! | `out_proj` (sequential blocks: `llama2`, `gpt3`) | `e` | minimal, minimal_flash, save_dot_except_mlpwi, save_dot_except_mlp, save_out_proj, none (host: minimal_offloaded) |
//! | MLP input matmuls (`n` of them) | `n m` | minimal, minimal_flash, none (host: minimal_offloaded) |
//! | attention output (`context`) | `h d` | minimal_flash, none |
//! | the norm outputs (one in a parallel block, two in a sequential one) and the MLP activation's output | `norms · e + m` | none |
//!
//! `custom` places each named tensor itself (`query_proj`, `key_proj` and
//! `value_proj` apart: `h d`, `kv d`, `kv d`): `device` keeps it in HBM,
//! `offload` in the host's memory, `remat` neither; the layer input is
//! kept on the device or offloaded like the others.
//!
//! `none` is a floor: XLA keeps whatever else the backward pass reads
//! (softmax statistics, the score matrix under dot-product attention),
//! which depends on the attention kernel.
//!
//! **Sharding.** MaxText shards the activations' batch over `data` and
//! `fsdp` and their embedding, heads and MLP width over `tensor`
//! (`activation_batch`, `activation_embed`, `activation_heads`,
//! `activation_mlp`): a tensor group of `t` devices holds `t` devices'
//! sequences, each device `1/t` of every width. A device therefore keeps
//! `tokens_per_device × elements` whatever `t`, which is what this module
//! counts.
//!
//! Beside the saved activations, the backward pass of one layer holds that
//! layer's rematerialized intermediates and gradients
//! ([`layer_working_set`]), and the loss holds the logits
//! ([`logits_buffers`]); `step_model` puts them in its HBM account.

use super::config::{ModelConfig, Placement, RematPolicy};

/// What one decoder layer keeps between forward and backward on one
/// device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ActivationMemory {
    /// Elements kept per token in HBM.
    pub device_elements_per_token: u64,
    /// Elements per token offloaded to host memory.
    pub host_elements_per_token: u64,
    /// Bytes in HBM per layer: elements × tokens per device × dtype size.
    pub device_bytes: f64,
    /// Bytes in host memory per layer.
    pub host_bytes: f64,
}

/// One layer's saved activations under the config's remat policy.
pub fn activation_memory_per_layer(config: &ModelConfig) -> ActivationMemory {
    activation_memory_per_layer_with(config, config.remat)
}

/// One layer's residuals per token, in elements, by tensor (the table in
/// the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Residuals {
    input: u64,
    qkv: u64,
    out: u64,
    mlp_in: u64,
    context: u64,
    /// The norm outputs and the MLP activation's output.
    rest: u64,
}

/// The average layer's residuals ([`ModelConfig::mlp_hidden`]: the saved
/// activations of every layer are this times the layers).
fn residuals(config: &ModelConfig) -> Residuals {
    residuals_with_hidden(config, config.mlp_hidden())
}

/// A layer's residuals with an MLP `hidden` wide: the query, key and value
/// as the projections produce them (MLA's up-projected ones) and the
/// attention's output.
fn residuals_with_hidden(config: &ModelConfig, hidden: u64) -> Residuals {
    let e = config.embed;
    let sequential = !config.decoder_block.is_parallel();
    Residuals {
        input: e,
        qkv: config.query_width() + config.key_width() + config.value_width(),
        out: if sequential { e } else { 0 },
        mlp_in: config.mlp_activations.len() as u64 * hidden,
        context: config.context_width(),
        rest: if sequential { 2 * e } else { e } + hidden,
    }
}

/// One layer's saved activations under `policy`.
pub fn activation_memory_per_layer_with(
    config: &ModelConfig,
    policy: RematPolicy,
) -> ActivationMemory {
    let r = residuals(config);
    let minimal = r.qkv + r.out + r.mlp_in;
    if let Some(placed) = custom_placements(config, policy) {
        let sum = |want: Placement| -> u64 {
            placed
                .iter()
                .filter(|(p, _)| *p == want)
                .map(|(_, n)| n)
                .sum()
        };
        return memory_of(config, sum(Placement::Device), sum(Placement::Offload));
    }
    let (device, host) = match policy {
        RematPolicy::Full => (0, 0),
        RematPolicy::Minimal => (minimal, 0),
        RematPolicy::MinimalFlash => (minimal + r.context, 0),
        RematPolicy::MinimalOffloaded => (0, minimal),
        // `mlpwo`, which save_dot_except_mlpwi also names, is no residual.
        RematPolicy::SaveDotExceptMlpwi | RematPolicy::SaveDotExceptMlp => (r.qkv + r.out, 0),
        RematPolicy::SaveQkvProj => (r.qkv, 0),
        RematPolicy::QkvProjOffloaded => (0, r.qkv),
        RematPolicy::SaveOutProj => (r.out, 0),
        RematPolicy::None => (minimal + r.context + r.rest, 0),
        RematPolicy::Custom { .. } => unreachable!("placed above"),
    };
    // The layer input is the scan's carry, kept under every policy.
    memory_of(config, device + r.input, host)
}

/// Each residual a `custom` policy names with its placement and its
/// elements per token (the layer input first); `None` for a named policy.
pub fn custom_placements(
    config: &ModelConfig,
    policy: RematPolicy,
) -> Option<[(Placement, u64); 7]> {
    let RematPolicy::Custom {
        decoder_layer_input,
        query_proj,
        key_proj,
        value_proj,
        context,
        out_proj,
        mlpwi,
        ..
    } = policy
    else {
        return None;
    };
    let r = residuals(config);
    Some([
        (decoder_layer_input, r.input),
        (query_proj, config.query_width()),
        (key_proj, config.key_width()),
        (value_proj, config.value_width()),
        (context, r.context),
        (out_proj, r.out),
        (mlpwi, r.mlp_in),
    ])
}

/// `device` and `host` elements per token as one layer's bytes.
fn memory_of(config: &ModelConfig, device: u64, host: u64) -> ActivationMemory {
    let bytes_per_token = config.tokens_per_device() * config.activation_dtype.byte_size() as f64;
    ActivationMemory {
        device_elements_per_token: device,
        host_elements_per_token: host,
        device_bytes: device as f64 * bytes_per_token,
        host_bytes: host as f64 * bytes_per_token,
    }
}

/// Bytes one layer's backward pass holds on a device besides the saved
/// activations: every residual of the layer (rematerialized, or saved and
/// brought back), the gradient of the MLP's input activations (its widest)
/// and of the layer's output, in the activation dtype; the widest layer's
/// where they differ (a mixture's and a dense layer's MLP).
pub fn layer_working_set(config: &ModelConfig) -> f64 {
    let r = residuals_with_hidden(config, config.mlp_hidden_widest());
    let all = r.input + r.qkv + r.out + r.mlp_in + r.context + r.rest;
    let gradients = r.mlp_in + config.embed;
    (all + gradients) as f64
        * config.tokens_per_device()
        * config.activation_dtype.byte_size() as f64
}

/// Bytes of the loss's buffers on a device: the logits and their
/// gradient, `tokens × vocab` each (a `num_vocab_tiling`-th of them at a
/// time) (the vocabulary sharded over `tensor`
/// like every width), in the activations' type. MaxText casts the logits
/// to `float32` for the cross-entropy (`cast_logits_to_fp32`), but XLA
/// fuses the cast into the softmax and its gradient: a published run
/// proves no f32 copy is held (Llama 3.1 70B on v6e-256, 40,960 tokens a
/// device at a 128,256-word vocabulary: f32 logits and gradient would be
/// 42.0 GB of a 34.4 GB chip; in bf16 they are 21.0 GB).
pub fn logits_buffers(config: &ModelConfig) -> f64 {
    2.0 * config.tokens_per_device()
        * config.vocab as f64
        * config.activation_dtype.byte_size() as f64
        / config.num_vocab_tiling.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::bundled;

    #[test]
    fn full_keeps_only_the_layer_input() {
        let config = bundled("llama2-7b").unwrap();
        let m = activation_memory_per_layer_with(&config, RematPolicy::Full);
        assert_eq!(m.device_elements_per_token, 4096);
        // 4096 elements × (4 sequences × 4096 tokens) × 2 bytes (bf16).
        assert_eq!(m.device_bytes, 4096.0 * 4.0 * 4096.0 * 2.0);
        assert_eq!(m.host_bytes, 0.0);
    }

    #[test]
    fn policies_order_by_what_they_keep() {
        let config = bundled("llama2-70b").unwrap();
        let kept = |p| activation_memory_per_layer_with(&config, p).device_elements_per_token;
        assert!(kept(RematPolicy::Full) < kept(RematPolicy::SaveOutProj));
        assert!(kept(RematPolicy::SaveQkvProj) < kept(RematPolicy::SaveDotExceptMlp));
        // `mlpwo` is no residual: naming it saves nothing more.
        assert_eq!(
            kept(RematPolicy::SaveDotExceptMlp),
            kept(RematPolicy::SaveDotExceptMlpwi)
        );
        assert!(kept(RematPolicy::SaveDotExceptMlpwi) < kept(RematPolicy::Minimal));
        assert!(kept(RematPolicy::Minimal) < kept(RematPolicy::MinimalFlash));
        assert!(kept(RematPolicy::MinimalFlash) < kept(RematPolicy::None));
        // Offloading moves the same tensors to the host.
        let offloaded = activation_memory_per_layer_with(&config, RematPolicy::MinimalOffloaded);
        assert_eq!(offloaded.device_elements_per_token, kept(RematPolicy::Full));
        assert_eq!(
            offloaded.host_elements_per_token + kept(RematPolicy::Full),
            kept(RematPolicy::Minimal)
        );
        // Llama 2 70B (sequential), minimal: qkv (64+16)*128 = 10240, out
        // 8192 (the post-attention norm reads the residual plus it), wi
        // 2*28672, input 8192; not wo, which only the residual reads.
        assert_eq!(kept(RematPolicy::Minimal), 10240 + 8192 + 57344 + 8192);
    }

    #[test]
    fn a_parallel_block_keeps_neither_output_projection() {
        // MaxText's 32B on v5p (`default` block): qkv (32+64)*256, wi
        // 32768, input 10240; both projections only feed the residual.
        let config = bundled("maxtext-v5p-32b").unwrap();
        let m = activation_memory_per_layer_with(&config, RematPolicy::Minimal);
        assert_eq!(m.device_elements_per_token, 24576 + 32768 + 10240);
        // 16384 tokens a device, bf16.
        assert_eq!(m.device_bytes, 67584.0 * 16384.0 * 2.0);
        let none = activation_memory_per_layer_with(&config, RematPolicy::None);
        // Plus the context (32*256), one norm and the activation's output.
        assert_eq!(none.device_elements_per_token, 67584 + 8192 + 10240 + 32768);
    }

    #[test]
    fn the_working_set_and_the_logits_are_per_token() {
        let config = bundled("maxtext-v5p-32b").unwrap();
        let tokens = 16384.0;
        // Every residual (the none set) plus the MLP input's and the
        // output's gradients.
        let all = 67584.0 + 8192.0 + 10240.0 + 32768.0;
        assert_eq!(
            layer_working_set(&config),
            (all + 32768.0 + 10240.0) * tokens * 2.0
        );
        // bf16 logits and their gradient, 32768 words.
        assert_eq!(logits_buffers(&config), 2.0 * tokens * 32768.0 * 2.0);
    }
}
