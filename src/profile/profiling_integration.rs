//! [`ProfilingIntegration`]: counters, a Chrome/Perfetto trace and a memory
//! export of what a pod ran.
//!
//! The trace (`chrome://tracing`, <https://ui.perfetto.dev>) is one JSON
//! object `{"traceEvents": [...], "displayTimeUnit": "ns"}`. Every event has
//! `ph`, `ts`, `dur` (µs), `pid` and `tid`; spans are complete events
//! (`"X"`), and `"M"` events name the processes and threads:
//!
//! | pid | process | tracks | clock |
//! |---|---|---|---|
//! | 1 | systems | one per system (and one for whole ticks / compiles) | wall |
//! | 2 | devices | per device: heartbeats (sent → delivered), barrier arrivals, collectives, failures (fault → detection) | simulated |
//! | 3 | compiler | per program: its passes (`PassLog`), then its kernels when executed | wall |
//!
//! Wall-clock and simulated times are separate processes: they are different
//! clocks, and Perfetto shows them one above the other. The trace is built
//! and written by [`super::trace`], with timed metadata so that every event,
//! metadata too, has those fields.
//!
//! The memory export lists the device-memory reservations and releases the
//! pod's runs really made (optimizer state, a step's buffers, a sharded
//! model's shards; each with its simulated time, holder, offset and size),
//! and each device's heap at its highest use, snapshotted while the
//! reservation that reached it was held. Compiling reserves nothing, so the
//! export is empty until something has run (a compiled program's planned
//! buffers are in its `CompileReport`, not here).
//!
//! Exports go to the path the caller gives and never replace a file: an
//! existing path is refused with [`ProfilingError::Exists`].

use super::system_timer::SystemTimer;
pub use super::trace::ProfilingError;
use super::trace::{Event, Trace, write_new};
use crate::collectives::pod::{Collective, CollectiveOutcome};
use crate::compiler::CompileReport;
use crate::compiler::executable::KernelTiming;
use crate::error::Result;
use crate::memory::journal::{self, HbmEvent, HbmPeak};
use crate::pod::Pod;
use crate::topology::DeviceId;
use crate::transport::{Inbox, Payload};
use bevy_ecs::prelude::*;
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

/// Process ids of the trace.
pub mod pid {
    /// Wall-clock spans of systems.
    pub const SYSTEMS: u32 = 1;
    /// Simulated-time events of devices.
    pub const DEVICES: u32 = 2;
    /// Compiler passes and kernels.
    pub const COMPILER: u32 = 3;
}

/// Tracks of one device (tid = device × 4 + track).
const DEVICE_TRACKS: [&str; 4] = ["heartbeats", "barriers", "collectives", "failures"];

/// Running totals of what the profiler saw.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Counters {
    /// `Step` ticks run through the profiler.
    pub ticks: u64,
    /// Wall time of those ticks, ns.
    pub step_wall_ns: u64,
    /// System runs timed.
    pub system_runs: u64,
    /// Heartbeats delivered to the coordination service.
    pub heartbeats: u64,
    /// Barrier arrivals delivered.
    pub barrier_arrivals: u64,
    /// Data messages delivered.
    pub data_messages: u64,
    /// Collectives finished (completed or failed).
    pub collectives: u64,
    /// Failures detected.
    pub failures: u64,
    /// Programs compiled.
    pub compiles: u64,
    /// Compiler passes run.
    pub passes: u64,
    /// Kernels executed.
    pub kernels_executed: u64,
}

/// What device memory did while the profiler watched: every reservation
/// and release a run made (from the pod's [`crate::memory::journal`]), and
/// each device's heap at its highest use.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MemoryExport {
    /// Reservations, releases and heap rebuilds, in the order they happened.
    pub events: Vec<HbmEvent>,
    /// Each device's heap at its highest use, taken while the reservation
    /// that reached it was held.
    pub peaks: Vec<HbmPeak>,
    /// Events the pod dropped because the profiler did not look in time.
    pub dropped: u64,
}

