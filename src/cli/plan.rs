//! `plan POD --model NAME|FILE`: the fastest layouts of a model on a pod
//! that fit, found by search (`optirs_tpu::plan`), each with the command
//! line that models it; ranked by goodput under failures with
//! `--mtbf-hours`; pods compared by time to train with `--pods`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use clap::Args;
use optirs_tpu::cost_model::DataReduction;
use optirs_tpu::goodput::{Fleet, GoodputConfig};
use optirs_tpu::model::{ModelConfig, RematPolicy};
use optirs_tpu::plan::{
    Effective, Plan, PlanRequest, PodPlan, SearchSpace, by_time_to_train, plan, plan_by_goodput,
};
use optirs_tpu::sharding::{RecoveryPolicy, Strategy};
use optirs_tpu::step_model::ModelStepOptions;
use optirs_tpu::topology::{DEFAULT_PRESET, Topology, load_topology};

use super::model_step::load_model;
use super::parse::{parse_count_u64, parse_positive, usage};

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// A preset name (see `optirs-tpu presets`) or a pod file path.
    #[arg(default_value = DEFAULT_PRESET)]
    pub(super) pod: String,
    /// Compare pods instead: each pod's best layout by time to train
    /// `--tokens` and chip-hours (comma-separated presets or files).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "POD,POD[,...]",
        requires = "tokens"
    )]
    pub(super) pods: Vec<String>,
    /// The transformer: a bundled name or a RON model file (docs/models.md).
    #[arg(long, value_name = "NAME|FILE")]
    pub(super) model: String,
    /// Sequences a step over the whole pod (default: the model's
    /// per-device batch times the chips; with --pods, the first pod's).
    #[arg(long, value_name = "N", value_parser = parse_count_u64,
          conflicts_with = "tokens_per_step")]
    pub(super) global_batch: Option<u64>,
    /// Tokens a step over the whole pod: the global batch times the
    /// sequence length.
    #[arg(long, value_name = "N", value_parser = parse_count_u64)]
    pub(super) tokens_per_step: Option<u64>,
    /// Tokens to train: adds the time to train each layout (and, with
    /// --pods, the chip-hours).
    #[arg(long, value_name = "N", value_parser = parse_tokens)]
    pub(super) tokens: Option<f64>,
    /// Search only these strategies (replicated, zero2, fsdp).
    #[arg(long, value_delimiter = ',', value_name = "S[,S...]")]
    pub(super) strategy: Vec<Strategy>,
    /// Search only this mesh (`--mesh` as train takes it).
    #[arg(long, value_name = "SPEC")]
    pub(super) mesh: Option<String>,
    /// Search only these remat policies (MaxText's names; `custom` is the
    /// model file's own).
    #[arg(long, value_delimiter = ',', value_name = "POLICY[,...]", value_parser = parse_remat_name)]
    pub(super) remat: Vec<String>,
    /// fsdp prefetch depths searched (default 1,2).
    #[arg(long, value_delimiter = ',', value_name = "N[,N...]",
          value_parser = super::parse::parse_prefetch)]
    pub(super) prefetch: Vec<usize>,
    /// The data axis's reduction schedules searched (after-backward,
    /// overlapped; default both).
    #[arg(long, value_delimiter = ',', value_name = "WHEN[,...]")]
    pub(super) data_reduction: Vec<DataReduction>,
    /// Leave pipeline stages out of the search.
    #[arg(long)]
    pub(super) no_stages: bool,
    /// The optimizer (its state slots and update).
    #[arg(long, default_value = "adam")]
    pub(super) optimizer: String,
    /// Recovery policies searched (default rollback; with --mtbf-hours
    /// rollback and redundant, and spare-cube on a pod with spare cubes).
    #[arg(long, value_delimiter = ',', value_name = "POLICY[,...]")]
    pub(super) recovery: Vec<RecoveryPolicy>,
    /// Rank by effective throughput under failures: a chip's mean time
    /// between failures, hours (goodput's inputs, its defaults otherwise).
    #[arg(long, value_name = "H", value_parser = super::goodput::parse_mtbf_hours)]
    pub(super) mtbf_hours: Option<f64>,
    /// With --mtbf-hours: the simulated run's length, days (default 30).
    #[arg(long, value_name = "D", value_parser = super::goodput::parse_days, requires = "mtbf_hours")]
    pub(super) days: Option<f64>,
    /// With --pods: a price per chip-hour, to cost each pod's run (no
    /// price is assumed).
    #[arg(long, value_name = "PRICE", value_parser = parse_price, requires = "pods")]
    pub(super) price_per_chip_hour: Option<f64>,
    /// How many layouts to rank.
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = parse_top)]
    pub(super) top: usize,
    /// Model every layout (no pruning by the passes' bound): the same
    /// ranking, slower.
    #[arg(long)]
    pub(super) exhaustive: bool,
    /// Write the throughput of every layout against its HBM headroom,
    /// with the Pareto front of those that fit, as SVG (never
    /// overwrites; every layout is modeled, as with --exhaustive).
    #[arg(long, value_name = "FILE", conflicts_with = "pods")]
    pub(super) svg: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub(super) json: bool,
}

