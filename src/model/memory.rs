//! Activation memory a training step keeps per decoder layer, by remat
//! policy: what the policy saves, per token, times the tokens on a device,
//! times the activation dtype's size.
//!
//! Per token, in elements (`e` embed, `h`/`kv` heads, `d` head_dim, `m`
//! mlp_dim, `n` MLP input matrices):
//!
//! | tensor | elements | saved by |
//! |---|---|---|
//! | layer input (scan carry) | `e` | every policy |
//! | `query_proj`, `key_proj`, `value_proj` | `(h + 2 kv) d` | minimal, minimal_flash, save_dot_except_mlpwi, save_dot_except_mlp, save_qkv_proj, none (host: qkv_proj_offloaded, minimal_offloaded) |
//! | `out_proj` | `e` | minimal, minimal_flash, save_dot_except_mlpwi, save_dot_except_mlp, save_out_proj, none (host: minimal_offloaded) |
//! | MLP input matmuls (`n` of them) | `n m` | minimal, minimal_flash, none (host: minimal_offloaded) |
//! | `mlpwo` | `e` | minimal, minimal_flash, save_dot_except_mlpwi, none (host: minimal_offloaded) |
//! | attention output (`context`) | `h d` | minimal_flash, none |
//! | the two norm outputs and the gated product `mlpwi` | `2 e + m` | none |
//!
//! `none` is a floor: XLA keeps whatever else the backward pass reads
//! (softmax statistics, the score matrix under dot-product attention),
//! which depends on the attention kernel. The step model adds
//! `device_bytes × layers` to HBM; a sequence-sharded or tensor-sharded
//! layout divides it further, which is the step model's business.

use super::config::{ModelConfig, RematPolicy};

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

/// One layer's saved activations under `policy`.
pub fn activation_memory_per_layer_with(
    config: &ModelConfig,
    policy: RematPolicy,
) -> ActivationMemory {
    let e = config.embed;
    let qkv = (config.heads + 2 * config.kv_heads) * config.head_dim;
    let mlp_in = config.mlp_activations.len() as u64 * config.mlp_dim;
    let context = config.heads * config.head_dim;
    let minimal = qkv + e + mlp_in + e;
    let (device, host) = match policy {
        RematPolicy::Full => (0, 0),
        RematPolicy::Minimal => (minimal, 0),
        RematPolicy::MinimalFlash => (minimal + context, 0),
        RematPolicy::MinimalOffloaded => (0, minimal),
        RematPolicy::SaveDotExceptMlpwi => (qkv + e + e, 0),
        RematPolicy::SaveDotExceptMlp => (qkv + e, 0),
        RematPolicy::SaveQkvProj => (qkv, 0),
        RematPolicy::QkvProjOffloaded => (0, qkv),
        RematPolicy::SaveOutProj => (e, 0),
        RematPolicy::None => (minimal + context + 2 * e + config.mlp_dim, 0),
    };
    // The layer input is the scan's carry, kept under every policy.
    let device = device + e;
    let bytes_per_token = config.tokens_per_device() * config.activation_dtype.byte_size() as f64;
    ActivationMemory {
        device_elements_per_token: device,
        host_elements_per_token: host,
        device_bytes: device as f64 * bytes_per_token,
        host_bytes: host as f64 * bytes_per_token,
    }
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
        assert!(kept(RematPolicy::SaveDotExceptMlp) < kept(RematPolicy::SaveDotExceptMlpwi));
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
        // Llama 2 70B, minimal: qkv (64+16)*128 = 10240, out 8192, wi 2*28672,
        // wo 8192, input 8192.
        assert_eq!(
            kept(RematPolicy::Minimal),
            10240 + 8192 + 57344 + 8192 + 8192
        );
    }
}
