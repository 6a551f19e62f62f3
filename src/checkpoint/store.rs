//! Checkpoints on disk: a directory per checkpoint, committed atomically and
//! verified before anything is restored.
//!
//! ```text
//! ROOT/
//!   tick-000000001200/
//!     manifest.ron          human-readable: version, tick, pod, files
//!     world.bin             the WorldSnapshot's canonical bytes (postcard)
//!     tensors.safetensors   the tensor side channel (see `tensor_file`)
//!     run.ron               optional: the host's record of the run
//! ```
//!
//! The manifest lists every file with its length and SHA-256, and ends with
//! a line `// manifest-sha256: <hex>` over every byte before it, so a change
//! to any byte of the manifest — a digit, a letter's case, a space — is
//! caught as well as a change to any file.
//!
//! **Writing** goes into a fresh temporary directory beside the target
//! (`ROOT/.tmp-…`): the files are written, the manifest last, and
//! `fsync`ed together; the directory is `fsync`ed, then renamed to its
//! final name and the root `fsync`ed. A crash at any point leaves either no checkpoint of that name
//! or a complete one; stale temporary directories are never listed and are
//! removed by the next save.
//!
//! **Verifying** checks that the checkpoint is a directory holding exactly
//! its manifest and the files the manifest lists, every one a regular file
//! (an extra file, a subdirectory, a symbolic link or a named pipe is
//! refused, named, and never opened), then the manifest's own digest, its
//! format version, then every listed file's length and SHA-256, then
//! decodes the world and checks every column. Only a checkpoint that
//! passes all of it is restored.
//!
//! **Bulk bytes are touched as few times as possible** (see `hashed_io`):
//! a large file is hashed on a second thread while it is written, and read
//! in chunks that a second thread hashes while the next chunk is read; the
//! tensor file is read straight into the typed buffers the restored tensors
//! keep, and written straight from the live tensors.

use super::error::CheckpointError;
use super::hashed_io::write_hashed;
use super::read::{kind_of, read, read_tensor_file, read_verified};
use super::split::{SPLIT_MANIFEST, is_split_checkpoint, parse_split, read_split_checkpoint};
use super::tensor_file::{self, TENSOR_FILE};
use crate::persist::{FORMAT_VERSION, SnapshotRegistry, WorldSnapshot, hex};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

/// The manifest's file name.
pub const MANIFEST: &str = "manifest.ron";
/// The world file's name.
pub const WORLD_FILE: &str = "world.bin";
/// The optional file of the host's record of the run
/// ([`write_checkpoint_with`], [`read_run_record`]).
pub const RUN_FILE: &str = "run.ron";
const DIGEST_PREFIX: &str = "// manifest-sha256: ";

/// One file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// File name inside the checkpoint directory.
    pub name: String,
    /// Length in bytes.
    pub bytes: u64,
    /// SHA-256, lowercase hex.
    pub sha256: String,
}

/// What a checkpoint holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename = "Checkpoint", deny_unknown_fields)]
pub struct Manifest {
    /// Snapshot format version.
    pub format_version: u32,
    /// The checkpoint's name (its directory name).
    pub name: String,
    /// Pod name.
    pub pod: String,
    /// Tick at capture.
    pub tick: u64,
    /// Engine entities in the world.
    pub entities: u32,
    /// Files, with length and digest.
    pub files: Vec<FileEntry>,
}

/// A step of writing a checkpoint, where a crash may be injected in tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WritePoint {
    /// Creating the temporary directory.
    CreateTemp,
    /// Writing a file (its name).
    Write(String),
    /// Syncing a file (its name).
    SyncFile(String),
    /// Syncing the temporary directory.
    SyncTemp,
    /// Renaming the temporary directory into place.
    Rename,
    /// Syncing the root directory.
    SyncRoot,
}

pub(super) fn io_error(path: &Path) -> impl FnOnce(io::Error) -> CheckpointError + '_ {
    move |error| CheckpointError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// Characters that reorder how text is displayed (bidirectional
/// embeddings, overrides, isolates and marks): a name holding one can read
/// as another name.
const BIDI_CONTROLS: &[char] = &[
    '\u{061C}', '\u{200E}', '\u{200F}', '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{202E}',
    '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}',
];

