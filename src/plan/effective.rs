//! Ranking by goodput: each layout's tokens a second times the goodput of
//! a run of it through failures, at the checkpoint interval that run does
//! best at ([`crate::goodput`]'s `auto` search).
//!
//! The goodput of a layout depends on its step (how much work a failure
//! throws away, how many steps a checkpoint interval holds) and its
//! recovery policy (what a failure costs, and the redundant copies' per
//! step). It never exceeds 1, so a layout's tokens a second bound its
//! effective throughput: the search ranks the raw throughput exactly, the
//! goodput is simulated for its top, and the top widens until the
//! `keep`-th effective throughput is at least the raw throughput of every
//! layout left out — the ranking is then exactly an exhaustive one's.

use serde::Serialize;

use super::search::{Candidate, Plan, PlanRequest, plan};
use crate::goodput::{Fleet, GoodputConfig, GoodputError, simulate};
use crate::sharding::RecoveryPolicy;

/// A fitting layout ranked by goodput.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Effective {
    /// The layout and its step.
    pub candidate: Candidate,
    /// Productive time over the run's time at its best checkpoint interval.
    pub goodput: f64,
    /// `tokens_per_s_per_chip × goodput`.
    pub effective_tokens_per_s_per_chip: f64,
    /// The interval the run does best at, seconds of training (`None`: no
    /// checkpoints).
    pub checkpoint_interval_seconds: Option<f64>,
}

/// [`plan`] ranked by effective throughput under `goodput`'s failures,
/// checkpoints and recoveries (each layout's own recovery policy and
/// step): the search's plan (its ranked list as wide as the exact ranking
/// needed) and the `request.keep` best by effective throughput.
pub fn plan_by_goodput(
    request: &PlanRequest,
    fleet: &Fleet,
    goodput: &GoodputConfig,
) -> Result<(Plan, Vec<Effective>), GoodputError> {
    let keep = request.keep.max(1);
    let mut widened = keep * 4;
    // A run's goodput depends on the layout only through its step and its
    // recovery policy (the seed and every other input are the request's),
    // so layouts that tie there (prefetch depths, reduction schedules the
    // step hides) share one simulation, and a wider search does not
    // simulate the narrower one's top again.
    let mut runs = Runs::new();
    loop {
        let searched = plan(&PlanRequest {
            keep: widened,
            ..request.clone()
        });
        let mut ranked = Vec::with_capacity(searched.ranked.len());
        for candidate in &searched.ranked {
            ranked.push(effective(candidate, fleet, goodput, &mut runs)?);
        }
        ranked.sort_by(|a, b| {
            b.effective_tokens_per_s_per_chip
                .total_cmp(&a.effective_tokens_per_s_per_chip)
                .then(a.candidate.order.cmp(&b.candidate.order))
        });
        // Every layout left out is at most the last kept one's raw
        // throughput; if the keep-th effective beats it, none can enter.
        let complete = searched.ranked.len() < widened
            || ranked.get(keep - 1).is_some_and(|k| {
                searched.ranked.last().is_some_and(|last| {
                    k.effective_tokens_per_s_per_chip >= last.tokens_per_s_per_chip
                })
            });
        if complete {
            ranked.truncate(keep);
            return Ok((searched, ranked));
        }
        widened *= 4;
    }
}

/// Simulated runs by (step seconds' bits, recovery policy): the goodput
/// and the best checkpoint interval.
type Runs = std::collections::HashMap<(u64, RecoveryPolicy), (f64, Option<f64>)>;

/// `candidate`'s goodput on `fleet` under `goodput`'s inputs.
fn effective(
    candidate: &Candidate,
    fleet: &Fleet,
    goodput: &GoodputConfig,
    runs: &mut Runs,
) -> Result<Effective, GoodputError> {
    let key = (candidate.step_seconds.to_bits(), candidate.layout.recovery);
    let (goodput, interval) = match runs.get(&key) {
        Some(run) => *run,
        None => {
            let config = GoodputConfig {
                step_seconds: candidate.step_seconds,
                recovery: candidate.layout.recovery,
                ..goodput.clone()
            };
            let report = simulate(fleet, &config)?;
            let run = (report.goodput, report.checkpoint_interval_seconds);
            runs.insert(key, run);
            run
        }
    };
    Ok(Effective {
        candidate: candidate.clone(),
        goodput,
        effective_tokens_per_s_per_chip: candidate.tokens_per_s_per_chip * goodput,
        checkpoint_interval_seconds: interval,
    })
}
