//! What pipeline stages over the DCN would have given a published
//! multislice run: the run's model, pod, per-device batch and tensor axis,
//! with the slices shared between `data` and `stage` (MaxText's
//! `dcn_data_parallelism × dcn_pipeline_parallelism`) instead of all on
//! `data`, at the best microbatch count and repeats the batch and the
//! layers allow. Microbatches are whole sequences on every device of a
//! stage (at most the `P ×` per-device batch a stage's device holds) and a
//! multiple of the stages; repeats divide the stage's layers.

use serde::Serialize;

use super::validation::{mesh_of, pod_of};
use super::{ModelStep, ModelStepOptions, PipelineOptions, StepModelError, model_step};
use crate::model::{Published, PublishedRow};
use crate::sharding::{MeshAxisName, MeshSizes, Strategy};

/// A published multislice run and its best layout with stages over DCN.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StagesOverDcn {
    /// The table's id.
    pub table: String,
    /// The model as labeled.
    pub model: String,
    /// Slices.
    pub slices: u32,
    /// Published TFLOP/s per chip.
    pub published_tflops: f64,
    /// Modeled TFLOP/s per chip as the run was laid out (data over DCN).
    pub data_tflops: f64,
    /// The best layout with a stage axis: its mesh, microbatches and
    /// repeats, TFLOP/s per chip, bubble fraction and whether it fits.
    pub best: Option<StagedLayout>,
}

/// One layout with a stage axis over the DCN.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StagedLayout {
    /// The mesh.
    pub mesh: String,
    /// Microbatches a step.
    pub microbatches: usize,
    /// Rounds of the stages.
    pub repeats: usize,
    /// Modeled TFLOP/s per chip.
    pub tflops: f64,
    /// The bubble's share of the pipelined passes.
    pub bubble_fraction: f64,
    /// The permutes over DCN, seconds a step.
    pub permute_seconds: f64,
    /// The step, seconds.
    pub step_seconds: f64,
}

/// For each row of `published` with at least `min_slices` slices and a
/// bundled config, the run as laid out and the fastest layout with stages
/// over the slices that fits.
pub fn stages_over_dcn(
    published: &Published,
    min_slices: u32,
) -> Result<Vec<StagesOverDcn>, StepModelError> {
    let mut out = Vec::new();
    for row in published.rows.iter().filter(|r| r.slices >= min_slices) {
        let Some(mut config) = row.model_config()? else {
            continue;
        };
        if let Some(batch) = row.per_device_batch {
            config.per_device_batch = batch;
        }
        let formula = published
            .table_of(row)
            .ok_or_else(|| StepModelError::Field {
                field: "table",
                value: row.table.clone(),
                problem: "no such table".into(),
            })?
            .formula;
        let topology = pod_of(row)?;
        let (mesh, _) = mesh_of(row, &topology)?;
        let base = ModelStepOptions {
            strategy: Strategy::Fsdp,
            mesh: mesh.clone(),
            formula,
            ..ModelStepOptions::new(&topology)
        };
        let data = model_step(&config, &topology, &base)?;
        let mut best: Option<(ModelStep, usize, usize)> = None;
        for (sizes, m, r) in candidates(row, &mesh.sizes(), config.layers, config.per_device_batch)
        {
            let Ok(staged_mesh) = sizes.lay_out_split(&topology) else {
                continue;
            };
            let options = ModelStepOptions {
                mesh: staged_mesh,
                pipeline: PipelineOptions {
                    microbatches: Some(m),
                    repeats: Some(r),
                },
                ..base.clone()
            };
            let Ok(step) = model_step(&config, &topology, &options) else {
                continue;
            };
            if step.fits_in_hbm
                && best
                    .as_ref()
                    .is_none_or(|(b, _, _)| step.step_seconds < b.step_seconds)
            {
                best = Some((step, m, r));
            }
        }
        out.push(StagesOverDcn {
            table: row.table.clone(),
            model: row.model.clone(),
            slices: row.slices,
            published_tflops: row.tflops_per_chip,
            data_tflops: data.tflops_per_chip,
            best: best.map(|(s, m, r)| {
                let p = s.pipeline.expect("a staged layout is pipelined");
                StagedLayout {
                    mesh: s.mesh.clone(),
                    microbatches: m,
                    repeats: r,
                    tflops: s.tflops_per_chip,
                    bubble_fraction: p.bubble_fraction,
                    permute_seconds: p.permute_seconds,
                    step_seconds: s.step_seconds,
                }
            }),
        });
    }
    Ok(out)
}

/// The layouts to try: the row's mesh with `P` of its slices on `stage`
/// (`P` a power of two dividing the slices and the layers), microbatches
/// `P·j` for whole sequences per device (`j` dividing the per-device
/// batch), repeats dividing the stage's layers (powers of two).
fn candidates(
    row: &PublishedRow,
    sizes: &MeshSizes,
    layers: u64,
    per_device_batch: f64,
) -> Vec<(MeshSizes, usize, usize)> {
    let slices = row.slices as usize;
    let mut out = Vec::new();
    let mut p = 2usize;
    while p <= slices {
        if slices.is_multiple_of(p) && layers.is_multiple_of(p as u64) {
            let staged = MeshSizes {
                data: sizes.of(MeshAxisName::Data) / p,
                stage: p,
                ..*sizes
            };
            // Sequences a stage's device holds: P × the per-device batch.
            let held = (per_device_batch * p as f64).round() as usize;
            for m in (p..=held.max(p))
                .step_by(p)
                .filter(|m| held.is_multiple_of(*m))
            {
                let mut r = 1usize;
                while (layers / p as u64).is_multiple_of(r as u64) && r as u64 <= layers / p as u64
                {
                    out.push((staged, m, r));
                    r *= 2;
                }
            }
        }
        p *= 2;
    }
    out
}
