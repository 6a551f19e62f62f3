//! The one Chrome/Perfetto trace writer every command uses (`run --trace`,
//! `collectives --trace`): a typed builder of the [Trace Event Format] that
//! `chrome://tracing` and <https://ui.perfetto.dev> read.
//!
//! A [`Trace`] is a list of [`Event`]s: metadata that names processes and
//! threads (tracks) and orders them, complete spans (`"X"`, `ts` and `dur`
//! in µs), instants (`"i"`) and counters (`"C"`), each with optional `args`.
//! It serializes to one JSON object, `{"displayTimeUnit": "ns",
//! "otherData": {...}, "traceEvents": [...]}`, with every object's keys in
//! sorted order, so [`Trace::to_json`] and [`Trace::write_to`] give the same
//! bytes.
//!
//! ```
//! use optirs_tpu::profile::trace::{Event, Scope, Trace};
//! use serde_json::json;
//!
//! let mut trace = Trace::new();
//! trace.process(0, "all_reduce on v4-16");
//! trace.thread(0, 0, "ICI");
//! trace.push(
//!     Event::complete("reduce_scatter", 0.0, 12.5)
//!         .on(0, 0)
//!         .category("ici")
//!         .args(json!({"bytes": 4096})),
//! );
//! trace.push(Event::instant("fault", 3.0, Scope::Process).on(0, 0));
//! let value = trace.to_json();
//! assert_eq!(value["traceEvents"][2]["ph"], "X");
//! assert_eq!(value["traceEvents"][2]["dur"], 12.5);
//! assert_eq!(value["traceEvents"][1]["args"]["name"], "ICI");
//! let mut bytes = Vec::new();
//! trace.write_to(&mut bytes)?;
//! assert_eq!(bytes, serde_json::to_vec(&value)?);
//! # Ok::<(), serde_json::Error>(())
//! ```
//!
//! [Trace Event Format]: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Why writing a profiling export (a trace, the memory export) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProfilingError {
    /// The path exists; exports never overwrite.
    #[error(
        "{path} already exists; profiling exports never overwrite a file: choose a new path or remove it"
    )]
    Exists {
        /// The path given.
        path: PathBuf,
    },
    /// Writing failed.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The path given.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// What an event is (its `ph`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// `"X"`: a span with a start and a duration.
    Complete,
    /// `"i"`: a moment.
    Instant,
    /// `"C"`: values of named series at a moment (the `args`).
    Counter,
    /// `"M"`: names or orders a process or thread.
    Metadata,
}

impl Phase {
    /// The `ph` letter.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Complete => "X",
            Phase::Instant => "i",
            Phase::Counter => "C",
            Phase::Metadata => "M",
        }
    }
}

/// How far an instant's line reaches (its `s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// `"g"`: across the whole trace.
    Global,
    /// `"p"`: across every thread of its process.
    Process,
    /// `"t"`: its own thread only.
    Thread,
}

impl Scope {
    /// The `s` letter.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Global => "g",
            Scope::Process => "p",
            Scope::Thread => "t",
        }
    }
}

/// A time field: µs, or the whole-number 0 metadata carries when a trace
/// gives every event a `ts` and `dur` ([`Trace::with_timed_metadata`]).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Time {
    Micros(f64),
    Zero,
}

impl Time {
    fn micros(self) -> f64 {
        match self {
            Time::Micros(us) => us,
            Time::Zero => 0.0,
        }
    }
}

impl Serialize for Time {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match *self {
            Time::Micros(us) => serializer.serialize_f64(us),
            Time::Zero => serializer.serialize_u64(0),
        }
    }
}

/// One event of a [`Trace`]; build it with [`Event::complete`],
/// [`Event::instant`] or [`Event::counter`], then place it with
/// [`Event::on`]. Metadata comes from [`Trace::process`] and its siblings.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    name: String,
    phase: Phase,
    category: Option<String>,
    pid: u32,
    tid: Option<u32>,
    ts: Option<Time>,
    dur: Option<Time>,
    scope: Option<Scope>,
    args: Option<Value>,
}

