//! Where a training run's simulated time went, nanosecond by nanosecond.
//!
//! The host that drives a run charges each stretch of simulated time, from
//! where the last one ended to the time it names, to one kind
//! ([`TimeKind`]); a rollback moves the steps it undid from productive to
//! undone. Every nanosecond from the start is charged exactly once, so the
//! parts add up to the total in integers, and goodput is productive time
//! over the total, as `goodput` computes it for a planned run.
//!
//! ```
//! use optirs_tpu::sharding::ledger::{TimeKind, TimeLedger};
//!
//! let mut ledger = TimeLedger::starting_at(1_000);
//! ledger.step_completed(1, 1_000, 1_400);
//! ledger.charge(TimeKind::CheckpointWrite, 1_500);
//! ledger.step_completed(2, 1_500, 1_900);
//! ledger.charge(TimeKind::CutOffStep, 2_000);
//! ledger.rolled_back_to(1);
//! ledger.charge(TimeKind::Recovery, 2_600);
//! let parts = ledger.parts();
//! assert_eq!(parts.productive_ns, 400);
//! assert_eq!(parts.undone_ns, 400);
//! assert_eq!(parts.total_ns, 1_600);
//! assert_eq!(parts.accounted_ns(), parts.total_ns);
//! assert_eq!(parts.goodput(), 0.25);
//! ```

use serde::{Deserialize, Serialize};

/// What a stretch of a run's simulated time was spent on, other than a
/// completed step ([`TimeLedger::step_completed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeKind {
    /// A step that failed in flight, launch to the failure.
    CutOffStep,
    /// A checkpoint write (the model waits for it), finished or voided.
    CheckpointWrite,
    /// A recovery: the failure to the next launch (checkpoint read,
    /// re-shard, cube swap).
    Recovery,
    /// Time nothing above explains (zero in a run the engine drives:
    /// a test that it stays zero keeps the ledger honest).
    Other,
}

/// A run's simulated time split by [`TimeKind`], in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeParts {
    /// Steps that count at the end.
    pub productive_ns: u64,
    /// Completed steps a rollback threw away.
    pub undone_ns: u64,
    /// Steps cut off by a failure in flight.
    pub cut_off_ns: u64,
    /// Checkpoint writes.
    pub checkpoint_write_ns: u64,
    /// Recoveries.
    pub recovery_ns: u64,
    /// Anything else.
    pub other_ns: u64,
    /// The run's simulated time.
    pub total_ns: u64,
}

impl TimeParts {
    /// The sum of the parts: the total, when every nanosecond was charged.
    pub fn accounted_ns(&self) -> u64 {
        self.productive_ns
            + self.undone_ns
            + self.cut_off_ns
            + self.checkpoint_write_ns
            + self.recovery_ns
            + self.other_ns
    }

    /// Productive time over the total (0 for an empty run): in [0, 1].
    pub fn goodput(&self) -> f64 {
        if self.total_ns == 0 {
            0.0
        } else {
            self.productive_ns as f64 / self.total_ns as f64
        }
    }
}

/// The ledger of a run in progress (module docs); serialized into a
/// checkpoint's record of the run, so a resumed run goes on charging the
/// whole run's ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeLedger {
    start_ns: u64,
    cursor_ns: u64,
    /// Completed steps that count so far: (step number, ns).
    kept: Vec<(u64, u64)>,
    parts: TimeParts,
}

impl TimeLedger {
    /// A ledger of a run that starts at `start_ns`.
    pub fn starting_at(start_ns: u64) -> TimeLedger {
        TimeLedger {
            start_ns,
            cursor_ns: start_ns,
            ..TimeLedger::default()
        }
    }

    /// Where the charged time ends.
    pub fn cursor_ns(&self) -> u64 {
        self.cursor_ns
    }

    /// Charges the time from the cursor to `until_ns` to `kind` (nothing
    /// if `until_ns` is not after the cursor).
    pub fn charge(&mut self, kind: TimeKind, until_ns: u64) {
        let ns = until_ns.saturating_sub(self.cursor_ns);
        self.cursor_ns = self.cursor_ns.max(until_ns);
        let part = match kind {
            TimeKind::CutOffStep => &mut self.parts.cut_off_ns,
            TimeKind::CheckpointWrite => &mut self.parts.checkpoint_write_ns,
            TimeKind::Recovery => &mut self.parts.recovery_ns,
            TimeKind::Other => &mut self.parts.other_ns,
        };
        *part += ns;
    }

    /// Step `number` completed: launched at `launched_ns` (the time before
    /// it, from the cursor, was a recovery's wait if one was in progress,
    /// otherwise [`TimeKind::Other`]) and ended at `completed_ns`.
    pub fn step_completed(&mut self, number: u64, launched_ns: u64, completed_ns: u64) {
        self.charge(TimeKind::Other, launched_ns);
        let ns = completed_ns.saturating_sub(self.cursor_ns);
        self.cursor_ns = self.cursor_ns.max(completed_ns);
        self.kept.push((number, ns));
        self.parts.productive_ns += ns;
    }

    /// A rollback to `steps_completed`: the kept steps after it are undone.
    pub fn rolled_back_to(&mut self, steps_completed: u64) {
        let split = self.kept.partition_point(|&(n, _)| n <= steps_completed);
        for (_, ns) in self.kept.drain(split..) {
            self.parts.productive_ns -= ns;
            self.parts.undone_ns += ns;
        }
    }

    /// The parts so far, the total being the time charged.
    pub fn parts(&self) -> TimeParts {
        TimeParts {
            total_ns: self.cursor_ns - self.start_ns,
            ..self.parts
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_nanosecond_is_charged_once_and_a_rollback_moves_steps_to_undone() {
        let mut ledger = TimeLedger::starting_at(7);
        let mut t = 7;
        for number in 1..=5 {
            ledger.step_completed(number, t, t + 333);
            t += 333;
            if number % 2 == 0 {
                t += 41;
                ledger.charge(TimeKind::CheckpointWrite, t);
            }
        }
        t += 100;
        ledger.charge(TimeKind::CutOffStep, t);
        ledger.rolled_back_to(4);
        t += 1_000;
        ledger.charge(TimeKind::Recovery, t);
        ledger.step_completed(5, t, t + 333);
        t += 333;
        let parts = ledger.parts();
        assert_eq!(parts.total_ns, t - 7);
        assert_eq!(parts.accounted_ns(), parts.total_ns);
        assert_eq!(parts.productive_ns, 5 * 333);
        assert_eq!(parts.undone_ns, 333);
        assert_eq!(parts.cut_off_ns, 100);
        assert_eq!(parts.checkpoint_write_ns, 82);
        assert_eq!(parts.recovery_ns, 1_000);
        assert_eq!(parts.other_ns, 0);
        assert!(parts.goodput() > 0.0 && parts.goodput() <= 1.0);
    }

    #[test]
    fn time_before_a_launch_nobody_charged_is_other_and_charges_never_go_back() {
        let mut ledger = TimeLedger::starting_at(0);
        ledger.step_completed(1, 10, 20);
        ledger.charge(TimeKind::Recovery, 5);
        assert_eq!(ledger.cursor_ns(), 20);
        let parts = ledger.parts();
        assert_eq!(
            (parts.other_ns, parts.productive_ns, parts.recovery_ns),
            (10, 10, 0)
        );
        assert_eq!(parts.accounted_ns(), 20);
        assert_eq!(TimeLedger::default().parts().goodput(), 0.0);
    }
}
