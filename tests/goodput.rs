//! Goodput through failures: determinism, Young/Daly, published figures,
//! monotonicity, bad input. Inputs taken from publications are stated
//! where they are used; `docs/goodput.md` lists them with what the
//! publications leave open.

use optirs_tpu::TpuGeneration;
use optirs_tpu::goodput::{
    CheckpointInterval, FailureUnit, Fleet, GoodputConfig, GoodputError, GoodputReport,
    parse_recovery, simulate, young_daly_seconds,
};
use optirs_tpu::sharding::RecoveryPolicy;
use optirs_tpu::topology::load_preset;

fn small_fleet() -> Fleet {
    Fleet::blocks("test-1024", 1024, 4, TpuGeneration::V4).unwrap()
}

fn small_config() -> GoodputConfig {
    // 1024 chips at 3072 h each: the pod fails every 3 h.
    let mut config = GoodputConfig::new(1_000_000_000, 3.0 * 1024.0, 20.0, 2.0);
    config.checkpoint = CheckpointInterval::Every(900.0);
    config.seed = 11;
    config
}

fn accounted(r: &GoodputReport) -> f64 {
    r.productive_seconds
        + r.lost_seconds
        + r.checkpoint_seconds
        + r.recovery_seconds
        + r.replication_seconds
}

#[test]
fn the_same_seed_gives_the_same_run_and_another_seed_another() {
    let fleet = small_fleet();
    for recovery in [RecoveryPolicy::Rollback, RecoveryPolicy::Redundant] {
        let mut config = small_config();
        config.recovery = recovery;
        config.checkpoint = CheckpointInterval::Auto;
        let a = simulate(&fleet, &config).unwrap();
        let b = simulate(&fleet, &config).unwrap();
        assert_eq!(a, b, "{recovery}: a seed must replay the same run");
        config.seed += 1;
        let c = simulate(&fleet, &config).unwrap();
        assert_ne!(
            (a.restarts, a.goodput.to_bits()),
            (c.restarts, c.goodput.to_bits()),
            "{recovery}: another seed must draw other failures"
        );
    }
}

#[test]
fn every_simulated_second_is_accounted_once() {
    let fleet = small_fleet();
    for recovery in [RecoveryPolicy::Rollback, RecoveryPolicy::Redundant] {
        for checkpoint in [
            CheckpointInterval::Never,
            CheckpointInterval::Every(60.0),
            CheckpointInterval::Auto,
        ] {
            let mut config = small_config();
            config.recovery = recovery;
            config.checkpoint = checkpoint;
            let r = simulate(&fleet, &config).unwrap();
            assert!(
                (accounted(&r) - r.simulated_seconds).abs() < 1e-6 * r.simulated_seconds,
                "{recovery} {checkpoint:?}: {} accounted of {}",
                accounted(&r),
                r.simulated_seconds
            );
            assert!((r.goodput - r.productive_seconds / r.simulated_seconds).abs() < 1e-12);
            // 20 days at a failure every 3 h: 160 expected.
            assert!((100..230).contains(&r.restarts), "{}", r.restarts);
        }
    }
}

/// Young/Daly's assumptions: exponential failures, a checkpoint much
/// shorter than the MTBF, a restart short enough that failures during it
/// are rare, and a long run (many failures).
#[test]
fn auto_agrees_with_young_daly_where_its_assumptions_hold() {
    let fleet = small_fleet();
    // (params, storage bytes/s, pod MTBF hours): checkpoints of 30 s, 5 s, 120 s.
    for (params, storage, pod_mtbf_hours) in [
        (1_000_000_000u64, 4e8, 3.0),
        (1_000_000_000, 2.4e9, 1.0),
        (10_000_000_000, 1e9, 12.0),
    ] {
        let mut config = GoodputConfig::new(params, pod_mtbf_hours * 1024.0, 54.0, 1.0);
        config.storage_bytes_per_s = Some(storage);
        config.restart_seconds = 60.0;
        config.reconfigure_seconds = 0.0;
        config.checkpoint = CheckpointInterval::Auto;
        config.seed = 3;
        let r = simulate(&fleet, &config).unwrap();
        let c = r.costs.checkpoint_write_seconds;
        let young = young_daly_seconds(c, r.costs.system_mtbf_seconds);
        let auto = r.checkpoint_interval_seconds.unwrap();
        assert!(
            (auto / young - 1.0).abs() <= 0.10,
            "C = {c} s, MTBF = {} s: auto {auto} s vs Young/Daly {young} s",
            r.costs.system_mtbf_seconds
        );
        // And auto is no worse than Young/Daly's own interval on the same run.
        config.checkpoint = CheckpointInterval::Every(young);
        let at_young = simulate(&fleet, &config).unwrap();
        assert!(
            r.goodput >= at_young.goodput - 2e-3,
            "{} vs {}",
            r.goodput,
            at_young.goodput
        );
    }
}

