//! `plan`'s report: the ranked layouts as a table, each with the command
//! that models it, why the others lose, the faster layouts that do not
//! fit, the refusals; as JSON; the pods compared; the SVG picture.

use std::fmt::Write as _;

use anyhow::Result;
use optirs_tpu::plan::{Candidate, PodPlan};
use optirs_tpu::step_model::known_gap;
use optirs_tpu::svg::{ScatterPoint, scatter_svg};
use serde_json::{Value, json};

use super::output::{self, bytes, seconds};
use super::parse::usage;
use super::plan::{PlanArgs, PodSearch};

/// `optirs-tpu train POD --model M --modeled-only FLAGS`: the command that
/// models `c` (with the global batch when the user set it).
fn command(args: &PlanArgs, search: &PodSearch, c: &Candidate) -> String {
    let batch = match (
        args.global_batch,
        args.tokens_per_step,
        args.pods.is_empty(),
    ) {
        (None, None, true) => String::new(),
        _ => format!(
            " --global-batch {}",
            search
                .config
                .global_batch(u64::from(search.topology.num_devices()))
                .unwrap_or(0)
        ),
    };
    let pod = if args.pods.is_empty() {
        &args.pod
    } else {
        &search.topology.name
    };
    format!(
        "optirs-tpu train {pod} --model {} --modeled-only {}{batch}{}",
        args.model,
        c.layout.flags(),
        if args.optimizer == "adam" {
            String::new()
        } else {
            format!(" --optimizer {}", args.optimizer)
        }
    )
}

/// A ranked layout's goodput, when the ranking is by effective throughput.
fn goodput_of(search: &PodSearch, c: &Candidate) -> Option<f64> {
    search
        .effective
        .as_ref()?
        .iter()
        .find(|e| e.candidate.order == c.order)
        .map(|e| e.goodput)
}

/// What `c` loses to `best` by: the parts of the step that grew, and
/// under --mtbf-hours the goodput it gives up (a faster step can lose
/// there alone, by checkpointing or recovering slower).
fn loses_by(search: &PodSearch, c: &Candidate, best: &Candidate) -> String {
    let parts = [
        ("compute", c.compute_seconds - best.compute_seconds),
        (
            "exposed communication",
            (c.exposed_communication - c.bubble_seconds)
                - (best.exposed_communication - best.bubble_seconds),
        ),
        ("bubble", c.bubble_seconds - best.bubble_seconds),
    ];
    let mut grew: Vec<String> = parts
        .iter()
        .filter(|(_, d)| *d > 1e-9 * best.step_seconds.max(1e-12))
        .map(|(name, d)| format!("{name} +{}", seconds(*d)))
        .collect();
    if let (Some(mine), Some(theirs)) = (goodput_of(search, c), goodput_of(search, best))
        && theirs - mine > 1e-9
    {
        let points = (theirs - mine) * 100.0;
        grew.push(if points >= 0.01 {
            format!("goodput -{points:.2} points")
        } else {
            format!("goodput -{points:.1e} points")
        });
    }
    if grew.is_empty() {
        "ties".into()
    } else {
        grew.join(", ")
    }
}

fn headroom(margin: i64) -> String {
    if margin >= 0 {
        bytes(margin as u64)
    } else {
        format!("-{}", bytes(margin.unsigned_abs()))
    }
}

/// The first of the ranking: the fastest, or with --mtbf-hours the most
/// effective.
fn first_ranked(search: &PodSearch) -> Option<&Candidate> {
    match &search.effective {
        Some(ranked) => ranked.first().map(|e| &e.candidate),
        None => search.plan.best(),
    }
}

fn candidate_json(args: &PlanArgs, search: &PodSearch, c: &Candidate) -> Value {
    let best = first_ranked(search);
    json!({
        "tokens_per_s_per_chip": c.tokens_per_s_per_chip,
        "step_seconds": c.step_seconds,
        "mfu": c.mfu,
        "strategy": c.layout.strategy.name(),
        "mesh": c.mesh,
        "remat": c.layout.remat.name(),
        "prefetch": c.layout.prefetch,
        "data_reduction": c.layout.data_reduction.name(),
        "microbatches": c.layout.pipeline.map(|p| p.0),
        "repeats": c.layout.pipeline.map(|p| p.1),
        "recovery": c.layout.recovery.to_string(),
        "compute_seconds": c.compute_seconds,
        "exposed_communication": c.exposed_communication,
        "bubble_seconds": c.bubble_seconds,
        "hbm_bytes_per_device": c.hbm.total,
        "hbm_margin_bytes": c.hbm.margin,
        "hbm_by_kind": c.hbm,
        "fits_in_hbm": c.fits,
        "not_fitting": c.not_fitting,
        "loses_by": best.filter(|b| b.order != c.order).map(|b| loses_by(search, c, b)),
        "time_to_train_seconds": args.tokens.map(|n| {
            n / (c.tokens_per_s_per_chip * f64::from(search.topology.num_devices()))
        }),
        "command": command(args, search, c),
    })
}

