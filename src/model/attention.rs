//! How a layer attends: the kernel the hardware runs the scores in
//! ([`AttentionKernel`]) and, for DeepSeek's layers, multi-head latent
//! attention ([`MultiHeadLatentAttention`], MaxText's `attention_type:
//! "mla"`), with the widths the rest of the model reads
//! ([`ModelConfig::query_width`] and its siblings) so the FLOP count, the
//! parameter count and the saved activations take either attention alike.
//!
//! In a model file MLA is written with MaxText's names:
//!
//! ```ron
//! mla: Some((q_lora_rank: 1536, kv_lora_rank: 512, qk_nope_head_dim: 128,
//!            qk_rope_head_dim: 64, v_head_dim: 128)),
//! ```
//!
//! `heads` and `kv_heads` stay (MLA needs them equal, as MaxText asserts);
//! `head_dim` is not read by an MLA layer.

use serde::{Deserialize, Serialize};

use super::config::ModelConfig;

/// Which attention scores the hardware computes, and how often.
///
/// Both kernels are flash kernels: the scores never reach HBM, so the
/// backward recomputes them. With the key-value gradients and the query
/// gradient in kernels of their own (the Pallas flash kernel, and
/// MaxText's splash default, `sa_use_fused_bwd_kernel: False`) each
/// recomputes `QKᵀ` and `dO·Vᵀ`: seven score-sized matmuls against the
/// forward's two. One fused kernel (`fused_backward: true`) makes five.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionKernel {
    /// Every score: a flash kernel with `causal=False` (MaxText's v5e runs
    /// at e47fa1b5, their mask applied as a bias), its backward in two
    /// kernels.
    #[default]
    Full,
    /// A flash kernel with `causal=True` skips every block of scores
    /// wholly above the diagonal (MaxText's `attention='flash'` from
    /// 76bd53b0 on, 512-token blocks).
    Causal {
        /// Tokens per block along the sequence (the kernel's `block_q`
        /// and `block_k`).
        block: u64,
        /// `sa_use_fused_bwd_kernel`: the backward in one kernel.
        #[serde(default)]
        fused_backward: bool,
    },
}

impl AttentionKernel {
    /// The query-key pairs the kernel computes for a local layer of
    /// `window` tokens, per sequence of `seq_len`: a causal kernel's blocks
    /// that meet the band (each query block the key blocks from its own
    /// back to the window's start), every pair without one (the mask
    /// applied to the full scores).
    pub fn window_pairs_computed(self, seq_len: u64, window: u64) -> f64 {
        match self {
            AttentionKernel::Full => (seq_len as f64).powi(2),
            AttentionKernel::Causal { block, .. } => {
                let b = block.clamp(1, seq_len.max(1));
                let n = seq_len.div_ceil(b);
                let reach = window.saturating_sub(1).div_ceil(b) + 1;
                // Σ over query blocks i of min(i + 1, reach) key blocks.
                let full = n.saturating_sub(reach);
                let ramp = n.min(reach);
                let blocks = ramp * (ramp + 1) / 2 + full * reach;
                (blocks as f64 * (b * b) as f64).min((seq_len as f64).powi(2))
            }
        }
    }

    /// The share of the full scores' and values' FLOPs the kernel runs at
    /// `seq_len`: with `n` blocks a side, the `n(n+1)/2` on or below the
    /// diagonal of `n²` (5/8 at 2048 tokens in 512-token blocks). The
    /// backward's blocks are taken as the forward's.
    pub fn computed_fraction(self, seq_len: u64) -> f64 {
        match self {
            AttentionKernel::Full => 1.0,
            AttentionKernel::Causal { block, .. } => {
                let n = seq_len.div_ceil(block.clamp(1, seq_len.max(1))) as f64;
                (n + 1.0) / (2.0 * n)
            }
        }
    }

    /// The backward's score-sized matmuls per forward's (`QKᵀ` and `PV`):
    /// 7/2 in two kernels, 5/2 fused (the type's docs).
    pub fn backward_factor(self) -> f64 {
        match self {
            AttentionKernel::Causal {
                fused_backward: true,
                ..
            } => 2.5,
            _ => 3.5,
        }
    }
}