/// Checks that `name` is a name the manager would write: one path
/// component that cannot leave the root, without control characters
/// (newlines included) or bidirectional controls.
pub fn check_name(name: &str) -> Result<(), CheckpointError> {
    let plain = !name.is_empty()
        && !name.starts_with('.')
        && !name.contains(['/', '\\', '\0'])
        && !name
            .chars()
            .any(|c| c.is_control() || BIDI_CONTROLS.contains(&c))
        && name != ".."
        && Path::new(name).components().count() == 1;
    if plain {
        Ok(())
    } else {
        Err(CheckpointError::BadName(name.to_string()))
    }
}

/// Renders a manifest with its trailing self-digest.
pub fn render_manifest(manifest: &Manifest) -> String {
    render_digested(manifest, DIGEST_PREFIX)
}

/// Pretty RON of `value` and a last line `PREFIX<sha256 of the RON>`: a
/// record that says when it was edited or torn.
pub(super) fn render_digested<T: Serialize>(value: &T, prefix: &str) -> String {
    let body = ron::ser::to_string_pretty(value, ron::ser::PrettyConfig::default())
        .expect("a manifest always serializes");
    let body = format!("{body}\n");
    let digest = hex(&Sha256::digest(body.as_bytes()));
    format!("{body}{prefix}{digest}\n")
}

/// The RON body of a record [`render_digested`] wrote, once its last line
/// (`PREFIX<hex>`) matches the body's digest.
fn digested_body<'a>(
    path: &Path,
    text: &'a [u8],
    prefix: &str,
) -> Result<&'a str, CheckpointError> {
    let bad = |reason: String| CheckpointError::Manifest {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::str::from_utf8(text).map_err(|_| bad("not UTF-8".into()))?;
    let body_end = text
        .trim_end_matches('\n')
        .rfind('\n')
        .map(|i| i + 1)
        .ok_or_else(|| bad("no digest line".into()))?;
    let (body, trailer) = text.split_at(body_end);
    let digest = trailer
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_suffix('\n'))
        .ok_or_else(|| bad(format!("the last line is not `{prefix}<hex>`")))?;
    let actual = hex(&Sha256::digest(body.as_bytes()));
    if digest != actual {
        return Err(bad(format!(
            "its digest line says {digest}, its contents hash to {actual} (edited or corrupted)"
        )));
    }
    Ok(body)
}

/// A record [`render_digested`] wrote, parsed once its digest line
/// matches, and refused unless `format_version` of it is this build's.
pub(super) fn parse_digested<T: serde::de::DeserializeOwned>(
    path: &Path,
    text: &[u8],
    prefix: &str,
    format_version: impl Fn(&T) -> u32,
) -> Result<T, CheckpointError> {
    let bad = |reason: String| CheckpointError::Manifest {
        path: path.to_path_buf(),
        reason,
    };
    let body = digested_body(path, text, prefix)?;
    let record: T = ron::from_str(body).map_err(|source| CheckpointError::ManifestSyntax {
        path: path.to_path_buf(),
        source,
    })?;
    let version = format_version(&record);
    if version != FORMAT_VERSION {
        return Err(bad(format!(
            "format version {version} is not supported (this build reads version \
             {FORMAT_VERSION})"
        )));
    }
    Ok(record)
}

/// Parses a manifest, checking its self-digest first.
pub fn parse_manifest(path: &Path, text: &[u8]) -> Result<Manifest, CheckpointError> {
    let bad = |reason: String| CheckpointError::Manifest {
        path: path.to_path_buf(),
        reason,
    };
    let manifest: Manifest =
        parse_digested(path, text, DIGEST_PREFIX, |m: &Manifest| m.format_version)?;
    for (i, file) in manifest.files.iter().enumerate() {
        check_name(&file.name)
            .map_err(|_| bad(format!("file name `{}` is not plain", file.name)))?;
        if file.name == MANIFEST {
            return Err(bad(format!("it lists itself (`{MANIFEST}`)")));
        }
        if manifest.files[..i].iter().any(|f| f.name == file.name) {
            return Err(bad(format!("it lists `{}` twice", file.name)));
        }
    }
    for required in [WORLD_FILE, TENSOR_FILE] {
        if !manifest.files.iter().any(|f| f.name == required) {
            return Err(bad(format!("it does not list `{required}`")));
        }
    }
    Ok(manifest)
}

