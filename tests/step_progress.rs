//! A host can watch a step in flight: the gradients' reduction chunk by
//! chunk, then the step's simulated time tick by tick, each from 0 to 1.

use ndarray::{ArrayD, IxDyn};
use optirs_tpu::Pod;
use optirs_tpu::optimizers::Adam;
use optirs_tpu::sharding::ParamSet;
use optirs_tpu::topology::load_preset;
use optirs_tpu::tpu::{ShardedOptimizer, ShardingConfig};
use optirs_tpu::training::{RunPlan, StepPart, run_steps};
use std::sync::{Arc, Mutex};

#[test]
fn each_step_reports_its_gradients_then_its_flight_in_order() {
    let pod = Pod::from_topology(load_preset("v4-16").unwrap()).unwrap();
    let params = ParamSet::new()
        .with("w", ArrayD::from_elem(IxDyn(&[3000]), 0.5f32))
        .unwrap()
        .with("b", ArrayD::from_elem(IxDyn(&[500]), 0.1f32))
        .unwrap();
    let sharding = ShardingConfig {
        bucket_bytes: 4096,
        ..ShardingConfig::default()
    };
    let mut opt = ShardedOptimizer::on_pod(Adam::new(1e-3f32), pod, params, sharding).unwrap();
    let seen: Arc<Mutex<Vec<(StepPart, f64)>>> = Arc::default();
    let log = seen.clone();
    opt.on_step_progress(Some(Box::new(move |part, fraction| {
        log.lock().unwrap().push((part, fraction));
    })));
    let plan = RunPlan {
        steps: 2,
        seed: 1,
        kills: Vec::new(),
        optimizer: "adam".into(),
    };
    let mut steps_seen = Vec::new();
    run_steps(&mut opt, &plan, &|| false, &mut |done| {
        steps_seen.push(done)
    })
    .unwrap();
    assert_eq!(steps_seen, vec![1, 2]);
    let seen = seen.lock().unwrap().clone();
    // Two steps, each its gradients (rising to 1) and then its flight.
    let starts: Vec<usize> = (0..seen.len())
        .filter(|&i| {
            seen[i].0 == StepPart::Gradients && (i == 0 || seen[i - 1].0 == StepPart::InFlight)
        })
        .collect();
    assert_eq!(starts.len(), 2, "{seen:?}");
    for (k, &start) in starts.iter().enumerate() {
        let end = starts.get(k + 1).copied().unwrap_or(seen.len());
        let step = &seen[start..end];
        let gradients: Vec<f64> = step
            .iter()
            .filter(|p| p.0 == StepPart::Gradients)
            .map(|p| p.1)
            .collect();
        let flight: Vec<f64> = step
            .iter()
            .filter(|p| p.0 == StepPart::InFlight)
            .map(|p| p.1)
            .collect();
        assert!(gradients.len() > 1, "chunk by chunk: {gradients:?}");
        assert_eq!(gradients.last(), Some(&1.0), "{gradients:?}");
        assert!(!flight.is_empty(), "{step:?}");
        assert!(flight.windows(2).all(|w| w[0] <= w[1]), "{flight:?}");
        assert!(flight.iter().all(|f| (0.0..=1.0).contains(f)), "{flight:?}");
        // Idle stretches are jumped over; the step ends at its end.
        assert_eq!(flight.last(), Some(&1.0), "{flight:?}");
    }
    // Telling stops when asked.
    opt.on_step_progress(None);
    let before = seen.len();
    let plan = RunPlan { steps: 3, ..plan };
    run_steps(&mut opt, &plan, &|| false, &mut |_| {}).unwrap();
    assert_eq!(before, seen.len());
}
