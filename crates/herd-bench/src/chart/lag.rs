//! `herd bench lag`: replication lag over time, one line per phase, as SVG.

use std::path::Path;

use plotters::prelude::*;

use super::{colour, legend};
use crate::report::Results;

/// Draws the time lag (ms) of every sample of every phase of `r` into `path`: the top panel in
/// milliseconds, the bottom one in WAL bytes.
pub fn draw(r: &Results, path: &Path) -> Result<(), String> {
    let phases = crate::scenarios::lag_report::ordered(r);
    let root = SVGBackend::new(path, (800, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let root = root
        .titled(
            &format!("herd bench lag: replica lag sampled at 10 Hz ({})", r.date),
            ("sans-serif", 20),
        )
        .map_err(|e| e.to_string())?;
    let (top, bottom) = root.split_vertically(300);
    let panels = [
        (top, 2usize, "time lag (ms)", 1.0),
        (bottom, 1usize, "lag (KiB of WAL)", 1024.0),
    ];
    let t_max = phases
        .iter()
        .flat_map(|(_, l)| l.series.iter().map(|s| s[0]))
        .fold(1.0_f64, f64::max);
    // Whole seconds repeat on short (quick) phases: tenths there.
    let x_digits = if t_max < 10.0 { 1 } else { 0 };
    for (k, (area, column, desc, unit)) in panels.into_iter().enumerate() {
        let y_max = phases
            .iter()
            .flat_map(|(_, l)| l.series.iter().map(|s| s[column] / unit))
            .fold(0.0_f64, f64::max);
        let mut chart = ChartBuilder::on(&area)
            .margin(15)
            .x_label_area_size(35)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..t_max, 0.0..(y_max * 1.1).max(1.0))
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("seconds into the phase")
            .y_desc(desc)
            .x_label_formatter(&|v| format!("{v:.x_digits$}"))
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, (phase, l)) in phases.iter().enumerate() {
            let colour = colour(i);
            let points: Vec<(f64, f64)> =
                l.series.iter().map(|s| (s[0], s[column] / unit)).collect();
            let drawn = chart
                .draw_series(std::iter::once(PathElement::new(
                    points,
                    colour.stroke_width(1),
                )))
                .map_err(|e| e.to_string())?;
            // One legend is enough: the top panel's.
            if k == 0 {
                drawn
                    .label(format!("{phase} (p95 {:.0} ms)", l.time_ms.p95))
                    .legend(move |(x, y)| {
                        PathElement::new([(x, y), (x + 14, y)], colour.stroke_width(2))
                    });
            }
        }
        if k == 0 {
            legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        }
    }
    root.present().map_err(|e| e.to_string())
}
