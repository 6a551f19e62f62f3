//! Where a modeled step lies outside what the published runs hold the
//! model to, and how far off the model has been there.
//!
//! The recipes (`assets/validation/recipes.ron`, [`super::recipes`]) hold
//! the step model to its accuracy bounds on every row but those marked
//! with a known gap: the dropless mixtures of 128 and 256 experts, whose
//! published steps are 1.4–1.8 times the modeled ones (`docs/validation.md`
//! says which costs are missing). A step of that kind is reported with
//! those runs' measured errors beside it, so its number is not read with
//! the confidence the validated rows earn. The kind is read from the
//! recipes themselves: a dropless mixture with more experts than any
//! dropless mixture held to the bounds. When the model closes the gap and
//! its rows lose their `gap`, the warning goes with them.

use std::sync::OnceLock;

use serde::Serialize;

use super::StepModelError;
use super::recipes::{RecipeRow, model_row, recipes};
use crate::model::{MixtureOfExperts, ModelConfig, bundled};

/// A step of a kind the published runs do not validate, with the runs of
/// that kind the model is known to miss.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KnownGap {
    /// What sets the step apart (`dropless mixture of 256 experts`).
    pub kind: String,
    /// The most experts of a dropless mixture held to the accuracy bounds.
    pub validated_experts: u64,
    /// The published runs of the kind, as modeled today.
    pub runs: Vec<GapRun>,
}

/// One published run the model is known to miss.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GapRun {
    /// The row's id in `docs/validation.md`.
    pub id: String,
    /// The bundled model it ran.
    pub model: String,
    /// Its routed experts.
    pub experts: u64,
    /// The published step over the modeled one (published tokens/s/chip
    /// below modeled by this factor): above 1, the model is fast.
    pub published_over_modeled: f64,
}

impl KnownGap {
    /// The least and the most `published_over_modeled` of the runs.
    pub fn range(&self) -> (f64, f64) {
        self.runs.iter().fold((f64::MAX, f64::MIN), |(lo, hi), r| {
            (
                lo.min(r.published_over_modeled),
                hi.max(r.published_over_modeled),
            )
        })
    }

    /// One line for a report: what is not validated and how far off the
    /// model has been on it.
    pub fn line(&self) -> String {
        let (lo, hi) = self.range();
        let runs: Vec<String> = self
            .runs
            .iter()
            .map(|r| {
                format!(
                    "{} {} ({} experts) {:.2}×",
                    r.id, r.model, r.experts, r.published_over_modeled
                )
            })
            .collect();
        format!(
            "not validated: a {}; dropless mixtures are validated up to {} experts, and the \
             published runs with more took {:.2}–{:.2}× the modeled step ({}; \
             docs/validation.md): read this step as a lower bound",
            self.kind,
            self.validated_experts,
            lo,
            hi,
            runs.join(", ")
        )
    }
}

/// The recipes' dropless mixtures: the most experts among the rows held to
/// the bounds, and the known-gap rows beyond it, modeled.
#[derive(Debug)]
struct DroplessCoverage {
    validated_experts: u64,
    beyond: Vec<GapRun>,
}

/// `config`'s mixture, if it routes dropless (no capacity factor).
fn dropless_mixture(config: &ModelConfig) -> Option<MixtureOfExperts> {
    config.moe.filter(|m| m.capacity_factor.is_none())
}

fn dropless(row: &RecipeRow) -> Result<Option<MixtureOfExperts>, StepModelError> {
    Ok(dropless_mixture(&bundled(&row.model)?))
}

fn coverage() -> Result<DroplessCoverage, StepModelError> {
    let recipes = recipes()?;
    let mut validated_experts = 0;
    for row in recipes.rows.iter().filter(|r| r.gap.is_none()) {
        if let Some(m) = dropless(row)? {
            validated_experts = validated_experts.max(m.num_experts);
        }
    }
    let mut beyond = Vec::new();
    for row in recipes.rows.iter().filter(|r| r.gap.is_some()) {
        let Some(m) = dropless(row)? else { continue };
        if m.num_experts <= validated_experts {
            continue;
        }
        let modeled = model_row(row, None)?;
        beyond.push(GapRun {
            id: row.id.clone(),
            model: row.model.clone(),
            experts: m.num_experts,
            published_over_modeled: 1.0 + modeled.error,
        });
    }
    Ok(DroplessCoverage {
        validated_experts,
        beyond,
    })
}

/// The known gap `config`'s step falls in, if any: a dropless mixture with
/// more experts than the validated ones, while the recipes hold runs of
/// that kind the model misses. The recipes are modeled once per process.
pub fn known_gap(config: &ModelConfig) -> Result<Option<KnownGap>, StepModelError> {
    static COVERAGE: OnceLock<Result<DroplessCoverage, String>> = OnceLock::new();
    let Some(moe) = dropless_mixture(config) else {
        return Ok(None);
    };
    let coverage = COVERAGE
        .get_or_init(|| coverage().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|problem| StepModelError::Field {
            field: "recipes",
            value: "assets/validation/recipes.ron".into(),
            problem: problem.clone(),
        })?;
    if moe.num_experts <= coverage.validated_experts || coverage.beyond.is_empty() {
        return Ok(None);
    }
    Ok(Some(KnownGap {
        kind: format!("dropless mixture of {} experts", moe.num_experts),
        validated_experts: coverage.validated_experts,
        runs: coverage.beyond.clone(),
    }))
}
