//! [`CompileReport`]: what a compilation did, as JSON (`serde`), as text
//! tables (`Display`) and as a Graphviz graph with fusion groups ([`CompileReport::to_dot`]).

use std::fmt::{self, Write as _};
use std::sync::Arc;

use bevy_ecs::entity::EntityHashMap;
use bevy_ecs::prelude::*;
use serde::Serialize;
use smallvec::SmallVec;

use super::cost::OpCost;
use super::executable::Executable;
use super::graph::{
    Node, NodeName, Operands, Output, ProgramOutputs, ValueType, node_label, program_name,
    program_nodes,
};
use super::passes::PassRecord;
use super::passes::cost_analysis::{KernelCost, kernel_cost};
use super::passes::fusion::{FusionRefusal, FusionRefusals, InKernel, Kernel, ProgramKernels};
use super::passes::memory_plan::{Buffer, MemoryPlan};
use super::types::TensorType;

/// A row of the kernel table.
#[derive(Debug, Clone)]
pub struct KernelRow {
    /// Kernel name in the executable.
    pub name: String,
    /// Ops in the kernel.
    pub ops: usize,
    /// Inputs read (each once).
    pub inputs: usize,
    /// Outputs written.
    pub outputs: usize,
    /// The ops, in order (abbreviated).
    pub summary: String,
    /// The loop shape of a fused loop.
    pub loop_shape: Option<Vec<usize>>,
}

/// A row of the buffer table.
#[derive(Debug, Clone)]
pub struct BufferRow {
    /// The value's label.
    pub value: String,
    /// Offset in the heap.
    pub offset: usize,
    /// Aligned size.
    pub size: usize,
    /// Live range (inclusive steps).
    pub live: (u32, u32),
    /// Reuses an input in place.
    pub in_place: bool,
}

/// One kernel's cost: `{name, flops, transcendentals, bytes_read,
/// bytes_written, arithmetic_intensity}` (flops per byte accessed; `null`
/// for a kernel that accesses no bytes).
#[derive(Debug, Clone, Serialize)]
pub struct KernelCostRow {
    /// Kernel name in the executable.
    pub name: String,
    /// The kernel's cost (a fusion's bytes cross its boundary only).
    #[serde(flatten)]
    pub cost: OpCost,
    /// Flops per byte read or written.
    pub arithmetic_intensity: Option<f64>,
}

/// The program's cost: `{flops, transcendentals, bytes_read, bytes_written,
/// kernels: [..]}`, the totals being the sum of the kernels.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CostReport {
    /// Sum over kernels.
    #[serde(flatten)]
    pub totals: OpCost,
    /// One row per kernel, in execution order.
    pub kernels: Vec<KernelCostRow>,
}

/// The result of compiling one program. Serializes to exactly
/// `{passes: [{name, changed, nodes_before, nodes_after, micros}], kernels,
/// fusion_refusals: [{reason, producer, consumer}], memory: {peak_bytes,
/// lower_bound_bytes, fragmentation_bytes}, cost: {flops, transcendentals,
/// bytes_read, bytes_written, kernels: [{name, flops, transcendentals,
/// bytes_read, bytes_written, arithmetic_intensity}]}}`.
#[derive(Debug, Clone, Serialize)]
pub struct CompileReport {
    /// Program name.
    #[serde(skip)]
    pub program: String,
    /// One row per pass, in pipeline order.
    pub passes: Vec<PassRecord>,
    /// Number of kernels in the executable.
    pub kernels: usize,
    /// Every fusion refusal with its reason.
    pub fusion_refusals: Vec<FusionRefusal>,
    /// Memory plan statistics.
    pub memory: MemoryPlan,
    /// Flops, transcendentals and bytes (XLA's `HloCostAnalysis` rules).
    pub cost: CostReport,
    /// Kernel table.
    #[serde(skip)]
    pub kernel_rows: Vec<KernelRow>,
    /// Buffer table.
    #[serde(skip)]
    pub buffers: Vec<BufferRow>,
    /// The executable.
    #[serde(skip)]
    pub executable: Arc<Executable>,
    #[serde(skip)]
    graph: GraphSnapshot,
}

