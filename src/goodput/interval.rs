//! Choosing the checkpoint interval by simulation (`--checkpoint-every
//! auto`), and Young/Daly's closed form it is checked against.
//!
//! The search simulates every candidate interval on the same failures
//! (common random numbers: replicates `0..R` of the run's seed), enough
//! replicates for about [`SEARCH_FAILURES`] failures in all, so that the
//! comparison between intervals is not swamped by which failures were
//! drawn. A coarse grid (ratio [`COARSE_RATIO`]) from one step to the whole
//! run finds the best region; a fine grid (ratio [`FINE_RATIO`]) around it
//! is fitted with a parabola in log-interval, whose vertex is the answer
//! (the simulated waste is flat near its minimum, and the fit averages
//! the noise of many points instead of trusting one); the vertex is scored
//! on the same replicates for the figure reported. Writing no
//! checkpoints is a candidate as well, so `auto` is never worse than
//! `never` on the same replicates.

use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;
use serde::Serialize;

use super::inputs::Costs;
use super::timeline::{Exposure, Plan, simulate_replicates};

/// Failures the search simulates per candidate, over its replicates.
pub const SEARCH_FAILURES: f64 = 40_000.0;
/// The most replicates the search runs (a run with almost no failures).
pub const MAX_SEARCH_REPLICATES: u64 = 10_000;
/// Step between coarse candidates.
pub const COARSE_RATIO: f64 = 1.25;
/// Step between fine candidates.
pub const FINE_RATIO: f64 = 1.03;
/// The fine grid spans this many coarse steps either side of the best.
const FINE_SPAN: i32 = 2;

/// Young's optimal interval between checkpoints, `√(2·C·M)` for a
/// checkpoint of `C` seconds and a mean time between failures of `M`
/// (J. W. Young, CACM 17(9), 1974; J. T. Daly, FGCS 22(3), 2006, whose
/// higher-order estimate is within a few percent of it when `C ≪ M`).
pub fn young_daly_seconds(checkpoint_seconds: f64, system_mtbf_seconds: f64) -> f64 {
    (2.0 * checkpoint_seconds * system_mtbf_seconds).sqrt()
}

/// What the search found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IntervalSearch {
    /// The chosen interval, steps (`None`: never checkpoint, which did
    /// best).
    pub steps: Option<u64>,
    /// The chosen interval, seconds of training (`None`: never).
    pub seconds: Option<f64>,
    /// The chosen plan's goodput on the search's replicates.
    pub goodput: f64,
    /// Goodput with no checkpoints on the same replicates: `goodput` is
    /// never below it (`never` is a candidate).
    pub never_goodput: f64,
    /// Intervals simulated.
    pub candidates: usize,
    /// Replicates per candidate.
    pub replicates: u64,
    /// Failures simulated per candidate.
    pub failures_per_candidate: u64,
}

/// Geometric grid of whole step counts in `[lo, hi]` with `ratio`.
fn grid(lo: f64, hi: f64, ratio: f64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut x = lo.max(1.0);
    while x <= hi * (1.0 + 1e-12) {
        let n = x.round().max(1.0) as u64;
        if out.last() != Some(&n) {
            out.push(n);
        }
        x *= ratio;
    }
    out
}

/// Least-squares parabola through `(x, y)`: the vertex's `x`, if the
/// parabola opens upward.
fn parabola_vertex(points: &[(f64, f64)]) -> Option<f64> {
    if points.len() < 3 {
        return None;
    }
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / points.len() as f64;
    // Normal equations of y = a + b·u + c·u² with u = x − mean_x.
    let mut s = [0.0f64; 5];
    let mut t = [0.0f64; 3];
    for &(x, y) in points {
        let u = x - mean_x;
        let mut p = 1.0;
        for (k, sk) in s.iter_mut().enumerate() {
            *sk += p;
            if k < 3 {
                t[k] += p * y;
            }
            p *= u;
        }
    }
    let m = [[s[0], s[1], s[2]], [s[1], s[2], s[3]], [s[2], s[3], s[4]]];
    let det = |m: [[f64; 3]; 3]| {
        m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
    };
    let d = det(m);
    if d.abs() < f64::MIN_POSITIVE {
        return None;
    }
    let column = |k: usize| {
        let mut mk = m;
        for (row, tk) in mk.iter_mut().zip(t) {
            row[k] = tk;
        }
        det(mk) / d
    };
    let (b, c) = (column(1), column(2));
    (c > 0.0).then(|| mean_x - b / (2.0 * c))
}

