//! The search: every layout of a [`SearchSpace`] on a pod, modeled
//! best-first and pruned by a bound that never drops a layout of the top.
//!
//! The layouts of one mesh and remat policy share their passes (every
//! layer's forward and backward and the logits on the MXU), which no step
//! of theirs is shorter than ([`crate::step_model::passes_lower_bound`]).
//! The search computes that bound once per mesh and policy, models the
//! groups in the bound's order, and stops modeling once the next group's
//! bound is above the step of the `keep`-th fastest layout that fits: every
//! layout after it is slower than every layout kept, so the top `keep` are
//! exactly an exhaustive search's (`tests/plan.rs` compares the two). A
//! pipeline's bound is its stage's passes plus the bubble of its schedule,
//! so a group of pipelines is bounded by its schedule with the smallest
//! bubble (the most microbatches and repeats). A layout whose
//! weights, gradients, state and saved activations alone overflow a chip's
//! HBM ([`crate::step_model::hbm_floor`]) fits under no timing: the first
//! of each mesh and policy is modeled, to show what it would give, the
//! rest are not.
//! The order of
//! the result is the step, then the order the space lists the layouts in:
//! deterministic.

use serde::Serialize;

use super::space::{Layout, SearchSpace, meshes};
use crate::model::ModelConfig;
use crate::sharding::{Mesh, MeshSizes};
use crate::step_model::{
    ModelHbm, ModelStep, ModelStepOptions, PipelineOptions, default_efficiency, hbm_floor,
    model_step, passes_lower_bound,
};
use crate::topology::Topology;

/// What a search is asked.
#[derive(Debug, Clone)]
pub struct PlanRequest<'a> {
    /// The model, at the batch the search keeps.
    pub config: &'a ModelConfig,
    /// The pod.
    pub topology: &'a Topology,
    /// The layouts searched.
    pub space: &'a SearchSpace,
    /// What every layout shares: the optimizer, the recovery policy, the
    /// FLOP formula (the strategy, mesh, prefetch, reduction and pipeline
    /// are each layout's).
    pub base: ModelStepOptions,
    /// How many fitting layouts to rank (and non-fitting faster ones to
    /// show).
    pub keep: usize,
    /// Prune by the passes' bound; `false` models every layout.
    pub prune: bool,
    /// Model no layout whose passes' bound is above this step, seconds
    /// (a search for the layouts faster than a given one).
    pub ceiling: Option<f64>,
}

/// One modeled layout.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    /// The layout.
    pub layout: Layout,
    /// Its mesh as laid out (`data=1,fsdp=256,tensor=1`).
    pub mesh: String,
    /// The modeled step, seconds.
    pub step_seconds: f64,
    /// Tokens per second per chip.
    pub tokens_per_s_per_chip: f64,
    /// Model FLOP utilization.
    pub mfu: f64,
    /// Compute seconds (the passes and the update).
    pub compute_seconds: f64,
    /// Step seconds no compute covers.
    pub exposed_communication: f64,
    /// A pipeline's bubble, seconds (0 without a stage axis).
    pub bubble_seconds: f64,
    /// HBM per device at the step's peak, by kind.
    pub hbm: ModelHbm,
    /// Whether the step fits the device's HBM (and its host what it
    /// offloads).
    pub fits: bool,
    /// What does not fit, and by how much.
    pub not_fitting: Option<String>,
    /// The order the space lists it in (the ranking's tie-break).
    pub order: usize,
}

impl Candidate {
    fn of(layout: Layout, mesh: &Mesh, step: &ModelStep, order: usize) -> Candidate {
        Candidate {
            layout,
            mesh: mesh.to_string(),
            step_seconds: step.step_seconds,
            tokens_per_s_per_chip: step.tokens_per_s_per_chip,
            mfu: step.mfu,
            compute_seconds: step.compute_seconds,
            exposed_communication: step.exposed_communication,
            bubble_seconds: step.pipeline.map_or(0.0, |p| p.bubble_seconds),
            hbm: step.hbm,
            fits: step.fits_in_hbm,
            not_fitting: step.not_fitting.clone(),
            order,
        }
    }

    /// HBM left at the step's peak, bytes (negative: over).
    pub fn headroom(&self) -> i64 {
        self.hbm.margin
    }
}

/// Layouts the step model refuses for one reason (a tensor axis that does
/// not divide the heads, microbatches that do not divide the batch).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Refusal {
    /// The reason, as the step model gives it.
    pub reason: String,
    /// How many layouts it refused.
    pub layouts: usize,
    /// The first of them.
    pub example: Layout,
}

