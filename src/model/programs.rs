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

use super::config::{DecoderBlock, ModelConfig};
use super::error::ModelError;
use crate::compiler::graph::{Node, program_nodes};
use crate::compiler::passes::{cost_analysis, fusion, shape_inference};
use crate::compiler::{
    BinaryOp, CompareDir, CompileError, DType, DotDims, GraphBuilder, Op, OpCost, ReduceKind,
    TensorType, UnaryOp, analyze, compiler_world,
};

/// Bytes per element of the graphs' `f32`.
const GRAPH_ELEMENT_BYTES: u64 = 4;

/// The most tokens per device a layer is built for: the IR's largest
/// tensor (`shape_inference::MAX_ELEMENTS`), so `batch × seq_len` cannot
/// overflow.
pub const MAX_TOKENS: u64 = shape_inference::MAX_ELEMENTS as u64;

/// The norms' epsilon (MaxText's `normalization_layer_epsilon`).
const NORM_EPSILON: f64 = 1e-6;

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
            b.g.finish()
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

type BuildFn = fn(&mut Builder<'_>, &Shape);

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

/// The activation function of one MLP input matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Activation {
    Linear,
    Relu,
    Gelu,
    Silu,
    Sigmoid,
    Tanh,
}

impl Activation {
    fn from_name(name: &str) -> Activation {
        // `validate` has refused every other name.
        match name {
            "relu" => Activation::Relu,
            "gelu" => Activation::Gelu,
            "silu" | "swish" => Activation::Silu,
            "sigmoid" => Activation::Sigmoid,
            "tanh" => Activation::Tanh,
            _ => Activation::Linear,
        }
    }
}

/// The layer's dimensions as graph sizes.
struct Shape {
    /// Sequences in the graphs.
    b: usize,
    l: usize,
    e: usize,
    kv: usize,
    /// Query heads per key/value head.
    g: usize,
    d: usize,
    m: usize,
    vocab: usize,
    activations: Vec<Activation>,
    layer_norm: bool,
    biases: bool,
    parallel: bool,
}

impl Shape {
    fn new(config: &ModelConfig, tokens: u64) -> Shape {
        let b = tokens.div_ceil(config.seq_len).max(1);
        // `validate` bounds every dimension by 2^24, so these fit a usize.
        let u = |x: u64| x as usize;
        Shape {
            b: u(b),
            l: u(config.seq_len),
            e: u(config.embed),
            kv: u(config.kv_heads),
            g: u(config.heads / config.kv_heads),
            d: u(config.head_dim),
            m: u(config.mlp_dim),
            vocab: u(config.vocab),
            activations: config
                .mlp_activations
                .iter()
                .map(|a| Activation::from_name(a))
                .collect(),
            layer_norm: config.decoder_block == DecoderBlock::Gpt3,
            biases: config.decoder_block == DecoderBlock::Gpt3,
            parallel: matches!(
                config.decoder_block,
                DecoderBlock::Default | DecoderBlock::DefaultT5
            ),
        }
    }

    fn wq(&self) -> Vec<usize> {
        vec![self.e, self.kv, self.g, self.d]
    }

    fn wkv(&self) -> Vec<usize> {
        vec![self.e, self.kv, self.d]
    }

    fn wo(&self) -> Vec<usize> {
        vec![self.kv, self.g, self.d, self.e]
    }

    fn hidden(&self) -> Vec<usize> {
        vec![self.b, self.l, self.e]
    }

    fn mlp(&self) -> Vec<usize> {
        vec![self.b, self.l, self.m]
    }

    /// `[b, l, kv, g, d]`: queries as projected.
    fn q(&self) -> Vec<usize> {
        vec![self.b, self.l, self.kv, self.g, self.d]
    }

    /// `[b, l, kv, d]`: keys and values as projected.
    fn kv_proj(&self) -> Vec<usize> {
        vec![self.b, self.l, self.kv, self.d]
    }

