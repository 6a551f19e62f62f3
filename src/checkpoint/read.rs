//! Reading the files a manifest lists: the length is checked before
//! reading, the SHA-256 while reading, and nothing read is handed out
//! before the whole file matches its digest.
//!
//! Only regular files are opened: a symbolic link, a named pipe (which
//! would block the reader forever), a device or a directory in place of a
//! checkpoint file is refused by its metadata before it is opened, and the
//! open itself does not follow links and does not block (on Linux,
//! `O_NOFOLLOW | O_NONBLOCK`), so an entry swapped in between the check and
//! the open is refused too.

use super::error::CheckpointError;
use super::hashed_io::read_hashed;
use super::store::{FileEntry, io_error};
use super::tensor_file;
use crate::files::{self, InputError, Links};
use crate::persist::Landing;
use crate::persist::StoredTensor;
use crate::persist::hex;
use sha2::digest::Output;
use sha2::{Digest, Sha256};
use std::fs::{File, FileType};
use std::io::{self, Read};
use std::path::Path;
use std::sync::Arc;

/// A manifest is a few hundred bytes; one larger than this is not read.
pub(super) const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// What a file system entry is, in words, for errors.
pub(super) use crate::files::kind_of;

/// Refuses anything but a regular file.
pub(super) fn check_regular(path: &Path, file_type: &FileType) -> Result<(), CheckpointError> {
    if file_type.is_file() {
        Ok(())
    } else {
        Err(CheckpointError::NotRegular {
            path: path.to_path_buf(),
            found: kind_of(file_type),
            expected: "a regular file",
        })
    }
}

/// A checkpoint file that cannot be opened, as a checkpoint error.
fn from_input(error: InputError) -> CheckpointError {
    match error {
        InputError::Missing { path } => CheckpointError::Missing { path },
        InputError::NotRegular { path, found } => CheckpointError::NotRegular {
            path,
            found,
            expected: "a regular file",
        },
        InputError::Io { path, error } => CheckpointError::Io { path, error },
        other => CheckpointError::Io {
            path: other.path().to_path_buf(),
            error: io::Error::other(other.to_string()),
        },
    }
}

/// Opens `path` for reading if, and only if, it is a regular file: its
/// metadata is checked without following a link, the open neither follows
/// a link nor blocks, and the opened file is checked again
/// ([`crate::files::open_regular`]).
pub(super) fn open_regular(path: &Path) -> Result<File, CheckpointError> {
    files::open_regular(path, Links::Refuse).map_err(from_input)
}

/// Reads a small file (the manifest) whole: a regular file of at most
/// [`MAX_MANIFEST_BYTES`].
pub(super) fn read(path: &Path) -> Result<Vec<u8>, CheckpointError> {
    let file = open_regular(path)?;
    let len = file.metadata().map_err(io_error(path))?.len();
    if len > MAX_MANIFEST_BYTES {
        return Err(CheckpointError::Manifest {
            path: path.to_path_buf(),
            reason: format!("{len} bytes, more than a manifest holds ({MAX_MANIFEST_BYTES})"),
        });
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io_error(path))?;
    Ok(bytes)
}

/// Opens a file the manifest lists and checks its length before reading.
fn open_listed(path: &Path, entry: &FileEntry) -> Result<(File, usize), CheckpointError> {
    let file = open_regular(path)?;
    let on_disk = file.metadata().map_err(io_error(path))?.len();
    let len = usize::try_from(entry.bytes)
        .ok()
        .filter(|_| on_disk == entry.bytes)
        .ok_or_else(|| CheckpointError::Length {
            path: path.to_path_buf(),
            expected: entry.bytes,
            actual: on_disk,
        })?;
    Ok((file, len))
}

/// Checks that a file read in full ends where the manifest says (even if
/// it grew meanwhile) and has the listed digest.
fn check_read(
    file: &mut File,
    path: &Path,
    entry: &FileEntry,
    digest: &Output<Sha256>,
) -> Result<(), CheckpointError> {
    if file.read(&mut [0u8; 1]).map_err(io_error(path))? != 0 {
        return Err(CheckpointError::Length {
            path: path.to_path_buf(),
            expected: entry.bytes,
            actual: entry.bytes + 1,
        });
    }
    let actual = hex(digest);
    if actual != entry.sha256 {
        return Err(CheckpointError::Digest {
            path: path.to_path_buf(),
            expected: entry.sha256.clone(),
            actual,
        });
    }
    Ok(())
}

/// Reads a file the manifest lists, checking its length before reading and
/// its SHA-256 while reading.
pub(super) fn read_verified(path: &Path, entry: &FileEntry) -> Result<Vec<u8>, CheckpointError> {
    let (mut file, len) = open_listed(path, entry)?;
    let mut bytes = vec![0u8; len];
    let digest =
        read_hashed(&mut file, Sha256::new(), vec![&mut bytes[..]]).map_err(io_error(path))?;
    check_read(&mut file, path, entry, &digest)?;
    Ok(bytes)
}

/// The length field and the header of a tensor file of `len` bytes, or as
/// much of them as the file holds.
fn read_tensor_header(file: &mut File, len: usize) -> io::Result<Vec<u8>> {
    let mut prefix = vec![0u8; len.min(8)];
    file.read_exact(&mut prefix)?;
    if let Some(header) = tensor_file::header_len(&prefix)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n <= len)
    {
        prefix.resize(header, 0);
        file.read_exact(&mut prefix[8..])?;
    }
    Ok(prefix)
}

/// Reads the tensor file the manifest lists straight into the buffers the
/// restored tensors keep, hashing it on the way. The header lays the
/// buffers out before its digest is known; nothing read is handed out
/// unless the whole file matches the digest. A header that does not parse
/// sends the file through [`read_verified`] instead, so a corrupted header
/// is reported as a digest mismatch like any other corrupted byte.
pub(super) fn read_tensor_file(
    path: &Path,
    entry: &FileEntry,
) -> Result<Vec<StoredTensor>, CheckpointError> {
    let snapshot_error = |error| CheckpointError::Snapshot {
        path: path.to_path_buf(),
        error,
    };
    let (mut file, len) = open_listed(path, entry)?;
    let prefix = read_tensor_header(&mut file, len).map_err(io_error(path))?;
    let Ok(entries) = tensor_file::parse_header(&prefix, len) else {
        let bytes = read_verified(path, entry)?;
        return tensor_file::decode(Arc::new(bytes)).map_err(snapshot_error);
    };
    let mut hasher = Sha256::new();
    hasher.update(&prefix);
    let mut landings: Vec<Landing> = entries
        .iter()
        .map(|t| Landing::new(t.dtype, t.range.len()))
        .collect();
    let parts = landings.iter_mut().map(Landing::bytes_mut).collect();
    let digest = read_hashed(&mut file, hasher, parts).map_err(io_error(path))?;
    check_read(&mut file, path, entry, &digest)?;
    tensor_file::assemble(entries.into_iter().zip(landings).map(|(t, landing)| {
        let data = landing.finish(&t.shape);
        (t, data)
    }))
    .map_err(snapshot_error)
}
