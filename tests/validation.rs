//! The step model against every row of MaxText's published v5e and v5p
//! tables (`docs/validation.md`): `cargo test --release --test validation
//! -- --nocapture` prints the table.

use optirs_tpu::cost_model::DataReduction;
use optirs_tpu::model::maxtext_published;
use optirs_tpu::step_model::validation::{ValidationRow, validate, validate_with};

#[test]
fn every_published_row_is_predicted() {
    let published = maxtext_published().unwrap();
    let rows = validate(&published).unwrap();
    println!(
        "| table | model | slice | slices | chips | mesh | published TFLOP/s/chip | modeled | error | step s | exposed s | DCN s | HBM GB (margin) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {}{} | {:.0} | {:.1} | {:+.1}%{} | {:.2} | {:.3} | {:.3} | {:.1} ({:.1}) |",
            r.table,
            r.model,
            r.accelerator,
            r.slices,
            r.chips,
            r.mesh,
            if r.mesh_note.is_some() { " ¹" } else { "" },
            r.published_tflops,
            r.modeled_tflops,
            r.error * 100.0,
            if r.fitted { " (fitted)" } else { "" },
            r.step_seconds,
            r.exposed_communication,
            r.dcn_seconds,
            r.hbm_bytes as f64 / 1e9,
            r.hbm_margin as f64 / 1e9
        );
    }
    for r in rows.iter().filter(|r| r.mesh_note.is_some()) {
        println!(
            "¹ {} {} {} x{}: {}",
            r.table,
            r.model,
            r.accelerator,
            r.slices,
            r.mesh_note.as_deref().unwrap_or("")
        );
    }
    let predicted: Vec<f64> = rows
        .iter()
        .filter(|r| !r.fitted)
        .map(|r| r.error.abs())
        .collect();
    let mae = predicted.iter().sum::<f64>() / predicted.len() as f64;
    let worst = predicted.iter().cloned().fold(0.0, f64::max);
    let single: Vec<f64> = rows
        .iter()
        .filter(|r| !r.fitted && r.slices == 1)
        .map(|r| r.error.abs())
        .collect();
    let single_mae = single.iter().sum::<f64>() / single.len() as f64;
    println!(
        "predicted rows: {}, mean absolute error {:.2}%, worst {:.2}%; one-slice rows: {}, \
         mean absolute error {:.2}%",
        predicted.len(),
        mae * 100.0,
        worst * 100.0,
        single.len(),
        single_mae * 100.0
    );
    // The choice docs/validation.md rests the DCN model on: with the
    // all-reduce over data behind the backward, the multislice rows miss by
    // more than with it after the backward.
    let overlapped = validate_with(&published, DataReduction::Overlapped).unwrap();
    let multislice_mae = |rows: &[ValidationRow]| {
        let m: Vec<f64> = rows
            .iter()
            .filter(|r| r.slices > 1)
            .map(|r| r.error.abs())
            .collect();
        m.iter().sum::<f64>() / m.len() as f64
    };
    let (after, behind) = (multislice_mae(&rows), multislice_mae(&overlapped));
    println!(
        "multislice rows: mean absolute error {:.2}% with the all-reduce over data after the \
         backward, {:.2}% with it behind the backward",
        after * 100.0,
        behind * 100.0
    );
    assert!(after < behind - 0.02, "{after} vs {behind}");
    let within = predicted.iter().filter(|e| **e <= 0.10).count();
    println!("rows within 10%: {within} of {}", predicted.len());
    // Every row with a bundled config is modeled, the fitted ones exactly.
    assert_eq!(rows.len(), 48);
    assert_eq!(rows.iter().filter(|r| r.fitted).count(), 3);
    for r in rows.iter().filter(|r| r.fitted) {
        assert!(r.error.abs() < 0.005, "{r:?}");
    }
    // The figures docs/validation.md gives (a change to the model that
    // moves them must update the doc).
    assert!(mae < 0.065, "mean absolute error {mae}");
    assert!(
        single_mae < 0.06,
        "one-slice mean absolute error {single_mae}"
    );
    assert!(worst < 0.23, "worst {worst}");
    assert!(within >= 36, "{within} rows within 10%");
    // Every published run ran, so the HBM account fits every one.
    let tightest = rows.iter().min_by_key(|r| r.hbm_margin).unwrap();
    println!(
        "HBM: every row fits; the tightest is {} {} on {} x{}, {:.1} GB of {:.1} GB ({:.1} GB left)",
        tightest.table,
        tightest.model,
        tightest.accelerator,
        tightest.slices,
        tightest.hbm_bytes as f64 / 1e9,
        tightest.hbm_capacity as f64 / 1e9,
        tightest.hbm_margin as f64 / 1e9
    );
    for r in &rows {
        assert!(
            r.hbm_margin >= 0,
            "{} {} on {} x{} ran, but is modeled at {} B of {} B",
            r.table,
            r.model,
            r.accelerator,
            r.slices,
            r.hbm_bytes,
            r.hbm_capacity
        );
    }
}