    /// `[b, kv, l, g, l]`: the scores.
    fn scores(&self) -> Vec<usize> {
        vec![self.b, self.kv, self.l, self.g, self.l]
    }

    /// `[b, kv, l, g, d]`: the attention output before `wo`.
    fn context(&self) -> Vec<usize> {
        vec![self.b, self.kv, self.l, self.g, self.d]
    }

    fn weights(&self, weight_bytes: u64) -> Vec<LayerWeight> {
        let mut list = vec![
            ("wq".to_string(), self.wq()),
            ("wk".to_string(), self.wkv()),
            ("wv".to_string(), self.wkv()),
            ("wo".to_string(), self.wo()),
        ];
        for i in 0..self.activations.len() {
            list.push((format!("mlp_wi_{i}"), vec![self.e, self.m]));
        }
        list.push(("mlp_wo".to_string(), vec![self.m, self.e]));
        list.into_iter()
            .map(|(name, dims)| {
                let dims: Vec<u64> = dims.into_iter().map(|x| x as u64).collect();
                let bytes = dims.iter().product::<u64>() * weight_bytes;
                LayerWeight { name, dims, bytes }
            })
            .collect()
    }
}

/// A [`GraphBuilder`] with the few shorthands the layer needs (every value
/// `f32`).
struct Builder<'w> {
    g: GraphBuilder<'w>,
}

impl<'w> Builder<'w> {
    fn new(world: &'w mut World, name: &str) -> Self {
        Builder {
            g: GraphBuilder::new(world, name),
        }
    }

    fn param(&mut self, dims: Vec<usize>) -> Entity {
        self.g.parameter(TensorType::new(DType::F32, dims))
    }

    fn scalar(&mut self, value: f64) -> Entity {
        self.g.scalar(DType::F32, value)
    }

    fn dot(&mut self, a: Entity, b: Entity, contract: (&[usize], &[usize])) -> Entity {
        self.batched_dot(a, b, (&[], &[]), contract)
    }

    fn batched_dot(
        &mut self,
        a: Entity,
        b: Entity,
        batch: (&[usize], &[usize]),
        contract: (&[usize], &[usize]),
    ) -> Entity {
        self.g.dot(
            a,
            b,
            DotDims {
                lhs_contracting: contract.0.to_vec(),
                rhs_contracting: contract.1.to_vec(),
                lhs_batch: batch.0.to_vec(),
                rhs_batch: batch.1.to_vec(),
            },
        )
    }

    fn reduce(&mut self, x: Entity, kind: ReduceKind, dims: Vec<usize>) -> Entity {
        self.g.reduce(x, kind, dims)
    }

    /// `x` of shape `shape` without its last dimension, broadcast back.
    fn expand_last(&mut self, x: Entity, shape: &[usize]) -> Entity {
        let kept = (0..shape.len() - 1).collect();
        self.g.broadcast(x, shape.to_vec(), Some(kept))
    }

    fn unary(&mut self, op: UnaryOp, x: Entity) -> Entity {
        self.g.unary(op, x)
    }

    fn add(&mut self, a: Entity, b: Entity) -> Entity {
        self.g.add(a, b)
    }

    fn sub(&mut self, a: Entity, b: Entity) -> Entity {
        self.g.sub(a, b)
    }

    fn mul(&mut self, a: Entity, b: Entity) -> Entity {
        self.g.mul(a, b)
    }

    fn sum(&mut self, terms: &[Entity]) -> Entity {
        let mut acc = terms[0];
        for &t in &terms[1..] {
            acc = self.add(acc, t);
        }
        acc
    }

    /// `1 - x`.
    fn one_minus(&mut self, x: Entity) -> Entity {
        let one = self.scalar(1.0);
        self.sub(one, x)
    }
}

/// A norm's forward: its output, and what its backward reads (the
/// per-token reciprocal deviation `r`, `[b, l]`).
struct NormForward {
    y: Entity,
    r: Entity,
}