/// Llama 3 405B (Meta, "The Llama 3 Herd of Models", 2024).
///
/// From the publication:
/// * 16,384 H100 GPUs in servers of 8 (§3.3.1, "Compute");
/// * 419 unexpected interruptions in a 54-day snapshot of pre-training
///   (§3.3.4): one per 54·24/419 = 3.09 h, so a per-GPU MTBF of
///   3.09 h × 16,384 = 50,675 h, failures per chip;
/// * "higher than 90% effective training time" (§3.3.4);
/// * checkpoint storage: Tectonic, "a sustainable throughput of 2 TB/s"
///   (§3.3.1, "Storage");
/// * 405e9 parameters; the step: a 16M-token batch (§3.4.1) at 400 TFLOPs
///   per GPU on 16,384 GPUs (Table 4): 6·405e9·2^24 / (16,384·400e12) = 6.2 s.
///
/// Left open, and assumed: the checkpoint interval (auto, the simulated
/// optimum); the state's bytes (the crate's f32 parameters and Adam's two
/// moments: 12 bytes per parameter, 4.86 TB); the restart time (the
/// crate's default, 600 s; the paper says only that it reduced "job
/// startup and checkpointing time"); the reconfiguration (10 s) and the
/// detection (10 s); the 47 planned interruptions are not simulated.
#[test]
fn llama3_405b_lands_within_three_points_of_its_published_effective_training_time() {
    let fleet = Fleet::blocks("llama3-16k", 16_384, 8, TpuGeneration::V5p).unwrap();
    let mtbf_hours = 54.0 * 24.0 / 419.0 * 16_384.0;
    let step = 6.0 * 405e9 * 16_777_216.0 / (16_384.0 * 400e12);
    let mut config = GoodputConfig::new(405_000_000_000, mtbf_hours, 54.0, step);
    config.storage_bytes_per_s = Some(2e12);
    config.seed = 2024;
    let r = simulate(&fleet, &config).unwrap();
    assert!(
        (0.87..=0.93).contains(&r.goodput),
        "published > 90%, simulated {:.2}%",
        100.0 * r.goodput
    );
    assert!(
        (359..=479).contains(&r.restarts),
        "{} interruptions",
        r.restarts
    );
    eprintln!(
        "Llama 3: {:.2}% ({} restarts, interval {:?} s, Young/Daly {} s)",
        100.0 * r.goodput,
        r.restarts,
        r.checkpoint_interval_seconds,
        r.young_daly_seconds
    );
}

