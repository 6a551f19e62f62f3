//! Opening the files a user names as inputs (pod files, program files,
//! checkpoint files): only regular files are read, and never more than a
//! loader's size limit.
//!
//! A named pipe would block the reader until some other process writes to
//! it (forever, usually), a device such as `/dev/zero` never ends, and a
//! directory or a socket is not a file at all. So the entry's metadata is
//! checked *before* it is opened, the open does not block (on Unix,
//! `O_NONBLOCK`, which changes nothing for a regular file), and the opened
//! file is checked again, so an entry swapped in between is refused too.
//! A file larger than the limit is refused by its length, and the read
//! stops at the limit even if the file grows meanwhile.

use std::fs::{self, File, FileType};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use thiserror::Error;

/// An input file that cannot be read. Every variant names the file.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum InputError {
    /// Nothing exists at the path.
    #[error("{path}: no such file")]
    Missing {
        /// The path given.
        path: PathBuf,
    },
    /// The path is a named pipe, a device, a directory, a socket (or, where
    /// links are refused, a symbolic link): never opened for reading.
    #[error("{path}: is {found}, not a regular file")]
    NotRegular {
        /// The path given.
        path: PathBuf,
        /// What it is, in words (`a named pipe`, `a device`, ...).
        found: &'static str,
    },
    /// The file is larger than the loader reads.
    #[error("{path}: {bytes} bytes, more than the {limit} bytes {what} may have")]
    TooLarge {
        /// The path given.
        path: PathBuf,
        /// Its length.
        bytes: u64,
        /// The limit.
        limit: u64,
        /// What the file was read as (`a pod file`).
        what: &'static str,
    },
    /// The file is not UTF-8 text.
    #[error("{path}: not UTF-8 text ({what} is RON text)")]
    NotText {
        /// The path given.
        path: PathBuf,
        /// What the file was read as.
        what: &'static str,
    },
    /// The operating system refused (permissions, I/O). The message
    /// includes the I/O error's, so it is a field, not a `source()`.
    #[error("{path}: {error}")]
    Io {
        /// The path given.
        path: PathBuf,
        /// Why.
        error: io::Error,
    },
}

impl InputError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            InputError::Missing { path }
            | InputError::NotRegular { path, .. }
            | InputError::TooLarge { path, .. }
            | InputError::NotText { path, .. }
            | InputError::Io { path, .. } => path,
        }
    }
}

/// Whether a symbolic link is followed to the file it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Follow it (a pod file may be a link into a shared directory).
    Follow,
    /// Refuse it (a checkpoint holds its own files, never links).
    Refuse,
}

/// What a file system entry is, in words, for errors.
pub fn kind_of(file_type: &FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "a named pipe";
        }
        if file_type.is_socket() {
            return "a socket";
        }
        if file_type.is_block_device() || file_type.is_char_device() {
            return "a device";
        }
    }
    if file_type.is_symlink() {
        "a symbolic link"
    } else if file_type.is_dir() {
        "a directory"
    } else if file_type.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> InputError + '_ {
    move |error| {
        if error.kind() == io::ErrorKind::NotFound {
            InputError::Missing {
                path: path.to_path_buf(),
            }
        } else {
            InputError::Io {
                path: path.to_path_buf(),
                error,
            }
        }
    }
}

fn check_regular(path: &Path, file_type: &FileType) -> Result<(), InputError> {
    if file_type.is_file() {
        Ok(())
    } else {
        Err(InputError::NotRegular {
            path: path.to_path_buf(),
            found: kind_of(file_type),
        })
    }
}

/// Opens `path` for reading if, and only if, it is a regular file: checked
/// by its metadata before the open, opened without blocking (and, with
/// [`Links::Refuse`], without following a link), and checked again once
/// open.
pub fn open_regular(path: &Path, links: Links) -> Result<File, InputError> {
    let metadata = match links {
        Links::Follow => fs::metadata(path),
        Links::Refuse => fs::symlink_metadata(path),
    }
    .map_err(io_error(path))?;
    check_regular(path, &metadata.file_type())?;
    let mut options = fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let no_follow = match links {
            Links::Follow => 0,
            Links::Refuse => libc::O_NOFOLLOW,
        };
        options.custom_flags(libc::O_NONBLOCK | no_follow);
    }
    let file = options.open(path).map_err(|error| {
        // ELOOP: the entry became a link after the check.
        #[cfg(unix)]
        if links == Links::Refuse && error.raw_os_error() == Some(libc::ELOOP) {
            return InputError::NotRegular {
                path: path.to_path_buf(),
                found: "a symbolic link",
            };
        }
        io_error(path)(error)
    })?;
    check_regular(path, &file.metadata().map_err(io_error(path))?.file_type())?;
    Ok(file)
}

