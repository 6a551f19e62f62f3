//! The strategy model's two streams (compute and communication) and the
//! step's sums: where each bucket's stages land in time
//! ([`super::strategy`]'s module docs give the orders).
//!
//! Each schedule walks its buckets (or uses) as runs of equal work
//! ([`BucketRuns`]); inside a run, once the schedule repeats itself, it
//! jumps ahead ([`SteadyState`]), so the cost of modeling does not grow
//! with the model.

use std::collections::BTreeMap;

use super::steady_state::{Jump, SteadyState};
use super::strategy::{AxisFigures, BucketSpan, Costing, LengthCost, Round, SpanKind, Uses};
use crate::sharding::bucket_runs::BucketRuns;

/// The two streams and the step's sums.
pub(super) struct Streams {
    pub(super) comm_free: f64,
    pub(super) compute_free: f64,
    pub(super) update_seconds: f64,
    /// As `timing::schedule` sums the update phase: each span's length.
    pub(super) update_phase: f64,
    pub(super) use_total: f64,
    pub(super) phase_seconds: Vec<f64>,
    pub(super) phase_bytes: Vec<u128>,
    pub(super) axis_seconds: Vec<f64>,
    pub(super) axis_bytes: Vec<u128>,
    pub(super) record: bool,
    pub(super) spans: Vec<BucketSpan>,
    pub(super) steady: SteadyState,
    /// Whether a stage with no passes (a collective over an axis of one
    /// device, no state copy) leaves the stream alone: the training order.
    /// The optimizer order lets it hold the stream until it is ready, as
    /// the real run's schedule does.
    pub(super) skip_empty: bool,
}

/// The buckets and what each run's bucket costs.
#[derive(Clone, Copy)]
pub(super) struct Work<'a> {
    pub(super) costs: &'a [LengthCost],
    pub(super) runs: &'a BucketRuns,
}

impl Work<'_> {
    pub(super) fn cost(&self, bucket: usize) -> &LengthCost {
        &self.costs[self.runs.run_of(bucket)]
    }
}

/// Indices from which a loop's iterations may differ from the one before:
/// each of `points` shifted by `shifts`, in `0..=end`, sorted.
pub(super) fn cuts(
    points: &[usize],
    shifts: std::ops::RangeInclusive<isize>,
    end: usize,
) -> Vec<usize> {
    // Sized once: a flat-map's collect grows the vector step by step,
    // and a step model calls this on every schedule.
    let width = (shifts.end() - shifts.start() + 1).max(0) as usize;
    let mut out: Vec<usize> = Vec::with_capacity(points.len() * width + 2);
    for &p in points {
        out.extend(
            shifts
                .clone()
                .map(|d| p as isize + d)
                .filter(|&x| x >= 0 && x as usize <= end)
                .map(|x| x as usize),
        );
    }
    out.push(0);
    out.push(end);
    out.sort_unstable();
    out.dedup();
    out
}

/// Iterations left in the run of iteration `i` after it (`cuts` sorted).
pub(super) fn remaining(cuts: &[usize], i: usize) -> u64 {
    let next = cuts.partition_point(|&c| c <= i);
    cuts.get(next).map_or(0, |&c| (c - i - 1) as u64)
}

impl Streams {
    /// Per phase the seconds and bytes, plus `exposed_communication` (the
    /// step's `step_seconds` minus its compute); per physical axis both.
    pub(super) fn totals(
        &self,
        costing: &Costing,
        has_buckets: bool,
        step_seconds: f64,
    ) -> (
        BTreeMap<String, f64>,
        BTreeMap<String, u128>,
        BTreeMap<String, AxisFigures>,
    ) {
        let update_key = "update".to_string();
        let mut phases: BTreeMap<String, f64> = BTreeMap::new();
        let mut phase_bytes: BTreeMap<String, u128> = BTreeMap::new();
        for (i, key) in costing.phases.0.iter().enumerate() {
            phases.insert(key.clone(), self.phase_seconds[i]);
            phase_bytes.insert(key.clone(), self.phase_bytes[i]);
        }
        if has_buckets {
            phases.insert(update_key, self.update_phase);
        }
        let compute = self.update_seconds + self.use_total;
        phases.insert(
            "exposed_communication".into(),
            (step_seconds - compute).max(0.0),
        );
        let axes: BTreeMap<String, AxisFigures> = costing
            .axes
            .0
            .iter()
            .enumerate()
            .map(|(i, k)| {
                (
                    k.clone(),
                    AxisFigures {
                        seconds: self.axis_seconds[i],
                        link_bytes: self.axis_bytes[i],
                    },
                )
            })
            .collect();
        (phases, phase_bytes, axes)
    }

