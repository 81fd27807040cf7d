//! Stacked shares: commit-waits' wait events per commit mode.

use std::path::Path;

use plotters::prelude::*;

use super::{colour, group_chart, group_labels, legend};
use crate::report::Results;

/// commit-waits: each mode's wait-event shares (targets `wait:…`) as one stacked bar, the main
/// events first and every other event summed as "other".
pub fn draw(r: &Results, path: &Path) -> Result<(), String> {
    const EVENTS: [&str; 4] = ["IO:WALSync", "IPC:SyncRep", "LWLock:WALWrite", "CPU"];
    let modes = crate::report::ordered_modes(r);
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let title = format!(
        "herd bench {}: share of commit samples ({})",
        r.scenario, r.date
    );
    let mut chart = group_chart(
        &root,
        &title,
        (modes.len().max(1) as f64 + 1.2, 1.0),
        "share of backend samples",
        &|v| format!("{:.0} %", v * 100.0),
    )?;
    let share = |m: &crate::report::ModeResult, e: &str| {
        let all = |k: &String| k.starts_with("wait:");
        match e {
            "other" => m
                .iter()
                .filter(|(k, _)| {
                    all(k) && !EVENTS.iter().any(|x| k.as_str() == format!("wait:{x}"))
                })
                .map(|(_, t)| t.median_tps)
                .sum(),
            _ => m.get(&format!("wait:{e}")).map_or(0.0, |t| t.median_tps),
        }
    };
    let mut bottom = vec![0.0; modes.len()];
    for (i, event) in EVENTS.iter().chain(&["other"]).enumerate() {
        // CPU in the baseline grey, "other" in light grey.
        let colour = match *event {
            "CPU" => colour(0),
            "other" => RGBColor(200, 200, 200),
            _ => colour(i + 1),
        };
        let mut rects = Vec::new();
        for (g, (_, m)) in modes.iter().enumerate() {
            let v = share(m, event);
            let x0 = g as f64 + 0.2;
            rects.push(Rectangle::new(
                [(x0, bottom[g]), (x0 + 0.6, bottom[g] + v)],
                colour.filled(),
            ));
            bottom[g] += v;
        }
        chart
            .draw_series(rects)
            .map_err(|e| e.to_string())?
            .label(*event)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    let names: Vec<String> = modes
        .iter()
        .map(|(mode, m)| {
            let latency = m.get("latency_ms").map_or(0.0, |t| t.median_tps);
            format!("{mode} ({latency:.1} ms)")
        })
        .collect();
    group_labels(&root, &chart, &names, 14)?;
    root.present().map_err(|e| e.to_string())
}
