//! A training run's Chrome/Perfetto trace in simulated time: the run's
//! steps, failed steps, waits, recoveries (by part) and checkpoint writes
//! on a "run" process, and every device's compute and communication per
//! bucket ([`trace_of`]), built with the crate's one trace writer,
//! [`crate::profile::trace`].

use serde_json::{Value, json};

use crate::profile::trace::{Event, Scope, Trace};

use crate::sharding::StepPhase;

use super::ShardedStepReport;
use super::report::{RecoveryRow, TrainReport, recovery_parts};
use super::run::FailureRow;

impl TrainReport {
    /// The trace of this run: its steps' `reports` (the report keeps no
    /// spans) and the periodic checkpoint `writes` with it.
    pub fn trace_input<'a>(
        &'a self,
        reports: &'a [ShardedStepReport],
        writes: &'a [(u64, f64)],
        end_ns: u64,
    ) -> TraceInput<'a> {
        TraceInput {
            reports,
            failures: &self.failures,
            recoveries: &self.recoveries,
            checkpoint_writes: writes,
            devices: self.devices,
            tick_ns: self.tick_ns,
            end_ns,
        }
    }
}

/// What a train trace draws: the steps, the failed attempts, the
/// recoveries and checkpoint writes, in simulated time.
pub struct TraceInput<'a> {
    /// The completed steps, with their spans.
    pub reports: &'a [ShardedStepReport],
    /// The failed attempts.
    pub failures: &'a [FailureRow],
    /// The recoveries.
    pub recoveries: &'a [RecoveryRow],
    /// Checkpoint writes: start ns and seconds.
    pub checkpoint_writes: &'a [(u64, f64)],
    /// The pod's devices (the "run" process's pid).
    pub devices: u32,
    /// The pod's tick, ns: a gap up to it is a wait for the tick.
    pub tick_ns: u64,
    /// The run's simulated end: the timeline is drawn up to it.
    pub end_ns: u64,
}

/// The run's tracks: one process "run" above the devices, whose threads
/// never hold overlapping spans (Perfetto nests or drops those).
pub mod track {
    /// Steps, failed steps, recoveries and the waits between them: every
    /// simulated second of the run is in exactly one span here.
    pub const TIMELINE: u32 = 0;
    /// Kills and the wait until the step saw them.
    pub const FAULTS: u32 = 1;
    /// A recovery's parts, one after another.
    pub const RECOVERY_PARTS: u32 = 2;
    /// Periodic checkpoint writes.
    pub const CHECKPOINTS: u32 = 3;
}

/// A complete ("X") span in simulated seconds, on the trace's µs clock.
fn span(
    name: impl Into<String>,
    cat: &str,
    pid: u32,
    tid: u32,
    start_s: f64,
    seconds: f64,
    args: Value,
) -> Event {
    Event::complete(name, start_s * 1e6, seconds.max(0.0) * 1e6)
        .category(cat)
        .on(pid, tid)
        .args(args)
}

/// The Chrome/Perfetto trace of a run (see [`TraceInput`], [`track`]):
/// a "run" process (pid = the device count, shown first) and one process
/// per device with a compute, a communication and (multislice) a DCN
/// thread, per bucket.
pub fn trace_of(input: &TraceInput<'_>) -> Trace {
    let run = input.devices;
    let mut trace = Trace::new();
    run_process(&mut trace, run);
    // The run's timeline: spans in time order, the gaps between them
    // drawn as waits.
    let mut timeline = step_spans(input, run);
    failure_spans(input, run, &mut timeline, &mut trace);
    recovery_spans(input, run, &mut timeline, &mut trace);
    // A checkpoint write stops training (it is synchronous): the timeline
    // shows it where it happened, and its own track below too.
    for &(at_ns, seconds) in input.checkpoint_writes {
        timeline.push(checkpoint_span(run, track::TIMELINE, at_ns, seconds));
    }
    push_with_waits(input, run, timeline, &mut trace);
    for &(at_ns, seconds) in input.checkpoint_writes {
        trace.push(checkpoint_span(run, track::CHECKPOINTS, at_ns, seconds));
    }
    device_events(input, &mut trace);
    trace
}

/// The "run" process, shown first, and its threads' names.
fn run_process(trace: &mut Trace, run: u32) {
    trace.process(run, "run").process_sort_index(run, -1);
    for (tid, name) in [
        (track::TIMELINE, "steps, failures, recoveries, waits"),
        (track::FAULTS, "faults and detection"),
        (track::RECOVERY_PARTS, "recovery parts"),
        (track::CHECKPOINTS, "checkpoint writes"),
    ] {
        trace.thread(run, tid, name);
    }
}

