//! Tensors inside snapshot columns: small ones inline, large ones as
//! references into the checkpoint's tensor file, and their little-endian
//! byte encoding (the safetensors layout).

use std::sync::Arc;

use ndarray::{ArrayD, IxDyn};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::codec::{LoadContext, StoreContext, TensorRef};
use super::error::SnapshotError;
use crate::ir::{DType, Tensor, TensorType};

/// Tensors with at most this many elements are stored inline in their
/// column; larger ones go to the tensor file.
pub const INLINE_TENSOR_MAX_ELEMENTS: usize = 64;

/// A tensor in a column: inline, or a reference into the tensor file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum StoredTensorValue {
    /// Small tensors, in the column itself.
    Inline(Tensor),
    /// Large tensors, in the tensor side channel.
    External(TensorRef),
}

impl StoredTensorValue {
    /// Bytes the tensor occupies once loaded, read from the stored form
    /// without building it (what a device heap must hold for it).
    pub fn byte_len(&self, ctx: &LoadContext, what: &'static str) -> Result<usize, SnapshotError> {
        match self {
            StoredTensorValue::Inline(t) => Ok(t.len() * t.dtype().byte_size()),
            StoredTensorValue::External(r) => Ok(ctx.tensor(r, what)?.data.len()),
        }
    }
}

/// Elements per parallel chunk when converting bulk tensors.
const CONVERT_CHUNK: usize = 1 << 20;

/// Each element's little-endian bytes, in row-major order. Written into a
/// preallocated buffer chunk by chunk (in parallel for large tensors), so
/// the compiler turns it into plain copies on little-endian targets.
fn encode_le<T: Copy + Send + Sync, const N: usize>(
    a: &ArrayD<T>,
    le: impl Fn(T) -> [u8; N] + Sync,
) -> Vec<u8> {
    let mut out = vec![0u8; a.len() * N];
    let fill = |dst: &mut [u8], src: &[T]| {
        dst.chunks_exact_mut(N)
            .zip(src)
            .for_each(|(d, &v)| d.copy_from_slice(&le(v)));
    };
    match a.as_slice() {
        Some(s) => out
            .par_chunks_mut(CONVERT_CHUNK * N)
            .zip(s.par_chunks(CONVERT_CHUNK))
            .for_each(|(d, s)| fill(d, s)),
        None => {
            let logical: Vec<T> = a.iter().copied().collect();
            fill(&mut out, &logical);
        }
    }
    out
}

/// The tensor's elements as little-endian row-major bytes (pred as 0/1).
pub fn tensor_le_bytes(t: &Tensor) -> Vec<u8> {
    match t {
        Tensor::Pred(a) => encode_le(a, |v| [u8::from(v)]),
        Tensor::I32(a) => encode_le(a, i32::to_le_bytes),
        Tensor::F32(a) => encode_le(a, f32::to_le_bytes),
        Tensor::F64(a) => encode_le(a, f64::to_le_bytes),
    }
}

fn decode_le<T: Copy + Default + Send, const N: usize>(
    bytes: &[u8],
    from: impl Fn([u8; N]) -> T + Sync,
) -> Vec<T> {
    let mut out = vec![T::default(); bytes.len() / N];
    out.par_chunks_mut(CONVERT_CHUNK)
        .zip(bytes.par_chunks(CONVERT_CHUNK * N))
        .for_each(|(d, s)| {
            d.iter_mut()
                .zip(s.chunks_exact(N))
                .for_each(|(d, c)| *d = from(c.try_into().expect("chunks_exact yields N bytes")));
        });
    out
}