fn parse_tokens(text: &str) -> Result<f64, String> {
    parse_positive(text, 1e30)
}

fn parse_price(text: &str) -> Result<f64, String> {
    parse_positive(text, 1e9)
}

fn parse_top(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if (1..=1000).contains(&n) => Ok(n),
        _ => Err(format!("`{text}` is not a count of layouts from 1 to 1000")),
    }
}

/// A remat policy's MaxText name, or `custom`.
pub(super) fn parse_remat_name(text: &str) -> Result<String, String> {
    if text == "custom" || RematPolicy::ALL.iter().any(|p| p.name() == text) {
        return Ok(text.to_string());
    }
    Err(format!(
        "unknown remat policy `{text}` (expected {}, or custom for the model file's own){}",
        RematPolicy::ALL.map(RematPolicy::name).join(", "),
        optirs_tpu::error::did_you_mean(text, RematPolicy::ALL.map(RematPolicy::name))
    ))
}

/// `name` as a policy of `config` (`custom` is the model file's own).
pub(super) fn remat_of(config: &ModelConfig, name: &str) -> Result<RematPolicy> {
    if name == "custom" {
        return match config.remat {
            RematPolicy::Custom { .. } => Ok(config.remat),
            _ => Err(usage(format!(
                "--remat custom: {} has no custom remat policy (a model file's `remat: custom(…)`)",
                config.name
            ))),
        };
    }
    RematPolicy::ALL
        .into_iter()
        .find(|p| p.name() == name)
        .ok_or_else(|| usage(parse_remat_name(name).unwrap_err()))
}

/// `config` at `--global-batch` (or `--tokens-per-step`) sequences over
/// `chips`: its per-device batch is the share of each chip.
pub(super) fn at_global_batch(
    config: &ModelConfig,
    (global_batch, tokens_per_step): (Option<u64>, Option<u64>),
    chips: u32,
) -> Result<ModelConfig> {
    let sequences = match (global_batch, tokens_per_step) {
        (Some(g), _) => Some(g),
        (None, Some(t)) if t % config.seq_len == 0 => Some(t / config.seq_len),
        (None, Some(t)) => {
            return Err(usage(format!(
                "--tokens-per-step {t}: not a whole number of {}'s {}-token sequences",
                config.name, config.seq_len
            )));
        }
        (None, None) => None,
    };
    let mut config = config.clone();
    if let Some(g) = sequences {
        if g == 0 {
            return Err(usage(
                "--global-batch 0: a step needs at least one sequence",
            ));
        }
        config.per_device_batch = g as f64 / f64::from(chips);
        if let Err((field, problem)) = config.validate() {
            return Err(usage(format!(
                "--global-batch {g} over {chips} chips: {field}: {problem}"
            )));
        }
    }
    Ok(config)
}

/// `config` under train's `--remat` and `--global-batch` on `chips`.
pub(super) fn with_model_flags(
    config: &ModelConfig,
    (remat, global_batch): (Option<&str>, Option<u64>),
    chips: u32,
) -> Result<ModelConfig> {
    let mut config = at_global_batch(config, (global_batch, None), chips)?;
    if let Some(name) = remat {
        config.remat = remat_of(&config, name)?;
    }
    Ok(config)
}

/// What `train --strategy auto` searched and chose.
pub(super) struct AutoChoice {
    /// Layouts in the space.
    pub(super) layouts: usize,
    /// Layouts modeled.
    pub(super) modeled: usize,
    /// The search's wall time, seconds.
    pub(super) seconds: f64,
    /// The chosen layout's flags.
    pub(super) flags: String,
    /// Whether it fits (when nothing does: the nearest to fitting).
    pub(super) fits: bool,
}

impl AutoChoice {
    /// The search in a report's JSON (`layout_search`).
    pub(super) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "layouts": self.layouts,
            "modeled": self.modeled,
            "seconds": self.seconds,
            "chosen": self.flags,
            "fits": self.fits,
        })
    }

    /// The search in a report's text.
    pub(super) fn line(&self) -> String {
        format!(
            "layout: --strategy auto chose {} ({} of {} layouts modeled in {}{})",
            self.flags,
            self.modeled,
            self.layouts,
            super::output::seconds(self.seconds),
            if self.fits {
                ""
            } else {
                "; none fits, this is the nearest to fitting"
            }
        )
    }
}

