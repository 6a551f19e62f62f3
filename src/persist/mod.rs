//! How the engine's world becomes bytes and back: the [`Persist`] codec of
//! each component and resource type, [`WorldSnapshot`] (one column per
//! registered type, entities as dense ids), [`SnapshotRegistry`] (capture,
//! verify, restore in place), and tensors as inline values or references
//! into a tensor side channel.
//!
//! This layer knows nothing of files: [`crate::checkpoint`] writes a
//! snapshot to disk with its manifest and verifies it before a restore.
//! Domains implement [`Persist`] for their own components here, below
//! every domain, so no domain has to import the checkpoint machinery.

mod codec;
mod error;
mod snapshot;
mod tensor_bytes;
mod tensor_value;

pub(crate) use codec::persist_as_self;
pub use codec::{DenseIds, LoadContext, Persist, StoreContext, StoredTensor, TensorRef};
pub use error::SnapshotError;
pub use snapshot::{Column, FORMAT_VERSION, SnapshotRegistry, WorldSnapshot, hex};
pub(crate) use tensor_bytes::Landing;
pub use tensor_bytes::TensorBytes;
pub use tensor_value::{
    INLINE_TENSOR_MAX_ELEMENTS, StoredTensorValue, check_tensor, load_shared_tensor, load_tensor,
    store_shared_tensor, store_tensor, tensor_from_le_bytes, tensor_le_bytes,
};
