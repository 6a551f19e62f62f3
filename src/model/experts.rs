//! A mixture of experts in place of each layer's MLP (MaxText's
//! `num_experts` > 1, `layers/moe.py`): a router (`2·D·E` FLOPs a token)
//! picks `num_experts_per_tok` of `num_experts` expert MLPs of width
//! `moe_mlp_dim` for each token, beside `shared_experts` every token runs.
//!
//! MaxText's FLOP count (`calculate_tflops_training_per_device`) is the
//! dropless one whatever the routing: the router and `k + shared` expert
//! MLPs a token. The hardware runs more when tokens are dropped
//! (`capacity_factor` > 0): every expert computes its whole capacity, full
//! or not, and the one-hot dispatch (`BSM,BSEC→EBCM`) and combine
//! (`EBCM,BSEC→BSM`) are matmuls of `2·B·S·E·C·D` FLOPs each, `C` slots an
//! expert per sequence ([`MixtureOfExperts::capacity`]).
//!
//! Dropless routing (MaxText's `sparse_matmul` with megablox) sorts a
//! device's `m` routed rows by expert and runs each expert matmul as one
//! grouped matmul over row tiles of `tile_batch_seq` (`min(512, m)`,
//! MaxText's default, which the published DeepSeek-V3 recipes keep). A
//! tile that holds the end of one expert's rows and the start of the
//! next's is computed once for each of them, masked, so the kernel visits
//! `ceil(m / tm) + G − 1` tiles for `G` experts on the device: with 256
//! experts and 1536 rows each, a third more than the rows; with 128
//! experts of 256 rows, half as much again
//! ([`MixtureOfExperts::grouped_matmul_rows`]).
//!
//! Not every layer need hold the mixture. DeepSeek's first
//! `first_num_dense_layers` layers have a dense MLP of `mlp_dim`, the rest
//! the mixture; Llama 4's every `interleave_moe_layer_step`-th layer is a
//! mixture (layer `i`, counted from 0, when `(i + 1) % step == 0`), the
//! others dense. MaxText's `get_dense_moe_layers` counts `first, layers −
//! first` and `layers − layers / step, layers / step`, and its FLOP count
//! (`calculate_routed_and_shared_ffn_tflops_per_device`) takes each kind
//! times its layers; so do the parameter count and the step model here
//! (MaxText reads the first for its `deepseek` block, the second for its
//! `llama4` one; here either applies whatever the block, one at a time):
//!
//! ```ron
//! moe: Some((num_experts: 256, num_experts_per_tok: 8, moe_mlp_dim: 2048,
//!            shared_experts: 1, routed_bias: true, first_num_dense_layers: 3)),
//! ```

use serde::{Deserialize, Serialize};

/// A mixture of experts: every decoder layer's MLP.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixtureOfExperts {
    /// `num_experts`: routed experts a layer holds.
    pub num_experts: u64,
    /// `num_experts_per_tok`: experts each token is routed to (top-k).
    pub num_experts_per_tok: u64,
    /// `moe_mlp_dim`: each expert's hidden width.
    pub moe_mlp_dim: u64,
    /// `shared_experts`: experts of the same width every token runs.
    #[serde(default)]
    pub shared_experts: u64,
    /// `capacity_factor`: tokens are dropped beyond this multiple of an
    /// even share per expert; `None` is dropless (MaxText's `-1`).
    #[serde(default)]
    pub capacity_factor: Option<f64>,
    /// `first_num_dense_layers`: the layers before the first mixture,
    /// each with a dense MLP of `mlp_dim` (DeepSeek: 3); 0, every layer a
    /// mixture (or as `interleave_moe_layer_step` picks).
    #[serde(default)]
    pub first_num_dense_layers: u64,
    /// `interleave_moe_layer_step`: every this-many-th layer is a mixture,
    /// the others dense (Llama 4 Maverick: 2); 1, every layer.
    #[serde(default = "one")]
    pub interleave_moe_layer_step: u64,
    /// `routed_bias`: the router's scores take a learned bias per expert
    /// (DeepSeek-V3's load-balancing bias: `num_experts` parameters a
    /// mixture layer; no FLOPs counted).
    #[serde(default)]
    pub routed_bias: bool,
    /// `use_ring_of_experts`: on an expert axis, every device's tokens are
    /// all-gathered over the axis, each device runs its experts on the
    /// tokens routed to them, and the results are reduce-scattered back,
    /// in place of the two all-to-alls (`crate::step_model::expert_parallel`);
    /// without an expert axis there is nothing to gather and the step is
    /// the same.
    #[serde(default)]
    pub use_ring_of_experts: bool,
    /// `tile_batch_seq`: the dropless grouped matmul's row tile (MaxText's
    /// megablox tiling; default 512). Unused when tokens are dropped.
    #[serde(default = "default_tile_batch_seq")]
    pub tile_batch_seq: u64,
}

