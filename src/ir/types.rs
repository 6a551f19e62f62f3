//! Element types and tensor types (`f32[8,128]`).

use std::fmt;

use serde::{Deserialize, Serialize};

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DType {
    /// Boolean (`pred` in XLA).
    Pred,
    /// 32-bit signed integer, wrapping arithmetic.
    I32,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
}

impl DType {
    /// The name used in programs and messages (`f32`).
    pub fn name(self) -> &'static str {
        match self {
            DType::Pred => "pred",
            DType::I32 => "i32",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// Bytes per element in a device buffer.
    pub fn byte_size(self) -> usize {
        match self {
            DType::Pred => 1,
            DType::I32 | DType::F32 => 4,
            DType::F64 => 8,
        }
    }

    /// Whether this is `f32` or `f64`.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64)
    }

    /// Parses `pred`, `i32`, `f32`, `f64`.
    pub fn parse(text: &str) -> Option<DType> {
        match text {
            "pred" => Some(DType::Pred),
            "i32" => Some(DType::I32),
            "f32" => Some(DType::F32),
            "f64" => Some(DType::F64),
            _ => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A dtype and a static shape, printed and parsed as `f32[8,128]` (`f32[]` is a scalar).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Dimensions, major to minor.
    pub dims: Vec<usize>,
}

impl TensorType {
    /// A tensor type from a dtype and dimensions.
    pub fn new(dtype: DType, dims: impl Into<Vec<usize>>) -> Self {
        TensorType {
            dtype,
            dims: dims.into(),
        }
    }

    /// A rank-0 tensor type.
    pub fn scalar(dtype: DType) -> Self {
        TensorType::new(dtype, Vec::new())
    }

    /// Number of elements (1 for a scalar), saturating at `usize::MAX`.
    pub fn element_count(&self) -> usize {
        self.dims.iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }

    /// Bytes a dense buffer of this type needs, saturating at `usize::MAX`.
    pub fn byte_size(&self) -> usize {
        self.element_count().saturating_mul(self.dtype.byte_size())
    }

    /// The rank (number of dimensions).
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Parses `f32[8,128]`; `None` when the text is not a tensor type.
    pub fn parse(text: &str) -> Option<TensorType> {
        let text = text.trim();
        let open = text.find('[')?;
        let dtype = DType::parse(text[..open].trim())?;
        let inner = text[open + 1..].strip_suffix(']')?;
        let dims = if inner.trim().is_empty() {
            Vec::new()
        } else {
            inner
                .split(',')
                .map(|d| d.trim().parse::<usize>().ok())
                .collect::<Option<Vec<_>>>()?
        };
        Some(TensorType { dtype, dims })
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_tensor_types() {
        let t = TensorType::parse("f32[8, 128]").unwrap();
        assert_eq!(t, TensorType::new(DType::F32, [8, 128]));
        assert_eq!(t.to_string(), "f32[8,128]");
        assert_eq!(TensorType::parse("pred[]").unwrap().element_count(), 1);
        assert!(TensorType::parse("f16[2]").is_none());
        assert!(TensorType::parse("f32[2,x]").is_none());
        assert!(TensorType::parse("f32").is_none());
    }
}