/// RMSNorm (`x · rsqrt(mean(x²) + ε) · γ`) or LayerNorm (centred, `+ β`)
/// over the last axis of `[b, l, e]`.
fn norm_forward(b: &mut Builder<'_>, s: &Shape, x: Entity) -> NormForward {
    let shape = s.hidden();
    let centred = if s.layer_norm {
        let mu = b.reduce(x, ReduceKind::Mean, vec![2]);
        let mu = b.expand_last(mu, &shape);
        b.sub(x, mu)
    } else {
        x
    };
    let sq = b.mul(centred, centred);
    let ms = b.reduce(sq, ReduceKind::Mean, vec![2]);
    let eps = b.scalar(NORM_EPSILON);
    let ms = b.add(ms, eps);
    let r = b.unary(UnaryOp::Rsqrt, ms);
    let rb = b.expand_last(r, &shape);
    let xhat = b.mul(centred, rb);
    let gamma = b.param(vec![s.e]);
    let mut y = b.mul(xhat, gamma);
    if s.layer_norm {
        let beta = b.param(vec![s.e]);
        y = b.add(y, beta);
    }
    NormForward { y, r }
}

/// The norm's backward from its input `x`, saved `r` and `dy`: returns `dx`
/// (the scale and bias gradients are reductions of `dy`, added as nodes).
fn norm_backward(b: &mut Builder<'_>, s: &Shape, x: Entity, r: Entity, dy: Entity) -> Entity {
    let shape = s.hidden();
    let centred = if s.layer_norm {
        let mu = b.reduce(x, ReduceKind::Mean, vec![2]);
        let mu = b.expand_last(mu, &shape);
        b.sub(x, mu)
    } else {
        x
    };
    let rb = b.expand_last(r, &shape);
    let xhat = b.mul(centred, rb);
    let gamma = b.param(vec![s.e]);
    // dγ = Σ dy·x̂, dβ = Σ dy over tokens.
    let dy_xhat = b.mul(dy, xhat);
    let dgamma = b.reduce(dy_xhat, ReduceKind::Sum, vec![0, 1]);
    b.g.output(dgamma);
    if s.layer_norm {
        let dbeta = b.reduce(dy, ReduceKind::Sum, vec![0, 1]);
        b.g.output(dbeta);
    }
    // dx = r · (g − x̂ · mean(g · x̂) [− mean(g)]), g = γ·dy.
    let gdy = b.mul(dy, gamma);
    let gx = b.mul(gdy, xhat);
    let mgx = b.reduce(gx, ReduceKind::Mean, vec![2]);
    let mgx = b.expand_last(mgx, &shape);
    let proj = b.mul(xhat, mgx);
    let mut inner = b.sub(gdy, proj);
    if s.layer_norm {
        let mg = b.reduce(gdy, ReduceKind::Mean, vec![2]);
        let mg = b.expand_last(mg, &shape);
        inner = b.sub(inner, mg);
    }
    b.mul(inner, rb)
}

/// A bias on a dense layer's output (gpt3 only).
fn bias(b: &mut Builder<'_>, s: &Shape, y: Entity, dims: Vec<usize>) -> Entity {
    if s.biases {
        let p = b.param(dims);
        b.add(y, p)
    } else {
        y
    }
}

/// The bias gradient: `dy` summed over `dims` (gpt3 only).
fn bias_grad(b: &mut Builder<'_>, s: &Shape, dy: Entity, dims: Vec<usize>) {
    if s.biases {
        let db = b.reduce(dy, ReduceKind::Sum, dims);
        b.g.output(db);
    }
}

