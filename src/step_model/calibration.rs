//! The one fitted constant per generation: the fraction of the bf16 peak
//! a layer's matmuls reach on the MXU. Each was fitted on one published
//! row (named below) so that the modeled TFLOP/s/chip equals it; every
//! other row of `docs/validation.md` is a prediction.

use crate::hardware::TpuGeneration;

/// v5e: fitted on MaxText's 16B model on one v5e-256 slice (120 TFLOP/s
/// per chip, MaxText README at e47fa1b5), a full-remat run: its backward
/// recomputes the matmuls whose results it reads (not the two output
/// projections of the parallel block).
pub const V5E_MXU_EFFICIENCY: f64 = 0.7514;

/// v5p: fitted on MaxText's 32B model on one v5p-128 slice (328 TFLOP/s
/// per chip, `MaxText/configs/v5p/README.md` at 76bd53b0).
pub const V5P_MXU_EFFICIENCY: f64 = 0.7301;

/// v6e (Trillium): fitted on the Trillium recipe's Llama 2 70B on one
/// v6e-256 slice (943.086 tokens/s/chip, 17.373 s a step:
/// AI-Hypercomputer/tpu-recipes 5f53866,
/// `training/trillium/Llama2-70B-MaxText/README.md`, `llama2_70b_4096`),
/// a full-remat run with no offload and a gathered embedding, so the
/// constant is the MXU's alone.
/// Trillium's published runs reach about half its 918 TFLOP/s where v5e
/// and v5p reach 60–70 % of theirs: the other constants do not transfer.
pub const V6E_MXU_EFFICIENCY: f64 = 0.5639;

/// TPU7x (Ironwood): fitted on the Ironwood recipe's Llama 3.1 70B on a
/// 4x4x4 slice (2686.98 tokens/s/chip, 12.20 s a step:
/// AI-Hypercomputer/tpu-recipes d25b533, `training/ironwood/README.md`,
/// `llama3.1-70b/8k-bf16-tpu7x-4x4x4`), bf16, the projections and the
/// attention output saved on the device, no offload. Per chip: JAX sees
/// each chip as two devices, the step model one.
pub const TPU7X_MXU_EFFICIENCY: f64 = 0.6458;

/// Every fitted constant.
pub const FITTED: [f64; 4] = [
    V5E_MXU_EFFICIENCY,
    V5P_MXU_EFFICIENCY,
    V6E_MXU_EFFICIENCY,
    TPU7X_MXU_EFFICIENCY,
];

/// A generation with no fitted row: the mean of the fitted ones (a
/// reported figure says it is uncalibrated, and gives the step at the
/// least and the most of them, [`fitted_range`]).
pub const DEFAULT_MXU_EFFICIENCY: f64 =
    (V5E_MXU_EFFICIENCY + V5P_MXU_EFFICIENCY + V6E_MXU_EFFICIENCY + TPU7X_MXU_EFFICIENCY) / 4.0;

/// The least and the most fitted constant: an uncalibrated generation's
/// step lies between them as far as the other generations say.
pub fn fitted_range() -> (f64, f64) {
    FITTED.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &e| {
        (lo.min(e), hi.max(e))
    })
}

/// The calibrated efficiency of `generation`, if it has one.
pub fn mxu_efficiency(generation: TpuGeneration) -> Option<f64> {
    match generation {
        TpuGeneration::V5e => Some(V5E_MXU_EFFICIENCY),
        TpuGeneration::V5p => Some(V5P_MXU_EFFICIENCY),
        TpuGeneration::V6e => Some(V6E_MXU_EFFICIENCY),
        TpuGeneration::Tpu7x => Some(TPU7X_MXU_EFFICIENCY),
        _ => None,
    }
}