impl MemoryExport {
    /// Takes the events the pod recorded since the last look, and its peaks.
    fn take_from(&mut self, world: &mut World) {
        journal::enable(world);
        self.events.extend(journal::take_events(world));
        let recorded = world.resource::<journal::HbmJournal>();
        self.dropped = recorded.dropped();
        for peak in recorded.peaks() {
            match self.peaks.iter_mut().find(|p| p.device == peak.device) {
                Some(known) if known.used_bytes >= peak.used_bytes => {}
                Some(known) => *known = peak.clone(),
                None => self.peaks.push(peak.clone()),
            }
        }
    }
}

/// The profiler of one pod: build the pod through it, then step and
/// compile through it.
#[derive(Debug)]
pub struct ProfilingIntegration {
    timer: SystemTimer,
    counters: Counters,
    events: Vec<Event>,
    /// Thread names per (pid, tid).
    threads: BTreeMap<(u32, u32), String>,
    seen_collectives: HashSet<Entity>,
    seen_failures: usize,
    programs: u32,
    memory: MemoryExport,
    step_wall_ns: Vec<u64>,
}

impl Default for ProfilingIntegration {
    fn default() -> Self {
        ProfilingIntegration::new()
    }
}

/// Microseconds (the trace's unit) from nanoseconds.
fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

fn complete(
    name: &str,
    cat: &str,
    pid: u32,
    tid: u32,
    ts_ns: u64,
    dur_ns: u64,
    args: Value,
) -> Event {
    Event::complete(name, us(ts_ns), us(dur_ns))
        .on(pid, tid)
        .category(cat)
        .args(args)
}

impl ProfilingIntegration {
    /// A profiler with nothing recorded.
    pub fn new() -> Self {
        let timer = SystemTimer::new();
        timer.set_recording(true);
        ProfilingIntegration {
            timer,
            counters: Counters::default(),
            events: Vec::new(),
            threads: BTreeMap::new(),
            seen_collectives: HashSet::new(),
            seen_failures: 0,
            programs: 0,
            memory: MemoryExport::default(),
            step_wall_ns: Vec::new(),
        }
    }

    /// Builds a pod whose systems report their runs to this profiler
    /// (`|| Pod::load("v4-16")`).
    /// Its device memory is recorded from then on.
    pub fn build_pod(&self, build: impl FnOnce() -> Result<Pod>) -> Result<Pod> {
        let mut pod = self.timer.scope(build)?;
        journal::enable(pod.world_mut());
        Ok(pod)
    }

    /// The counters so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Wall time of every tick stepped through the profiler, ns.
    pub fn step_wall_ns(&self) -> &[u64] {
        &self.step_wall_ns
    }

    /// The memory export so far.
    pub fn memory(&self) -> &MemoryExport {
        &self.memory
    }

    /// Runs the `Step` schedule of `pod` once (one tick, or to an exact
    /// stop inside one), recording its system spans and what its devices
    /// did.
    pub fn step(&mut self, pod: &mut Pod) {
        let start = self.timer.now_ns();
        pod.step();
        let end = self.timer.now_ns();
        self.counters.ticks += 1;
        self.counters.step_wall_ns += end - start;
        self.step_wall_ns.push(end - start);
        let tick = pod.clock().tick;
        self.thread(pid::SYSTEMS, 0, "Step ticks");
        self.events.push(complete(
            &format!("tick {tick}"),
            "step",
            pid::SYSTEMS,
            0,
            start,
            end - start,
            json!({"tick": tick}),
        ));
        self.take_system_spans("Step");
        self.observe(pod);
    }

    /// Runs `ticks` ticks, as [`Pod::run`] does (a tick that ends at an
    /// exact stop inside it, such as a scheduled fault, is followed by the
    /// rest of the tick; each run of the schedule is recorded), calling
    /// `progress(done)` after each tick.
    pub fn run(&mut self, pod: &mut Pod, ticks: u64, progress: &mut dyn FnMut(u64)) {
        let start = pod.clock().tick;
        let target = start.saturating_add(ticks);
        while pod.clock().tick < target {
            let before = pod.clock().tick;
            self.step(pod);
            if pod.clock().tick != before {
                progress(pod.clock().tick - start);
            }
        }
    }