/// Gemini (Google, "Gemini: A Family of Highly Capable Multimodal Models",
/// 2023, "Training Infrastructure"): "the overall goodput for the
/// largest-scale training job increased from 85% to 97%" once recovery
/// used "redundant in-memory copies of the model state" instead of
/// "periodic checkpointing of weights to persistent cluster storage";
/// TPU v4 SuperPods of 4096 chips whose cubes the OCS rewires "in around
/// 10 seconds".
///
/// Left open, and assumed (see `docs/goodput.md`): the chip count (2
/// SuperPods, 8,192 v4 chips, 4 per host, as `v4-8192` has them); the
/// failure rate (Llama 3's per-accelerator rate, 50,675 h per chip: a
/// failure every 6.19 h); the model (1e12 parameters, f32 with Adam: 12 TB
/// of state); the persistent storage's aggregate bandwidth (80 GB/s: a
/// 150 s checkpoint); the step (10 s); the restart (the default 600 s, the
/// same under both policies); the checkpoint interval (auto for rollback;
/// redundant keeps auto checkpoints as the fallback when both copies are
/// lost).
#[test]
fn gemini_goodput_rises_from_85_to_97_percent_with_redundant_copies() {
    let fleet = Fleet::blocks("gemini-2x4096", 8192, 4, TpuGeneration::V4).unwrap();
    let mtbf_hours = 54.0 * 24.0 / 419.0 * 16_384.0;
    let mut config = GoodputConfig::new(1_000_000_000_000, mtbf_hours, 54.0, 10.0);
    config.storage_bytes_per_s = Some(8e10);
    config.seed = 2023;
    let rollback = simulate(&fleet, &config).unwrap();
    config.recovery = RecoveryPolicy::Redundant;
    let redundant = simulate(&fleet, &config).unwrap();
    assert!(
        (rollback.goodput - 0.85).abs() <= 0.03,
        "rollback: published 85%, simulated {:.2}%",
        100.0 * rollback.goodput
    );
    assert!(
        (redundant.goodput - 0.97).abs() <= 0.03,
        "redundant: published 97%, simulated {:.2}%",
        100.0 * redundant.goodput
    );
    assert_eq!(
        redundant.lost_steps, 0,
        "chip failures never lose both copies here"
    );
    eprintln!(
        "Gemini: rollback {:.2}% ({} restarts, interval {:?} s), redundant {:.2}% ({} restarts)",
        100.0 * rollback.goodput,
        rollback.restarts,
        rollback.checkpoint_interval_seconds,
        100.0 * redundant.goodput,
        redundant.restarts
    );
}

#[test]
fn goodput_rises_with_the_mtbf() {
    let fleet = small_fleet();
    for checkpoint in [CheckpointInterval::Every(600.0), CheckpointInterval::Auto] {
        let mut last = (0.0, u64::MAX);
        for hours in [500.0, 1000.0, 2000.0, 4000.0, 8000.0, 16000.0] {
            let mut config = small_config();
            config.mtbf_hours = hours;
            config.checkpoint = checkpoint;
            let r = simulate(&fleet, &config).unwrap();
            assert!(
                r.goodput > last.0 && r.restarts < last.1,
                "{checkpoint:?}: MTBF {hours} h gives {} ({} restarts) after {last:?}",
                r.goodput,
                r.restarts
            );
            last = (r.goodput, r.restarts);
        }
    }
}

#[test]
fn a_host_that_drives_a_device_and_its_ring_successor_loses_both_copies() {
    // v4-128: hosts of 2x2x1 chips; the snake ring runs through each host.
    let topology = load_preset("v4-128").unwrap();
    let fleet = Fleet::from_topology(&topology).unwrap();
    let mut config = GoodputConfig::new(1_000_000_000, 64.0 * 24.0, 30.0, 1.0);
    config.recovery = RecoveryPolicy::Redundant;
    config.failure_unit = FailureUnit::Host;
    config.mtbf_hours = 16.0 * 24.0;
    let hosts = simulate(&fleet, &config).unwrap();
    assert!(hosts.restarts > 0);
    // Every failure falls back, but one during a recovery that already
    // rolls back (it only restarts that recovery).
    assert!(
        hosts.fallbacks_to_checkpoint * 10 >= hosts.restarts * 9,
        "{hosts:?}"
    );
    assert!(hosts.lost_steps > 0);
    config.failure_unit = FailureUnit::Chip;
    config.mtbf_hours = 64.0 * 24.0;
    let chips = simulate(&fleet, &config).unwrap();
    assert!(chips.restarts > 0);
    assert!(
        chips.fallbacks_to_checkpoint * 20 < chips.restarts,
        "{chips:?}"
    );
}