/// `--strategy auto` (`train --model --modeled-only`, `goodput --model`):
/// the fastest layout that fits among the strategies, meshes and prefetch
/// depths the flags in `given` leave open (the model's remat policy and
/// batch, the given data reduction, recovery and optimizer), modeled as
/// the explicit flags would model it; with nothing fitting, the nearest to
/// fitting. `given.strategy` is what the search chooses, so it is not
/// read.
pub(super) fn auto_step(
    given: &super::model_step::ModelLayout,
    config: &ModelConfig,
    topology: &Topology,
) -> Result<(optirs_tpu::step_model::ModelStep, AutoChoice)> {
    let mut space = SearchSpace::every(config);
    space.remat = vec![config.remat];
    space.data_reductions = vec![given.data_reduction.unwrap_or(DataReduction::AfterBackward)];
    space.recoveries = vec![given.recovery];
    if let Some(n) = given.prefetch {
        space.strategies = vec![Strategy::Fsdp];
        space.prefetch = vec![n];
    }
    let mesh = match given.mesh {
        Some(spec) => Some(super::model_step::mesh_flag(spec, topology)?),
        None => None,
    };
    if let Some(mesh) = &mesh {
        space.meshes = Some(vec![mesh.sizes()]);
    }
    let stages = mesh.as_ref().map_or(1, |m| m.sizes().stage);
    match (given.pipeline.microbatches, given.pipeline.repeats, stages) {
        (None, None, _) => {}
        (m, r, p) if p > 1 => {
            let m = m.unwrap_or(p);
            // The step model refuses what the stages cannot take.
            space.microbatches = Some(m);
            space.repeats = vec![r.unwrap_or(1)];
        }
        (m, r, _) => {
            let flag = m
                .map(|m| format!("--microbatches {m}"))
                .or(r.map(|r| format!("--repeats {r}")))
                .unwrap_or_default();
            return Err(usage(format!(
                "{flag} schedules a pipeline, and the mesh has no stage axis: give --mesh \
                 with one (…,stage=P)"
            )));
        }
    }
    let base = base_of(given.optimizer, topology)?;
    let request = PlanRequest {
        config,
        topology,
        space: &space,
        base,
        keep: 1,
        prune: true,
        ceiling: None,
    };
    let started = Instant::now();
    let searched = plan(&request);
    let seconds = started.elapsed().as_secs_f64();
    let Some(chosen) = searched.best().or(searched.rejected.first()) else {
        let why = searched
            .refusals
            .first()
            .map_or("the search space is empty".to_string(), |r| {
                r.reason.clone()
            });
        return Err(usage(format!(
            "--strategy auto: no layout of --model {} on {} could be modeled: {why}",
            config.name, topology.name
        )));
    };
    let layout = chosen.layout;
    let mesh_flag = layout.mesh_flag();
    let step = super::model_step::ModelLayout {
        strategy: layout.strategy,
        mesh: Some(&mesh_flag),
        prefetch: layout.prefetch,
        data_reduction: Some(layout.data_reduction),
        recovery: layout.recovery,
        optimizer: given.optimizer,
        record_spans: given.record_spans,
        pipeline: optirs_tpu::step_model::PipelineOptions {
            microbatches: layout.pipeline.map(|p| p.0),
            repeats: layout.pipeline.map(|p| p.1),
        },
    }
    .step(config, topology)?;
    Ok((
        step,
        AutoChoice {
            layouts: searched.layouts,
            modeled: searched.modeled,
            seconds,
            flags: layout.flags(),
            fits: chosen.fits,
        },
    ))
}

/// The space `args` narrow the search to, for `config` on `topology`.
fn space_of(args: &PlanArgs, config: &ModelConfig, topology: &Topology) -> Result<SearchSpace> {
    let mut space = SearchSpace::every(config);
    if !args.strategy.is_empty() {
        space.strategies = args.strategy.clone();
    }
    if let Some(spec) = &args.mesh {
        let mesh = super::model_step::mesh_flag(spec, topology)?;
        if args.no_stages && mesh.sizes().stage > 1 {
            return Err(usage(format!(
                "--no-stages leaves pipeline stages out, and --mesh {spec} has {} of them: give \
                 one or the other",
                mesh.sizes().stage
            )));
        }
        space.meshes = Some(vec![mesh.sizes()]);
    }
    if !args.remat.is_empty() {
        space.remat = args
            .remat
            .iter()
            .map(|name| remat_of(config, name))
            .collect::<Result<_>>()?;
    }
    if !args.prefetch.is_empty() {
        if !space.strategies.contains(&Strategy::Fsdp) {
            return Err(usage(
                "--prefetch sets fsdp's gathers ahead, and --strategy leaves fsdp out of the \
                 search",
            ));
        }
        space.prefetch = args.prefetch.clone();
    }
    if !args.data_reduction.is_empty() {
        space.data_reductions = args.data_reduction.clone();
    }
    space.stages = !args.no_stages;
    space.recoveries = match (&args.recovery[..], args.mtbf_hours) {
        ([], None) => vec![RecoveryPolicy::Rollback],
        ([], Some(_)) => {
            let mut all = vec![RecoveryPolicy::Rollback, RecoveryPolicy::Redundant];
            if topology.cubes.is_some_and(|c| c.spares > 0) {
                all.push(RecoveryPolicy::SpareCube);
            }
            all
        }
        (given, _) => given.to_vec(),
    };
    Ok(space)
}