fn one() -> u64 {
    1
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a.max(1) } else { gcd(b, a % b) }
}

/// MaxText's `tile_batch_seq` default.
pub const DEFAULT_TILE_BATCH_SEQ: u64 = 512;

fn default_tile_batch_seq() -> u64 {
    DEFAULT_TILE_BATCH_SEQ
}

impl MixtureOfExperts {
    /// MaxText's `expert_capacity_per_batch`, the slots each expert holds
    /// per sequence of `seq_len` when dropping:
    /// `int(max(ceil(S·k/E)·cf, cf))`; `None` dropless.
    pub fn capacity(&self, seq_len: u64) -> Option<u64> {
        let cf = self.capacity_factor?;
        let even = (seq_len * self.num_experts_per_tok).div_ceil(self.num_experts.max(1));
        Some((even as f64 * cf).max(cf) as u64)
    }

    /// Routed rows each token's expert matmuls take as the hardware runs
    /// them: `k` dropless, `E·C/S` dropping (the capacity's slots, padding
    /// included).
    pub fn routed_rows_per_token(&self, seq_len: u64) -> f64 {
        match self.capacity(seq_len) {
            None => self.num_experts_per_tok as f64,
            Some(c) => (self.num_experts * c) as f64 / seq_len.max(1) as f64,
        }
    }

    /// The rows a dropless grouped matmul computes for `rows` routed rows
    /// on a device split among `groups` experts (module docs): each tile of
    /// `tm = min(tile_batch_seq, rows)` rows once, and once more for each
    /// expert boundary inside a tile, `(ceil(rows/tm) + b)·tm`. Routed
    /// groups differ in size, so each of the `min(groups, rows) − 1`
    /// boundaries falls on a tile's edge only by chance, `1/tm` of the
    /// time: `b = (min(groups, rows) − 1)(1 − 1/tm)`. When every token goes
    /// to every expert the groups are equal and `b` counts the boundaries
    /// off the tiles' edges exactly. The rows themselves when tokens are
    /// dropped (the capacity's slots are counted there) or there are none.
    pub fn grouped_matmul_rows(&self, rows: f64, groups: u64) -> f64 {
        if self.capacity_factor.is_some() || rows.is_nan() || rows < 1.0 || !rows.is_finite() {
            return rows.max(0.0);
        }
        let m = rows.ceil();
        let tile = (self.tile_batch_seq.max(1) as f64).min(m);
        let tiles = (m / tile).ceil();
        let groups = (groups.max(1) as f64).min(m);
        let inside = if self.num_experts_per_tok >= self.num_experts && m < 1e15 {
            // Equal groups of `m / groups` rows: boundary `j` is on an
            // edge when `j·per` is a multiple of the tile.
            let (m, tile, g) = (m as u64, tile as u64, groups as u64);
            if m % g == 0 {
                let per = m / g;
                let period = tile / gcd(per, tile);
                (g - 1 - (g - 1) / period) as f64
            } else {
                (g - 1) as f64
            }
        } else {
            (groups - 1.0) * (1.0 - 1.0 / tile)
        };
        (tiles + inside) * tile
    }

    /// The expert hidden widths a token's MLP holds as the hardware runs
    /// it: `moe_mlp_dim × (routed rows + shared)`.
    pub fn hidden_per_token(&self, seq_len: u64) -> f64 {
        self.moe_mlp_dim as f64 * (self.routed_rows_per_token(seq_len) + self.shared_experts as f64)
    }

    /// How many of `layers` hold the mixture (MaxText's
    /// `get_dense_moe_layers`): those after the first
    /// `first_num_dense_layers`, or `layers / interleave_moe_layer_step`.
    pub fn moe_layers(&self, layers: u64) -> u64 {
        let after_dense = layers.saturating_sub(self.first_num_dense_layers);
        after_dense / self.interleave_moe_layer_step.max(1)
    }

