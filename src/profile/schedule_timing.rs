//! Per-system timing of the `Step` and `Compile` schedules
//! (`optirs-tpu bench schedule`).
//!
//! A pod is built inside a [`SystemTimer`] scope, stepped `steps` ticks and
//! made to compile the bundled programs; each system's time per run becomes a
//! sample, summarized as mean, p50 and p99 (nearest rank). Every system is
//! named with the `StepSystems` / `CompileSystems` set it was added to, read
//! from the schedule graph, so the table shows where a tick's time goes.

use super::system_timer::{SystemSpan, SystemTimer};
use crate::error::Result;
use crate::pod::Pod;
pub use crate::schedule::{COMPILE_SETS, STEP_SETS};
use crate::schedule::{Compile, Step};
use bevy_ecs::prelude::*;
use bevy_ecs::schedule::{InternedScheduleLabel, InternedSystemSet, ScheduleLabel, Schedules};
use serde::Serialize;
use std::collections::HashMap;

/// The programs in `assets/programs/`, embedded: `(file name, RON text)`.
pub const BUNDLED_PROGRAMS: &[(&str, &str)] = &[
    ("adam.ron", include_str!("../../assets/programs/adam.ron")),
    (
        "conv_block.ron",
        include_str!("../../assets/programs/conv_block.ron"),
    ),
    (
        "cse_fold.ron",
        include_str!("../../assets/programs/cse_fold.ron"),
    ),
    ("mlp.ron", include_str!("../../assets/programs/mlp.ron")),
];

/// Where a system sits: its schedule, its set, its position in the run order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemPlace {
    /// `"Step"` or `"Compile"`.
    pub schedule: &'static str,
    /// The engine set it was added to (`"Heartbeats"`), or `"-"`.
    pub set: String,
    /// Position in the schedule's run order.
    pub order: usize,
}

/// Sets with their printed names.
type NamedSets = [(String, InternedSystemSet)];

