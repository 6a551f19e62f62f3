//! One run's timeline as a discrete-event simulation: failures, and the
//! training, checkpoints and recoveries between them.
//!
//! Failures form a Poisson process over wall time (every unit fails
//! independently with exponential inter-arrival times of the unit's MTBF,
//! and a failed unit is replaced by a spare, so the rate stays
//! `units / MTBF`); which unit fails is uniform. Between two failures the
//! timeline is deterministic — `n` steps, a checkpoint, `n` steps, … — so
//! a stretch is accounted in closed form and a run costs O(failures), not
//! O(steps).
//!
//! * A step takes `step + replication` seconds (replication is 0 under
//!   rollback); a step in flight at a failure is void.
//! * A checkpoint is taken after every `n` completed steps. Synchronous:
//!   training waits for its write, and one still being written at a
//!   failure is void. Asynchronous (Orbax's async save): training waits
//!   only for the device-to-host copy; the write to storage runs in the
//!   background while training goes on, and the checkpoint can be rolled
//!   back to only once that write has finished. A failure cuts a write in
//!   flight off (the job's host memory goes with it), so a rollback then
//!   goes to the checkpoint before. A snapshot due while the previous
//!   write is still in flight waits for it (one save at a time), and that
//!   wait is checkpoint time.
//! * **Rollback**: the steps completed since the last checkpoint whose
//!   write finished are lost; the job detects, restarts, reconfigures and reads the
//!   checkpoint (nothing to read before the first checkpoint).
//! * **Redundant**: no step is lost; the job detects, restarts,
//!   reconfigures and re-shards from the copies. The copies are lost, and
//!   the job falls back to a rollback, when one failure takes down a device
//!   and its ring successor (a host that drives both), or when a second
//!   failure during the recovery hits a ring neighbour of a lost unit.
//! * **SpareCube**: the failed unit's cube is swapped for a free spare:
//!   the steps since the last checkpoint are lost as in a rollback, but
//!   the job keeps its slice, so it detects, reconfigures the OCSes and
//!   reads the checkpoint, with no restart. The failed cube is a spare
//!   again after the repair time; a failure with no free spare is a
//!   rollback (the job waits for a whole new slice). Spares themselves do
//!   not fail (they run nothing).
//! * A failure during a recovery restarts the recovery.
//!
//! The run ends at its horizon: steps completed since the last checkpoint
//! count, a step or checkpoint in flight does not.

use std::collections::HashSet;

use super::inputs::{Costs, FailureUnit, Fleet};
use crate::rng::SimRng;
use crate::sharding::RecoveryPolicy;

/// Stream keys of this module's draws (apart from [`crate::rng::stream`]'s).
mod stream {
    /// Failure inter-arrival times.
    pub const FAILURE_TIME: u64 = 0x676f_6f64_0001;
    /// Which unit fails.
    pub const FAILURE_UNIT: u64 = 0x676f_6f64_0002;
}

/// Which failure units hold a redundant copy of each other's state.
#[derive(Debug, Clone)]
pub struct Exposure {
    /// Units.
    pub units: u32,
    /// Per unit: it drives a device and that device's ring successor, so
    /// losing it loses both copies.
    pub holds_both: Vec<bool>,
    /// Unordered pairs of distinct units that hold ring neighbours.
    pub neighbours: HashSet<(u32, u32)>,
}

impl Exposure {
    /// The exposure of `fleet`'s ring to failures of `unit`.
    pub fn new(fleet: &Fleet, unit: FailureUnit) -> Exposure {
        let n = fleet.ring_hosts.len();
        let of = |position: usize| match unit {
            FailureUnit::Chip => position as u32,
            FailureUnit::Host => fleet.ring_hosts[position],
        };
        let units = match unit {
            FailureUnit::Chip => fleet.chips,
            FailureUnit::Host => fleet.hosts,
        };
        let mut holds_both = vec![false; units as usize];
        let mut neighbours = HashSet::new();
        for i in 0..n {
            let (a, b) = (of(i), of((i + 1) % n));
            if a == b {
                holds_both[a as usize] = true;
            } else {
                neighbours.insert((a.min(b), a.max(b)));
            }
        }
        Exposure {
            units,
            holds_both,
            neighbours,
        }
    }

    fn are_neighbours(&self, a: u32, b: u32) -> bool {
        self.neighbours.contains(&(a.min(b), a.max(b)))
    }
}

