//! Bulk bytes through SHA-256 on their way to and from disk, each byte
//! touched as few times as possible.
//!
//! Writing: the bytes go to the file in chunks while a second thread hashes
//! the same slices, and after every few chunks the kernel is told to start
//! writing them back (`sync_file_range` on Linux), so the disk works while
//! the rest is hashed and the final `fsync` waits only for the tail.
//!
//! Reading: chunks are read straight into their final buffers by two
//! reader threads and hashed in file order as they arrive.

use sha2::digest::Output;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::sync::mpsc;

/// Files at least this large are hashed on a second thread while they are
/// written or read; smaller ones are not worth the thread.
pub(crate) const PARALLEL_HASH_BYTES: usize = 4 << 20;

/// Chunk of a pipelined read or write: large enough to amortize the
/// hand-off, small enough that the two threads overlap.
const CHUNK_BYTES: usize = 8 << 20;

/// Written bytes between two write-back requests.
const WRITE_BACK_BYTES: u64 = 32 << 20;

/// Asks the kernel to start writing `len` bytes at `offset` back to disk,
/// without waiting. Advisory: the caller still syncs the file, which
/// reports any error.
#[cfg(target_os = "linux")]
fn start_write_back(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    // SAFETY: the descriptor is open for the duration of the call (`file`
    // is borrowed); sync_file_range reads no memory of this process.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
    }
}

#[cfg(not(target_os = "linux"))]
fn start_write_back(_: &File, _: u64, _: u64) {}

/// Writes `parts` back to back, starting write-back as it goes, and
/// returns their SHA-256 (computed on a second thread for large files).
pub(crate) fn write_hashed(file: &mut File, parts: &[&[u8]]) -> io::Result<Output<Sha256>> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let hash_all = || {
        let mut hasher = Sha256::new();
        parts.iter().for_each(|p| hasher.update(p));
        hasher.finalize()
    };
    if total < PARALLEL_HASH_BYTES {
        parts.iter().try_for_each(|p| file.write_all(p))?;
        return Ok(hash_all());
    }
    std::thread::scope(|scope| {
        let hasher = scope.spawn(hash_all);
        let written = write_with_write_back(file, parts);
        let digest = hasher.join().expect("hashing does not panic");
        written.map(|()| digest)
    })
}

fn write_with_write_back(file: &mut File, parts: &[&[u8]]) -> io::Result<()> {
    let (mut written, mut requested) = (0u64, 0u64);
    for chunk in parts.iter().flat_map(|p| p.chunks(CHUNK_BYTES)) {
        file.write_all(chunk)?;
        written += chunk.len() as u64;
        if written - requested >= WRITE_BACK_BYTES {
            start_write_back(file, requested, written - requested);
            requested = written;
        }
    }
    Ok(())
}

/// Fills `parts` in order from `file` (from its current position, which
/// is left at their end) and returns the SHA-256 of `hasher` (which may
/// already hold the bytes before them) followed by every part.
///
/// A large read is split into chunks that two reader threads fill
/// alternately (`pread` at each chunk's offset) while this thread hashes
/// them in file order: copying out of the page cache and faulting in the
/// fresh pages cost about as much as hashing, so one reader alone would
/// leave the hasher waiting.
pub(crate) fn read_hashed(
    file: &mut File,
    mut hasher: Sha256,
    parts: Vec<&mut [u8]>,
) -> io::Result<Output<Sha256>> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    if total < PARALLEL_HASH_BYTES || cfg!(not(unix)) {
        for part in parts {
            file.read_exact(part)?;
            hasher.update(&*part);
        }
        return Ok(hasher.finalize());
    }
    let start = file.stream_position()?;
    let mut lanes: [Vec<(u64, &mut [u8])>; 2] = Default::default();
    let mut offset = start;
    for (i, chunk) in parts
        .into_iter()
        .flat_map(|p| p.chunks_mut(CHUNK_BYTES))
        .enumerate()
    {
        let len = chunk.len() as u64;
        lanes[i % 2].push((offset, chunk));
        offset += len;
    }
    let chunks = lanes[0].len() + lanes[1].len();
    let reader: &File = file;
    let digest = std::thread::scope(|scope| {
        let mut receivers = Vec::with_capacity(2);
        let mut readers = Vec::with_capacity(2);
        for lane in lanes {
            let (send, receive) = mpsc::sync_channel::<&[u8]>(2);
            receivers.push(receive);
            readers.push(scope.spawn(move || {
                for (offset, chunk) in lane {
                    read_exact_at(reader, chunk, offset)?;
                    let chunk: &[u8] = chunk;
                    // The hasher stops taking chunks only after an error
                    // elsewhere, which is reported instead.
                    if send.send(chunk).is_err() {
                        break;
                    }
                }
                Ok::<(), io::Error>(())
            }));
        }
        let hashed = (0..chunks).all(|i| match receivers[i % 2].recv() {
            Ok(chunk) => {
                hasher.update(chunk);
                true
            }
            Err(_) => false,
        });
        drop(receivers);
        for reader in readers {
            reader.join().expect("reading does not panic")?;
        }
        if !hashed {
            return Err(io::Error::other("a reader stopped early"));
        }
        Ok(hasher.finalize())
    })?;
    file.seek(io::SeekFrom::Start(offset))?;
    Ok(digest)
}

#[cfg(unix)]
fn read_exact_at(file: &File, buffer: &mut [u8], offset: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buffer, offset)
}

#[cfg(not(unix))]
fn read_exact_at(_: &File, _: &mut [u8], _: u64) -> io::Result<()> {
    Err(io::Error::other("positioned reads need a unix target"))
}
