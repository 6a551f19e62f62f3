//! How a strategy step is modeled: the strategy, mesh, overlap and order
//! options of [`super::strategy::modeled_strategy_step`].

use serde::Serialize;

use crate::sharding::mesh::{Mesh, Strategy};
use crate::sharding::model::RecoveryPolicy;
use crate::topology::Topology;

/// How a strategy step is modeled.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StrategyOptions {
    /// The strategy.
    pub strategy: Strategy,
    /// The mesh, laid out on the pod.
    pub mesh: Mesh,
    /// fsdp: gathers ahead of the use (0: each bucket gathered when the
    /// previous one is freed).
    pub prefetch: usize,
    /// The recovery policy whose per-step costs are in the figures.
    pub recovery: RecoveryPolicy,
    /// Seconds of each forward use of a bucket (and of each backward use
    /// unless `backward_use_seconds` says otherwise): 0 while the step
    /// models no compute but the update.
    pub use_seconds: f64,
    /// Seconds of each backward use, if not `use_seconds` (a model's
    /// backward pass costs twice its forward, plus what remat recomputes).
    pub backward_use_seconds: Option<f64>,
    /// Compute between the last forward use and the first backward use
    /// (a model's logits and loss, forward and backward), seconds.
    pub between_seconds: f64,
    /// Whether to keep every bucket's spans (for a trace; a large model
    /// has hundreds of thousands).
    pub record_spans: bool,
    /// When the gradients' reduction over `data` runs.
    pub data_reduction: DataReduction,
    /// The order of the step's uses, updates and all-gathers.
    pub order: StepOrder,
    /// Bytes per element of each kind a model's training step holds and
    /// moves, where they differ from the model's element type
    /// ([`Precision`]); `None` for a real run, every kind in its type.
    pub precision: Option<Precision>,
    /// Of every bucket, the fraction that is a mixture's expert weights,
    /// split over the mesh's `expert` axis
    /// ([`crate::sharding::strategy::bucket_plan_with_experts`]); 0 for a dense
    /// model or a mesh without the axis.
    pub expert_share: f64,
}

/// The order a strategy step runs its uses, updates and the new
/// parameters' all-gathers in ([`super::strategy`] module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StepOrder {
    /// An optimizer step on gradients given at its start: replicated and
    /// zero2 update and all-gather every bucket after the uses (what real
    /// runs do: their gradients come from the host, with no backward pass
    /// to hide behind).
    #[default]
    Optimizer,
    /// A training step: each update after the next backward use, and
    /// (replicated, zero2) its all-gather behind the rest of the backward
    /// pass, as fsdp's collectives are.
    Training,
}

/// Steps the training order simulates back to back; the last one's length
/// is the step. Each step's forward waits for the new parameters of the
/// one before, so from the second on the head of a step overlaps the tail
/// of the one before as in a long run; the third is the steady state's
/// (the unit tests hold it equal to the fifth).
pub const STEADY_STEPS: usize = 3;

/// When a step reduces its gradients over the mesh's `data` axis.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DataReduction {
    /// Each bucket's, right after its gradient's reduction over `fsdp`,
    /// behind the rest of the backward pass (what a real run does).
    #[default]
    Overlapped,
    /// Every bucket's after the whole backward pass, before the updates:
    /// what MaxText's published multislice runs show (`step_model`).
    AfterBackward,
}

impl DataReduction {
    /// Both, in the order `--data-reduction` lists them.
    pub const ALL: [DataReduction; 2] = [DataReduction::AfterBackward, DataReduction::Overlapped];

    /// `after-backward` or `overlapped`.
    pub fn name(self) -> &'static str {
        match self {
            DataReduction::AfterBackward => "after-backward",
            DataReduction::Overlapped => "overlapped",
        }
    }
}

impl std::str::FromStr for DataReduction {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DataReduction::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| {
                format!(
                    "`{s}` is not after-backward or overlapped{}",
                    crate::error::did_you_mean(s, DataReduction::ALL.map(DataReduction::name))
                )
            })
    }
}

/// Each use's seconds and the compute between the passes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Uses {
    pub(super) forward: f64,
    pub(super) backward: f64,
    pub(super) between: f64,
}

impl StrategyOptions {
    /// Seconds of each backward use.
    pub fn backward(&self) -> f64 {
        self.backward_use_seconds.unwrap_or(self.use_seconds)
    }

    /// `strategy` on `topology`'s default mesh, prefetch 1, rollback, no
    /// compute, no spans.
    pub fn new(strategy: Strategy, topology: &Topology) -> StrategyOptions {
        StrategyOptions {
            strategy,
            mesh: Mesh::default_for(topology),
            prefetch: 1,
            recovery: RecoveryPolicy::Rollback,
            use_seconds: 0.0,
            backward_use_seconds: None,
            between_seconds: 0.0,
            record_spans: false,
            data_reduction: DataReduction::Overlapped,
            order: StepOrder::Optimizer,
            precision: None,
            expert_share: 0.0,
        }
    }
}

pub use crate::sharding::strategy::Precision;