/// A search's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// The fitting layouts, fastest first: at most `keep`.
    pub ranked: Vec<Candidate>,
    /// Layouts faster than the best that fits but that do not fit, fastest
    /// first (at most `keep`); with nothing fitting, the ones nearest to
    /// fitting, least over first.
    pub rejected: Vec<Candidate>,
    /// Every layout modeled, as (tokens/s/chip, HBM headroom, fits): what
    /// the throughput-against-headroom picture plots.
    pub points: Vec<(f64, i64, bool)>,
    /// Meshes the pod admits in the space.
    pub meshes: usize,
    /// Layouts in the space.
    pub layouts: usize,
    /// Layouts modeled.
    pub modeled: usize,
    /// Layouts the bound showed slower than the ranked ones, not modeled.
    pub pruned: usize,
    /// Layouts whose state and saved activations alone overflow a chip's
    /// HBM, not modeled (the first of each mesh and remat policy is, to
    /// show what it would give).
    pub pruned_not_fitting: usize,
    /// Layouts the step model refused, by reason.
    pub refusals: Vec<Refusal>,
}

impl Plan {
    /// Layouts refused in all.
    pub fn refused(&self) -> usize {
        self.refusals.iter().map(|r| r.layouts).sum()
    }

    /// The best layout that fits.
    pub fn best(&self) -> Option<&Candidate> {
        self.ranked.first()
    }
}

/// One mesh and remat policy's layouts, with the bound on their steps.
struct Group {
    bound: f64,
    mesh: Mesh,
    config: usize,
    layouts: Vec<(usize, Layout)>,
}

/// The groups of one mesh and remat policy, each with its passes' bound,
/// sorted by it; the layouts in all; the refusals of the groups whose
/// passes cannot be modeled.
fn groups_of(
    request: &PlanRequest,
    (meshes, configs): (&[(MeshSizes, Mesh)], &[ModelConfig]),
    base: &ModelStepOptions,
    refusals: &mut Vec<Refusal>,
) -> (Vec<Group>, usize) {
    let (space, topology, config) = (request.space, request.topology, request.config);
    let mut groups = Vec::new();
    let mut order = 0usize;
    for (sizes, mesh) in meshes {
        for (c, remat) in space.remat.iter().enumerate() {
            let layouts: Vec<(usize, Layout)> = space
                .variants(*sizes, *remat, config.layers)
                .into_iter()
                .map(|l| {
                    order += 1;
                    (order - 1, l)
                })
                .collect();
            // The group's bound is its least layout's: a pipeline's
            // depends on its schedule (the bubble), nothing else's does.
            let mut schedules: Vec<Option<(usize, usize)>> =
                layouts.iter().map(|(_, l)| l.pipeline).collect();
            schedules.sort_unstable();
            schedules.dedup();
            let bound = schedules
                .into_iter()
                .try_fold(f64::INFINITY, |least, pipeline| {
                    let options = ModelStepOptions {
                        mesh: mesh.clone(),
                        pipeline: PipelineOptions {
                            microbatches: pipeline.map(|(m, _)| m),
                            repeats: pipeline.map(|(_, r)| r),
                        },
                        ..base.clone()
                    };
                    passes_lower_bound(&configs[c], topology, &options)
                        .map(|bound| least.min(bound.unwrap_or(0.0)))
                });
            match bound {
                Ok(bound) => groups.push(Group {
                    bound: if bound.is_finite() { bound } else { 0.0 },
                    mesh: mesh.clone(),
                    config: c,
                    layouts,
                }),
                Err(e) => {
                    for (_, layout) in layouts {
                        refuse(refusals, e.to_string(), layout);
                    }
                }
            }
        }
    }
    groups.sort_by(|a, b| a.bound.total_cmp(&b.bound));
    (groups, order)
}

