//! MaxText's training FLOP count per device per step, in each of the
//! versions MaxText has shipped, and the model's parameter count.
//!
//! MaxText reports TFLOP/s per chip as this count divided by the measured
//! step time, and MFU as that over the chip's peak, so a published figure
//! is only comparable under the formula of its date. The formula changed
//! three times (`google/maxtext`, `MaxText/train.py` then
//! `MaxText/maxtext_utils.py`):
//!
//! | version | from | learnable weights | attention |
//! |---|---|---|---|
//! | [`FlopFormula::ParamsFullAttention`] | 0e650131 (2023-06-02) | `6 N B L` | `12 h d L² B layers` |
//! | [`FlopFormula::ParamsCausalAttention`] | 64ee4e93 (2023-11-08) | `6 N B L` | `6 h d L² B layers` (halved: causal) |
//! | [`FlopFormula::Matmuls`] | 353fb837 (2024-05-08), still at e64f6813 (2024-10-10) | `3 × (layers × (ffn + qkv + proj) + embedding)` | `12 h d L² B layers` ("megatron" count, not causal) |
//! | [`FlopFormula::MatmulsCausal`] | 2025 (`src/MaxText/maxtext_utils.py`, AI-Hypercomputer/maxtext 020763fe) | as `Matmuls` | `6 h d L² B layers` (halved again) |
//!
//! with `N` the parameter count (every parameter of the tree: embeddings,
//! norms, biases), `B` `per_device_batch`, `L` `seq_len`, `h` query heads,
//! `d` `head_dim`; and, per layer, `ffn = 2 B L mlp embed (n_act + 1)`,
//! `qkv = 2 B L embed (h + 2 kv) d`, `proj = 2 B L embed h d`, and once
//! `embedding = 2 B L embed vocab` (the logits matmul). The `3` is forward
//! plus the two backward matmuls. MaxText multiplies by
//! `gradient_accumulation_steps`; these configs have one step (the field
//! does not exist here). The MoE and Gemma 2 branches are not modeled.

use super::config::{DecoderBlock, ModelConfig};

/// Which of MaxText's FLOP formulas (see the module docs for dates).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FlopFormula {
    /// `6 N tokens` plus full (non-causal) attention, June–November 2023:
    /// the v5e table's runs (October 2023).
    ParamsFullAttention,
    /// `6 N tokens` plus attention halved for causality, November 2023 –
    /// May 2024: the v5p tables' runs (December 2023, March 2024).
    ParamsCausalAttention,
    /// Per-matmul count, attention not halved: `calculate_tflops_training_per_device`
    /// from May 2024 (the version at google/maxtext e64f6813).
    Matmuls,
    /// Per-matmul count with causal attention halved (MaxText 2025).
    MatmulsCausal,
}

impl FlopFormula {
    /// The name reports and model files use (`matmuls_causal`).
    pub fn name(self) -> &'static str {
        match self {
            FlopFormula::ParamsFullAttention => "params_full_attention",
            FlopFormula::ParamsCausalAttention => "params_causal_attention",
            FlopFormula::Matmuls => "matmuls",
            FlopFormula::MatmulsCausal => "matmuls_causal",
        }
    }
}

/// Training FLOPs of one step on one device, split as MaxText splits them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainingFlops {
    /// Matmuls against learnable weights (forward and backward).
    pub learnable_weight: f64,
    /// The attention score and value matmuls (forward and backward).
    pub attention: f64,
}

impl TrainingFlops {
    /// Their sum, MaxText's `total_tflops` × 10¹².
    pub fn total(&self) -> f64 {
        self.learnable_weight + self.attention
    }
}

