//! The report of `herd bench backup`: the copies' times and speeds, the primary's rate during
//! backups, and a chart of the speeds.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::SeriesLabelPosition;

use crate::chart::{colour, grouped, Bars, Series};
use crate::report::Results;
use crate::BenchError;

/// The Markdown tables.
pub fn table(r: &Results) -> String {
    let Some(b) = &r.backup else {
        return String::new();
    };
    let mut md = format!(
        "Cluster: pgbench scale {}, {:.0} MB (every database).\n\n\
         | copy | median s | MB/s | time vs baseline | each round, s |\n\
         |---|---|---|---|---|\n",
        b.scale,
        b.cluster_bytes as f64 / 1e6
    );
    for c in &b.copies {
        let each: Vec<String> = c.seconds.iter().map(|s| format!("{s:.1}")).collect();
        let _ = writeln!(
            md,
            "| {} | {:.1} | {:.1} | {:.2} | {} |",
            c.copy,
            c.median_s,
            c.mb_per_s,
            c.vs_baseline,
            each.join(", ")
        );
    }
    md.push_str(
        "\nBaselines: pg_basebackup for the backups, the copy of a pg_basebackup for the \
         restore.\n",
    );
    md.push_str(
        "\n| primary's pgbench TPC-B | median tps | vs no backup | backups completed |\n\
         |---|---|---|---|\n",
    );
    for l in &b.load {
        let _ = writeln!(
            md,
            "| {} | {:.0} | {:.2} | {} |",
            l.during, l.median_tps, l.ratio, l.backups
        );
    }
    md
}

/// Bars: each copy's MB/s.
pub fn chart(r: &Results, path: &Path) -> Result<(), BenchError> {
    let Some(b) = &r.backup else {
        return Ok(());
    };
    let bars = Bars {
        title: "Backup and restore speed (MB/s of the cluster's size)".into(),
        y_desc: "MB/s".into(),
        y_format: |v| format!("{v:.0}"),
        groups: b.copies.iter().map(|c| c.copy.clone()).collect(),
        series: vec![Series::labelled(
            "MB/s".into(),
            colour(0),
            b.copies.iter().map(|c| Some(c.mb_per_s)).collect(),
            |v| format!("{v:.0}"),
        )],
        reference: None,
        legend: SeriesLabelPosition::UpperRight,
        width: 1000,
    };
    grouped(&bars, path)
}