/// Each table constant is its fitted row's: refitting it (bisection on
/// the MXU efficiency until the modeled TFLOP/s/chip is the published
/// one) gives it back, so a change to the model cannot leave a stale
/// constant behind.
#[test]
fn each_table_constant_is_its_fitted_row() {
    use optirs_tpu::sharding::Strategy;
    use optirs_tpu::step_model::calibration::{V5E_MXU_EFFICIENCY, V5P_MXU_EFFICIENCY};
    use optirs_tpu::step_model::validation::{is_fitted, mesh_of, pod_of};
    use optirs_tpu::step_model::{ModelStepOptions, model_step};
    let published = maxtext_published().unwrap();
    let fitted: Vec<_> = published.rows.iter().filter(|r| is_fitted(r)).collect();
    assert_eq!(fitted.len(), 3);
    for row in fitted {
        let mut config = row.model_config().unwrap().unwrap();
        if let Some(batch) = row.per_device_batch {
            config.per_device_batch = batch;
        }
        let formula = published.table_of(row).unwrap().formula;
        let topology = pod_of(row).unwrap();
        let (mesh, _) = mesh_of(row, &topology).unwrap();
        let (mut low, mut high) = (0.05f64, 1.0f64);
        for _ in 0..40 {
            let mid = 0.5 * (low + high);
            let options = ModelStepOptions {
                strategy: Strategy::Fsdp,
                mesh: mesh.clone(),
                formula,
                efficiency: Some(mid),
                ..ModelStepOptions::new(&topology)
            };
            let step = model_step(&config, &topology, &options).unwrap();
            if step.tflops_per_chip > row.tflops_per_chip {
                high = mid;
            } else {
                low = mid;
            }
        }
        let refit = 0.5 * (low + high);
        let constant = if row.table == "v5e" {
            V5E_MXU_EFFICIENCY
        } else {
            V5P_MXU_EFFICIENCY
        };
        println!(
            "{} {}: fitted MXU efficiency {refit:.4}",
            row.table, row.model
        );
        assert!(
            (refit - constant).abs() < 1e-4,
            "{} {}: {refit}",
            row.table,
            row.model
        );
    }
}

/// What stages over the DCN would have given the v5e runs at 32 slices
/// (`docs/validation.md`): the run's model, batch and tensor axis with the
/// slices shared between data and stage, at the best microbatches and
/// repeats that fit.
#[test]
fn stages_over_the_dcn_for_the_v5e_32_slice_rows() {
    use optirs_tpu::step_model::stages_over_dcn::stages_over_dcn;
    let published = optirs_tpu::model::maxtext_published().unwrap();
    let rows = stages_over_dcn(&published, 32).unwrap();
    println!(
        "| model | published TFLOP/s/chip | data=32 over DCN | best with stages over DCN | microbatches | repeats | bubble | permutes s | TFLOP/s/chip | vs data |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let v5e: Vec<_> = rows.iter().filter(|r| r.table == "v5e").collect();
    assert_eq!(v5e.len(), 4, "the four v5e 32-slice rows");
    for r in &v5e {
        let b = r.best.as_ref().expect("a staged layout that fits");
        println!(
            "| {} | {:.0} | {:.1} | {} | {} | {} | {:.1} % | {:.3} | {:.1} | {:+.1} % |",
            r.model,
            r.published_tflops,
            r.data_tflops,
            b.mesh,
            b.microbatches,
            b.repeats,
            b.bubble_fraction * 100.0,
            b.permute_seconds,
            b.tflops,
            (b.tflops / r.data_tflops - 1.0) * 100.0
        );
        // The bubble is the closed form's, and the stages cost it: with
        // the all-reduce over DCN as small as these models make it, no
        // staged layout beats data over the slices.
        let p = b
            .mesh
            .split(',')
            .find_map(|e| e.strip_prefix("stage="))
            .unwrap();
        let p: f64 = p.parse().unwrap();
        let closed = (p - 1.0) / (b.repeats as f64 * b.microbatches as f64 + p - 1.0);
        assert!((b.bubble_fraction - closed).abs() < 1e-12);
        assert!(b.tflops <= r.data_tflops * 1.001, "{} {b:?}", r.model);
    }
}