fn activation_forward(b: &mut Builder<'_>, act: Activation, a: Entity) -> Entity {
    match act {
        Activation::Linear => a,
        Activation::Relu => {
            let zero = b.scalar(0.0);
            b.g.max(a, zero)
        }
        Activation::Sigmoid => b.unary(UnaryOp::Logistic, a),
        Activation::Tanh => b.unary(UnaryOp::Tanh, a),
        Activation::Silu => {
            let s = b.unary(UnaryOp::Logistic, a);
            b.mul(a, s)
        }
        Activation::Gelu => {
            // flax's `gelu` (tanh approximation): ½a(1 + tanh(√(2/π)(a + 0.044715a³))).
            let t = gelu_tanh(b, a);
            let one = b.scalar(1.0);
            let t1 = b.add(t, one);
            let half = b.scalar(0.5);
            let ha = b.mul(a, half);
            b.mul(ha, t1)
        }
    }
}

/// `tanh(√(2/π)(a + 0.044715 a³))`.
fn gelu_tanh(b: &mut Builder<'_>, a: Entity) -> Entity {
    let a2 = b.mul(a, a);
    let a3 = b.mul(a2, a);
    let c = b.scalar(0.044_715);
    let ca3 = b.mul(a3, c);
    let inner = b.add(a, ca3);
    let k = b.scalar((2.0 / std::f64::consts::PI).sqrt());
    let z = b.mul(inner, k);
    b.unary(UnaryOp::Tanh, z)
}

/// `da = df · f'(a)`.
fn activation_backward(b: &mut Builder<'_>, act: Activation, a: Entity, df: Entity) -> Entity {
    match act {
        Activation::Linear => df,
        Activation::Relu => {
            let sign = b.unary(UnaryOp::Sign, a);
            let zero = b.scalar(0.0);
            let mask = b.g.max(sign, zero);
            b.mul(df, mask)
        }
        Activation::Sigmoid => {
            let s = b.unary(UnaryOp::Logistic, a);
            let one_s = b.one_minus(s);
            let ds = b.mul(s, one_s);
            b.mul(df, ds)
        }
        Activation::Tanh => {
            let t = b.unary(UnaryOp::Tanh, a);
            let t2 = b.mul(t, t);
            let dt = b.one_minus(t2);
            b.mul(df, dt)
        }
        Activation::Silu => {
            // s (1 + a (1 − s)).
            let s = b.unary(UnaryOp::Logistic, a);
            let one_s = b.one_minus(s);
            let a1s = b.mul(a, one_s);
            let one = b.scalar(1.0);
            let inner = b.add(a1s, one);
            let ds = b.mul(s, inner);
            b.mul(df, ds)
        }
        Activation::Gelu => {
            // ½(1 + t) + ½a(1 − t²)·√(2/π)(1 + 3·0.044715a²).
            let t = gelu_tanh(b, a);
            let one = b.scalar(1.0);
            let half = b.scalar(0.5);
            let t1 = b.add(t, one);
            let left = b.mul(t1, half);
            let t2 = b.mul(t, t);
            let sech2 = b.one_minus(t2);
            let a2 = b.mul(a, a);
            let c = b.scalar(3.0 * 0.044_715);
            let ca2 = b.mul(a2, c);
            let poly = b.add(ca2, one);
            let k = b.scalar(0.5 * (2.0 / std::f64::consts::PI).sqrt());
            let kp = b.mul(poly, k);
            let ak = b.mul(a, kp);
            let right = b.mul(ak, sech2);
            let d = b.add(left, right);
            b.mul(df, d)
        }
    }
}

/// The MLP's forward from its (normalized) input: its output; the
/// pre-activations and the gated product its backward reads are outputs.
fn mlp_forward(b: &mut Builder<'_>, s: &Shape, x: Entity) -> Entity {
    let mut hidden = None;
    for &act in &s.activations {
        let wi = b.param(vec![s.e, s.m]);
        let a = b.dot(x, wi, (&[2], &[0]));
        let a = bias(b, s, a, vec![s.m]);
        b.g.output(a);
        let f = activation_forward(b, act, a);
        hidden = Some(match hidden {
            None => f,
            Some(h) => b.mul(h, f),
        });
    }
    // `validate` requires at least one activation.
    let hidden = hidden.unwrap_or(x);
    b.g.output(hidden);
    let wo = b.param(vec![s.m, s.e]);
    let y = b.dot(hidden, wo, (&[2], &[0]));
    bias(b, s, y, vec![s.e])
}