/// Multi-head latent attention (`layers/attention_mla.py`): the input
/// projected down to a `kv_lora_rank` latent (plus a shared
/// `qk_rope_head_dim` rotary key), normalized, then up to every head's key
/// (`qk_nope_head_dim`, joined by the rotary part) and value
/// (`v_head_dim`); the query straight from the input, or through a
/// `q_lora_rank` latent of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MultiHeadLatentAttention {
    /// `q_lora_rank`: the query's latent width; 0 projects the query
    /// from the input directly (`embed × heads × qk_head_dim`).
    #[serde(default)]
    pub q_lora_rank: u64,
    /// `kv_lora_rank`: the keys' and values' shared latent width.
    pub kv_lora_rank: u64,
    /// `qk_nope_head_dim`: each head's key and query width without
    /// rotary positions.
    pub qk_nope_head_dim: u64,
    /// `qk_rope_head_dim`: the rotary part of each head's query and key
    /// (the key's is one projection shared by every head).
    pub qk_rope_head_dim: u64,
    /// `v_head_dim`: each head's value width.
    pub v_head_dim: u64,
}

impl MultiHeadLatentAttention {
    /// A head's query and key width: `qk_nope_head_dim + qk_rope_head_dim`.
    pub fn qk_head_dim(&self) -> u64 {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// The multiply-adds of the query and key-value projections per token,
    /// MaxText's `calculate_mla_tflops_per_device` `qkv_flops` over
    /// `2·B·L`: `E·H·qk` (or `E·q_lora + q_lora·H·qk`) for the query,
    /// `E·(kv_lora + rope) + kv_lora·H·(nope + v)` for the keys and values.
    pub fn projection_macs_per_token(&self, embed: u64, heads: u64) -> u64 {
        let qk = self.qk_head_dim();
        let query = if self.q_lora_rank == 0 {
            embed * heads * qk
        } else {
            embed * self.q_lora_rank + self.q_lora_rank * heads * qk
        };
        query
            + embed * (self.kv_lora_rank + self.qk_rope_head_dim)
            + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
    }

    /// Its parameters with `heads` heads on an `embed`-wide input: the
    /// projections ([`Self::projection_macs_per_token`], one weight a
    /// multiply-add), the output (`H·v × E`), and the RMSNorm scales on
    /// the latents (`q_norm` when there is a query latent, `kv_norm`).
    pub fn parameters(&self, embed: u64, heads: u64) -> u64 {
        self.projection_macs_per_token(embed, heads)
            + heads * self.v_head_dim * embed
            + self.q_lora_rank
            + self.kv_lora_rank
    }

    /// Its largest weight matrix, in elements.
    pub fn largest_matrix(&self, embed: u64, heads: u64) -> u64 {
        let qk = self.qk_head_dim();
        let query = if self.q_lora_rank == 0 {
            embed * heads * qk
        } else {
            (embed * self.q_lora_rank).max(self.q_lora_rank * heads * qk)
        };
        [
            query,
            embed * (self.kv_lora_rank + self.qk_rope_head_dim),
            self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim),
            heads * self.v_head_dim * embed,
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
    }

    /// The first field that cannot be, with why.
    pub(crate) fn check(&self) -> Result<(), String> {
        for (field, value) in [
            ("q_lora_rank", self.q_lora_rank),
            ("kv_lora_rank", self.kv_lora_rank),
            ("qk_nope_head_dim", self.qk_nope_head_dim),
            ("qk_rope_head_dim", self.qk_rope_head_dim),
            ("v_head_dim", self.v_head_dim),
        ] {
            if value > 1 << 24 {
                return Err(format!("{field} {value} is more than 2^24"));
            }
        }
        if self.kv_lora_rank == 0 {
            return Err(
                "kv_lora_rank 0: the keys and values are projected through a latent of at \
                 least 1 (q_lora_rank alone may be 0)"
                    .into(),
            );
        }
        if self.qk_head_dim() == 0 {
            return Err(
                "qk_nope_head_dim 0 and qk_rope_head_dim 0: a head's query and key need a \
                 width"
                    .into(),
            );
        }
        if self.v_head_dim == 0 {
            return Err("v_head_dim 0: a head's value needs a width".into());
        }
        Ok(())
    }
}

/// The attention's widths, whichever kind: what the projections produce,
/// what the scores cost, what the output projection reads.
impl ModelConfig {
    /// The query's width a token: `heads × head_dim`, or MLA's `heads ×
    /// qk_head_dim`.
    pub fn query_width(&self) -> u64 {
        match &self.mla {
            None => self.heads * self.head_dim,
            Some(m) => self.heads * m.qk_head_dim(),
        }
    }

    /// The key's width a token: `kv_heads × head_dim`, or MLA's every
    /// head's `qk_head_dim` (the up-projected keys the scores read).
    pub fn key_width(&self) -> u64 {
        match &self.mla {
            None => self.kv_heads * self.head_dim,
            Some(m) => self.heads * m.qk_head_dim(),
        }
    }