/// The step options every layout shares, with `optimizer`'s update.
fn base_of(optimizer: &str, topology: &Topology) -> Result<ModelStepOptions> {
    Ok(ModelStepOptions {
        optimizer: super::model_step::update_cost(optimizer)?,
        ..ModelStepOptions::new(topology)
    })
}

/// One pod's search: the plan, and the goodput ranking with --mtbf-hours.
pub(super) struct PodSearch {
    pub(super) topology: Topology,
    pub(super) config: ModelConfig,
    pub(super) plan: Plan,
    pub(super) effective: Option<Vec<Effective>>,
    pub(super) seconds: f64,
}

fn search_pod(
    args: &PlanArgs,
    pod: &str,
    model: &ModelConfig,
    global: Option<u64>,
) -> Result<PodSearch> {
    let topology = load_topology(pod)?;
    let config = at_global_batch(
        model,
        (global.or(args.global_batch), args.tokens_per_step),
        topology.num_devices(),
    )?;
    config
        .global_batch(u64::from(topology.num_devices()))
        .map_err(|e| usage(format!("--model {} on {}: {e}", config.name, topology.name)))?;
    let space = space_of(args, &config, &topology)?;
    let request = PlanRequest {
        config: &config,
        topology: &topology,
        space: &space,
        base: base_of(&args.optimizer, &topology)?,
        keep: args.top,
        prune: !(args.exhaustive || args.svg.is_some()),
        ceiling: None,
    };
    let started = Instant::now();
    let (plan, effective) = match args.mtbf_hours {
        None => (plan(&request), None),
        Some(mtbf) => {
            let fleet = Fleet::from_topology(&topology)?;
            let params = optirs_tpu::model::parameter_count(&config).total();
            let mut goodput = GoodputConfig::new(params, mtbf, args.days.unwrap_or(30.0), 1.0);
            goodput.optimizer_slots = request.base.optimizer.slots;
            goodput.check(&fleet).map_err(|e| usage(e.to_string()))?;
            let (plan, ranked) = plan_by_goodput(&request, &fleet, &goodput)?;
            (plan, Some(ranked))
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    Ok(PodSearch {
        topology,
        config,
        plan,
        effective,
        seconds,
    })
}

/// `plan`.
pub fn plan_command(args: PlanArgs) -> Result<()> {
    if let Some(path) = &args.svg {
        super::output::check_new_file("--svg", path)?;
    }
    let model = load_model(&args.model)?;
    if args.pods.is_empty() {
        let search = search_pod(&args, &args.pod, &model, None)?;
        if let Some(path) = &args.svg {
            super::output::write_new("--svg", path, &super::plan_print::svg_of(&search))?;
        }
        return super::plan_print::print_search(&args, &search);
    }
    let first = load_topology(&args.pods[0])?;
    let global = match (args.global_batch, args.tokens_per_step) {
        (None, None) => Some(
            model
                .global_batch(u64::from(first.num_devices()))
                .map_err(|e| usage(format!("--model {} on {}: {e}", model.name, first.name)))?,
        ),
        _ => None,
    };
    let tokens = args.tokens.unwrap_or(0.0);
    let mut pods = Vec::new();
    let mut searches = Vec::new();
    for pod in &args.pods {
        let search = search_pod(&args, pod, &model, global)?;
        let best = match &search.effective {
            Some(ranked) => ranked.first().map(|e| {
                let mut c = e.candidate.clone();
                c.tokens_per_s_per_chip = e.effective_tokens_per_s_per_chip;
                c
            }),
            None => search.plan.best().cloned(),
        };
        pods.push(PodPlan::new(
            (
                search.topology.name.clone(),
                search.topology.generation.name().to_string(),
                search.topology.num_devices() as usize,
            ),
            best,
            tokens,
            args.price_per_chip_hour,
        ));
        searches.push(search);
    }
    super::plan_print::print_pods(&args, &by_time_to_train(pods), &searches)
}