/// Searches `request.space` on the pod (module docs).
pub fn plan(request: &PlanRequest) -> Plan {
    let PlanRequest {
        config, topology, ..
    } = request;
    let space = request.space;
    let mut base = request.base.clone();
    base.efficiency = base.efficiency.or(Some(default_efficiency(topology)));
    base.record_spans = false;
    let meshes: Vec<(MeshSizes, Mesh)> = match &space.meshes {
        None => meshes(topology, config, space.stages),
        Some(list) => list
            .iter()
            .filter_map(|&s| s.lay_out_split(topology).ok().map(|m| (s, m)))
            .collect(),
    };
    let configs: Vec<ModelConfig> = space
        .remat
        .iter()
        .map(|&remat| ModelConfig {
            remat,
            ..(*config).clone()
        })
        .collect();
    let mut refusals: Vec<Refusal> = Vec::new();
    let (groups, layouts) = groups_of(request, (&meshes, &configs), &base, &mut refusals);
    let keep = request.keep.max(1);
    let mut fitting: Vec<Candidate> = Vec::new();
    let mut over: Vec<Candidate> = Vec::new();
    let (mut modeled, mut pruned, mut pruned_not_fitting) = (0usize, 0usize, 0usize);
    let capacity = topology.generation.spec().hbm_bytes;
    let mut points = Vec::new();
    for group in &groups {
        let threshold = (fitting.len() >= keep).then(|| fitting[keep - 1].step_seconds);
        let above = |t: f64| group.bound > t;
        if (request.prune && threshold.is_some_and(above)) || request.ceiling.is_some_and(above) {
            pruned += group.layouts.len();
            continue;
        }
        let mut shown_over = false;
        for &(at, layout) in &group.layouts {
            let options = options_of(&base, &group.mesh, &layout);
            if request.prune
                && hbm_floor(&configs[group.config], topology, &options)
                    .ok()
                    .flatten()
                    .is_some_and(|floor| floor > capacity)
            {
                // One of the group's overflowing layouts is modeled, to
                // show what it would give.
                if shown_over {
                    pruned_not_fitting += 1;
                    continue;
                }
                shown_over = true;
            }
            match model_step(&configs[group.config], topology, &options) {
                Ok(step) => {
                    modeled += 1;
                    let candidate = Candidate::of(layout, &group.mesh, &step, at);
                    points.push((
                        candidate.tokens_per_s_per_chip,
                        candidate.headroom(),
                        candidate.fits,
                    ));
                    if candidate.fits {
                        insert_ranked(&mut fitting, candidate, keep);
                    } else {
                        over.push(candidate);
                    }
                }
                Err(e) => refuse(&mut refusals, e.to_string(), layout),
            }
        }
    }
    let rejected = rejected(over, fitting.first(), keep);
    Plan {
        ranked: fitting,
        rejected,
        points,
        meshes: meshes.len(),
        layouts,
        modeled,
        pruned,
        pruned_not_fitting,
        refusals,
    }
}

/// The step options of `layout` on `mesh` over `base`.
pub fn options_of(base: &ModelStepOptions, mesh: &Mesh, layout: &Layout) -> ModelStepOptions {
    ModelStepOptions {
        strategy: layout.strategy,
        mesh: mesh.clone(),
        prefetch: layout.prefetch.unwrap_or(base.prefetch),
        data_reduction: layout.data_reduction,
        recovery: layout.recovery,
        pipeline: PipelineOptions {
            microbatches: layout.pipeline.map(|(m, _)| m),
            repeats: layout.pipeline.map(|(_, r)| r),
        },
        ..base.clone()
    }
}

/// Keeps `ranked` the `keep` fastest, by step then listing order.
fn insert_ranked(ranked: &mut Vec<Candidate>, candidate: Candidate, keep: usize) {
    let key = |c: &Candidate| (c.step_seconds, c.order);
    let at = ranked.partition_point(|c| {
        let (a, b) = (key(c), key(&candidate));
        a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).is_lt()
    });
    if at < keep {
        ranked.insert(at, candidate);
        ranked.truncate(keep);
    }
}

/// The non-fitting layouts worth showing: those faster than the best that
/// fits (why they lost is their overflow), fastest first; with none
/// fitting, the nearest to fitting.
fn rejected(mut over: Vec<Candidate>, best: Option<&Candidate>, keep: usize) -> Vec<Candidate> {
    match best {
        Some(best) => {
            over.retain(|c| c.step_seconds < best.step_seconds);
            over.sort_by(|a, b| {
                a.step_seconds
                    .total_cmp(&b.step_seconds)
                    .then(a.order.cmp(&b.order))
            });
        }
        None => over.sort_by(|a, b| b.hbm.margin.cmp(&a.hbm.margin).then(a.order.cmp(&b.order))),
    }
    // One per mesh and remat policy: its strategies differ little in
    // speed and all overflow by about its activations.
    let mut seen = std::collections::HashSet::new();
    over.retain(|c| seen.insert((c.layout.mesh, c.layout.remat)));
    over.truncate(keep);
    over
}

fn refuse(refusals: &mut Vec<Refusal>, reason: String, layout: Layout) {
    match refusals.iter_mut().find(|r| r.reason == reason) {
        Some(r) => r.layouts += 1,
        None => refusals.push(Refusal {
            reason,
            layouts: 1,
            example: layout,
        }),
    }
}
