//! Jumping over a run of identical iterations of a schedule, so a model of
//! 10¹¹ equal buckets costs what a model of ten does.
//!
//! The strategy model's schedules ([`super::streams`]) are
//! max-plus: every time is the largest of earlier times and inputs, plus a
//! duration. Over a run of iterations that do the same work (equal
//! buckets, the same collectives), once every `max` keeps choosing the same
//! argument the system is affine: each iteration adds the same increment
//! `D` to every carried time, and the same amount to every sum. Three
//! consecutive iterations whose two increments are equal and whose choices
//! are the same prove it (the choices fix which earlier time each new one
//! copies, so the increments copy too), and the choices hold while no
//! margin `a − b` of a `max(a, b)` changes sign: each margin moves by a
//! fixed amount per iteration, so the first iteration where one would flip
//! is known. The
//! run then advances `k` iterations at once (`state += k·D`, sums `+= k·Δ`)
//! and is simulated again from there.
//!
//! The result is the iteration-by-iteration simulation's up to floating
//! rounding (`k·D` for `D` added `k` times); runs shorter than
//! [`MIN_JUMP`] iterations, and schedules that record spans, are simulated
//! one by one, so small models keep their bits.

/// The fewest iterations a jump skips: shorter runs are simulated.
pub(super) const MIN_JUMP: u64 = 16;

/// What one iteration carried and summed, as [`SteadyState::end`] sees it.
#[derive(Debug, Clone, Default)]
struct Snapshot {
    state: Vec<f64>,
    margins: Vec<f64>,
    sums: Vec<f64>,
    bytes: Vec<u128>,
}

/// A jump: `iterations` iterations at once, each adding these increments.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Jump {
    /// Iterations skipped.
    pub(super) iterations: u64,
    /// Per iteration, each carried time's increment.
    pub(super) state: Vec<f64>,
    /// Per iteration, each sum's increment.
    pub(super) sums: Vec<f64>,
    /// Per iteration, each byte count's increment.
    pub(super) bytes: Vec<u128>,
}

/// The margins of the current iteration's choices and the last three
/// iterations' snapshots of one run.
#[derive(Debug, Clone)]
pub(super) struct SteadyState {
    enabled: bool,
    margins: Vec<f64>,
    history: Vec<Snapshot>,
    /// Buffers of snapshots dropped, for the next ones: a step ends dozens
    /// of iterations, and a search models thousands of steps.
    spare_f64: Vec<Vec<f64>>,
    spare_u128: Vec<Vec<u128>>,
    /// Iterations simulated one by one (the rest were jumped).
    pub(super) simulated: u64,
}

impl SteadyState {
    /// A detector; `enabled: false` simulates every iteration.
    pub(super) fn new(enabled: bool) -> SteadyState {
        SteadyState {
            enabled,
            margins: Vec::new(),
            history: Vec::new(),
            spare_f64: Vec::new(),
            spare_u128: Vec::new(),
            simulated: 0,
        }
    }

    /// Whether iterations are snapshotted (and jumped).
    pub(super) fn enabled(&self) -> bool {
        self.enabled
    }

    /// An empty buffer for an iteration's carried times or sums.
    pub(super) fn f64_buffer(&mut self) -> Vec<f64> {
        self.spare_f64.pop().unwrap_or_default()
    }

    /// An empty buffer for an iteration's byte counts.
    pub(super) fn u128_buffer(&mut self) -> Vec<u128> {
        self.spare_u128.pop().unwrap_or_default()
    }

    /// Keeps `snapshot`'s buffers for the next ones.
    fn recycle(&mut self, snapshot: Snapshot) {
        for mut v in [snapshot.state, snapshot.margins, snapshot.sums] {
            v.clear();
            self.spare_f64.push(v);
        }
        let mut bytes = snapshot.bytes;
        bytes.clear();
        self.spare_u128.push(bytes);
    }

    /// Forgets the snapshots, keeping their buffers.
    fn clear_history(&mut self) {
        let history = std::mem::take(&mut self.history);
        for snapshot in history {
            self.recycle(snapshot);
        }
    }

