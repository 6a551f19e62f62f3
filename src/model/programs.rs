//! One decoder layer's forward and backward, and the logits' forward and
//! backward, as compiler programs, costed by the compiler's cost analysis.
//!
//! The step model needs what a layer computes and moves, op by op, not only
//! MaxText's FLOP total; building the layer as a graph and running
//! [`analyze`] on it gives both, and the dots' FLOPs must agree with
//! MaxText's per-matmul count ([`FlopFormula::Matmuls`](super::flops::FlopFormula::Matmuls))
//! exactly (tested), which checks the graph.
//!
//! - **Shapes.** Activations are `[batch, seq, ...]` with `batch` the
//!   `tokens / seq_len` sequences rounded up to a whole one. A fractional
//!   batch (MaxText allows `per_device_batch 0.5`) is built at the rounded
//!   batch and every figure scaled by `tokens / (batch × seq_len)`: all of
//!   them, the attention's too, are linear in the batch at a fixed
//!   sequence length. Heads stay split as `[kv_heads, heads / kv_heads]`
//!   and every matmul is one general dot over those axes, so grouped-query
//!   attention needs no broadcast of K and V and the graph has no
//!   transposes.
//! - **Attention** is full (non-causal) scores `[batch, kv, seq, group,
//!   seq]` (the `[batch, heads, seq, seq]` scores with heads split),
//!   matching `Matmuls`' attention term; a causal kernel skips half of
//!   it, which `MatmulsCausal` counts. Rotary positions, dropout, T5's
//!   relative-position biases and query/key norms are not in the graph.
//! - **Block.** `llama2`: RMSNorm, attention, residual, RMSNorm, MLP,
//!   residual. `gpt3`: LayerNorms and a bias on every dense layer.
//!   `default`/`default_t5`: one RMSNorm feeding attention and the MLP in
//!   parallel, both added to the residual.
//! - **Backward** takes the forward's intermediates as parameters (no
//!   rematerialization: recomputing under a remat policy is the step
//!   model's to add) and has, for every dot `Y = A·B`, `dA = dY·Bᵀ` and
//!   `dB = Aᵀ·dY`, so its dot FLOPs are exactly twice the forward's; the
//!   softmax, activation, norm and bias backward are elementwise ops and
//!   reductions.
//! - **Bytes.** `ir::DType` has no bfloat16, so the graphs are `f32` and
//!   every byte count is scaled by `activation_dtype.byte_size() / 4`
//!   (MaxText casts the weights to `dtype` for its matmuls, so they move
//!   at that size too). Programs are fused before costing, so bytes are
//!   what crosses kernel boundaries, as XLA's cost analysis of fused HLO
//!   counts them.
//!
//! The graphs have a few hundred nodes whatever the dimensions, so a call
//! is cheap (`docs/models.md` "Programs" has the measured time).

use bevy_ecs::prelude::*;
use serde::Serialize;

use super::config::ModelConfig;
use super::error::ModelError;
use super::layer_graph::{
    BuildFn, Builder, Shape, build_backward, build_forward, build_logits_backward,
    build_logits_forward,
};
use crate::compiler::graph::{Node, program_nodes};
use crate::compiler::passes::{cost_analysis, fusion, shape_inference};
use crate::compiler::{CompileError, Op, OpCost, analyze, compiler_world};

/// Bytes per element of the graphs' `f32`.
const GRAPH_ELEMENT_BYTES: u64 = 4;

/// The most tokens per device a layer is built for: the IR's largest
/// tensor (`shape_inference::MAX_ELEMENTS`), so `batch × seq_len` cannot
/// overflow.
pub const MAX_TOKENS: u64 = shape_inference::MAX_ELEMENTS as u64;

/// The cost of one program at the requested tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ProgramCosts {
    /// The whole program, fused (dot FLOPs included in `flops`).
    pub total: OpCost,
    /// FLOPs of the dot nodes alone: what MaxText's formula counts.
    pub dot_flops: u64,
}

impl ProgramCosts {
    /// FLOPs that are not dots: norms, softmax, activations, residuals.
    pub fn other_flops(&self) -> u64 {
        self.total.flops.saturating_sub(self.dot_flops)
    }
}

/// A weight matrix of the layer, in the layout its dot reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LayerWeight {
    /// `wq`, `wk`, `wv`, `wo`, `mlp_wi_0`, …, `mlp_wo`.
    pub name: String,
    /// Its dimensions.
    pub dims: Vec<u64>,
    /// Bytes at the config's `weight_dtype`.
    pub bytes: u64,
}