    pub(super) fn new(phases: usize, axes: usize, record: bool) -> Streams {
        Streams {
            comm_free: 0.0,
            compute_free: 0.0,
            update_seconds: 0.0,
            update_phase: 0.0,
            use_total: 0.0,
            phase_seconds: vec![0.0; phases],
            phase_bytes: vec![0; phases],
            axis_seconds: vec![0.0; axes],
            axis_bytes: vec![0; axes],
            record,
            spans: Vec::new(),
            // Spans are per bucket: a recording schedule simulates each.
            steady: SteadyState::new(!record),
            skip_empty: false,
        }
    }

    pub(super) fn span(&mut self, bucket: usize, kind: SpanKind, start: f64, end: f64) {
        if self.record {
            self.spans.push(BucketSpan {
                bucket: bucket as u32,
                kind,
                start_seconds: start,
                end_seconds: end,
            });
        }
    }

    /// `rounds` on the communication stream once it is free and `ready`
    /// has passed: the end.
    pub(super) fn comm(
        &mut self,
        bucket: usize,
        kind: SpanKind,
        rounds: &[Round],
        ready: f64,
    ) -> f64 {
        if rounds.is_empty() && self.skip_empty {
            return ready;
        }
        let start = self.steady.max(self.comm_free, ready);
        let mut at = start;
        let mut round_end = start;
        let mut group = None;
        for r in rounds {
            if group != Some(r.group) {
                at = round_end;
                group = Some(r.group);
            }
            let end = at + r.seconds;
            // As `timing::schedule` sums a phase: each span's own length.
            self.phase_seconds[r.phase] += end - at;
            self.axis_seconds[r.axis] += end - at;
            self.phase_bytes[r.phase] += u128::from(r.bytes);
            self.axis_bytes[r.axis] += u128::from(r.bytes);
            round_end = round_end.max(end);
        }
        let at = round_end;
        self.comm_free = at;
        if !rounds.is_empty() {
            self.span(bucket, kind, start, at);
        }
        at
    }

    pub(super) fn compute(
        &mut self,
        bucket: usize,
        kind: SpanKind,
        seconds: f64,
        ready: f64,
    ) -> f64 {
        let start = self.steady.max(self.compute_free, ready);
        let end = start + seconds;
        self.compute_free = end;
        match kind {
            SpanKind::Update => {
                self.update_seconds += seconds;
                self.update_phase += end - start;
            }
            _ => self.use_total += seconds,
        }
        self.span(bucket, kind, start, end);
        end
    }

    /// The sums a jump advances: seconds, then bytes.
    pub(super) fn sums(&mut self) -> (Vec<f64>, Vec<u128>) {
        let mut seconds = self.steady.f64_buffer();
        seconds.extend([self.update_seconds, self.update_phase, self.use_total]);
        seconds.extend(&self.phase_seconds);
        seconds.extend(&self.axis_seconds);
        let mut bytes = self.steady.u128_buffer();
        bytes.extend(&self.phase_bytes);
        bytes.extend(&self.axis_bytes);
        (seconds, bytes)
    }

    /// Ends an iteration with `carried` times (the two streams' first),
    /// `left` iterations of its run after it: the jump taken (the sums and
    /// the streams advanced; the caller advances the rest of `carried` by
    /// the jump's increments).
    pub(super) fn end_iteration(&mut self, carried: Vec<f64>, left: u64) -> Option<Jump> {
        if !self.steady.enabled() {
            return self.steady.end(carried, Vec::new(), Vec::new(), left);
        }
        let (seconds, bytes) = self.sums();
        let jump = self.steady.end(carried, seconds, bytes, left)?;
        let k = jump.iterations as f64;
        self.comm_free += k * jump.state[0];
        self.compute_free += k * jump.state[1];
        let mut s = jump.sums.iter().map(|d| k * d);
        self.update_seconds += s.next().unwrap_or(0.0);
        self.update_phase += s.next().unwrap_or(0.0);
        self.use_total += s.next().unwrap_or(0.0);
        for (total, d) in self
            .phase_seconds
            .iter_mut()
            .chain(self.axis_seconds.iter_mut())
            .zip(s)
        {
            *total += d;
        }
        let n = u128::from(jump.iterations);
        for (total, d) in self
            .phase_bytes
            .iter_mut()
            .chain(self.axis_bytes.iter_mut())
            .zip(&jump.bytes)
        {
            *total = total.saturating_add(d.saturating_mul(n));
        }
        Some(jump)
    }