    /// `a.max(b)`, remembering the choice's margin.
    pub(super) fn max(&mut self, a: f64, b: f64) -> f64 {
        if self.enabled {
            self.margins.push(a - b);
        }
        a.max(b)
    }

    /// Forgets the run: the next iteration starts a new one (its work
    /// differs from the last's).
    pub(super) fn new_run(&mut self) {
        self.clear_history();
        self.margins.clear();
    }

    /// Ends an iteration whose carried times are `state` and whose sums so
    /// far are `sums` and `bytes`; `remaining` iterations of the run follow
    /// it. The jump to take, if the run is in its affine regime.
    pub(super) fn end(
        &mut self,
        state: Vec<f64>,
        sums: Vec<f64>,
        bytes: Vec<u128>,
        remaining: u64,
    ) -> Option<Jump> {
        self.simulated += 1;
        if !self.enabled {
            return None;
        }
        let margins = self.f64_buffer();
        let snapshot = Snapshot {
            state,
            margins: std::mem::replace(&mut self.margins, margins),
            sums,
            bytes,
        };
        if self.history.len() == 3 {
            let oldest = self.history.remove(0);
            self.recycle(oldest);
        }
        self.history.push(snapshot);
        if remaining < MIN_JUMP || self.history.len() < 3 {
            return None;
        }
        let jump = self.affine_jump(remaining)?;
        self.clear_history();
        Some(jump)
    }

    /// The jump the last three iterations prove, if any: the same
    /// increment of every carried time twice, the same choices, as many
    /// iterations as no margin flips (and `remaining` allows).
    fn affine_jump(&self, remaining: u64) -> Option<Jump> {
        let [first, a, b] = [&self.history[0], &self.history[1], &self.history[2]];
        let increments = difference(&b.state, &a.state)?;
        let before = difference(&a.state, &first.state)?;
        let same_shape = |x: &Snapshot| {
            x.margins.len() == b.margins.len()
                && x.sums.len() == b.sums.len()
                && x.bytes.len() == b.bytes.len()
        };
        if !same_shape(a) || !same_shape(first) {
            return None;
        }
        let scale = b
            .state
            .iter()
            .chain(&b.margins)
            .fold(1e-9f64, |m, v| m.max(v.abs()));
        // Rounding in a difference of times of size `scale`.
        let tolerance = 1e-12 * scale;
        if increments
            .iter()
            .zip(&before)
            .any(|(d, e)| (d - e).abs() > tolerance)
        {
            return None;
        }
        let mut iterations = remaining;
        for ((&m, &m0), &m1) in first.margins.iter().zip(&a.margins).zip(&b.margins) {
            if (m >= 0.0) != (m1 >= 0.0) || (m0 >= 0.0) != (m1 >= 0.0) {
                return None;
            }
            let slope = m1 - m0;
            if slope.abs() <= tolerance {
                continue;
            }
            let flips_after = if m1 >= 0.0 && slope < 0.0 {
                m1 / -slope
            } else if m1 < 0.0 && slope > 0.0 {
                -m1 / slope
            } else {
                continue;
            };
            // Stop two iterations short of the flip: rounding may move it.
            let safe = (flips_after.floor() - 2.0).max(0.0);
            iterations = iterations.min(if safe >= u64::MAX as f64 {
                u64::MAX
            } else {
                safe as u64
            });
        }
        if iterations < MIN_JUMP {
            return None;
        }
        let sums = difference(&b.sums, &a.sums)?;
        let bytes: Option<Vec<u128>> = b
            .bytes
            .iter()
            .zip(&a.bytes)
            .map(|(&y, &x)| y.checked_sub(x))
            .collect();
        Some(Jump {
            iterations,
            state: increments,
            sums,
            bytes: bytes?,
        })
    }
}

/// `b − a` componentwise, if they have the same length.
fn difference(b: &[f64], a: &[f64]) -> Option<Vec<f64>> {
    (a.len() == b.len()).then(|| b.iter().zip(a).map(|(y, x)| y - x).collect())
}
