//! `tensors.safetensors`: the snapshot's tensor side channel in the
//! ecosystem's standard tensor format, so Python's `safetensors.numpy.load_file`
//! (or torch, or any other reader) opens a checkpoint's tensors directly.
//!
//! Layout (the format's own): an 8-byte little-endian header length, a JSON
//! header padded with spaces to a multiple of 8 bytes mapping each tensor
//! name to `{dtype, shape, data_offsets}` (dtype `BOOL`, `I32`, `F32` or
//! `F64`), then the tensors' little-endian row-major bytes, back to back.
//! Tensors are laid out by decreasing element size, then by name — the
//! order the `safetensors` crate itself uses — so every tensor starts at a
//! multiple of its element size. The header also carries
//! `__metadata__: {"format_version": "<n>"}`.
//!
//! Reading parses and validates the header with the `safetensors` crate
//! (offsets contiguous and in bounds, lengths matching dtype × shape, no
//! trailing bytes) and hands out each tensor as a range of the one file
//! buffer, without copying.

use super::error::SnapshotError;
use super::persist::{StoredTensor, TensorBytes};
use super::snapshot::FORMAT_VERSION;
use crate::xla::DType;
use safetensors::tensor::{Dtype, Metadata, SafeTensors, TensorInfo};
use std::collections::HashMap;
use std::sync::Arc;

/// The tensor file's name.
pub const TENSOR_FILE: &str = "tensors.safetensors";

fn to_safetensors(dtype: DType) -> Dtype {
    match dtype {
        DType::Pred => Dtype::BOOL,
        DType::I32 => Dtype::I32,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
    }
}

fn from_safetensors(dtype: Dtype) -> Option<DType> {
    match dtype {
        Dtype::BOOL => Some(DType::Pred),
        Dtype::I32 => Some(DType::I32),
        Dtype::F32 => Some(DType::F32),
        Dtype::F64 => Some(DType::F64),
        _ => None,
    }
}

fn header_error(reason: impl Into<String>) -> SnapshotError {
    SnapshotError::Tensor {
        name: "<header>".into(),
        reason: reason.into(),
    }
}

/// The file's leading bytes (length and JSON header) and the order in which
/// the tensors' data follows them (indices into `tensors`).
pub fn encode_header(tensors: &[StoredTensor]) -> Result<(Vec<u8>, Vec<usize>), SnapshotError> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    // Stable: tensors are sorted by name already.
    order.sort_by_key(|&i| std::cmp::Reverse(tensors[i].dtype.byte_size()));
    let mut offset = 0;
    let infos = order
        .iter()
        .map(|&i| {
            let t = &tensors[i];
            let info = TensorInfo {
                dtype: to_safetensors(t.dtype),
                shape: t.shape.clone(),
                data_offsets: (offset, offset + t.data.len()),
            };
            offset += t.data.len();
            (t.name.clone(), info)
        })
        .collect();
    let mut about = HashMap::new();
    about.insert("format_version".to_string(), FORMAT_VERSION.to_string());
    let metadata = Metadata::new(Some(about), infos).map_err(|e| header_error(e.to_string()))?;
    let mut json = serde_json::to_vec(&metadata).map_err(|e| header_error(e.to_string()))?;
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut header = Vec::with_capacity(8 + json.len());
    header.extend_from_slice(&(json.len() as u64).to_le_bytes());
    header.extend_from_slice(&json);
    Ok((header, order))
}

/// The tensors of a whole tensor file, sorted by name, each a range of
/// `file` (no copies).
pub fn decode(file: Arc<Vec<u8>>) -> Result<Vec<StoredTensor>, SnapshotError> {
    let (header_len, metadata) =
        SafeTensors::read_metadata(&file).map_err(|e| header_error(e.to_string()))?;
    let data_start = 8 + header_len;
    let mut tensors = metadata
        .tensors()
        .into_iter()
        .map(|(name, info)| {
            let dtype = from_safetensors(info.dtype).ok_or_else(|| SnapshotError::Tensor {
                name: name.clone(),
                reason: format!("dtype {:?} is not one the engine uses", info.dtype),
            })?;
            let (start, end) = info.data_offsets;
            let data = TensorBytes::shared(file.clone(), data_start + start..data_start + end)
                .ok_or_else(|| SnapshotError::Tensor {
                    name: name.clone(),
                    reason: "data offsets out of bounds".into(),
                })?;
            let tensor = StoredTensor {
                name,
                dtype,
                shape: info.shape.clone(),
                data,
            };
            tensor.check()?;
            Ok(tensor)
        })
        .collect::<Result<Vec<_>, SnapshotError>>()?;
    tensors.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    Ok(tensors)
}