/// Searches the interval (in steps) with the best simulated goodput for
/// `plan`'s run (its `steps_per_checkpoint` is ignored). Writing no
/// checkpoints at all is a candidate too: on a run shorter than a restart,
/// or with failures so rare that a checkpoint costs more than it saves, it
/// wins, so `auto` never does worse than `never` on the search's
/// replicates.
pub fn search_interval(exposure: &Exposure, costs: &Costs, plan: Plan) -> IntervalSearch {
    search_interval_with_progress(exposure, costs, plan, &|_, _| {})
}

/// [`search_interval`], calling `progress(done, planned)` after each
/// candidate is simulated (from any thread): `planned` grows once the fine
/// grid is known.
pub fn search_interval_with_progress(
    exposure: &Exposure,
    costs: &Costs,
    plan: Plan,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> IntervalSearch {
    let step = costs.step_seconds + costs.replication_seconds_per_step;
    let expected = plan.horizon_seconds / costs.system_mtbf_seconds;
    let replicates =
        ((SEARCH_FAILURES / expected.max(1e-9)).ceil() as u64).clamp(1, MAX_SEARCH_REPLICATES);
    let most = (plan.horizon_seconds / step).floor().max(1.0);
    let done = AtomicUsize::new(0);
    let planned = AtomicUsize::new(0);
    let goodput_of = |steps: Option<u64>| {
        let plan = Plan {
            steps_per_checkpoint: steps,
            ..plan
        };
        let goodput =
            simulate_replicates(exposure, costs, plan, replicates).goodput(costs.step_seconds);
        let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
        progress(finished, planned.load(Ordering::Relaxed).max(finished));
        goodput
    };
    let score = |n: u64| (n, goodput_of(Some(n)));
    let best_of = |scored: &[(u64, f64)]| {
        scored
            .iter()
            .copied()
            .fold((1, f64::NEG_INFINITY), |b, s| if s.1 > b.1 { s } else { b })
    };
    let coarse_grid = grid(1.0, most, COARSE_RATIO);
    // The coarse grid, `never` and the vertex's own score; the fine grid
    // is added once known.
    planned.store(coarse_grid.len() + 2, Ordering::Relaxed);
    let never_goodput = goodput_of(None);
    let coarse: Vec<(u64, f64)> = coarse_grid.into_par_iter().map(score).collect();
    let (best, _) = best_of(&coarse);
    let span = COARSE_RATIO.powi(FINE_SPAN);
    let lo = (best as f64 / span).max(1.0);
    let hi = (best as f64 * span).min(most);
    let fine_grid = grid(lo, hi, FINE_RATIO);
    planned.fetch_add(fine_grid.len(), Ordering::Relaxed);
    let fine: Vec<(u64, f64)> = fine_grid.into_par_iter().map(score).collect();
    let (fine_best, fine_goodput) = best_of(&fine);
    let points: Vec<(f64, f64)> = fine.iter().map(|&(n, g)| ((n as f64).ln(), g)).collect();
    // The fit maximizes goodput: a parabola of the waste, 1 − goodput.
    let waste: Vec<(f64, f64)> = points.iter().map(|&(x, g)| (x, 1.0 - g)).collect();
    let fitted = parabola_vertex(&waste)
        .map(f64::exp)
        .filter(|&n| n >= lo && n <= hi)
        .map(|n| n.round().max(1.0) as u64);
    // The fitted vertex (when the fit has one in range) is the answer, and
    // its own score is the one reported and compared with `never`.
    let (steps, goodput) = match fitted {
        Some(n) if n != fine_best => (n, goodput_of(Some(n))),
        _ => (fine_best, fine_goodput),
    };
    let (steps, goodput) = if goodput > never_goodput {
        (Some(steps), goodput)
    } else if fine_goodput > never_goodput {
        (Some(fine_best), fine_goodput)
    } else {
        (None, never_goodput)
    };
    IntervalSearch {
        steps,
        seconds: steps.map(|n| n as f64 * step),
        goodput,
        never_goodput,
        candidates: done.load(Ordering::Relaxed),
        replicates,
        failures_per_candidate: (expected * replicates as f64).round() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fitted_vertex_is_the_parabolas() {
        let points: Vec<(f64, f64)> = (0..9)
            .map(|i| {
                let x = i as f64 * 0.1;
                (x, 3.0 * (x - 0.37).powi(2) + 1.0)
            })
            .collect();
        let v = parabola_vertex(&points).unwrap();
        assert!((v - 0.37).abs() < 1e-9, "{v}");
        let down: Vec<(f64, f64)> = points.iter().map(|&(x, y)| (x, -y)).collect();
        assert_eq!(parabola_vertex(&down), None);
    }

    #[test]
    fn grids_are_whole_distinct_and_span_the_range() {
        let g = grid(1.0, 1000.0, 1.25);
        assert_eq!(g[0], 1);
        assert!(g.windows(2).all(|w| w[0] < w[1]));
        assert!(*g.last().unwrap() <= 1000 && *g.last().unwrap() > 700);
    }
}