/// Writes `parts` back to back as file `name`, hashing them as they are
/// written. The caller syncs it.
fn write_file(
    dir: &Path,
    name: &str,
    parts: &[&[u8]],
    hook: &mut dyn FnMut(&WritePoint) -> io::Result<()>,
) -> Result<(File, FileEntry), CheckpointError> {
    let path = dir.join(name);
    hook(&WritePoint::Write(name.to_string())).map_err(io_error(&path))?;
    let mut file = File::create(&path).map_err(io_error(&path))?;
    let digest = write_hashed(&mut file, parts).map_err(io_error(&path))?;
    let entry = FileEntry {
        name: name.to_string(),
        bytes: parts.iter().map(|p| p.len() as u64).sum(),
        sha256: hex(&digest),
    };
    Ok((file, entry))
}

/// Syncs the written files of a checkpoint at once: concurrent `fsync`s
/// share the file system's journal commits where one after another each
/// waited for its own. (They all sit in the temporary directory, which is
/// renamed only after every one is synced.)
fn sync_files(
    dir: &Path,
    files: &[(File, &str)],
    hook: &mut dyn FnMut(&WritePoint) -> io::Result<()>,
) -> Result<(), CheckpointError> {
    for (_, name) in files {
        hook(&WritePoint::SyncFile(name.to_string())).map_err(io_error(&dir.join(name)))?;
    }
    std::thread::scope(|scope| {
        let syncs: Vec<_> = files
            .iter()
            .map(|(file, name)| {
                scope.spawn(move || {
                    let path = dir.join(name);
                    file.sync_all().map_err(io_error(&path))
                })
            })
            .collect();
        syncs
            .into_iter()
            .try_for_each(|sync| sync.join().expect("fsync does not panic"))
    })
}

pub(super) fn sync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

/// Removes temporary directories that a crashed save left in `root`.
pub fn remove_stale_temporaries(root: &Path) {
    if let Ok(entries) = fs::read_dir(root) {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(".tmp-") {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// Writes `snapshot` as checkpoint `name` under `root`, atomically.
/// `hook` is called before every write, sync and rename (tests inject
/// crashes there); pass `&mut |_| Ok(())` otherwise.
pub fn write_checkpoint(
    root: &Path,
    name: &str,
    pod: &str,
    snapshot: &WorldSnapshot,
    hook: &mut dyn FnMut(&WritePoint) -> io::Result<()>,
) -> Result<Manifest, CheckpointError> {
    write_checkpoint_with(root, name, pod, snapshot, None, hook)
}

/// [`write_checkpoint`] with the host's record of the run beside the world
/// ([`RUN_FILE`], listed and digested in the manifest like every file, so
/// verification covers it); `None` writes none.
pub fn write_checkpoint_with(
    root: &Path,
    name: &str,
    pod: &str,
    snapshot: &WorldSnapshot,
    run_record: Option<&[u8]>,
    hook: &mut dyn FnMut(&WritePoint) -> io::Result<()>,
) -> Result<Manifest, CheckpointError> {
    let target = prepare_write(root, name)?;
    hook(&WritePoint::CreateTemp).map_err(io_error(root))?;
    let temp = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempdir_in(root)
        .map_err(io_error(root))?;
    let dir = temp.path();
    let (world_out, world) = write_file(dir, WORLD_FILE, &[&snapshot.to_bytes()], hook)?;
    let (header, order) = tensor_file::encode_header(&snapshot.tensors).map_err(|error| {
        CheckpointError::Snapshot {
            path: temp.path().join(TENSOR_FILE),
            error,
        }
    })?;
    let mut parts: Vec<&[u8]> = Vec::with_capacity(order.len() + 1);
    parts.push(&header);
    parts.extend(order.iter().map(|&i| &*snapshot.tensors[i].data));
    let (tensors_out, tensors) = write_file(dir, TENSOR_FILE, &parts, hook)?;
    let mut files = vec![(world_out, WORLD_FILE), (tensors_out, TENSOR_FILE)];
    let mut entries = vec![world, tensors];
    if let Some(record) = run_record {
        let (out, entry) = write_file(dir, RUN_FILE, &[record], hook)?;
        files.push((out, RUN_FILE));
        entries.push(entry);
    }
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        name: name.to_string(),
        pod: pod.to_string(),
        tick: snapshot.tick,
        entities: snapshot.entity_count,
        files: entries,
    };
    let manifest_text = render_manifest(&manifest);
    let (manifest_out, _) = write_file(dir, MANIFEST, &[manifest_text.as_bytes()], hook)?;
    files.push((manifest_out, MANIFEST));
    sync_files(dir, &files, hook)?;
    drop(files);
    hook(&WritePoint::SyncTemp).map_err(io_error(temp.path()))?;
    sync_dir(temp.path()).map_err(io_error(temp.path()))?;
    hook(&WritePoint::Rename).map_err(io_error(&target))?;
    let temp_path = temp.keep();
    if let Err(error) = fs::rename(&temp_path, &target) {
        let _ = fs::remove_dir_all(&temp_path);
        return Err(CheckpointError::Io {
            path: target,
            error,
        });
    }
    hook(&WritePoint::SyncRoot).map_err(io_error(root))?;
    sync_dir(root).map_err(io_error(root))?;
    Ok(manifest)
}

/// Checks that `root` can be a storage root: it is a directory, or it does
/// not exist and no entry on the way to it is anything but a directory.
fn check_root_path(root: &Path) -> Result<bool, CheckpointError> {
    for (depth, path) in root.ancestors().enumerate() {
        if path.as_os_str().is_empty() {
            continue;
        }
        match fs::metadata(path) {
            Ok(metadata) if metadata.is_dir() => return Ok(depth == 0),
            Ok(metadata) => {
                return Err(CheckpointError::RootNotDirectory {
                    path: path.to_path_buf(),
                    found: kind_of(&metadata.file_type()),
                });
            }
            // Not there, or under a file: an ancestor says which.
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                continue;
            }
            Err(error) => return Err(io_error(path)(error)),
        }
    }
    Ok(false)
}

/// A storage root as [`check_storage_root`] found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StorageRoot {
    /// The root.
    pub path: PathBuf,
    /// Whether it exists yet (a save creates it).
    pub exists: bool,
    /// Its checkpoints (directories whose manifest, or split commit
    /// record, parses), newest recorded tick first: (name, tick).
    pub checkpoints: Vec<(String, u64)>,
}