impl Event {
    fn new(name: impl Into<String>, phase: Phase) -> Event {
        Event {
            name: name.into(),
            phase,
            category: None,
            pid: 0,
            tid: None,
            ts: None,
            dur: None,
            scope: None,
            args: None,
        }
    }

    /// A span from `ts_us` lasting `dur_us` (µs), on process 0 until
    /// [`Event::on`] moves it.
    pub fn complete(name: impl Into<String>, ts_us: f64, dur_us: f64) -> Event {
        Event {
            ts: Some(Time::Micros(ts_us)),
            dur: Some(Time::Micros(dur_us)),
            ..Event::new(name, Phase::Complete)
        }
    }

    /// A moment at `ts_us` (µs) whose line reaches `scope`.
    pub fn instant(name: impl Into<String>, ts_us: f64, scope: Scope) -> Event {
        Event {
            ts: Some(Time::Micros(ts_us)),
            scope: Some(scope),
            ..Event::new(name, Phase::Instant)
        }
    }

    /// The values of the series `values` (`{"bytes": 4096}`) at `ts_us`.
    pub fn counter(name: impl Into<String>, ts_us: f64, values: Value) -> Event {
        Event {
            ts: Some(Time::Micros(ts_us)),
            args: Some(values),
            ..Event::new(name, Phase::Counter)
        }
    }

    /// Puts the event on thread `tid` of process `pid`.
    #[must_use]
    pub fn on(mut self, pid: u32, tid: u32) -> Event {
        self.pid = pid;
        self.tid = Some(tid);
        self
    }

    /// Puts the event on process `pid`, with no thread.
    #[must_use]
    pub fn on_process(mut self, pid: u32) -> Event {
        self.pid = pid;
        self.tid = None;
        self
    }

    /// Sets the category (`cat`), which the viewers filter by.
    #[must_use]
    pub fn category(mut self, category: impl Into<String>) -> Event {
        self.category = Some(category.into());
        self
    }

    /// Sets the `args` the viewers show beside the event.
    #[must_use]
    pub fn args(mut self, args: Value) -> Event {
        self.args = Some(args);
        self
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The thread id, if the event is on a thread.
    pub fn tid(&self) -> Option<u32> {
        self.tid
    }

    /// The start, µs (0 for metadata).
    pub fn ts_us(&self) -> f64 {
        self.ts.map_or(0.0, Time::micros)
    }

    /// The duration, µs (0 for all but spans).
    pub fn dur_us(&self) -> f64 {
        self.dur.map_or(0.0, Time::micros)
    }
}

impl Serialize for Event {
    /// Keys in sorted order, as a `serde_json::Value` writes them.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        if let Some(args) = &self.args {
            map.serialize_entry("args", args)?;
        }
        if let Some(category) = &self.category {
            map.serialize_entry("cat", category)?;
        }
        if let Some(dur) = &self.dur {
            map.serialize_entry("dur", dur)?;
        }
        map.serialize_entry("name", &self.name)?;
        map.serialize_entry("ph", self.phase.as_str())?;
        map.serialize_entry("pid", &self.pid)?;
        if let Some(scope) = self.scope {
            map.serialize_entry("s", scope.as_str())?;
        }
        if let Some(tid) = &self.tid {
            map.serialize_entry("tid", tid)?;
        }
        if let Some(ts) = &self.ts {
            map.serialize_entry("ts", ts)?;
        }
        map.end()
    }
}

/// A Chrome/Perfetto trace being built: its events in the order they are
/// written, and optional `otherData` (the viewers show it as metadata).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    events: Vec<Event>,
    other_data: Option<Value>,
    timed_metadata: bool,
}

impl Trace {
    /// An empty trace.
    pub fn new() -> Trace {
        Trace::default()
    }

    /// A trace whose metadata events also carry `ts: 0`, `dur: 0` and (for
    /// a process) `tid: 0`, so that every event has `ph`, `ts`, `dur`,
    /// `pid` and `tid`: readers may index any event by them.
    #[must_use]
    pub fn with_timed_metadata(mut self) -> Trace {
        self.timed_metadata = true;
        self
    }

