//! One layer's compute on one device at the roofline: the matmul FLOPs
//! the hardware runs (a causal or windowed kernel's blocks, what remat
//! recomputes), each at its type's peak, and the bytes at HBM bandwidth
//! (the module docs of [`super`]).

use crate::model::{
    LayerMatmulFlops, ModelConfig, Placement, Quantization, RematPolicy, layer_matmul_flops,
    parameter_count,
};

use super::{LayerCompute, PassCompute};

/// A layer's forward matmul FLOPs as the hardware runs them on a device
/// with no tensor or expert axis ([`hardware_matmul_flops_on`]).
pub fn hardware_matmul_flops(config: &ModelConfig) -> LayerMatmulFlops {
    hardware_matmul_flops_on(config, (1, 1))
}

/// A layer's forward matmul FLOPs as the hardware runs them: MaxText's
/// per-matmul count ([`layer_matmul_flops`]) with the attention's scores
/// and values at what the model's attention kernel computes
/// ([`crate::model::AttentionKernel::computed_fraction`]), and a
/// mixture's routed experts as its routing runs them on a device of a
/// `tensor`-wide group with `1/experts_split` of the experts: a dropping
/// mixture's whole capacity and one-hot dispatch and combine, a dropless
/// one's grouped matmul with its tiles shared between experts
/// ([`crate::model::MixtureOfExperts::grouped_matmul_rows`]; the device's
/// rows are its tensor group's tokens, which the expert matmuls gather,
/// times the experts a token).
pub fn hardware_matmul_flops_on(
    config: &ModelConfig,
    (tensor, experts_split): (usize, usize),
) -> LayerMatmulFlops {
    let mut g = layer_matmul_flops(config);
    g.attention *= config.attention_kernel.computed_fraction(config.seq_len);
    // A local layer's band as the kernel's blocks cover it, folded into
    // the attention (what the rest of the model times and recomputes).
    if let Some(w) = config.sliding_window {
        let band = crate::model::flops::window_pairs(config.seq_len, w.window);
        let computed = config
            .attention_kernel
            .window_pairs_computed(config.seq_len, w.window);
        if band > 0.0 {
            g.attention += g.window_attention * computed / band;
        }
        g.window_attention = 0.0;
    }
    // A mixture's routed rows as its routing runs them (`crate::model::
    // experts`): dropping, every expert's whole capacity, and the one-hot
    // dispatch and combine, matmuls of 2·T·E·C·D each; dropless, the
    // grouped matmul's tiles, those two experts share run for each. In
    // the mixture's layers only, averaged over the layers as the count is.
    if let Some(moe) = &config.moe {
        let routed = moe.num_experts_per_tok as f64;
        let shared = moe.shared_experts as f64;
        let (routed_rows, one_hot) = match moe.capacity(config.seq_len) {
            Some(capacity) => (
                moe.routed_rows_per_token(config.seq_len),
                2.0 * config.per_device_batch
                    * config.seq_len as f64
                    * (moe.num_experts * capacity) as f64
                    * config.embed as f64,
            ),
            None => {
                let rows = config.tokens_per_device() * tensor.max(1) as f64 * routed;
                let groups = moe.num_experts / experts_split.max(1) as u64;
                (
                    routed * moe.grouped_matmul_rows(rows, groups) / rows.max(1.0),
                    0.0,
                )
            }
        };
        let padded = (shared + routed_rows) / (shared + routed);
        if padded != 1.0 || one_hot > 0.0 {
            let mlp = crate::model::mlp_flops(config);
            let run = (
                (mlp.moe.0 - mlp.router) * padded + mlp.router + one_hot,
                mlp.moe.1 * padded + one_hot,
            );
            (g.mlp_in, g.mlp_out) = mlp.average_with(run);
        }
    }
    g
}