    /// The routed experts' weights of one mixture layer: `num_experts`
    /// MLPs of `activations + 1` matrices of `embed × moe_mlp_dim` (what an
    /// expert axis splits; the shared experts and the router stay whole).
    pub fn routed_weights(&self, embed: u64, activations: u64) -> u64 {
        (activations + 1) * self.moe_mlp_dim * embed * self.num_experts
    }

    /// The routed experts' weights of all of `config`'s mixture layers.
    pub fn routed_weights_of(config: &super::ModelConfig) -> u64 {
        let (_, moe_layers) = config.dense_and_moe_layers();
        config.moe.map_or(0, |m| {
            m.routed_weights(config.embed, config.mlp_activations.len() as u64) * moe_layers
        })
    }

    /// The first field that cannot be in a model of `layers` layers, with
    /// why.
    pub(crate) fn check(&self, layers: u64) -> Result<(), String> {
        if self.first_num_dense_layers > layers {
            return Err(format!(
                "first_num_dense_layers {}: at most the model's {layers} layers",
                self.first_num_dense_layers
            ));
        }
        if self.interleave_moe_layer_step == 0 || self.interleave_moe_layer_step > layers {
            return Err(format!(
                "interleave_moe_layer_step {}: at least 1 (every layer a mixture) and at most the \
                 model's {layers} layers",
                self.interleave_moe_layer_step
            ));
        }
        if self.first_num_dense_layers > 0 && self.interleave_moe_layer_step > 1 {
            return Err(format!(
                "first_num_dense_layers {} with interleave_moe_layer_step {}: MaxText reads the \
                 first for DeepSeek's block and the second for Llama 4's, never both; set one",
                self.first_num_dense_layers, self.interleave_moe_layer_step
            ));
        }
        if self.moe_mlp_dim > 1 << 24 {
            return Err(format!(
                "moe_mlp_dim {} is more than 2^24",
                self.moe_mlp_dim
            ));
        }
        if self.num_experts < 2 {
            return Err(format!(
                "num_experts {}: a mixture needs at least 2 (a dense model sets no moe)",
                self.num_experts
            ));
        }
        if self.num_experts_per_tok == 0 || self.num_experts_per_tok > self.num_experts {
            return Err(format!(
                "num_experts_per_tok {}: at least 1 and at most num_experts ({})",
                self.num_experts_per_tok, self.num_experts
            ));
        }
        if self.moe_mlp_dim == 0 {
            return Err("moe_mlp_dim 0: an expert needs a hidden width".into());
        }
        if self.shared_experts > 1 << 16 || self.num_experts > 1 << 20 {
            return Err(format!(
                "{} experts and {} shared: at most 2^20 and 2^16",
                self.num_experts, self.shared_experts
            ));
        }
        if self.tile_batch_seq == 0 || self.tile_batch_seq > 1 << 20 {
            return Err(format!(
                "tile_batch_seq {}: the grouped matmul's row tile, from 1 to 2^20",
                self.tile_batch_seq
            ));
        }
        if let Some(cf) = self.capacity_factor
            && !(cf.is_finite() && cf > 0.0 && cf <= self.num_experts as f64)
        {
            return Err(format!(
                "capacity_factor {cf}: above 0 and at most num_experts ({}); dropless sets None",
                self.num_experts
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mixtral(cf: Option<f64>) -> MixtureOfExperts {
        MixtureOfExperts {
            num_experts: 8,
            num_experts_per_tok: 2,
            moe_mlp_dim: 14336,
            shared_experts: 0,
            capacity_factor: cf,
            first_num_dense_layers: 0,
            interleave_moe_layer_step: 1,
            routed_bias: false,
            use_ring_of_experts: false,
            tile_batch_seq: DEFAULT_TILE_BATCH_SEQ,
        }
    }

    #[test]
    fn a_dropless_grouped_matmul_visits_a_shared_tile_once_per_expert() {
        let dropless = MixtureOfExperts {
            num_experts: 256,
            num_experts_per_tok: 8,
            ..mixtral(None)
        };
        // One expert: the rows rounded up to whole tiles.
        assert_eq!(dropless.grouped_matmul_rows(1024.0, 1), 1024.0);
        assert_eq!(dropless.grouped_matmul_rows(1000.0, 1), 1024.0);
        // DeepSeek-V3's P3 row: 6 × 8192 tokens, top-8 of 256: 768 tiles
        // of 512 and 255 boundaries, each inside a tile but 1/512 of the
        // time.
        let rows = 6.0 * 8192.0 * 8.0;
        let inside = |b: f64| b * (1.0 - 1.0 / 512.0);
        assert_eq!(
            dropless.grouped_matmul_rows(rows, 256),
            (768.0 + inside(255.0)) * 512.0
        );
        // An expert axis of 16 leaves 16 experts and 15 boundaries.
        assert_eq!(
            dropless.grouped_matmul_rows(rows, 16),
            (768.0 + inside(15.0)) * 512.0
        );
        // Fewer rows than a tile: one tile of the rows, and the experts'
        // boundaries inside it (at most one expert a row).
        assert_eq!(
            dropless.grouped_matmul_rows(100.0, 4),
            (1.0 + 3.0 * (1.0 - 1.0 / 100.0)) * 100.0
        );
        // Every token to every expert: equal groups, whose boundaries
        // fall on the tiles' edges when a group is a whole number of
        // tiles, and inside them otherwise.
        let all = MixtureOfExperts {
            num_experts: 8,
            num_experts_per_tok: 8,
            ..dropless
        };
        assert_eq!(all.grouped_matmul_rows(8.0 * 1024.0, 8), 8.0 * 1024.0);
        // 8 groups of 768 rows: boundaries at 768·j, on an edge for even j.
        assert_eq!(
            all.grouped_matmul_rows(8.0 * 768.0, 8),
            (12.0 + 4.0) * 512.0
        );
        // Dropping counts its capacity elsewhere; nothing to pad here.
        assert_eq!(mixtral(Some(1.25)).grouped_matmul_rows(rows, 8), rows);
        assert_eq!(dropless.grouped_matmul_rows(0.0, 256), 0.0);
        assert_eq!(dropless.grouped_matmul_rows(f64::NAN, 256), 0.0);
        let zero = MixtureOfExperts {
            tile_batch_seq: 0,
            ..dropless
        };
        assert!(zero.check(61).unwrap_err().contains("tile_batch_seq 0"));
    }

    #[test]
    fn capacity_is_maxtexts() {
        // 4096 tokens, top-2 of 8: 1024 an expert, ×1.25.
        assert_eq!(mixtral(Some(1.25)).capacity(4096), Some(1280));
        assert_eq!(mixtral(Some(1.25)).routed_rows_per_token(4096), 2.5);
        assert_eq!(mixtral(None).capacity(4096), None);
        assert_eq!(mixtral(None).routed_rows_per_token(4096), 2.0);
        // One token: ceil(2/8) = 1 slot, at least cf.
        assert_eq!(mixtral(Some(2.0)).capacity(1), Some(2));
        assert!(mixtral(Some(f64::NAN)).check(32).is_err());
        assert!(mixtral(Some(9.0)).check(32).is_err());
        let top9 = MixtureOfExperts {
            num_experts_per_tok: 9,
            ..mixtral(None)
        };
        assert!(
            top9.check(32)
                .unwrap_err()
                .contains("num_experts_per_tok 9")
        );
    }

    #[test]
    fn dense_first_and_interleaved_layers_count_as_maxtext() {
        let deepseek = MixtureOfExperts {
            first_num_dense_layers: 3,
            ..mixtral(None)
        };
        assert_eq!(deepseek.moe_layers(61), 58);
        assert_eq!(deepseek.moe_layers(3), 0);
        let maverick = MixtureOfExperts {
            interleave_moe_layer_step: 2,
            ..mixtral(None)
        };
        assert_eq!(maverick.moe_layers(48), 24);
        // layers // step, as get_dense_moe_layers: 7 // 2 = 3.
        assert_eq!(maverick.moe_layers(7), 3);
        assert_eq!(mixtral(None).moe_layers(32), 32);
        let err = deepseek.check(2).unwrap_err();
        assert!(err.contains("first_num_dense_layers 3"), "{err}");
        let step0 = MixtureOfExperts {
            interleave_moe_layer_step: 0,
            ..mixtral(None)
        };
        assert!(
            step0
                .check(32)
                .unwrap_err()
                .contains("interleave_moe_layer_step 0")
        );
        let both = MixtureOfExperts {
            interleave_moe_layer_step: 2,
            ..deepseek
        };
        assert!(both.check(61).unwrap_err().contains("never both"));
    }
}