/// Every completed step on the timeline, a step a later rollback took
/// back marked as undone.
fn step_spans(input: &TraceInput<'_>, run: u32) -> Vec<Event> {
    let mut timeline = Vec::new();
    for r in input.reports {
        let start = r.launched_at_ns as f64 * 1e-9;
        // A step a later rollback took back: its time bought nothing.
        let undone = input.recoveries.iter().any(|rec| {
            r.completed_at_ns as f64 * 1e-9 <= rec.started_at_seconds
                && r.step < rec.failed_step
                && r.step + rec.lost_steps >= rec.failed_step
        });
        timeline.push(span(
            if undone {
                format!("step {} (undone by a rollback)", r.step)
            } else {
                format!("step {}", r.step)
            },
            "step",
            run,
            track::TIMELINE,
            start,
            r.modeled_seconds,
            json!({
                "step": r.step,
                "undone": undone,
                "modeled_seconds": r.modeled_seconds,
                "devices": r.hbm_bytes_per_device.len(),
            }),
        ));
    }
    timeline
}

/// Every failed attempt on the timeline; a kill, and the wait until the
/// step saw it, on the faults track and the device.
fn failure_spans(input: &TraceInput<'_>, run: u32, timeline: &mut Vec<Event>, trace: &mut Trace) {
    for f in input.failures {
        let phase = f.phase.key();
        timeline.push(span(
            format!("step {} failed: {}", f.step, f.cause),
            "failure",
            run,
            track::TIMELINE,
            f.launched_at_seconds,
            f.at_seconds - f.launched_at_seconds,
            json!({"step": f.step, "failed": true, "cause": f.cause, "phase": phase, "device": f.device}),
        ));
        if let Some(killed) = f.killed_at_seconds {
            let device = f.device.map_or_else(String::new, |d| format!(" {d}"));
            trace.push(
                Event::instant(
                    format!("device{device} killed"),
                    killed * 1e6,
                    Scope::Process,
                )
                .category("failure")
                .on(run, track::FAULTS)
                .args(json!({"device": f.device})),
            );
            if let Some(d) = f.device {
                trace.push(
                    Event::instant("killed", killed * 1e6, Scope::Thread)
                        .category("failure")
                        .on(d, 0),
                );
            }
            trace.push(span(
                "detection wait",
                "wait",
                run,
                track::FAULTS,
                killed,
                f.at_seconds - killed,
                json!({"step": f.step, "cause": f.cause}),
            ));
        }
    }
}

/// Every recovery on the timeline, and its parts one after another on
/// their own track.
fn recovery_spans(input: &TraceInput<'_>, run: u32, timeline: &mut Vec<Event>, trace: &mut Trace) {
    for rec in input.recoveries {
        let start = rec.started_at_seconds;
        timeline.push(span(
            format!("recovery ({})", rec.policy),
            "recovery",
            run,
            track::TIMELINE,
            start,
            rec.recovery_seconds,
            json!({
                "failed_step": rec.failed_step,
                "lost_devices": rec.lost_devices,
                "lost_steps": rec.lost_steps,
                "swapped_cubes": rec.swapped_cubes,
            }),
        ));
        let mut at = start;
        for (name, seconds) in recovery_parts(rec) {
            trace.push(span(
                name,
                "recovery",
                run,
                track::RECOVERY_PARTS,
                at,
                seconds,
                json!({"failed_step": rec.failed_step}),
            ));
            at += seconds;
        }
    }
}

/// A checkpoint write on track `tid`.
fn checkpoint_span(run: u32, tid: u32, at_ns: u64, seconds: f64) -> Event {
    span(
        "checkpoint write",
        "checkpoint",
        run,
        tid,
        at_ns as f64 * 1e-9,
        seconds,
        json!({}),
    )
}