/// What a policy and a checkpoint interval are simulated with.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Steps between checkpoints (`None`: no checkpoints).
    pub steps_per_checkpoint: Option<u64>,
    /// The recovery policy.
    pub recovery: RecoveryPolicy,
    /// Simulated time, seconds.
    pub horizon_seconds: f64,
    /// The seed.
    pub seed: u64,
}

/// Sums over one or more runs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tally {
    /// Simulated time, seconds.
    pub simulated_seconds: f64,
    /// Steps completed (including those a rollback later lost).
    pub steps_done: u64,
    /// Completed steps a rollback lost.
    pub lost_steps: u64,
    /// Time in steps that never completed (in flight at a failure or at the
    /// end), seconds.
    pub void_step_seconds: f64,
    /// Checkpoints written to the end (usable for a rollback).
    pub checkpoints: u64,
    /// Asynchronous writes a failure cut off before they finished.
    pub writes_cut: u64,
    /// Time training waited for checkpoints (the write, or the host copy
    /// and any previous write still in flight), including a wait a failure
    /// cut off, seconds.
    pub checkpoint_seconds: f64,
    /// Of `checkpoint_seconds`, time waiting for the previous asynchronous
    /// write to finish before the next copy could start, seconds.
    pub checkpoint_wait_seconds: f64,
    /// Time from failures until training resumed, seconds.
    pub recovery_seconds: f64,
    /// Time copying state to ring successors, seconds.
    pub replication_seconds: f64,
    /// Failures (each restarts the job or its recovery).
    pub restarts: u64,
    /// Redundant recoveries that lost both copies and rolled back.
    pub fallbacks: u64,
    /// Failures a spare cube was swapped in for (spare-cube).
    pub spare_swaps: u64,
    /// Failures with no free spare cube, recovered by a rollback.
    pub spare_shortfalls: u64,
}

impl Tally {
    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &Tally) {
        self.simulated_seconds += other.simulated_seconds;
        self.steps_done += other.steps_done;
        self.lost_steps += other.lost_steps;
        self.void_step_seconds += other.void_step_seconds;
        self.checkpoints += other.checkpoints;
        self.writes_cut += other.writes_cut;
        self.checkpoint_seconds += other.checkpoint_seconds;
        self.checkpoint_wait_seconds += other.checkpoint_wait_seconds;
        self.recovery_seconds += other.recovery_seconds;
        self.replication_seconds += other.replication_seconds;
        self.restarts += other.restarts;
        self.fallbacks += other.fallbacks;
        self.spare_swaps += other.spare_swaps;
        self.spare_shortfalls += other.spare_shortfalls;
    }

    /// Steps that count: completed and not lost.
    pub fn productive_steps(&self) -> u64 {
        self.steps_done - self.lost_steps
    }

    /// Productive time over simulated time, in [0, 1].
    pub fn goodput(&self, step_seconds: f64) -> f64 {
        if self.simulated_seconds > 0.0 {
            (self.productive_steps() as f64 * step_seconds / self.simulated_seconds).clamp(0.0, 1.0)
        } else {
            0.0
        }
    }
}

/// The failures of one run, in time order.
struct Failures {
    rng: SimRng,
    replicate: u64,
    index: u64,
    at: f64,
    mtbf: f64,
    units: u32,
}

impl Iterator for Failures {
    type Item = (f64, u32);

    fn next(&mut self) -> Option<(f64, u32)> {
        let key = [self.replicate, self.index];
        let bits = self.rng.bits(stream::FAILURE_TIME, key);
        // Uniform in (0, 1]: never ln(0).
        let u = ((bits >> 11) + 1) as f64 / (1u64 << 53) as f64;
        self.at += -u.ln() * self.mtbf;
        let unit = self
            .rng
            .up_to(u64::from(self.units - 1), stream::FAILURE_UNIT, key) as u32;
        self.index += 1;
        Some((self.at, unit))
    }
}

/// Where a run's training stands between failures. A checkpoint is a
/// snapshot (the state copied out at a step boundary) and then its write;
/// it can be rolled back to once the write has finished (at once when
/// training waits for the write).
struct Run<'a> {
    costs: &'a Costs,
    plan: Plan,
    tally: Tally,
    /// Steps completed since the latest snapshot (or the start, or the
    /// restore): the next checkpoint is due when this reaches the interval.
    since_snapshot: u64,
    /// Steps between the last finished checkpoint (or the start) and the
    /// latest snapshot, when that snapshot's write is in flight or was cut
    /// off; 0 once it has finished. A rollback loses these and
    /// `since_snapshot`.
    before_snapshot: u64,
    /// Seconds left of the write in flight in the background (0: none).
    write_left: f64,
    /// A finished checkpoint exists to roll back to.
    has_checkpoint: bool,
}