/// One decoder layer's forward matmul FLOPs on one device, by group:
/// MaxText's per-matmul terms (the attention scores and values in full).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerMatmulFlops {
    /// The query, key and value projections.
    pub qkv: f64,
    /// `QKᵀ` and `PV`: `4·B·L²·h·d`.
    pub attention: f64,
    /// The output projection.
    pub out: f64,
    /// The MLP's input matrices (one per activation).
    pub mlp_in: f64,
    /// The MLP's output matrix.
    pub mlp_out: f64,
    /// A sliding window's local layers' `QKᵀ` and `PV` over their band
    /// (`4·B·h·d` per query and key it sees: `W·L − W(W−1)/2` pairs),
    /// averaged over the layers like `attention` (which then counts the
    /// global layers only); 0 without a window.
    pub window_attention: f64,
}

impl LayerMatmulFlops {
    /// All of them.
    pub fn total(&self) -> f64 {
        self.qkv + self.attention + self.window_attention + self.out + self.mlp_in + self.mlp_out
    }
}

/// Query-key pairs a local layer computes per sequence: each query sees
/// itself and the `window − 1` tokens before it.
pub fn window_pairs(seq_len: u64, window: u64) -> f64 {
    let (l, w) = (seq_len as f64, window.min(seq_len) as f64);
    w * l - w * (w - 1.0) / 2.0
}

/// `config`'s per-layer forward matmul FLOPs per device.
pub fn layer_matmul_flops(config: &ModelConfig) -> LayerMatmulFlops {
    let b = config.per_device_batch;
    let l = config.seq_len as f64;
    let heads = config.heads as f64;
    let head_dim = config.head_dim as f64;
    let embed = config.embed as f64;
    let mlp = config.mlp_dim as f64;
    let activations = config.mlp_activations.len() as f64;
    // Global and local layers' shares of the layers.
    let (global_share, local_share, pairs) = match config.sliding_window {
        None => (1.0, 0.0, 0.0),
        Some(w) => {
            let (global, local) = w.global_and_local(config.layers);
            let layers = config.layers.max(1) as f64;
            (
                global as f64 / layers,
                local as f64 / layers,
                window_pairs(config.seq_len, w.window),
            )
        }
    };
    // A mixture: the router, then `k + shared` experts' MLPs a token
    // (MaxText's dropless count, whatever the routing).
    let (mlp_in, mlp_out) = match &config.moe {
        None => (
            2.0 * b * l * mlp * embed * activations,
            2.0 * b * l * mlp * embed,
        ),
        Some(m) => {
            let experts = (m.num_experts_per_tok + m.shared_experts) as f64;
            let width = m.moe_mlp_dim as f64;
            (
                2.0 * b * l * embed * m.num_experts as f64
                    + 2.0 * b * l * width * embed * activations * experts,
                2.0 * b * l * width * embed * experts,
            )
        }
    };
    LayerMatmulFlops {
        qkv: 2.0 * b * l * embed * (heads + 2.0 * config.kv_heads as f64) * head_dim,
        // 2 FLOPs per multiply-add.
        attention: 4.0 * b * l * l * heads * head_dim * global_share,
        window_attention: 4.0 * b * pairs * heads * head_dim * local_share,
        out: 2.0 * b * l * embed * heads * head_dim,
        mlp_in,
        mlp_out,
    }
}

/// The step's FLOPs per device under `formula`.
pub fn training_flops_per_device(config: &ModelConfig, formula: FlopFormula) -> TrainingFlops {
    let b = config.per_device_batch;
    let l = config.seq_len as f64;
    let layers = config.layers as f64;
    let layer = layer_matmul_flops(config);
    // Forward and backward: three times the forward.
    let full_attention = layer.attention * layers * 3.0;
    // A local layer's band is causal already: no formula halves it.
    let window = layer.window_attention * layers * 3.0;
    let attention = window
        + match formula {
            FlopFormula::ParamsFullAttention | FlopFormula::Matmuls => full_attention,
            FlopFormula::ParamsCausalAttention | FlopFormula::MatmulsCausal => full_attention / 2.0,
        };
    let learnable_weight = match formula {
        FlopFormula::ParamsFullAttention | FlopFormula::ParamsCausalAttention => {
            6.0 * parameter_count(config).total() as f64 * l * b
        }
        FlopFormula::Matmuls | FlopFormula::MatmulsCausal => {
            let embedding = 2.0 * b * l * config.embed as f64 * config.vocab as f64;
            ((layer.mlp_in + layer.mlp_out + layer.qkv + layer.out) * layers + embedding) * 3.0
        }
    };
    TrainingFlops {
        learnable_weight,
        attention,
    }
}

