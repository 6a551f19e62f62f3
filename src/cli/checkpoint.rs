//! `optirs-tpu checkpoint ...`: save, verify, restore, list and inspect.

use super::parse::{parse_count_or_zero, usage};
use super::run::{check_ticks, print_report, step_and_report};
use super::{output, progress};
use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use optirs_tpu::Pod;
use optirs_tpu::checkpoint::{
    check_new_checkpoint, check_storage_root, engine_registry, list_checkpoints, verify_checkpoint,
    write_checkpoint,
};
use optirs_tpu::persist::SnapshotRegistry;
use optirs_tpu::topology::DEFAULT_PRESET;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args, Debug)]
pub struct CheckpointArgs {
    #[command(subcommand)]
    command: CheckpointCommand,
}

#[derive(Subcommand, Debug)]
enum CheckpointCommand {
    /// Run a pod N ticks, then write a checkpoint to DIR (atomically).
    Save {
        /// A preset name or a pod file path.
        #[arg(default_value = DEFAULT_PRESET)]
        pod: String,
        /// Ticks to run before saving: `0`, `100` or `1e3`.
        #[arg(long, default_value_t = 0, value_parser = parse_count_or_zero,
          allow_negative_numbers = true)]
        steps: u64,
        /// The checkpoint directory to create (its parent is the storage root).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Check every byte of a checkpoint; exit 0 only if it is intact.
    Verify {
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// Restore a checkpoint into a fresh pod, run M more ticks, report.
    Restore {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Ticks to run after restoring: `0`, `100` or `1e3`.
        #[arg(long, default_value_t = 0, value_parser = parse_count_or_zero,
          allow_negative_numbers = true)]
        steps: u64,
        /// Print one JSON object (the keys of `run --json`).
        #[arg(long)]
        json: bool,
    },
    /// List the checkpoints under a storage root, newest first, verified.
    List {
        /// The storage root.
        root: PathBuf,
        /// Print a JSON list.
        #[arg(long)]
        json: bool,
    },
    /// Print a checkpoint's world as RON, for people.
    Inspect {
        /// The checkpoint directory.
        dir: PathBuf,
    },
}

fn split_dir(dir: &Path) -> Result<(PathBuf, String)> {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| {
            usage(format!(
                "{} does not end in a checkpoint name",
                dir.display()
            ))
        })?
        .to_string();
    let root = dir
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let root = if root.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        root
    };
    Ok((root, name))
}

pub fn checkpoint(args: CheckpointArgs) -> Result<()> {
    let registry = engine_registry();
    match args.command {
        CheckpointCommand::Save { pod, steps, out } => save(&pod, steps, &out),
        CheckpointCommand::Verify { dir }
            if optirs_tpu::checkpoint::split::is_split_checkpoint(&dir) =>
        {
            let (manifest, snapshot) =
                optirs_tpu::checkpoint::split::read_split_checkpoint(&dir, &registry)?;
            output::print_text(&format!(
                "ok: {} at tick {}, {} parts (one per rank), world sha256 {}\n",
                manifest.pod,
                manifest.tick,
                manifest.parts.len(),
                snapshot.sha256_hex()
            ))
        }
        CheckpointCommand::Verify { dir } => {
            let (manifest, snapshot) = verify_checkpoint(&dir, &registry)?;
            output::print_text(&format!(
                "ok: {} at tick {}, {} entities, {} files, world sha256 {}\n",
                manifest.pod,
                manifest.tick,
                manifest.entities,
                manifest.files.len(),
                snapshot.sha256_hex()
            ))
        }
        CheckpointCommand::Restore { dir, steps, json } => {
            let start = Instant::now();
            let snapshot = optirs_tpu::checkpoint::split::read_any_checkpoint(&dir, &registry)?;
            let mut pod = Pod::from_snapshot(&snapshot)?;
            check_ticks("--steps", steps, pod.clock().tick_ns)?;
            let report = step_and_report(&mut pod, steps, start.elapsed().as_secs_f64(), json)?;
            print_report(&report, json)
        }
        CheckpointCommand::List { root, json } => list(&root, json, &registry),
        CheckpointCommand::Inspect { dir } => inspect(&dir, &registry),
    }
}

/// `checkpoint save`: where it goes is checked before the pod runs.
fn save(pod: &str, steps: u64, out: &Path) -> Result<()> {
    if out.symlink_metadata().is_ok() {
        return Err(usage(format!(
            "--out {} already exists: a checkpoint is written to a new directory; \
             choose a new path or remove it",
            out.display()
        )));
    }
    let (root, name) = split_dir(out)?;
    output::check_new_file("--out", out)?;
    check_new_checkpoint(&root, &name)?;
    let mut pod = Pod::load(pod)?;
    check_ticks("--steps", steps, pod.clock().tick_ns)?;
    let bar = progress::bar(steps, false, "run");
    let mut done = 0;
    while done < steps {
        let chunk = (steps - done).min(64);
        pod.run(chunk);
        done += chunk;
        bar.set_position(done);
    }
    bar.finish_and_clear();
    let snapshot = pod.snapshot()?;
    let manifest = write_checkpoint(&root, &name, &pod.topology().name, &snapshot, &mut |_| {
        Ok(())
    })?;
    let bytes: u64 = manifest.files.iter().map(|f| f.bytes).sum();
    output::print_text(&format!(
        "saved {} at tick {} ({}, {}) to {}\n",
        manifest.pod,
        manifest.tick,
        output::plural(u64::from(manifest.entities), "entity", "entities"),
        output::bytes(bytes),
        out.display()
    ))
}

/// `checkpoint list`: every checkpoint under a storage root, ok or its problem.
fn list(root: &Path, json: bool, registry: &SnapshotRegistry) -> Result<()> {
    if !check_storage_root(root)?.exists {
        return Err(usage(format!("{}: no such storage root", root.display())));
    }
    let listings = list_checkpoints(root, registry)?;
    if json {
        return output::print_json(&listings);
    }
    if listings.is_empty() {
        bail!("no checkpoints under {}", root.display());
    }
    let mut text = String::new();
    for listing in listings {
        let tick = listing.tick.map_or("?".to_string(), |t| t.to_string());
        let status = listing.problem.unwrap_or_else(|| "ok".to_string());
        text += &format!("{:<24} tick {:>12}  {status}\n", listing.name, tick);
    }
    output::print_text(&text)
}

/// `checkpoint inspect`: the verified world as RON, under its manifest.
fn inspect(dir: &Path, registry: &SnapshotRegistry) -> Result<()> {
    let (manifest, snapshot) = verify_checkpoint(dir, registry)?;
    // The manifest verified above, read again for its text.
    let manifest_path = dir.join(optirs_tpu::checkpoint::MANIFEST);
    let header = optirs_tpu::files::read_text(&manifest_path, 1 << 20, "a manifest")?;
    output::print_text(&format!(
        "// {}\n{header}\n{}",
        manifest.name,
        registry.inspect(&snapshot)?
    ))
}
