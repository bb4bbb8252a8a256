//! The plot: hand-written SVG, one row per lock with a bar per hold coloured by member, and a
//! row of fault markers above them.

use std::fmt::Write as _;

use super::checker::Report;

const WIDTH: f64 = 1600.0;
const LEFT: f64 = 90.0;
const ROW: f64 = 40.0;
const COLOURS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

/// The colour of a fault kind's marker.
fn fault_colour(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "kill" | "exit" => "#d62728",
        "restart" => "#2ca02c",
        "pause" => "#9467bd",
        "resume" => "#c5b0d5",
        "partition" => "#ff7f0e",
        "loss" => "#17becf",
        "delay" => "#bcbd22",
        "garbage" => "#8c564b",
        "heal-partition" | "heal-loss" | "heal-delay" => "#aaaaaa",
        "quiet" | "end" => "#000000",
        _ => return None,
    })
}

/// The SVG of a run.
pub fn svg(report: &Report, nodes: &[String]) -> String {
    let (start, _, end) = report.phase;
    let last = report
        .holds
        .values()
        .flatten()
        .map(|h| h.end())
        .max()
        .unwrap_or(start);
    let end = if end == u64::MAX { last } else { end.max(last) };
    let span = end.saturating_sub(start).max(1) as f64;
    let x = |t: u64| LEFT + (t.saturating_sub(start) as f64 / span) * (WIDTH - LEFT - 10.0);
    let rows = report.holds.len() as f64;
    let height = 60.0 + ROW * (rows + 1.0) + 40.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="monospace" font-size="11">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="4" y="14">{:.1} s; faults on the top row; a bar per hold, in its member's lane and colour</text>"#,
        span / 1e6
    );
    // Faults.
    let top = 24.0;
    let _ = writeln!(out, r#"<text x="4" y="{}">faults</text>"#, top + 16.0);
    for fault in &report.faults {
        if let Some(colour) = fault_colour(&fault.kind) {
            let fx = x(fault.t);
            let _ = writeln!(
                out,
                r#"<line x1="{fx:.1}" y1="{top}" x2="{fx:.1}" y2="{:.1}" stroke="{colour}" stroke-width="1"><title>{} {}</title></line>"#,
                top + ROW - 4.0,
                fault.kind,
                escape(&fault.detail)
            );
        }
    }
    // Holds.
    for (i, (lock, holds)) in report.holds.iter().enumerate() {
        let y = top + ROW * (i as f64 + 1.0);
        let _ = writeln!(
            out,
            r#"<text x="4" y="{:.1}">{}</text>"#,
            y + 16.0,
            escape(lock)
        );
        for hold in holds {
            let lane = nodes.iter().position(|n| *n == hold.node);
            let colour = lane.map_or("#000000", |i| COLOURS[i % COLOURS.len()]);
            // Each member its own lane in the row, so overlapping holds show side by side.
            let lane_height = (ROW - 8.0) / nodes.len().max(1) as f64;
            let lane_y = y + 4.0 + lane.unwrap_or(0) as f64 * lane_height;
            let (x0, x1) = (x(hold.granted), x(hold.end()));
            let _ = writeln!(
                out,
                r#"<rect x="{x0:.2}" y="{lane_y:.1}" width="{:.2}" height="{lane_height:.1}" fill="{colour}"><title>{} token {}</title></rect>"#,
                (x1 - x0).max(0.5),
                hold.node,
                hold.token
            );
        }
    }
    // Legend.
    let y = top + ROW * (rows + 1.0) + 20.0;
    for (i, node) in nodes.iter().enumerate() {
        let lx = LEFT + 80.0 * i as f64;
        let _ = writeln!(
            out,
            r#"<rect x="{lx}" y="{:.1}" width="10" height="10" fill="{}"/><text x="{}" y="{y:.1}">{}</text>"#,
            y - 9.0,
            COLOURS[i % COLOURS.len()],
            lx + 14.0,
            escape(node)
        );
    }
    let kinds = [
        "kill",
        "restart",
        "pause",
        "resume",
        "partition",
        "loss",
        "delay",
        "garbage",
    ];
    for (i, kind) in kinds.iter().enumerate() {
        let lx = LEFT + 80.0 * (nodes.len() as f64 + 0.5) + 90.0 * i as f64;
        let _ = writeln!(
            out,
            r#"<rect x="{lx}" y="{:.1}" width="3" height="10" fill="{}"/><text x="{}" y="{y:.1}">{kind}</text>"#,
            y - 9.0,
            fault_colour(kind).unwrap_or("#000"),
            lx + 6.0
        );
    }
    out.push_str("</svg>\n");
    out
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