/// The timeline's spans in time order into `trace`, each gap before a
/// span (and before the run's end) drawn as a wait.
fn push_with_waits(input: &TraceInput<'_>, run: u32, mut timeline: Vec<Event>, trace: &mut Trace) {
    timeline.sort_by(|a, b| a.ts_us().total_cmp(&b.ts_us()));
    // A gap up to a tick is the pod waiting for the tick that ends what
    // came before; a longer one is idle time.
    let wait = |from_us: f64, to_us: f64, before: Value| {
        let seconds = (to_us - from_us) * 1e-6;
        let name = if seconds <= input.tick_ns as f64 * 1e-9 + 1e-12 {
            "waiting for the tick"
        } else {
            "idle"
        };
        span(
            name,
            "wait",
            run,
            track::TIMELINE,
            from_us * 1e-6,
            seconds,
            json!({"before": before}),
        )
    };
    let mut free_at: Option<f64> = None;
    for event in timeline {
        let (ts, dur) = (event.ts_us(), event.dur_us());
        if let Some(free) = free_at.filter(|&free| ts > free) {
            trace.push(wait(free, ts, json!(event.name())));
        }
        free_at = Some(free_at.map_or(ts + dur, |free: f64| free.max(ts + dur)));
        trace.push(event);
    }
    let end_us = input.end_ns as f64 * 1e-3;
    if let Some(free) = free_at.filter(|&free| end_us > free) {
        trace.push(wait(free, end_us, json!("the end of the run")));
    }
}

/// Every device's process and threads, and its phases per bucket.
fn device_events(input: &TraceInput<'_>, trace: &mut Trace) {
    let devices: Vec<u32> = input
        .reports
        .first()
        .map(|r| r.hbm_bytes_per_device.iter().map(|&(d, _)| d).collect())
        .unwrap_or_default();
    let dcn = input
        .reports
        .iter()
        .any(|r| r.spans.iter().any(|s| s.phase.is_dcn()));
    // A round's passes on different axes run at once: axis 0 (and the
    // state copies) on track 1, axis a ≥ 1 on track 2 + a.
    let axes: std::collections::BTreeSet<u32> = input
        .reports
        .iter()
        .flat_map(|r| r.spans.iter().filter_map(|s| comm_axis(s.phase)))
        .filter(|&a| a > 0)
        .collect();
    for &d in &devices {
        trace
            .process(d, format!("device {d}"))
            .thread(d, 0, "compute")
            .thread(d, 1, "communication");
        if dcn {
            trace.thread(d, 2, "DCN (across slices)");
        }
        for &a in &axes {
            trace.thread(d, 2 + a, format!("communication, axis {a}"));
        }
    }
    for r in input.reports {
        let devices: Vec<u32> = r.hbm_bytes_per_device.iter().map(|&(d, _)| d).collect();
        for s in &r.spans {
            if let StepPhase::Free { .. } = s.phase {
                // The bucket's gathered parameters go back: an instant.
                let at_us = (r.launched_at_ns as f64 * 1e-9 + s.start_seconds) * 1e6;
                for &d in &devices {
                    trace.push(
                        Event::instant(
                            format!("{} bucket {}", s.phase.key(), s.bucket),
                            at_us,
                            Scope::Thread,
                        )
                        .category("memory")
                        .on(d, 0)
                        .args(json!({"step": r.step})),
                    );
                }
                continue;
            }
            let (tid, cat) = if s.phase == StepPhase::Update || s.phase.is_marker() {
                (0, "compute")
            } else if s.phase.is_dcn() {
                (2, "dcn")
            } else {
                (
                    comm_axis(s.phase).filter(|&a| a > 0).map_or(1, |a| 2 + a),
                    "communication",
                )
            };
            for &d in &devices {
                trace.push(span(
                    format!("{} bucket {}", s.phase.key(), s.bucket),
                    cat,
                    d,
                    tid,
                    r.launched_at_ns as f64 * 1e-9 + s.start_seconds,
                    s.end_seconds - s.start_seconds,
                    json!({"step": r.step}),
                ));
            }
        }
    }
}

