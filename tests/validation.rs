//! The step model against every row of MaxText's published v5e and v5p
//! tables (`docs/validation.md`): `cargo test --release --test validation
//! -- --nocapture` prints the table.

use optirs_tpu::model::maxtext_published;
use optirs_tpu::step_model::validation::validate;

#[test]
fn every_published_row_is_predicted() {
    let published = maxtext_published().unwrap();
    let rows = validate(&published).unwrap();
    println!(
        "| table | model | slice | slices | chips | published TFLOP/s/chip | modeled | error | step s | exposed s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {:.0} | {:.1} | {:+.1}%{} | {:.2} | {:.3} |",
            r.table,
            r.model,
            r.accelerator,
            r.slices,
            r.chips,
            r.published_tflops,
            r.modeled_tflops,
            r.error * 100.0,
            if r.fitted { " (fitted)" } else { "" },
            r.step_seconds,
            r.exposed_communication
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
    // Every row with a bundled config is modeled, the fitted ones exactly.
    assert_eq!(rows.len(), 48);
    assert_eq!(rows.iter().filter(|r| r.fitted).count(), 3);
    for r in rows.iter().filter(|r| r.fitted) {
        assert!(r.error.abs() < 0.005, "{r:?}");
    }
    // The figures docs/validation.md gives (a change to the model that
    // moves them must update the doc).
    assert!(mae < 0.09, "mean absolute error {mae}");
    assert!(
        single_mae < 0.08,
        "one-slice mean absolute error {single_mae}"
    );
    assert!(worst < 0.32, "worst {worst}");
}