/// The fraction of a layer's forward matmul FLOPs `policy` recomputes in
/// the backward pass: the matmuls whose results the backward reads and the
/// policy does not save (`jax.checkpoint` rematerializes residuals only; a
/// result nothing in the backward reads is not recomputed). The backward
/// reads the query, key and value projections, the attention (a flash
/// kernel's output, for the output projection's weight gradient), the MLP's
/// input matmuls and, in a sequential block, the output projection (the
/// post-attention norm's input is the residual plus it); never `mlpwo`, and
/// not a parallel block's output projection, which only the residual
/// reads. So `full` recomputes those, `minimal` the attention (it saves the
/// weight matmuls only), `minimal_flash` and `none` nothing
/// ([`crate::model::memory`] has the saved set).
pub fn recomputed_fraction(config: &ModelConfig, policy: RematPolicy) -> f64 {
    let all = hardware_matmul_flops(config).total();
    if all <= 0.0 {
        return 0.0;
    }
    let (weights, attention) = recomputed_flops(config, policy);
    (weights + attention) / all
}

/// The forward FLOPs `policy` recomputes in the backward pass, as the
/// weights' matmuls and the attention's ([`recomputed_fraction`]).
pub fn recomputed_flops(config: &ModelConfig, policy: RematPolicy) -> (f64, f64) {
    recomputed_flops_of(config, policy, &hardware_matmul_flops(config))
}

/// [`recomputed_flops`] of the forward's FLOPs `g` as a device runs them
/// ([`hardware_matmul_flops_on`]).
fn recomputed_flops_of(
    config: &ModelConfig,
    policy: RematPolicy,
    g: &LayerMatmulFlops,
) -> (f64, f64) {
    let out = if config.decoder_block.is_parallel() {
        0.0
    } else {
        g.out
    };
    if let Some(placed) = crate::model::memory::custom_placements(config, policy) {
        // The matmuls whose residuals are rematerialized: the projections
        // by their widths, the attention with its output, the MLP's input.
        let [_, q, k, v, context, out_proj, mlpwi] = placed.map(|(p, _)| p == Placement::Remat);
        // Each projection's share of their FLOPs by its width (the
        // heads' for standard attention).
        let (qw, kw, vw) = (
            config.query_width() as f64,
            config.key_width() as f64,
            config.value_width() as f64,
        );
        let qkv_share = |on: bool, width: f64| if on { width / (qw + kw + vw) } else { 0.0 };
        let weights = g.qkv * (qkv_share(q, qw) + qkv_share(k, kw) + qkv_share(v, vw))
            + if out_proj { out } else { 0.0 }
            + if mlpwi { g.mlp_in } else { 0.0 };
        return (weights, if context { g.attention } else { 0.0 });
    }
    match policy {
        RematPolicy::Custom { .. } => unreachable!("placed above"),
        RematPolicy::Full => (g.qkv + out + g.mlp_in, g.attention),
        RematPolicy::None | RematPolicy::MinimalFlash => (0.0, 0.0),
        RematPolicy::Minimal | RematPolicy::MinimalOffloaded => (0.0, g.attention),
        RematPolicy::SaveQkvProj | RematPolicy::QkvProjOffloaded => (out + g.mlp_in, g.attention),
        RematPolicy::SaveOutProj => (g.qkv + g.mlp_in, g.attention),
        RematPolicy::SaveDotExceptMlp | RematPolicy::SaveDotExceptMlpwi => (g.mlp_in, g.attention),
    }
}

/// HBM bytes of one layer's forward on one device: its weights (its
/// `1/tensor` of them) read once (in the activations' type, as the MXU
/// takes them), each matmul's input
/// and output activations read or written once (the attention scores are
/// not materialized: a fused attention kernel keeps them on chip), MLA's
/// latents written and read once more between its down and up projections.
fn forward_bytes(c: &ModelConfig, (tensor, experts_split): (usize, usize)) -> f64 {
    let t = c.tokens_per_device();
    let act = c.activation_dtype.byte_size() as f64;
    let weights = local_layer_weights(c, (tensor, experts_split)) * act;
    let (e, qkv, ctx, latent, m) = (
        c.embed as f64,
        (c.query_width() + c.key_width() + c.value_width()) as f64,
        c.context_width() as f64,
        c.latent_width() as f64,
        c.mlp_hidden() as f64,
    );
    let n_act = c.mlp_activations.len() as f64;
    // Per token: qkv in/out, attention in/out, out-projection in/out, MLP
    // in/out (its hidden read and written once more by the activation).
    let per_token = (e + qkv + 2.0 * latent)
        + (qkv + ctx)
        + (ctx + e)
        + (e + n_act * m)
        + (n_act * m + m)
        + (m + e);
    weights + t * per_token * act
}

