//! A transformer decoder as MaxText configures it: the dimensions its FLOP
//! count and parameter count read, the batch, the remat policy and the
//! dtypes, written as RON.
//!
//! ```ron
//! Model(
//!     name: "llama2-7b",
//!     decoder_block: llama2,
//!     layers: 32, embed: 4096, heads: 32, kv_heads: 32, head_dim: 128,
//!     mlp_dim: 11008, mlp_activations: ["silu", "linear"],
//!     vocab: 32000, seq_len: 4096, per_device_batch: 1.0,
//!     remat: full, weight_dtype: f32, activation_dtype: bf16,
//!     logits_via_embedding: false,
//!     // Optional: attention_width_is_embed (false), trainable_position_size (0), source (""),
//!     // grad_dtype and mu_dtype (the weight_dtype's).
//! )
//! ```
//!
//! `ir::DType` has no bfloat16 (the interpreter computes in f32/f64), so
//! the dtypes here are [`ModelDType`], a local enum of the storage types a
//! MaxText run uses.
//!
//! MaxText lets `head_dim` differ from `emb_dim / num_query_heads` (its
//! `global_parameter_scale` doubles the heads, not `head_dim`, so the
//! scaled models have `heads × head_dim ≠ embed`); a family that ties them
//! (Llama 2, GPT-3) says so with `attention_width_is_embed: true`, and
//! validation then checks it.

use serde::{Deserialize, Serialize};

pub use super::attention::{AttentionKernel, MultiHeadLatentAttention};
use super::error::ModelError;
pub use super::quantization::Quantization;

/// The largest model file read.
pub const MAX_MODEL_FILE_BYTES: u64 = 1 << 20;

/// MaxText's `remat_policy`: which of a decoder layer's intermediates the
/// forward pass keeps for the backward pass (the rest is recomputed). The
/// names are MaxText's (`MaxText/layers/models.py`, `base.yml`); the layer
/// input (the scan carry) is kept by every policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RematPolicy {
    /// `nothing_saveable`: only the layer input; the whole layer is
    /// recomputed in the backward pass.
    Full,
    /// `checkpoint_dots_with_no_batch_dims`: every weight matmul's output
    /// (query, key, value, out projection, the MLP input matmuls and
    /// `mlpwo`), not the attention dots.
    Minimal,
    /// `minimal` moved to host memory: nothing but the layer input stays in
    /// HBM.
    MinimalOffloaded,
    /// `minimal` plus the attention output (`context`).
    MinimalFlash,
    /// `query_proj`, `key_proj`, `value_proj`, `out_proj`, `mlpwo`.
    SaveDotExceptMlpwi,
    /// `query_proj`, `key_proj`, `value_proj`, `out_proj`.
    SaveDotExceptMlp,
    /// `query_proj`, `key_proj`, `value_proj`.
    SaveQkvProj,
    /// `query_proj`, `key_proj`, `value_proj` offloaded to host memory.
    QkvProjOffloaded,
    /// `out_proj` only.
    SaveOutProj,
    /// No rematerialization: every intermediate is kept.
    None,
    /// MaxText's `remat_policy: custom`: each named activation kept on the
    /// device, offloaded to the host's pinned memory, or rematerialized
    /// (`save_and_offload_only_these_names`). Unnamed ones are
    /// rematerialized; the layer input (the scan carry) stays on the
    /// device unless offloaded.
    Custom {
        /// `decoder_layer_input`: the scan carry (`device` or `offload`;
        /// it is where the backward pass's recomputation starts).
        #[serde(default = "Placement::device")]
        decoder_layer_input: Placement,
        /// `query_proj`.
        #[serde(default)]
        query_proj: Placement,
        /// `key_proj`.
        #[serde(default)]
        key_proj: Placement,
        /// `value_proj`.
        #[serde(default)]
        value_proj: Placement,
        /// `context`: the attention's output.
        #[serde(default)]
        context: Placement,
        /// `out_proj`.
        #[serde(default)]
        out_proj: Placement,
        /// `mlpwi`: the MLP's input matmuls.
        #[serde(default)]
        mlpwi: Placement,
        /// `mlpwo`: the MLP's output matmul (no residual: only the next
        /// layer's input reads it, so its placement changes nothing).
        #[serde(default)]
        mlpwo: Placement,
    },
}