    /// Sets the `otherData` object.
    pub fn set_other_data(&mut self, other_data: Value) -> &mut Trace {
        self.other_data = Some(other_data);
        self
    }

    fn metadata(&mut self, name: &str, pid: u32, tid: Option<u32>, args: Value) -> &mut Trace {
        let mut event = Event::new(name, Phase::Metadata).args(args);
        event.pid = pid;
        event.tid = tid;
        if self.timed_metadata {
            event.tid = Some(tid.unwrap_or(0));
            event.ts = Some(Time::Zero);
            event.dur = Some(Time::Zero);
        }
        self.push(event)
    }

    /// Names process `pid`.
    pub fn process(&mut self, pid: u32, name: impl Into<String>) -> &mut Trace {
        let name: String = name.into();
        self.metadata("process_name", pid, None, serde_json::json!({"name": name}))
    }

    /// Orders process `pid` among the processes (lower first).
    pub fn process_sort_index(&mut self, pid: u32, index: i64) -> &mut Trace {
        self.metadata(
            "process_sort_index",
            pid,
            None,
            serde_json::json!({"sort_index": index}),
        )
    }

    /// Names thread (track) `tid` of process `pid`.
    pub fn thread(&mut self, pid: u32, tid: u32, name: impl Into<String>) -> &mut Trace {
        let name: String = name.into();
        self.metadata(
            "thread_name",
            pid,
            Some(tid),
            serde_json::json!({"name": name}),
        )
    }

    /// Orders thread `tid` among the threads of process `pid` (lower first).
    pub fn thread_sort_index(&mut self, pid: u32, tid: u32, index: i64) -> &mut Trace {
        self.metadata(
            "thread_sort_index",
            pid,
            Some(tid),
            serde_json::json!({"sort_index": index}),
        )
    }

    /// Appends `event`.
    pub fn push(&mut self, event: Event) -> &mut Trace {
        self.events.push(event);
        self
    }

    /// Appends every event of `events`, in order.
    pub fn extend(&mut self, events: impl IntoIterator<Item = Event>) -> &mut Trace {
        self.events.extend(events);
        self
    }

    /// The events in the order they are written.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The trace as one JSON value.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// Writes the trace as JSON to `writer`, event by event (no JSON tree
    /// is built first).
    pub fn write_to(&self, writer: impl Write) -> serde_json::Result<()> {
        serde_json::to_writer(writer, self)
    }

    /// Writes the trace to `path`, which must not exist yet (see
    /// [`write_new`]).
    pub fn write_new(&self, path: &Path) -> Result<(), ProfilingError> {
        write_new(path, self)
    }
}

impl Serialize for Trace {
    /// Keys in sorted order, as a `serde_json::Value` writes them.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("displayTimeUnit", "ns")?;
        if let Some(other_data) = &self.other_data {
            map.serialize_entry("otherData", other_data)?;
        }
        map.serialize_entry("traceEvents", &self.events)?;
        map.end()
    }
}