impl StorageRoot {
    /// The newest checkpoint's path, if there is one.
    pub fn newest(&self) -> Option<PathBuf> {
        self.checkpoints
            .first()
            .map(|(name, _)| self.path.join(name))
    }
}

/// Checks a storage root before any work is done: a path that is (or runs
/// through) a regular file, a pipe or a device is an error naming it, and a
/// directory is listed — how many checkpoints it holds, the newest first
/// (by their manifests, not verified: [`list_checkpoints`] verifies). A
/// root that does not exist yet is fine: a save creates it.
pub fn check_storage_root(root: &Path) -> Result<StorageRoot, CheckpointError> {
    let exists = check_root_path(root)?;
    let mut checkpoints = Vec::new();
    if exists {
        for entry in fs::read_dir(root).map_err(io_error(root))? {
            let entry = entry.map_err(io_error(root))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if let Some(tick) = recorded_tick(&entry.path()) {
                checkpoints.push((name, tick));
            }
        }
    }
    checkpoints.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
    Ok(StorageRoot {
        path: root.to_path_buf(),
        exists,
        checkpoints,
    })
}

/// The tick the manifest (or split commit record) in `dir` records, if it
/// parses: whether `dir` is a checkpoint, without reading its data.
fn recorded_tick(dir: &Path) -> Option<u64> {
    let split = dir.join(SPLIT_MANIFEST);
    if let Ok(text) = read(&split) {
        return parse_split(&split, &text).ok().map(|m| m.tick);
    }
    let path = dir.join(MANIFEST);
    parse_manifest(&path, &read(&path).ok()?)
        .ok()
        .map(|m| m.tick)
}