fn one() -> u64 {
    1
}

/// Local attention over a window, in a repeating pattern of layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlidingWindow {
    /// Tokens a local layer's query attends to (itself and the ones
    /// before it), at most `seq_len`.
    pub window: u64,
    /// Local layers before each global one (the pattern's last layer).
    pub local_per_global: u64,
}

impl SlidingWindow {
    /// How many of `layers` are global (every `local_per_global + 1`-th)
    /// and how many local.
    pub fn global_and_local(self, layers: u64) -> (u64, u64) {
        let global = layers / (self.local_per_global + 1);
        (global, layers - global)
    }
}

/// Where a `custom` remat policy keeps one named activation between the
/// forward and the backward pass (MaxText's `device`, `offload`, `remat`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// Saved in HBM.
    Device,
    /// Saved in the host's memory: written over the host link in the
    /// forward pass, read back in the backward.
    Offload,
    /// Recomputed in the backward pass.
    #[default]
    Remat,
}

impl Placement {
    /// `device` (the layer input's default).
    pub fn device() -> Placement {
        Placement::Device
    }
}

impl RematPolicy {
    /// Every policy, in MaxText's order (fastest to leanest, then `none`).
    pub const ALL: [RematPolicy; 10] = [
        RematPolicy::Minimal,
        RematPolicy::MinimalFlash,
        RematPolicy::SaveDotExceptMlpwi,
        RematPolicy::SaveDotExceptMlp,
        RematPolicy::SaveQkvProj,
        RematPolicy::QkvProjOffloaded,
        RematPolicy::MinimalOffloaded,
        RematPolicy::SaveOutProj,
        RematPolicy::Full,
        RematPolicy::None,
    ];

    /// MaxText's name for the policy.
    pub fn name(self) -> &'static str {
        match self {
            RematPolicy::Full => "full",
            RematPolicy::Minimal => "minimal",
            RematPolicy::MinimalOffloaded => "minimal_offloaded",
            RematPolicy::MinimalFlash => "minimal_flash",
            RematPolicy::SaveDotExceptMlpwi => "save_dot_except_mlpwi",
            RematPolicy::SaveDotExceptMlp => "save_dot_except_mlp",
            RematPolicy::SaveQkvProj => "save_qkv_proj",
            RematPolicy::QkvProjOffloaded => "qkv_proj_offloaded",
            RematPolicy::SaveOutProj => "save_out_proj",
            RematPolicy::None => "none",
            RematPolicy::Custom { .. } => "custom",
        }
    }
}

/// Storage type of weights or activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelDType {
    /// bfloat16, MaxText's activation `dtype`.
    Bf16,
    /// IEEE half precision.
    F16,
    /// float32, MaxText's default `weight_dtype`.
    F32,
}

impl ModelDType {
    /// Bytes per element.
    pub fn byte_size(self) -> u64 {
        match self {
            ModelDType::Bf16 | ModelDType::F16 => 2,
            ModelDType::F32 => 4,
        }
    }
}

/// MaxText's `decoder_block`: which parameters a layer has besides its
/// attention and MLP matrices (what [`parameter_count`](super::flops::parameter_count)
/// adds up).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecoderBlock {
    /// `llama2`: RMSNorm (scale only) before attention and before the MLP,
    /// rotary positions (no parameters), a final RMSNorm; no biases.
    Llama2,
    /// `gpt3`: LayerNorm (scale and bias) before attention and before the
    /// MLP, biases on every dense layer, learned positions
    /// (`trainable_position_size × embed`), a final LayerNorm.
    Gpt3,
    /// MaxText's `default` block of December 2023 (`MaxText/layers/models.py`
    /// at 76bd53b0): one RMSNorm feeds attention and the MLP in parallel,
    /// rotary positions, a final RMSNorm; no biases.
    Default,
    /// The `default` block of October 2023 (`MaxText/layers.py` at
    /// e47fa1b5): as [`DecoderBlock::Default`] plus per-layer T5 relative
    /// position biases (32 buckets per head) and query/key RMSNorms
    /// (`head_dim` each).
    DefaultT5,
    /// `gemma3`: RMSNorms before and after attention and before and after
    /// the MLP, query and key RMSNorms (`head_dim` each), rotary positions,
    /// no biases, a final RMSNorm.
    Gemma3,
}