    /// The value's width a token: `kv_heads × head_dim`, or MLA's `heads ×
    /// v_head_dim`.
    pub fn value_width(&self) -> u64 {
        match &self.mla {
            None => self.kv_heads * self.head_dim,
            Some(m) => self.heads * m.v_head_dim,
        }
    }

    /// The attention's output a token, the output projection's input:
    /// `heads × head_dim`, or MLA's `heads × v_head_dim`.
    pub fn context_width(&self) -> u64 {
        match &self.mla {
            None => self.heads * self.head_dim,
            Some(m) => self.heads * m.v_head_dim,
        }
    }

    /// Multiply-adds a token's query, key and value projections take:
    /// `embed × (heads + 2·kv_heads) × head_dim`, or MLA's
    /// ([`MultiHeadLatentAttention::projection_macs_per_token`]).
    pub fn projection_macs_per_token(&self) -> u64 {
        match &self.mla {
            None => self.embed * (self.heads + 2 * self.kv_heads) * self.head_dim,
            Some(m) => m.projection_macs_per_token(self.embed, self.heads),
        }
    }

    /// Multiply-adds of one query-key pair's score and value, every head:
    /// `QKᵀ` over the query's width and `PV` over the context's
    /// (`2·heads·head_dim`; MLA's `heads × (qk_head_dim + v_head_dim)`,
    /// MaxText's MLA attention term).
    pub fn score_macs_per_pair(&self) -> u64 {
        self.query_width() + self.context_width()
    }

    /// The latents MLA writes and reads between its down and up
    /// projections, a token (`q_lora_rank + kv_lora_rank +
    /// qk_rope_head_dim`); 0 for standard attention.
    pub fn latent_width(&self) -> u64 {
        self.mla
            .map_or(0, |m| m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim)
    }

    /// The input widths of the attention's projection matmuls a token (what
    /// a quantized step quantizes): `3 × embed` (query, key, value), or
    /// MLA's `embed` into each down projection (one for the query without
    /// a latent) and each latent into its up projection.
    pub fn projection_input_width(&self) -> u64 {
        match &self.mla {
            None => 3 * self.embed,
            Some(m) => 2 * self.embed + m.q_lora_rank + m.kv_lora_rank,
        }
    }

    /// The attention's largest weight matrix: the query or output
    /// projection (`embed × heads × head_dim`), or MLA's largest.
    pub fn largest_attention_matrix(&self) -> u64 {
        match &self.mla {
            None => self.embed * self.heads * self.head_dim,
            Some(m) => m.largest_matrix(self.embed, self.heads),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deepseek_v3() -> MultiHeadLatentAttention {
        MultiHeadLatentAttention {
            q_lora_rank: 1536,
            kv_lora_rank: 512,
            qk_nope_head_dim: 128,
            qk_rope_head_dim: 64,
            v_head_dim: 128,
        }
    }

    #[test]
    fn mla_parameters_by_hand() {
        // DeepSeek-V3 (embed 7168, 128 heads): wq_a 7168·1536, q_norm 1536,
        // wq_b 1536·128·192, wkv_a 7168·576, kv_norm 512, wkv_b
        // 512·128·256, out 128·128·7168.
        let m = deepseek_v3();
        assert_eq!(
            m.parameters(7168, 128),
            11_010_048 + 1536 + 37_748_736 + 4_128_768 + 512 + 16_777_216 + 117_440_512
        );
        let direct = MultiHeadLatentAttention {
            q_lora_rank: 0,
            ..m
        };
        assert_eq!(
            direct.parameters(7168, 128) - m.parameters(7168, 128),
            7168 * 128 * 192 - 11_010_048 - 1536 - 37_748_736
        );
        assert_eq!(m.largest_matrix(7168, 128), 117_440_512);
    }

    #[test]
    fn mla_needs_its_latent_and_its_widths() {
        let m = deepseek_v3();
        assert!(m.check().is_ok());
        let zero_kv = MultiHeadLatentAttention {
            kv_lora_rank: 0,
            ..m
        };
        assert!(zero_kv.check().unwrap_err().contains("kv_lora_rank 0"));
        let zero_v = MultiHeadLatentAttention { v_head_dim: 0, ..m };
        assert!(zero_v.check().unwrap_err().contains("v_head_dim 0"));
        let no_qk = MultiHeadLatentAttention {
            qk_nope_head_dim: 0,
            qk_rope_head_dim: 0,
            ..m
        };
        assert!(no_qk.check().unwrap_err().contains("qk_nope_head_dim 0"));
    }
}
