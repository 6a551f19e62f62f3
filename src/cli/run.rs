//! `optirs-tpu run`: step a pod.

use super::parse::{
    MAX_SECONDS, number, parse_count, parse_count_u64, parse_seconds, parse_timed_device,
    parse_timed_link, usage,
};
use super::{output, progress};
use anyhow::{Result, bail};
use clap::Args;
use optirs_tpu::Pod;
use optirs_tpu::health::Fault;
use optirs_tpu::monitor::{PerformanceReport, performance_report};
use optirs_tpu::profile::trace::{Event, Scope};
use optirs_tpu::topology::{DEFAULT_PRESET, DeviceId, Topology};
use optirs_tpu::xla::backend::profiling_integration::ProfilingIntegration;
use serde::Serialize;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Wall-clock step times `run` keeps for its report: the newest this many
/// ticks (512 KiB), so a run of any length holds a bounded amount. The
/// report's `step_wall_ns` summary is over them (its `count` says how many);
/// `wall_ns_per_tick` is over the whole run.
pub const STEP_WALL_SAMPLES: usize = 1 << 16;

/// A ring of the newest [`STEP_WALL_SAMPLES`] step times, ns.
#[derive(Debug, Default)]
struct StepWallTimes {
    newest: VecDeque<u64>,
}

impl StepWallTimes {
    /// An empty ring with room for `steps` samples (at most the capacity).
    fn with_steps(steps: u64) -> Self {
        let room = usize::try_from(steps).map_or(STEP_WALL_SAMPLES, |s| s.min(STEP_WALL_SAMPLES));
        StepWallTimes {
            newest: VecDeque::with_capacity(room),
        }
    }

    /// Records one step, dropping the oldest when full.
    fn push(&mut self, ns: u64) {
        if self.newest.len() == STEP_WALL_SAMPLES {
            self.newest.pop_front();
        }
        self.newest.push_back(ns);
    }

    /// The samples, oldest first.
    fn as_slice(&mut self) -> &[u64] {
        self.newest.make_contiguous()
    }
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// A preset name (see `optirs-tpu presets`) or a pod file path; with
    /// --restore, the checkpoint's pod unless given (default: v5e-16).
    pod: Option<String>,
    /// Ticks to run: `1000`, `10_000` or `1e4`.
    #[arg(long, default_value_t = 1000, value_parser = parse_count_u64,
          allow_negative_numbers = true)]
    steps: u64,
    /// Kill a device at a simulated time: `DEVICE@SECONDS` (repeatable).
    #[arg(long, value_name = "DEVICE@SECONDS", value_parser = parse_timed_device,
          allow_hyphen_values = true)]
    kill: Vec<(u32, f64)>,
    /// Pause a device (it stops responding) at a simulated time (repeatable).
    #[arg(long, value_name = "DEVICE@SECONDS", value_parser = parse_timed_device,
          allow_hyphen_values = true)]
    pause: Vec<(u32, f64)>,
    /// Cut the link between two devices at a simulated time: `A-B@SECONDS`
    /// (repeatable); traffic reroutes around it.
    #[arg(long, value_name = "A-B@SECONDS", value_parser = parse_timed_link,
          allow_hyphen_values = true)]
    cut: Vec<(u32, u32, f64)>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Write a Chrome/Perfetto trace of the run (systems in wall time,
    /// devices in simulated time). An existing file is never overwritten.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Jump the clock over idle ticks (nothing due: no heartbeat, message,
    /// fault, sample or checkpoint); the world is bit-identical to ticking
    /// each one, and the report says how many ticks were skipped.
    #[arg(long, conflicts_with = "trace")]
    skip_idle: bool,
    /// Under `mpirun`: how long a rank waits for another before it stops,
    /// naming the lost rank and its hosts (rank 0 waits this long, the
    /// others twice as long). 30 s if not given; refused in one process,
    /// which waits for no other rank.
    #[arg(long, value_name = "SECONDS", value_parser = super::parse::parse_rank_timeout,
          allow_negative_numbers = true)]
    pub(super) rank_timeout: Option<f64>,
    /// Write a checkpoint every this many simulated seconds (a whole
    /// number of the pod's ticks) into --checkpoint-dir, named
    /// `tick-NNNNNNNNNNNN`; under mpirun, one split checkpoint of every
    /// rank's part.
    #[arg(long, value_name = "SECONDS", requires = "checkpoint_dir", value_parser = parse_seconds,
          allow_negative_numbers = true)]
    pub(super) checkpoint_every: Option<f64>,
    /// Where --checkpoint-every writes (created if missing).
    #[arg(long, value_name = "DIR", requires = "checkpoint_every")]
    pub(super) checkpoint_dir: Option<PathBuf>,
    /// How many of the newest checkpoints --checkpoint-every keeps.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = parse_count,
          allow_negative_numbers = true)]
    pub(super) keep_checkpoints: usize,
    /// Start from a checkpoint (one process's or a split pod's, written
    /// with any rank count) instead of tick 0; --steps more ticks run.
    #[arg(long, value_name = "CHECKPOINT")]
    pub(super) restore: Option<PathBuf>,
}