/// A tensor from little-endian row-major bytes; `what` names it in errors.
pub fn tensor_from_le_bytes(
    ty: &TensorType,
    bytes: &[u8],
    what: &str,
) -> Result<Tensor, SnapshotError> {
    let bad = |reason: String| SnapshotError::Tensor {
        name: what.to_string(),
        reason,
    };
    if Some(bytes.len())
        != ty
            .dims
            .iter()
            .try_fold(ty.dtype.byte_size(), |n, &d| n.checked_mul(d))
    {
        return Err(bad(format!("{} bytes do not hold a {ty}", bytes.len())));
    }
    let dim = IxDyn(&ty.dims);
    let shape_error = |e: ndarray::ShapeError| bad(e.to_string());
    Ok(match ty.dtype {
        DType::Pred => {
            if let Some(b) = bytes.iter().find(|&&b| b > 1) {
                return Err(bad(format!("bool byte {b} is neither 0 nor 1")));
            }
            Tensor::Pred(
                ArrayD::from_shape_vec(dim, bytes.iter().map(|&b| b == 1).collect())
                    .map_err(shape_error)?,
            )
        }
        DType::I32 => Tensor::I32(
            ArrayD::from_shape_vec(dim, decode_le(bytes, i32::from_le_bytes))
                .map_err(shape_error)?,
        ),
        DType::F32 => Tensor::F32(
            ArrayD::from_shape_vec(dim, decode_le(bytes, f32::from_le_bytes))
                .map_err(shape_error)?,
        ),
        DType::F64 => Tensor::F64(
            ArrayD::from_shape_vec(dim, decode_le(bytes, f64::from_le_bytes))
                .map_err(shape_error)?,
        ),
    })
}

/// Stores a tensor inline or in the side channel, by size.
pub fn store_tensor(t: &Tensor, ctx: &StoreContext) -> Result<StoredTensorValue, SnapshotError> {
    if t.len() <= INLINE_TENSOR_MAX_ELEMENTS {
        return Ok(StoredTensorValue::Inline(t.clone()));
    }
    ctx.put_tensor(t.dtype(), t.shape(), tensor_le_bytes(t))
        .map(StoredTensorValue::External)
}

/// [`store_tensor`] for a shared tensor: the side channel shares it rather
/// than copying it.
pub fn store_shared_tensor(
    t: &Arc<Tensor>,
    ctx: &StoreContext,
) -> Result<StoredTensorValue, SnapshotError> {
    if t.len() <= INLINE_TENSOR_MAX_ELEMENTS {
        return Ok(StoredTensorValue::Inline((**t).clone()));
    }
    ctx.put_shared_tensor(t).map(StoredTensorValue::External)
}

/// Checks that a stored tensor would load, without decoding bulk data.
pub fn check_tensor(
    stored: &StoredTensorValue,
    ctx: &LoadContext,
    what: &'static str,
) -> Result<(), SnapshotError> {
    match stored {
        StoredTensorValue::Inline(t) => check_inline(t, what),
        StoredTensorValue::External(r) => {
            let t = ctx.tensor(r, what)?;
            if t.dtype == DType::Pred && t.data.iter().any(|&b| b > 1) {
                return Err(SnapshotError::Tensor {
                    name: t.name.clone(),
                    reason: "a bool byte is neither 0 nor 1".into(),
                });
            }
            Ok(())
        }
    }
}

fn check_inline(t: &Tensor, what: &'static str) -> Result<(), SnapshotError> {
    // ndarray's deserializer checks that the data fills the shape.
    if t.len() > INLINE_TENSOR_MAX_ELEMENTS {
        return Err(SnapshotError::Corrupt {
            column: what.into(),
            reason: format!("an inline tensor of {} elements", t.len()),
        });
    }
    Ok(())
}

/// Loads a tensor stored by [`store_tensor`].
pub fn load_tensor(
    stored: StoredTensorValue,
    ctx: &LoadContext,
    what: &'static str,
) -> Result<Tensor, SnapshotError> {
    load_shared_tensor(stored, ctx, what).map(Arc::unwrap_or_clone)
}

/// Loads a tensor stored by [`store_tensor`] or [`store_shared_tensor`],
/// sharing the side channel's tensor when it holds one of the right type
/// (a tensor file read straight into typed buffers) instead of decoding.
pub fn load_shared_tensor(
    stored: StoredTensorValue,
    ctx: &LoadContext,
    what: &'static str,
) -> Result<Arc<Tensor>, SnapshotError> {
    match stored {
        StoredTensorValue::Inline(t) => check_inline(&t, what).map(|()| Arc::new(t)),
        StoredTensorValue::External(r) => {
            let t = ctx.tensor(&r, what)?;
            match t.data.as_tensor() {
                Some(shared) if shared.dtype() == t.dtype && shared.shape() == t.shape => {
                    Ok(shared.clone())
                }
                _ => tensor_from_le_bytes(
                    &TensorType::new(t.dtype, t.shape.clone()),
                    &t.data,
                    &t.name,
                )
                .map(Arc::new),
            }
        }
    }
}
