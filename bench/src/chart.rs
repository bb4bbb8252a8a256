//! The benchmark's pictures: small hand-written SVG charts, written next to the tables in
//! `docs/` (or the directory `CONCLAVE_BENCH_CHARTS` names).
//!
//! - [`latency`]: one row per system, a bar from the minimum to the 99th percentile of its
//!   latencies, marks at p50 and p90, on a logarithmic axis of microseconds.
//! - [`rates`]: one bar per system (handoffs per second, say), with its value.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

const WIDTH: f64 = 1040.0;
const LEFT: f64 = 260.0;
const RIGHT: f64 = 230.0;
const ROW: f64 = 34.0;
const COLOURS: [&str; 6] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
];

/// Where the charts go: `$CONCLAVE_BENCH_CHARTS`, else `docs/` of the workspace.
pub(crate) fn directory() -> PathBuf {
    std::env::var_os("CONCLAVE_BENCH_CHARTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs"))
}

/// Writes `svg` to `name` in [`directory`] and says where.
pub(crate) fn write(name: &str, svg: &str) -> std::io::Result<()> {
    let dir = directory();
    let path = dir.canonicalize().unwrap_or(dir).join(name);
    std::fs::write(&path, svg)?;
    println!("chart: {}", path.display());
    Ok(())
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn header(out: &mut String, height: f64, title: &str) {
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="8" y="18" font-weight="bold">{}</text>"#,
        escape(title)
    );
}

/// A row's name, left of its bar.
fn row_label(out: &mut String, y: f64, name: &str) {
    let _ = writeln!(
        out,
        r#"<text x="8" y="{}">{}</text>"#,
        y + 16.0,
        escape(name)
    );
}

/// The `p`-quantile of `sorted`.
fn quantile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Latency distributions, one row per `(system, sorted samples)`.
pub(crate) fn latency(title: &str, systems: &[(&str, &[Duration])]) -> String {
    let micros = |d: Duration| d.as_secs_f64() * 1e6;
    let lo = systems
        .iter()
        .filter_map(|(_, s)| s.first())
        .map(|d| micros(*d).max(0.1))
        .fold(f64::INFINITY, f64::min);
    let hi = systems
        .iter()
        .map(|(_, s)| micros(quantile(s, 0.99)))
        .fold(1.0, f64::max);
    let (lo, hi) = if lo.is_finite() && lo < hi {
        ((lo / 1.5).log10(), (hi * 1.5).log10())
    } else {
        (0.0, 3.0)
    };
    let x = |us: f64| LEFT + (us.max(0.1).log10() - lo) / (hi - lo) * (WIDTH - LEFT - RIGHT);
    let height = 60.0 + ROW * systems.len() as f64 + 40.0;
    let mut out = String::new();
    header(&mut out, height, title);
    for (i, (name, samples)) in systems.iter().enumerate() {
        let y = 40.0 + ROW * i as f64;
        let colour = COLOURS[i % COLOURS.len()];
        let (min, p50, p90, p99) = (
            micros(quantile(samples, 0.0)),
            micros(quantile(samples, 0.5)),
            micros(quantile(samples, 0.9)),
            micros(quantile(samples, 0.99)),
        );
        row_label(&mut out, y, name);
        let _ = writeln!(
            out,
            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="14" fill="{colour}" opacity="0.35"/>"#,
            x(min),
            y + 5.0,
            (x(p99) - x(min)).max(1.0)
        );
        for (q, label) in [(p50, "p50"), (p90, "p90")] {
            let _ = writeln!(
                out,
                r#"<line x1="{0:.1}" x2="{0:.1}" y1="{1:.1}" y2="{2:.1}" stroke="{colour}" stroke-width="3"><title>{label} {q:.1} µs</title></line>"#,
                x(q),
                y + 2.0,
                y + 22.0
            );
        }
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}">p50 {p50:.1} µs · p99 {p99:.1} µs</text>"#,
            x(p99) + 6.0,
            y + 16.0
        );
    }
    // The axis: powers of ten.
    let base = 40.0 + ROW * systems.len() as f64 + 10.0;
    let mut decade = 10f64.powf(lo.floor());
    while decade.log10() <= hi {
        if decade.log10() >= lo {
            let _ = writeln!(
                out,
                r##"<line x1="{0:.1}" x2="{0:.1}" y1="36" y2="{base:.1}" stroke="#ccc"/><text x="{0:.1}" y="{1:.1}" text-anchor="middle">{2} µs</text>"##,
                x(decade),
                base + 16.0,
                decade
            );
        }
        decade *= 10.0;
    }
    let _ = writeln!(out, "</svg>");
    out
}

/// One bar per `(system, value)`, labelled with the value and `unit`.
pub(crate) fn rates(title: &str, unit: &str, systems: &[(&str, f64)]) -> String {
    let max = systems.iter().map(|(_, v)| *v).fold(1.0, f64::max);
    let height = 60.0 + ROW * systems.len() as f64;
    let mut out = String::new();
    header(&mut out, height, title);
    for (i, (name, value)) in systems.iter().enumerate() {
        let y = 40.0 + ROW * i as f64;
        let width = value / max * (WIDTH - LEFT - RIGHT - 60.0);
        row_label(&mut out, y, name);
        let _ = writeln!(
            out,
            r#"<rect x="{LEFT}" y="{:.1}" width="{:.1}" height="18" fill="{}"/>"#,
            y + 3.0,
            width.max(1.0),
            COLOURS[i % COLOURS.len()]
        );
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}">{value:.0} {}</text>"#,
            LEFT + width + 6.0,
            y + 16.0,
            escape(unit)
        );
    }
    let _ = writeln!(out, "</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&u| Duration::from_micros(u)).collect()
    }

    #[test]
    fn a_latency_chart_has_a_row_per_system_and_its_percentiles() {
        let a = us(&[10, 12, 13, 14, 20, 40]);
        let b = us(&[30, 31, 33, 35, 90, 400]);
        let svg = latency("lock p50 <vs> Redis", &[("Conclave", &a), ("Redis", &b)]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<rect x=").count(), 2, "one bar per system");
        assert!(
            svg.contains("p50 14.0 µs") || svg.contains("p50 13.0 µs"),
            "{svg}"
        );
        assert!(svg.contains("&lt;vs&gt;"), "text is escaped");
    }

    #[test]
    fn a_rate_chart_scales_bars_to_the_largest() {
        let svg = rates("handoffs", "/s", &[("a", 100.0), ("b", 50.0)]);
        let widths: Vec<f64> = svg
            .match_indices("height=\"18\"")
            .map(|(i, _)| {
                let before = &svg[..i];
                let w = before.rsplit("width=\"").next().unwrap();
                w.split('"').next().unwrap().parse().unwrap()
            })
            .collect();
        assert_eq!(widths.len(), 2);
        assert!((widths[0] / widths[1] - 2.0).abs() < 1e-9, "{widths:?}");
    }
}
