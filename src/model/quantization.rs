//! MaxText's `quantization`: the weights' matmuls in a narrower type than
//! the compute type, forward only (AQT's `int8`, `fp8`) or with the
//! backward's gradient matmuls too (qwix's `fp8_full`), and the peak each
//! runs at (`crate::step_model::compute`).

use serde::{Deserialize, Serialize};

/// MaxText's `quantization`: the type of the weights' matmuls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Quantization {
    /// 8-bit integers (AQT), at the chip's int8 peak.
    Int8,
    /// 8-bit floats, at the chip's fp8 peak.
    Fp8,
    /// 8-bit floats in every weight matmul, the backward's gradient
    /// matmuls too (qwix's `fp8_full`: e4m3 forward, e5m2 gradients), at
    /// the chip's fp8 peak.
    Fp8Full,
}

impl Quantization {
    /// `int8`, `fp8` or `fp8_full`.
    pub fn name(self) -> &'static str {
        match self {
            Quantization::Int8 => "int8",
            Quantization::Fp8 => "fp8",
            Quantization::Fp8Full => "fp8_full",
        }
    }

    /// The type its matmuls run in: `int8` or `fp8`.
    pub fn matmul_type(self) -> &'static str {
        match self {
            Quantization::Int8 => "int8",
            Quantization::Fp8 | Quantization::Fp8Full => "fp8",
        }
    }

    /// Whether the backward's gradient matmuls run quantized too
    /// (`fp8_full`); the others quantize the forward's (and its
    /// recomputation) only.
    pub fn quantizes_gradients(self) -> bool {
        self == Quantization::Fp8Full
    }
}