/// Checks, creating nothing, that checkpoint `name` can be written under
/// `root`: a plain name, a root that is a directory or can be created, and
/// nothing at the target (a checkpoint there is [`CheckpointError::Exists`],
/// anything else [`CheckpointError::Occupied`]). Returns the target path.
/// A command calls it before any work; the save checks again.
pub fn check_new_checkpoint(root: &Path, name: &str) -> Result<PathBuf, CheckpointError> {
    check_name(name)?;
    check_root_path(root)?;
    let target = root.join(name);
    let Ok(metadata) = fs::symlink_metadata(&target) else {
        return Ok(target);
    };
    if metadata.is_dir() && recorded_tick(&target).is_some() {
        return Err(CheckpointError::Exists { path: target });
    }
    let found = if metadata.is_dir() {
        "a directory without a manifest"
    } else {
        kind_of(&metadata.file_type())
    };
    Err(CheckpointError::Occupied {
        path: target,
        found,
    })
}

/// The start of every checkpoint write, one process's or a split pod's:
/// [`check_new_checkpoint`], then the root created and the temporaries a
/// crashed save left in it removed. Returns the checkpoint's path.
pub(super) fn prepare_write(root: &Path, name: &str) -> Result<PathBuf, CheckpointError> {
    let target = check_new_checkpoint(root, name)?;
    fs::create_dir_all(root).map_err(io_error(root))?;
    remove_stale_temporaries(root);
    Ok(target)
}

/// Why `dir`, a directory without a manifest, is not a checkpoint: it is a
/// storage root (naming its newest checkpoint), or it is not one at all.
fn not_a_checkpoint(dir: &Path) -> CheckpointError {
    // A split pod's commit record that is not a regular file (its parts
    // would make the directory look like a storage root).
    let record = dir.join(SPLIT_MANIFEST);
    if let Ok(metadata) = fs::symlink_metadata(&record)
        && !metadata.is_file()
    {
        return CheckpointError::NotRegular {
            path: record,
            found: kind_of(&metadata.file_type()),
            expected: "a regular file",
        };
    }
    match check_storage_root(dir) {
        Ok(root) if !root.checkpoints.is_empty() => CheckpointError::StorageRoot {
            path: dir.to_path_buf(),
            count: root.checkpoints.len(),
            newest: root.newest().unwrap_or_default(),
        },
        _ => CheckpointError::NotACheckpoint {
            path: dir.to_path_buf(),
        },
    }
}

/// Checks that `dir` is a directory (not a link to one).
fn check_directory(dir: &Path) -> Result<(), CheckpointError> {
    match fs::symlink_metadata(dir) {
        Ok(metadata) if metadata.is_dir() => Ok(()),
        Ok(metadata) => Err(CheckpointError::NotRegular {
            path: dir.to_path_buf(),
            found: kind_of(&metadata.file_type()),
            expected: "a checkpoint directory",
        }),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            Err(CheckpointError::NoDirectory {
                path: dir.to_path_buf(),
            })
        }
        Err(error) => Err(io_error(dir)(error)),
    }
}

/// Checks that `dir` holds exactly the manifest and the files it lists,
/// each a regular file (by its own metadata: a link is not followed).
/// Listed files that are missing are reported when they are read.
fn check_contents(dir: &Path, manifest: &Manifest) -> Result<(), CheckpointError> {
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_error(dir))? {
        let entry = entry.map_err(io_error(dir))?;
        entries.push((entry.file_name(), entry.file_type().map_err(io_error(dir))?));
    }
    // In name order, so the entry reported is the same on every run.
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, file_type) in entries {
        let path = dir.join(&name);
        let listed = name
            .to_str()
            .is_some_and(|name| name == MANIFEST || manifest.files.iter().any(|f| f.name == name));
        if !listed {
            return Err(CheckpointError::Unlisted { path });
        }
        super::read::check_regular(&path, &file_type)?;
    }
    Ok(())
}

