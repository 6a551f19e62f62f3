//! What a search covers: every mesh a pod admits on whole torus axes and
//! slices, and every layout of a model on it (strategy, remat policy, fsdp
//! prefetch, the data axis's reduction schedule, a pipeline's microbatches
//! and repeats), narrowed by what the user fixes.

use std::collections::BTreeSet;
use std::fmt;

use serde::Serialize;

use crate::cost_model::DataReduction;
use crate::model::{ModelConfig, RematPolicy};
use crate::sharding::mesh::physical_axes;
use crate::sharding::{Mesh, MeshAxisName, MeshSizes, PhysicalAxis, RecoveryPolicy, Strategy};
use crate::topology::Topology;

/// One way to run a model on a pod: everything a modeled step takes
/// besides the model and the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// ZeRO-1, ZeRO-2 or fsdp over the mesh's fsdp (and expert) axes.
    pub strategy: Strategy,
    /// The mesh's axis sizes (laid out as `--mesh` lays them out).
    pub mesh: MeshSizes,
    /// The remat policy.
    pub remat: RematPolicy,
    /// fsdp's gathered buckets ahead of the one in use (`None` under the
    /// other strategies, which gather nothing).
    pub prefetch: Option<usize>,
    /// When the gradients' all-reduce over `data` runs.
    pub data_reduction: DataReduction,
    /// A pipeline's microbatches and repeats (`None` without a stage axis).
    pub pipeline: Option<(usize, usize)>,
    /// What a failed step costs: its per-step costs are in the step, its
    /// recoveries in the goodput.
    pub recovery: RecoveryPolicy,
}

impl Layout {
    /// The mesh as `--mesh` takes it: every axis above 1 (`fsdp=256`).
    pub fn mesh_flag(&self) -> String {
        let shown: Vec<String> = MeshAxisName::ALL
            .iter()
            .filter(|&&a| self.mesh.of(a) > 1)
            .map(|&a| format!("{a}={}", self.mesh.of(a)))
            .collect();
        if shown.is_empty() {
            "data=1".into()
        } else {
            shown.join(",")
        }
    }

    /// The `train` flags that model this layout (besides the pod and the
    /// model): `--strategy fsdp --mesh fsdp=256 --remat full …`.
    pub fn flags(&self) -> String {
        let mut flags = format!(
            "--strategy {} --mesh {} --remat {}",
            self.strategy,
            self.mesh_flag(),
            self.remat.name()
        );
        if let Some(n) = self.prefetch {
            flags += &format!(" --prefetch {n}");
        }
        if self.mesh.data > 1 && self.data_reduction != DataReduction::AfterBackward {
            flags += &format!(" --data-reduction {}", self.data_reduction.name());
        }
        if let Some((m, r)) = self.pipeline {
            flags += &format!(" --microbatches {m} --repeats {r}");
        }
        if self.recovery != RecoveryPolicy::Rollback {
            flags += &format!(" --recovery {}", self.recovery);
        }
        flags
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.flags())
    }
}

/// Which layouts a search covers. Every field narrows: a list holds the
/// values searched, and what the user fixes on the command line is a list
/// of one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchSpace {
    /// The strategies.
    pub strategies: Vec<Strategy>,
    /// The meshes (`None`: every mesh the pod admits, [`meshes`]).
    pub meshes: Option<Vec<MeshSizes>>,
    /// The remat policies.
    pub remat: Vec<RematPolicy>,
    /// fsdp's prefetch depths.
    pub prefetch: Vec<usize>,
    /// The data axis's reduction schedules (a mesh without a data axis
    /// takes the first: there is nothing to reduce).
    pub data_reductions: Vec<DataReduction>,
    /// A pipeline's microbatches as multiples of its stages (MaxText's
    /// `num_pipeline_microbatches` must be one).
    pub microbatches_per_stage: Vec<usize>,
    /// A pipeline's microbatches when fixed (`--microbatches M`), in place
    /// of the multiples of its stages.
    pub microbatches: Option<usize>,
    /// A pipeline's repeats (circular when above 1).
    pub repeats: Vec<usize>,
    /// Whether the `stage` axis is searched (it multiplies the space by
    /// the pipeline's options).
    pub stages: bool,
    /// The recovery policies (rollback alone unless goodput ranks them).
    pub recoveries: Vec<RecoveryPolicy>,
}

impl SearchSpace {
    /// Every layout of `config`: the three strategies, every named remat
    /// policy (and the model's own custom one), prefetch 1 and 2, both
    /// reduction schedules, pipelines of 1, 2 and 4 microbatches a stage
    /// and 1 or 2 repeats.
    pub fn every(config: &ModelConfig) -> SearchSpace {
        let mut remat = RematPolicy::ALL.to_vec();
        if matches!(config.remat, RematPolicy::Custom { .. }) {
            remat.insert(0, config.remat);
        }
        SearchSpace {
            strategies: Strategy::ALL.to_vec(),
            meshes: None,
            remat,
            prefetch: vec![1, 2],
            data_reductions: DataReduction::ALL.to_vec(),
            microbatches_per_stage: vec![1, 2, 4],
            microbatches: None,
            repeats: vec![1, 2],
            stages: true,
            recoveries: vec![RecoveryPolicy::Rollback],
        }
    }