/// The MLP's backward: `dx` of its input `x`, from `dy`.
fn mlp_backward(b: &mut Builder<'_>, s: &Shape, x: Entity, dy: Entity) -> Entity {
    let n = s.activations.len();
    let pre: Vec<Entity> = (0..n).map(|_| b.param(s.mlp())).collect();
    let hidden = b.param(s.mlp());
    let wo = b.param(vec![s.m, s.e]);
    bias_grad(b, s, dy, vec![0, 1]);
    let dwo = b.dot(hidden, dy, (&[0, 1], &[0, 1]));
    b.g.output(dwo);
    let dhidden = b.dot(dy, wo, (&[2], &[1]));
    // The gated product's backward: each factor's gradient is dh times the
    // other factors, recomputed from their pre-activations.
    let factors: Vec<Entity> = if n > 1 {
        s.activations
            .iter()
            .zip(&pre)
            .map(|(&act, &a)| activation_forward(b, act, a))
            .collect()
    } else {
        Vec::new()
    };
    let mut dxs = Vec::with_capacity(n);
    for (k, (&act, &a)) in s.activations.iter().zip(&pre).enumerate() {
        let mut df = dhidden;
        for (j, &f) in factors.iter().enumerate() {
            if j != k {
                df = b.mul(df, f);
            }
        }
        let da = activation_backward(b, act, a, df);
        bias_grad(b, s, da, vec![0, 1]);
        let wi = b.param(vec![s.e, s.m]);
        let dwi = b.dot(x, da, (&[0, 1], &[0, 1]));
        b.g.output(dwi);
        dxs.push(b.dot(da, wi, (&[2], &[1])));
    }
    b.sum(&dxs)
}

/// Attention's forward from the normalized input: the output `[b, l, e]`.
fn attention_forward(b: &mut Builder<'_>, s: &Shape, x: Entity) -> Entity {
    let wq = b.param(s.wq());
    let wk = b.param(s.wkv());
    let wv = b.param(s.wkv());
    let q = b.dot(x, wq, (&[2], &[0]));
    let q = bias(b, s, q, vec![s.kv, s.g, s.d]);
    let k = b.dot(x, wk, (&[2], &[0]));
    let k = bias(b, s, k, vec![s.kv, s.d]);
    let v = b.dot(x, wv, (&[2], &[0]));
    let v = bias(b, s, v, vec![s.kv, s.d]);
    let scale = b.scalar(1.0 / (s.d as f64).sqrt());
    let q = b.mul(q, scale);
    // scores[b, kv, lq, g, lk] = Σ_d q[b, lq, kv, g, d] k[b, lk, kv, d].
    let scores = b.batched_dot(q, k, (&[0, 2], &[0, 2]), (&[4], &[3]));
    let shape = s.scores();
    let mx = b.reduce(scores, ReduceKind::Max, vec![4]);
    let mx = b.expand_last(mx, &shape);
    let z = b.sub(scores, mx);
    let ez = b.unary(UnaryOp::Exp, z);
    let sum = b.reduce(ez, ReduceKind::Sum, vec![4]);
    let sum = b.expand_last(sum, &shape);
    let p = b.g.div(ez, sum);
    // context[b, kv, lq, g, d] = Σ_lk p[b, kv, lq, g, lk] v[b, lk, kv, d].
    let context = b.batched_dot(p, v, (&[0, 1], &[0, 2]), (&[4], &[1]));
    for saved in [q, k, v, p, context] {
        b.g.output(saved);
    }
    let wo = b.param(s.wo());
    let y = b.dot(context, wo, (&[1, 3, 4], &[0, 1, 2]));
    bias(b, s, y, vec![s.e])
}

