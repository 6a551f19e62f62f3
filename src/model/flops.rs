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
//! does not exist here).
//!
//! A mixture of experts (`crate::model::experts`) replaces `ffn` by the
//! router and `k + shared` expert MLPs a token in each mixture layer and
//! keeps the dense `ffn` in the others (MaxText's
//! `calculate_routed_and_shared_ffn_tflops_per_device`). Multi-head latent
//! attention (`crate::model::attention`) replaces `qkv`, the attention and
//! `proj` by MaxText's `calculate_mla_tflops_per_device`: `qkv = 2 B L ×`
//! its down and up projections, attention `2 B L² h (qk + v)` (the
//! standard `4 B L² h d` with the query-key and value widths apart),
//! `proj = 2 B L embed h v`. MaxText's formula has had MLA only since its
//! causal version; the older versions here take the same terms.
//!
//! Not modeled: Gemma 2's and Gemma 3's own attention branches (a sliding
//! window is counted by its band here), Llama 4's chunked attention
//! (MaxText's `calculate_llama4_attention_tflops` counts a chunked layer
//! as `⌊L/C⌋ C² + (L mod C)²` score pairs where a global one has `L²`;
//! equal while `seq_len ≤ chunk_attn_window_size`, 8192, as in every
//! bundled Llama 4 config), multi-token prediction, DeepSeek's indexer.

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

/// One layer's MLP forward FLOPs per device, each kind of layer apart.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MlpFlops {
    /// A dense layer's input and output matmuls (`mlp_dim` wide).
    pub dense: (f64, f64),
    /// A mixture layer's, MaxText's dropless count: the router (in the
    /// input's) and `k + shared` experts a token. 0 without a mixture.
    pub moe: (f64, f64),
    /// Of `moe.0`, the router's `2·T·E·num_experts`.
    pub router: f64,
    /// Layers with a dense MLP.
    pub dense_layers: u64,
    /// Layers with the mixture.
    pub moe_layers: u64,
}

impl MlpFlops {
    /// The average layer's input and output FLOPs with a mixture layer's
    /// taken as `moe` (the hardware's may differ from the count's):
    /// `(dense × dense layers + moe × mixture layers) / layers`, so that
    /// times the layers is each kind's total.
    pub fn average_with(&self, moe: (f64, f64)) -> (f64, f64) {
        // One kind: its own figures, not rounded through the average.
        if self.moe_layers == 0 {
            return self.dense;
        }
        if self.dense_layers == 0 {
            return moe;
        }
        let (d, m) = (self.dense_layers as f64, self.moe_layers as f64);
        let layers = (d + m).max(1.0);
        (
            (self.dense.0 * d + moe.0 * m) / layers,
            (self.dense.1 * d + moe.1 * m) / layers,
        )
    }
}

/// `config`'s MLP FLOPs by kind of layer.
pub fn mlp_flops(config: &ModelConfig) -> MlpFlops {
    let t = config.tokens_per_device();
    let embed = config.embed as f64;
    let activations = config.mlp_activations.len() as f64;
    let ffn = |width: f64| {
        (
            2.0 * t * width * embed * activations,
            2.0 * t * width * embed,
        )
    };
    let (dense_layers, moe_layers) = config.dense_and_moe_layers();
    // A mixture: the router, then `k + shared` experts' MLPs a token
    // (MaxText's dropless count, whatever the routing).
    let (moe, router) = match &config.moe {
        None => ((0.0, 0.0), 0.0),
        Some(m) => {
            let experts = (m.num_experts_per_tok + m.shared_experts) as f64;
            let (mlp_in, mlp_out) = ffn(m.moe_mlp_dim as f64);
            let router = 2.0 * t * embed * m.num_experts as f64;
            ((router + mlp_in * experts, mlp_out * experts), router)
        }
    };
    MlpFlops {
        dense: ffn(config.mlp_dim as f64),
        moe,
        router,
        dense_layers,
        moe_layers,
    }
}

