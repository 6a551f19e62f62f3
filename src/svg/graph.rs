//! A compiled graph as SVG: nodes in layers by longest path from the
//! inputs, operand edges as arrows, each fused kernel's nodes filled with
//! its colour inside a dashed box of the same colour, declared outputs
//! outlined in bold. Unfused nodes are white.

use super::{escape, open, palette};
use std::collections::BTreeSet;
use std::fmt::Write;

/// One node of a graph to draw.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphViewNode {
    /// Its label (`%add.3 (f32[8])`).
    pub label: String,
    /// Indices of its operands, in order.
    pub operands: Vec<u32>,
    /// Its fused kernel (kernels of one node are not groups).
    pub cluster: Option<u32>,
    /// Whether it is a declared output.
    pub output: bool,
}

/// A graph to draw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GraphView {
    /// The program's name.
    pub name: String,
    /// Nodes; operands refer to indices here.
    pub nodes: Vec<GraphViewNode>,
}

const NODE_H: f64 = 24.0;
const LAYER_GAP: f64 = 56.0;
const NODE_GAP: f64 = 16.0;
const CHAR_W: f64 = 6.6;
const MARGIN: f64 = 24.0;
const HEADER: f64 = 44.0;

/// Longest path from a node without operands, per node (operands that
/// point forward or at missing nodes are ignored, so any input terminates).
fn layers(view: &GraphView) -> Vec<usize> {
    let n = view.nodes.len();
    let mut layer = vec![0usize; n];
    // Relax n times at most: enough for any DAG, bounded for bad input.
    for _ in 0..n.max(1) {
        let mut changed = false;
        for (i, node) in view.nodes.iter().enumerate() {
            let want = node
                .operands
                .iter()
                .filter(|&&o| (o as usize) < n && o as usize != i)
                .map(|&o| layer[o as usize] + 1)
                .max()
                .unwrap_or(0)
                .min(n);
            if want > layer[i] {
                layer[i] = want;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    layer
}

/// Where each node goes (`x, y, width`), and the picture's size.
struct Placement {
    pos: Vec<(f64, f64, f64)>,
    width: f64,
    height: f64,
}

/// The nodes of each layer, each kernel's members side by side.
fn rows_of(view: &GraphView) -> Vec<Vec<usize>> {
    let layer = layers(view);
    let depth = layer.iter().max().map_or(0, |d| d + 1);
    let mut rows: Vec<Vec<usize>> = vec![Vec::new(); depth];
    for (i, &l) in layer.iter().enumerate() {
        rows[l].push(i);
    }
    // Keep each kernel's members side by side within a layer.
    for row in &mut rows {
        row.sort_by_key(|&i| (view.nodes[i].cluster.map_or(u32::MAX, |c| c), i));
    }
    rows
}

/// Each layer is a row, centred on the widest; a node is as wide as its label.
fn place(view: &GraphView, rows: &[Vec<usize>]) -> Placement {
    let depth = rows.len();
    let width_of = |i: usize| view.nodes[i].label.chars().count() as f64 * CHAR_W + 14.0;
    let row_width = |row: &Vec<usize>| {
        row.iter().map(|&i| width_of(i)).sum::<f64>()
            + NODE_GAP * row.len().saturating_sub(1) as f64
    };
    let max_row = rows.iter().map(row_width).fold(200.0, f64::max);
    let width = max_row + 2.0 * MARGIN;
    let height = HEADER + depth as f64 * (NODE_H + LAYER_GAP) + MARGIN;
    let mut pos = vec![(0.0, 0.0, 0.0); view.nodes.len()]; // x, y, w
    for (l, row) in rows.iter().enumerate() {
        let mut x = MARGIN + (max_row - row_width(row)) / 2.0;
        let y = HEADER + l as f64 * (NODE_H + LAYER_GAP);
        for &i in row {
            let w = width_of(i);
            pos[i] = (x, y, w);
            x += w + NODE_GAP;
        }
    }
    Placement { pos, width, height }
}

/// The graph as an SVG document.
pub fn graph_svg(view: &GraphView) -> String {
    let Placement { pos, width, height } = place(view, &rows_of(view));
    let mut out = String::new();
    open(&mut out, width, height, &format!("graph {}", view.name));
    let kernels: BTreeSet<u32> = view.nodes.iter().filter_map(|n| n.cluster).collect();
    write_legend(&mut out, view, &kernels);
    write_kernel_boxes(&mut out, view, &kernels, &pos);
    write_edges(&mut out, view, &pos);
    write_nodes(&mut out, view, &pos);
    out.push_str("</svg>\n");
    out
}

/// The arrow marker, the program's name and the counts.
fn write_legend(out: &mut String, view: &GraphView, kernels: &BTreeSet<u32>) {
    let _ = writeln!(
        out,
        "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"6\" markerHeight=\"6\" orient=\"auto\"><path d=\"M0,0L10,5L0,10z\" fill=\"#666\"/></marker></defs>\n\
         <text x=\"{MARGIN}\" y=\"18\" font-size=\"14\" font-weight=\"bold\">{}</text>\n\
         <text x=\"{MARGIN}\" y=\"34\">{} nodes, {} fused kernel{} (filled, dashed boxes) · bold: declared outputs</text>",
        escape(&view.name),
        view.nodes.len(),
        kernels.len(),
        if kernels.len() == 1 { "" } else { "s" }
    );
}

/// A dashed box in each kernel's colour around its members.
fn write_kernel_boxes(
    out: &mut String,
    view: &GraphView,
    kernels: &BTreeSet<u32>,
    pos: &[(f64, f64, f64)],
) {
    for &k in kernels {
        let members: Vec<usize> = (0..view.nodes.len())
            .filter(|&i| view.nodes[i].cluster == Some(k))
            .collect();
        let x0 = members
            .iter()
            .map(|&i| pos[i].0)
            .fold(f64::INFINITY, f64::min)
            - 5.0;
        let y0 = members
            .iter()
            .map(|&i| pos[i].1)
            .fold(f64::INFINITY, f64::min)
            - 5.0;
        let x1 = members
            .iter()
            .map(|&i| pos[i].0 + pos[i].2)
            .fold(0.0, f64::max)
            + 5.0;
        let y1 = members.iter().map(|&i| pos[i].1).fold(0.0, f64::max) + NODE_H + 5.0;
        let _ = writeln!(
            out,
            "<rect x=\"{x0:.1}\" y=\"{y0:.1}\" width=\"{:.1}\" height=\"{:.1}\" rx=\"6\" fill=\"none\" stroke=\"{}\" stroke-dasharray=\"5,3\"><title>fused kernel {k}: {} ops</title></rect>",
            x1 - x0,
            y1 - y0,
            palette(k as usize),
            members.len()
        );
    }
}

/// An arrow from each operand to its user.
fn write_edges(out: &mut String, view: &GraphView, pos: &[(f64, f64, f64)]) {
    for (i, node) in view.nodes.iter().enumerate() {
        let (x, y, w) = pos[i];
        for &o in &node.operands {
            let Some(&(ox, oy, ow)) = pos.get(o as usize) else {
                continue;
            };
            let _ = writeln!(
                out,
                "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#666\" marker-end=\"url(#arrow)\"/>",
                ox + ow / 2.0,
                oy + NODE_H,
                x + w / 2.0
            );
        }
    }
}

/// Each node filled with its kernel's colour (white unfused), outputs in bold.
fn write_nodes(out: &mut String, view: &GraphView, pos: &[(f64, f64, f64)]) {
    for (i, node) in view.nodes.iter().enumerate() {
        let (x, y, w) = pos[i];
        let fill = node.cluster.map_or("white", |k| palette(k as usize));
        let text = if node.cluster.is_some() {
            "white"
        } else {
            "black"
        };
        let stroke = if node.output { "2.5" } else { "0.8" };
        let _ = writeln!(
            out,
            "<g><title>{label}</title><rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{NODE_H}\" rx=\"3\" fill=\"{fill}\" stroke=\"#222\" stroke-width=\"{stroke}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" fill=\"{text}\">{label}</text></g>",
            x + 7.0,
            y + 16.0,
            label = escape(&node.label)
        );
    }
}
