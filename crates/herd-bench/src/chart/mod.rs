//! SVG charts of the reports: grouped bars (throughput, speedups, byte ratios), stacked shares
//! (commit waits) and lines (failover RTO, replication lag). The shapes share one drawing
//! routine each; scenarios only say what goes where.

mod bars;
mod lag;
mod lines;
mod shares;

use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor;

pub use bars::{grouped, Bars, Series};

use crate::report::{label, Results};
use crate::BenchError;

/// Colours in order of use; the first (grey) marks baselines.
pub const COLOURS: [RGBColor; 5] = [
    RGBColor(90, 90, 90),
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];

/// The `i`-th colour, cycling.
pub fn colour(i: usize) -> RGBColor {
    COLOURS[i % COLOURS.len()]
}

/// Draws `results`' figures per mode into `path`: tps (or rows/s) bars for most scenarios,
/// stacked wait-event shares for commit-waits, speedups for read-scaling.
pub fn bars(results: &Results, path: &Path) -> Result<(), BenchError> {
    match results.scenario.as_str() {
        "commit-waits" => shares::draw(results, path).map_err(|e| chart_error(path, e)),
        "read-scaling" => grouped(&speedup(results), path),
        _ => grouped(&throughput(results), path),
    }
}

/// Draws `results`' failover RTO per iteration, one line per commit mode, into `path`.
pub fn rto(results: &Results, path: &Path) -> Result<(), BenchError> {
    lines::rto(results, path).map_err(|e| chart_error(path, e))
}

/// Draws `results`' replication lag over time, one line per phase, into `path`.
pub fn lag(results: &Results, path: &Path) -> Result<(), BenchError> {
    lag::draw(results, path).map_err(|e| chart_error(path, e))
}

fn chart_error(path: &Path, detail: String) -> BenchError {
    BenchError::Chart {
        path: path.to_path_buf(),
        detail,
    }
}

/// Median tps (rows/s for commit-modes) per mode and target, each bar with its ratio to the
/// baseline target (the first).
fn throughput(r: &Results) -> Bars {
    // commit-modes: one target, rows/s, each bar with its ratio to the mode "none".
    let rows = r.scenario == "commit-modes";
    let modes = crate::report::ordered_modes(r);
    let series = r
        .settings
        .targets
        .iter()
        .enumerate()
        .map(|(i, target)| {
            let figures: Vec<_> = modes.iter().map(|(_, m)| m.get(target)).collect();
            Series {
                name: label(target).to_string(),
                colour: colour(i),
                values: figures.iter().map(|t| t.map(|t| t.median_tps)).collect(),
                labels: figures
                    .iter()
                    .map(|t| match t {
                        Some(t) if i == 0 && !rows => format!("{:.0}", t.median_tps),
                        Some(t) => format!("{:.0} ({:.2}×)", t.median_tps, t.ratio_to_direct),
                        None => String::new(),
                    })
                    .collect(),
            }
        })
        .collect();
    Bars {
        title: format!(
            "herd bench {}: median {} ({})",
            r.scenario,
            if rows { "rows/s" } else { "tps" },
            r.date
        ),
        y_desc: if rows {
            "rows per second"
        } else {
            "transactions per second"
        }
        .into(),
        y_format: |v| format!("{v:.0}"),
        groups: modes.iter().map(|(m, _)| m.to_string()).collect(),
        series,
        reference: None,
        legend: SeriesLabelPosition::UpperRight,
        width: 800,
    }
}

/// read-scaling: each query's speedup against the first mode (1 node), one group per query
/// and one bar per cluster size (the qps are in report.md).
fn speedup(r: &Results) -> Bars {
    let modes = crate::report::ordered_modes(r);
    let targets = &r.settings.targets;
    let series = modes
        .iter()
        .enumerate()
        .map(|(i, (mode, m))| {
            let values: Vec<Option<f64>> = targets
                .iter()
                .map(|t| m.get(t).map(|t| t.ratio_to_direct))
                .collect();
            Series::labelled(mode.to_string(), colour(i + 1), values, |v| {
                format!("{v:.2}×")
            })
        })
        .collect();
    Bars {
        title: format!(
            "herd bench {}: qps relative to 1 node ({})",
            r.scenario, r.date
        ),
        y_desc: "speedup (qps / qps with 1 node)".into(),
        y_format: |v| format!("{v:.1}×"),
        groups: targets.clone(),
        series,
        reference: Some(1.0),
        legend: SeriesLabelPosition::UpperLeft,
        width: 900,
    }
}

/// A chart with numeric axes drawn as SVG.
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// The frame of a chart over named groups: x runs over `0..x_max` (group names are drawn by
/// [`group_labels`], so the axis has no ticks of its own), y over `0..y_max`, described and
/// formatted as given.
fn group_chart<'a, 'b: 'a>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    title: &str,
    (x_max, y_max): (f64, f64),
    y_desc: &str,
    y_format: &dyn Fn(&f64) -> String,
) -> Result<Chart<'a, 'b>, String> {
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .x_label_formatter(&|_| String::new())
        .y_desc(y_desc)
        .y_label_formatter(y_format)
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(chart)
}

/// The legend box every chart uses.
fn legend<'a, 'b: 'a>(
    chart: &mut Chart<'a, 'b>,
    position: SeriesLabelPosition,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(position)
        .draw()
        .map_err(|e| e.to_string())
}

/// Writes `labels` under the x axis, one centred on each unit-wide group (the x axis is
/// numeric, so the names are placed in pixels from the chart's own coordinates).
fn group_labels(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    chart: &Chart<'_, '_>,
    labels: &[String],
    size: u32,
) -> Result<(), String> {
    for (g, text) in labels.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(g as f64 + 0.5, 0.0));
        let style = ("sans-serif", size)
            .into_font()
            .color(&BLACK)
            .pos(text_anchor::Pos::new(
                text_anchor::HPos::Center,
                text_anchor::VPos::Top,
            ));
        root.draw(&Text::new(text.as_str(), (x, y + 10), style))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}
