//! The pipelined order of [`super::strategy`] (its module docs):
//! forward and backward uses, each bucket's gradient collectives behind the
//! backward, each update after the next use; fsdp gathers before each use,
//! replicated and zero2 all-gather after each update. Consecutive steps
//! are simulated back to back, each step's forward waiting for the new
//! parameters of the step before, so a step's tail overlaps the next one's
//! head as it does in a run; the last step's length is the step (the
//! period of the steady state).

use std::collections::VecDeque;

use super::steady_state::Jump;
use super::strategy::{SpanKind, Uses};
use super::streams::{Streams, Work, cuts, remaining};

/// A gradient whose reduction over `data` waits for the end of the backward
/// pass: one bucket's, or a run of equal buckets' (descending from
/// `bucket`) whose gradients arrived `step` seconds apart.
#[derive(Debug, Clone, Copy)]
struct Deferred {
    bucket: usize,
    arrived: f64,
    step: f64,
    count: u64,
}

/// When each bucket's new parameters are in (its update under fsdp, its
/// all-gather after the update otherwise): written by one step's backward
/// in descending bucket order, read by the next step's forward. Affine
/// runs, so a jump over a run of buckets writes one.
#[derive(Debug, Clone, Default)]
struct ReadyTimes {
    /// `(highest bucket, buckets, time of the highest, increment per
    /// bucket below it)`, in the order written (descending buckets).
    runs: Vec<(usize, usize, f64, f64)>,
}

impl ReadyTimes {
    /// When bucket `k`'s parameters are in (0 before any step wrote it).
    fn get(&self, k: usize) -> f64 {
        let i = self.runs.partition_point(|r| r.0 + 1 > k + r.1);
        match self.runs.get(i) {
            Some(&(high, count, at, step)) if k <= high && high - k < count => {
                at + (high - k) as f64 * step
            }
            _ => 0.0,
        }
    }

    /// Bucket `k`'s parameters in at `at`.
    fn one(&mut self, k: usize, at: f64) {
        self.runs.push((k, 1, at, 0.0));
    }

    /// The `count` buckets below `high + 1`, the first in at `at`, each
    /// next `step` later.
    fn run(&mut self, high: usize, count: usize, at: f64, step: f64) {
        self.runs.push((high, count, at, step));
    }

    /// The lowest bucket of every run: where the next step's forward may
    /// change its pace.
    fn starts(&self) -> impl Iterator<Item = usize> + '_ {
        self.runs.iter().flat_map(|r| [r.0 + 1 - r.1, r.0 + 1])
    }
}

/// What one step of the pipeline carries into the next.
struct Carry {
    /// When each bucket's new parameters are in.
    ready: ReadyTimes,
    /// The ends of the step's last uses (a gather waits for the use
    /// `window` before it to free its buffer).
    recent_uses: VecDeque<f64>,
    /// replicated and zero2: the bucket updated after the last use and its
    /// update's end, whose all-gather over `data` waits for the next
    /// step's forward (it would otherwise hold up the last bucket's, which
    /// that forward needs first).
    held: Option<(usize, f64)>,
}

/// What one iteration of a step did that a jump extends.
struct Iteration {
    /// Its gradient waits for the end of the backward pass.
    deferring: bool,
    /// The bucket it updated and when its new parameters are in.
    written: Option<(usize, f64)>,
}

/// One step of the pipeline being placed.
struct StepRun<'w> {
    work: Work<'w>,
    seconds: Uses,
    window: usize,
    fsdp: bool,
    buckets: usize,
    uses: usize,
    /// The step before's new parameters, and the bucket it held back.
    before: ReadyTimes,
    from_before: Option<(usize, f64)>,
    /// When the gathers queued for the next uses end.
    ring: VecDeque<f64>,
    /// The ends of the last `window` uses.
    recent: VecDeque<f64>,
    cut_points: Vec<usize>,
    ready_times: ReadyTimes,
    pending: Option<(usize, f64)>,
    deferred: Vec<Deferred>,
    last_used: f64,
    held: Option<(usize, f64)>,
}

impl<'w> StepRun<'w> {
    fn new(work: Work<'w>, seconds: Uses, (window, fsdp): (usize, bool), carry: Carry) -> Self {
        let buckets = work.runs.buckets();
        let uses = 2 * buckets;
        let mut points: Vec<usize> = vec![0, buckets, uses];
        for &k in &work.runs.run_starts() {
            points.extend([k, uses.saturating_sub(k + 1)]);
        }
        points.extend(carry.ready.starts());
        let w = window as isize;
        StepRun {
            work,
            seconds,
            window,
            fsdp,
            buckets,
            uses,
            cut_points: cuts(&points, -w - 1..=2, uses),
            before: carry.ready,
            from_before: carry.held,
            ring: VecDeque::with_capacity(window + 1),
            recent: carry.recent_uses,
            ready_times: ReadyTimes::default(),
            pending: None,
            deferred: Vec::new(),
            last_used: 0.0,
            held: None,
        }
    }