/// Writes `value` as JSON into a new file at `path`, refusing to replace
/// an existing one ([`ProfilingError::Exists`]): exports never overwrite.
pub fn write_new(path: &Path, value: &impl Serialize) -> Result<(), ProfilingError> {
    let io = |source| ProfilingError::Io {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::AlreadyExists => ProfilingError::Exists {
                path: path.to_owned(),
            },
            _ => io(source),
        })?;
    let mut writer = std::io::BufWriter::new(file);
    serde_json::to_writer(&mut writer, value).map_err(|e| io(e.into()))?;
    writer.flush().map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bytes(trace: &Trace) -> String {
        let mut out = Vec::new();
        trace.write_to(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn events_render_as_the_trace_event_format() {
        let mut trace = Trace::new();
        trace.push(
            Event::complete("all_reduce", 1.5, 2.0)
                .on(3, 1)
                .category("ici")
                .args(json!({"bytes": 4096})),
        );
        trace.push(Event::instant("killed", 4.0, Scope::Process).on(3, 0));
        trace.push(Event::counter("hbm", 5.0, json!({"used": 7})).on_process(3));
        assert_eq!(
            bytes(&trace),
            r#"{"displayTimeUnit":"ns","traceEvents":[{"args":{"bytes":4096},"cat":"ici","dur":2.0,"name":"all_reduce","ph":"X","pid":3,"tid":1,"ts":1.5},{"name":"killed","ph":"i","pid":3,"s":"p","tid":0,"ts":4.0},{"args":{"used":7},"name":"hbm","ph":"C","pid":3,"ts":5.0}]}"#
        );
    }

    #[test]
    fn metadata_names_and_orders_processes_and_tracks() {
        let mut trace = Trace::new();
        trace
            .process(2, "devices")
            .process_sort_index(2, -1)
            .thread(2, 5, "device 1 barriers")
            .thread_sort_index(2, 5, 5);
        let value = trace.to_json();
        let events = value["traceEvents"].as_array().unwrap();
        assert_eq!(
            events[0],
            json!({"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "devices"}})
        );
        assert_eq!(events[1]["args"]["sort_index"], -1);
        assert_eq!(
            events[2],
            json!({"name": "thread_name", "ph": "M", "pid": 2, "tid": 5, "args": {"name": "device 1 barriers"}})
        );
        assert_eq!(events[3]["name"], "thread_sort_index");
        assert_eq!(events[3]["args"]["sort_index"], 5);
    }

    #[test]
    fn timed_metadata_gives_every_event_ts_dur_pid_and_tid() {
        let mut trace = Trace::new().with_timed_metadata();
        trace.process(1, "systems").thread(1, 4, "clock");
        let text = bytes(&trace);
        assert_eq!(
            text,
            r#"{"displayTimeUnit":"ns","traceEvents":[{"args":{"name":"systems"},"dur":0,"name":"process_name","ph":"M","pid":1,"tid":0,"ts":0},{"args":{"name":"clock"},"dur":0,"name":"thread_name","ph":"M","pid":1,"tid":4,"ts":0}]}"#
        );
    }

    #[test]
    fn names_are_escaped() {
        let mut trace = Trace::new();
        let name = "a \"quoted\"\\ name\nwith µ and \u{1}";
        trace.thread(0, 0, name);
        trace.push(Event::complete(name, 0.0, 1.0).category("c\"at"));
        let text = bytes(&trace);
        assert!(
            text.contains(r#""a \"quoted\"\\ name\nwith µ and \u0001""#),
            "{text}"
        );
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["traceEvents"][0]["args"]["name"], name);
        assert_eq!(back["traceEvents"][1]["name"], name);
        assert_eq!(back["traceEvents"][1]["cat"], "c\"at");
    }

    #[test]
    fn to_json_and_write_to_agree_and_other_data_is_kept() {
        let mut trace = Trace::new();
        trace.set_other_data(json!({"generator": "test"}));
        trace.push(Event::complete("x", 0.25, 0.5).on(1, 2));
        assert_eq!(
            bytes(&trace),
            serde_json::to_string(&trace.to_json()).unwrap()
        );
        assert_eq!(trace.to_json()["otherData"]["generator"], "test");
        assert_eq!(trace.events().len(), 1);
        assert_eq!(trace.events()[0].ts_us(), 0.25);
        assert_eq!(trace.events()[0].dur_us(), 0.5);
    }

    #[test]
    fn write_new_refuses_an_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trace.json");
        let trace = Trace::new();
        trace.write_new(&path).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            r#"{"displayTimeUnit":"ns","traceEvents":[]}"#
        );
        let again = trace.write_new(&path).unwrap_err();
        assert!(matches!(again, ProfilingError::Exists { .. }), "{again}");
        let missing = dir.path().join("no/such/trace.json");
        assert!(matches!(
            trace.write_new(&missing).unwrap_err(),
            ProfilingError::Io { .. }
        ));
    }
}
