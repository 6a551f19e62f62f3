//! The graphs of [`super::programs`]: one decoder layer's forward and
//! backward and the logits' forward and backward, built op by op with the
//! compiler's [`GraphBuilder`] (shapes, blocks and backward rules in
//! [`super::programs`]' module docs).

use bevy_ecs::prelude::*;

use super::config::{DecoderBlock, ModelConfig};
use super::programs::LayerWeight;
use crate::compiler::{
    BinaryOp, CompareDir, DType, DotDims, GraphBuilder, Op, ReduceKind, TensorType, UnaryOp,
};

/// The norms' epsilon (MaxText's `normalization_layer_epsilon`).
const NORM_EPSILON: f64 = 1e-6;

/// Builds one program's graph.
pub(super) type BuildFn = fn(&mut Builder<'_>, &Shape);

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
pub(super) struct Shape {
    /// Sequences in the graphs.
    pub(super) b: usize,
    pub(super) l: usize,
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
    pub(super) fn new(config: &ModelConfig, tokens: u64) -> Shape {
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
            parallel: config.decoder_block.is_parallel(),
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

    pub(super) fn weights(&self, weight_bytes: u64) -> Vec<LayerWeight> {
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
pub(super) struct Builder<'w> {
    g: GraphBuilder<'w>,
}

impl<'w> Builder<'w> {
    /// The program's entity once its graph is built.
    pub(super) fn finish(self) -> Entity {
        self.g.finish()
    }

    pub(super) fn new(world: &'w mut World, name: &str) -> Self {
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

pub(super) fn build_forward(b: &mut Builder<'_>, s: &Shape) {
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

pub(super) fn build_backward(b: &mut Builder<'_>, s: &Shape) {
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

pub(super) fn build_logits_forward(b: &mut Builder<'_>, s: &Shape) {
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

pub(super) fn build_logits_backward(b: &mut Builder<'_>, s: &Shape) {
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