impl DecoderBlock {
    /// Whether attention and the MLP read the same normalized input and
    /// are summed into the residual (MaxText's `default` blocks), rather
    /// than one after the other (`llama2`, `gpt3`).
    pub fn is_parallel(self) -> bool {
        matches!(self, DecoderBlock::Default | DecoderBlock::DefaultT5)
    }
}

/// The most parameters a model may have: 2^60 (1.15·10^18), the closed
/// form's limit (`sharding::bucket_runs::MAX_MODELED_ELEMENTS`), so every
/// count of them stays a `u64`.
pub const MAX_PARAMETERS: u64 = 1 << 60;

/// The most sequences a device may take per step: 2^24, far past any
/// batch that fits a chip, so every token count stays exact in an `f64`.
pub const MAX_PER_DEVICE_BATCH: f64 = 16_777_216.0;

/// MLP activations MaxText's `MlpBlock` accepts that the bundled models use
/// (`linear` or a `flax.linen` function name); others are refused as typos.
pub const KNOWN_ACTIVATIONS: [&str; 7] =
    ["linear", "relu", "gelu", "silu", "swish", "sigmoid", "tanh"];

/// A transformer decoder, its batch and its training numerics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename = "Model", deny_unknown_fields)]
pub struct ModelConfig {
    /// The model's name (`"llama2-7b"`).
    pub name: String,
    /// Where the figures come from (file and commit), for reports.
    #[serde(default)]
    pub source: String,
    /// MaxText's `decoder_block`.
    pub decoder_block: DecoderBlock,
    /// `num_decoder_layers`.
    pub layers: u64,
    /// `emb_dim`.
    pub embed: u64,
    /// `num_query_heads`.
    pub heads: u64,
    /// `num_kv_heads` (fewer than `heads`: grouped-query attention).
    pub kv_heads: u64,
    /// `head_dim`.
    pub head_dim: u64,
    /// `mlp_dim`.
    pub mlp_dim: u64,
    /// `mlp_activations`: one MLP input matrix per entry (`["silu",
    /// "linear"]` is gated, two matrices).
    pub mlp_activations: Vec<String>,
    /// `vocab_size`.
    pub vocab: u64,
    /// `max_target_length`, tokens per sequence.
    pub seq_len: u64,
    /// `per_device_batch_size`, sequences per chip per step (fractional
    /// allowed, as in MaxText; the global batch must be whole).
    pub per_device_batch: f64,
    /// `remat_policy`.
    pub remat: RematPolicy,
    /// `weight_dtype`.
    pub weight_dtype: ModelDType,
    /// `dtype` (activations, and the compute type the weights are cast to).
    pub activation_dtype: ModelDType,
    /// `grad_dtype`: the gradients as the optimizer's shard of them is
    /// held and reduced across the data axis; the weights' type if absent
    /// (JAX's gradients take their parameters' type).
    #[serde(default)]
    pub grad_dtype: Option<ModelDType>,
    /// `mu_dtype`: Adam's first moment (optax's `mu_dtype`); the weights'
    /// type if absent. The other state slots are in the weights' type.
    #[serde(default)]
    pub mu_dtype: Option<ModelDType>,
    /// `logits_via_embedding`: the output logits reuse the token embedding
    /// (tied) instead of a separate `vocab × embed` matrix.
    pub logits_via_embedding: bool,
    /// Whether the family requires `heads × head_dim = embed`.
    #[serde(default)]
    pub attention_width_is_embed: bool,
    /// `trainable_position_size`: rows of a learned position embedding
    /// (GPT-3), 0 for none.
    #[serde(default)]
    pub trainable_position_size: u64,
    /// `quantization`: the weights' matmuls in a narrower type (MaxText's
    /// AQT `int8`; `fp8` and `fp8_full` on the chips that run fp8
    /// natively): the forward's and its recomputation, and with `fp8_full`
    /// the gradients' too; the attention and the logits stay in the
    /// compute type.
    #[serde(default)]
    pub quantization: Option<Quantization>,
    /// `optimizer_memory_host_offload`: the optimizer state lives in the
    /// host's memory, brought in for the update and written back.
    #[serde(default)]
    pub optimizer_memory_host_offload: bool,
    /// `parameter_memory_host_offload`: the parameters (the device's
    /// shard) live in the host's memory between steps.
    #[serde(default)]
    pub parameter_memory_host_offload: bool,
    /// `num_vocab_tiling`: the loss computed in this many chunks of the
    /// tokens, so the logits and their gradient are held a chunk at a time
    /// (1: all at once).
    #[serde(default = "one")]
    pub num_vocab_tiling: u64,
    /// Sliding-window attention: `local_per_global` layers attending to
    /// the last `window` tokens, then one attending to all of them (Gemma
    /// 3: window 1024, five local layers to one global); `None`: every
    /// layer global.
    #[serde(default)]
    pub sliding_window: Option<SlidingWindow>,
    /// Which attention scores the hardware computes (MaxText's formula
    /// counts its own way, [`super::flops::FlopFormula`]).
    #[serde(default)]
    pub attention_kernel: AttentionKernel,
    /// A mixture of experts in place of the MLP of every layer, or of
    /// those its `first_num_dense_layers` and `interleave_moe_layer_step`
    /// pick (MaxText's `num_experts` > 1); `None`: the dense MLP of
    /// `mlp_dim` everywhere.
    #[serde(default)]
    pub moe: Option<super::MixtureOfExperts>,
    /// Multi-head latent attention in every layer (MaxText's
    /// `attention_type: "mla"`, DeepSeek); `None`: the query, key and value
    /// projections of `heads`, `kv_heads` and `head_dim`.
    #[serde(default)]
    pub mla: Option<MultiHeadLatentAttention>,
    /// `use_iota_embed`: the token embedding looked up as a one-hot
    /// matmul on the MXU (`2·T·V·E` FLOPs forward and again for its
    /// gradient, which MaxText's formula does not count) instead of a
    /// gather.
    #[serde(default)]
    pub use_iota_embed: bool,
}

