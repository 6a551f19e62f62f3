//! The step model against published training recipes it was not fitted
//! to (`assets/validation/recipes.ron`): each run a bundled model with the
//! recipe's own batch, sequence, remat and offload, weight type and
//! attention blocks, on its slices, compared in tokens per second per chip
//! (a figure no FLOP formula can bend).

use serde::{Deserialize, Serialize};

use super::{ModelStepOptions, StepModelError, model_step};
use crate::model::{AttentionKernel, ModelDType, Quantization, RematPolicy, bundled};
use crate::sharding::{Mesh, Strategy};
use crate::topology::{Topology, parse_topology};

/// The bundled recipes file.
pub const RECIPES_RON: &str = include_str!("../../assets/validation/recipes.ron");

/// The published runs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename = "Recipes", deny_unknown_fields)]
pub struct Recipes {
    /// Every run.
    pub rows: Vec<RecipeRow>,
}

/// One published run: the model as its recipe set it, the pod, the figure.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecipeRow {
    /// The row's id in `docs/validation.md`.
    pub id: String,
    /// A bundled model.
    pub model: String,
    /// The TPU generation (`v6e`).
    pub generation: String,
    /// One slice's torus (`16x16`).
    pub shape: String,
    /// Slices over the data-center network.
    pub slices: u32,
    /// `per_device_batch_size`, if not the bundled model's.
    #[serde(default)]
    pub per_device_batch: Option<f64>,
    /// `max_target_length`, if not the bundled model's.
    #[serde(default)]
    pub seq_len: Option<u64>,
    /// The remat policy, if not the bundled model's.
    #[serde(default)]
    pub remat: Option<RematPolicy>,
    /// `weight_dtype`, if not the bundled model's.
    #[serde(default)]
    pub weight_dtype: Option<ModelDType>,
    /// The attention kernel's blocks, if not the bundled model's.
    #[serde(default)]
    pub attention_kernel: Option<AttentionKernel>,
    /// `mu_dtype`, if the run set one.
    #[serde(default)]
    pub mu_dtype: Option<ModelDType>,
    /// `grad_dtype`, if the run set one.
    #[serde(default)]
    pub grad_dtype: Option<ModelDType>,
    /// `quantization`, if the run set one.
    #[serde(default)]
    pub quantization: Option<Quantization>,
    /// `use_iota_embed`, if not the bundled model's.
    #[serde(default)]
    pub use_iota_embed: Option<bool>,
    /// `num_vocab_tiling`, if not the bundled model's.
    #[serde(default)]
    pub num_vocab_tiling: Option<u64>,
    /// The run's mesh, if not fsdp over each slice and data across them.
    #[serde(default)]
    pub mesh: Option<String>,
    /// Whether the generation's constant was fitted on this run.
    #[serde(default)]
    pub fitted: bool,
    /// What the run spends that the step model does not cost yet, when
    /// that is known to move its step: the row is modeled and reported
    /// with its error, but not held to the predicted rows' accuracy
    /// (`docs/validation.md` says why for each).
    #[serde(default)]
    pub gap: Option<String>,
    /// Published seconds per step.
    pub step_seconds: f64,
    /// Published tokens per second per chip.
    pub tokens_per_s_per_chip: f64,
    /// Published TFLOP/s per chip (MaxText's formula of the day).
    pub tflops_per_chip: f64,
    /// Where the figure is published.
    pub source: String,
}

/// One run: published and modeled.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RecipeResult {
    /// The row's id.
    pub id: String,
    /// The model.
    pub model: String,
    /// `v6e 16x16 x1`.
    pub pod: String,
    /// Chips.
    pub chips: u32,
    /// The mesh modeled.
    pub mesh: String,
    /// Published tokens/s/chip.
    pub published: f64,
    /// Modeled tokens/s/chip.
    pub modeled: f64,
    /// `modeled / published − 1`.
    pub error: f64,
    /// Whether a constant was fitted on it.
    pub fitted: bool,
    /// The row's known modeling gap, if any (reported, not held to the
    /// accuracy bounds).
    pub gap: Option<String>,
    /// Whether the generation has a calibrated constant.
    pub calibrated: bool,
    /// An uncalibrated generation's tokens/s/chip at the least and the
    /// most of the fitted constants.
    pub modeled_range: Option<(f64, f64)>,
    /// The modeled step, seconds.
    pub step_seconds: f64,
    /// Of it, exposed communication and host transfers, seconds.
    pub exposed_communication: f64,
    /// What is left of a device's HBM at the peak, bytes (the run ran).
    pub hbm_margin: i64,
}

