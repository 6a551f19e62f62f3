//! A scatter plot with a front: each point a small circle (filled when it
//! is one of the kept kind, hollow grey otherwise) and the front a line
//! through its points — what `plan --svg` draws, throughput against HBM
//! headroom with the Pareto front of the layouts that fit.

use std::fmt::Write;

use super::{escape, open, palette};

/// One point: its coordinates, whether it is of the kept kind (drawn
/// filled), and its hover text.
#[derive(Debug, Clone, PartialEq)]
pub struct ScatterPoint {
    /// Horizontal value.
    pub x: f64,
    /// Vertical value.
    pub y: f64,
    /// Drawn filled (kept) or hollow.
    pub kept: bool,
    /// Hover text.
    pub label: String,
}

/// The plot of `points` (non-finite ones are left out) with `front` drawn
/// as a line, axes labelled `x_label` and `y_label`, a dashed vertical
/// line at `x = 0` when the range spans it, and a legend naming the kept
/// points, the others and the front (`legend`, in that order).
pub fn scatter_svg(
    title: &str,
    (x_label, y_label): (&str, &str),
    points: &[ScatterPoint],
    front: &[(f64, f64)],
    legend: [&str; 3],
) -> String {
    let (w, h, left, bottom, top, right) = (760.0, 480.0, 80.0, 50.0, 40.0, 20.0);
    let finite: Vec<&ScatterPoint> = points
        .iter()
        .filter(|p| p.x.is_finite() && p.y.is_finite())
        .collect();
    let range = |f: &dyn Fn(&ScatterPoint) -> f64| {
        let lo = finite.iter().map(|p| f(p)).fold(f64::INFINITY, f64::min);
        let hi = finite
            .iter()
            .map(|p| f(p))
            .fold(f64::NEG_INFINITY, f64::max);
        match (lo.is_finite(), hi > lo) {
            (true, true) => (lo, hi),
            (true, false) => (lo - 1.0, lo + 1.0),
            _ => (0.0, 1.0),
        }
    };
    let (x0, x1) = range(&|p| p.x);
    let (y0, y1) = range(&|p| p.y);
    let y0 = y0.min(0.0);
    let px = |x: f64| left + (x - x0) / (x1 - x0) * (w - left - right);
    let py = |y: f64| h - bottom - (y - y0) / (y1 - y0) * (h - bottom - top);
    let mut out = String::new();
    open(&mut out, w, h, title);
    let _ = writeln!(
        out,
        "<text x=\"{left}\" y=\"20\" font-size=\"13\">{}</text>",
        escape(title)
    );
    draw_axes(
        &mut out,
        (&px, &py),
        (x0, x1, y0, y1),
        (w, h, left, bottom, top, right),
        (x_label, y_label),
    );
    for p in &finite {
        let (fill, stroke) = if p.kept {
            (palette(0), palette(0))
        } else {
            ("none", "#999999")
        };
        let _ = writeln!(
            out,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{fill}\" stroke=\"{stroke}\">\
             <title>{}</title></circle>",
            px(p.x),
            py(p.y),
            escape(&p.label)
        );
    }
    if !front.is_empty() {
        let path: Vec<String> = front
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            out,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>",
            path.join(" "),
            palette(3)
        );
    }
    draw_legend(&mut out, w - right, top, legend);
    out.push_str("</svg>\n");
    out
}

/// The legend, right-aligned at `(right, top)`: a filled circle, a hollow
/// one and a line, each with its label.
fn draw_legend(out: &mut String, right: f64, top: f64, labels: [&str; 3]) {
    let widest = labels.iter().map(|l| l.len()).max().unwrap_or(0) as f64;
    let mark = right - 18.0 - 6.5 * widest;
    for (i, label) in labels.iter().enumerate() {
        let y = top + 12.0 + 14.0 * i as f64;
        let shape = match i {
            0 => format!(
                "<circle cx=\"{mark:.1}\" cy=\"{y:.1}\" r=\"3\" fill=\"{0}\" stroke=\"{0}\"/>",
                palette(0)
            ),
            1 => format!(
                "<circle cx=\"{mark:.1}\" cy=\"{y:.1}\" r=\"3\" fill=\"none\" stroke=\"#999999\"/>"
            ),
            _ => format!(
                "<line x1=\"{:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{}\" \
                 stroke-width=\"2\"/>",
                mark - 6.0,
                mark + 6.0,
                palette(3)
            ),
        };
        let _ = writeln!(
            out,
            "{shape}<text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            mark + 10.0,
            y + 4.0,
            escape(label)
        );
    }
}

/// The axes, their ticks and labels, and the dashed line at `x = 0`.
fn draw_axes(
    out: &mut String,
    (px, py): (&dyn Fn(f64) -> f64, &dyn Fn(f64) -> f64),
    (x0, x1, y0, y1): (f64, f64, f64, f64),
    (w, h, left, bottom, top, right): (f64, f64, f64, f64, f64, f64),
    (x_label, y_label): (&str, &str),
) {
    let _ = writeln!(
        out,
        "<line x1=\"{left}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/>\
         <line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{b}\" stroke=\"black\"/>",
        b = h - bottom,
        r = w - right
    );
    for i in 0..=4 {
        let (x, y) = (
            x0 + (x1 - x0) * f64::from(i) / 4.0,
            y0 + (y1 - y0) * f64::from(i) / 4.0,
        );
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{x:.3}</text>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{y:.0}</text>",
            px(x),
            h - bottom + 15.0,
            left - 5.0,
            py(y) + 4.0
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\
         <text x=\"15\" y=\"{:.1}\" transform=\"rotate(-90 15 {:.1})\" \
         text-anchor=\"middle\">{}</text>",
        (left + w - right) / 2.0,
        h - 12.0,
        escape(x_label),
        (top + h - bottom) / 2.0,
        (top + h - bottom) / 2.0,
        escape(y_label)
    );
    if x0 < 0.0 && x1 > 0.0 {
        let _ = writeln!(
            out,
            "<line x1=\"{0:.1}\" y1=\"{top}\" x2=\"{0:.1}\" y2=\"{1:.1}\" stroke=\"grey\" \
             stroke-dasharray=\"4 3\"/>",
            px(0.0),
            h - bottom
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_every_finite_point_and_the_front() {
        let p = |x, y, kept| ScatterPoint {
            x,
            y,
            kept,
            label: "a<b".into(),
        };
        let svg = scatter_svg(
            "t",
            ("x", "y"),
            &[
                p(-1.0, 2.0, false),
                p(1.0, 3.0, true),
                p(f64::NAN, 1.0, true),
            ],
            &[(1.0, 3.0)],
            ["kept", "other", "the front"],
        );
        // Two points and the legend's two marks.
        assert_eq!(svg.matches("<circle").count(), 4);
        assert!(svg.contains("<polyline"));
        assert!(svg.contains("a&lt;b"));
        assert!(svg.contains("stroke-dasharray"), "x = 0 is marked");
        for label in ["kept", "other", "the front"] {
            assert!(svg.contains(&format!(">{label}</text>")), "{label}");
        }
    }
}