    /// Records the system spans finished since the last call.
    fn take_system_spans(&mut self, schedule: &str) {
        let spans = self.timer.take();
        if spans.is_empty() {
            return;
        }
        let names = self.timer.names();
        for span in spans {
            let tid = span.system + 1;
            let name = names[span.system as usize]
                .strip_prefix("optirs_tpu::")
                .unwrap_or(&names[span.system as usize])
                .to_string();
            self.thread(pid::SYSTEMS, tid, &name);
            self.counters.system_runs += 1;
            self.events.push(complete(
                &name,
                schedule,
                pid::SYSTEMS,
                tid,
                span.start_ns,
                span.dur_ns,
                json!({}),
            ));
        }
    }

    fn thread(&mut self, pid: u32, tid: u32, name: &str) {
        self.threads
            .entry((pid, tid))
            .or_insert_with(|| name.to_string());
    }

    fn device_event(
        &mut self,
        device: DeviceId,
        track: usize,
        name: &str,
        from_ns: u64,
        to_ns: u64,
        args: Value,
    ) {
        let tid = device.0 * DEVICE_TRACKS.len() as u32 + track as u32;
        self.thread(
            pid::DEVICES,
            tid,
            &format!("device {} {}", device.0, DEVICE_TRACKS[track]),
        );
        self.events.push(complete(
            name,
            DEVICE_TRACKS[track],
            pid::DEVICES,
            tid,
            from_ns,
            to_ns.saturating_sub(from_ns),
            args,
        ));
    }

    /// Records what the world shows since the last look: messages delivered
    /// this tick, collectives that finished, failures detected, device
    /// memory reserved and released. Call it after driving the pod directly
    /// (a `TPUOptimizer` on it: `observe(opt.pod_mut()..)`); on a pod not
    /// built through [`ProfilingIntegration::build_pod`], device memory is
    /// recorded from the first call on.
    pub fn observe(&mut self, pod: &mut Pod) {
        self.memory.take_from(pod.world_mut());
        let messages = pod.world().resource::<Inbox>().messages.clone();
        for m in messages {
            match m.payload {
                Payload::Heartbeat { sent_ns } => {
                    self.counters.heartbeats += 1;
                    self.device_event(
                        m.from,
                        0,
                        "heartbeat",
                        sent_ns,
                        m.deliver_at_ns,
                        json!({"seq": m.seq}),
                    );
                }
                Payload::BarrierArrival {
                    barrier,
                    generation,
                } => {
                    self.counters.barrier_arrivals += 1;
                    self.device_event(
                        m.from,
                        1,
                        "barrier arrival",
                        m.sent_at_ns,
                        m.deliver_at_ns,
                        json!({"barrier": barrier, "generation": generation}),
                    );
                }
                Payload::Data { .. } => self.counters.data_messages += 1,
            }
        }
        let world = pod.world_mut();
        let mut finished: Vec<(Entity, Collective, CollectiveOutcome)> = world
            .query::<(Entity, &Collective, &CollectiveOutcome)>()
            .iter(world)
            .filter(|(e, _, o)| {
                !matches!(o, CollectiveOutcome::Pending) && !self.seen_collectives.contains(e)
            })
            .map(|(e, c, o)| (e, c.clone(), o.clone()))
            .collect();
        finished.sort_by_key(|(_, c, _)| (c.launched_at_ns, c.participants.first().copied()));
        for (entity, collective, outcome) in finished {
            self.seen_collectives.insert(entity);
            self.counters.collectives += 1;
            let (end, status) = match outcome {
                CollectiveOutcome::Completed { at_ns } => (at_ns, "completed".to_string()),
                CollectiveOutcome::Failed { at_ns, device } => {
                    (at_ns, format!("failed: device {} failed", device.0))
                }
                CollectiveOutcome::Pending => continue,
            };
            let name = format!("{:?} {} B", collective.kind, collective.bytes);
            for &device in &collective.participants {
                self.device_event(
                    device,
                    2,
                    &name,
                    collective.launched_at_ns,
                    end,
                    json!({"bytes_per_rank": collective.bytes, "ranks": collective.participants.len(), "outcome": status}),
                );
            }
        }
        let failures = pod.failures()[self.seen_failures..].to_vec();
        self.seen_failures += failures.len();
        for record in failures {
            self.counters.failures += 1;
            let from = record.injected_at_ns.unwrap_or(record.detected_at_ns);
            self.device_event(
                record.device,
                3,
                "failure (fault → detection)",
                from,
                record.detected_at_ns,
                json!({"epoch": record.epoch, "injected": record.injected_at_ns.is_some()}),
            );
        }
    }