/// Maps every system name of the `Step` and `Compile` schedules to its place.
pub fn system_places(world: &World) -> HashMap<String, SystemPlace> {
    let mut places = HashMap::new();
    let Some(schedules) = world.get_resource::<Schedules>() else {
        return places;
    };
    let step: Vec<(String, InternedSystemSet)> = STEP_SETS
        .iter()
        .map(|s| (format!("{s:?}"), s.intern()))
        .collect();
    let compile: Vec<(String, InternedSystemSet)> = COMPILE_SETS
        .iter()
        .map(|s| (format!("{s:?}"), s.intern()))
        .collect();
    let labels: [(&'static str, InternedScheduleLabel, &NamedSets); 2] = [
        ("Step", Step.intern(), step.as_slice()),
        ("Compile", Compile.intern(), compile.as_slice()),
    ];
    for (label_name, label, sets) in labels {
        let Some(schedule) = schedules.get(label) else {
            continue;
        };
        let Ok(systems) = schedule.systems() else {
            continue;
        };
        let graph = schedule.graph();
        for (order, (key, system)) in systems.enumerate() {
            let set = sets
                .iter()
                .find(|(_, set)| {
                    graph
                        .systems_in_set(*set)
                        .is_ok_and(|members| members.contains(&key))
                })
                .map_or_else(|| "-".to_string(), |(name, _)| name.clone());
            places.insert(
                system.name().to_string(),
                SystemPlace {
                    schedule: label_name,
                    set,
                    order,
                },
            );
        }
    }
    places
}

/// Timing of one system over a benchmark.
#[derive(Debug, Clone, Serialize)]
pub struct SystemTiming {
    /// The system's name (its function path).
    pub name: String,
    /// `"Step"` or `"Compile"`.
    pub schedule: &'static str,
    /// The engine set it belongs to.
    pub set: String,
    /// Runs measured.
    pub runs: usize,
    /// Mean wall time per run, ns.
    pub mean_ns: f64,
    /// Median, ns.
    pub p50_ns: u64,
    /// 99th percentile (nearest rank), ns.
    pub p99_ns: u64,
}

/// The result of [`bench_schedules`]: exactly `{pod, steps, systems}` in JSON.
#[derive(Debug, Clone, Serialize)]
pub struct ScheduleBench {
    /// The pod's name.
    pub pod: String,
    /// `Step` ticks measured.
    pub steps: u64,
    /// One row per system, `Step` first, each schedule in run order.
    pub systems: Vec<SystemTiming>,
}

/// Nearest-rank percentile of sorted samples (`p` in 0..=100).
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Adds one run's spans to the samples, summing repeated runs of a system.
fn add_run(samples: &mut HashMap<u32, Vec<u64>>, spans: &[SystemSpan]) {
    let mut per_system: HashMap<u32, u64> = HashMap::new();
    for span in spans {
        *per_system.entry(span.system).or_default() += span.dur_ns;
    }
    for (system, ns) in per_system {
        samples.entry(system).or_default().push(ns);
    }
}

/// Builds the pod `spec` (preset or file), steps it `steps` ticks and
/// compiles every bundled program `compile_runs` times, timing every system.
/// `progress(done, total)` is called after each unit of work.
pub fn bench_schedules(
    spec: &str,
    steps: u64,
    compile_runs: usize,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ScheduleBench> {
    let timer = SystemTimer::new();
    let mut pod = timer.scope(|| Pod::load(spec))?;
    let places = system_places(pod.world());
    let total = steps + (compile_runs * BUNDLED_PROGRAMS.len()) as u64;
    let mut step_samples: HashMap<u32, Vec<u64>> = HashMap::new();
    let mut compile_samples: HashMap<u32, Vec<u64>> = HashMap::new();
    timer.set_recording(true);
    for done in 1..=steps {
        pod.step();
        add_run(&mut step_samples, &timer.take());
        progress(done, total);
    }
    let mut done = steps;
    for run in 0..compile_runs {
        for (file, text) in BUNDLED_PROGRAMS {
            pod.compile_program_str(&format!("{file}#{run}"), text)?;
            add_run(&mut compile_samples, &timer.take());
            done += 1;
            progress(done, total);
        }
    }
    timer.set_recording(false);
    let names = timer.names();
    let mut systems = Vec::new();
    for (schedule, samples) in [("Step", step_samples), ("Compile", compile_samples)] {
        for (system, mut ns) in samples {
            let name = names[system as usize].clone();
            let place = places.get(&name);
            ns.sort_unstable();
            systems.push((
                place.map_or(usize::MAX, |p| p.order),
                SystemTiming {
                    schedule,
                    set: place.map_or_else(|| "-".to_string(), |p| p.set.clone()),
                    runs: ns.len(),
                    mean_ns: ns.iter().sum::<u64>() as f64 / ns.len() as f64,
                    p50_ns: percentile(&ns, 50.0),
                    p99_ns: percentile(&ns, 99.0),
                    name,
                },
            ));
        }
    }
    systems.sort_by(|(a_order, a), (b_order, b)| {
        (a.schedule != "Step", *a_order, &a.name).cmp(&(b.schedule != "Step", *b_order, &b.name))
    });
    Ok(ScheduleBench {
        pod: pod.topology().name.clone(),
        steps,
        systems: systems.into_iter().map(|(_, s)| s).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert_eq!(percentile(&[], 50.0), 0);
    }

    #[test]
    fn every_step_system_is_timed_in_its_set() {
        let bench = bench_schedules("v4-16", 20, 1, &mut |_, _| {}).unwrap();
        let heartbeat = bench
            .systems
            .iter()
            .find(|s| s.name.ends_with("emit_heartbeats"))
            .expect("emit_heartbeats timed");
        assert_eq!(
            (heartbeat.schedule, heartbeat.set.as_str()),
            ("Step", "Heartbeats")
        );
        assert_eq!(heartbeat.runs, 20);
        assert!(heartbeat.p50_ns <= heartbeat.p99_ns);
        let fuse = bench
            .systems
            .iter()
            .find(|s| s.name.ends_with("fuse_kernels"))
            .expect("fuse_kernels timed");
        assert_eq!((fuse.schedule, fuse.set.as_str()), ("Compile", "Fuse"));
        assert_eq!(fuse.runs, BUNDLED_PROGRAMS.len());
        assert!(bench.systems.iter().all(|s| s.set != "-"), "{bench:#?}");
    }
}