/// Reads the regular file at `path` whole, refusing one of more than
/// `limit` bytes (`what` names the kind of file in that error).
pub fn read_bytes(path: &Path, limit: u64, what: &'static str) -> Result<Vec<u8>, InputError> {
    let file = open_regular(path, Links::Follow)?;
    read_limited(path, file, limit, what)
}

/// [`read_bytes`] on a file already opened by [`open_regular`].
pub fn read_limited(
    path: &Path,
    file: File,
    limit: u64,
    what: &'static str,
) -> Result<Vec<u8>, InputError> {
    let too_large = |bytes| InputError::TooLarge {
        path: path.to_path_buf(),
        bytes,
        limit,
        what,
    };
    let len = file.metadata().map_err(io_error(path))?.len();
    if len > limit {
        return Err(too_large(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(io_error(path))?;
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Reads the regular file at `path` as UTF-8 text of at most `limit` bytes.
pub fn read_text(path: &Path, limit: u64, what: &'static str) -> Result<String, InputError> {
    String::from_utf8(read_bytes(path, limit, what)?).map_err(|_| InputError::NotText {
        path: path.to_path_buf(),
        what,
    })
}

impl From<InputError> for crate::error::OptimError {
    fn from(error: InputError) -> Self {
        crate::error::OptimError::new(crate::error::ErrorKind::Io, error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_is_read_and_a_larger_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.ron");
        fs::write(&path, "0123456789").unwrap();
        assert_eq!(read_text(&path, 10, "a test file").unwrap(), "0123456789");
        let err = read_text(&path, 9, "a test file").unwrap_err();
        assert!(
            matches!(
                err,
                InputError::TooLarge {
                    bytes: 10,
                    limit: 9,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("a.ron"), "{err}");
    }

    #[test]
    fn a_directory_a_device_and_a_missing_path_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_bytes(dir.path(), 1 << 20, "a test file").unwrap_err();
        assert!(
            matches!(
                err,
                InputError::NotRegular {
                    found: "a directory",
                    ..
                }
            ),
            "{err}"
        );
        let err = read_bytes(Path::new("/dev/zero"), 1 << 20, "a test file").unwrap_err();
        assert!(
            matches!(
                err,
                InputError::NotRegular {
                    found: "a device",
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "/dev/zero: is a device, not a regular file"
        );
        let missing = dir.path().join("none.ron");
        let err = read_bytes(&missing, 1 << 20, "a test file").unwrap_err();
        assert!(matches!(err, InputError::Missing { .. }), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn a_named_pipe_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("ff.ron");
        let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo reads nothing else.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        let err = read_bytes(&fifo, 1 << 20, "a test file").unwrap_err();
        assert!(
            matches!(
                err,
                InputError::NotRegular {
                    found: "a named pipe",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_link_is_followed_or_refused_as_asked() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("t.ron");
        fs::write(&target, "x").unwrap();
        let link = dir.path().join("l.ron");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(open_regular(&link, Links::Follow).is_ok());
        let err = open_regular(&link, Links::Refuse).unwrap_err();
        assert!(
            matches!(
                err,
                InputError::NotRegular {
                    found: "a symbolic link",
                    ..
                }
            ),
            "{err}"
        );
    }
}

/// A RON syntax or type error in an input file: where, and in which field
/// (the serde path, or `top` for the file as a whole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RonSyntax {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// The field path (`slices`, `extra_links[2].a`), or the top name.
    pub field: String,
    /// RON's message.
    pub message: String,
}

/// Parses RON `text` into `T` (implicit `Some`), naming the field of the
/// first error by its serde path (`top` for the file as a whole): the one
/// reader of every RON input file, each domain mapping the error to its own.
pub fn parse_ron<T: serde::de::DeserializeOwned>(text: &str, top: &str) -> Result<T, RonSyntax> {
    let options =
        ron::Options::default().with_default_extension(ron::extensions::Extensions::IMPLICIT_SOME);
    let syntax = |field: String, error: ron::error::SpannedError| RonSyntax {
        line: error.position.line,
        column: error.position.col,
        field,
        message: error.code.to_string(),
    };
    let mut de = ron::Deserializer::from_str_with_options(text, &options)
        .map_err(|e| syntax(top.to_string(), e))?;
    let parsed: Result<T, _> = serde_path_to_error::deserialize(&mut de);
    match parsed {
        Ok(value) => {
            de.end()
                .map_err(|code| syntax(top.to_string(), de.span_error(code)))?;
            Ok(value)
        }
        Err(error) => {
            let path = error.path().to_string();
            let field = if path == "." || path.is_empty() {
                top.to_string()
            } else {
                path
            };
            Err(syntax(field, de.span_error(error.into_inner())))
        }
    }
}
