//! The search held against MaxText's published runs
//! ([`crate::step_model::validation`]): on each row's pod, model and global
//! batch, the best layout the search finds is at least as fast as the
//! published layout as the step model models it, and where the search
//! prefers another, the row says by how much and why.

use serde::Serialize;

use super::search::{Candidate, PlanRequest, plan};
use super::space::SearchSpace;
use crate::cost_model::DataReduction;
use crate::model::Published;
use crate::sharding::Strategy;
use crate::step_model::validation::{mesh_of, pod_of};
use crate::step_model::{ModelStepOptions, StepModelError, default_efficiency, model_step};

/// One published run: its layout's rank among every layout of its pod.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PublishedRank {
    /// The table's id.
    pub table: String,
    /// The model as labeled.
    pub model: String,
    /// The slice type.
    pub accelerator: String,
    /// Slices.
    pub slices: u32,
    /// The published layout's modeled step, seconds.
    pub published_step_seconds: f64,
    /// Its mesh (fsdp on the script's mesh, the model's remat policy).
    pub published_mesh: String,
    /// Its compute seconds (the passes and the update).
    pub published_compute_seconds: f64,
    /// Its exposed communication, seconds.
    pub published_exposed_seconds: f64,
    /// The best layout found.
    pub best: Candidate,
    /// 1 + the fitting layouts strictly faster than the published one
    /// (`None` when not counted: only the best was searched for).
    pub rank: Option<usize>,
    /// Layouts in the space.
    pub layouts: usize,
}

impl PublishedRank {
    /// Why the best layout is faster: the parts of the step it saves
    /// (`compute −1.2 s, exposed communication −0.3 s`).
    pub fn why(&self) -> String {
        let parts = [
            (
                "compute",
                self.best.compute_seconds - self.published_compute_seconds,
            ),
            (
                "exposed communication",
                self.best.exposed_communication - self.published_exposed_seconds,
            ),
        ];
        let saved: Vec<String> = parts
            .iter()
            .filter(|(_, d)| d.abs() >= 5e-4)
            .map(|(name, d)| format!("{name} {d:+.3} s"))
            .collect();
        if saved.is_empty() {
            "the same step".into()
        } else {
            saved.join(", ")
        }
    }
}

/// Every row of `published` with a bundled config: the best layout of its
/// pod and, with `ranks`, the published layout's rank (every layout not
/// slower than it modeled: slower to compute).
pub fn rank_published(
    published: &Published,
    ranks: bool,
) -> Result<Vec<PublishedRank>, StepModelError> {
    use rayon::prelude::*;
    // Each row is its own search: on the pool's threads, in the rows'
    // order.
    let ranked: Vec<Option<PublishedRank>> = published
        .rows
        .par_iter()
        .map(|row| rank_row(row, ranks))
        .collect::<Result<_, _>>()?;
    Ok(ranked.into_iter().flatten().collect())
}

/// [`rank_published`] for one row (`None`: no bundled config).
fn rank_row(
    row: &crate::model::PublishedRow,
    ranks: bool,
) -> Result<Option<PublishedRank>, StepModelError> {
    let Some(mut config) = row.model_config()? else {
        return Ok(None);
    };
    if let Some(batch) = row.per_device_batch {
        config.per_device_batch = batch;
    }
    let topology = pod_of(row)?;
    let (mesh, _) = mesh_of(row, &topology)?;
    let base = ModelStepOptions {
        efficiency: Some(default_efficiency(&topology)),
        ..ModelStepOptions::new(&topology)
    };
    let published_options = ModelStepOptions {
        strategy: Strategy::Fsdp,
        mesh: mesh.clone(),
        data_reduction: DataReduction::AfterBackward,
        ..base.clone()
    };
    let step = model_step(&config, &topology, &published_options)?;
    let space = SearchSpace::every(&config);
    let searched = plan(&PlanRequest {
        config: &config,
        topology: &topology,
        space: &space,
        base,
        keep: if ranks { usize::MAX } else { 1 },
        prune: true,
        ceiling: ranks.then_some(step.step_seconds),
    });
    let Some(best) = searched.best().cloned() else {
        return Err(StepModelError::Field {
            field: "model",
            value: row.model.clone(),
            problem: format!("no layout of it fits {}", topology.name),
        });
    };
    let rank = ranks.then(|| {
        1 + searched
            .ranked
            .iter()
            .filter(|c| c.step_seconds < step.step_seconds)
            .count()
    });
    Ok(Some(PublishedRank {
        table: row.table.clone(),
        model: row.model.clone(),
        accelerator: row.accelerator.clone(),
        slices: row.slices,
        published_step_seconds: step.step_seconds,
        published_mesh: mesh.to_string(),
        published_compute_seconds: step.compute_seconds,
        published_exposed_seconds: step.exposed_communication,
        best,
        rank,
        layouts: searched.layouts,
    }))
}
