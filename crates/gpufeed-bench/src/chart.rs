//! A small self-contained SVG line chart for the bench (no font or system libraries needed).

use std::fmt::Write as _;

/// One line of a chart: its label, its colour and its (x, y) points.
pub(crate) type Series<'a> = (&'a str, &'a str, Vec<(usize, f64)>);

/// Draws `series` as lines with markers on linear axes from 0.
pub(crate) fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let (width, height) = (820.0, 460.0);
    let (left, right, top, bottom) = (70.0, 260.0, 50.0, 60.0);
    let plot_w = width - left - right;
    let plot_h = height - top - bottom;
    let x_max = series
        .iter()
        .flat_map(|s| s.2.iter().map(|p| p.0 as f64))
        .fold(1.0, f64::max);
    let y_max = series
        .iter()
        .flat_map(|s| s.2.iter().map(|p| p.1))
        .filter(|y| y.is_finite())
        .fold(1e-9, f64::max);
    let y_top = nice_ceiling(y_max * 1.05);
    let x_top = nice_ceiling(x_max);
    let px = |x: f64| left + x / x_top * plot_w;
    let py = |y: f64| top + plot_h - y / y_top * plot_h;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" font-size="14" text-anchor="middle">{}</text>"#,
        width / 2.0,
        escape(title)
    );
    for i in 0..=5 {
        let y = y_top * i as f64 / 5.0;
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="#ddd"/><text x="{2:.1}" y="{3:.1}" text-anchor="end">{4}</text>"##,
            py(y),
            left + plot_w,
            left - 6.0,
            py(y) + 4.0,
            trim(y)
        );
        let x = x_top * i as f64 / 5.0;
        let _ = writeln!(
            s,
            r##"<line x1="{0:.1}" y1="{top}" x2="{0:.1}" y2="{1:.1}" stroke="#eee"/><text x="{0:.1}" y="{2:.1}" text-anchor="middle">{3}</text>"##,
            px(x),
            top + plot_h,
            top + plot_h + 18.0,
            trim(x)
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        left + plot_w / 2.0,
        height - 16.0,
        escape(x_label)
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        top + plot_h / 2.0,
        escape(y_label)
    );
    for (i, (label, colour, points)) in series.iter().enumerate() {
        let path: Vec<String> = points
            .iter()
            .filter(|p| p.1.is_finite())
            .map(|p| format!("{:.1},{:.1}", px(p.0 as f64), py(p.1)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for p in points.iter().filter(|p| p.1.is_finite()) {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{colour}"><title>{}: batch {} = {:.3} ms</title></circle>"#,
                px(p.0 as f64),
                py(p.1),
                escape(label),
                p.0,
                p.1
            );
        }
        let ly = top + 10.0 + 22.0 * i as f64;
        let lx = left + plot_w + 14.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{colour}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            lx + 22.0,
            lx + 28.0,
            ly + 4.0,
            escape(label)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// The smallest of 1, 1.5, 2, 2.5, 3, 4, 5, 6, 8 times a power of ten at or above `v`.
fn nice_ceiling(v: f64) -> f64 {
    let exp = v.log10().floor();
    let base = 10f64.powf(exp);
    for m in [1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0] {
        if m * base >= v {
            return m * base;
        }
    }
    10.0 * base
}

fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_has_every_series_and_point() {
        let svg = line_chart(
            "t <1>",
            "x",
            "y",
            &[
                ("a", "#000", vec![(32, 0.1), (64, 0.2)]),
                ("b", "#111", vec![(32, 0.4), (64, 0.8)]),
            ],
        );
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 4);
        assert!(svg.contains("t &lt;1&gt;"));
        assert_eq!(nice_ceiling(0.83), 1.0);
        assert_eq!(nice_ceiling(2.81), 3.0);
        assert_eq!(nice_ceiling(256.0), 300.0);
    }
}