/// MaxText's `calculate_tflops_training_per_device(config)` as at
/// google/maxtext e64f6813 ([`FlopFormula::Matmuls`]): `(total,
/// learnable_weight, attention)` in TFLOPs per device per step.
pub fn calculate_tflops_training_per_device(config: &ModelConfig) -> (f64, f64, f64) {
    let flops = training_flops_per_device(config, FlopFormula::Matmuls);
    (
        flops.total() / 1e12,
        flops.learnable_weight / 1e12,
        flops.attention / 1e12,
    )
}

/// A model's parameters by where they live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParameterCount {
    /// The token embedding, `vocab × embed`.
    pub embedding: u64,
    /// The separate logits matrix (`vocab × embed`), 0 when tied.
    pub logits: u64,
    /// Learned positions, `trainable_position_size × embed`.
    pub position: u64,
    /// One layer's attention: query, key, value and output matrices, their
    /// biases (GPT-3) and query/key norms (`DefaultT5`).
    pub attention_per_layer: u64,
    /// One layer's MLP: `n_act` input matrices, the output matrix, biases.
    pub mlp_per_layer: u64,
    /// One layer's norms and relative position biases.
    pub other_per_layer: u64,
    /// The final norm.
    pub final_norm: u64,
    /// Decoder layers.
    pub layers: u64,
}

impl ParameterCount {
    /// Parameters of one decoder layer.
    pub fn per_layer(&self) -> u64 {
        self.attention_per_layer + self.mlp_per_layer + self.other_per_layer
    }

    /// Every parameter (what MaxText's `calculate_num_params_from_pytree` counts).
    pub fn total(&self) -> u64 {
        self.embedding
            + self.logits
            + self.position
            + self.final_norm
            + self.layers * self.per_layer()
    }
}