impl RunArgs {
    /// The pod spec as given, or the default preset when neither a pod nor
    /// a checkpoint names one.
    pub(super) fn pod_spec(&self) -> Option<&str> {
        match (&self.pod, &self.restore) {
            (Some(pod), _) => Some(pod),
            (None, Some(_)) => None,
            (None, None) => Some(DEFAULT_PRESET),
        }
    }

    /// Ticks to run.
    #[cfg(feature = "mpi")]
    pub(super) fn steps(&self) -> u64 {
        self.steps
    }

    /// Whether to print JSON.
    #[cfg(feature = "mpi")]
    pub(super) fn json(&self) -> bool {
        self.json
    }

    /// Whether a trace was asked for.
    #[cfg(feature = "mpi")]
    pub(super) fn trace(&self) -> Option<&PathBuf> {
        self.trace.as_ref()
    }

    /// Refuses `--skip-idle` under an MPI launcher: every rank exchanges
    /// with the others each tick, so no tick is idle.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(super) fn refuse_split_skip_idle(&self) -> Result<()> {
        if self.skip_idle {
            return Err(usage(
                "--skip-idle runs in one process: under mpirun every rank exchanges with the \
                 others each tick, so no tick is idle; run without mpirun or without --skip-idle",
            ));
        }
        Ok(())
    }

    /// Refuses, before any work, the paths the run would write: the trace
    /// file and the checkpoint directory.
    pub(super) fn check_outputs(&self) -> Result<()> {
        output::refuse_existing(&[("--trace", self.trace.as_deref())])?;
        if let Some(dir) = &self.checkpoint_dir {
            output::check_dir("--checkpoint-dir", dir)?;
        }
        if let Some(dir) = &self.restore {
            output::refuse_missing("--restore", dir, "checkpoint directory")?;
        }
        Ok(())
    }

    /// Refuses a run longer than [`MAX_SECONDS`] of simulated time.
    pub(super) fn check_length(&self, tick_ns: u64) -> Result<()> {
        check_ticks("--steps", self.steps, tick_ns)
    }

    /// `--checkpoint-every` in ticks of `tick_ns`, refused unless it is a
    /// whole number of them (a `run` checkpoint is taken at the end of a
    /// tick, so any other period could not be honoured).
    pub(super) fn checkpoint_ticks(&self, tick_ns: u64) -> Result<Option<u64>> {
        let Some(every) = self.checkpoint_every else {
            return Ok(None);
        };
        let ticks = every * 1e9 / tick_ns as f64;
        let whole = ticks.round();
        if whole < 1.0 || (ticks - whole).abs() > 1e-6 * whole {
            let tick = output::seconds(tick_ns as f64 * 1e-9);
            let nearest = whole.max(1.0);
            return Err(usage(format!(
                "--checkpoint-every {} is not a whole number of the pod's {tick} ticks: \
                 give a multiple of {tick}, such as {} ({})",
                number(every),
                number(nearest * tick_ns as f64 * 1e-9),
                output::plural(nearest as u64, "tick", "ticks")
            )));
        }
        Ok(Some(whole as u64))
    }

    /// The faults of `--kill`, `--pause` and `--cut`, checked against the
    /// pod: a device it does not have, or a pair of devices with no link
    /// between them, is a bad value (exit code 2).
    pub(super) fn faults(&self, topology: &Topology) -> Result<Vec<(u64, Fault)>> {
        let devices = topology.num_devices();
        let name = self.pod.as_deref().unwrap_or(&topology.name);
        let exists = |flag: &str, device: u32| {
            if device >= devices {
                return Err(usage(format!(
                    "{flag}: device {device} does not exist: {name} has devices 0 to {}",
                    devices.saturating_sub(1)
                )));
            }
            Ok(())
        };
        let at_ns = |seconds: f64| (seconds * 1e9).round() as u64;
        let mut plan = Vec::new();
        for &(device, seconds) in &self.kill {
            exists("--kill", device)?;
            plan.push((at_ns(seconds), Fault::KillDevice(DeviceId(device))));
        }
        for &(device, seconds) in &self.pause {
            exists("--pause", device)?;
            plan.push((at_ns(seconds), Fault::PauseDevice(DeviceId(device))));
        }
        if !self.cut.is_empty() {
            let linked: std::collections::HashSet<(u32, u32)> = topology
                .links()
                .iter()
                .map(|link| (link.a.min(link.b), link.a.max(link.b)))
                .collect();
            for &(a, b, seconds) in &self.cut {
                exists("--cut", a)?;
                exists("--cut", b)?;
                if !linked.contains(&(a.min(b), a.max(b))) {
                    return Err(usage(format!(
                        "--cut {a}-{b}: {name} has no link between device {a} and device {b}"
                    )));
                }
                plan.push((at_ns(seconds), Fault::CutLink(DeviceId(a), DeviceId(b))));
            }
        }
        Ok(plan)
    }
}

