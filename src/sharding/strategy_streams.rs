//! The strategy model's two streams (compute and communication) and the
//! step's sums: where each bucket's stages land in time
//! ([`super::strategy_model`]'s module docs give the orders).

use std::collections::BTreeMap;

use super::strategy_model::{AxisFigures, BucketSpan, Costing, LengthCost, Round, SpanKind, Uses};

/// The two streams and the step's sums.
pub(super) struct Streams {
    pub(super) comm_free: f64,
    pub(super) compute_free: f64,
    pub(super) update_seconds: f64,
    /// As `timing::schedule` sums the update phase: each span's length.
    pub(super) update_phase: f64,
    pub(super) use_total: f64,
    pub(super) phase_seconds: Vec<f64>,
    pub(super) phase_bytes: Vec<u64>,
    pub(super) axis_seconds: Vec<f64>,
    pub(super) axis_bytes: Vec<u64>,
    pub(super) record: bool,
    pub(super) spans: Vec<BucketSpan>,
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
        BTreeMap<String, u64>,
        BTreeMap<String, AxisFigures>,
    ) {
        let update_key = "update".to_string();
        let mut phases: BTreeMap<String, f64> = BTreeMap::new();
        let mut phase_bytes: BTreeMap<String, u64> = BTreeMap::new();
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
        }
    }

    fn span(&mut self, bucket: usize, kind: SpanKind, start: f64, end: f64) {
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
    fn comm(&mut self, bucket: usize, kind: SpanKind, rounds: &[Round], ready: f64) -> f64 {
        let start = self.comm_free.max(ready);
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
            self.phase_bytes[r.phase] += r.bytes;
            self.axis_bytes[r.axis] += r.bytes;
            round_end = round_end.max(end);
        }
        let at = round_end;
        self.comm_free = at;
        if !rounds.is_empty() {
            self.span(bucket, kind, start, at);
        }
        at
    }

    fn compute(&mut self, bucket: usize, kind: SpanKind, seconds: f64, ready: f64) -> f64 {
        let start = self.compute_free.max(ready);
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

    /// replicated and zero2 (module docs).
    pub(super) fn data_parallel(&mut self, costs: &[LengthCost], per_bucket: &[usize], uses: Uses) {
        let b = per_bucket.len();
        let mut used = vec![0.0f64; b];
        for k in 0..b {
            self.compute(k, SpanKind::Use { backward: false }, uses.forward, 0.0);
        }
        self.between(uses.between);
        for (k, end) in used.iter_mut().enumerate() {
            *end = self.compute(k, SpanKind::Use { backward: true }, uses.backward, 0.0);
        }
        let backward_end = used.last().copied().unwrap_or(0.0);
        let mut update_end = vec![0.0f64; b];
        for k in 0..=b {
            if k < b {
                let c = &costs[per_bucket[k]];
                let mut in_at = self.comm(k, SpanKind::ReduceScatter, &c.gradient, used[k]);
                if !c.data_gradient.is_empty() {
                    let ready = in_at.max(backward_end);
                    in_at = self.comm(k, SpanKind::DataReduction, &c.data_gradient, ready);
                }
                update_end[k] = self.compute(k, SpanKind::Update, c.update, in_at);
            }
            if k >= 1 {
                let j = k - 1;
                self.after(j, &costs[per_bucket[j]], update_end[j]);
            }
        }
    }

    /// The compute between the forward and the backward pass.
    fn between(&mut self, seconds: f64) {
        if seconds > 0.0 {
            let start = self.compute_free;
            self.compute_free += seconds;
            self.use_total += seconds;
            self.span(0, SpanKind::Between, start, self.compute_free);
        }
    }

    /// The all-gather after bucket `j`'s update, then its state copy.
    fn after(&mut self, j: usize, cost: &LengthCost, ready: f64) {
        let end = self.comm(j, SpanKind::AllGather, &cost.all_gather, ready);
        self.comm(j, SpanKind::ReplicateState, &cost.replicate, end);
    }

    /// fsdp (module docs).
    pub(super) fn fsdp(
        &mut self,
        costs: &[LengthCost],
        per_bucket: &[usize],
        seconds: Uses,
        prefetch: usize,
    ) {
        let b = per_bucket.len();
        let uses = 2 * b;
        let bucket_of = |s: usize| if s < b { s } else { uses - 1 - s };
        let window = prefetch.saturating_add(1);
        let mut used = vec![0.0f64; uses];
        let gather = |st: &mut Streams, s: usize, used: &[f64]| {
            let ready = if s >= window { used[s - window] } else { 0.0 };
            let k = bucket_of(s);
            let rounds = &costs[per_bucket[k]].gather;
            st.comm(k, SpanKind::Gather { backward: s >= b }, rounds, ready)
                .max(ready)
        };
        let mut gathered_end = vec![0.0f64; uses];
        for (s, end) in gathered_end.iter_mut().enumerate().take(window) {
            *end = gather(self, s, &used);
        }
        let mut pending: Option<(usize, f64)> = None;
        let mut deferred: Vec<(usize, f64)> = Vec::new();
        for s in 0..uses {
            let k = bucket_of(s);
            let backward = s >= b;
            if s == b {
                self.between(seconds.between);
            }
            let use_seconds = if backward {
                seconds.backward
            } else {
                seconds.forward
            };
            used[s] = self.compute(k, SpanKind::Use { backward }, use_seconds, gathered_end[s]);
            self.span(k, SpanKind::Free { backward }, used[s], used[s]);
            if let Some((j, ready)) = pending.take() {
                let end = self.compute(j, SpanKind::Update, costs[per_bucket[j]].update, ready);
                self.comm(
                    j,
                    SpanKind::ReplicateState,
                    &costs[per_bucket[j]].replicate,
                    end,
                );
            }
            if s + window < uses {
                gathered_end[s + window] = gather(self, s + window, &used);
            }
            if backward {
                let in_at = self.comm(
                    k,
                    SpanKind::ReduceScatter,
                    &costs[per_bucket[k]].gradient,
                    used[s],
                );
                if costs[per_bucket[k]].data_gradient.is_empty() {
                    pending = Some((k, in_at));
                } else {
                    deferred.push((k, in_at));
                }
            }
        }
        // The reductions over `data` that wait for the backward pass, then
        // their buckets' updates.
        let backward_end = used.last().copied().unwrap_or(0.0);
        for (k, in_at) in deferred {
            let c = &costs[per_bucket[k]];
            let ready = self.comm(
                k,
                SpanKind::DataReduction,
                &c.data_gradient,
                in_at.max(backward_end),
            );
            let end = self.compute(k, SpanKind::Update, c.update, ready);
            self.comm(k, SpanKind::ReplicateState, &c.replicate, end);
        }
        if let Some((j, ready)) = pending {
            let end = self.compute(j, SpanKind::Update, costs[per_bucket[j]].update, ready);
            self.comm(
                j,
                SpanKind::ReplicateState,
                &costs[per_bucket[j]].replicate,
                end,
            );
        }
    }
}