    /// Use `s`'s bucket (forward `0..B−1`, backward `B−1..0`).
    fn bucket_of(&self, s: usize) -> usize {
        if s < self.buckets {
            s
        } else {
            self.uses - 1 - s
        }
    }

    /// The gathers of the first `window` uses: each waits for its buffer
    /// (the use `window` before it, in the step before) and for the new
    /// parameters.
    fn fill_ring(&mut self, streams: &mut Streams) {
        for s in 0..self.window.min(self.uses) {
            let k = self.bucket_of(s);
            let freed = (self.recent.len() + s)
                .checked_sub(self.window)
                .and_then(|i| self.recent.get(i).copied())
                .unwrap_or(0.0);
            let ready = if self.fsdp {
                streams.steady.max(freed, self.before.get(k))
            } else {
                streams.new_params(k, self.work, &self.before, &mut self.from_before)
            };
            let end = streams.gather(s >= self.buckets, k, (self.work, self.fsdp), ready);
            self.ring.push_back(end);
        }
        self.recent.clear();
    }

    /// Use `s`, the update it lets run, the next gather, its gradient.
    fn iteration(&mut self, streams: &mut Streams, s: usize) -> Iteration {
        let (work, fsdp) = (self.work, self.fsdp);
        let k = self.bucket_of(s);
        let backward = s >= self.buckets;
        if s == self.buckets {
            streams.between(self.seconds.between);
        }
        let use_seconds = if backward {
            self.seconds.backward
        } else {
            self.seconds.forward
        };
        let ready = self.ring.pop_front().unwrap_or(0.0);
        let used = streams.compute(k, SpanKind::Use { backward }, use_seconds, ready);
        self.last_used = used;
        streams.span(k, SpanKind::Free { backward }, used, used);
        let updated = self.pending.take().map(|(j, ready)| {
            let end = streams.compute(j, SpanKind::Update, work.cost(j).update, ready);
            if fsdp {
                streams.comm(j, SpanKind::ReplicateState, &work.cost(j).replicate, end);
            }
            (j, end)
        });
        if s + self.window < self.uses {
            let next = s + self.window;
            // fsdp's gather waits for a free buffer; every forward gather
            // for the new parameters.
            let ready = match (fsdp, next < self.buckets) {
                (true, true) => streams.steady.max(used, self.before.get(next)),
                (true, false) => used,
                (false, true) => {
                    streams.new_params(next, work, &self.before, &mut self.from_before)
                }
                (false, false) => 0.0,
            };
            let end = streams.gather(
                next >= self.buckets,
                self.bucket_of(next),
                (work, fsdp),
                ready,
            );
            self.ring.push_back(end);
        }
        let mut deferring = false;
        if backward {
            let c = work.cost(k);
            let in_at = streams.comm(k, SpanKind::ReduceScatter, &c.gradient, used);
            if c.data_gradient.is_empty() {
                self.pending = Some((k, in_at));
            } else {
                deferring = true;
                self.deferred.push(Deferred {
                    bucket: k,
                    arrived: in_at,
                    step: 0.0,
                    count: 1,
                });
            }
        }
        let written = match updated {
            // The bucket updated after the last use: its all-gather waits
            // behind the last bucket's, which the next step needs first.
            Some(u) if !fsdp && s + 1 == self.uses => {
                self.held = Some(u);
                None
            }
            Some((j, end)) => {
                let at = if fsdp {
                    end
                } else {
                    streams.after_training(j, work, end)
                };
                self.ready_times.one(j, at);
                Some((j, at))
            }
            None => None,
        };
        Iteration { deferring, written }
    }

    /// The times the iteration carries into the next (the streams', the
    /// last use's, the gathers', the pending update's, and the outputs a
    /// jump extends).
    fn carried(&self, streams: &mut Streams, it: &Iteration) -> Vec<f64> {
        let mut carried = streams.steady.f64_buffer();
        carried.extend([streams.comm_free, streams.compute_free, self.last_used]);
        carried.extend(self.ring.iter());
        carried.extend(self.pending.map(|p| p.1));
        carried.extend(
            self.deferred
                .last()
                .filter(|_| it.deferring)
                .map(|d| d.arrived),
        );
        carried.extend(it.written.map(|w| w.1));
        carried
    }