/// Refuses `flag`'s `ticks` of `tick_ns` when they would cover more than
/// [`MAX_SECONDS`] of simulated time: the bound every duration on the
/// command line has.
pub(super) fn check_ticks(flag: &str, ticks: u64, tick_ns: u64) -> Result<()> {
    let seconds = ticks as f64 * tick_ns as f64 * 1e-9;
    if seconds > MAX_SECONDS {
        return Err(usage(format!(
            "{flag} {}: that many ticks of {} is {} of simulated time, more than the {} a \
             run may cover",
            number(ticks as f64),
            output::seconds(tick_ns as f64 * 1e-9),
            output::seconds(seconds),
            output::seconds(MAX_SECONDS)
        )));
    }
    Ok(())
}

/// One detected failure, in seconds.
#[derive(Serialize, Debug)]
struct FailureRow {
    device: u32,
    /// When the device went silent: its first kill or pause since it last
    /// ran (a pause then a kill is dated from the pause).
    injected_at_s: Option<f64>,
    detected_at_s: f64,
    /// `detected_at_s - injected_at_s`: how long the detector took.
    detection_latency_s: Option<f64>,
}

/// What `run` (and `checkpoint restore`) report.
#[derive(Serialize, Debug)]
pub struct RunReport {
    pod: String,
    generation: String,
    /// Device (chip) entities.
    chips: u32,
    hosts: u32,
    links: usize,
    ticks: u64,
    /// Idle ticks jumped over (`--skip-idle`), of `ticks`.
    #[serde(skip_serializing_if = "Option::is_none")]
    skipped_ticks: Option<u64>,
    tick_ns: u64,
    simulated_seconds: f64,
    build_seconds: f64,
    wall_seconds: f64,
    wall_ns_per_tick: f64,
    failures: Vec<FailureRow>,
    /// Processes the pod ran on (`mpirun -n R`; 1 for one process).
    pub(super) ranks: u32,
    world_sha256: String,
    /// The monitor's report over its live history.
    performance: PerformanceReport,
}

/// Ticks per `run_skipping` call under `--skip-idle`, so the progress bar
/// moves (splitting a run changes nothing: each part equals its ticks).
const SKIP_CHUNK_TICKS: u64 = 1 << 16;