/// Checks every byte of the checkpoint in `dir` and decodes its world.
/// Nothing is restored; the caller decides what to do with the snapshot.
///
/// A checkpoint is exactly its manifest's files, regular files, inside its
/// directory: anything else in the directory, and any entry that is not a
/// regular file, is an error naming it.
pub fn verify_checkpoint(
    dir: &Path,
    registry: &SnapshotRegistry,
) -> Result<(Manifest, WorldSnapshot), CheckpointError> {
    check_directory(dir)?;
    let manifest_path = dir.join(MANIFEST);
    let text = match read(&manifest_path) {
        Err(CheckpointError::Missing { .. }) => return Err(not_a_checkpoint(dir)),
        other => other?,
    };
    let manifest = parse_manifest(&manifest_path, &text)?;
    check_contents(dir, &manifest)?;
    let mut world_bytes = None;
    let mut tensors = None;
    for entry in &manifest.files {
        let path = dir.join(&entry.name);
        match entry.name.as_str() {
            WORLD_FILE => world_bytes = Some(read_verified(&path, entry)?),
            TENSOR_FILE => tensors = Some(read_tensor_file(&path, entry)?),
            _ => drop(read_verified(&path, entry)?),
        }
    }
    let tensors = tensors.expect("parse_manifest requires the tensor file");
    let world_path = dir.join(WORLD_FILE);
    let snapshot_error = |error| CheckpointError::Snapshot {
        path: world_path.clone(),
        error,
    };
    let bytes = world_bytes.expect("parse_manifest requires the world file");
    let snapshot = WorldSnapshot::from_parts(&bytes, tensors).map_err(snapshot_error)?;
    registry.verify(&snapshot).map_err(snapshot_error)?;
    if snapshot.tick != manifest.tick || snapshot.entity_count != manifest.entities {
        return Err(CheckpointError::Manifest {
            path: manifest_path,
            reason: format!(
                "it says tick {} and {} entities; the world holds tick {} and {} entities",
                manifest.tick, manifest.entities, snapshot.tick, snapshot.entity_count
            ),
        });
    }
    Ok((manifest, snapshot))
}

/// The host's record of the run in the checkpoint `dir` whose `manifest`
/// has been verified ([`verify_checkpoint`]), read and checked against its
/// digest again; `None` if the checkpoint holds none.
pub fn read_run_record(
    dir: &Path,
    manifest: &Manifest,
) -> Result<Option<Vec<u8>>, CheckpointError> {
    manifest
        .files
        .iter()
        .find(|f| f.name == RUN_FILE)
        .map(|entry| read_verified(&dir.join(RUN_FILE), entry))
        .transpose()
}

/// A checkpoint found under a root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckpointListing {
    /// Directory name.
    pub name: String,
    /// Full path.
    pub path: PathBuf,
    /// Tick, when the manifest could be read.
    pub tick: Option<u64>,
    /// `None` when it verifies; otherwise why not.
    pub problem: Option<String>,
}

/// Every checkpoint directory under `root` (temporaries excluded), newest
/// tick first; unreadable ones last. Each is fully verified (a split pod's
/// checkpoint by its commit record and every part).
pub fn list_checkpoints(
    root: &Path,
    registry: &SnapshotRegistry,
) -> Result<Vec<CheckpointListing>, CheckpointError> {
    let mut listings = Vec::new();
    for entry in fs::read_dir(root).map_err(io_error(root))? {
        let entry = entry.map_err(io_error(root))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // A link is listed (and refused by verification), never followed.
        let file_type = entry.file_type().map_err(io_error(root))?;
        if name.starts_with('.') || !(file_type.is_dir() || file_type.is_symlink()) {
            continue;
        }
        let path = entry.path();
        let (tick, problem) = if file_type.is_dir() && is_split_checkpoint(&path) {
            match read_split_checkpoint(&path, registry) {
                Ok((manifest, _)) => (Some(manifest.tick), None),
                Err(error) => {
                    let record = path.join(SPLIT_MANIFEST);
                    let tick = read(&record)
                        .ok()
                        .and_then(|text| parse_split(&record, &text).ok())
                        .map(|m| m.tick);
                    (tick, Some(error.to_string()))
                }
            }
        } else {
            match verify_checkpoint(&path, registry) {
                Ok((manifest, _)) => (Some(manifest.tick), None),
                Err(error) => {
                    let tick = (file_type.is_dir())
                        .then(|| read(&path.join(MANIFEST)).ok())
                        .flatten()
                        .and_then(|text| parse_manifest(&path, &text).ok())
                        .map(|m| m.tick);
                    (tick, Some(error.to_string()))
                }
            }
        };
        listings.push(CheckpointListing {
            name,
            path: entry.path(),
            tick,
            problem,
        });
    }
    listings.sort_by(|a, b| b.tick.cmp(&a.tick).then_with(|| b.name.cmp(&a.name)));
    Ok(listings)
}
