//! A training run's report: what [`Outcome::report`] makes of the steps
//! (the median step and phases, failures, recoveries by part, checkpoint
//! writes, where the simulated time went and the goodput), and the text
//! pieces every printout of a run shares.

use std::collections::BTreeMap;

use ndarray::IxDyn;
use serde::Serialize;

use crate::error::Result;
use crate::optimizers::Optimizer;
use crate::sharding::RecoveryPolicy;
use crate::sharding::RecoveryRecord;
use crate::sharding::ledger::TimeParts;

use super::run::{FailureRow, Outcome, RunPlan};
use super::{ShardedOptimizer, ShardedStepReport, WriteOutcome};

/// A recovery as the report shows it, its time broken into its parts.
#[derive(Serialize, Debug)]
pub struct RecoveryRow {
    /// The policy that ran.
    pub policy: String,
    /// The step whose failure it recovered.
    pub failed_step: u64,
    /// The devices lost.
    pub lost_devices: Vec<u32>,
    /// Completed steps it took back (a rollback's).
    pub lost_steps: u64,
    /// When the recovery started (the failure seen).
    pub started_at_seconds: f64,
    /// The sum of the three parts below.
    pub recovery_seconds: f64,
    /// Reading the checkpoint restored (rollback, spare-cube).
    pub read_seconds: f64,
    /// The optical switches swapping cubes (spare-cube).
    pub reconfigure_seconds: f64,
    /// Moving the new state shards to their devices.
    pub reshard_seconds: f64,
    /// `[failed, spare]` cubes swapped (spare-cube only).
    pub swapped_cubes: Vec<[u32; 2]>,
    /// Why the policy that ran is not the one asked for, if it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The report of a training run (`train`'s text and JSON).
#[derive(Serialize, Debug)]
pub struct TrainReport {
    /// The pod's name.
    pub pod: String,
    /// Its devices, one a chip (`chips` in JSON, as in every command's).
    #[serde(rename = "chips")]
    pub devices: u32,
    /// Devices the model spans at the end.
    #[serde(rename = "chips_at_end")]
    pub devices_at_end: usize,
    /// The optimizer.
    pub optimizer: String,
    /// Parameters.
    pub params: usize,
    /// Tensors.
    pub tensors: usize,
    /// Buckets.
    pub buckets: usize,
    /// Bytes per bucket.
    pub bucket_bytes: usize,
    /// How the model is split over the mesh.
    pub strategy: crate::sharding::Strategy,
    /// The mesh the run is laid out on (`data=1,fsdp=16,tensor=1`).
    pub mesh: String,
    /// Steps completed.
    pub steps_completed: u64,
    /// Steps attempted (failed ones included).
    pub steps_attempted: u64,
    /// The median step's modeled seconds (`step_seconds` in JSON, as in
    /// `--model`'s and the modeled reports).
    #[serde(rename = "step_seconds")]
    pub step_modeled_seconds: f64,
    /// Median modeled seconds per phase.
    pub phases: BTreeMap<String, f64>,
    /// The most HBM any device used in a step.
    pub hbm_bytes_per_device: u64,
    /// Bytes the steps put on the links.
    pub link_bytes: u64,
    /// The same by phase, over every step.
    pub phase_bytes: BTreeMap<String, u64>,
    /// Per physical axis (`axis0`, `dcn`; `snake_ring` for the redundant
    /// copies): the median step's seconds its passes last and the run's
    /// bytes over its links.
    pub axes: BTreeMap<String, AxisReport>,
    /// Failed attempts.
    pub failures: Vec<FailureRow>,
    /// Recoveries.
    pub recoveries: Vec<RecoveryRow>,
    /// Productive step time over simulated time, each step's own.
    pub goodput: f64,
    /// Simulated time of the run, seconds.
    pub simulated_seconds: f64,
    /// Where the simulated time went.
    pub time: TimeReport,
    /// The same, in nanoseconds: the parts add up to `total_ns` exactly.
    pub time_ns: TimeParts,
    /// Checkpoint writes at step boundaries (none in a split run, whose
    /// periodic checkpoints take no simulated time).
    pub checkpoints: Option<CheckpointsReport>,
    /// The checkpoint this run resumed from.
    pub resumed_from: Option<ResumedRow>,
    /// This process's part of a resumed run (the fields above count the
    /// whole run from its start); absent for a run that did not resume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segment: Option<SegmentReport>,
    /// The pod's tick, ns.
    pub tick_ns: u64,
    /// Wall time of the steps, seconds.
    pub wall_seconds: f64,
    /// Wall time per attempt, seconds.
    pub wall_seconds_per_step: f64,
    /// Wall time compiling the update, seconds.
    pub compile_seconds: f64,
    /// SHA-256 of the world at the end.
    pub world_sha256: String,
    /// Processes the pod ran on (`mpirun -n R`; 1 without).
    pub ranks: u32,
}

/// An axis's share of a run: seconds of the median step, bytes of all.
#[derive(Serialize, Debug, Clone, Copy, Default, PartialEq)]
pub struct AxisReport {
    /// Seconds its passes last in the median step (passes of a round on
    /// other axes run at the same time).
    pub seconds: f64,
    /// Bytes over its links in the run.
    pub link_bytes: u64,
}

/// Every step's bytes by phase, summed.
fn phase_bytes(reports: &[ShardedStepReport]) -> BTreeMap<String, u64> {
    let mut total = BTreeMap::new();
    for (k, b) in reports.iter().flat_map(|r| &r.phase_bytes) {
        *total.entry(k.clone()).or_insert(0) += b;
    }
    total
}

/// The physical axis a phase key runs on: `reduce_scatter.axis0` on
/// `axis0`, `all_gather.dcn` on `dcn`, `replicate_state` on the snake
/// ring; none for the update and the totals.
fn axis_of_phase(key: &str) -> Option<&str> {
    if key == "replicate_state" {
        return Some("snake_ring");
    }
    let (kind, axis) = key.split_once('.')?;
    matches!(kind, "reduce_scatter" | "all_gather").then_some(axis)
}

/// Per physical axis, from the median phases and the run's bytes.
fn axes_of(
    phases: &BTreeMap<String, f64>,
    bytes: &BTreeMap<String, u64>,
) -> BTreeMap<String, AxisReport> {
    let mut axes: BTreeMap<String, AxisReport> = BTreeMap::new();
    for (k, s) in phases {
        if let Some(axis) = axis_of_phase(k) {
            axes.entry(axis.to_string()).or_default().seconds += s;
        }
    }
    for (k, b) in bytes {
        if let Some(axis) = axis_of_phase(k) {
            axes.entry(axis.to_string()).or_default().link_bytes += b;
        }
    }
    axes
}

/// The median of `v`: the middle value, or the mean of the two middle
/// values of an even count; 0 for none. The one median the crate's
/// reports use (a step's modeled time and phases, benchmark figures).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Where the run's simulated time went, seconds (the parts add up to
/// `simulated_seconds`; `time_ns` has them exactly).
#[derive(Serialize, Debug)]
pub struct TimeReport {
    /// In steps that count.
    pub productive_seconds: f64,
    /// In steps a rollback undid.
    pub undone_steps_seconds: f64,
    /// In steps a failure cut off.
    pub cut_off_steps_seconds: f64,
    /// Writing checkpoints.
    pub checkpoint_write_seconds: f64,
    /// Recovering.
    pub recovery_seconds: f64,
    /// Everything else (waiting).
    pub other_seconds: f64,
}

/// The run's checkpoint writes at step boundaries.
#[derive(Serialize, Debug)]
pub struct CheckpointsReport {
    /// One write (or a rollback's read), modeled seconds.
    pub io_seconds: f64,
    /// Writes that reached disk.
    pub written: usize,
    /// Writes a lost device cut short: nothing reached disk.
    pub voided: usize,
    /// What retention could not do (each names the path).
    pub retention_problems: Vec<String>,
}

/// The part of a resumed run this process ran, from the checkpoint on.
#[derive(Serialize, Debug)]
pub struct SegmentReport {
    /// Steps completed in it.
    pub steps_completed: u64,
    /// Steps attempted in it (failed ones included).
    pub steps_attempted: u64,
    /// When it started (the checkpoint's time), seconds.
    pub started_at_seconds: f64,
    /// Its simulated time (waiting out the checkpoint's write first),
    /// seconds.
    pub simulated_seconds: f64,
    /// Productive step time over its simulated time.
    pub goodput: f64,
    /// Where its simulated time went, ns.
    pub time_ns: TimeParts,
}

/// The checkpoint a resumed run started from.
#[derive(Serialize, Debug)]
pub struct ResumedRow {
    /// Its directory.
    pub path: String,
    /// The steps it held.
    pub steps_completed: u64,
    /// Its simulated time, seconds.
    pub at_seconds: f64,
    /// Newer checkpoints that did not verify, passed over and left on
    /// disk as they were.
    pub skipped: Vec<SkippedRow>,
}

/// A checkpoint a resume passed over.
#[derive(Serialize, Debug)]
pub struct SkippedRow {
    /// Its directory.
    pub path: String,
    /// Why it did not verify.
    pub problem: String,
}

impl Outcome {
    /// The run's checkpoint writes as (start ns, seconds), for the trace.
    pub fn checkpoint_write_spans(&self) -> Vec<(u64, f64)> {
        self.writes
            .iter()
            .map(|w| {
                let ns = w.ended_at_ns.saturating_sub(w.started_at_ns);
                (w.started_at_ns, ns as f64 * 1e-9)
            })
            .collect()
    }