/// `run` in this process (`mod.rs` checks the outputs first and sends a
/// pod split over MPI ranks to [`super::ranks::run`]).
pub fn run(args: RunArgs) -> Result<()> {
    super::parse::refuse_rank_timeout_in_one_process(args.rank_timeout, "run")?;
    let mut profiler = args.trace.as_ref().map(|_| ProfilingIntegration::new());
    let build_start = Instant::now();
    let build = || -> optirs_tpu::error::Result<Pod> {
        let Some(dir) = &args.restore else {
            return Pod::load(args.pod_spec().unwrap_or(DEFAULT_PRESET));
        };
        let registry = optirs_tpu::checkpoint::engine_registry();
        let snapshot = optirs_tpu::checkpoint::split::read_any_checkpoint(dir, &registry)?;
        match args.pod_spec() {
            // The checkpoint names its pod.
            None => Pod::from_snapshot(&snapshot),
            Some(spec) => {
                let mut pod = Pod::load(spec)?;
                pod.restore_snapshot(&snapshot)?;
                Ok(pod)
            }
        }
    };
    let mut pod = match &profiler {
        Some(profiler) => profiler.build_pod(build)?,
        None => build()?,
    };
    let tick_ns = pod.clock().tick_ns;
    args.check_length(tick_ns)?;
    if let (Some(every), Some(dir)) = (args.checkpoint_ticks(tick_ns)?, &args.checkpoint_dir) {
        pod.enable_periodic_checkpoints(every, vec![dir.clone()], args.keep_checkpoints)?;
    }
    let build_seconds = build_start.elapsed().as_secs_f64();
    let plan = args.faults(pod.topology())?;
    for &(at_ns, fault) in &plan {
        pod.schedule_fault(at_ns, fault);
    }
    check_faults_apply(&mut pod, args.steps)?;
    let bar = progress::bar(args.steps, args.json, "run");
    let start = Instant::now();
    let mut step_wall_ns = StepWallTimes::with_steps(args.steps);
    let mut skipped = None;
    match &mut profiler {
        None if args.skip_idle => {
            let mut stats = optirs_tpu::pod::SkipStats::default();
            let mut done = 0;
            while done < args.steps {
                let chunk = (args.steps - done).min(SKIP_CHUNK_TICKS);
                let ran = pod.run_skipping(chunk)?;
                stats.stepped += ran.stepped;
                stats.skipped += ran.skipped;
                stats.jumps += ran.jumps;
                done += chunk;
                bar.set_position(done);
                refuse_failed_checkpoint(&pod)?;
            }
            skipped = Some(stats.skipped);
        }
        Some(profiler) => profiler.run(&mut pod, args.steps, &mut |done| {
            if done % 64 == 0 {
                bar.set_position(done)
            }
        }),
        None => {
            for done in 1..=args.steps {
                // One tick to its boundary: a fault inside it stops the
                // clock at its time, then the rest of the tick runs.
                let tick_start = Instant::now();
                pod.run(1);
                step_wall_ns.push(tick_start.elapsed().as_nanos() as u64);
                if done % 64 == 0 {
                    bar.set_position(done);
                    refuse_failed_checkpoint(&pod)?;
                }
            }
        }
    }
    let wall_seconds = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    refuse_failed_checkpoint(&pod)?;
    // Skipped ticks have no wall time of their own.
    let step_wall = match &profiler {
        Some(profiler) => Some(profiler.step_wall_ns()),
        None if args.skip_idle => None,
        None => Some(step_wall_ns.as_slice()),
    };
    let mut report = report_after(&mut pod, args.steps, build_seconds, wall_seconds, step_wall)?;
    report.skipped_ticks = skipped;
    if let (Some(profiler), Some(path)) = (&profiler, &args.trace) {
        write_trace(profiler, path, &plan)?;
    }
    print_report(&report, args.json)
}

/// Writes the run's trace with a marker across the devices at each
/// injected fault (`kill device 5`, `cut link 0-1`), so the fault shows
/// where it struck, not only where it was detected. Without faults the
/// profiler streams its events; with them the trace is built whole first.
fn write_trace(profiler: &ProfilingIntegration, path: &Path, plan: &[(u64, Fault)]) -> Result<()> {
    if plan.is_empty() {
        return Ok(profiler.write_trace(path)?);
    }
    let mut trace = profiler.trace();
    trace.extend(
        plan.iter()
            .map(|&(at_ns, fault)| fault_marker(at_ns, fault)),
    );
    output::write_new("--trace", path, &serde_json::to_string(&trace)?)
}

/// A process-wide instant on the devices' (simulated-time) tracks.
fn fault_marker(at_ns: u64, fault: Fault) -> Event {
    let name = match fault {
        Fault::KillDevice(d) => format!("kill device {}", d.0),
        Fault::PauseDevice(d) => format!("pause device {}", d.0),
        Fault::CutLink(a, b) => format!("cut link {}-{}", a.0, b.0),
        other => format!("{other:?}"),
    };
    Event::instant(name, at_ns as f64 / 1e3, Scope::Process)
        .category("fault")
        .on(optirs_tpu::profile::profiling_integration::pid::DEVICES, 0)
        .args(serde_json::json!({"at_seconds": at_ns as f64 * 1e-9}))
}

