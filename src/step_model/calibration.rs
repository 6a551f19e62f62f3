//! The one fitted constant per generation: the fraction of the bf16 peak
//! a layer's matmuls reach on the MXU. Each was fitted on one published
//! row (named below) so that the modeled TFLOP/s/chip equals it; every
//! other row of `docs/validation.md` is a prediction.

use crate::hardware::TpuGeneration;

/// v5e: fitted on MaxText's 16B model on one v5e-256 slice (120 TFLOP/s
/// per chip, MaxText README at e47fa1b5), a full-remat run: its backward
/// recomputes the matmuls whose results it reads (not the two output
/// projections of the parallel block).
pub const V5E_MXU_EFFICIENCY: f64 = 0.7326;

/// v5p: fitted on MaxText's 32B model on one v5p-128 slice (328 TFLOP/s
/// per chip, `MaxText/configs/v5p/README.md` at 76bd53b0).
pub const V5P_MXU_EFFICIENCY: f64 = 0.7230;

/// A generation with no fitted row: the mean of the fitted ones (a
/// reported figure says it is uncalibrated).
pub const DEFAULT_MXU_EFFICIENCY: f64 = (V5E_MXU_EFFICIENCY + V5P_MXU_EFFICIENCY) / 2.0;

/// The calibrated efficiency of `generation`, if it has one.
pub fn mxu_efficiency(generation: TpuGeneration) -> Option<f64> {
    match generation {
        TpuGeneration::V5e => Some(V5E_MXU_EFFICIENCY),
        TpuGeneration::V5p => Some(V5P_MXU_EFFICIENCY),
        _ => None,
    }
}
