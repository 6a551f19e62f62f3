//! SVG pictures: a pod's topology ([`topology_svg`]), a compiled graph with
//! its fusion groups ([`graph_svg`]), a memory plan over time
//! ([`memory_svg`]) and a scatter plot with its front ([`scatter_svg`]).
//!
//! Plain SVG 1.1 written by hand: every picture is a handful of rectangles,
//! lines and text, and each element carries a `<title>` so a browser shows
//! the details on hover. Layouts are deterministic (same input, same bytes).

pub mod graph;
pub mod memory;
pub mod scatter;
pub mod topology;

pub use graph::{GraphView, GraphViewNode, graph_svg};
pub use memory::{MemoryBuffer, memory_svg};
pub use scatter::{ScatterPoint, scatter_svg};
pub use topology::topology_svg;

use std::fmt::Write;

/// Escapes text for XML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => {}
            c => out.push(c),
        }
    }
    out
}

/// Opens an SVG document of `width` × `height` px with a white background.
pub(crate) fn open(out: &mut String, width: f64, height: f64, title: &str) {
    let _ = writeln!(
        out,
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{width:.0}\" \
         height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\" \
         font-family=\"monospace\" font-size=\"11\">\n<title>{}</title>\n\
         <rect x=\"0\" y=\"0\" width=\"{width:.0}\" height=\"{height:.0}\" fill=\"white\"/>",
        escape(title)
    );
}

/// A categorical colour (Tableau 10) for index `i`.
pub(crate) fn palette(i: usize) -> &'static str {
    const COLORS: [&str; 10] = [
        "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
        "#9c755f", "#bab0ac",
    ];
    COLORS[i % COLORS.len()]
}

/// A pale categorical colour for backgrounds.
pub(crate) fn pale(i: usize) -> &'static str {
    const COLORS: [&str; 6] = [
        "#eef3f9", "#fdf1e6", "#eef6ec", "#fbeeee", "#f3eef6", "#fbf8e8",
    ];
    COLORS[i % COLORS.len()]
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes_markup() {
        assert_eq!(super::escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