impl Run<'_> {
    fn complete(&mut self, steps: u64) {
        self.tally.steps_done += steps;
        self.tally.replication_seconds += steps as f64 * self.costs.replication_seconds_per_step;
    }

    /// The write in flight has finished: its snapshot can be rolled back to.
    fn finish_write(&mut self) {
        self.before_snapshot = 0;
        self.write_left = 0.0;
        self.has_checkpoint = true;
        self.tally.checkpoints += 1;
    }

    /// Runs the background write for `seconds` of training; it finishes if
    /// it needed no more.
    fn write_during(&mut self, seconds: f64) {
        if self.write_left > 0.0 {
            if self.write_left <= seconds {
                self.finish_write();
            } else {
                self.write_left -= seconds;
            }
        }
    }

    /// Trains for `seconds` with no failure, from where the run stands;
    /// what is in flight at the end is void.
    fn train(&mut self, seconds: f64) {
        let step = self.costs.step_seconds + self.costs.replication_seconds_per_step;
        let Some(n) = self.plan.steps_per_checkpoint else {
            let k = (seconds / step).floor() as u64;
            self.complete(k);
            self.since_snapshot += k;
            self.tally.void_step_seconds += (seconds - k as f64 * step).max(0.0);
            return;
        };
        let blocking = self.costs.checkpoint_blocking_seconds;
        let background = self.costs.checkpoint_background_seconds;
        let mut left = seconds;
        loop {
            // Steps until the next checkpoint is due.
            let due_steps = n - self.since_snapshot;
            let due = due_steps as f64 * step;
            if left < due {
                let k = ((left / step).floor() as u64).min(due_steps);
                self.complete(k);
                self.since_snapshot += k;
                self.tally.void_step_seconds += (left - k as f64 * step).max(0.0);
                self.write_during(left);
                return;
            }
            self.complete(due_steps);
            self.since_snapshot = n;
            left -= due;
            self.write_during(due);
            // The previous write still in flight: the next snapshot waits
            // for it (Orbax finishes one save before starting the next).
            if self.write_left > 0.0 {
                let wait = self.write_left;
                if left < wait {
                    self.tally.checkpoint_seconds += left;
                    self.tally.checkpoint_wait_seconds += left;
                    self.write_left -= left;
                    return;
                }
                left -= wait;
                self.tally.checkpoint_seconds += wait;
                self.tally.checkpoint_wait_seconds += wait;
                self.finish_write();
            }
            if left < blocking {
                self.tally.checkpoint_seconds += left;
                return;
            }
            left -= blocking;
            self.tally.checkpoint_seconds += blocking;
            self.snapshot(background);
            // Whole cycles in closed form: `n` steps, a wait for the write
            // if it outlasts them, the next snapshot.
            let wait = (background - n as f64 * step).max(0.0);
            let cycle = n as f64 * step + wait + blocking;
            let k = (left / cycle).floor() as u64;
            if k > 0 {
                self.complete(k * n);
                self.tally.checkpoints += k;
                self.tally.checkpoint_seconds += k as f64 * (wait + blocking);
                self.tally.checkpoint_wait_seconds += k as f64 * wait;
                self.has_checkpoint = true;
                // Each cycle's write finished and the next snapshot's began.
                self.before_snapshot = if background > 0.0 { n } else { 0 };
                left = (left - k as f64 * cycle).max(0.0);
            }
        }
    }

    /// The state is copied out after `since_snapshot` steps; its write
    /// takes `background` seconds more (0: it is finished already).
    fn snapshot(&mut self, background: f64) {
        self.before_snapshot += self.since_snapshot;
        self.since_snapshot = 0;
        if background > 0.0 {
            self.write_left = background;
        } else {
            self.finish_write();
        }
    }

    /// A failure: a write in flight is lost with the job's host memory.
    fn cut_write(&mut self) {
        if self.write_left > 0.0 {
            self.write_left = 0.0;
            self.tally.writes_cut += 1;
        }
    }

    /// Back to the last finished checkpoint (or the start).
    fn roll_back(&mut self) {
        self.tally.lost_steps += self.before_snapshot + self.since_snapshot;
        self.before_snapshot = 0;
        self.since_snapshot = 0;
    }

    /// A rollback's downtime: its parts, the read only if there is a
    /// checkpoint to read.
    fn rollback_seconds(&self) -> f64 {
        if self.has_checkpoint {
            self.costs.rollback_seconds
        } else {
            self.costs.detect_seconds + self.costs.restart_seconds + self.costs.reconfigure_seconds
        }
    }

    fn spare_cube_seconds(&self) -> f64 {
        if self.has_checkpoint {
            self.costs.spare_cube_seconds
        } else {
            self.costs.detect_seconds + self.costs.reconfigure_seconds
        }
    }
}

