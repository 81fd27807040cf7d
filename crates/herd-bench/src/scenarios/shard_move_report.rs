//! The report of `herd bench shard-move`: a table per move and a chart of the longest waits.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::SeriesLabelPosition;

use crate::chart::{colour, grouped, Bars, Series};
use crate::report::Results;
use crate::BenchError;

/// The Markdown table.
pub fn table(r: &Results) -> String {
    let Some(m) = &r.shard_move else {
        return String::new();
    };
    let mut md = format!(
        "Table: {} rows, {:.0} MiB on the two groups; the moved shard holds {} rows.\n\n\
         | move | total s | Herd's switch wait ms | moved shard: longest ms | p99 ms | other shards: longest ms | p99 ms | transactions (moved / other) | failed (moved / other) |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        m.rows,
        m.table_bytes as f64 / 1048576.0,
        m.moved_rows
    );
    for mv in &m.moves {
        let _ = writeln!(
            md,
            "| {} | {:.1} | {:.0} | {:.0} | {:.1} | {:.0} | {:.1} | {} / {} | {} / {} |",
            mv.groups,
            mv.total_s,
            mv.herd_wait_ms,
            mv.moved_max_ms,
            mv.moved_p99_ms,
            mv.other_max_ms,
            mv.other_p99_ms,
            mv.transactions.0,
            mv.transactions.1,
            mv.failed.0,
            mv.failed.1
        );
    }
    let _ = writeln!(
        md,
        "| before any move (other shards) | | | | | {:.0} | {:.1} | | |",
        m.baseline_other_max_ms, m.baseline_other_p99_ms
    );
    md
}

/// Bars per move: the moved shard's longest transaction, Herd's switch wait, the other
/// shards' longest transaction (and before any move).
pub fn chart(r: &Results, path: &Path) -> Result<(), BenchError> {
    let Some(m) = &r.shard_move else {
        return Ok(());
    };
    let mut groups: Vec<String> = m
        .moves
        .iter()
        .map(|mv| format!("move {}", mv.groups))
        .collect();
    groups.push("before".into());
    let with_none = |v: Vec<f64>| -> Vec<Option<f64>> {
        let mut out: Vec<Option<f64>> = v.into_iter().map(Some).collect();
        out.push(None);
        out
    };
    let ms = |v: f64| format!("{v:.0}");
    let mut other: Vec<Option<f64>> = m.moves.iter().map(|mv| Some(mv.other_max_ms)).collect();
    other.push(Some(m.baseline_other_max_ms));
    let bars = Bars {
        title: "Longest write during a shard move (ms)".into(),
        y_desc: "ms".into(),
        y_format: |v| format!("{v:.0}"),
        groups,
        series: vec![
            Series::labelled(
                "moved shard".into(),
                colour(0),
                with_none(m.moves.iter().map(|mv| mv.moved_max_ms).collect()),
                ms,
            ),
            Series::labelled(
                "Herd's switch wait".into(),
                colour(1),
                with_none(m.moves.iter().map(|mv| mv.herd_wait_ms).collect()),
                ms,
            ),
            Series::labelled("other shards".into(), colour(2), other, ms),
        ],
        reference: Some(1000.0),
        legend: SeriesLabelPosition::UpperRight,
        width: 900,
    };
    grouped(&bars, path)
}