    /// Extends the carried times over `jump`'s iterations after use `s`:
    /// the use the jump ends on.
    fn jump(&mut self, s: usize, it: &Iteration, jump: &Jump) -> usize {
        let n = jump.iterations;
        let k = n as f64;
        self.last_used += k * jump.state[2];
        let mut d = jump.state[3..].iter().copied();
        for (g, d) in self.ring.iter_mut().zip(&mut d) {
            *g += k * d;
        }
        if let Some(p) = self.pending.as_mut() {
            p.1 += k * d.next().unwrap_or(0.0);
        }
        if it.deferring {
            let step = d.next().unwrap_or(0.0);
            let last = self.deferred.last().map_or(0.0, |l| l.arrived);
            self.deferred.push(Deferred {
                bucket: self.bucket_of(s + 1),
                arrived: last + step,
                step,
                count: n,
            });
        }
        if let Some((j, at)) = it.written {
            let step = d.next().unwrap_or(0.0);
            // The jumped iterations update the buckets below `j`.
            self.ready_times.run(j - 1, n as usize, at + step, step);
        }
        let s = s + n as usize;
        let bucket = self.bucket_of(s);
        if let Some(p) = self.pending.as_mut() {
            p.0 = bucket;
        }
        s
    }

    /// The deferred reductions and the last updates: what the next step
    /// starts from.
    fn finish(mut self, streams: &mut Streams) -> Carry {
        let (work, fsdp) = (self.work, self.fsdp);
        let deferred = std::mem::take(&mut self.deferred);
        let held =
            streams.reduce_deferred(work, &deferred, self.last_used, fsdp, &mut self.ready_times);
        let held = self.held.or(held);
        if let Some((j, ready)) = self.pending {
            let end = streams.compute(j, SpanKind::Update, work.cost(j).update, ready);
            let at = if fsdp {
                streams.comm(j, SpanKind::ReplicateState, &work.cost(j).replicate, end);
                end
            } else {
                streams.after_training(j, work, end)
            };
            self.ready_times.one(j, at);
        }
        if let Some((j, end)) = self.from_before {
            // Nothing of the forward took it (no forward gather of its
            // bucket ran): its all-gather still runs in this step.
            let at = streams.after_training(j, work, end);
            self.ready_times.one(j, at);
        }
        Carry {
            ready: self.ready_times,
            recent_uses: self.recent,
            held,
        }
    }
}

impl Streams {
    /// `steps` steps of the pipelined order back to back (module docs);
    /// the sums and spans are the last step's (the spans from its first
    /// one, which may start before the step before ends). `window` gathered buckets
    /// in flight under `fsdp`. Returns the last step's length: from the
    /// end of the step before it to its own end (the whole step if one).
    pub(super) fn pipelined(
        &mut self,
        work: Work,
        seconds: Uses,
        (window, fsdp): (usize, bool),
        steps: usize,
    ) -> f64 {
        let b = work.runs.buckets();
        let window = window.clamp(1, (2 * b).max(1));
        let mut carry = Carry {
            ready: ReadyTimes::default(),
            recent_uses: VecDeque::new(),
            held: None,
        };
        let mut previous_end = 0.0;
        let mut end = 0.0;
        for step in 0..steps.max(1) {
            if step + 1 == steps.max(1) {
                self.reset_sums();
                previous_end = end;
            }
            carry = self.pipelined_step(work, seconds, (window, fsdp), carry);
            end = self.comm_free.max(self.compute_free);
        }
        // The reported step's spans from its first one.
        let first = self
            .spans
            .iter()
            .map(|s| s.start_seconds)
            .fold(f64::INFINITY, f64::min);
        for span in &mut self.spans {
            span.start_seconds -= first;
            span.end_seconds -= first;
        }
        end - previous_end
    }

    /// One step of [`Streams::pipelined`] after the one `carry` describes.
    fn pipelined_step(
        &mut self,
        work: Work,
        seconds: Uses,
        (window, fsdp): (usize, bool),
        carry: Carry,
    ) -> Carry {
        let mut step = StepRun::new(work, seconds, (window, fsdp), carry);
        step.fill_ring(self);
        let mut s = 0usize;
        while s < step.uses {
            if step.cut_points.binary_search(&s).is_ok() {
                self.steady.new_run();
            }
            let iteration = step.iteration(self, s);
            let carried = step.carried(self, &iteration);
            if let Some(jump) = self.end_iteration(carried, remaining(&step.cut_points, s)) {
                s = step.jump(s, &iteration, &jump);
            }
            step.recent.push_back(step.last_used);
            if step.recent.len() > step.window {
                step.recent.pop_front();
            }
            s += 1;
        }
        step.finish(self)
    }