/// The parameters of `config`'s decoder, as MaxText's layers create them.
pub fn parameter_count(config: &ModelConfig) -> ParameterCount {
    let (e, h, kv, d, m) = (
        config.embed,
        config.heads,
        config.kv_heads,
        config.head_dim,
        config.mlp_dim,
    );
    let activations = config.mlp_activations.len() as u64;
    let attention_weights = e * (h + 2 * kv) * d + h * d * e;
    // A mixture holds every expert (routed and shared) and the router.
    let mlp_weights = match &config.moe {
        None => (activations + 1) * m * e,
        Some(x) => {
            (activations + 1) * x.moe_mlp_dim * e * (x.num_experts + x.shared_experts)
                + e * x.num_experts
        }
    };
    let (attention_extra, mlp_extra, other, final_norm) = match config.decoder_block {
        // Two RMSNorm scales per layer.
        DecoderBlock::Llama2 => (0, 0, 2 * e, e),
        // qkv and output biases; wi and wo biases; two LayerNorms with bias.
        DecoderBlock::Gpt3 => ((h + 2 * kv) * d + e, activations * m + e, 4 * e, 2 * e),
        // One RMSNorm shared by the parallel attention and MLP.
        DecoderBlock::Default => (0, 0, e, e),
        // Plus query and key norms and 32 relative-position buckets per head.
        DecoderBlock::DefaultT5 => (2 * d, 0, e + 32 * h, e),
        // Query and key norms; four RMSNorm scales around attention and MLP.
        DecoderBlock::Gemma3 => (2 * d, 0, 4 * e, e),
    };
    ParameterCount {
        embedding: config.vocab * e,
        logits: if config.logits_via_embedding {
            0
        } else {
            config.vocab * e
        },
        position: config.trainable_position_size * e,
        attention_per_layer: attention_weights + attention_extra,
        mlp_per_layer: mlp_weights + mlp_extra,
        other_per_layer: other,
        final_norm,
        layers: config.layers,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::config::{ModelDType, RematPolicy};

    /// A two-layer model small enough to count by hand (bf16 activations).
    pub(crate) fn tiny() -> ModelConfig {
        ModelConfig {
            name: "tiny".into(),
            source: String::new(),
            decoder_block: DecoderBlock::Llama2,
            layers: 2,
            embed: 8,
            heads: 2,
            kv_heads: 1,
            head_dim: 4,
            mlp_dim: 16,
            mlp_activations: vec!["silu".into(), "linear".into()],
            vocab: 10,
            seq_len: 4,
            per_device_batch: 3.0,
            remat: RematPolicy::Full,
            weight_dtype: ModelDType::F32,
            activation_dtype: ModelDType::Bf16,
            grad_dtype: None,
            mu_dtype: None,
            num_vocab_tiling: 1,
            quantization: None,
            sliding_window: None,
            optimizer_memory_host_offload: false,
            parameter_memory_host_offload: false,
            logits_via_embedding: false,
            attention_width_is_embed: true,
            trainable_position_size: 0,
            attention_kernel: crate::model::AttentionKernel::Full,
            use_iota_embed: false,
            moe: None,
        }
    }

    #[test]
    fn matmuls_formula_matches_the_hand_count() {
        // B=3, L=4: ffn = 2*12*16*8*(2+1) = 9216; qkv = 2*12*8*(2+2)*4 = 3072;
        // proj = 2*12*8*2*4 = 1536; embedding = 2*12*8*10 = 1920.
        // learnable = ((9216+3072+1536)*2 + 1920)*3 = 88704.
        // attention = 4*3*16*2*4*2*3 = 9216.
        let f = training_flops_per_device(&tiny(), FlopFormula::Matmuls);
        assert_eq!(f.learnable_weight, 88704.0);
        assert_eq!(f.attention, 9216.0);
        let c = training_flops_per_device(&tiny(), FlopFormula::MatmulsCausal);
        assert_eq!(c.learnable_weight, 88704.0);
        assert_eq!(c.attention, 4608.0);
        let (total, w, a) = calculate_tflops_training_per_device(&tiny());
        assert_eq!((total, w, a), (97920.0e-12, 88704.0e-12, 9216.0e-12));
    }

    #[test]
    fn params_formula_is_six_n_tokens_plus_attention() {
        let config = tiny();
        let n = parameter_count(&config).total() as f64;
        let f = training_flops_per_device(&config, FlopFormula::ParamsFullAttention);
        assert_eq!(f.learnable_weight, 6.0 * n * 12.0);
        assert_eq!(f.attention, 12.0 * 2.0 * 2.0 * 4.0 * 16.0 * 3.0);
        let c = training_flops_per_device(&config, FlopFormula::ParamsCausalAttention);
        assert_eq!(c.attention, f.attention / 2.0);
    }

    #[test]
    fn parameters_of_the_tiny_model_by_hand() {
        // attention: 8*(2+2)*4 + 2*4*8 = 192; mlp: 3*16*8 = 384; norms 16;
        // embedding 80 + logits 80 + final norm 8.
        let p = parameter_count(&tiny());
        assert_eq!(p.attention_per_layer, 192);
        assert_eq!(p.mlp_per_layer, 384);
        assert_eq!(p.other_per_layer, 16);
        assert_eq!(p.total(), 80 + 80 + 8 + 2 * (192 + 384 + 16));
        let tied = ModelConfig {
            logits_via_embedding: true,
            ..tiny()
        };
        assert_eq!(parameter_count(&tied).total(), p.total() - 80);
    }
}