/// `config`'s per-layer forward matmul FLOPs per device: the average
/// layer where layers differ (a sliding window's local and global layers,
/// a mixture's dense and mixture layers), so times `layers` each total is
/// whole.
pub fn layer_matmul_flops(config: &ModelConfig) -> LayerMatmulFlops {
    let t = config.tokens_per_device();
    let b = config.per_device_batch;
    let l = config.seq_len as f64;
    let embed = config.embed as f64;
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
    let mlp = mlp_flops(config);
    let (mlp_in, mlp_out) = mlp.average_with(mlp.moe);
    // 2 FLOPs per multiply-add; a query-key pair's score and value take
    // `4·h·d` (`2·h·(qk + v)` under MLA).
    let pair = 2.0 * config.score_macs_per_pair() as f64;
    LayerMatmulFlops {
        qkv: 2.0 * t * config.projection_macs_per_token() as f64,
        attention: pair * b * l * l * global_share,
        window_attention: pair * b * pairs * local_share,
        out: 2.0 * t * embed * config.context_width() as f64,
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
///
/// Where the layers differ (a mixture's dense-first or interleaved
/// layers), the per-layer fields are the average layer, rounded down, and
/// what the rounding leaves is [`ParameterCount::layer_remainder`]: the
/// step model multiplies one layer by `layers` and adds the rest
/// ([`ParameterCount::outside_layers`]), and both sums are the total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParameterCount {
    /// The token embedding, `vocab × embed`.
    pub embedding: u64,
    /// The separate logits matrix (`vocab × embed`), 0 when tied.
    pub logits: u64,
    /// Learned positions, `trainable_position_size × embed`.
    pub position: u64,
    /// One layer's attention: query, key, value and output matrices, their
    /// biases (GPT-3) and query/key norms (`DefaultT5`), or MLA's
    /// projections and latent norms.
    pub attention_per_layer: u64,
    /// One layer's MLP: `n_act` input matrices, the output matrix, biases;
    /// a mixture's experts and router; their average where the layers
    /// differ.
    pub mlp_per_layer: u64,
    /// One layer's norms and relative position biases.
    pub other_per_layer: u64,
    /// The final norm.
    pub final_norm: u64,
    /// Decoder layers.
    pub layers: u64,
    /// The MLP parameters the average layer's rounding leaves (fewer than
    /// `layers`; 0 when every layer is alike).
    pub layer_remainder: u64,
}

impl ParameterCount {
    /// Parameters of one decoder layer (the average layer where they
    /// differ).
    pub fn per_layer(&self) -> u64 {
        self.attention_per_layer + self.mlp_per_layer + self.other_per_layer
    }

    /// Every parameter outside `layers × per_layer()`: the embeddings, the
    /// final norm and the layers' remainder.
    pub fn outside_layers(&self) -> u64 {
        self.embedding + self.logits + self.position + self.final_norm + self.layer_remainder
    }

    /// Every parameter (what MaxText's `calculate_num_params_from_pytree` counts).
    pub fn total(&self) -> u64 {
        self.outside_layers() + self.layers * self.per_layer()
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
    let attention_weights = match &config.mla {
        None => e * (h + 2 * kv) * d + h * d * e,
        Some(mla) => mla.parameters(e, h),
    };
    // A mixture layer holds every expert (routed and shared), the router
    // and its bias; the others a dense MLP.
    let dense_weights = (activations + 1) * m * e;
    let (dense_layers, moe_layers) = config.dense_and_moe_layers();
    let moe_weights = config.moe.map_or(0, |x| {
        (activations + 1) * x.moe_mlp_dim * e * (x.num_experts + x.shared_experts)
            + e * x.num_experts
            + if x.routed_bias { x.num_experts } else { 0 }
    });
    let mlp_all = dense_weights * dense_layers + moe_weights * moe_layers;
    let layers = config.layers.max(1);
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
        mlp_per_layer: mlp_all / layers + mlp_extra,
        other_per_layer: other,
        final_norm,
        layers: config.layers,
        layer_remainder: mlp_all % layers,
    }
}

/// The parameters a token runs through: every parameter but the routed
/// experts it is not routed to (`num_experts − num_experts_per_tok` of
/// them in each mixture layer), what "active parameters" means in a
/// mixture's published size (DeepSeek-V3's 37B of 671B).
pub fn active_parameter_count(config: &ModelConfig) -> u64 {
    let total = parameter_count(config).total();
    let Some(m) = &config.moe else {
        return total;
    };
    let (_, moe_layers) = config.dense_and_moe_layers();
    let expert = (config.mlp_activations.len() as u64 + 1) * m.moe_mlp_dim * config.embed;
    total - (m.num_experts - m.num_experts_per_tok) * expert * moe_layers
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
            mla: None,
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