/// The bundled recipes, parsed.
pub fn recipes() -> Result<Recipes, StepModelError> {
    ron::from_str(RECIPES_RON).map_err(|e| StepModelError::Field {
        field: "recipes",
        value: "assets/validation/recipes.ron".into(),
        problem: e.to_string(),
    })
}

/// `row`'s pod: its slices of `shape`.
pub fn pod_of(row: &RecipeRow) -> Result<Topology, StepModelError> {
    let name = format!("{}-{}x{}", row.generation, row.shape, row.slices);
    let text = format!(
        "Pod(name: \"{name}\", generation: \"{}\", shape: \"{}\", slices: {})",
        row.generation, row.shape, row.slices
    );
    parse_topology(&text, &name).map_err(|e| StepModelError::Field {
        field: "shape",
        value: row.shape.clone(),
        problem: e.to_string(),
    })
}

/// `row` modeled with the generation's constant, or `efficiency` if given.
pub fn model_row(row: &RecipeRow, efficiency: Option<f64>) -> Result<RecipeResult, StepModelError> {
    let mut config = bundled(&row.model)?;
    if let Some(b) = row.per_device_batch {
        config.per_device_batch = b;
    }
    if let Some(s) = row.seq_len {
        config.seq_len = s;
    }
    if let Some(r) = row.remat {
        config.remat = r;
    }
    if let Some(w) = row.weight_dtype {
        config.weight_dtype = w;
    }
    if row.mu_dtype.is_some() {
        config.mu_dtype = row.mu_dtype;
    }
    if row.grad_dtype.is_some() {
        config.grad_dtype = row.grad_dtype;
    }
    if row.quantization.is_some() {
        config.quantization = row.quantization;
    }
    if let Some(n) = row.num_vocab_tiling {
        config.num_vocab_tiling = n;
    }
    if let Some(k) = row.attention_kernel {
        config.attention_kernel = k;
    }
    if let Some(iota) = row.use_iota_embed {
        config.use_iota_embed = iota;
    }
    let topology = pod_of(row)?;
    let mesh = match &row.mesh {
        Some(spec) => Mesh::parse_split(spec, &topology).map_err(|e| StepModelError::Field {
            field: "mesh",
            value: spec.clone(),
            problem: e.to_string(),
        })?,
        None => Mesh::default_for(&topology),
    };
    let options = ModelStepOptions {
        strategy: Strategy::Fsdp,
        mesh,
        efficiency,
        ..ModelStepOptions::new(&topology)
    };
    let step = model_step(&config, &topology, &options)?;
    Ok(RecipeResult {
        id: row.id.clone(),
        model: row.model.clone(),
        pod: format!("{} {} x{}", row.generation, row.shape, row.slices),
        chips: topology.num_devices(),
        mesh: step.mesh.clone(),
        published: row.tokens_per_s_per_chip,
        modeled: step.tokens_per_s_per_chip,
        error: step.tokens_per_s_per_chip / row.tokens_per_s_per_chip - 1.0,
        fitted: row.fitted,
        gap: row.gap.clone(),
        calibrated: step.calibrated,
        modeled_range: step
            .step_seconds_range
            .map(|(slow, fast)| (step.tokens_per_device / slow, step.tokens_per_device / fast)),
        step_seconds: step.step_seconds,
        exposed_communication: step.exposed_communication,
        hbm_margin: step.hbm.margin,
    })
}

/// Every row, modeled.
pub fn validate_recipes(recipes: &Recipes) -> Result<Vec<RecipeResult>, StepModelError> {
    recipes.rows.iter().map(|r| model_row(r, None)).collect()
}

/// The MXU efficiency at which `row` is modeled at its published
/// tokens/s/chip (bisection: the step falls as the efficiency rises).
pub fn fitted_efficiency(row: &RecipeRow) -> Result<f64, StepModelError> {
    let (mut low, mut high) = (0.05f64, 1.0f64);
    for _ in 0..60 {
        let mid = 0.5 * (low + high);
        if model_row(row, Some(mid))?.error > 0.0 {
            high = mid;
        } else {
            low = mid;
        }
    }
    Ok(0.5 * (low + high))
}
