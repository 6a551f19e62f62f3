//! A tensor's stored bytes without copies where the layout allows.
//!
//! The side channel stores little-endian row-major bytes. On little-endian
//! targets those bytes *are* a standard-layout tensor's elements, so a
//! [`TensorBytes`] may simply share the live tensor (capture writes it
//! straight from the world) and a tensor file may be read straight into
//! typed buffers that the restored tensors keep (see [`Landing`]).

use crate::ir::DType;
use crate::ir::Tensor;
use ndarray::{ArrayD, IxDyn};
use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

#[derive(Clone)]
enum Source {
    /// A range of a byte buffer (a converted tensor, or a file read whole).
    Buffer(Arc<Vec<u8>>, Range<usize>),
    /// A tensor whose elements are the bytes.
    Tensor(Arc<Tensor>),
}

/// Immutable little-endian row-major bytes of one tensor, shared with
/// their owner rather than copied.
#[derive(Clone)]
pub struct TensorBytes(Source);

/// The tensor's elements as bytes, when they are its stored bytes.
fn element_bytes(tensor: &Tensor) -> Option<&[u8]> {
    if cfg!(target_endian = "big") {
        return None;
    }
    Some(match tensor {
        Tensor::Pred(a) => bytemuck::cast_slice(a.as_slice()?),
        Tensor::I32(a) => bytemuck::cast_slice(a.as_slice()?),
        Tensor::F32(a) => bytemuck::cast_slice(a.as_slice()?),
        Tensor::F64(a) => bytemuck::cast_slice(a.as_slice()?),
    })
}

impl TensorBytes {
    /// `range` of a shared buffer. `None` when the range is out of bounds.
    pub fn shared(buffer: Arc<Vec<u8>>, range: Range<usize>) -> Option<TensorBytes> {
        (range.start <= range.end && range.end <= buffer.len())
            .then_some(TensorBytes(Source::Buffer(buffer, range)))
    }

    /// The stored bytes of `tensor`: the tensor itself when its elements
    /// already are those bytes, a converted copy otherwise (big-endian
    /// targets, non-standard layouts).
    pub fn of_tensor(tensor: &Arc<Tensor>) -> TensorBytes {
        if element_bytes(tensor).is_some() {
            TensorBytes(Source::Tensor(tensor.clone()))
        } else {
            super::tensor_value::tensor_le_bytes(tensor).into()
        }
    }

    /// The tensor these bytes are the elements of, when they are one.
    pub fn as_tensor(&self) -> Option<&Arc<Tensor>> {
        match &self.0 {
            Source::Tensor(t) => Some(t),
            Source::Buffer(..) => None,
        }
    }
}

impl From<Vec<u8>> for TensorBytes {
    fn from(bytes: Vec<u8>) -> TensorBytes {
        let range = 0..bytes.len();
        TensorBytes(Source::Buffer(Arc::new(bytes), range))
    }
}

impl Deref for TensorBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Source::Buffer(buffer, range) => &buffer[range.clone()],
            Source::Tensor(t) => element_bytes(t).expect("only viewable tensors are shared"),
        }
    }
}

impl PartialEq for TensorBytes {
    fn eq(&self, other: &TensorBytes) -> bool {
        **self == **other
    }
}

impl Eq for TensorBytes {}

impl fmt::Debug for TensorBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TensorBytes({} bytes)", self.len())
    }
}

/// Where one tensor's bytes land when a tensor file is read: the typed
/// buffer itself on little-endian targets, so the restored tensor is the
/// buffer the file was read into; a byte buffer for bools (a byte other
/// than 0 or 1 must be rejected, not read as a `bool`) and on big-endian
/// targets.
pub(crate) enum Landing {
    I32(Vec<i32>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bytes(Vec<u8>),
}

impl Landing {
    /// Room for `bytes` bytes of a `dtype` tensor (a whole number of
    /// elements: the header was validated). Zeroed by the allocator's fresh
    /// pages, not by a pass over the bytes: the read fills each page first.
    /// (Huge pages are not advised: under page-cache pressure the kernel
    /// took seconds to assemble them, far more than the faults they save.)
    pub(crate) fn new(dtype: DType, bytes: usize) -> Landing {
        let n = bytes / dtype.byte_size();
        match dtype {
            _ if cfg!(target_endian = "big") => Landing::Bytes(vec![0; bytes]),
            DType::Pred => Landing::Bytes(vec![0; bytes]),
            DType::I32 => Landing::I32(vec![0; n]),
            DType::F32 => Landing::F32(vec![0.0; n]),
            DType::F64 => Landing::F64(vec![0.0; n]),
        }
    }

    /// The buffer, as the bytes to read into.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Landing::I32(v) => bytemuck::cast_slice_mut(v),
            Landing::F32(v) => bytemuck::cast_slice_mut(v),
            Landing::F64(v) => bytemuck::cast_slice_mut(v),
            Landing::Bytes(v) => v,
        }
    }

    /// The filled buffer as a tensor of `shape`. `None` when the element
    /// count does not fill the shape.
    pub(crate) fn finish(self, shape: &[usize]) -> Option<TensorBytes> {
        let dim = IxDyn(shape);
        let tensor = match self {
            Landing::Bytes(v) => return Some(v.into()),
            Landing::I32(v) => Tensor::I32(ArrayD::from_shape_vec(dim, v).ok()?),
            Landing::F32(v) => Tensor::F32(ArrayD::from_shape_vec(dim, v).ok()?),
            Landing::F64(v) => Tensor::F64(ArrayD::from_shape_vec(dim, v).ok()?),
        };
        Some(TensorBytes::of_tensor(&Arc::new(tensor)))
    }
}