/// One layer's passes and the logits' at the roofline of `spec` with the
/// MXU at `efficiency` of its peaks, each device holding `1/tensor` of the
/// weights and the backward recomputing what the remat policy does not
/// save. The weights' matmuls run at the quantized type's peak when the
/// model quantizes them ([`matmul_peaks`]); the attention and the logits
/// at the bf16 peak.
pub(super) fn layer_compute(
    config: &ModelConfig,
    spec: &crate::hardware::HardwareSpec,
    efficiency: f64,
    (tensor, experts_split): (usize, usize),
) -> LayerCompute {
    let (weight_peak, bf16_peak) = matmul_peaks(config, spec);
    // A pass's `quantized` FLOPs run at the quantized type's peak (the
    // bf16 one unquantized), the rest at the bf16 peak; then its operands'
    // quantizing passes.
    let pass = |(quantized, rest): (f64, f64), bytes: f64, quantize: f64| {
        let peak_seconds = quantized / weight_peak + rest / bf16_peak;
        let quantize_seconds = quantize / spec.hbm_bytes_per_s;
        PassCompute {
            flops: quantized + rest,
            bytes,
            seconds: (peak_seconds / efficiency).max(bytes / spec.hbm_bytes_per_s)
                + quantize_seconds,
            peak_seconds,
            quantize_seconds,
            ..PassCompute::default()
        }
    };
    let g = hardware_matmul_flops_on(config, (tensor, experts_split));
    let forward = (g.total() - g.attention, g.attention);
    let recomputed = recomputed_flops_of(config, config.remat, &g);
    let recompute = (recomputed.0 + recomputed.1) / g.total().max(f64::MIN_POSITIVE);
    let fwd_bytes = forward_bytes(config, (tensor, experts_split));
    let t = config.tokens_per_device();
    let logits_matrix = config.vocab as f64 * config.embed as f64;
    let act = config.activation_dtype.byte_size() as f64;
    let iota = if config.use_iota_embed { 1.0 } else { 0.0 };
    let quantize_forward = quantize_bytes(config, (tensor, experts_split));
    let weight_recompute = recomputed.0 / forward.0.max(f64::MIN_POSITIVE);
    // The gradients' weight matmuls (twice the forward's): quantized under
    // `fp8_full`, each quantizing its operands again (the weight and the
    // input, and the output's gradient); otherwise they gain nothing from
    // quantizing (module docs, "Quantization") and run at the bf16 peak.
    let (gradients_quantized, gradients_bf16, quantize_gradients) =
        match config.quantization.filter(|q| q.quantizes_gradients()) {
            Some(_) => (
                2.0 * forward.0,
                0.0,
                quantize_forward + gradient_quantize_bytes(config, tensor),
            ),
            None => (0.0, 2.0 * forward.0, 0.0),
        };
    LayerCompute {
        forward: pass(forward, fwd_bytes, quantize_forward),
        // The recomputed weight matmuls run quantized, the attention's
        // backward at the bf16 peak.
        backward: pass(
            (
                recomputed.0 + gradients_quantized,
                gradients_bf16
                    + config.attention_kernel.backward_factor() * forward.1
                    + recomputed.1,
            ),
            (2.0 + recompute) * fwd_bytes,
            weight_recompute * quantize_forward + quantize_gradients,
        ),
        // Forward 2·T·E·V, backward twice that; the logits written and
        // read back by the loss, the matrix read. A one-hot embedding's
        // lookup and its gradient ride with them: 2·T·V·E each, the
        // embedding read and its gradient written.
        logits: pass(
            (0.0, (6.0 + 4.0 * iota) * t * logits_matrix),
            (3.0 + 2.0 * iota) * logits_matrix * act + 3.0 * t * config.vocab as f64 * act,
            0.0,
        ),
    }
}