fn search_json(args: &PlanArgs, s: &PodSearch) -> Value {
    let p = &s.plan;
    let chips = s.topology.num_devices();
    let ranked: Vec<Value> = match &s.effective {
        Some(ranked) => ranked
            .iter()
            .map(|e| {
                let mut v = candidate_json(args, s, &e.candidate);
                v["goodput"] = e.goodput.into();
                v["effective_tokens_per_s_per_chip"] = e.effective_tokens_per_s_per_chip.into();
                v["checkpoint_interval_seconds"] = e.checkpoint_interval_seconds.into();
                v
            })
            .collect(),
        None => p
            .ranked
            .iter()
            .map(|c| candidate_json(args, s, c))
            .collect(),
    };
    json!({
        "pod": s.topology.name,
        "chips": chips,
        "model": s.config.name,
        "global_batch": s.config.global_batch(u64::from(chips)).ok(),
        "tokens_per_device": s.config.tokens_per_device(),
        "ranked_by": if s.effective.is_some() { "effective_tokens_per_s_per_chip" } else { "tokens_per_s_per_chip" },
        "search": {
            "meshes": p.meshes,
            "layouts": p.layouts,
            "modeled": p.modeled,
            "pruned": p.pruned,
            "pruned_not_fitting": p.pruned_not_fitting,
            "refused": p.refused(),
            "seconds": s.seconds,
            "layouts_per_second": p.layouts as f64 / s.seconds.max(1e-9),
            "exhaustive": args.exhaustive || args.svg.is_some(),
        },
        "ranked": ranked,
        "rejected": p.rejected.iter().map(|c| candidate_json(args, s, c)).collect::<Vec<_>>(),
        "refusals": p.refusals.iter().map(|r| json!({
            "reason": r.reason, "layouts": r.layouts, "example": r.example.flags(),
        })).collect::<Vec<_>>(),
    })
}

/// What `plan` says when nothing fits: the nearest layout, by how much it
/// is over, and what would fit.
fn nothing_fits(args: &PlanArgs, s: &PodSearch) -> anyhow::Error {
    let p = &s.plan;
    let Some(near) = p.rejected.first() else {
        let why = p
            .refusals
            .first()
            .map_or("the search space is empty".to_string(), |r| {
                format!("{} (e.g. {})", r.reason, r.example.flags())
            });
        return usage(format!(
            "plan {} on {}: no layout could be modeled: {why}",
            s.config.name, s.topology.name
        ));
    };
    // Of the nearest layouts, the one whose activations and buffers leave
    // the most room says how many chips its weights and state would need.
    let split = |c: &Candidate| {
        let h = &c.hbm;
        let state = h.params + h.grads + h.state + h.master + h.redundant;
        (state, h.total.saturating_sub(state), h.capacity)
    };
    let roomiest = p.rejected.iter().min_by_key(|c| split(c).1).unwrap_or(near);
    let (state, rest, capacity) = split(roomiest);
    let chips = u64::from(s.topology.num_devices());
    let larger = if capacity > rest && state > 0 {
        let need = (chips as f64 * state as f64 / (capacity - rest) as f64).ceil() as u64;
        format!(
            "with `{}` its weights, gradients and state take {} a chip beside {} of activations \
             and buffers: a pod of at least {} chips would hold them",
            roomiest.layout.flags(),
            bytes(state),
            bytes(rest),
            need.next_power_of_two()
        )
    } else {
        format!(
            "even `{}` needs {} a chip for its activations and buffers alone, over a chip's {}: \
             a smaller per-device batch or a remat policy that saves less is needed first",
            roomiest.layout.flags(),
            bytes(rest),
            bytes(capacity)
        )
    };
    let remat = if args.remat.is_empty() {
        String::new()
    } else {
        "; the search was narrowed to --remat ".to_string()
            + &args.remat.join(",")
            + " (full remat saves the least)"
    };
    usage(format!(
        "plan {} on {}: nothing fits: of {} layouts modeled, the nearest to fitting is `{}` on \
         mesh {}, {} over ({}); {larger}{remat}",
        s.config.name,
        s.topology.name,
        p.modeled,
        near.layout.flags(),
        near.mesh,
        bytes(near.hbm.margin.unsigned_abs()),
        near.not_fitting.as_deref().unwrap_or("does not fit"),
    ))
}

