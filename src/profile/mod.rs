//! The backend side of the compiler: profiling of what the engine runs.
//!
//! * [`system_timer`]: wall-clock time of every system run, from bevy's
//!   `trace` spans.
//! * [`schedule_timing`]: `bench schedule`, per-system mean/p50/p99 of the
//!   `Step` and `Compile` schedules.
//! * [`profiling_integration::ProfilingIntegration`]: counters, a
//!   Chrome/Perfetto trace and a memory export of a pod's run.
//! * [`trace`]: the Chrome/Perfetto trace writer every command's `--trace`
//!   uses.

pub mod profiling_integration;
pub mod schedule_timing;
pub mod system_timer;
pub mod trace;