    /// The report of the run, with the world's digest (a split run's is
    /// the merged world's) and the rank count.
    pub fn report<O: Optimizer<f32, IxDyn>>(
        &self,
        opt: &ShardedOptimizer<O>,
        plan: &RunPlan,
        world_sha256: String,
        ranks: u32,
    ) -> Result<TrainReport> {
        let reports = &self.reports;
        let parts = self.whole.as_ref().unwrap_or(&self.ledger).parts();
        let simulated_seconds = parts.total_ns as f64 * 1e-9;
        let step_modeled_seconds = median(reports.iter().map(|r| r.modeled_seconds).collect());
        let phases = median_phases(reports);
        let run_phase_bytes = phase_bytes(reports);
        let axes = axes_of(&phases, &run_phase_bytes);
        let layout = opt.layout()?.clone();
        let seconds = |ns: u64| ns as f64 * 1e-9;
        let checkpoints = self.checkpoints_report(opt)?;
        Ok(TrainReport {
            pod: opt.pod().topology().name.clone(),
            devices: opt.pod().topology().num_devices(),
            devices_at_end: layout.devices(),
            optimizer: plan.optimizer.clone(),
            params: layout.elements,
            tensors: layout.tensors.len(),
            buckets: layout.buckets.len(),
            bucket_bytes: opt.sharding().bucket_bytes,
            strategy: opt.sharding().strategy,
            mesh: opt
                .sharding()
                .mesh
                .and_then(|sizes| sizes.lay_out(opt.pod().topology()).ok())
                .unwrap_or_else(|| crate::sharding::Mesh::default_for(opt.pod().topology()))
                .to_string(),
            steps_completed: opt.steps_completed(),
            steps_attempted: self.earlier_attempts + self.attempts,
            step_modeled_seconds,
            phases,
            hbm_bytes_per_device: reports
                .iter()
                .flat_map(|r| r.hbm_bytes_per_device.iter().map(|&(_, b)| b))
                .max()
                .unwrap_or(0),
            link_bytes: reports.iter().map(|r| r.link_bytes).sum(),
            phase_bytes: run_phase_bytes,
            axes,
            failures: self.failures.clone(),
            recoveries: recovery_rows(opt),
            goodput: parts.goodput(),
            simulated_seconds,
            time: TimeReport {
                productive_seconds: seconds(parts.productive_ns),
                undone_steps_seconds: seconds(parts.undone_ns),
                cut_off_steps_seconds: seconds(parts.cut_off_ns),
                checkpoint_write_seconds: seconds(parts.checkpoint_write_ns),
                recovery_seconds: seconds(parts.recovery_ns),
                other_seconds: seconds(parts.other_ns),
            },
            time_ns: parts,
            checkpoints,
            resumed_from: self.resumed.as_ref().map(|r| ResumedRow {
                path: r.path.display().to_string(),
                steps_completed: r.steps_completed,
                at_seconds: r.at_ns as f64 * 1e-9,
                skipped: r
                    .skipped
                    .iter()
                    .map(|s| SkippedRow {
                        path: s.path.display().to_string(),
                        problem: s.problem.clone(),
                    })
                    .collect(),
            }),
            segment: self.segment_report(),
            tick_ns: opt.pod().clock().tick_ns,
            wall_seconds: self.wall_seconds,
            wall_seconds_per_step: self.wall_seconds / self.attempts.max(1) as f64,
            compile_seconds: opt.compile_seconds(),
            world_sha256,
            ranks,
        })
    }
}

impl Outcome {
    /// This segment's figures, for a resumed run.
    fn segment_report(&self) -> Option<SegmentReport> {
        let resumed = self.resumed.as_ref()?;
        let parts = self.ledger.parts();
        Some(SegmentReport {
            steps_completed: self.reports.len() as u64,
            steps_attempted: self.attempts,
            started_at_seconds: resumed.at_ns as f64 * 1e-9,
            simulated_seconds: parts.total_ns as f64 * 1e-9,
            goodput: parts.goodput(),
            time_ns: parts,
        })
    }

