//! A memory plan as SVG, in the manner of XLA's buffer-assignment views:
//! time (plan steps) to the right, heap offset downwards, one rectangle per
//! buffer over its live range, the plan's peak and the lower bound (the most
//! bytes live at once) as lines.

use super::{escape, open, palette};
use std::fmt::Write;

/// One buffer to draw.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryBuffer {
    /// The value it holds.
    pub label: String,
    /// Heap offset, bytes.
    pub offset: usize,
    /// Bytes.
    pub size: usize,
    /// First and last step it is live (inclusive).
    pub live: (u32, u32),
}

const MARGIN: f64 = 84.0;
const HEADER: f64 = 48.0;
const PLOT_W: f64 = 720.0;
const PLOT_H: f64 = 420.0;

/// The plan as an SVG document. `peak_bytes` and `lower_bound_bytes` come
/// from the plan.
pub fn memory_svg(
    name: &str,
    buffers: &[MemoryBuffer],
    peak_bytes: usize,
    lower_bound_bytes: usize,
) -> String {
    let steps = buffers
        .iter()
        .map(|b| b.live.1 + 1)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let top = buffers
        .iter()
        .map(|b| b.offset + b.size)
        .max()
        .unwrap_or(0)
        .max(peak_bytes)
        .max(1) as f64;
    let x = |step: f64| MARGIN + step / steps * PLOT_W;
    let y = |bytes: f64| HEADER + bytes / top * PLOT_H;
    let mut out = String::new();
    open(
        &mut out,
        PLOT_W + 2.0 * MARGIN,
        PLOT_H + HEADER + MARGIN,
        &format!("memory plan of {name}"),
    );
    let _ = writeln!(
        out,
        "<text x=\"{MARGIN}\" y=\"18\" font-size=\"14\" font-weight=\"bold\">memory plan of {}</text>\n\
         <text x=\"{MARGIN}\" y=\"34\">{} buffers · peak {peak_bytes} B (red) · lower bound {lower_bound_bytes} B (green) · x: step, y: offset</text>\n\
         <rect x=\"{MARGIN}\" y=\"{HEADER}\" width=\"{PLOT_W}\" height=\"{PLOT_H}\" fill=\"#fafafa\" stroke=\"#999\"/>",
        escape(name),
        buffers.len()
    );
    for (i, b) in buffers.iter().enumerate() {
        let (x0, x1) = (x(b.live.0 as f64), x(b.live.1 as f64 + 1.0));
        let (y0, y1) = (y(b.offset as f64), y((b.offset + b.size) as f64));
        let _ = writeln!(
            out,
            "<rect x=\"{x0:.2}\" y=\"{y0:.2}\" width=\"{:.2}\" height=\"{:.2}\" fill=\"{}\" fill-opacity=\"0.8\" stroke=\"#333\" stroke-width=\"0.3\"><title>{}: {} B at +{} live [{}, {}]</title></rect>",
            (x1 - x0).max(0.5),
            (y1 - y0).max(0.5),
            palette(i),
            escape(&b.label),
            b.size,
            b.offset,
            b.live.0,
            b.live.1
        );
    }
    // Labels left of the plot, the lower bound's below the peak's when close.
    let mut label_y = f64::NEG_INFINITY;
    for (bytes, color, label) in [
        (peak_bytes, "#d62728", "peak"),
        (lower_bound_bytes, "#2ca02c", "lower bound"),
    ] {
        let yy = y(bytes as f64);
        label_y = (yy + 4.0).max(label_y + 13.0);
        let _ = writeln!(
            out,
            "<line x1=\"{MARGIN}\" y1=\"{yy:.2}\" x2=\"{:.2}\" y2=\"{yy:.2}\" stroke=\"{color}\" stroke-dasharray=\"4,3\"/><text x=\"{:.2}\" y=\"{:.2}\" fill=\"{color}\">{label}</text>",
            MARGIN + PLOT_W,
            MARGIN + PLOT_W + 4.0,
            label_y
        );
    }
    let ticks = (steps as u32).clamp(1, 10);
    for t in 0..=ticks {
        let step = (steps * t as f64 / ticks as f64).round();
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#555\">{step}</text>",
            x(step),
            HEADER + PLOT_H + 14.0
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#555\">0</text>\n<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#555\">{top:.0}</text>",
        MARGIN - 4.0,
        HEADER + 4.0,
        MARGIN - 4.0,
        HEADER + PLOT_H
    );
    out.push_str("</svg>\n");
    out
}
