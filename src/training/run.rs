//! The run loop: a sharded optimizer stepped until a plan's steps are
//! done, through failures (a failed step is retried after its recovery),
//! with a checkpoint at every step boundary where one is due; every
//! stretch of simulated time is charged to the run's [`TimeLedger`]. The
//! loop installs no signal handler: whoever runs it says when to stop
//! through a closure, checked at every step boundary.

use std::time::Instant;

use ndarray::IxDyn;
use serde::{Serialize, Serializer};

use crate::error::OptimError;
use crate::health::{DeviceState, Fault, FaultPlan};
use crate::optimizers::Optimizer;
use crate::pod::Pod;
use crate::sharding::ledger::{TimeKind, TimeLedger};
use crate::sharding::{FailureCause, ShardedStep, ShardingError, StepPhase, SyntheticGradients};
use crate::topology::DeviceId;

use super::ledgers::Ledgers;
use super::{CheckpointWrite, Resumed, RunRecord, ShardedOptimizer, ShardedStepReport};

/// What a run does: its steps, the seed of its synthetic gradients, the
/// kills it was asked for (to date a failure whose device a cube swap has
/// since revived) and the optimizer's name as the report shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPlan {
    /// Steps to complete (lost steps are redone).
    pub steps: u64,
    /// Seed of the synthetic gradients.
    pub seed: u64,
    /// The kills asked for: device and simulated seconds from the start.
    pub kills: Vec<(u32, f64)>,
    /// The optimizer's name, as the report shows it.
    pub optimizer: String,
}

/// Why a run ended before its steps were done.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The stop closure asked for a stop at a step boundary.
    #[error("stopped at a step boundary with {steps_completed} of {steps} steps completed")]
    Stopped {
        /// Steps completed when it stopped.
        steps_completed: u64,
        /// Steps the plan asked for.
        steps: u64,
        /// The simulated time it stopped at, seconds.
        at_seconds: f64,
    },
    /// Failures kept the run from completing its steps within
    /// `steps × 4 + devices` attempts.
    #[error("gave up after {attempts} attempts with {steps_completed} steps completed")]
    GaveUp {
        /// Attempts made.
        attempts: u64,
        /// Steps completed.
        steps_completed: u64,
    },
    /// A step, a checkpoint or the pod failed in a way the run does not
    /// recover from.
    #[error(transparent)]
    Failed(#[from] OptimError),
}

/// A failed attempt as the report and the trace show it.
#[derive(Serialize, Debug, Clone)]
pub struct FailureRow {
    /// The step that failed.
    pub step: u64,
    /// The device whose loss failed it, if a device's.
    pub device: Option<u32>,
    /// When the failed attempt was launched.
    pub launched_at_seconds: f64,
    /// When the device was killed (a kill's failure only).
    pub killed_at_seconds: Option<f64>,
    /// When the step saw the failure and stopped.
    pub at_seconds: f64,
    /// The phase it failed in (its key, `update`, `all_gather.axis0`, …).
    #[serde(serialize_with = "phase_key")]
    pub phase: StepPhase,
    /// Why it failed.
    pub cause: String,
}

fn phase_key<S: Serializer>(phase: &StepPhase, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&phase.key())
}

/// The steps of a run, as they went.
#[derive(Debug)]
pub struct Outcome {
    /// Every completed step, in order (a step a rollback undid, and its
    /// redo, both appear).
    pub reports: Vec<ShardedStepReport>,
    /// Every failed attempt, in order.
    pub failures: Vec<FailureRow>,
    /// Steps attempted.
    pub attempts: u64,
    /// Wall time of the loop, seconds.
    pub wall_seconds: f64,
    /// Where this segment's simulated time went (the whole run's, unless
    /// it resumed one).
    pub ledger: TimeLedger,
    /// Where the whole run's simulated time went, from its start, when
    /// this segment resumed it.
    pub whole: Option<TimeLedger>,
    /// Steps the run attempted before this segment.
    pub earlier_attempts: u64,
    /// Checkpoint writes at step boundaries.
    pub writes: Vec<CheckpointWrite>,
    /// The checkpoint the run resumed from.
    pub resumed: Option<Resumed>,
}

