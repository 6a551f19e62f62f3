//! The step model against MaxText's published runs
//! ([`crate::model::maxtext_published`]): every row with a bundled config,
//! modeled on its pod (slices of the published slice type over DCN) with
//! its table's FLOP formula, beside the published TFLOP/s/chip.

use serde::Serialize;

use super::{ModelStepOptions, StepModelError, model_step};
use crate::model::{Published, PublishedRow};
use crate::sharding::Strategy;
use crate::topology::{Topology, parse_topology};

/// One row: published and modeled.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ValidationRow {
    /// The table's id.
    pub table: String,
    /// The model as labeled.
    pub model: String,
    /// The slice type as printed.
    pub accelerator: String,
    /// Slices.
    pub slices: u32,
    /// Chips.
    pub chips: u64,
    /// Published TFLOP/s per chip.
    pub published_tflops: f64,
    /// Modeled TFLOP/s per chip.
    pub modeled_tflops: f64,
    /// `modeled / published − 1`.
    pub error: f64,
    /// The modeled step, seconds.
    pub step_seconds: f64,
    /// Of it, exposed communication, seconds.
    pub exposed_communication: f64,
    /// Whether the row is one a constant was fitted on.
    pub fitted: bool,
}

/// The torus of one slice of `chips` chips as MaxText's runs had it
/// (`v5e-256` is 16x16; a v5p slice of `n` chips its cube-built shape).
pub fn slice_shape(generation: &str, chips: u64) -> Option<&'static str> {
    Some(match (generation, chips) {
        ("v5e", 256) => "16x16",
        ("v5p", 64) => "4x4x4",
        ("v5p", 128) => "4x4x8",
        ("v5p", 256) => "4x8x8",
        ("v5p", 512) => "8x8x8",
        ("v5p", 1024) => "8x8x16",
        ("v5p", 2048) => "8x16x16",
        ("v5p", 4096) => "16x16x16",
        _ => return None,
    })
}

/// The pod of `row`: its slices over DCN.
pub fn pod_of(row: &PublishedRow) -> Result<Topology, StepModelError> {
    let per_slice = row.chips / u64::from(row.slices.max(1));
    let shape = slice_shape(&row.generation, per_slice).ok_or_else(|| StepModelError::Field {
        field: "accelerator",
        value: row.accelerator.clone(),
        problem: format!(
            "no slice shape known for {per_slice} {} chips",
            row.generation
        ),
    })?;
    let text = format!(
        "Pod(name: \"{}x{}\", generation: \"{}\", shape: \"{shape}\", slices: {})",
        row.slices, row.accelerator, row.generation, row.slices
    );
    let text = if row.slices == 1 {
        format!(
            "Pod(name: \"{}\", generation: \"{}\", shape: \"{shape}\")",
            row.accelerator, row.generation
        )
    } else {
        text
    };
    parse_topology(&text, &row.accelerator).map_err(|e| StepModelError::Field {
        field: "accelerator",
        value: row.accelerator.clone(),
        problem: e.to_string(),
    })
}

/// Whether `row` is one a calibration constant was fitted on (the v5p
/// README repeats the configs table's fitted run).
pub fn is_fitted(row: &PublishedRow) -> bool {
    matches!(
        (
            row.table.as_str(),
            row.model.as_str(),
            row.accelerator.as_str(),
            row.slices
        ),
        ("v5e", "16B", "v5e-256", 1) | ("v5p-configs" | "v5p-readme", "32B", "v5p-128", 1)
    )
}

/// Every row of `published` with a bundled config, modeled (fsdp on the
/// default mesh: fsdp inside each slice, data across the slices, as
/// MaxText's scripts run them).
pub fn validate(published: &Published) -> Result<Vec<ValidationRow>, StepModelError> {
    let mut rows = Vec::new();
    for row in &published.rows {
        let Some(mut config) = row.model_config()? else {
            continue;
        };
        if let Some(batch) = row.per_device_batch {
            config.per_device_batch = batch;
        }
        let table = published
            .table_of(row)
            .ok_or_else(|| StepModelError::Field {
                field: "table",
                value: row.table.clone(),
                problem: "no such table".into(),
            })?;
        let topology = pod_of(row)?;
        let options = ModelStepOptions {
            strategy: Strategy::Fsdp,
            formula: table.formula,
            ..ModelStepOptions::new(&topology)
        };
        let step = model_step(&config, &topology, &options)?;
        rows.push(ValidationRow {
            table: row.table.clone(),
            model: row.model.clone(),
            accelerator: row.accelerator.clone(),
            slices: row.slices,
            chips: row.chips,
            published_tflops: row.tflops_per_chip,
            modeled_tflops: step.tflops_per_chip,
            error: step.tflops_per_chip / row.tflops_per_chip - 1.0,
            step_seconds: step.step_seconds,
            exposed_communication: step.exposed_communication,
            fitted: is_fitted(row),
        });
    }
    Ok(rows)
}