#[test]
fn bad_input_is_refused_before_any_work_with_a_clear_error() {
    let fleet = small_fleet();
    let cases: Vec<(GoodputConfig, &str)> = vec![
        (
            GoodputConfig {
                mtbf_hours: 0.0,
                ..small_config()
            },
            "--mtbf-hours must be a positive number, got 0",
        ),
        (
            GoodputConfig {
                mtbf_hours: -5.0,
                ..small_config()
            },
            "--mtbf-hours must be a positive number, got -5",
        ),
        (
            GoodputConfig {
                mtbf_hours: f64::NAN,
                ..small_config()
            },
            "--mtbf-hours must be a positive number",
        ),
        (
            GoodputConfig {
                days: 0.0,
                ..small_config()
            },
            "--days must be a positive number, got 0",
        ),
        (
            GoodputConfig {
                days: -1.0,
                ..small_config()
            },
            "--days must be a positive number, got -1",
        ),
        (
            GoodputConfig {
                model_params: 0,
                ..small_config()
            },
            "--model-params is 0",
        ),
        (
            GoodputConfig {
                checkpoint: CheckpointInterval::Every(-3.0),
                ..small_config()
            },
            "--checkpoint-every must be a positive number",
        ),
        (
            GoodputConfig {
                mtbf_hours: 1e-9,
                days: 365.0,
                ..small_config()
            },
            "failures, more than the",
        ),
        (
            GoodputConfig {
                days: 1000.0,
                mtbf_hours: 1e30,
                step_seconds: 1e-9,
                ..small_config()
            },
            "1000 days of 1e-9 s steps is more than the 1e15 steps a run counts",
        ),
        (
            GoodputConfig {
                days: 1e12,
                mtbf_hours: 1e30,
                ..small_config()
            },
            "--days 1e12 is longer than the 10000 days a run simulates",
        ),
        (
            GoodputConfig {
                days: 1e-6,
                ..small_config()
            },
            "is shorter than one 2 s step",
        ),
    ];
    for (config, expected) in cases {
        let error = simulate(&fleet, &config).expect_err(expected).to_string();
        assert!(error.contains(expected), "`{error}` lacks `{expected}`");
    }
    let unknown = parse_recovery("sometimes").unwrap_err();
    assert_eq!(
        unknown.to_string(),
        "unknown recovery policy `sometimes` (known: rollback, redundant, spare-cube)"
    );
    assert_eq!(parse_recovery("spare-cube"), Ok(RecoveryPolicy::SpareCube));
    assert!("soon".parse::<CheckpointInterval>().is_err());
    assert!("-3".parse::<CheckpointInterval>().is_err());
    assert!("rack".parse::<FailureUnit>().is_err());
    assert_eq!(
        "auto".parse::<CheckpointInterval>().unwrap(),
        CheckpointInterval::Auto
    );
}

/// A 1024-chip v4 pod of 16 cubes with `spares` spare cubes.
fn cube_fleet(spares: u32) -> Fleet {
    let text = format!(
        "Pod(name: \"v4-1024-cubes\", generation: \"v4\", shape: \"8x8x16\", \
         cubes: (spares: {spares}))"
    );
    Fleet::from_topology(&optirs_tpu::topology::parse_topology(&text, "t.ron").unwrap()).unwrap()
}