impl ModelConfig {
    /// Decoder layers with a dense MLP and with a mixture of experts
    /// ([`super::MixtureOfExperts::moe_layers`]); every layer dense
    /// without a mixture.
    pub fn dense_and_moe_layers(&self) -> (u64, u64) {
        let moe = self.moe.map_or(0, |m| m.moe_layers(self.layers));
        (self.layers - moe, moe)
    }

    /// The MLP's hidden elements a token holds as the hardware computes
    /// them, averaged over the layers: `mlp_dim` in a dense layer, a
    /// mixture's experts' widths over its routed rows and shared experts
    /// in a mixture's ([`super::MixtureOfExperts::hidden_per_token`]).
    /// The step model multiplies one layer by the layer count, so where
    /// the layers differ (dense-first, interleaved) it takes this average
    /// and the totals come out whole.
    pub fn mlp_hidden(&self) -> u64 {
        match &self.moe {
            None => self.mlp_dim,
            Some(m) => {
                let (dense, moe) = self.dense_and_moe_layers();
                let total = dense as f64 * self.mlp_dim as f64
                    + moe as f64 * m.hidden_per_token(self.seq_len);
                (total / self.layers.max(1) as f64).ceil() as u64
            }
        }
    }

    /// The widest layer's MLP hidden elements a token (what one layer's
    /// backward holds at once): the larger of a dense layer's `mlp_dim`
    /// and a mixture layer's, of the kinds the model has.
    pub fn mlp_hidden_widest(&self) -> u64 {
        let (dense, moe) = self.dense_and_moe_layers();
        let dense_width = if dense > 0 { self.mlp_dim } else { 0 };
        let moe_width = match &self.moe {
            Some(m) if moe > 0 => m.hidden_per_token(self.seq_len).ceil() as u64,
            _ => 0,
        };
        dense_width.max(moe_width)
    }