/// Stops the run once a periodic checkpoint has failed, instead of
/// stepping on to report it at the end.
fn refuse_failed_checkpoint(pod: &Pod) -> Result<()> {
    if let Some(periodic) = pod
        .world()
        .get_resource::<optirs_tpu::checkpoint::PeriodicCheckpoints>()
        && let Some(error) = &periodic.last_error
    {
        bail!(
            "a periodic checkpoint could not be written at tick {}: {error}",
            pod.clock().tick
        );
    }
    Ok(())
}

/// Refuses a run whose `--kill`/`--pause` faults can never apply.
fn check_faults_apply(pod: &mut Pod, steps: u64) -> Result<()> {
    let unappliable = pod.faults_that_cannot_apply(steps);
    refuse_unappliable(&unappliable, steps, pod.clock().tick_ns)
}

/// Refuses faults that can never apply, each named as its flag was
/// written (`--kill 5@30`) with the reason, on one line: a bad value on
/// the command line (exit code 2).
pub(super) fn refuse_unappliable(
    unappliable: &[optirs_tpu::health::UnappliableFault],
    steps: u64,
    tick_ns: u64,
) -> Result<()> {
    if unappliable.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = unappliable
        .iter()
        .map(|f| format!("{} {}", as_flag(&f.scheduled), f.reason))
        .collect();
    Err(usage(format!(
        "{} can never apply in a run of {} ({}): {}",
        if unappliable.len() == 1 {
            "a fault".to_string()
        } else {
            format!("{} faults", unappliable.len())
        },
        output::plural(steps, "tick", "ticks"),
        output::seconds(steps as f64 * tick_ns as f64 * 1e-9),
        list.join("; ")
    )))
}

/// A scheduled fault as the flag that asks for it: `--kill 5@30`.
fn as_flag(scheduled: &optirs_tpu::health::ScheduledFault) -> String {
    let at = number(scheduled.at_ns as f64 * 1e-9);
    match scheduled.fault {
        Fault::KillDevice(d) => format!("--kill {}@{at}:", d.0),
        Fault::PauseDevice(d) => format!("--pause {}@{at}:", d.0),
        Fault::CutLink(a, b) => format!("--cut {}-{}@{at}:", a.0, b.0),
        other => format!("{other:?} at {at} s:"),
    }
}

/// Runs `steps` ticks (with a progress bar on a terminal unless `json`)
/// and reports the pod's state after them.
pub fn step_and_report(
    pod: &mut Pod,
    steps: u64,
    build_seconds: f64,
    json: bool,
) -> Result<RunReport> {
    let bar = progress::bar(steps, json, "run");
    let start = Instant::now();
    let mut done = 0;
    while done < steps {
        let chunk = (steps - done).min(64);
        pod.run(chunk);
        done += chunk;
        bar.set_position(done);
    }
    bar.finish_and_clear();
    let wall_seconds = start.elapsed().as_secs_f64();
    report_after(pod, steps, build_seconds, wall_seconds, None)
}

/// Reports the pod's state after `steps` ticks that took `wall_seconds`.
pub(super) fn report_after(
    pod: &mut Pod,
    steps: u64,
    build_seconds: f64,
    wall_seconds: f64,
    step_wall_ns: Option<&[u64]>,
) -> Result<RunReport> {
    let performance = performance_report(pod.world_mut(), step_wall_ns);
    let world_sha256 = pod.world_sha256()?;
    let topology = pod.topology();
    Ok(RunReport {
        pod: topology.name.clone(),
        generation: topology.generation.to_string(),
        chips: topology.num_devices(),
        hosts: topology.num_hosts(),
        links: topology.links().len(),
        ticks: pod.clock().tick,
        skipped_ticks: None,
        tick_ns: pod.clock().tick_ns,
        simulated_seconds: pod.clock().now_seconds(),
        build_seconds,
        wall_seconds,
        // No ticks, no time per tick.
        wall_ns_per_tick: if steps == 0 {
            0.0
        } else {
            wall_seconds * 1e9 / steps as f64
        },
        failures: pod
            .failures()
            .iter()
            .map(|record| FailureRow {
                device: record.device.0,
                injected_at_s: record.injected_at_ns.map(|ns| ns as f64 * 1e-9),
                detected_at_s: record.detected_at_ns as f64 * 1e-9,
                detection_latency_s: record
                    .injected_at_ns
                    .map(|ns| record.detected_at_ns.saturating_sub(ns) as f64 * 1e-9),
            })
            .collect(),
        ranks: 1,
        world_sha256,
        performance,
    })
}