#[test]
fn spare_cube_swaps_in_the_reconfiguration_time_instead_of_restarting() {
    let fleet = cube_fleet(16);
    assert_eq!(fleet.spare_cubes, Some(16));
    let mut rollback = small_config();
    rollback.recovery = RecoveryPolicy::Rollback;
    let mut spare = rollback.clone();
    spare.recovery = RecoveryPolicy::SpareCube;
    let r = simulate(&fleet, &rollback).unwrap();
    let s = simulate(&fleet, &spare).unwrap();
    assert_eq!(r.restarts, s.restarts, "the same failures");
    // A failure every 3 h and 24 h repairs keep 8 cubes in repair on
    // average (Little's law); 16 spares almost always leave one free, so
    // nearly every failure skips the 600 s restart.
    assert_eq!(s.spare_swaps + s.spare_shortfalls, s.restarts);
    assert!(s.spare_swaps > s.restarts * 95 / 100, "{s:?}");
    let c = &s.costs;
    assert_eq!(
        c.spare_cube_seconds,
        c.detect_seconds + c.reconfigure_seconds + c.checkpoint_read_seconds
    );
    assert!(
        s.goodput > r.goodput + 0.02,
        "{} vs {}",
        s.goodput,
        r.goodput
    );
    assert!((accounted(&s) - s.simulated_seconds).abs() < 1e-6 * s.simulated_seconds);
    // A single spare out for repair for a month: the first failure takes
    // it, every later one waits for a whole restart.
    let mut slow = spare.clone();
    slow.cube_repair_hours = 24.0 * 30.0;
    let one = simulate(&cube_fleet(1), &slow).unwrap();
    assert_eq!(one.spare_swaps, 1);
    assert_eq!(one.spare_shortfalls, one.restarts - 1);
    assert!(one.goodput < s.goodput);
}

#[test]
fn spare_cube_without_spares_is_refused_before_any_work() {
    let mut config = small_config();
    config.recovery = RecoveryPolicy::SpareCube;
    for fleet in [small_fleet(), cube_fleet(0)] {
        let error = simulate(&fleet, &config).unwrap_err();
        assert!(matches!(error, GoodputError::NoSpareCube { .. }), "{error}");
        assert!(error.to_string().contains("needs spare cubes"), "{error}");
    }
    config.cube_repair_hours = 0.0;
    let error = simulate(&cube_fleet(1), &config).unwrap_err().to_string();
    assert!(error.contains("--cube-repair-hours"), "{error}");
}

// ---- Checkpoints that cost what they cost, synchronous and asynchronous ----

use optirs_tpu::goodput::{Costs, Exposure, Plan, Tally, simulate_failures};
use proptest::prelude::*;

/// Costs with round figures: 1 s steps, detection 1 s, restart 100 s, no
/// reconfiguration, a 2 s read; `write` s writes, and an asynchronous
/// `copy` s host copy when `copy` is given.
fn round_costs(write: f64, copy: Option<f64>) -> (Exposure, Costs) {
    let fleet = Fleet::blocks("round", 8, 4, TpuGeneration::V4).unwrap();
    let mut config = GoodputConfig::new(1_000_000, 1e6, 1.0, 1.0);
    config.restart_seconds = 100.0;
    config.reconfigure_seconds = 0.0;
    let mut costs = Costs::derive(&fleet, &config).unwrap();
    costs.detect_seconds = 1.0;
    costs.checkpoint_write_seconds = write;
    costs.checkpoint_read_seconds = 2.0;
    costs.rollback_seconds = 1.0 + 100.0 + 0.0 + 2.0;
    match copy {
        Some(copy) => {
            costs.host_copy_seconds = copy;
            costs.checkpoint_blocking_seconds = copy;
            costs.checkpoint_background_seconds = write;
        }
        None => {
            costs.checkpoint_blocking_seconds = write;
            costs.checkpoint_background_seconds = 0.0;
        }
    }
    (Exposure::new(&fleet, FailureUnit::Chip), costs)
}

fn plan(steps: u64, horizon: f64) -> Plan {
    Plan {
        steps_per_checkpoint: Some(steps),
        recovery: RecoveryPolicy::Rollback,
        horizon_seconds: horizon,
        seed: 0,
    }
}

fn tally_accounted(t: &Tally, costs: &Costs) -> f64 {
    t.steps_done as f64 * costs.step_seconds
        + t.replication_seconds
        + t.void_step_seconds
        + t.checkpoint_seconds
        + t.recovery_seconds
}

