//! Writing results: JSON or human text to stdout, files where asked.

use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::io::Write;
use std::path::Path;

/// Prints `value` as one JSON object on stdout.
pub fn print_json(value: &impl Serialize) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut stdout, value)?;
    writeln!(stdout)?;
    Ok(())
}

/// Prints text on stdout.
pub fn print_text(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    Ok(())
}

/// An export a command was asked for: its flag (`--svg`) and path.
pub type Export<'a> = (&'static str, Option<&'a Path>);

/// Refuses, before any work is done, an export path that exists or that
/// two flags share: exports never overwrite a file (the same rule as
/// `run --trace` and the profiling exports).
pub fn refuse_existing(exports: &[Export<'_>]) -> Result<()> {
    let given: Vec<(&str, &Path)> = exports
        .iter()
        .filter_map(|&(flag, path)| path.map(|p| (flag, p)))
        .collect();
    for (i, &(flag, path)) in given.iter().enumerate() {
        if path.exists() {
            bail!(
                "{} already exists; {flag} never overwrites a file: choose a new path or remove it",
                path.display()
            );
        }
        if let Some((other, _)) = given[..i].iter().find(|(_, p)| *p == path) {
            bail!(
                "{other} and {flag} both name {}: each export needs its own file",
                path.display()
            );
        }
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
    let units = [(1e15, "PB/s"), (1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s")];
    for (scale, unit) in units {
        if value >= scale {
            return format!("{:.2} {unit}", value / scale);
        }
    }
    format!("{value:.0} B/s")
}

/// Formats seconds with a unit suited to their size.
pub fn seconds(value: f64) -> String {
    if value >= 1.0 {
        format!("{value:.3} s")
    } else if value >= 1e-3 {
        format!("{:.3} ms", value * 1e3)
    } else if value >= 1e-6 {
        format!("{:.3} µs", value * 1e6)
    } else {
        format!("{:.0} ns", value * 1e9)
    }
}

/// Formats a byte count with a binary unit: `1.27 TiB`, `512 B`.
pub fn bytes(value: u64) -> String {
    let units = [
        (1u64 << 50, "PiB"),
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    for (scale, unit) in units {
        if value >= scale {
            return format!("{:.2} {unit}", value as f64 / scale as f64);
        }
    }
    format!("{value} B")
}

/// `1 step`, `2 steps`: the count and the word in the right number
/// (`plural(n, "step", "steps")`).
pub fn plural(count: u64, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
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
    fn sizes_and_counts_read_as_a_person_writes_them() {
        use super::{bytes, plural};
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1_400_156_250_112), "1.27 TiB");
        assert_eq!(bytes(10 << 20), "10.00 MiB");
        assert_eq!(plural(1, "step", "steps"), "1 step");
        assert_eq!(plural(0, "step", "steps"), "0 steps");
    }
}
