//! Writing results: JSON or human text to stdout, files where asked.

use super::parse::{number, usage};
use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::io::Write;
use std::path::Path;

/// Prints `value` as one JSON object on stdout, with every `-0.0` written
/// as `0.0`: a sign on zero is an artefact of the arithmetic (a negated or
/// rounded nothing), never a figure a reader should see.
pub fn print_json(value: &impl Serialize) -> Result<()> {
    let text = unsign_zeros(&serde_json::to_string_pretty(value)?);
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    writeln!(stdout)?;
    Ok(())
}

/// JSON text with each number token `-0.0` (how serde_json writes a
/// negative zero) turned into `0.0`; strings are left as they are.
fn unsign_zeros(json: &str) -> String {
    let bytes = json.as_bytes();
    let mut out = String::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else if b == b'"' {
            in_string = true;
        } else if b == b'-'
            && bytes[i + 1..].starts_with(b"0.0")
            && !bytes
                .get(i + 4)
                .is_some_and(|c| c.is_ascii_digit() || matches!(c, b'e' | b'E' | b'.'))
        {
            out.push_str(&json[start..i]);
            start = i + 1;
        }
    }
    out.push_str(&json[start..]);
    out
}

/// Prints text on stdout.
pub fn print_text(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    Ok(())
}

/// An export a command was asked for: its flag (`--svg`) and path.
pub type Export<'a> = (&'static str, Option<&'a Path>);

/// Refuses, before any work is done, an export path a command could not
/// write at the end: one that exists (exports never overwrite a file), that
/// two flags share, whose directory does not exist, or where this process
/// cannot create a file. Each is a bad command-line value (exit code 2).
pub fn refuse_existing(exports: &[Export<'_>]) -> Result<()> {
    let given: Vec<(&str, &Path)> = exports
        .iter()
        .filter_map(|&(flag, path)| path.map(|p| (flag, p)))
        .collect();
    for (i, &(flag, path)) in given.iter().enumerate() {
        if let Some((other, _)) = given[..i].iter().find(|(_, p)| *p == path) {
            return Err(usage(format!(
                "{other} and {flag} both name {}: each export needs its own file",
                path.display()
            )));
        }
        check_new_file(flag, path)?;
    }
    Ok(())
}

/// Refuses `path` for `flag` unless a new file can be created there: it
/// does not exist yet, its directory does, and a file can be created in
/// that directory (tried with a probe file that is removed at once).
pub fn check_new_file(flag: &str, path: &Path) -> Result<()> {
    if path.is_dir() {
        return Err(usage(format!(
            "{flag} {}: is a directory; {flag} writes a new file: give a file's path",
            path.display()
        )));
    }
    if path.symlink_metadata().is_ok() {
        return Err(usage(format!(
            "{} already exists; {flag} never overwrites a file: choose a new path or remove it",
            path.display()
        )));
    }
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    if parent.exists() && !parent.is_dir() {
        return Err(usage(format!(
            "{flag} {}: {} is not a directory",
            path.display(),
            parent.display()
        )));
    }
    if !parent.is_dir() {
        return Err(usage(format!(
            "{flag} {}: the directory {} does not exist",
            path.display(),
            parent.display()
        )));
    }
    if let Err(error) = tempfile::Builder::new()
        .prefix(".optirs-tpu-probe-")
        .tempfile_in(parent)
    {
        return Err(usage(format!(
            "{flag} {}: cannot create a file in {}: {}",
            path.display(),
            parent.display(),
            cannot_create(&error)
        )));
    }
    Ok(())
}

/// Refuses `dir` for `flag` (a directory a command writes into, created
/// if missing) unless files can be created in it: it is a directory or
/// does not exist yet, and the nearest existing directory on its path
/// takes a new file (tried with a probe file that is removed at once).
pub fn check_dir(flag: &str, dir: &Path) -> Result<()> {
    if dir.exists() && !dir.is_dir() {
        return Err(usage(format!(
            "{flag} {}: exists and is not a directory",
            dir.display()
        )));
    }
    let existing = dir
        .ancestors()
        .find(|a| !a.as_os_str().is_empty() && a.exists())
        .unwrap_or(Path::new("."));
    if !existing.is_dir() {
        return Err(usage(format!(
            "{flag} {}: {} is not a directory",
            dir.display(),
            existing.display()
        )));
    }
    if let Err(error) = tempfile::Builder::new()
        .prefix(".optirs-tpu-probe-")
        .tempfile_in(existing)
    {
        return Err(usage(format!(
            "{flag} {}: cannot create a file in {}: {}",
            dir.display(),
            existing.display(),
            cannot_create(&error)
        )));
    }
    Ok(())
}

/// Writes `contents` for `flag` into a new file at `path`: `create_new`, so
/// a file that appeared since [`refuse_existing`] is not replaced either.
pub fn write_new(flag: &str, path: &Path, contents: &str) -> Result<()> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path);
    let mut file = match file {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => bail!(
            "{} already exists; {flag} never overwrites a file: choose a new path or remove it",
            path.display()
        ),
        other => other.with_context(|| format!("cannot write {}", path.display()))?,
    };
    file.write_all(contents.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// The error with its causes, `outer: cause: root`, each said once: a cause
/// whose text the message already contains is skipped (many errors show
/// their source in their own message and also return it as `source()`,
/// which printed "Is a directory (os error 21): Is a directory (os error
/// 21)").
pub fn error_message(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if cause.is_empty() || text.contains(&cause) {
            continue;
        }
        text.push_str(": ");
        text.push_str(&cause);
    }
    text
}

/// Whether the error chain ends in a closed pipe (`optirs-tpu ... | head`).
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || cause
                .downcast_ref::<serde_json::Error>()
                .and_then(|json| json.io_error_kind())
                == Some(std::io::ErrorKind::BrokenPipe)
    })
}