#[test]
fn without_failures_a_checkpoint_costs_its_wait_in_closed_form() {
    // 10 steps of 1 s between checkpoints, 100 whole cycles.
    let (n, cycles) = (10u64, 100u64);
    // Synchronous, a 0.5 s write: cycles of 10.5 s.
    let (exposure, costs) = round_costs(0.5, None);
    let t = simulate_failures(&exposure, &costs, plan(n, cycles as f64 * 10.5), []);
    assert_eq!(t.steps_done, n * cycles);
    assert_eq!(t.checkpoints, cycles);
    assert!((t.goodput(1.0) - 10.0 / 10.5).abs() < 1e-12);
    // Asynchronous, a 0.25 s copy and a 4 s write that the 10 s of steps
    // hide: cycles of 10.25 s, no wait.
    let (exposure, costs) = round_costs(4.0, Some(0.25));
    let t = simulate_failures(&exposure, &costs, plan(n, cycles as f64 * 10.25), []);
    assert_eq!(t.steps_done, n * cycles);
    assert!((t.goodput(1.0) - 10.0 / 10.25).abs() < 1e-12);
    assert_eq!(t.checkpoint_wait_seconds, 0.0);
    // The last write is still in flight at the end: 99 finished.
    assert_eq!(t.checkpoints, cycles - 1);
    // A 20 s write outlasts the 10 s of steps: each snapshot waits 10 s
    // for the previous write, cycles of 20.25 s.
    let (exposure, costs) = round_costs(20.0, Some(0.25));
    let horizon = 0.25 + cycles as f64 * 20.25 - 10.0;
    let t = simulate_failures(&exposure, &costs, plan(n, horizon), []);
    assert_eq!(t.steps_done, n * cycles);
    assert!(
        (t.checkpoint_wait_seconds - 10.0 * (cycles - 1) as f64).abs() < 1e-9,
        "{t:?}"
    );
    assert!((tally_accounted(&t, &costs) - horizon).abs() < 1e-9);
}

#[test]
fn a_failure_during_the_background_write_rolls_back_to_the_checkpoint_before() {
    // 10 steps, a 0.25 s copy (snapshot at 10.25 s), a 4 s write that
    // finishes at 14.25 s.
    let (exposure, costs) = round_costs(4.0, Some(0.25));
    // Training resumes at 114 s after the failure at 13 s; 80 cycles of
    // 10.25 s follow, so the run ends on a cycle's end.
    let horizon = 114.0 + 80.0 * 10.25;
    // At 13 s the write is in flight: the rollback goes to the start,
    // losing the 10 steps before the snapshot and the 2 after it, and
    // there is nothing to read.
    let cut = simulate_failures(&exposure, &costs, plan(10, horizon), [(13.0, 0)]);
    assert_eq!(cut.lost_steps, 12);
    assert_eq!(cut.writes_cut, 1);
    assert_eq!(cut.void_step_seconds, 0.75);
    assert_eq!(cut.recovery_seconds, 101.0, "detect + restart, no read");
    // At 15 s it has finished: 4 steps since the snapshot are lost, and
    // the checkpoint is read back.
    let done = simulate_failures(&exposure, &costs, plan(10, horizon), [(15.0, 0)]);
    assert_eq!(done.lost_steps, 4);
    assert_eq!(done.writes_cut, 0);
    assert_eq!(done.recovery_seconds, 103.0, "detect + restart + read");
    // Synchronous, the same 4 s write: training waits for it, and a
    // failure at 13 s cuts it off with 3 s spent.
    let (exposure, sync_costs) = round_costs(4.0, None);
    let sync = simulate_failures(&exposure, &sync_costs, plan(10, horizon), [(13.0, 0)]);
    assert_eq!(sync.lost_steps, 10);
    for (t, c) in [(&cut, &costs), (&done, &costs), (&sync, &sync_costs)] {
        assert!((tally_accounted(t, c) - horizon).abs() < 1e-9, "{t:?}");
    }
}