    /// The layouts of one mesh and remat policy, in a fixed order: what a
    /// search models together once their passes' bound admits them.
    pub fn variants(&self, mesh: MeshSizes, remat: RematPolicy, layers: u64) -> Vec<Layout> {
        let reductions: &[DataReduction] = if mesh.data > 1 {
            &self.data_reductions
        } else {
            &self.data_reductions[..1.min(self.data_reductions.len())]
        };
        let pipelines: Vec<Option<(usize, usize)>> = if mesh.stage > 1 {
            let mut p = Vec::new();
            for &r in &self.repeats {
                if !layers.is_multiple_of((mesh.stage * r) as u64) {
                    continue;
                }
                match self.microbatches {
                    Some(m) => p.push(Some((m, r))),
                    None => p.extend(
                        self.microbatches_per_stage
                            .iter()
                            .map(|&k| Some((k * mesh.stage, r))),
                    ),
                }
            }
            p
        } else {
            vec![None]
        };
        let mut out = Vec::new();
        for &strategy in &self.strategies {
            let prefetches: Vec<Option<usize>> = if strategy == Strategy::Fsdp {
                self.prefetch.iter().map(|&n| Some(n)).collect()
            } else {
                vec![None]
            };
            for &prefetch in &prefetches {
                for &data_reduction in reductions {
                    for &pipeline in &pipelines {
                        for &recovery in &self.recoveries {
                            out.push(Layout {
                                strategy,
                                mesh,
                                remat,
                                prefetch,
                                data_reduction,
                                pipeline,
                                recovery,
                            });
                        }
                    }
                }
            }
        }
        out
    }
}

/// Every mesh `topology` admits for `config`, laid out as `--mesh` lays it
/// out: each torus axis of extent above 1 whole to one mesh axis, the
/// slices to one axis or shared by several (MaxText's `dcn_*_parallelism`
/// product). `expert` only for a mixture of experts, `stage` only when
/// `stages`. Sorted by the sizes in [`MeshAxisName::ALL`] order.
pub fn meshes(topology: &Topology, config: &ModelConfig, stages: bool) -> Vec<(MeshSizes, Mesh)> {
    let allowed: Vec<usize> = MeshAxisName::ALL
        .iter()
        .enumerate()
        .filter(|&(_, &axis)| match axis {
            MeshAxisName::Expert => config.moe.is_some(),
            MeshAxisName::Stage => stages && config.layers > 1,
            _ => true,
        })
        .map(|(i, _)| i)
        .collect();
    let phys = physical_axes(topology);
    let torus: Vec<usize> = phys
        .iter()
        .filter(|(p, _)| *p != PhysicalAxis::Slices)
        .map(|&(_, n)| n)
        .collect();
    let slices = topology.slices.max(1) as usize;
    let slice_splits = factorizations(slices, allowed.len());
    let mut seen = BTreeSet::new();
    let combos = allowed.len().pow(torus.len() as u32);
    for code in 0..combos {
        let mut sizes = [1usize; 5];
        let mut c = code;
        for &extent in &torus {
            sizes[allowed[c % allowed.len()]] *= extent;
            c /= allowed.len();
        }
        for split in &slice_splits {
            let mut with = sizes;
            for (k, &f) in split.iter().enumerate() {
                with[allowed[k]] *= f;
            }
            seen.insert(with);
        }
    }
    seen.into_iter()
        .filter_map(|sizes| {
            let sizes = MeshSizes::from_order(sizes);
            sizes.lay_out_split(topology).ok().map(|mesh| (sizes, mesh))
        })
        .collect()
}

/// Every ordered way to write `n` as a product of `parts` factors.
fn factorizations(n: usize, parts: usize) -> Vec<Vec<usize>> {
    if parts == 0 {
        return if n == 1 { vec![vec![]] } else { vec![] };
    }
    let mut out = Vec::new();
    for f in (1..=n).filter(|f| n.is_multiple_of(*f)) {
        for mut rest in factorizations(n / f, parts - 1) {
            rest.insert(0, f);
            out.push(rest);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::bundled;
    use crate::topology::load_preset;

    #[test]
    fn factorizations_multiply_back_and_are_all_there() {
        let f = factorizations(12, 3);
        assert!(f.iter().all(|v| v.iter().product::<usize>() == 12));
        // Ordered factorizations of 2²·3 into 3 parts: C(4,2)·C(3,2) = 18.
        assert_eq!(f.len(), 18);
        assert_eq!(factorizations(1, 4), vec![vec![1, 1, 1, 1]]);
    }

    #[test]
    fn a_slice_s_meshes_put_each_torus_axis_whole_on_one_mesh_axis() {
        let topology = load_preset("v5p-256").unwrap(); // 4x4x8
        let config = bundled("llama2-7b").unwrap();
        let all = meshes(&topology, &config, true);
        // Four axes (no experts) for three torus axes: 4³ assignments,
        // fewer distinct sizes.
        assert!(all.len() > 10 && all.len() <= 64, "{}", all.len());
        for (sizes, mesh) in &all {
            assert_eq!(mesh.devices(), 128);
            assert_eq!(sizes.expert, 1);
            for axis in MeshAxisName::ALL {
                assert!(
                    [1, 4, 8, 16, 32, 128].contains(&sizes.of(axis)),
                    "{sizes:?}"
                );
            }
        }
    }

    #[test]
    fn slices_may_be_shared_and_experts_appear_for_a_mixture() {
        let topology = crate::topology::parse_topology(
            r#"Pod(name: "x", generation: "v5e", shape: "4x4", slices: 4)"#,
            "x.ron",
        )
        .unwrap();
        let config = bundled("mixtral-8x7b").unwrap();
        let all = meshes(&topology, &config, true);
        assert!(all.iter().any(|(s, _)| s.data == 2 && s.stage == 2));
        assert!(all.iter().any(|(s, _)| s.expert > 1));
    }
}