/// One decoder layer and the logits as costed programs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerPrograms {
    /// One decoder layer's forward.
    pub forward: OpCost,
    /// Its backward (activation and weight gradients).
    pub backward: OpCost,
    /// Final norm, logits matmul, log-softmax and cross-entropy.
    pub logits_forward: OpCost,
    /// Their backward.
    pub logits_backward: OpCost,
    /// Dot FLOPs of each program, in the same order.
    pub dot_flops: [u64; 4],
    /// The layer's weight matrices (norm scales and biases left out).
    pub weights: Vec<LayerWeight>,
    /// Tokens per device the figures are for.
    pub tokens: u64,
    /// Sequences the graphs were built with (`tokens / seq_len` rounded up).
    pub shape_batch: u64,
    /// `tokens / (shape_batch × seq_len)`, by which every figure was scaled.
    pub scale: f64,
    /// Nodes of the four graphs together.
    pub nodes: usize,
}

impl LayerPrograms {
    /// Each program's costs: forward, backward, logits forward, logits backward.
    pub fn programs(&self) -> [ProgramCosts; 4] {
        let totals = [
            self.forward,
            self.backward,
            self.logits_forward,
            self.logits_backward,
        ];
        std::array::from_fn(|i| ProgramCosts {
            total: totals[i],
            dot_flops: self.dot_flops[i],
        })
    }

    /// Dot FLOPs of a training step over `layers` layers:
    /// `(forward + backward) × layers + logits forward + logits backward`.
    pub fn step_dot_flops(&self, layers: u64) -> f64 {
        let [f, b, lf, lb] = self.dot_flops.map(|x| x as f64);
        (f + b) * layers as f64 + lf + lb
    }

    /// FLOPs of a step that are not dots, over `layers` layers.
    pub fn step_other_flops(&self, layers: u64) -> f64 {
        let [f, b, lf, lb] = self.programs().map(|p| p.other_flops() as f64);
        (f + b) * layers as f64 + lf + lb
    }

    /// Elements of the layer's weight matrices.
    pub fn weight_elements(&self) -> u64 {
        self.weights
            .iter()
            .map(|w| w.dims.iter().product::<u64>())
            .sum()
    }
}

/// What a layer program does not compile, refused naming its field: a
/// windowed model's local layers, a mixture of experts and latent
/// attention are modeled by their FLOP count (`step_model`) instead.
fn refuse_uncompiled(config: &ModelConfig) -> Result<(), ModelError> {
    let refusals = [
        (
            config.sliding_window.is_some(),
            "sliding_window",
            "a layer program computes dense attention; a windowed model's local layers are \
             modeled by their FLOP count (step_model), not compiled",
        ),
        (
            config.moe.is_some(),
            "moe",
            "a layer program computes a dense MLP; a mixture of experts is modeled by its FLOP \
             count (step_model), not compiled",
        ),
        (
            config.mla.is_some(),
            "mla",
            "a layer program computes standard attention; multi-head latent attention is \
             modeled by its FLOP count (step_model), not compiled",
        ),
    ];
    match refusals.into_iter().find(|(present, _, _)| *present) {
        Some((_, field, problem)) => Err(ModelError::Invalid {
            origin: format!("model {}", config.name),
            line: None,
            field: field.into(),
            problem: problem.into(),
        }),
        None => Ok(()),
    }
}

/// Builds and costs one decoder layer of `config` (forward and backward)
/// and the logits (forward and backward) at `tokens` tokens per device.
///
/// Errors: the config's own [`ModelConfig::validate`] error
/// ([`ModelError::Invalid`]), `tokens` outside `1..=`[`MAX_TOKENS`], or a graph the compiler
/// refuses ([`ModelError::Program`], e.g. scores larger than the IR's
/// largest tensor).
pub fn layer_programs(config: &ModelConfig, tokens: u64) -> Result<LayerPrograms, ModelError> {
    config
        .validate()
        .map_err(|(field, problem)| ModelError::Invalid {
            origin: format!("model {}", config.name),
            line: None,
            field: field.to_string(),
            problem,
        })?;
    refuse_uncompiled(config)?;
    if tokens == 0 || tokens > MAX_TOKENS {
        return Err(ModelError::Invalid {
            origin: format!("model {}", config.name),
            line: None,
            field: "tokens".into(),
            problem: format!("{tokens} is not in 1..={MAX_TOKENS}"),
        });
    }
    let shape = Shape::new(config, tokens);
    let scale = tokens as f64 / (shape.b * shape.l) as f64;
    let byte_scale =
        scale * config.activation_dtype.byte_size() as f64 / GRAPH_ELEMENT_BYTES as f64;
    let mut world = compiler_world();
    let builders: [(&str, BuildFn); 4] = [
        ("layer_forward", build_forward),
        ("layer_backward", build_backward),
        ("logits_forward", build_logits_forward),
        ("logits_backward", build_logits_backward),
    ];
    let mut costs = [ProgramCosts::default(); 4];
    let mut nodes = 0;
    for (i, (name, build)) in builders.into_iter().enumerate() {
        let program = {
            let mut b = Builder::new(&mut world, name);
            build(&mut b, &shape);
            b.finish()
        };
        let wrap = |source: CompileError| ModelError::Program {
            model: config.name.clone(),
            program: name.to_string(),
            source: Box::new(source),
        };
        shape_inference::run(&mut world, program).map_err(wrap)?;
        fusion::run(&mut world, program).map_err(wrap)?;
        let total = analyze(&world, program).map_err(wrap)?.totals;
        let members = program_nodes(&world, program);
        nodes += members.len();
        let mut dot_flops = 0u64;
        for node in members {
            if matches!(world.get::<Node>(node).map(|n| &n.op), Some(Op::Dot(_))) {
                let cost = cost_analysis::node_cost(&world, node).map_err(wrap)?;
                dot_flops = dot_flops.saturating_add(cost.flops);
            }
        }
        costs[i] = ProgramCosts {
            total: scaled(total, scale, byte_scale),
            dot_flops: scale_count(dot_flops, scale),
        };
    }
    Ok(LayerPrograms {
        forward: costs[0].total,
        backward: costs[1].total,
        logits_forward: costs[2].total,
        logits_backward: costs[3].total,
        dot_flops: costs.map(|c| c.dot_flops),
        weights: shape.weights(config.weight_dtype.byte_size()),
        tokens,
        shape_batch: shape.b as u64,
        scale,
        nodes,
    })
}