#[test]
fn async_checkpoints_cost_the_host_copy_and_raise_goodput() {
    // Gemini's inputs (see above): a 150 s write of 12 TB at 80 GB/s.
    let fleet = Fleet::blocks("gemini-2x4096", 8192, 4, TpuGeneration::V4).unwrap();
    let mtbf_hours = 54.0 * 24.0 / 419.0 * 16_384.0;
    let mut config = GoodputConfig::new(1_000_000_000_000, mtbf_hours, 54.0, 10.0);
    config.storage_bytes_per_s = Some(8e10);
    config.seed = 2023;
    config.checkpoint = CheckpointInterval::Every(1800.0);
    let sync = simulate(&fleet, &config).unwrap();
    config.async_checkpoint = true;
    let asynchronous = simulate(&fleet, &config).unwrap();
    let c = &asynchronous.costs;
    let copy = 12e12 / (8192.0 * TpuGeneration::V4.spec().host_link_bytes_per_s);
    assert!((c.host_copy_seconds - copy).abs() < 1e-9 * copy);
    assert_eq!(c.checkpoint_blocking_seconds, c.host_copy_seconds);
    assert_eq!(c.checkpoint_background_seconds, 150.0);
    assert_eq!(sync.costs.checkpoint_blocking_seconds, 150.0);
    assert!(
        asynchronous.goodput > sync.goodput + 0.02,
        "{} vs {}",
        asynchronous.goodput,
        sync.goodput
    );
    assert!(asynchronous.checkpoint_writes_cut > 0, "{asynchronous:?}");
    for r in [&sync, &asynchronous] {
        assert!((accounted(r) - r.simulated_seconds).abs() < 1e-6 * r.simulated_seconds);
    }
}

#[test]
fn the_checkpoint_cost_is_the_shared_one() {
    let fleet = small_fleet();
    let config = small_config();
    let r = simulate(&fleet, &config).unwrap();
    let bytes = 1e9 * 12.0;
    assert_eq!(
        r.costs.checkpoint_write_seconds,
        optirs_tpu::hardware::checkpoint_io_seconds(bytes, fleet.hosts)
    );
    assert_eq!(
        r.costs.checkpoint_read_seconds,
        r.costs.checkpoint_write_seconds
    );
}

#[test]
fn auto_is_never_worse_than_never_on_a_run_shorter_than_a_restart() {
    // 8.64 s of 1 s steps with a 6 s checkpoint (12 GB over v5e-16's 2 hosts).
    let fleet = Fleet::from_topology(&load_preset("v5e-16").unwrap()).unwrap();
    let mut config = GoodputConfig::new(1_000_000_000, 1000.0, 0.0001, 1.0);
    let auto = simulate(&fleet, &config).unwrap();
    config.checkpoint = CheckpointInterval::Never;
    let never = simulate(&fleet, &config).unwrap();
    assert_eq!(auto.checkpoint_interval_steps, None);
    assert_eq!(auto.goodput, never.goodput);
    let search = auto.search.unwrap();
    assert_eq!(search.goodput, search.never_goodput);
}

