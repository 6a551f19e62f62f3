//! MaxText's published training throughput as data: every row of the v5e
//! table and of both v5p tables, with the file and commit each comes from
//! (`assets/validation/maxtext.ron`, embedded).
//!
//! A row gives TFLOP/s per chip and MFU; no table gives a step time. What
//! a row implies is the step time [`implied_step_seconds`]: MaxText's FLOP
//! count of the row's model under the row's formula, divided by the
//! published TFLOP/s. The step model's prediction is compared with that.

use serde::{Deserialize, Serialize};

use super::config::{ModelConfig, parse_ron};
use super::error::ModelError;
use super::flops::{FlopFormula, training_flops_per_device};
use crate::hardware::TpuGeneration;

/// The embedded table text.
pub const MAXTEXT_PUBLISHED_RON: &str = include_str!("../../assets/validation/maxtext.ron");

/// One published table: where it is and which FLOP formula its runs used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishedTable {
    /// Short id rows refer to (`v5e`, `v5p-configs`, `v5p-readme`).
    pub id: String,
    /// File in google/maxtext.
    pub file: String,
    /// Section heading.
    pub section: String,
    /// The commit that introduced the figures.
    pub commit: String,
    /// MaxText's FLOP formula at that commit.
    pub formula: FlopFormula,
}

/// One published run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishedRow {
    /// The table's id.
    pub table: String,
    /// The model as labeled (`16B`).
    pub model: String,
    /// The bundled config of that run, if MaxText has one.
    pub config: Option<String>,
    /// The chip generation (`v5e`).
    pub generation: String,
    /// The slice type as printed (`v5e-256`, `v5p-1024` = 512 chips).
    pub accelerator: String,
    /// Slices joined over DCN.
    pub slices: u32,
    /// Chips in all slices.
    pub chips: u64,
    /// `per_device_batch_size` of the run's script, when known.
    pub per_device_batch: Option<f64>,
    /// `ici_tensor_parallelism` of the run's script (1 when it sets none).
    #[serde(default)]
    pub tensor: Option<usize>,
    /// Published TFLOP/s per chip.
    pub tflops_per_chip: f64,
    /// Published MFU, as a fraction.
    pub mfu: f64,
    /// What is uncertain or inconsistent about the row as printed.
    #[serde(default)]
    pub note: Option<String>,
}

/// The tables and their rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename = "Published", deny_unknown_fields)]
pub struct Published {
    /// The tables.
    pub tables: Vec<PublishedTable>,
    /// Every row of every table, in table order.
    pub rows: Vec<PublishedRow>,
}

impl Published {
    /// The table a row belongs to.
    pub fn table_of(&self, row: &PublishedRow) -> Option<&PublishedTable> {
        self.tables.iter().find(|t| t.id == row.table)
    }

    /// The rows of one table.
    pub fn rows_of<'a>(&'a self, table: &'a str) -> impl Iterator<Item = &'a PublishedRow> + 'a {
        self.rows.iter().filter(move |r| r.table == table)
    }
}

impl PublishedRow {
    /// The row's generation.
    pub fn tpu(&self) -> Result<TpuGeneration, ModelError> {
        self.generation.parse().map_err(|_| ModelError::Published {
            origin: self.table.clone(),
            problem: format!("unknown generation `{}`", self.generation),
        })
    }

    /// Published TFLOP/s over the generation's bf16 peak
    /// (`hardware::HardwareSpec::peak_bf16_flops`).
    pub fn mfu_from_tflops(&self) -> Result<f64, ModelError> {
        Ok(self.tflops_per_chip * 1e12 / self.tpu()?.spec().peak_bf16_flops)
    }

    /// The bundled config with the row's batch.
    pub fn model_config(&self) -> Result<Option<ModelConfig>, ModelError> {
        let Some(name) = &self.config else {
            return Ok(None);
        };
        let mut config = super::bundled(name)?;
        if let Some(batch) = self.per_device_batch {
            config.per_device_batch = batch;
        }
        Ok(Some(config))
    }
}

/// The step time a row's published TFLOP/s implies for its model: FLOPs
/// per device per step under `formula` ÷ (TFLOP/s × 10¹²).
pub fn implied_step_seconds(row: &PublishedRow, config: &ModelConfig, formula: FlopFormula) -> f64 {
    training_flops_per_device(config, formula).total() / (row.tflops_per_chip * 1e12)
}

/// Chips in one slice of an accelerator type as printed: `v5e-256` is 256
/// chips; v4 and v5p names count TensorCores, two per chip.
pub fn chips_per_slice(accelerator: &str) -> Option<u64> {
    let (generation, count) = accelerator.split_once('-')?;
    let count: u64 = count.parse().ok()?;
    let generation: TpuGeneration = generation.parse().ok()?;
    let cores = u64::from(generation.spec().cores_per_chip);
    (count.is_multiple_of(cores) && count > 0).then_some(count / cores)
}

/// Parses and checks the published rows: every row names a known table, a
/// known generation, an accelerator whose chips × slices is the row's
/// chips, and a bundled config if any.
pub fn parse_published(text: &str, origin: &str) -> Result<Published, ModelError> {
    let published: Published = parse_ron(text, origin, "Published")?;
    let problem = |problem: String| ModelError::Published {
        origin: origin.to_string(),
        problem,
    };
    for (i, row) in published.rows.iter().enumerate() {
        if published.table_of(row).is_none() {
            return Err(problem(format!("rows[{i}]: no table `{}`", row.table)));
        }
        row.tpu()?;
        let per_slice = chips_per_slice(&row.accelerator)
            .ok_or_else(|| problem(format!("rows[{i}]: accelerator `{}`", row.accelerator)))?;
        if per_slice * u64::from(row.slices) != row.chips {
            return Err(problem(format!(
                "rows[{i}]: {} x {} slices is {} chips, not {}",
                row.accelerator,
                row.slices,
                per_slice * u64::from(row.slices),
                row.chips
            )));
        }
        if !(row.tflops_per_chip > 0.0 && (0.0..=1.0).contains(&row.mfu)) {
            return Err(problem(format!("rows[{i}]: TFLOP/s or MFU out of range")));
        }
        row.model_config()?;
    }
    Ok(published)
}

/// MaxText's published tables (embedded).
pub fn maxtext_published() -> Result<Published, ModelError> {
    parse_published(MAXTEXT_PUBLISHED_RON, "assets/validation/maxtext.ron")
}