/// `plan POD`'s report.
pub(super) fn print_search(args: &PlanArgs, s: &PodSearch) -> Result<()> {
    if s.plan.ranked.is_empty() {
        return Err(nothing_fits(args, s));
    }
    let gap = known_gap(&s.config)?;
    if args.json {
        let mut value = search_json(args, s);
        value["known_gap"] = json!(gap);
        return output::print_json(&value);
    }
    let mut text = search_text(args, s);
    if let Some(gap) = &gap {
        let _ = writeln!(text, "{}", gap.line());
    }
    output::print_text(&text)
}

/// The ranking as a table, each row with its command; the time to train
/// with --tokens.
fn ranked_rows(args: &PlanArgs, s: &PodSearch) -> String {
    let p = &s.plan;
    let chips = s.topology.num_devices();
    let mut out = String::new();
    let best = first_ranked(s);
    let rows: Vec<(&Candidate, Option<(f64, f64)>)> = match &s.effective {
        Some(ranked) => ranked
            .iter()
            .map(|e| {
                (
                    &e.candidate,
                    Some((e.goodput, e.effective_tokens_per_s_per_chip)),
                )
            })
            .collect(),
        None => p.ranked.iter().map(|c| (c, None)).collect(),
    };
    let _ = writeln!(
        out,
        "  #  tokens/s/chip  {}step          MFU      HBM left     layout",
        if s.effective.is_some() {
            "goodput  effective  "
        } else {
            ""
        }
    );
    for (i, (c, eff)) in rows.iter().enumerate() {
        let _ = writeln!(
            out,
            "{:>3}  {:<13}  {}{:<12}  {:>5.1} %  {:<11}  {} on {}, remat {}{}",
            i + 1,
            output::tokens_per_s(c.tokens_per_s_per_chip),
            eff.map_or(String::new(), |(g, e)| format!(
                "{:>5.1} %  {:<9}  ",
                g * 100.0,
                output::tokens_per_s(e)
            )),
            seconds(c.step_seconds),
            c.mfu * 100.0,
            headroom(c.hbm.margin),
            c.layout.strategy,
            c.mesh,
            c.layout.remat.name(),
            match best {
                Some(b) if b.order != c.order => format!(" (vs #1: {})", loses_by(s, c, b)),
                _ => String::new(),
            }
        );
        let _ = writeln!(out, "     {}", command(args, s, c));
    }
    if let Some(n) = args.tokens {
        let first = rows[0].0;
        let rate = rows[0].1.map_or(first.tokens_per_s_per_chip, |e| e.1);
        let _ = writeln!(
            out,
            "training {n:e} tokens on #1: {}",
            seconds(n / (rate * f64::from(chips)))
        );
    }
    out
}

fn search_text(args: &PlanArgs, s: &PodSearch) -> String {
    let p = &s.plan;
    let chips = s.topology.num_devices();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "plan {} on {} ({}), global batch {} ({} tokens a chip), {}",
        s.config.name,
        s.topology.name,
        output::plural(u64::from(chips), "chip", "chips"),
        s.config.global_batch(u64::from(chips)).unwrap_or(0),
        s.config.tokens_per_device(),
        args.optimizer
    );
    let _ = writeln!(
        out,
        "searched {} layouts on {} in {} ({:.0} layouts/s): {} modeled, {} pruned by their \
         passes' bound, {} whose state and activations alone overflow HBM, {} refused{}",
        p.layouts,
        output::plural(p.meshes as u64, "mesh", "meshes"),
        seconds(s.seconds),
        p.layouts as f64 / s.seconds.max(1e-9),
        p.modeled,
        p.pruned,
        p.pruned_not_fitting,
        p.refused(),
        if s.effective.is_some() {
            ", ranked by tokens/s/chip × goodput"
        } else {
            ""
        }
    );
    out += &ranked_rows(args, s);
    if !p.rejected.is_empty() {
        let _ = writeln!(out, "faster layouts that do not fit:");
        for c in &p.rejected {
            let _ = writeln!(
                out,
                "  {} tokens/s/chip, {} on {}, remat {}: {} at the step's peak of {} ({} of \
                 activations), {} over",
                output::tokens_per_s(c.tokens_per_s_per_chip),
                c.layout.strategy,
                c.mesh,
                c.layout.remat.name(),
                bytes(c.hbm.total),
                bytes(c.hbm.capacity),
                bytes(c.hbm.activations),
                bytes(c.hbm.margin.unsigned_abs())
            );
        }
    }
    for r in p.refusals.iter().take(3) {
        let _ = writeln!(out, "refused {} layouts: {}", r.layouts, r.reason);
    }
    out
}