fn policy() -> impl Strategy<Value = RecoveryPolicy> {
    prop_oneof![
        Just(RecoveryPolicy::Rollback),
        Just(RecoveryPolicy::Redundant),
        Just(RecoveryPolicy::SpareCube),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Whatever the inputs: goodput in [0, 1], every simulated second
    /// accounted once, and each recovery's parts adding up to it.
    #[test]
    fn goodput_is_a_share_and_every_second_is_accounted(
        chips_log in 2u32..10,
        pod_mtbf_hours in 0.2f64..500.0,
        days in 0.01f64..20.0,
        step in 0.05f64..30.0,
        interval in prop::option::of(1.0f64..20_000.0),
        recovery in policy(),
        asynchronous in any::<bool>(),
        params_log in 6u32..12,
        restart in 0.0f64..2000.0,
        seed in 0u64..1000,
    ) {
        let chips = 1u32 << chips_log;
        let mut fleet = Fleet::blocks("p", chips, 4, TpuGeneration::V4).unwrap();
        fleet.spare_cubes = Some(2);
        let mut config = GoodputConfig::new(
            10u64.pow(params_log),
            pod_mtbf_hours * f64::from(chips),
            days,
            step,
        );
        prop_assume!(days * 86_400.0 >= step);
        config.checkpoint = interval.map_or(CheckpointInterval::Never, CheckpointInterval::Every);
        config.recovery = recovery;
        config.async_checkpoint = asynchronous;
        config.restart_seconds = restart;
        config.seed = seed;
        let r = simulate(&fleet, &config).unwrap();
        prop_assert!((0.0..=1.0).contains(&r.goodput), "{}", r.goodput);
        let total = accounted(&r);
        prop_assert!(
            (total - r.simulated_seconds).abs() <= 1e-9 * r.simulated_seconds,
            "{} accounted of {}", total, r.simulated_seconds
        );
        prop_assert!(r.checkpoint_wait_seconds <= r.checkpoint_seconds);
        prop_assert!(r.lost_steps == 0 || recovery != RecoveryPolicy::Redundant || r.fallbacks_to_checkpoint > 0);
        let c = &r.costs;
        for (policy, downtime) in [
            (RecoveryPolicy::Rollback, c.rollback_seconds),
            (RecoveryPolicy::Redundant, c.redundant_seconds),
            (RecoveryPolicy::SpareCube, c.spare_cube_seconds),
        ] {
            let parts = c.recovery_parts(policy, true);
            let sum = parts.iter().fold(0.0, |s, p| s + p.1);
            prop_assert_eq!(sum, downtime, "{:?}", parts);
        }
        let blocking = if asynchronous { c.host_copy_seconds } else { c.checkpoint_write_seconds };
        prop_assert_eq!(c.checkpoint_blocking_seconds, blocking);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]

    /// `auto` is never worse than `never` on the search's replicates.
    #[test]
    fn auto_is_never_worse_than_never(
        pod_mtbf_hours in 0.5f64..200.0,
        days in 0.0001f64..3.0,
        step in 0.5f64..20.0,
        asynchronous in any::<bool>(),
        seed in 0u64..100,
    ) {
        let fleet = Fleet::blocks("p", 64, 4, TpuGeneration::V4).unwrap();
        let mut config = GoodputConfig::new(1_000_000_000, pod_mtbf_hours * 64.0, days, step);
        prop_assume!(days * 86_400.0 >= step);
        config.async_checkpoint = asynchronous;
        config.seed = seed;
        let r = simulate(&fleet, &config).unwrap();
        let search = r.search.unwrap();
        prop_assert!(search.goodput >= search.never_goodput, "{:?}", search);
        prop_assert!((0.0..=1.0).contains(&r.goodput));
    }
}

#[test]
fn the_default_step_under_redundant_recovery_pays_for_its_copies() {
    use optirs_tpu::goodput::modeled_step_seconds;
    let pod = optirs_tpu::topology::load_topology("v5e-16").unwrap();
    let rollback = modeled_step_seconds(&pod, 1_000_000_000, 2, RecoveryPolicy::Rollback).unwrap();
    let spare = modeled_step_seconds(&pod, 1_000_000_000, 2, RecoveryPolicy::SpareCube).unwrap();
    let redundant =
        modeled_step_seconds(&pod, 1_000_000_000, 2, RecoveryPolicy::Redundant).unwrap();
    // The same figures `train --modeled-only` reports for the same policy.
    let tensors = vec![("param0".to_string(), vec![1_000_000_000usize])];
    let step = |recovery| {
        optirs_tpu::cost_model::modeled_step_with_recovery(
            &pod,
            &tensors,
            optirs_tpu::ir::DType::F32,
            2,
            optirs_tpu::sharding::DEFAULT_BUCKET_BYTES,
            recovery,
        )
        .unwrap()
        .timeline
        .step_seconds
    };
    assert_eq!(rollback, spare);
    // The closed form jumps over its 150 equal buckets once they repeat:
    // the bucket-by-bucket schedule's figure to rounding.
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b;
    assert!(close(rollback, step(RecoveryPolicy::Rollback)));
    assert!(close(redundant, step(RecoveryPolicy::Redundant)));
    assert!(redundant > rollback, "{redundant} s vs {rollback} s");
}