/// The spare cubes of a spare-cube run: how many, and when each cube out
/// for repair is back.
struct SparePool {
    free: u32,
    repairs: std::collections::VecDeque<f64>,
    repair_seconds: f64,
}

impl SparePool {
    /// Takes a spare at `at` for the failed cube (which goes for repair);
    /// `false` when none is free.
    fn take(&mut self, at: f64) -> bool {
        while self.repairs.front().is_some_and(|&back| back <= at) {
            self.repairs.pop_front();
            self.free += 1;
        }
        if self.free == 0 {
            return false;
        }
        self.free -= 1;
        self.repairs.push_back(at + self.repair_seconds);
        true
    }
}

/// Simulates replicate `replicate` of a run: the same `(seed, replicate)`
/// draws the same failures whatever the plan's interval, so runs that
/// differ only in their interval are compared on the same failures.
pub fn simulate_run(exposure: &Exposure, costs: &Costs, plan: Plan, replicate: u64) -> Tally {
    let failures = Failures {
        rng: SimRng::new(plan.seed),
        replicate,
        index: 0,
        at: 0.0,
        mtbf: costs.system_mtbf_seconds,
        units: exposure.units,
    };
    simulate_failures(exposure, costs, plan, failures)
}

/// Simulates a run through the given failures, `(seconds from the start,
/// failed unit)` in time order (a unit is taken modulo the exposure's
/// units); when they run out, no more fail. What
/// [`simulate_run`] does with its drawn failures, for a timeline chosen by
/// hand (a failure in the middle of a write, say).
pub fn simulate_failures(
    exposure: &Exposure,
    costs: &Costs,
    plan: Plan,
    failures: impl IntoIterator<Item = (f64, u32)>,
) -> Tally {
    let horizon = plan.horizon_seconds;
    let mut failures = failures.into_iter();
    let units = exposure.units.max(1);
    let mut draw = move || {
        failures
            .next()
            .map_or((f64::INFINITY, 0), |(at, unit)| (at, unit % units))
    };
    let mut run = Run {
        costs,
        plan,
        tally: Tally {
            simulated_seconds: horizon,
            ..Tally::default()
        },
        since_snapshot: 0,
        before_snapshot: 0,
        write_left: 0.0,
        has_checkpoint: false,
    };
    let pool = SparePool {
        free: costs.spare_cubes,
        repairs: std::collections::VecDeque::new(),
        repair_seconds: costs.cube_repair_seconds,
    };
    let next = draw();
    let mut recovery = Recovery {
        exposure,
        horizon,
        redundant: plan.recovery == RecoveryPolicy::Redundant,
        spare_cube: plan.recovery == RecoveryPolicy::SpareCube,
        pool,
        draw,
        next,
        episode: Vec::new(),
    };
    let mut now = 0.0;
    while now < horizon {
        let (at, _) = recovery.next;
        if at >= horizon {
            run.train(horizon - now);
            break;
        }
        run.train((at - now).max(0.0));
        now = recovery.recover(&mut run, now);
    }
    run.tally
}

/// What recovering from failures needs besides the run: the failures still
/// to come (`next` is the first of them), the spare pool, and the units
/// that failed in the episode being recovered.
struct Recovery<'e, D> {
    exposure: &'e Exposure,
    horizon: f64,
    redundant: bool,
    spare_cube: bool,
    pool: SparePool,
    draw: D,
    next: (f64, u32),
    episode: Vec<u32>,
}