/// Steps until `plan.steps` steps completed (a failed step is retried after
/// its recovery); `stop` is asked at every step boundary, and `on_step`
/// told the steps completed after each step.
pub fn run_steps<O: Optimizer<f32, IxDyn>>(
    opt: &mut ShardedOptimizer<O>,
    plan: &RunPlan,
    stop: &dyn Fn() -> bool,
    on_step: &mut dyn FnMut(u64),
) -> Result<Outcome, RunError> {
    run_steps_from(opt, plan, None, None, stop, on_step)
}

/// [`run_steps`] whose time is counted from `start_ns` (the resumed
/// checkpoint's time; now by default), writing a checkpoint at every step
/// boundary where one is due; each stretch of simulated time is charged
/// to the ledger.
pub fn run_steps_from<O: Optimizer<f32, IxDyn>>(
    opt: &mut ShardedOptimizer<O>,
    plan: &RunPlan,
    start_ns: Option<u64>,
    resumed: Option<Resumed>,
    stop: &dyn Fn() -> bool,
    on_step: &mut dyn FnMut(u64),
) -> Result<Outcome, RunError> {
    let devices = opt.pod().topology().num_devices();
    let start_ns = start_ns.unwrap_or(opt.pod().clock().now_ns);
    let mut ledger = Ledgers::new(start_ns, resumed.as_ref().map(earlier_record));
    // A resumed run waited out its checkpoint's write, as the run did.
    ledger.charge(TimeKind::CheckpointWrite, opt.pod().clock().now_ns);
    let started = Instant::now();
    let mut reports: Vec<ShardedStepReport> = Vec::new();
    let mut failures = Vec::new();
    let mut writes = Vec::new();
    let mut attempts = 0u64;
    let mut recovering = false;
    let max_attempts = plan.steps.saturating_mul(4).saturating_add(devices as u64);
    while opt.steps_completed() < plan.steps {
        if stop() {
            return Err(RunError::Stopped {
                steps_completed: opt.steps_completed(),
                steps: plan.steps,
                at_seconds: opt.pod().clock().now_seconds(),
            });
        }
        attempts += 1;
        if attempts > max_attempts {
            return Err(RunError::GaveUp {
                attempts,
                steps_completed: opt.steps_completed(),
            });
        }
        let step = opt.steps_completed() + 1;
        let replicas = opt.layout()?.devices();
        let grads = SyntheticGradients {
            seed: plan.seed,
            step,
            replicas,
            scale: 1e-2,
        };
        let wait = if recovering {
            TimeKind::Recovery
        } else {
            TimeKind::Other
        };
        match opt.step(&grads) {
            Ok(report) => {
                ledger.charge(wait, report.launched_at_ns);
                ledger.step_completed(report.step, report.launched_at_ns, report.completed_at_ns);
                recovering = false;
                reports.push(report);
                on_step(opt.steps_completed());
                let record = || ledger.record(attempts).to_bytes();
                if let Some(write) = opt.checkpoint_if_due_recording(Some(&record))? {
                    ledger.charge(TimeKind::CheckpointWrite, write.ended_at_ns);
                    writes.push(write);
                }
            }
            Err(e) => match e.downcast::<ShardingError>() {
                Ok(ShardingError::StepFailed {
                    step,
                    phase,
                    at_ns,
                    cause,
                }) => {
                    let launched_at_ns = opt
                        .pod()
                        .world()
                        .get_resource::<ShardedStep>()
                        .map_or(at_ns, |s| s.launched_at_ns);
                    ledger.charge(wait, launched_at_ns);
                    ledger.charge(TimeKind::CutOffStep, at_ns);
                    ledger.rolled_back_to(opt.steps_completed());
                    recovering = true;
                    failures.push(failure_row(opt, &plan.kills, step, phase, at_ns, &cause));
                }
                Ok(other) => return Err(OptimError::from(other).into()),
                Err(e) => return Err(e.into()),
            },
        }
    }
    ledger.charge(TimeKind::Other, opt.pod().clock().now_ns);
    let wall_seconds = started.elapsed().as_secs_f64();
    Ok(Outcome {
        reports,
        failures,
        attempts,
        wall_seconds,
        ledger: ledger.segment,
        whole: ledger.whole,
        earlier_attempts: ledger.earlier_attempts,
        writes,
        resumed,
    })
}

