//! Line charts: failover RTO per iteration.

use std::path::Path;

use plotters::prelude::*;

use super::{colour, legend};
use crate::report::Results;

/// One line (with points) per commit mode: the RTO of every iteration.
pub fn rto(r: &Results, path: &Path) -> Result<(), String> {
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
        .y_desc("RTO (s): fault → first acknowledged write")
        .x_labels(iterations.min(20))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.1}"))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (mode, f)) in modes.iter().enumerate() {
        let colour = colour(i + 1);
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
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present().map_err(|e| e.to_string())
}