/// `plan --pods`: each pod's best layout, by time to train.
pub(super) fn print_pods(args: &PlanArgs, pods: &[PodPlan], searches: &[PodSearch]) -> Result<()> {
    let search_of = |name: &str| searches.iter().find(|s| s.topology.name == name);
    // Every pod models the same model.
    let gap = match searches.first() {
        Some(s) => known_gap(&s.config)?,
        None => None,
    };
    if args.json {
        let rows: Vec<Value> = pods
            .iter()
            .map(|p| {
                let mut v = serde_json::to_value(p).unwrap_or(Value::Null);
                if let (Some(best), Some(s)) = (&p.best, search_of(&p.pod)) {
                    // The layout in the words of the ranking's rows
                    // (`rollback`, not the type's name).
                    v["best"] = candidate_json(args, s, best);
                    v["command"] = command(args, s, best).into();
                    v["search"] = search_json(args, s)["search"].clone();
                }
                v
            })
            .collect();
        return output::print_json(&json!({
            "model": args.model,
            "tokens": args.tokens,
            "price_per_chip_hour": args.price_per_chip_hour,
            "pods": rows,
            "known_gap": gap,
        }));
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} on {} pods, {:e} tokens, by time to train:",
        args.model,
        pods.len(),
        args.tokens.unwrap_or(0.0)
    );
    for (i, p) in pods.iter().enumerate() {
        match (&p.best, p.seconds_to_train, search_of(&p.pod)) {
            (Some(best), Some(t), Some(s)) => {
                let _ = writeln!(
                    out,
                    "{:>3}  {} ({} chips): {} ({:.1} days), {:.0} chip-hours{}, {} tokens/s/chip",
                    i + 1,
                    p.pod,
                    p.chips,
                    seconds(t),
                    t / 86_400.0,
                    p.chip_hours.unwrap_or(0.0),
                    p.cost.map_or(String::new(), |c| format!(", cost {c:.0}")),
                    output::tokens_per_s(best.tokens_per_s_per_chip)
                );
                let _ = writeln!(out, "     {}", command(args, s, best));
            }
            _ => {
                let why =
                    search_of(&p.pod).map_or(String::new(), |s| nothing_fits(args, s).to_string());
                let _ = writeln!(out, "  -  {} ({} chips): {why}", p.pod, p.chips);
            }
        }
    }
    if let Some(gap) = &gap {
        let _ = writeln!(out, "{}", gap.line());
    }
    output::print_text(&out)
}

/// Every modeled layout's throughput against its HBM headroom, with the
/// Pareto front of those that fit (no layout both faster and with more
/// headroom).
pub(super) fn svg_of(s: &PodSearch) -> String {
    let gib = (1u64 << 30) as f64;
    let points: Vec<ScatterPoint> = s
        .plan
        .points
        .iter()
        .map(|&(t, margin, fits)| ScatterPoint {
            x: margin as f64 / gib,
            y: t,
            kept: fits,
            label: format!(
                "{} tokens/s/chip, {} HBM left",
                output::tokens_per_s(t),
                headroom(margin)
            ),
        })
        .collect();
    let mut fitting: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| p.kept)
        .map(|p| (p.x, p.y))
        .collect();
    fitting.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.total_cmp(&a.1)));
    let mut front = Vec::new();
    let mut best = f64::NEG_INFINITY;
    for (x, y) in fitting {
        if y > best {
            front.push((x, y));
            best = y;
        }
    }
    front.reverse();
    scatter_svg(
        &format!(
            "plan {} on {}: {} layouts modeled",
            s.config.name, s.topology.name, s.plan.modeled
        ),
        ("HBM headroom at the step's peak, GiB", "tokens/s/chip"),
        &points,
        &front,
        [
            "fits",
            "does not fit",
            "Pareto front: no layout that fits is faster with more headroom",
        ],
    )
}