    /// Compiles RON program text in the pod's world, recording the compile
    /// systems and the passes (compiling reserves no device memory).
    pub fn compile_program_str(
        &mut self,
        pod: &mut Pod,
        name: &str,
        text: &str,
    ) -> Result<CompileReport> {
        let start = self.timer.now_ns();
        let report = pod.compile_program_str(name, text);
        let end = self.timer.now_ns();
        self.thread(pid::SYSTEMS, 0, "Step ticks");
        self.take_system_spans("Compile");
        let report = report?;
        self.counters.compiles += 1;
        self.programs += 1;
        let tid = self.programs;
        self.thread(pid::COMPILER, tid, &format!("program {}", report.program));
        self.events.push(complete(
            &format!("compile {}", report.program),
            "compile",
            pid::COMPILER,
            tid,
            start,
            end - start,
            json!({"kernels": report.kernels}),
        ));
        // Passes run back to back inside the compile; their `micros` are
        // laid end to end from its start (nested under it).
        let mut at = start;
        for pass in &report.passes {
            let dur = (pass.micros * 1000).min(end.saturating_sub(at));
            self.counters.passes += 1;
            self.events.push(complete(
                pass.name,
                "pass",
                pid::COMPILER,
                tid,
                at,
                dur,
                json!({"changed": pass.changed, "nodes_before": pass.nodes_before, "nodes_after": pass.nodes_after, "runs": pass.runs}),
            ));
            at += dur;
        }
        Ok(report)
    }

    /// Records kernel timings of one execution of `program`'s executable
    /// (from [`crate::compiler::Executable::run_timed`]).
    pub fn record_kernels(&mut self, program: &str, timings: &[KernelTiming]) {
        self.programs += 1;
        let tid = self.programs;
        self.thread(pid::COMPILER, tid, &format!("kernels of {program}"));
        for k in timings {
            self.counters.kernels_executed += 1;
            let start = self.timer.ns_since_epoch(k.start);
            let end = self.timer.ns_since_epoch(k.end);
            self.events.push(complete(
                &k.name,
                "kernel",
                pid::COMPILER,
                tid,
                start,
                end - start,
                json!({"fused": k.fused}),
            ));
        }
    }

    /// The trace: metadata events (process and thread names), then every
    /// span sorted by track, start, and longest first (so parents precede
    /// children).
    pub fn trace(&self) -> Trace {
        let mut trace = Trace::new().with_timed_metadata();
        for (pid, name) in [
            (pid::SYSTEMS, "systems (wall clock)"),
            (pid::DEVICES, "devices (simulated time)"),
            (pid::COMPILER, "compiler (wall clock)"),
        ] {
            trace.process(pid, name);
        }
        for (&(pid, tid), name) in &self.threads {
            trace
                .thread(pid, tid, name.as_str())
                .thread_sort_index(pid, tid, i64::from(tid));
        }
        let mut spans: Vec<&Event> = self.events.iter().collect();
        let key = |e: &Event| (e.pid(), e.tid().unwrap_or(0), e.ts_us(), -e.dur_us());
        spans.sort_by(|a, b| {
            key(a)
                .partial_cmp(&key(b))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        trace.extend(spans.into_iter().cloned());
        trace.set_other_data(json!({"counters": self.counters, "generator": concat!("optirs-tpu ", env!("CARGO_PKG_VERSION"))}));
        trace
    }

    /// The trace as one JSON object, events sorted by track then time.
    pub fn trace_json(&self) -> Value {
        self.trace().to_json()
    }

    /// Writes the trace to `path`, refusing to replace an existing file.
    /// The events are streamed, not copied into one JSON value first.
    pub fn write_trace(&self, path: &Path) -> std::result::Result<(), ProfilingError> {
        self.trace().write_new(path)
    }

    /// Writes the memory export to `path`, refusing to replace an existing file.
    pub fn write_memory(&self, path: &Path) -> std::result::Result<(), ProfilingError> {
        write_new(
            path,
            &serde_json::to_value(&self.memory).unwrap_or(Value::Null),
        )
    }
}