/// The run's record at the checkpoint `resumed` restored; for a
/// checkpoint written without one, the time before it charged to `other`
/// (where it went is not known) and every step it holds attempted once.
fn earlier_record(resumed: &Resumed) -> RunRecord {
    resumed.record.clone().unwrap_or_else(|| {
        let mut ledger = TimeLedger::starting_at(0);
        ledger.charge(TimeKind::Other, resumed.at_ns);
        RunRecord {
            ledger,
            attempts: resumed.steps_completed,
        }
    })
}

/// A failed attempt as the report and the trace show it: when it was
/// launched (the pod's step resource still holds the failed step) and,
/// for a killed device, when it died (the world's ground truth; after a
/// cube swap has revived the device's id, the `kills` entry that was due),
/// so the wait until the step saw it shows.
fn failure_row<O: Optimizer<f32, IxDyn>>(
    opt: &ShardedOptimizer<O>,
    kills: &[(u32, f64)],
    step: u64,
    phase: StepPhase,
    at_ns: u64,
    cause: &FailureCause,
) -> FailureRow {
    let pod = opt.pod();
    let launched_at_ns = pod
        .world()
        .get_resource::<ShardedStep>()
        .filter(|s| s.number == step)
        .map_or(at_ns, |s| s.launched_at_ns);
    let fault_at_ns = cause
        .device()
        .and_then(|d| pod.device_entity(d.0).ok())
        .and_then(|e| pod.world().get::<DeviceState>(e).copied())
        .and_then(|state| match state {
            DeviceState::Killed { at_ns } => Some(at_ns),
            _ => None,
        })
        .or_else(|| match cause {
            FailureCause::DeviceKilled(d) => kills
                .iter()
                .map(|&(device, seconds)| (device, (seconds * 1e9).round() as u64))
                .filter(|&(device, due)| device == d.0 && due <= at_ns)
                .map(|(_, due)| due)
                .max(),
            _ => None,
        });
    FailureRow {
        step,
        device: cause.device().map(|d| d.0),
        launched_at_seconds: launched_at_ns as f64 * 1e-9,
        killed_at_seconds: fault_at_ns.map(|ns| ns as f64 * 1e-9),
        at_seconds: at_ns as f64 * 1e-9,
        phase,
        cause: cause.to_string(),
    }
}

/// The kills of `kills` (device, seconds) still pending in the pod's fault
/// plan after the run: due after its simulated end, they never happened
/// (a run's end is only known once it has run). Each as it was asked.
pub fn kills_never_happened(pod: &mut Pod, kills: &[(u32, f64)]) -> Vec<(u32, f64)> {
    let end_ns = pod.clock().now_ns;
    pod.faults_that_cannot_apply(0)
        .iter()
        .filter_map(|f| match f.scheduled.fault {
            Fault::KillDevice(DeviceId(device)) if f.scheduled.at_ns > end_ns => {
                let asked = kills
                    .iter()
                    .find(|&&(d, s)| d == device && (s * 1e9).round() as u64 == f.scheduled.at_ns)
                    .map_or(f.scheduled.at_ns as f64 * 1e-9, |&(_, s)| s);
                Some((device, asked))
            }
            _ => None,
        })
        .collect()
}

/// Faults at their simulated times, ns.
pub type TimedFaults = Vec<(u64, Fault)>;

/// The faults a resumed pod still has to come (its checkpoint carries
/// them) and the `kills` given due after `resumed_at_ns`, both in one
/// order: a resumed run is the same run, so they must be equal.
pub fn kills_to_come(
    pod: &Pod,
    kills: &[(u64, Fault)],
    resumed_at_ns: u64,
) -> (TimedFaults, TimedFaults) {
    let plan = pod.world().resource::<FaultPlan>();
    let mut pending: Vec<(u64, Fault)> = plan.pending.iter().map(|f| (f.at_ns, f.fault)).collect();
    let mut given: Vec<(u64, Fault)> = kills
        .iter()
        .copied()
        .filter(|&(at, _)| at > resumed_at_ns)
        .collect();
    let key = |f: &(u64, Fault)| format!("{f:?}");
    pending.sort_by_key(key);
    given.sort_by_key(key);
    (pending, given)
}