    /// The elements of the MLP's largest weight tensor: `embed × mlp_dim`,
    /// or a mixture's experts stacked, `num_experts × embed × moe_mlp_dim`
    /// (one tensor, gathered whole), the larger where layers of both kinds
    /// are.
    pub fn mlp_matrix_elements(&self) -> u64 {
        let (dense, moe) = self.dense_and_moe_layers();
        let dense_matrix = if dense > 0 {
            self.embed * self.mlp_dim
        } else {
            0
        };
        let moe_matrix = match &self.moe {
            Some(m) if moe > 0 => m.num_experts * self.embed * m.moe_mlp_dim,
            _ => 0,
        };
        dense_matrix.max(moe_matrix)
    }

    /// The gradients' type: `grad_dtype`, or the weights'.
    pub fn grad_type(&self) -> ModelDType {
        self.grad_dtype.unwrap_or(self.weight_dtype)
    }

    /// Adam's first moment's type: `mu_dtype`, or the weights'.
    pub fn mu_type(&self) -> ModelDType {
        self.mu_dtype.unwrap_or(self.weight_dtype)
    }

    /// Reads and validates a model file (a regular file of at most
    /// [`MAX_MODEL_FILE_BYTES`]).
    pub fn from_ron_file(path: &std::path::Path) -> Result<ModelConfig, ModelError> {
        let text = crate::files::read_text(path, MAX_MODEL_FILE_BYTES, "a model file")
            .map_err(ModelError::Read)?;
        ModelConfig::from_ron_str(&text, &path.display().to_string())
    }

    /// Parses and validates model text; `origin` names it in errors.
    pub fn from_ron_str(text: &str, origin: &str) -> Result<ModelConfig, ModelError> {
        let config: ModelConfig = parse_ron(text, origin, "Model")?;
        config
            .validate()
            .map_err(|(field, problem)| ModelError::Invalid {
                origin: origin.to_string(),
                line: line_of_field(text, field),
                field: field.to_string(),
                problem,
            })?;
        Ok(config)
    }