/// The ICI axis of a reduce-scatter or all-gather pass.
fn comm_axis(phase: StepPhase) -> Option<u32> {
    match phase {
        StepPhase::ReduceScatter { axis } | StepPhase::AllGather { axis } if !phase.is_dcn() => {
            Some(axis)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sharding::Span;
    use std::collections::BTreeMap;

    fn step(number: u64, launched_at_ns: u64, modeled_seconds: f64) -> ShardedStepReport {
        let half = modeled_seconds / 2.0;
        ShardedStepReport {
            step: number,
            launched_at_ns,
            completed_at_ns: launched_at_ns + (modeled_seconds * 1e9).ceil() as u64,
            modeled_seconds,
            phases: BTreeMap::new(),
            link_bytes: 0,
            phase_bytes: Default::default(),
            hbm_bytes_per_device: vec![(0, 1), (1, 1)],
            buckets: 1,
            wall_seconds: 0.0,
            spans: vec![
                Span {
                    bucket: 0,
                    phase: StepPhase::ReduceScatter { axis: 0 },
                    start_seconds: 0.0,
                    end_seconds: half,
                },
                Span {
                    bucket: 0,
                    phase: StepPhase::Update,
                    start_seconds: half,
                    end_seconds: modeled_seconds,
                },
            ],
        }
    }

    /// A spare-cube run drawn by hand: steps 1 and 2, step 3 killed, a
    /// recovery of three parts that rolls back step 2, steps 2 and 3 again.
    #[test]
    fn the_trace_accounts_for_every_second_and_marks_undone_steps() {
        let us = 1_000u64;
        let reports = [
            step(1, 0, 8e-6),
            step(2, 10 * us, 8e-6),
            step(2, 1_100 * us, 8e-6),
            step(3, 1_110 * us, 8e-6),
        ];
        let failures = [FailureRow {
            step: 3,
            device: Some(1),
            launched_at_seconds: 20e-6,
            killed_at_seconds: Some(23e-6),
            at_seconds: 25e-6,
            phase: StepPhase::Update,
            cause: "device 1 was killed".into(),
        }];
        let recoveries = [RecoveryRow {
            policy: "spare-cube".into(),
            failed_step: 3,
            lost_devices: vec![1],
            lost_steps: 1,
            started_at_seconds: 25e-6,
            recovery_seconds: 1070e-6,
            read_seconds: 50e-6,
            reconfigure_seconds: 1000e-6,
            reshard_seconds: 20e-6,
            swapped_cubes: vec![[0, 1]],
            note: None,
        }];
        // A write after step 1, up to step 2's launch.
        let writes = [(9 * us, 1e-6)];
        let input = TraceInput {
            reports: &reports,
            failures: &failures,
            recoveries: &recoveries,
            checkpoint_writes: &writes,
            devices: 2,
            tick_ns: 10 * us,
            end_ns: 1_120 * us,
        };
        let trace = trace_of(&input).to_json();
        let events = trace["traceEvents"].as_array().unwrap();
        let on = |tid: u32| -> Vec<&serde_json::Value> {
            let mut spans: Vec<_> = events
                .iter()
                .filter(|e| e["ph"] == "X" && e["pid"] == 2 && e["tid"] == tid)
                .collect();
            spans.sort_by(|a, b| {
                a["ts"]
                    .as_f64()
                    .unwrap()
                    .total_cmp(&b["ts"].as_f64().unwrap())
            });
            spans
        };
        // The timeline runs from 0 to the end without a hole or overlap.
        let timeline = on(track::TIMELINE);
        let mut at = 0.0;
        for e in &timeline {
            let ts = e["ts"].as_f64().unwrap();
            assert!((ts - at).abs() < 1e-6, "{e} starts at {ts}, not {at}");
            at = ts + e["dur"].as_f64().unwrap();
        }
        assert!((at - 1120.0).abs() < 1e-6, "ends at {at}");
        let names: Vec<&str> = timeline
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "step 1",
                "waiting for the tick",
                "checkpoint write",
                "step 2 (undone by a rollback)",
                "waiting for the tick",
                "step 3 failed: device 1 was killed",
                "recovery (spare-cube)",
                "waiting for the tick",
                "step 2",
                "waiting for the tick",
                "step 3",
                "waiting for the tick",
            ]
        );
        // The recovery's parts, in order, add up to it.
        let parts = on(track::RECOVERY_PARTS);
        let names: Vec<&str> = parts.iter().map(|e| e["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["checkpoint read", "cube swap", "re-shard"]);
        assert_eq!(parts[0]["ts"].as_f64().unwrap(), 25.0);
        let sum: f64 = parts.iter().map(|e| e["dur"].as_f64().unwrap()).sum();
        assert!((sum - 1070.0).abs() < 1e-6);
        // The kill and the wait until the step saw it.
        let detection = on(track::FAULTS);
        assert_eq!(detection[0]["name"], "detection wait");
        assert!((detection[0]["ts"].as_f64().unwrap() - 23.0).abs() < 1e-9);
        assert!((detection[0]["dur"].as_f64().unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(on(track::CHECKPOINTS).len(), 1);
        // Each device's phases, per bucket.
        for device in 0..2 {
            assert_eq!(
                events
                    .iter()
                    .filter(|e| e["pid"] == device && e["ph"] == "X")
                    .count(),
                reports.len() * 2
            );
        }
    }
}
