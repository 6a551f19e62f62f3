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
//! Reading parses and validates the header with the `safetensors` crate's
//! own metadata checks (offsets contiguous, lengths matching dtype ×
//! shape) plus the file's length (no trailing bytes); the header alone is
//! enough to lay out the buffers the data is read into.

use crate::ir::DType;
use crate::persist::FORMAT_VERSION;
use crate::persist::SnapshotError;
use crate::persist::StoredTensor;
use crate::persist::TensorBytes;
use safetensors::tensor::{Dtype, Metadata, TensorInfo};
use std::collections::HashMap;
use std::ops::Range;
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

/// One tensor of a tensor file, as its header describes it.
#[derive(Debug)]
pub struct TensorEntry {
    /// Name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Byte range in the file.
    pub range: Range<usize>,
}

/// Bytes of the header (length field included) that a file starting with
/// `prefix` declares, when `prefix` holds the length field.
pub fn header_len(prefix: &[u8]) -> Option<u64> {
    let field: [u8; 8] = prefix.get(..8)?.try_into().ok()?;
    u64::from_le_bytes(field).checked_add(8)
}

/// Parses and validates the header of a tensor file of `file_len` bytes
/// from its leading bytes (at least the whole header): offsets contiguous
/// and in bounds, lengths matching dtype × shape, no trailing bytes, dtypes
/// the engine uses. The tensors come in file order: contiguous from the
/// end of the header to the end of the file.
pub fn parse_header(prefix: &[u8], file_len: usize) -> Result<Vec<TensorEntry>, SnapshotError> {
    let data_start = header_len(prefix)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n <= prefix.len())
        .ok_or_else(|| header_error("the header length points past the end of the file"))?;
    let json = std::str::from_utf8(&prefix[8..data_start])
        .map_err(|e| header_error(format!("the header is not UTF-8: {e}")))?;
    let metadata: Metadata = serde_json::from_str(json).map_err(|e| header_error(e.to_string()))?;
    if data_start.checked_add(metadata.data_len()) != Some(file_len) {
        return Err(header_error(format!(
            "the header describes {} data bytes; the file holds {}",
            metadata.data_len(),
            file_len.saturating_sub(data_start)
        )));
    }
    let mut tensors = metadata
        .tensors()
        .into_iter()
        .map(|(name, info)| {
            let dtype = from_safetensors(info.dtype).ok_or_else(|| SnapshotError::Tensor {
                name: name.clone(),
                reason: format!("dtype {:?} is not one the engine uses", info.dtype),
            })?;
            let (start, end) = info.data_offsets;
            Ok(TensorEntry {
                name,
                dtype,
                shape: info.shape.clone(),
                range: data_start + start..data_start + end,
            })
        })
        .collect::<Result<Vec<_>, SnapshotError>>()?;
    tensors.sort_unstable_by_key(|t| t.range.start);
    Ok(tensors)
}

/// Tensors from their entries and data, sorted by name, each checked.
pub fn assemble(
    entries: impl IntoIterator<Item = (TensorEntry, Option<TensorBytes>)>,
) -> Result<Vec<StoredTensor>, SnapshotError> {
    let mut tensors = entries
        .into_iter()
        .map(|(entry, data)| {
            let data = data.ok_or_else(|| SnapshotError::Tensor {
                name: entry.name.clone(),
                reason: "its data does not fill its shape".into(),
            })?;
            let tensor = StoredTensor {
                name: entry.name,
                dtype: entry.dtype,
                shape: entry.shape,
                data,
            };
            tensor.check()?;
            Ok(tensor)
        })
        .collect::<Result<Vec<_>, SnapshotError>>()?;
    tensors.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    Ok(tensors)
}

/// The tensors of a whole tensor file, sorted by name, each a range of
/// `file` (no copies).
pub fn decode(file: Arc<Vec<u8>>) -> Result<Vec<StoredTensor>, SnapshotError> {
    let entries = parse_header(&file, file.len())?;
    assemble(entries.into_iter().map(|entry| {
        let data = TensorBytes::shared(file.clone(), entry.range.clone());
        (entry, data)
    }))
}