    /// Checks the dimensions; the first violation, with its field.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.name.trim().is_empty() {
            return Err(("name", "the model needs a name".into()));
        }
        if let AttentionKernel::Causal { block: 0, .. } = self.attention_kernel {
            return Err((
                "attention_kernel",
                "a causal kernel's block is at least 1 token".into(),
            ));
        }
        for (field, value) in [
            ("layers", self.layers),
            ("embed", self.embed),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("mlp_dim", self.mlp_dim),
            ("vocab", self.vocab),
            ("seq_len", self.seq_len),
        ] {
            if value == 0 {
                return Err((field, "must be at least 1".into()));
            }
            // Every product the FLOP count forms stays far inside f64's
            // exact integers and u64 below this.
            if value > 1 << 24 {
                return Err((field, format!("{value} is more than 2^24")));
            }
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err((
                "kv_heads",
                format!(
                    "{} query heads cannot be grouped over {} key/value heads: kv_heads must divide heads",
                    self.heads, self.kv_heads
                ),
            ));
        }
        if self.attention_width_is_embed && self.heads * self.head_dim != self.embed {
            return Err((
                "head_dim",
                format!(
                    "heads x head_dim = {} x {} = {}, but this family needs it to equal embed ({})",
                    self.heads,
                    self.head_dim,
                    self.heads * self.head_dim,
                    self.embed
                ),
            ));
        }
        if self.mlp_activations.is_empty() || self.mlp_activations.len() > 4 {
            return Err((
                "mlp_activations",
                "needs 1 to 4 activations, one per MLP input matrix".into(),
            ));
        }
        if let Some(unknown) = self
            .mlp_activations
            .iter()
            .find(|a| !KNOWN_ACTIVATIONS.contains(&a.as_str()))
        {
            return Err((
                "mlp_activations",
                format!(
                    "unknown activation `{unknown}` (known: {})",
                    KNOWN_ACTIVATIONS.join(", ")
                ),
            ));
        }
        self.check_batch()?;
        self.check_training()?;
        if let Some(moe) = &self.moe {
            moe.check(self.layers).map_err(|problem| ("moe", problem))?;
        }
        if let Some(mla) = &self.mla {
            mla.check().map_err(|problem| ("mla", problem))?;
            if self.kv_heads != self.heads {
                return Err((
                    "kv_heads",
                    format!(
                        "{} key/value heads for {} query heads: multi-head latent attention \
                         up-projects a key and value for every head (MaxText asserts them equal)",
                        self.kv_heads, self.heads
                    ),
                ));
            }
        }
        self.check_parameter_count()?;
        if self.trainable_position_size > 1 << 24 {
            return Err(("trainable_position_size", "is more than 2^24".into()));
        }
        if self.trainable_position_size > 0 && self.decoder_block != DecoderBlock::Gpt3 {
            return Err((
                "trainable_position_size",
                "learned positions belong to the gpt3 decoder block; the others use rotary positions"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The batch: a positive number of sequences a device, at most
    /// [`MAX_PER_DEVICE_BATCH`].
    fn check_batch(&self) -> Result<(), (&'static str, String)> {
        if !(self.per_device_batch.is_finite() && self.per_device_batch > 0.0) {
            return Err((
                "per_device_batch",
                format!("{} is not a positive number", self.per_device_batch),
            ));
        }
        if self.per_device_batch > MAX_PER_DEVICE_BATCH {
            return Err((
                "per_device_batch",
                format!(
                    "{:e} sequences a device is more than 2^24 ({MAX_PER_DEVICE_BATCH})",
                    self.per_device_batch
                ),
            ));
        }
        Ok(())
    }

    /// The training knobs: the sliding window, the loss's tiling and a
    /// custom remat policy's layer input.
    fn check_training(&self) -> Result<(), (&'static str, String)> {
        if let Some(w) = self.sliding_window {
            if w.window == 0 || w.window > self.seq_len {
                return Err((
                    "sliding_window",
                    format!(
                        "a window of {} tokens: at least 1 and at most seq_len ({})",
                        w.window, self.seq_len
                    ),
                ));
            }
            if w.local_per_global > 1 << 24 {
                return Err((
                    "sliding_window",
                    format!("local_per_global {} is more than 2^24", w.local_per_global),
                ));
            }
        }
        if self.num_vocab_tiling == 0 || self.num_vocab_tiling > self.seq_len {
            return Err((
                "num_vocab_tiling",
                format!(
                    "{} chunks of the loss: at least 1 and at most seq_len ({})",
                    self.num_vocab_tiling, self.seq_len
                ),
            ));
        }
        if let RematPolicy::Custom {
            decoder_layer_input: Placement::Remat,
            ..
        } = self.remat
        {
            return Err((
                "remat",
                "decoder_layer_input cannot be rematerialized: it is where the backward pass's \
                 recomputation starts (device or offload)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The parameters multiplied out in 128 bits: more than
    /// [`MAX_PARAMETERS`] is refused, naming the width that makes a layer
    /// too large, or `layers`.
    fn check_parameter_count(&self) -> Result<(), (&'static str, String)> {
        let w = |v: u64| u128::from(v);
        let (e, h, kv, d, m) = (
            w(self.embed),
            w(self.heads),
            w(self.kv_heads),
            w(self.head_dim),
            w(self.mlp_dim),
        );
        let n = self.mlp_activations.len() as u128;
        // Every term of `parameter_count`, bounded above (biases, norms
        // and position rows included at their largest; a mixture's experts
        // and router, and MLA's projections, beside the dense MLP and the
        // standard attention).
        let experts = self.moe.map_or(0, |x| {
            let all = w(x.num_experts) + w(x.shared_experts);
            (n + 1) * w(x.moe_mlp_dim) * e * all + 2 * e * w(x.num_experts)
        });
        let latent = self.mla.map_or(0, |x| {
            let (qk, v) = (w(x.qk_head_dim()), w(x.v_head_dim));
            let (q_rank, kv_rank) = (w(x.q_lora_rank), w(x.kv_lora_rank));
            e * h * qk
                + e * q_rank
                + q_rank * h * qk
                + e * (kv_rank + w(x.qk_rope_head_dim))
                + kv_rank * h * (qk + v)
                + h * v * e
                + q_rank
                + kv_rank
        });
        let per_layer = e * (h + 2 * kv) * d
            + h * d * e
            + (n + 1) * m * e
            + 8 * e
            + 2 * (h + 2 * kv) * d
            + n * m
            + 32 * h
            + experts
            + latent;
        let embedding = 2 * w(self.vocab) * e + w(self.trainable_position_size) * e + 2 * e;
        let total = per_layer * w(self.layers) + embedding;
        if total <= u128::from(MAX_PARAMETERS) {
            return Ok(());
        }
        let field = if per_layer + embedding > u128::from(MAX_PARAMETERS) {
            "embed"
        } else {
            "layers"
        };
        Err((
            field,
            format!(
                "the model has about {:.2e} parameters, more than the 2^60 (1.15e18) the step \
                 model takes",
                total as f64
            ),
        ))
    }

    /// Tokens one chip processes per step: `per_device_batch × seq_len`.
    pub fn tokens_per_device(&self) -> f64 {
        self.per_device_batch * self.seq_len as f64
    }

    /// Sequences per step over `chips` chips, which MaxText requires to be
    /// whole (`per_device_batch_size × devices`).
    pub fn global_batch(&self, chips: u64) -> Result<u64, ModelError> {
        let product = self.per_device_batch * chips as f64;
        let rounded = product.round();
        if chips == 0 || rounded < 1.0 || (product - rounded).abs() > 1e-9 * product.max(1.0) {
            return Err(ModelError::FractionalGlobalBatch {
                model: self.name.clone(),
                per_device_batch: self.per_device_batch,
                chips,
                product,
            });
        }
        Ok(rounded as u64)
    }
}

/// MaxText's `get_individual_scales` (`MaxText/pyconfig.py`): how
/// `global_parameter_scale = 2^k` multiplies the `base_*` dimensions. The
/// exponents rotate: heads and MLP width, then embedding, then layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParameterScales {
    /// log2 of the `emb_dim` multiplier.
    pub embed: u32,
    /// log2 of the `num_query_heads` and `num_kv_heads` multiplier.
    pub heads: u32,
    /// log2 of the `mlp_dim` multiplier.
    pub mlp: u32,
    /// log2 of the `num_decoder_layers` multiplier.
    pub layers: u32,
}

/// The scales for `global_parameter_scale`; MaxText refuses a scale that is
/// not a power of two, and so does this.
pub fn parameter_scales(global_parameter_scale: u64) -> Result<ParameterScales, ModelError> {
    if global_parameter_scale == 0 || !global_parameter_scale.is_power_of_two() {
        return Err(ModelError::Invalid {
            origin: "global_parameter_scale".into(),
            line: None,
            field: "global_parameter_scale".into(),
            problem: format!("{global_parameter_scale} is not a power of 2"),
        });
    }
    let log2 = global_parameter_scale.trailing_zeros();
    let (base, rem) = (log2 / 3, log2 % 3);
    let heads = base + u32::from(rem > 0);
    Ok(ParameterScales {
        embed: base + u32::from(rem > 1),
        heads,
        mlp: heads,
        layers: base,
    })
}

/// Parses RON text into `T`; syntax errors carry origin, line, column and
/// the field path (as pod files do).
pub(super) fn parse_ron<T: serde::de::DeserializeOwned>(
    text: &str,
    origin: &str,
    top: &str,
) -> Result<T, ModelError> {
    crate::files::parse_ron(text, top).map_err(|e| ModelError::Syntax {
        origin: origin.to_string(),
        line: e.line,
        column: e.column,
        field: e.field,
        message: e.message,
    })
}

/// The 1-based line of a field's first appearance in `text`, best effort.
fn line_of_field(text: &str, field: &str) -> Option<usize> {
    text.lines()
        .position(|line| {
            let line = line.trim_start();
            !line.starts_with("//")
                && line.split([',', '(']).any(|part| {
                    part.trim_start()
                        .strip_prefix(field)
                        .is_some_and(|rest| rest.trim_start().starts_with(':'))
                })
        })
        .map(|i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_rotate_as_maxtext_get_individual_scales() {
        // pyconfig.get_individual_scales for 1, 2, 4, 8, 16, 128.
        let s = |e, h, l| ParameterScales {
            embed: e,
            heads: h,
            mlp: h,
            layers: l,
        };
        assert_eq!(parameter_scales(1).unwrap(), s(0, 0, 0));
        assert_eq!(parameter_scales(2).unwrap(), s(0, 1, 0));
        assert_eq!(parameter_scales(4).unwrap(), s(1, 1, 0));
        assert_eq!(parameter_scales(8).unwrap(), s(1, 1, 1));
        assert_eq!(parameter_scales(16).unwrap(), s(1, 2, 1));
        assert_eq!(parameter_scales(128).unwrap(), s(2, 3, 2));
        assert!(parameter_scales(24).is_err());
        assert!(parameter_scales(0).is_err());
    }

    #[test]
    fn policy_names_are_the_ron_names() {
        for policy in RematPolicy::ALL {
            let text = ron::to_string(&policy).unwrap();
            assert_eq!(text, policy.name());
            assert_eq!(ron::from_str::<RematPolicy>(&text).unwrap(), policy);
        }
    }

    #[test]
    fn a_model_past_the_planner_s_limits_names_the_field() {
        let mut config = crate::model::bundled("llama2-7b").unwrap();
        let mut wide = config.clone();
        wide.attention_width_is_embed = false;
        wide.embed = 1 << 24;
        wide.heads = 1 << 24;
        wide.kv_heads = 1 << 24;
        wide.head_dim = 1 << 24;
        wide.mlp_dim = 1 << 24;
        // Each dimension is allowed; their product (3e29 parameters, past
        // any u64) is not.
        let err = wide.validate().unwrap_err();
        assert_eq!(err.0, "embed", "{}", err.1);
        assert!(err.1.contains("2^60"), "{}", err.1);
        // Layers of an allowed width, too many of them.
        config.layers = 1 << 24;
        config.embed = 1 << 16;
        config.mlp_dim = 1 << 18;
        config.head_dim = (1 << 16) / 32;
        let err = config.validate().unwrap_err();
        assert_eq!(err.0, "layers", "{}", err.1);
        let mut batch = crate::model::bundled("llama2-7b").unwrap();
        batch.per_device_batch = 1e300;
        assert_eq!(batch.validate().unwrap_err().0, "per_device_batch");
        batch.per_device_batch = 16_777_216.0;
        assert!(batch.validate().is_ok());
    }

    #[test]
    fn a_field_is_found_on_its_line() {
        let text = "Model(\n  name: \"x\",\n  layers: 0, embed: 4,\n)";
        assert_eq!(line_of_field(text, "layers"), Some(3));
        assert_eq!(line_of_field(text, "embed"), Some(3));
        assert_eq!(line_of_field(text, "name"), Some(2));
        assert_eq!(line_of_field(text, "vocab"), None);
    }
}