/// HBM bytes a quantized layer's forward spends quantizing its matmuls'
/// operands, the weights and the inputs, each in a pass of its own (AQT's
/// dynamic scaling): read for its scale, read again to quantize, written
/// in 8 bits — 5 bytes per element of a 2-byte operand. 0 without
/// quantization.
fn quantize_bytes(config: &ModelConfig, (tensor, experts_split): (usize, usize)) -> f64 {
    if config.quantization.is_none() {
        return 0.0;
    }
    let per_element = 2.0 * config.activation_dtype.byte_size() as f64 + 1.0;
    let t = config.tokens_per_device();
    let (e, projections, ctx, m) = (
        config.embed as f64,
        config.projection_input_width() as f64,
        config.context_width() as f64,
        config.mlp_hidden() as f64,
    );
    let n = config.mlp_activations.len() as f64;
    let tensor = tensor.max(1) as f64;
    // Per token: each matmul's input width (q, k, v or MLA's down and up
    // projections, out, the MLP's inputs and its output), each device 1/t
    // of it.
    let inputs = (projections + ctx + n * e + m) / tensor;
    let weights = local_layer_weights(config, (tensor as usize, experts_split));
    per_element * (weights + t * inputs)
}

/// HBM bytes the backward of an `fp8_full` layer spends quantizing the
/// gradients of its weight matmuls' outputs (the q, k and v projections'
/// or MLA's, the output projection's, the MLP's inputs' and its output's),
/// each device `1/tensor` of them, at 5 bytes an element as
/// [`quantize_bytes`] counts; the weights and inputs it quantizes again
/// are `quantize_bytes`' own.
fn gradient_quantize_bytes(config: &ModelConfig, tensor: usize) -> f64 {
    let per_element = 2.0 * config.activation_dtype.byte_size() as f64 + 1.0;
    let n = config.mlp_activations.len() as f64;
    let outputs = (config.query_width() + config.key_width() + config.value_width()) as f64
        + config.latent_width() as f64
        + config.embed as f64
        + n * config.mlp_hidden() as f64
        + config.embed as f64;
    per_element * config.tokens_per_device() * outputs / tensor.max(1) as f64
}

/// The weights of the average layer a device's matmuls read: `1/tensor`
/// of each, and of a mixture's routed experts the `1/experts_split` an
/// expert axis leaves on the device.
fn local_layer_weights(config: &ModelConfig, (tensor, experts_split): (usize, usize)) -> f64 {
    let counts = parameter_count(config);
    let mut weights = counts.per_layer() as f64;
    if experts_split > 1 {
        let experts = crate::model::MixtureOfExperts::routed_weights_of(config) as f64
            / counts.layers.max(1) as f64;
        weights -= experts * (1.0 - 1.0 / experts_split as f64);
    }
    weights / tensor.max(1) as f64
}

/// The peaks the weights' matmuls and the rest run at on `spec`: the
/// quantized type's (`int8`, `fp8`) for the weights when the model
/// quantizes them, else both the bf16 peak (checked to exist first,
/// [`checked`]).
pub(super) fn matmul_peaks(
    config: &ModelConfig,
    spec: &crate::hardware::HardwareSpec,
) -> (f64, f64) {
    let weights = match config.quantization {
        None => spec.peak_bf16_flops,
        Some(Quantization::Int8) => spec.peak_int8_ops,
        Some(Quantization::Fp8 | Quantization::Fp8Full) => spec.peak_fp8_flops,
    };
    (weights, spec.peak_bf16_flops)
}