impl CompileReport {
    /// Collects the report of a compiled `program`.
    pub(crate) fn collect(
        world: &World,
        program: Entity,
        passes: Vec<PassRecord>,
        executable: Arc<Executable>,
    ) -> Self {
        let kernels: Vec<Entity> = world
            .get::<ProgramKernels>(program)
            .map(|k| k.0.clone())
            .unwrap_or_default();
        let cost = collect_cost(world, &kernels, &executable);
        let kernel_rows = kernels
            .iter()
            .zip(&executable.kernels)
            .map(|(&k, lowered)| {
                let kernel = world.get::<Kernel>(k).expect("kernel");
                let mut names: Vec<&str> = kernel
                    .members
                    .iter()
                    .filter_map(|m| world.get::<Node>(*m))
                    .map(|n| n.op.name())
                    .collect();
                let more = names.len().saturating_sub(8);
                names.truncate(8);
                KernelRow {
                    name: lowered.name.clone(),
                    ops: kernel.members.len(),
                    inputs: kernel.inputs.len(),
                    outputs: kernel.outputs.len(),
                    summary: if more > 0 {
                        format!("{}, … (+{more})", names.join(", "))
                    } else {
                        names.join(", ")
                    },
                    loop_shape: lowered.loop_shape.clone(),
                }
            })
            .collect();
        let memory = world
            .get::<MemoryPlan>(program)
            .cloned()
            .unwrap_or_default();
        let buffers = memory
            .buffers
            .iter()
            .filter_map(|&b| world.get::<Buffer>(b))
            .map(|b| BufferRow {
                value: node_label(world, b.value),
                offset: b.offset,
                size: b.size,
                live: (b.start, b.end),
                in_place: b.in_place,
            })
            .collect();
        CompileReport {
            program: program_name(world, program),
            passes,
            kernels: kernels.len(),
            fusion_refusals: world
                .get::<FusionRefusals>(program)
                .map(|r| r.0.clone())
                .unwrap_or_default(),
            memory,
            cost,
            kernel_rows,
            buffers,
            executable,
            graph: GraphSnapshot::capture(world, program),
        }
    }

    /// The optimized graph in Graphviz `dot` syntax, one cluster per fused
    /// kernel, declared outputs in bold.
    pub fn to_dot(&self) -> String {
        self.graph.render()
    }

    /// The optimized graph as SVG, fused kernels as coloured groups.
    pub fn to_svg(&self) -> String {
        crate::svg::graph_svg(&self.graph.view())
    }

    /// The memory plan as SVG: buffers over time × offset.
    pub fn to_memory_svg(&self) -> String {
        let buffers: Vec<crate::svg::MemoryBuffer> = self
            .buffers
            .iter()
            .map(|b| crate::svg::MemoryBuffer {
                label: b.value.clone(),
                offset: b.offset,
                size: b.size,
                live: b.live,
            })
            .collect();
        crate::svg::memory_svg(
            &self.program,
            &buffers,
            self.memory.peak_bytes,
            self.memory.lower_bound_bytes,
        )
    }

    /// The report as one JSON object.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}

/// The cost rows of a compiled program: each kernel's [`KernelCost`], or
/// its cost computed from the graph when the component is absent (a kernel
/// edited after compiling). A kernel that cannot be costed (a member without
/// a type) is left out; the totals are the sum of the rows shown.
fn collect_cost(world: &World, kernels: &[Entity], executable: &Executable) -> CostReport {
    let rows: Vec<KernelCostRow> = kernels
        .iter()
        .zip(&executable.kernels)
        .filter_map(|(&k, lowered)| {
            let cost = match world.get::<KernelCost>(k) {
                Some(c) => c.0,
                None => kernel_cost(world, world.get::<Kernel>(k)?).ok()?,
            };
            Some(KernelCostRow {
                name: lowered.name.clone(),
                cost,
                arithmetic_intensity: cost.arithmetic_intensity(),
            })
        })
        .collect();
    CostReport {
        totals: rows.iter().map(|r| r.cost).sum(),
        kernels: rows,
    }
}

fn dot_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// One node of the graph snapshot kept for [`CompileReport::to_dot`].
#[derive(Debug, Clone)]
struct SnapshotNode {
    name: String,
    ty: Option<TensorType>,
    operands: SmallVec<[u32; 4]>,
    /// Index of its fused kernel (kernels of one node are not clusters).
    cluster: Option<u32>,
    output: bool,
}

/// The optimized graph, detached from the world, rendered on demand.
#[derive(Debug, Clone, Default)]
struct GraphSnapshot {
    name: String,
    nodes: Vec<SnapshotNode>,
    outputs: Vec<u32>,
}

impl GraphSnapshot {
    fn capture(world: &World, program: Entity) -> Self {
        let nodes = program_nodes(world, program);
        let index: EntityHashMap<u32> = nodes
            .iter()
            .enumerate()
            .map(|(i, &e)| (e, i as u32))
            .collect();
        let mut clusters: EntityHashMap<u32> = EntityHashMap::default();
        let snapshot_nodes = nodes
            .iter()
            .map(|&e| {
                let cluster = world
                    .get::<InKernel>(e)
                    .filter(|k| {
                        world
                            .get::<Kernel>(k.0)
                            .is_some_and(|k| k.members.len() > 1)
                    })
                    .map(|k| {
                        let next = clusters.len() as u32;
                        *clusters.entry(k.0).or_insert(next)
                    });
                SnapshotNode {
                    name: world
                        .get::<NodeName>(e)
                        .map_or_else(|| format!("{e}"), |n| n.0.clone()),
                    ty: world.get::<ValueType>(e).map(|t| t.0.clone()),
                    operands: world
                        .get::<Operands>(e)
                        .map(|o| o.0.iter().filter_map(|x| index.get(x).copied()).collect())
                        .unwrap_or_default(),
                    cluster,
                    output: world.get::<Output>(e).is_some(),
                }
            })
            .collect();
        let outputs = world
            .get::<ProgramOutputs>(program)
            .map(|o| o.0.iter().filter_map(|x| index.get(x).copied()).collect())
            .unwrap_or_default();
        GraphSnapshot {
            name: program_name(world, program),
            nodes: snapshot_nodes,
            outputs,
        }
    }

