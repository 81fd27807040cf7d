//! SVG bar charts of median throughput per target, grouped by mode.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor;

use crate::report::{label, Results};
use crate::BenchError;

/// Bar colours, one per target in table order.
const COLOURS: [RGBColor; 4] = [
    RGBColor(90, 90, 90),
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
];

/// Draws `results`' median tps as grouped bars (one group per mode) into `path`.
pub fn bars(results: &Results, path: &Path) -> Result<(), BenchError> {
    match results.scenario.as_str() {
        "commit-waits" => draw_shares(results, path),
        "read-scaling" => draw_speedup(results, path),
        _ => draw(results, path),
    }
    .map_err(|detail| BenchError::Chart {
        path: path.to_path_buf(),
        detail,
    })
}

fn draw(r: &Results, path: &Path) -> Result<(), String> {
    let targets = &r.settings.targets;
    let modes = crate::report::ordered_modes(r);
    let max = r
        .modes
        .values()
        .flat_map(|m| m.values().map(|t| t.median_tps))
        .fold(0.0_f64, f64::max);
    let groups = modes.len().max(1) as f64;
    let width = 0.8 / targets.len().max(1) as f64;
    // commit-modes: one target, rows/s, each bar with its ratio to the mode "none".
    let rows = r.scenario == "commit-modes";
    let unit = if rows { "rows/s" } else { "tps" };

    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("herd bench {}: median {unit} ({})", r.scenario, r.date),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..groups, 0.0..(max * 1.15).max(1.0))
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .x_label_formatter(&|_| String::new())
        .y_desc(if rows {
            "rows per second"
        } else {
            "transactions per second"
        })
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(|e| e.to_string())?;

    for (i, target) in targets.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let bars = modes.iter().enumerate().filter_map(|(g, (_, per_target))| {
            let tps = per_target.get(target)?.median_tps;
            let x0 = g as f64 + 0.1 + i as f64 * width;
            Some(Rectangle::new(
                [(x0, 0.0), (x0 + width * 0.9, tps)],
                colour.filled(),
            ))
        });
        chart
            .draw_series(bars)
            .map_err(|e| e.to_string())?
            .label(label(target))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
    }
    // Each bar's median, and its ratio to the baseline, above it.
    for (i, target) in targets.iter().enumerate() {
        let labels = modes.iter().enumerate().filter_map(|(g, (_, per_target))| {
            let t = per_target.get(target)?;
            let x = g as f64 + 0.1 + (i as f64 + 0.45) * width;
            let text = if i == 0 && !rows {
                format!("{:.0}", t.median_tps)
            } else {
                format!("{:.0} ({:.2}×)", t.median_tps, t.ratio_to_direct)
            };
            let style = ("sans-serif", 12)
                .into_font()
                .color(&BLACK)
                .pos(text_anchor::Pos::new(
                    text_anchor::HPos::Center,
                    text_anchor::VPos::Bottom,
                ));
            Some(Text::new(text, (x, t.median_tps + max * 0.01), style))
        });
        chart.draw_series(labels).map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| e.to_string())?;

    // Mode names under the groups, placed in pixels from the chart's own coordinates.
    for (g, (mode, _)) in modes.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(g as f64 + 0.5, 0.0));
        let style = ("sans-serif", 16)
            .into_font()
            .color(&BLACK)
            .pos(text_anchor::Pos::new(
                text_anchor::HPos::Center,
                text_anchor::VPos::Top,
            ));
        root.draw(&Text::new(mode.as_str(), (x, y + 10), style))
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

/// Draws `results`' failover RTO per iteration, one line (with points) per commit mode, into
/// `path`.
pub fn rto(results: &Results, path: &Path) -> Result<(), BenchError> {
    draw_rto(results, path).map_err(|detail| BenchError::Chart {
        path: path.to_path_buf(),
        detail,
    })
}