    /// The checkpoint writes of the run (none reported for a split run
    /// that wrote none: its ranks report their own).
    fn checkpoints_report<O: Optimizer<f32, IxDyn>>(
        &self,
        opt: &ShardedOptimizer<O>,
    ) -> Result<Option<CheckpointsReport>> {
        if self.writes.is_empty() && opt.ranked().is_some() {
            return Ok(None);
        }
        let voided = self
            .writes
            .iter()
            .filter(|w| matches!(w.outcome, WriteOutcome::Voided { .. }))
            .count();
        Ok(Some(CheckpointsReport {
            io_seconds: opt.checkpoint_seconds()?,
            written: self.writes.len() - voided,
            voided,
            retention_problems: self
                .writes
                .iter()
                .flat_map(|w| match &w.outcome {
                    WriteOutcome::Written {
                        retention_problems, ..
                    } => retention_problems.clone(),
                    WriteOutcome::Voided { .. } => Vec::new(),
                })
                .collect(),
        }))
    }
}

/// The median of each phase over the completed steps.
fn median_phases(reports: &[ShardedStepReport]) -> BTreeMap<String, f64> {
    let mut phase_samples: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in reports {
        for (k, v) in &r.phases {
            phase_samples.entry(k.clone()).or_default().push(*v);
        }
    }
    phase_samples
        .into_iter()
        .map(|(k, v)| (k, median(v)))
        .collect()
}

/// The run's recoveries; a spare-cube run's rollback says no spare was free.
fn recovery_rows<O: Optimizer<f32, IxDyn>>(opt: &ShardedOptimizer<O>) -> Vec<RecoveryRow> {
    opt.recoveries()
        .iter()
        .map(|r| RecoveryRow {
            note: (opt.sharding().recovery == RecoveryPolicy::SpareCube
                && r.policy == RecoveryPolicy::Rollback)
                .then(|| {
                    "no spare cube was free: rolled back onto the survivors, as \
                     `goodput` models it"
                        .to_string()
                }),
            ..recovery_row(r)
        })
        .collect()
}

/// A recovery as the report shows it, its time broken into the parts
/// that add up to it.
pub fn recovery_row(r: &RecoveryRecord) -> RecoveryRow {
    RecoveryRow {
        policy: r.policy.to_string(),
        failed_step: r.failed_step,
        lost_devices: r.lost_devices.iter().map(|d| d.0).collect(),
        lost_steps: r.lost_steps,
        started_at_seconds: r.failed_at_ns as f64 * 1e-9,
        recovery_seconds: r.recovery_seconds,
        read_seconds: r.read_seconds,
        reconfigure_seconds: r.reconfigure_seconds,
        reshard_seconds: r.reshard_seconds,
        swapped_cubes: r.swapped_cubes.clone(),
        note: None,
    }
}

/// A recovery's parts in the order they run, each with its seconds; they
/// add up to its `recovery_seconds`. Parts that take no time are left out.
pub fn recovery_parts(rec: &RecoveryRow) -> Vec<(&'static str, f64)> {
    [
        ("checkpoint read", rec.read_seconds),
        ("cube swap", rec.reconfigure_seconds),
        ("re-shard", rec.reshard_seconds),
    ]
    .into_iter()
    .filter(|&(_, seconds)| seconds > 0.0)
    .collect()
}

/// Where a phase runs in a step: the reduce-scatter passes (axes in
/// order, then across slices), the update, the all-gather passes (the
/// reverse), the state replication; `exposed_communication`, a summary,
/// last.
fn execution_rank(key: &str) -> (u8, i64) {
    let axis = |pass: &str| -> i64 {
        match pass {
            "dcn" => i64::from(u32::MAX),
            other => other
                .strip_prefix("axis")
                .and_then(|n| n.parse::<i64>().ok())
                .unwrap_or(i64::from(u32::MAX) - 1),
        }
    };
    if let Some(pass) = key.strip_prefix("reduce_scatter.") {
        (0, axis(pass))
    } else if key == "update" {
        (1, 0)
    } else if let Some(pass) = key.strip_prefix("all_gather.") {
        (2, -axis(pass))
    } else if key == "replicate_state" {
        (3, 0)
    } else if key == "exposed_communication" {
        (5, 0)
    } else {
        (4, 0)
    }
}

/// The report's phases in the step's execution order (`execution_rank`).
pub fn phases_in_execution_order(phases: &BTreeMap<String, f64>) -> Vec<(&str, f64)> {
    let mut ordered: Vec<(&str, f64)> = phases.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    ordered.sort_by_key(|&(k, _)| execution_rank(k));
    ordered
}

/// Where the simulated time of a run went, from the run's time ledger
/// (every nanosecond charged once, so the shares add up to 100 %): the
/// steps that count (the goodput), steps a rollback undid, steps cut off
/// by a failure, checkpoint writes, recoveries and the rest. Empty for a
/// run that spent all its time in steps that count.
pub fn time_breakdown(r: &TrainReport) -> String {
    let t = &r.time_ns;
    if t.total_ns == 0 || t.productive_ns == t.total_ns {
        return String::new();
    }
    // A share that rounds to 0.0 % but is not 0 reads "<0.1 %".
    let share = |ns: u64| {
        let percent = ns as f64 / t.total_ns as f64 * 100.0;
        if ns > 0 && percent < 0.05 {
            "<0.1".to_string()
        } else {
            format!("{percent:.1}")
        }
    };
    let mut parts = vec![format!("{} % in steps that count", share(t.productive_ns))];
    for (ns, what) in [
        (t.undone_ns, "in steps a rollback undid"),
        (t.cut_off_ns, "in failed steps"),
        (t.checkpoint_write_ns, "writing checkpoints"),
        (t.recovery_ns, "recovering"),
        (t.other_ns, "waiting"),
    ] {
        if ns > 0 {
            parts.push(format!("{} % {what}", share(ns)));
        }
    }
    format!("time: {}\n", parts.join(", "))
}
