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
    draw(results, path).map_err(|detail| BenchError::Chart {
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

    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("herd bench {}: median tps ({})", r.scenario, r.date),
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
        .y_desc("transactions per second")
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
            let text = if i == 0 {
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
