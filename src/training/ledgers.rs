//! A run's time ledgers across a resume: each checkpoint a run writes
//! carries the whole run's ledger so far ([`RunRecord`], the checkpoint's
//! `run.ron`), so a resumed run charges the whole run's ledger on from
//! there as well as its own segment's, and its report tells the two
//! apart.

use serde::{Deserialize, Serialize};

use crate::error::{OptimError, Result};
use crate::sharding::ledger::{TimeKind, TimeLedger};

/// The host's record of a run at a checkpoint: where its simulated time
/// went from the start and how many steps it attempted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The whole run's ledger at the checkpoint's capture.
    pub ledger: TimeLedger,
    /// Steps attempted by then (failed ones included).
    pub attempts: u64,
}

impl RunRecord {
    /// The record as the checkpoint stores it (RON).
    pub fn to_bytes(&self) -> Vec<u8> {
        ron::to_string(self)
            .expect("a run record always serializes")
            .into_bytes()
    }

    /// A record read back from a checkpoint (`what` names it in the error).
    pub fn from_bytes(bytes: &[u8], what: &str) -> Result<RunRecord> {
        let text = std::str::from_utf8(bytes)
            .map_err(|_| OptimError::invalid_config(format!("{what}: not UTF-8")))?;
        ron::from_str(text).map_err(|e| OptimError::invalid_config(format!("{what}: {e}")))
    }
}

/// This segment's ledger and, for a resumed run, the whole run's, charged
/// alike.
#[derive(Debug, Clone)]
pub(super) struct Ledgers {
    /// From where this process started (or resumed) the run.
    pub segment: TimeLedger,
    /// From the run's start, when this segment resumed it.
    pub whole: Option<TimeLedger>,
    /// Steps the run attempted before this segment.
    pub earlier_attempts: u64,
}

impl Ledgers {
    /// The ledgers of a segment starting at `start_ns`, continuing `earlier`
    /// (the resumed checkpoint's record) if any.
    pub fn new(start_ns: u64, earlier: Option<RunRecord>) -> Ledgers {
        let (whole, earlier_attempts) = match earlier {
            Some(record) => (Some(record.ledger), record.attempts),
            None => (None, 0),
        };
        Ledgers {
            segment: TimeLedger::starting_at(start_ns),
            whole,
            earlier_attempts,
        }
    }

    fn each(&mut self, mut f: impl FnMut(&mut TimeLedger)) {
        f(&mut self.segment);
        if let Some(whole) = &mut self.whole {
            f(whole);
        }
    }

    /// [`TimeLedger::charge`] on both.
    pub fn charge(&mut self, kind: TimeKind, until_ns: u64) {
        self.each(|l| l.charge(kind, until_ns));
    }

    /// [`TimeLedger::step_completed`] on both.
    pub fn step_completed(&mut self, number: u64, launched_ns: u64, completed_ns: u64) {
        self.each(|l| l.step_completed(number, launched_ns, completed_ns));
    }

    /// [`TimeLedger::rolled_back_to`] on both.
    pub fn rolled_back_to(&mut self, steps_completed: u64) {
        self.each(|l| l.rolled_back_to(steps_completed));
    }

    /// The whole run's record after `attempts` attempts in this segment.
    pub fn record(&self, attempts: u64) -> RunRecord {
        RunRecord {
            ledger: self.whole.as_ref().unwrap_or(&self.segment).clone(),
            attempts: self.earlier_attempts + attempts,
        }
    }
}