/// Attention's backward: `dx` of its normalized input `x`, from `dy`.
fn attention_backward(b: &mut Builder<'_>, s: &Shape, x: Entity, dy: Entity) -> Entity {
    // Saved: scaled q, k, v, probabilities, context.
    let q = b.param(s.q());
    let k = b.param(s.kv_proj());
    let v = b.param(s.kv_proj());
    let p = b.param(s.scores());
    let context = b.param(s.context());
    let wq = b.param(s.wq());
    let wk = b.param(s.wkv());
    let wv = b.param(s.wkv());
    let wo = b.param(s.wo());
    bias_grad(b, s, dy, vec![0, 1]);
    // Output projection: dwo [kv, g, d, e], dcontext [b, l, kv, g, d].
    let dwo = b.dot(context, dy, (&[0, 2], &[0, 1]));
    b.g.output(dwo);
    let dcontext = b.dot(dy, wo, (&[2], &[3]));
    // context = p·v: dp [b, kv, lq, g, lk], dv [b, kv, lk, d].
    let dp = b.batched_dot(dcontext, v, (&[0, 2], &[0, 2]), (&[4], &[3]));
    let dv = b.batched_dot(p, dcontext, (&[0, 1], &[0, 2]), (&[2, 3], &[1, 3]));
    // Softmax: ds = p (dp − Σ dp·p).
    let shape = s.scores();
    let dpp = b.mul(dp, p);
    let row = b.reduce(dpp, ReduceKind::Sum, vec![4]);
    let row = b.expand_last(row, &shape);
    let centred = b.sub(dp, row);
    let ds = b.mul(p, centred);
    // scores = q·kᵀ: dq [b, kv, lq, g, d], dk [b, kv, lk, d].
    let dq = b.batched_dot(ds, k, (&[0, 1], &[0, 2]), (&[4], &[1]));
    let dk = b.batched_dot(ds, q, (&[0, 1], &[0, 2]), (&[2, 3], &[1, 3]));
    let scale = b.scalar(1.0 / (s.d as f64).sqrt());
    let dq = b.mul(dq, scale);
    bias_grad(b, s, dq, vec![0, 2]);
    bias_grad(b, s, dk, vec![0, 2]);
    bias_grad(b, s, dv, vec![0, 2]);
    // Projections: weight gradients and the input's.
    let dwq = b.dot(x, dq, (&[0, 1], &[0, 2]));
    let dwk = b.dot(x, dk, (&[0, 1], &[0, 2]));
    let dwv = b.dot(x, dv, (&[0, 1], &[0, 2]));
    for g in [dwq, dwk, dwv] {
        b.g.output(g);
    }
    let dxq = b.dot(dq, wq, (&[1, 3, 4], &[1, 2, 3]));
    let dxk = b.dot(dk, wk, (&[1, 3], &[1, 2]));
    let dxv = b.dot(dv, wv, (&[1, 3], &[1, 2]));
    b.sum(&[dxq, dxk, dxv])
}

fn build_forward(b: &mut Builder<'_>, s: &Shape) {
    let x = b.param(s.hidden());
    let n1 = norm_forward(b, s, x);
    b.g.output(n1.r);
    let attn = attention_forward(b, s, n1.y);
    let out = if s.parallel {
        let mlp = mlp_forward(b, s, n1.y);
        let h = b.add(x, attn);
        b.add(h, mlp)
    } else {
        let h = b.add(x, attn);
        b.g.output(h);
        let n2 = norm_forward(b, s, h);
        b.g.output(n2.r);
        let mlp = mlp_forward(b, s, n2.y);
        b.add(h, mlp)
    };
    b.g.output(out);
}