    /// replicated and zero2 with the new parameters all-gathered after
    /// each update (module docs): every use from the start, then each
    /// bucket's gradient collectives from the end of its backward use, its
    /// update, and the previous bucket's all-gather.
    pub(super) fn after_update(&mut self, work: Work, uses: Uses) {
        let b = work.runs.buckets();
        let forward_end = b as f64 * uses.forward;
        // Spans only when recording: a loop over every bucket would make
        // the cost of modeling grow with the model.
        if self.record {
            for k in 0..b {
                let start = k as f64 * uses.forward;
                self.span(
                    k,
                    SpanKind::Use { backward: false },
                    start,
                    start + uses.forward,
                );
            }
        }
        self.use_total += forward_end;
        self.compute_free = forward_end;
        self.between(uses.between);
        let backward_start = self.compute_free;
        let used = |k: usize| backward_start + (k + 1) as f64 * uses.backward;
        if self.record {
            for k in 0..b {
                self.span(
                    k,
                    SpanKind::Use { backward: true },
                    used(k) - uses.backward,
                    used(k),
                );
            }
        }
        self.use_total += b as f64 * uses.backward;
        self.compute_free = used(b.saturating_sub(1)).max(backward_start);
        let backward_end = self.compute_free;
        let mut points = work.runs.run_starts();
        points.push(b);
        let cuts = cuts(&points, -1..=2, b + 1);
        let mut previous_update = 0.0f64;
        let mut k = 0usize;
        while k <= b {
            if cuts.binary_search(&k).is_ok() {
                self.steady.new_run();
            }
            let mut update_end = 0.0;
            if k < b {
                let c = work.cost(k);
                let mut in_at = self.comm(k, SpanKind::ReduceScatter, &c.gradient, used(k));
                if !c.data_gradient.is_empty() {
                    let ready = self.steady.max(in_at, backward_end);
                    in_at = self.comm(k, SpanKind::DataReduction, &c.data_gradient, ready);
                }
                update_end = self.compute(k, SpanKind::Update, c.update, in_at);
            }
            if k >= 1 {
                let _ = self.after(k - 1, work.cost(k - 1), previous_update);
            }
            previous_update = update_end;
            let carried = vec![self.comm_free, self.compute_free, previous_update];
            if let Some(jump) = self.end_iteration(carried, remaining(&cuts, k)) {
                previous_update += jump.iterations as f64 * jump.state[2];
                k += jump.iterations as usize;
            }
            k += 1;
        }
    }

    /// The compute between the forward and the backward pass.
    pub(super) fn between(&mut self, seconds: f64) {
        if seconds > 0.0 {
            let start = self.compute_free;
            self.compute_free += seconds;
            self.use_total += seconds;
            self.span(0, SpanKind::Between, start, self.compute_free);
        }
    }

    /// The all-gather after bucket `j`'s update, then its state copy:
    /// when the new parameters are in.
    pub(super) fn after(&mut self, j: usize, cost: &LengthCost, ready: f64) -> f64 {
        let end = self.comm(j, SpanKind::AllGather, &cost.all_gather, ready);
        self.comm(j, SpanKind::ReplicateState, &cost.replicate, end);
        end
    }

    /// Forgets the sums and spans so far: what follows is the step reported.
    pub(super) fn reset_sums(&mut self) {
        self.update_seconds = 0.0;
        self.update_phase = 0.0;
        self.use_total = 0.0;
        self.phase_seconds.iter_mut().for_each(|v| *v = 0.0);
        self.axis_seconds.iter_mut().for_each(|v| *v = 0.0);
        self.phase_bytes.iter_mut().for_each(|v| *v = 0);
        self.axis_bytes.iter_mut().for_each(|v| *v = 0);
        self.spans.clear();
    }
}