    fn view(&self) -> crate::svg::GraphView {
        crate::svg::GraphView {
            name: self.name.clone(),
            nodes: self
                .nodes
                .iter()
                .map(|n| crate::svg::GraphViewNode {
                    label: match &n.ty {
                        Some(t) => format!("%{} ({t})", n.name),
                        None => format!("%{}", n.name),
                    },
                    operands: n.operands.to_vec(),
                    cluster: n.cluster,
                    output: n.output,
                })
                .collect(),
        }
    }

    fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "digraph \"{}\" {{\n  rankdir=TB;\n  node [shape=box, fontname=monospace];",
            dot_escape(&self.name)
        );
        let node_line = |out: &mut String, i: usize, indent: &str| {
            let n = &self.nodes[i];
            let label = match &n.ty {
                Some(t) => format!("%{} ({t})", n.name),
                None => format!("%{}", n.name),
            };
            let style = if n.output { ", style=bold" } else { "" };
            let _ = writeln!(
                out,
                "{indent}n{i} [label=\"{}\"{style}];",
                dot_escape(&label)
            );
        };
        let mut by_cluster: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
        for (i, n) in self.nodes.iter().enumerate() {
            match n.cluster {
                Some(c) => by_cluster.entry(c).or_default().push(i),
                None => node_line(&mut out, i, "  "),
            }
        }
        for (c, members) in &by_cluster {
            let _ = writeln!(
                out,
                "  subgraph cluster_{c} {{\n    label=\"fusion\"; style=filled; color=lightgrey;"
            );
            for &i in members {
                node_line(&mut out, i, "    ");
            }
            out.push_str("  }\n");
        }
        for (i, n) in self.nodes.iter().enumerate() {
            for (k, &o) in n.operands.iter().enumerate() {
                let _ = writeln!(out, "  n{o} -> n{i} [label=\"{k}\"];");
            }
        }
        for (k, &o) in self.outputs.iter().enumerate() {
            let _ = writeln!(
                out,
                "  out{k} [shape=plaintext, label=\"output {k}\"];\n  n{o} -> out{k};"
            );
        }
        out.push_str("}\n");
        out
    }
}

impl fmt::Display for CompileReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "program `{}`", self.program)?;
        writeln!(f, "\npasses")?;
        writeln!(
            f,
            "  {:<22} {:>7} {:>15} {:>10}  note",
            "name", "changed", "nodes", "µs"
        )?;
        for p in &self.passes {
            let runs = if p.runs > 1 {
                format!(" ({} runs)", p.runs)
            } else {
                String::new()
            };
            writeln!(
                f,
                "  {:<22} {:>7} {:>6} → {:<6} {:>10}  {}{}",
                p.name,
                if p.changed { "yes" } else { "no" },
                p.nodes_before,
                p.nodes_after,
                p.micros,
                p.note.as_deref().unwrap_or(""),
                runs
            )?;
        }
        writeln!(f, "\nkernels: {}", self.kernels)?;
        for k in &self.kernel_rows {
            let lp = k
                .loop_shape
                .as_ref()
                .map_or_else(String::new, |s| format!("  (loop over {s:?})"));
            writeln!(
                f,
                "  {:<16} {:>5} ops {:>3} in {:>3} out  {}{lp}",
                k.name, k.ops, k.inputs, k.outputs, k.summary
            )?;
        }
        let c = &self.cost.totals;
        writeln!(
            f,
            "\ncost: {} flops, {} transcendentals, {} bytes read, {} bytes written{}",
            c.flops,
            c.transcendentals,
            c.bytes_read,
            c.bytes_written,
            c.arithmetic_intensity()
                .map_or_else(String::new, |i| format!(" ({i:.3} flops/byte)"))
        )?;
        writeln!(f, "\nfusion refusals: {}", self.fusion_refusals.len())?;
        for r in &self.fusion_refusals {
            writeln!(f, "  {} → {}: {}", r.producer, r.consumer, r.reason)?;
        }
        let m = &self.memory;
        writeln!(f, "\nmemory plan")?;
        writeln!(f, "  peak        {:>12} bytes", m.peak_bytes)?;
        writeln!(f, "  lower bound {:>12} bytes", m.lower_bound_bytes)?;
        writeln!(f, "  fragmentation {:>10} bytes", m.fragmentation_bytes)?;
        writeln!(
            f,
            "  buffers {} ({} reuse an input in place)",
            self.buffers.len(),
            m.in_place
        )?;
        for b in self.buffers.iter().take(32) {
            writeln!(
                f,
                "    {:>10} +{:<10} live [{}, {}]{}  {}",
                b.offset,
                b.size,
                b.live.0,
                b.live.1,
                if b.in_place { " in place" } else { "" },
                b.value
            )?;
        }
        if self.buffers.len() > 32 {
            writeln!(f, "    … {} more", self.buffers.len() - 32)?;
        }
        Ok(())
    }
}