    /// When bucket `k`'s new parameters from the step before are ready for
    /// its all-gather over `fsdp`: as that step left them, or, for the
    /// bucket it held back, after its all-gather over `data` now.
    fn new_params(
        &mut self,
        k: usize,
        work: Work,
        before: &ReadyTimes,
        held: &mut Option<(usize, f64)>,
    ) -> f64 {
        match *held {
            Some((j, end)) if j == k => {
                *held = None;
                self.after_training(j, work, end)
            }
            _ => before.get(k),
        }
    }

    /// Bucket `k`'s parameters for a (`backward`) use once `ready`: fsdp's
    /// gather from the shards; otherwise, before a forward use, the new
    /// parameters' all-gather over `fsdp` (a backward use finds them
    /// resident). When they are in.
    fn gather(&mut self, backward: bool, k: usize, (work, fsdp): (Work, bool), ready: f64) -> f64 {
        let rounds = match (fsdp, backward) {
            (true, _) => &work.cost(k).gather,
            (false, false) => &work.cost(k).all_gather_fsdp,
            (false, true) => return 0.0,
        };
        let end = self.comm(k, SpanKind::Gather { backward }, rounds, ready);
        self.steady.max(end, ready)
    }

    /// replicated and zero2 after bucket `j`'s update ended at `end`: the
    /// new parameters' all-gather over `data` (replicated shards its state
    /// across it), then the state copy. When the parameters are ready for
    /// the next step's all-gather over `fsdp`.
    fn after_training(&mut self, j: usize, work: Work, end: f64) -> f64 {
        let cost = work.cost(j);
        let at = self.comm(j, SpanKind::AllGather, &cost.all_gather_data, end);
        self.comm(j, SpanKind::ReplicateState, &cost.replicate, at);
        at
    }

    /// The reductions over `data` that waited for the backward pass's end
    /// at `backward_end`, in order, each followed by its bucket's update;
    /// with `fsdp` its state copy, otherwise its all-gather (after the next
    /// bucket's reduction on the stream) and copy. Each bucket's new
    /// parameters' time goes to `ready_times`. The all-gather that would
    /// follow the last reduction is returned instead (bucket, update end):
    /// it goes behind the last bucket's, which the next step needs first.
    fn reduce_deferred(
        &mut self,
        work: Work,
        deferred: &[Deferred],
        backward_end: f64,
        fsdp: bool,
        ready_times: &mut ReadyTimes,
    ) -> Option<(usize, f64)> {
        let last = deferred.len().saturating_sub(1);
        let mut held = None;
        let mut updated: Option<(usize, f64)> = None;
        for (index, d) in deferred.iter().enumerate() {
            self.steady.new_run();
            let cost = work.cost(d.bucket);
            let mut i = 0u64;
            while i < d.count {
                let bucket = d.bucket - i as usize;
                let arrived = d.arrived + i as f64 * d.step;
                let ready = self.steady.max(arrived, backward_end);
                let ready = self.comm(bucket, SpanKind::DataReduction, &cost.data_gradient, ready);
                let mut written = None;
                match updated.take() {
                    Some(u) if index == last && i + 1 == d.count => held = Some(u),
                    Some((j, end)) => {
                        let at = self.after_training(j, work, end);
                        ready_times.one(j, at);
                        written = Some((j, at));
                    }
                    None => {}
                }
                let end = self.compute(bucket, SpanKind::Update, cost.update, ready);
                if fsdp {
                    self.comm(bucket, SpanKind::ReplicateState, &cost.replicate, end);
                    ready_times.one(bucket, end);
                    written = Some((bucket, end));
                } else {
                    updated = Some((bucket, end));
                }
                let mut carried = vec![self.comm_free, self.compute_free];
                carried.extend(updated.map(|u| u.1));
                carried.extend(written.map(|w| w.1));
                if let Some(jump) = self.end_iteration(carried, d.count - i - 1) {
                    let n = jump.iterations;
                    let mut d_state = jump.state[2..].iter().copied();
                    if let Some(u) = updated.as_mut() {
                        u.1 += n as f64 * d_state.next().unwrap_or(0.0);
                        u.0 -= n as usize;
                    }
                    if let Some((j, at)) = written {
                        let step = d_state.next().unwrap_or(0.0);
                        ready_times.run(j - 1, n as usize, at + step, step);
                    }
                    i += n;
                }
                i += 1;
            }
        }
        if let Some((j, end)) = updated {
            let at = self.after_training(j, work, end);
            ready_times.one(j, at);
        }
        held
    }
}
