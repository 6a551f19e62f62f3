//! `plan`'s search: pruned ≡ exhaustive, every step at least its bound,
//! deterministic, and never worse than a layout the user names.

use optirs_tpu::model::{ModelConfig, bundled};
use optirs_tpu::plan::{Plan, PlanRequest, SearchSpace, meshes, options_of, plan};
use optirs_tpu::sharding::Mesh;
use optirs_tpu::step_model::{
    ModelStepOptions, default_efficiency, hbm_floor, model_step, passes_lower_bound,
};
use optirs_tpu::topology::{Topology, load_preset, parse_topology};

fn search(config: &ModelConfig, topology: &Topology, keep: usize, prune: bool) -> Plan {
    let space = SearchSpace::every(config);
    plan(&PlanRequest {
        config,
        topology,
        space: &space,
        base: ModelStepOptions::new(topology),
        keep,
        prune,
        ceiling: None,
    })
}

fn two_slices() -> Topology {
    parse_topology(
        r#"Pod(name: "v5e-16x2", generation: "v5e", shape: "4x4", slices: 2)"#,
        "v5e-16x2.ron",
    )
    .unwrap()
}

/// The pods and models the exhaustive comparisons run on: a slice, a
/// multislice pod (data and stages over the DCN) and a mixture (the
/// expert axis).
fn cases() -> Vec<(ModelConfig, Topology)> {
    let mut small = bundled("llama2-7b").unwrap();
    small.layers = 8;
    let mut moe = bundled("mixtral-8x7b").unwrap();
    moe.layers = 4;
    vec![
        (small.clone(), load_preset("v5p-32").unwrap()),
        (small, two_slices()),
        (moe, load_preset("v5e-16").unwrap()),
    ]
}

#[test]
fn pruning_never_changes_the_ranking() {
    for (config, topology) in cases() {
        for keep in [1, 5] {
            let pruned = search(&config, &topology, keep, true);
            let all = search(&config, &topology, keep, false);
            let key = |p: &Plan| {
                p.ranked
                    .iter()
                    .map(|c| (c.layout, c.step_seconds))
                    .collect::<Vec<_>>()
            };
            assert!(
                !all.ranked.is_empty(),
                "{} on {}",
                config.name,
                topology.name
            );
            assert_eq!(
                key(&pruned),
                key(&all),
                "{} on {}",
                config.name,
                topology.name
            );
            assert_eq!(all.pruned + all.pruned_not_fitting, 0);
            assert_eq!(all.modeled + all.refused(), all.layouts);
            assert_eq!(
                pruned.modeled + pruned.pruned + pruned.pruned_not_fitting + pruned.refused(),
                pruned.layouts
            );
        }
    }
}

#[test]
fn every_step_is_at_least_its_passes_and_holds_its_hbm_floor() {
    for (config, topology) in cases() {
        let space = SearchSpace::every(&config);
        let mut base = ModelStepOptions::new(&topology);
        base.efficiency = Some(default_efficiency(&topology));
        let (mut checked, mut pipelined) = (0, 0);
        for (sizes, mesh) in meshes(&topology, &config, true) {
            for &remat in &space.remat {
                let config = ModelConfig {
                    remat,
                    ..config.clone()
                };
                for layout in space.variants(sizes, remat, config.layers) {
                    let options = options_of(&base, &mesh, &layout);
                    let Ok(step) = model_step(&config, &topology, &options) else {
                        continue;
                    };
                    // The bound as the search takes it: the mesh and the
                    // schedule, every other option the base's.
                    let at = ModelStepOptions {
                        mesh: mesh.clone(),
                        pipeline: options.pipeline,
                        ..base.clone()
                    };
                    let bound = passes_lower_bound(&config, &topology, &at).unwrap();
                    assert!(
                        bound.is_some(),
                        "{layout}: a layout the step model takes has a bound"
                    );
                    if step.pipeline.is_some() {
                        pipelined += 1;
                    }
                    let floor = hbm_floor(&config, &topology, &options).unwrap();
                    if let Some(bound) = bound {
                        assert!(
                            step.step_seconds >= bound * (1.0 - 1e-12),
                            "{layout}: step {} under its passes' {bound}",
                            step.step_seconds
                        );
                    }
                    if let Some(floor) = floor {
                        assert!(
                            step.hbm.total >= floor,
                            "{layout}: {} < {floor}",
                            step.hbm.total
                        );
                    }
                    checked += 1;
                }
            }
        }
        assert!(checked > 50, "{checked}");
        assert!(pipelined > 10, "{}: {pipelined} pipelines", topology.name);
    }
}