fn scale_count(x: u64, scale: f64) -> u64 {
    if scale == 1.0 {
        x
    } else {
        (x as f64 * scale).round() as u64
    }
}

fn scaled(c: OpCost, scale: f64, byte_scale: f64) -> OpCost {
    OpCost {
        flops: scale_count(c.flops, scale),
        transcendentals: scale_count(c.transcendentals, scale),
        bytes_read: scale_count(c.bytes_read, byte_scale),
        bytes_written: scale_count(c.bytes_written, byte_scale),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::ModelDType;

    /// The hand-counted model of `model::flops`'s tests, with f32
    /// activations.
    fn tiny() -> ModelConfig {
        ModelConfig {
            activation_dtype: ModelDType::F32,
            grad_dtype: None,
            mu_dtype: None,
            num_vocab_tiling: 1,
            quantization: None,
            sliding_window: None,
            optimizer_memory_host_offload: false,
            parameter_memory_host_offload: false,
            ..crate::model::flops::tests::tiny()
        }
    }

    #[test]
    fn tiny_layer_dot_flops_by_hand() {
        // T = 12 tokens, e 8, h 2 (kv 1, g 2), d 4, m 16, two MLP inputs, vocab 10.
        // q 2·12·8·8 = 1536; k, v 2·12·8·4 = 768 each; scores 2·3·2·4·4·4 = 768;
        // context 768; wo 1536; wi 2·(2·12·8·16) = 6144; wo2 3072.
        let p = layer_programs(&tiny(), 12).unwrap();
        let forward = 1536 + 768 + 768 + 768 + 768 + 1536 + 6144 + 3072;
        assert_eq!(p.dot_flops[0], forward);
        assert_eq!(p.dot_flops[1], 2 * forward);
        // logits 2·12·8·10 = 1920, twice that backward.
        assert_eq!(p.dot_flops[2], 1920);
        assert_eq!(p.dot_flops[3], 3840);
        assert_eq!((p.shape_batch, p.scale), (3, 1.0));
        assert!(p.forward.flops > forward, "norms, softmax, silu add flops");
        assert!(p.forward.transcendentals > 0);
        // wq 64 + wk, wv 32 each + wo 64 + wi 2·128 + wo2 128.
        assert_eq!(p.weight_elements(), 64 + 32 + 32 + 64 + 256 + 128);
        assert_eq!(p.weights[0].bytes, 64 * 4);
    }

    #[test]
    fn a_fractional_batch_scales_every_figure() {
        // 2 tokens of 4: built at one sequence, scaled by one half.
        let whole = layer_programs(&tiny(), 4).unwrap();
        let half = layer_programs(&tiny(), 2).unwrap();
        assert_eq!((half.shape_batch, half.scale), (1, 0.5));
        for (h, w) in half.dot_flops.iter().zip(&whole.dot_flops) {
            assert_eq!(2 * h, *w);
        }
        assert_eq!(half.forward.bytes_read * 2, whole.forward.bytes_read);
    }

    #[test]
    fn bf16_halves_the_bytes_not_the_flops() {
        let f32s = layer_programs(&tiny(), 12).unwrap();
        let bf16 = ModelConfig {
            activation_dtype: ModelDType::Bf16,
            grad_dtype: None,
            mu_dtype: None,
            num_vocab_tiling: 1,
            quantization: None,
            sliding_window: None,
            optimizer_memory_host_offload: false,
            parameter_memory_host_offload: false,
            ..tiny()
        };
        let bf16s = layer_programs(&bf16, 12).unwrap();
        assert_eq!(bf16s.backward.flops, f32s.backward.flops);
        assert_eq!(
            2 * bf16s.backward.bytes_written,
            f32s.backward.bytes_written
        );
    }
}