fn draw_rto(r: &Results, path: &Path) -> Result<(), String> {
    let modes = crate::report::ordered_failover(r);
    let max_rto = modes
        .iter()
        .flat_map(|(_, f)| f.rto_s.iter().copied())
        .fold(0.0_f64, f64::max);
    let iterations = modes
        .iter()
        .map(|(_, f)| f.rto_s.len())
        .max()
        .unwrap_or(1)
        .max(1);

    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("herd bench {}: RTO per iteration ({})", r.scenario, r.date),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(
            0.5..(iterations as f64 + 0.5),
            0.0..(max_rto * 1.2).max(1.0),
        )
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("iteration")
        .y_desc("RTO (s): kill → first acknowledged write")
        .x_labels(iterations.min(20))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.1}"))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (mode, f)) in modes.iter().enumerate() {
        let colour = COLOURS[(i + 1) % COLOURS.len()];
        let points: Vec<(f64, f64)> = f
            .rto_s
            .iter()
            .enumerate()
            .map(|(k, v)| (k as f64 + 1.0, *v))
            .collect();
        chart
            .draw_series(std::iter::once(PathElement::new(
                points.clone(),
                colour.stroke_width(2),
            )))
            .map_err(|e| e.to_string())?
            .label(format!("{mode} (p50 {:.2} s)", f.rto_p50_s))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 14, y)], colour.stroke_width(2)));
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, colour.filled())),
            )
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// commit-waits: each mode's wait-event shares (targets `wait:…`) as one stacked bar, the main
/// events first and every other event summed as "other".
fn draw_shares(r: &Results, path: &Path) -> Result<(), String> {
    const EVENTS: [&str; 4] = ["IO:WALSync", "IPC:SyncRep", "LWLock:WALWrite", "CPU"];
    let modes = crate::report::ordered_modes(r);
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "herd bench {}: share of commit samples ({})",
                r.scenario, r.date
            ),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..modes.len().max(1) as f64 + 1.2, 0.0..1.0)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .x_label_formatter(&|_| String::new())
        .y_desc("share of backend samples")
        .y_label_formatter(&|v| format!("{:.0} %", v * 100.0))
        .draw()
        .map_err(|e| e.to_string())?;
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
        let colour = if i < COLOURS.len() {
            COLOURS[(i + 1) % COLOURS.len()]
        } else {
            RGBColor(200, 200, 200)
        };
        let colour = if *event == "CPU" {
            RGBColor(90, 90, 90)
        } else {
            colour
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
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| e.to_string())?;
    for (g, (mode, m)) in modes.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(g as f64 + 0.5, 0.0));
        let style = ("sans-serif", 14)
            .into_font()
            .color(&BLACK)
            .pos(text_anchor::Pos::new(
                text_anchor::HPos::Center,
                text_anchor::VPos::Top,
            ));
        let latency = m.get("latency_ms").map_or(0.0, |t| t.median_tps);
        root.draw(&Text::new(
            format!("{mode} ({latency:.1} ms)"),
            (x, y + 10),
            style,
        ))
        .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

/// read-scaling: each query's speedup against the first mode (1 node), one group per query and
/// one bar per cluster size, the ratio above each bar (the qps are in report.md).
fn draw_speedup(r: &Results, path: &Path) -> Result<(), String> {
    let modes = crate::report::ordered_modes(r);
    let targets = &r.settings.targets;
    let max = r
        .modes
        .values()
        .flat_map(|m| m.values().map(|t| t.ratio_to_direct))
        .fold(1.0_f64, f64::max);
    let width = 0.8 / modes.len().max(1) as f64;
    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "herd bench {}: qps relative to 1 node ({})",
                r.scenario, r.date
            ),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..targets.len().max(1) as f64, 0.0..max * 1.2)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .x_label_formatter(&|_| String::new())
        .y_desc("speedup (qps / qps with 1 node)")
        .y_label_formatter(&|v| format!("{v:.1}×"))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (mode, per_target)) in modes.iter().enumerate() {
        let colour = COLOURS[(i + 1) % COLOURS.len()];
        let bars = targets.iter().enumerate().filter_map(|(g, t)| {
            let ratio = per_target.get(t)?.ratio_to_direct;
            let x0 = g as f64 + 0.1 + i as f64 * width;
            Some(Rectangle::new(
                [(x0, 0.0), (x0 + width * 0.9, ratio)],
                colour.filled(),
            ))
        });
        chart
            .draw_series(bars)
            .map_err(|e| e.to_string())?
            .label(mode.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
        let labels = targets.iter().enumerate().filter_map(|(g, t)| {
            let ratio = per_target.get(t)?.ratio_to_direct;
            let x = g as f64 + 0.1 + (i as f64 + 0.45) * width;
            let style = ("sans-serif", 11)
                .into_font()
                .color(&BLACK)
                .pos(text_anchor::Pos::new(
                    text_anchor::HPos::Center,
                    text_anchor::VPos::Bottom,
                ));
            Some(Text::new(
                format!("{ratio:.2}×"),
                (x, ratio + max * 0.01),
                style,
            ))
        });
        chart.draw_series(labels).map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| e.to_string())?;
    for (g, target) in targets.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(g as f64 + 0.5, 0.0));
        let style = ("sans-serif", 14)
            .into_font()
            .color(&BLACK)
            .pos(text_anchor::Pos::new(
                text_anchor::HPos::Center,
                text_anchor::VPos::Top,
            ));
        root.draw(&Text::new(target.as_str(), (x, y + 10), style))
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}
