//! The step model against published training recipes it was not fitted
//! to (`docs/validation.md`, "Recipes"): `cargo test --release --test
//! recipes -- --nocapture` prints the table.

use optirs_tpu::step_model::recipes::{fitted_efficiency, recipes, validate_recipes};

#[test]
fn every_recipe_is_predicted() {
    let recipes = recipes().unwrap();
    let rows = validate_recipes(&recipes).unwrap();
    println!(
        "| id | model | pod | chips | mesh | published tokens/s/chip | modeled | error | step s | exposed s | HBM left GB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {:.0} | {:.0} | {:+.1}%{}{}{} | {:.3} | {:.3} | {:.1} |",
            r.id,
            r.model,
            r.pod,
            r.chips,
            r.mesh,
            r.published,
            r.modeled,
            r.error * 100.0,
            if r.fitted { " (fitted)" } else { "" },
            if r.calibrated { "" } else { " (uncalibrated)" },
            if r.gap.is_some() { " (known gap)" } else { "" },
            r.step_seconds,
            r.exposed_communication,
            r.hbm_margin as f64 / 1e9,
        );
    }
    for row in recipes.rows.iter().filter(|r| r.fitted) {
        println!(
            "{}: fitted MXU efficiency {:.4}",
            row.id,
            fitted_efficiency(row).unwrap()
        );
    }
    for r in rows.iter().filter(|r| !r.calibrated) {
        let (low, high) = r.modeled_range.unwrap();
        println!(
            "{} (uncalibrated): published {:.0} tokens/s/chip, the fitted constants give {:.0} to {:.0}",
            r.id, r.published, low, high
        );
        assert!(low <= r.published && r.published <= high, "{}", r.id);
        assert!(r.error.abs() <= 0.07, "{}: {}", r.id, r.error);
    }
    // A row with a known gap is reported above, not held to the bounds.
    for r in rows.iter().filter(|r| r.gap.is_some()) {
        println!(
            "{} (known gap, {:+.1}%): {}",
            r.id,
            r.error * 100.0,
            r.gap.as_deref().unwrap_or("")
        );
    }
    let predicted: Vec<f64> = rows
        .iter()
        .filter(|r| !r.fitted && r.calibrated && r.gap.is_none())
        .map(|r| r.error.abs())
        .collect();
    let mae = predicted.iter().sum::<f64>() / predicted.len() as f64;
    let worst = predicted.iter().cloned().fold(0.0, f64::max);
    println!(
        "predicted rows: {}, mean absolute error {:.2}%, worst {:.2}%",
        predicted.len(),
        mae * 100.0,
        worst * 100.0
    );
    // Every run ran: each fits its chips.
    for r in &rows {
        assert!(r.hbm_margin >= 0, "{} does not fit: {}", r.id, r.hbm_margin);
        // An uncalibrated generation's rows report the fitted range.
        assert_eq!(r.calibrated, r.modeled_range.is_none(), "{}", r.id);
    }
    // The fitted row is the constant's definition.
    for r in rows.iter().filter(|r| r.fitted) {
        assert!(r.error.abs() < 5e-4, "{}: {}", r.id, r.error);
    }
    let single: Vec<f64> = rows
        .iter()
        .filter(|r| !r.fitted && r.calibrated && r.gap.is_none() && r.pod.ends_with("x1"))
        .map(|r| r.error.abs())
        .collect();
    let single_mae = single.iter().sum::<f64>() / single.len() as f64;
    let single_worst = single.iter().cloned().fold(0.0, f64::max);
    println!(
        "one-slice rows: {}, mean absolute error {:.2}%, worst {:.2}%",
        single.len(),
        single_mae * 100.0,
        single_worst * 100.0
    );
    // The measured accuracy (docs/validation.md), held so it cannot slip.
    assert!(
        single_mae <= 0.07,
        "one-slice mean absolute error {single_mae}"
    );
    assert!(single_worst <= 0.162, "one-slice worst {single_worst}");
    assert!(mae <= 0.08, "mean absolute error {mae}");
    assert!(worst <= 0.21, "worst {worst}");
}

/// Each constant is its fitted row's: refitting it gives it back.
#[test]
fn each_recipe_constant_is_its_fitted_row() {
    use optirs_tpu::step_model::calibration::{TPU7X_MXU_EFFICIENCY, V6E_MXU_EFFICIENCY};
    let recipes = recipes().unwrap();
    let fitted: Vec<_> = recipes.rows.iter().filter(|r| r.fitted).collect();
    assert_eq!(fitted.len(), 2);
    for row in fitted {
        let constant = match row.generation.as_str() {
            "v6e" => V6E_MXU_EFFICIENCY,
            "tpu7x" => TPU7X_MXU_EFFICIENCY,
            other => panic!("no constant is fitted on {other}"),
        };
        let refit = fitted_efficiency(row).unwrap();
        println!("{}: fitted MXU efficiency {refit:.4}", row.id);
        assert!((refit - constant).abs() < 1e-4, "{}: {refit}", row.id);
    }
}

/// A dropless mixture with more experts than any dropless run held to the
/// bounds carries the known-gap runs' measured errors; the validated kinds
/// carry none.
#[test]
fn a_step_beyond_the_validated_mixtures_carries_the_runs_it_misses() {
    use optirs_tpu::model::bundled;
    use optirs_tpu::step_model::known_gap;
    let recipes = recipes().unwrap();
    let rows = validate_recipes(&recipes).unwrap();
    let gap = known_gap(&bundled("deepseek3-671b").unwrap())
        .unwrap()
        .expect("256 experts dropless is beyond the validated runs");
    assert_eq!(gap.validated_experts, 16, "Scout's 16 experts (P4)");
    let ids: Vec<&str> = gap.runs.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["P3", "P5", "I9", "I9f"]);
    for run in &gap.runs {
        let row = rows.iter().find(|r| r.id == run.id).unwrap();
        assert!(row.gap.is_some(), "{}", run.id);
        // The same figure the validation table reports.
        assert_eq!(run.published_over_modeled, 1.0 + row.error, "{}", run.id);
        assert!(
            run.published_over_modeled > 1.0,
            "{}: the model is fast",
            run.id
        );
    }
    let (lo, hi) = gap.range();
    assert!(lo <= hi && lo > 1.0);
    let line = gap.line();
    assert!(
        line.contains("256 experts") && line.contains("lower bound"),
        "{line}"
    );
    // The validated kinds: dense, dropping (Mixtral) and Scout's 16 experts.
    for name in ["llama2-7b", "mixtral-8x7b", "llama4-17b-16e"] {
        assert_eq!(known_gap(&bundled(name).unwrap()).unwrap(), None, "{name}");
    }
    // One expert past the validated ones is beyond them; dropping is not.
    let mut config = bundled("llama4-17b-16e").unwrap();
    let mut moe = config.moe.unwrap();
    moe.num_experts = 17;
    config.moe = Some(moe);
    assert!(known_gap(&config).unwrap().is_some());
    moe.capacity_factor = Some(1.25);
    config.moe = Some(moe);
    assert_eq!(known_gap(&config).unwrap(), None);
}
