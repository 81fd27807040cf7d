//! Grouped bar charts: one group per x label, one bar per series in each group.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor;

use super::{chart_error, group_chart, group_labels, legend};
use crate::BenchError;

/// One series of bars: a value (and the text above its bar) per group.
pub struct Series {
    /// Legend entry.
    pub name: String,
    /// Fill colour.
    pub colour: RGBColor,
    /// Per group; `None` leaves a gap.
    pub values: Vec<Option<f64>>,
    /// Per group, written above the bar (empty: nothing).
    pub labels: Vec<String>,
}

impl Series {
    /// A series whose bars are labelled with their values as `format` writes them.
    pub fn labelled(
        name: String,
        colour: RGBColor,
        values: Vec<Option<f64>>,
        format: impl Fn(f64) -> String,
    ) -> Series {
        let labels = values
            .iter()
            .map(|v| v.map_or(String::new(), &format))
            .collect();
        Series {
            name,
            colour,
            values,
            labels,
        }
    }
}

/// A grouped bar chart.
pub struct Bars {
    /// Caption.
    pub title: String,
    /// Y axis description.
    pub y_desc: String,
    /// Y tick labels.
    pub y_format: fn(&f64) -> String,
    /// Group names, under the x axis.
    pub groups: Vec<String>,
    /// The bars of each group, in this order.
    pub series: Vec<Series>,
    /// A horizontal line at this value (e.g. 1 for ratios).
    pub reference: Option<f64>,
    /// Where the legend goes.
    pub legend: SeriesLabelPosition,
    /// Width in pixels (height 480).
    pub width: u32,
}

/// Draws `bars` into `path` as SVG.
pub fn grouped(bars: &Bars, path: &Path) -> Result<(), BenchError> {
    draw(bars, path).map_err(|e| chart_error(path, e))
}

fn draw(b: &Bars, path: &Path) -> Result<(), String> {
    let max = b
        .series
        .iter()
        .flat_map(|s| s.values.iter().flatten().copied())
        .chain(b.reference)
        .fold(0.0_f64, f64::max);
    // Head room for the labels above the bars and for the legend box.
    let top = (max * 1.45).max(1.0);
    let groups = b.groups.len().max(1) as f64;
    let width = 0.8 / b.series.len().max(1) as f64;
    let root = SVGBackend::new(path, (b.width, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = group_chart(&root, &b.title, (groups, top), &b.y_desc, &b.y_format)?;
    for (i, s) in b.series.iter().enumerate() {
        let colour = s.colour;
        let x0 = |g: usize| g as f64 + 0.1 + i as f64 * width;
        let rects = s.values.iter().enumerate().filter_map(|(g, v)| {
            let v = (*v)?;
            Some(Rectangle::new(
                [(x0(g), 0.0), (x0(g) + width * 0.9, v)],
                colour.filled(),
            ))
        });
        chart
            .draw_series(rects)
            .map_err(|e| e.to_string())?
            .label(s.name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
        let texts = s
            .values
            .iter()
            .zip(&s.labels)
            .enumerate()
            .filter_map(|(g, (v, text))| {
                let v = (*v)?;
                if text.is_empty() {
                    return None;
                }
                let style =
                    ("sans-serif", 12)
                        .into_font()
                        .color(&BLACK)
                        .pos(text_anchor::Pos::new(
                            text_anchor::HPos::Center,
                            text_anchor::VPos::Bottom,
                        ));
                Some(Text::new(
                    text.clone(),
                    (x0(g) + width * 0.45, v + max * 0.01),
                    style,
                ))
            });
        chart.draw_series(texts).map_err(|e| e.to_string())?;
    }
    if let Some(y) = b.reference {
        chart
            .draw_series(std::iter::once(PathElement::new(
                [(0.0, y), (groups, y)],
                BLACK.stroke_width(1),
            )))
            .map_err(|e| e.to_string())?;
    }
    legend(&mut chart, b.legend.clone())?;
    group_labels(&root, &chart, &b.groups, 15)?;
    root.present().map_err(|e| e.to_string())
}