fn build_backward(b: &mut Builder<'_>, s: &Shape) {
    let dout = b.param(s.hidden());
    let x = b.param(s.hidden());
    let r1 = b.param(vec![s.b, s.l]);
    // The normalized input is recomputed inside the norm's backward; the
    // matmuls read it as saved.
    let n1 = b.param(s.hidden());
    let dx = if s.parallel {
        let dmlp = mlp_backward(b, s, n1, dout);
        let dattn = attention_backward(b, s, n1, dout);
        let dn1 = b.add(dmlp, dattn);
        let dnorm = norm_backward(b, s, x, r1, dn1);
        b.add(dout, dnorm)
    } else {
        let h = b.param(s.hidden());
        let r2 = b.param(vec![s.b, s.l]);
        let n2 = b.param(s.hidden());
        let dn2 = mlp_backward(b, s, n2, dout);
        let dnorm2 = norm_backward(b, s, h, r2, dn2);
        let dh = b.add(dout, dnorm2);
        let dn1 = attention_backward(b, s, n1, dh);
        let dnorm1 = norm_backward(b, s, x, r1, dn1);
        b.add(dh, dnorm1)
    };
    b.g.output(dx);
}

/// The one-hot targets `[b, l, vocab]`, as MaxText builds them
/// (`jax.nn.one_hot`): an iota compared with the target ids, fused.
fn one_hot(b: &mut Builder<'_>, s: &Shape) -> Entity {
    let shape = vec![s.b, s.l, s.vocab];
    let ids = b.g.parameter(TensorType::new(DType::I32, vec![s.b, s.l]));
    let ids = b.g.broadcast(ids, shape.clone(), Some(vec![0, 1]));
    let iota = b.g.iota(TensorType::new(DType::I32, shape), 2);
    let hit = b.g.compare(CompareDir::Eq, iota, ids);
    b.g.node(Op::Convert(DType::F32), &[hit])
}

fn build_logits_forward(b: &mut Builder<'_>, s: &Shape) {
    let x = b.param(s.hidden());
    let n = norm_forward(b, s, x);
    b.g.output(n.r);
    let w = b.param(vec![s.e, s.vocab]);
    let logits = b.dot(n.y, w, (&[2], &[0]));
    let shape = vec![s.b, s.l, s.vocab];
    let mx = b.reduce(logits, ReduceKind::Max, vec![2]);
    let mx = b.expand_last(mx, &shape);
    let z = b.sub(logits, mx);
    let ez = b.unary(UnaryOp::Exp, z);
    let sum = b.reduce(ez, ReduceKind::Sum, vec![2]);
    let lse = b.unary(UnaryOp::Log, sum);
    let lse = b.expand_last(lse, &shape);
    let logp = b.sub(z, lse);
    b.g.output(logp);
    let target = one_hot(b, s);
    let picked = b.mul(logp, target);
    let total = b.reduce(picked, ReduceKind::Sum, vec![0, 1, 2]);
    let per_token = b.scalar(-1.0 / (s.b * s.l) as f64);
    let loss = b.mul(total, per_token);
    b.g.output(loss);
}

fn build_logits_backward(b: &mut Builder<'_>, s: &Shape) {
    let x = b.param(s.hidden());
    let r = b.param(vec![s.b, s.l]);
    let n = b.param(s.hidden());
    let logp = b.param(vec![s.b, s.l, s.vocab]);
    let w = b.param(vec![s.e, s.vocab]);
    // d loss / d logits = (softmax − one_hot) / tokens.
    let p = b.unary(UnaryOp::Exp, logp);
    let target = one_hot(b, s);
    let diff = b.sub(p, target);
    let per_token = b.scalar(1.0 / (s.b * s.l) as f64);
    let dlogits = b.g.binary(BinaryOp::Mul, diff, per_token);
    let dw = b.dot(n, dlogits, (&[0, 1], &[0, 1]));
    b.g.output(dw);
    let dn = b.dot(dlogits, w, (&[2], &[1]));
    let dx = norm_backward(b, s, x, r, dn);
    b.g.output(dx);
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