/// Prints a report as JSON or text.
pub fn print_report(report: &RunReport, json: bool) -> Result<()> {
    if json {
        return output::print_json(report);
    }
    let mut failures = String::new();
    for row in &report.failures {
        let injected = row.injected_at_s.map_or_else(
            || "no injected fault".to_string(),
            |s| format!("silent since {}", output::seconds(s)),
        );
        let latency = row
            .detection_latency_s
            .map_or_else(String::new, |s| format!(" ({} later)", output::seconds(s)));
        failures += &format!(
            "  device {:>5} failed: {injected}, detected at {}{latency}\n",
            row.device,
            output::seconds(row.detected_at_s)
        );
    }
    if report.failures.is_empty() {
        failures = "  no failures detected\n".to_string();
    }
    output::print_text(&format!(
        "pod {} ({}, {} on {}, {}), built in {}\n\
         at tick {}: {} simulated; ran in {} wall ({} per tick){}{}\n{failures}\
         {}world sha256 {}\n",
        report.pod,
        report.generation,
        output::plural(u64::from(report.chips), "chip", "chips"),
        output::plural(u64::from(report.hosts), "host", "hosts"),
        output::plural(report.links as u64, "link", "links"),
        output::seconds(report.build_seconds),
        report.ticks,
        output::seconds(report.simulated_seconds),
        output::seconds(report.wall_seconds),
        output::seconds(report.wall_ns_per_tick * 1e-9),
        if report.ranks > 1 {
            format!(" on {} ranks", report.ranks)
        } else {
            String::new()
        },
        report
            .skipped_ticks
            .map_or(String::new(), |skipped| format!(
                "; {} skipped, {} stepped",
                output::plural(skipped, "idle tick", "idle ticks"),
                report.ticks.saturating_sub(skipped)
            )),
        performance_text(&report.performance),
        report.world_sha256,
    ))
}

/// The monitor's figures as a few lines of text.
fn performance_text(p: &PerformanceReport) -> String {
    let ns = |v: f64| output::seconds(v * 1e-9);
    let mut text = format!(
        "monitor: {} samples every {}; checks {} ok, {} warning, {} critical\n\
         \x20 heartbeat latency p50 {} p99 {}; age p99 {}\n\
         \x20 link traffic per link p50 {} p99 {} peak {} (utilization p99 {:.3} %)\n",
        p.samples,
        ns(p.sample_every_ns as f64),
        p.checks.ok,
        p.checks.warning,
        p.checks.critical,
        ns(p.heartbeat_latency_ns.p50),
        ns(p.heartbeat_latency_ns.p99),
        ns(p.heartbeat_age_ns.p99),
        output::bytes_per_s(p.link_bytes_per_s.p50),
        output::bytes_per_s(p.link_bytes_per_s.p99),
        output::bytes_per_s(p.link_peak_bytes_per_s),
        p.link_utilization.p99 * 100.0,
    );
    if let Some(step) = &p.step_wall_ns {
        text += &format!(
            "  step wall time mean {} p50 {} p99 {}\n",
            ns(step.mean),
            ns(step.p50),
            ns(step.p99)
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_wall_times_stay_bounded_on_long_runs() {
        let mut times = StepWallTimes::with_steps(u64::MAX);
        let n = 3 * STEP_WALL_SAMPLES as u64 + 5;
        for ns in 0..n {
            times.push(ns);
        }
        assert!(times.newest.capacity() < 2 * STEP_WALL_SAMPLES);
        let kept = times.as_slice();
        assert_eq!(kept.len(), STEP_WALL_SAMPLES);
        assert_eq!(kept[0], n - STEP_WALL_SAMPLES as u64);
        assert_eq!(*kept.last().unwrap(), n - 1);
        // A short run keeps every step and reserves only what it needs.
        let mut short = StepWallTimes::with_steps(3);
        for ns in [5, 7, 9] {
            short.push(ns);
        }
        assert_eq!(short.as_slice(), &[5, 7, 9]);
        assert!(short.newest.capacity() < 64);
    }
}