/// Formats a byte rate with a decimal unit: `1.60 TB/s`.
pub fn bytes_per_s(value: f64) -> String {
    if value >= 1e18 {
        return format!("{} PB/s", number(value / 1e15));
    }
    let units = [(1e15, "PB/s"), (1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s")];
    for (scale, unit) in units {
        if value >= scale {
            return format!("{:.2} {unit}", value / scale);
        }
    }
    format!("{:.0} B/s", value.max(0.0))
}

/// Formats seconds with a unit suited to their size; beyond a billion
/// seconds in scientific notation (`1.84e19 s`), never `-0`.
pub fn seconds(value: f64) -> String {
    if !value.is_finite() || value.abs() >= 1e9 {
        format!("{} s", number(value))
    } else if value.abs() >= 1.0 {
        format!("{value:.3} s")
    } else if value.abs() >= 1e-3 {
        format!("{:.3} ms", value * 1e3)
    } else if value.abs() >= 1e-6 {
        format!("{:.3} µs", value * 1e6)
    } else if (value * 1e9).abs() < 0.5 {
        "0 ns".to_string()
    } else {
        format!("{:.0} ns", value * 1e9)
    }
}

/// Tokens a second (a chip's): whole above 10, three decimals below.
pub fn tokens_per_s(t: f64) -> String {
    if t >= 10.0 {
        format!("{t:.0}")
    } else {
        format!("{t:.3}")
    }
}

/// Memory sizes in binary units, the one formatter (see `optirs_tpu::units`).
pub use optirs_tpu::units::bytes;

/// `1 step`, `2 steps`: the count and the word in the right number
/// (`plural(n, "step", "steps")`).
pub fn plural(count: u64, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

/// Refuses an output file whose directory does not exist (or is not a
/// directory), before any work: the write at the end would fail.
pub fn refuse_missing_parent(flag: &str, path: &Path) -> Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match std::fs::metadata(parent) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(usage(format!(
            "{flag} {}: {} is a file, not a directory",
            path.display(),
            parent.display()
        ))),
        Err(_) => Err(usage(format!(
            "{flag} {}: the directory {} does not exist",
            path.display(),
            parent.display()
        ))),
    }
}

/// Refuses a directory flag naming something that is not a directory, or
/// that cannot be created because a file stands where one of its parents
/// should be.
pub fn refuse_non_directory(flag: &str, dir: &Path) -> Result<()> {
    for existing in dir.ancestors().filter(|a| !a.as_os_str().is_empty()) {
        let Ok(meta) = std::fs::metadata(existing) else {
            continue;
        };
        if meta.is_dir() {
            return Ok(());
        }
        return Err(usage(if existing == dir {
            format!("{flag} {}: is a file, not a directory", dir.display())
        } else {
            format!(
                "{flag} {}: cannot be created: {} is a file, not a directory",
                dir.display(),
                existing.display()
            )
        }));
    }
    Ok(())
}

/// Refuses `path` for `flag` (an input the command reads: `what`, such as
/// `checkpoint directory`) when nothing exists there.
pub fn refuse_missing(flag: &str, path: &Path, what: &str) -> Result<()> {
    if path.symlink_metadata().is_err() {
        return Err(usage(format!("{flag} {}: no such {what}", path.display())));
    }
    Ok(())
}

/// Why a file could not be created, in words: a directory that takes no
/// new files at all (`/proc`) says "not found", which reads as if the
/// directory were missing.
fn cannot_create(error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::NotFound => "it takes no new files".to_string(),
        kind => std::io::Error::from(kind).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::error_message;

    #[derive(Debug, thiserror::Error)]
    #[error("{path}: {source}")]
    struct ShowsItsSource {
        path: String,
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn each_cause_is_said_once() {
        let io = std::io::Error::new(std::io::ErrorKind::IsADirectory, "Is a directory");
        let error = anyhow::Error::new(ShowsItsSource {
            path: "/tmp".into(),
            source: io,
        })
        .context("cannot read /tmp");
        assert_eq!(
            error_message(&error),
            "cannot read /tmp: /tmp: Is a directory"
        );
        let plain = anyhow::anyhow!("root").context("middle").context("outer");
        assert_eq!(error_message(&plain), "outer: middle: root");
    }

    #[test]
    fn zeros_and_huge_times_read_plainly() {
        use super::{seconds, unsign_zeros};
        assert_eq!(seconds(1.8446744073709552e19), "1.84e19 s");
        assert_eq!(seconds(-0.0), "0 ns");
        assert_eq!(seconds(1e-12), "0 ns");
        assert_eq!(seconds(0.25), "250.000 ms");
        let json = r#"{"a": -0.0, "b": [-0.0, -0.05, -0.0e1], "c": "x -0.0 y", "d": -10.0}"#;
        assert_eq!(
            unsign_zeros(json),
            r#"{"a": 0.0, "b": [0.0, -0.05, -0.0e1], "c": "x -0.0 y", "d": -10.0}"#
        );
    }

    #[test]
    fn sizes_and_counts_read_as_a_person_writes_them() {
        use super::{bytes, plural};
        assert_eq!(bytes(512u64), "512 B");
        assert_eq!(bytes(1_400_156_250_112u64), "1.27 TiB");
        assert_eq!(bytes(10u64 << 20), "10.00 MiB");
        // A model's traffic past 2^64 bytes.
        assert_eq!(bytes(5u128 << 60), "5.00 EiB");
        assert_eq!(bytes(3u128 << 70), "3.00 ZiB");
        assert_eq!(plural(1, "step", "steps"), "1 step");
        assert_eq!(plural(0, "step", "steps"), "0 steps");
    }
}
