//! The step model against MaxText's published runs
//! ([`crate::model::maxtext_published`]): every row with a bundled config,
//! modeled on its pod (slices of the published slice type over DCN) with
//! its table's FLOP formula, beside the published TFLOP/s/chip.

use serde::Serialize;

use super::{ModelStepOptions, StepModelError, model_step};
use crate::cost_model::DataReduction;
use crate::model::{Published, PublishedRow};
use crate::sharding::{Mesh, MeshSizes, Strategy};
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
    /// Seconds the step's collectives over the DCN last, hidden or not:
    /// the most the slices could add to the step if none of it overlapped.
    pub dcn_seconds: f64,
    /// The mesh modeled (`data=2,fsdp=32,tensor=8`).
    pub mesh: String,
    /// Where the modeled mesh differs from the run's script, and why.
    pub mesh_note: Option<String>,
    /// The modeled peak HBM per device, bytes.
    pub hbm_bytes: u64,
    /// A device's HBM, bytes.
    pub hbm_capacity: u64,
    /// What is left at the peak (negative: over): the run ran, so it fits.
    pub hbm_margin: i64,
}

/// The run's mesh on `topology`: data across the slices, `tensor` from the
/// script, fsdp over the rest of each slice. A tensor axis that is not a
/// product of whole torus axes (tensor=16 on 8x8x8), which this model's
/// meshes need, is modeled at the largest power-of-two divisor that is,
/// and said.
pub fn mesh_of(
    row: &PublishedRow,
    topology: &Topology,
) -> Result<(Mesh, Option<String>), StepModelError> {
    let slices = row.slices.max(1) as usize;
    let per_slice = topology.chips_per_slice() as usize;
    let wanted = row.tensor.unwrap_or(1).max(1);
    let mut tensor = wanted;
    loop {
        let sizes = MeshSizes::new(slices, per_slice / tensor, tensor);
        let laid = per_slice
            .is_multiple_of(tensor)
            .then(|| sizes.lay_out_split(topology))
            .and_then(Result::ok);
        match laid {
            Some(mesh) => {
                let note = (tensor != wanted).then(|| {
                    format!(
                        "the script's tensor={wanted} is not a product of whole torus axes of \
                         {} (as the modeled meshes need); modeled at tensor={tensor}",
                        topology.name
                    )
                });
                return Ok((mesh, note));
            }
            None if tensor > 1 => tensor /= 2,
            None => {
                return Err(StepModelError::Field {
                    field: "accelerator",
                    value: row.accelerator.clone(),
                    problem: format!("no mesh of data={slices} lays out on {}", topology.name),
                });
            }
        }
    }
}

/// The torus of one slice of `row`: the Cloud accelerator type it names
/// (`v5p-1024` is 512 chips, 8x8x8), which must hold the row's chips per
/// slice.
pub fn slice_shape(row: &PublishedRow) -> Result<&'static str, StepModelError> {
    let per_slice = row.chips / u64::from(row.slices.max(1));
    let field = |problem: String| StepModelError::Field {
        field: "accelerator",
        value: row.accelerator.clone(),
        problem,
    };
    let cloud = crate::topology::cloud_type(&row.accelerator)
        .ok_or_else(|| field("not a Cloud TPU accelerator type".to_string()))?;
    if cloud.generation != row.generation || u64::from(cloud.chips) != per_slice {
        return Err(field(format!(
            "Cloud's {} is {} {} chips, the row has {per_slice} {} chips a slice",
            cloud.name, cloud.chips, cloud.generation, row.generation
        )));
    }
    Ok(cloud.shape)
}

/// The pod of `row`: its slices over DCN.
pub fn pod_of(row: &PublishedRow) -> Result<Topology, StepModelError> {
    let shape = slice_shape(row)?;
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

/// Every row of `published` with a bundled config, modeled as MaxText's
/// scripts ran it: fsdp inside each slice with the script's tensor axis,
/// data across the slices ([`mesh_of`]).
pub fn validate(published: &Published) -> Result<Vec<ValidationRow>, StepModelError> {
    validate_with(published, DataReduction::AfterBackward)
}

/// [`validate`] with the gradients' reduction over `data` run `when`.
pub fn validate_with(
    published: &Published,
    when: DataReduction,
) -> Result<Vec<ValidationRow>, StepModelError> {
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
        let (mesh, mesh_note) = mesh_of(row, &topology)?;
        let options = ModelStepOptions {
            strategy: Strategy::Fsdp,
            mesh,
            formula: table.formula,
            data_reduction: when,
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
            dcn_seconds: step
                .strategy_step
                .axes
                .get("dcn")
                .map_or(0.0, |a| a.seconds),
            mesh: step.mesh.clone(),
            mesh_note,
            hbm_bytes: step.hbm.total,
            hbm_capacity: step.hbm.capacity,
            hbm_margin: step.hbm.margin,
        });
    }
    Ok(rows)
}