impl<D: FnMut() -> (f64, u32)> Recovery<'_, D> {
    /// Takes a spare at `at` for the run (spare-cube), counting a swap or
    /// a shortfall.
    fn take_spare(&mut self, run: &mut Run, at: f64) -> bool {
        let ok = self.pool.take(at);
        run.tally.spare_swaps += u64::from(ok);
        run.tally.spare_shortfalls += u64::from(!ok);
        ok
    }

    /// Recovers from the failure `next`, which strikes a run that trained
    /// until `now`, and from every failure that strikes while it
    /// recovers; returns when training resumes (at most the horizon).
    fn recover(&mut self, run: &mut Run, now: f64) -> f64 {
        let (at, unit) = self.next;
        let exposure = self.exposure;
        run.cut_write();
        run.tally.restarts += 1;
        self.episode.clear();
        self.episode.push(unit);
        let mut copies_lost = !self.redundant || exposure.holds_both[unit as usize];
        if copies_lost {
            run.tally.fallbacks += u64::from(self.redundant);
            run.roll_back();
        }
        // Whether the recovery in progress has its spare (spare-cube).
        let mut swapped = false;
        if self.spare_cube {
            swapped = self.take_spare(run, at);
        }
        let mut start = at.max(now);
        self.next = (self.draw)();
        loop {
            let duration = if self.spare_cube && swapped {
                run.spare_cube_seconds()
            } else if copies_lost {
                run.rollback_seconds()
            } else {
                run.costs.redundant_seconds
            };
            let (again, unit) = self.next;
            if again < start + duration && again < self.horizon {
                let again = again.max(start);
                run.tally.recovery_seconds += again - start;
                run.tally.restarts += 1;
                if !copies_lost
                    && (exposure.holds_both[unit as usize]
                        || self
                            .episode
                            .iter()
                            .any(|&u| exposure.are_neighbours(u, unit)))
                {
                    copies_lost = true;
                    run.tally.fallbacks += 1;
                    run.roll_back();
                }
                self.episode.push(unit);
                if self.spare_cube {
                    // The new failure's cube needs a spare too; without
                    // one the slice cannot be rewired and the job restarts.
                    swapped = self.take_spare(run, again) && swapped;
                }
                start = again;
                self.next = (self.draw)();
                continue;
            }
            let end = (start + duration).min(self.horizon);
            run.tally.recovery_seconds += end - start;
            return end;
        }
    }
}

/// [`simulate_run`] over replicates `0..replicates`, summed.
pub fn simulate_replicates(
    exposure: &Exposure,
    costs: &Costs,
    plan: Plan,
    replicates: u64,
) -> Tally {
    let mut total = Tally::default();
    for r in 0..replicates {
        total.add(&simulate_run(exposure, costs, plan, r));
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::goodput::inputs::GoodputConfig;
    use crate::hardware::TpuGeneration;

    fn setup(recovery: RecoveryPolicy) -> (Exposure, Costs) {
        let mut fleet = Fleet::blocks("t", 64, 4, TpuGeneration::V4).unwrap();
        fleet.spare_cubes = Some(2);
        let mut config = GoodputConfig::new(1_000_000_000, 64.0 * 3.0, 30.0, 2.0);
        config.recovery = recovery;
        let costs = Costs::derive(&fleet, &config).unwrap();
        (Exposure::new(&fleet, FailureUnit::Chip), costs)
    }

    #[test]
    fn every_second_of_the_run_is_accounted_once() {
        for recovery in [
            RecoveryPolicy::Rollback,
            RecoveryPolicy::Redundant,
            RecoveryPolicy::SpareCube,
        ] {
            let (exposure, costs) = setup(recovery);
            for n in [None, Some(1), Some(37), Some(10_000)] {
                let plan = Plan {
                    steps_per_checkpoint: n,
                    recovery,
                    horizon_seconds: 30.0 * 86_400.0,
                    seed: 7,
                };
                let t = simulate_run(&exposure, &costs, plan, 0);
                let sum = t.steps_done as f64 * costs.step_seconds
                    + t.void_step_seconds
                    + t.checkpoint_seconds
                    + t.recovery_seconds
                    + t.replication_seconds;
                assert!(
                    (sum - t.simulated_seconds).abs() < 1e-6 * t.simulated_seconds,
                    "{recovery} {n:?}: {sum} vs {}",
                    t.simulated_seconds
                );
                assert!(t.restarts > 100, "{t:?}");
            }
        }
    }

    #[test]
    fn no_failures_means_only_checkpoints_cost() {
        let (exposure, mut costs) = setup(RecoveryPolicy::Rollback);
        costs.system_mtbf_seconds = 1e30;
        let plan = Plan {
            steps_per_checkpoint: Some(99),
            recovery: RecoveryPolicy::Rollback,
            horizon_seconds: 86_400.0,
            seed: 1,
        };
        let t = simulate_run(&exposure, &costs, plan, 0);
        let cycle = 99.0 * costs.step_seconds + costs.checkpoint_write_seconds;
        let expected = 99.0 * costs.step_seconds / cycle;
        assert_eq!(t.restarts, 0);
        assert!((t.goodput(costs.step_seconds) - expected).abs() < 1e-3);
    }
}