#[test]
fn the_search_is_deterministic() {
    let (config, topology) = cases().swap_remove(1);
    let a = search(&config, &topology, 5, true);
    let b = search(&config, &topology, 5, true);
    assert_eq!(a, b);
}

#[test]
fn the_best_is_at_least_any_layout_named_by_hand() {
    // The default layout and MaxText's usual ones, on a slice and over
    // slices: none beats the search.
    for (config, topology) in cases() {
        let best = search(&config, &topology, 1, true);
        let best = best.best().unwrap();
        for spec in ["fsdp=-1", "data=-1", "fsdp=-1,tensor=4"] {
            let Ok(mesh) = Mesh::parse_split(spec, &topology) else {
                continue;
            };
            for strategy in optirs_tpu::sharding::Strategy::ALL {
                let options = ModelStepOptions {
                    strategy,
                    mesh: mesh.clone(),
                    efficiency: Some(default_efficiency(&topology)),
                    ..ModelStepOptions::new(&topology)
                };
                let Ok(step) = model_step(&config, &topology, &options) else {
                    continue;
                };
                if step.fits_in_hbm {
                    assert!(
                        best.step_seconds <= step.step_seconds,
                        "{strategy} on {spec}: {} < best {}",
                        step.step_seconds,
                        best.step_seconds
                    );
                }
            }
        }
    }
}

#[test]
fn nothing_fits_leaves_the_nearest_layouts() {
    let config = bundled("gpt3-175b").unwrap();
    let topology = load_preset("v5e-4").unwrap();
    let p = search(&config, &topology, 3, true);
    assert!(p.ranked.is_empty());
    assert!(!p.rejected.is_empty());
    let margins: Vec<i64> = p.rejected.iter().map(|c| c.hbm.margin).collect();
    assert!(margins.windows(2).all(|w| w[0] >= w[1]), "{margins:?}");
    assert!(margins[0] < 0);
}

#[test]
fn every_published_run_s_best_layout_is_at_least_its_own() {
    let published = optirs_tpu::model::maxtext_published().unwrap();
    let rows = optirs_tpu::plan::rank_published(&published, false).unwrap();
    assert!(rows.len() >= 10, "{}", rows.len());
    for r in &rows {
        assert!(
            r.best.step_seconds <= r.published_step_seconds,
            "{} {} on {}x{}: best {} slower than the published {}",
            r.table,
            r.model,
            r.slices,
            r.accelerator,
            r.best.step_seconds,
            r.published_step_seconds
        );
    }
}

/// The table docs/validation.md shows (release, about a minute):
/// `cargo test --release --test plan -- --ignored --nocapture published_ranks`.
#[test]
#[ignore]
fn published_ranks() {
    let published = optirs_tpu::model::maxtext_published().unwrap();
    let rows = optirs_tpu::plan::rank_published(&published, true).unwrap();
    println!(
        "| run | pod | published layout, modeled | rank of | best layout found | best | why |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} {} | {}×{} | {:.3} s on {} | {} of {} | `{}` | {:.3} s ({:+.1} %) | {} |",
            r.table,
            r.model,
            r.slices,
            r.accelerator,
            r.published_step_seconds,
            r.published_mesh,
            r.rank.unwrap(),
            r.layouts,
            r.best.layout.flags(),
            r.best.step_seconds,
            (r.best.step_seconds / r.published_step_seconds - 1.0) * 100.0,
            r.why()
        );
    }
}
