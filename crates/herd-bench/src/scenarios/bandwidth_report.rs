//! `herd bench bandwidth`: the figures' types, the report table (laid out like reference 004's
//! summary, its published figures beside ours) and the ratio chart.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::SeriesLabelPosition;
use serde::{Deserialize, Serialize};

use crate::chart::{colour, grouped, Bars, Series};
use crate::report::Results;
use crate::BenchError;

/// The workloads, in table and run order: pgbench TPC-B at a fixed rate right after a
/// checkpoint (most updates write a full-page image), the same again at once (few full-page
/// images: the steady state of reference 004's 200 s run), one bulk insert, single-row commits.
pub const WORKLOADS: [&str; 4] = [
    "pgbench-checkpoint",
    "pgbench",
    "bulk-insert",
    "single-commits",
];

/// The publisher's `wal_compression` settings measured, in table order.
pub const COMPRESSIONS: [&str; 3] = ["off", "lz4", "zstd"];

/// Bytes one replication stream carried during one workload (deltas over the workload, read
/// once both streams had caught up).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamBytes {
    /// The headline figure: TCP payload bytes the walsender's socket sent (`tcpi_bytes_sent`
    /// of the socket, read with `ss -ti`; loopback, so no retransmissions).
    pub socket_bytes: u64,
    /// How far the stream's `sent_lsn` advanced: WAL bytes read (physical: sent) by the
    /// walsender.
    pub sent_lsn_bytes: u64,
    /// Logical only: bytes of decoded changes the walsender spilled to disk because a
    /// transaction outgrew `logical_decoding_work_mem` (`pg_stat_replication_slots.spill_bytes`).
    pub spill_bytes: u64,
}

/// One workload under one `wal_compression` setting.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BandwidthRow {
    /// One of [`WORKLOADS`].
    pub workload: String,
    /// The publisher's `wal_compression` (one of [`COMPRESSIONS`]).
    pub wal_compression: String,
    /// The physical stream to the publisher's hot standby.
    pub physical: StreamBytes,
    /// The logical stream to the subscription of the same tables.
    pub logical: StreamBytes,
    /// WAL the publisher wrote during the workload (`pg_current_wal_lsn()` delta).
    pub wal_bytes: u64,
    /// What the bytes are divided by for the per-unit columns: pgbench transactions, rows of the
    /// bulk insert, or single-row commits.
    pub units: u64,
    /// "txn", "row" or "commit".
    pub unit: String,
    /// Seconds the workload ran (without the catch-up wait).
    pub seconds: f64,
    /// Logical socket bytes over physical socket bytes (0 when physical is 0).
    pub ratio_logical_to_physical: f64,
}

/// Reference 004's published TX bytes (logical, physical) per workload: pgbench -c 3 -R 1000
/// -T 200, one insert of 50,000,001 rows, 100,000 single-row inserts (its loop; its text says
/// 10K), PostgreSQL 9.6 with pglogical 2.2 against streaming replication.
pub fn published(workload: &str) -> Option<(u64, u64, &'static str)> {
    match workload {
        "pgbench" => Some((195_120_378, 122_636_756, "200 s at 1000 tps")),
        "bulk-insert" => Some((2_465_344_586, 7_502_525_286, "50,000,001 rows")),
        "single-commits" => Some((44_468_348, 33_334_914, "100,000 commits")),
        _ => None,
    }
}

fn mb(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / 1_048_576.0)
}

fn per(bytes: u64, units: u64) -> String {
    if units == 0 {
        return "n/a".into();
    }
    format!("{:.0}", bytes as f64 / units as f64)
}

/// The rows of `r` in workload, then compression order.
pub fn ordered(r: &Results) -> Vec<&BandwidthRow> {
    let rank = |row: &BandwidthRow| {
        let w = WORKLOADS.iter().position(|w| *w == row.workload);
        let c = COMPRESSIONS.iter().position(|c| *c == row.wal_compression);
        (w.unwrap_or(usize::MAX), c.unwrap_or(usize::MAX))
    };
    let mut rows: Vec<&BandwidthRow> = r.bandwidth.iter().collect();
    rows.sort_by_key(|row| rank(row));
    rows
}

/// The copies made with `herd copy`: what each sends, its bytes, the physical stream's.
pub fn copies_table(r: &Results) -> String {
    if r.copy_bandwidth.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "\n### Logical copies made with `herd copy` (one bulk insert each)\n\n\
         | copy | options | rows | copy MiB | physical MiB | copy/physical | copy B/row |\n\
         |---|---|---:|---:|---:|---:|---:|\n",
    );
    for c in &r.copy_bandwidth {
        let _ = writeln!(
            md,
            "| {} | `{}` | {} | {} | {} | {:.2} | {} |",
            c.copy,
            c.options,
            c.rows,
            mb(c.copy_bytes),
            mb(c.physical_bytes),
            c.ratio_to_physical,
            per(c.copy_bytes, c.rows)
        );
    }
    md.push_str(
        "\nEach copy measured alone (the others paused): TCP payload Herd's endpoint relayed to the \
         copy's target during the insert, beside what the walsender sent the standby during the same \
         insert. Reference 004's bulk insert (whole table, pglogical) sent 0.33× the physical stream.\n",
    );
    md
}

/// workload | wal_compression | logical MiB | physical MiB | ratio | per unit | WAL | 004.
pub fn table(r: &Results) -> String {
    let mut md = String::from(
        "| workload | wal_compression | logical MiB | physical MiB | logical/physical \
         | logical B/unit | physical B/unit | WAL MiB | reference 004: logical/physical MiB (ratio) |\n",
    );
    md += &("|---".repeat(9) + "|\n");
    for row in ordered(r) {
        let reference = published(&row.workload).map_or(String::new(), |(l, p, what)| {
            format!("{} / {} ({:.2}, {what})", mb(l), mb(p), l as f64 / p as f64)
        });
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.2} | {} /{} | {} /{} | {} | {reference} |",
            row.workload,
            row.wal_compression,
            mb(row.logical.socket_bytes),
            mb(row.physical.socket_bytes),
            row.ratio_logical_to_physical,
            per(row.logical.socket_bytes, row.units),
            row.unit,
            per(row.physical.socket_bytes, row.units),
            row.unit,
            mb(row.wal_bytes),
        );
    }
    md.push_str(
        "\nCross-checks (MiB): socket bytes / sent_lsn advance / spilled to disk, logical then \
         physical:\n\n",
    );
    for row in ordered(r) {
        let s = |b: &StreamBytes| {
            format!(
                "{} / {} / {}",
                mb(b.socket_bytes),
                mb(b.sent_lsn_bytes),
                mb(b.spill_bytes)
            )
        };
        let _ = writeln!(
            md,
            "- {} ({}, {} {}s in {:.1} s): logical {}; physical {}",
            row.workload,
            row.wal_compression,
            row.units,
            row.unit,
            row.seconds,
            s(&row.logical),
            s(&row.physical)
        );
    }
    md
}

/// The chart: logical ÷ physical bytes per workload, one bar per `wal_compression` setting and
/// one for reference 004, with a line at 1 (equal bytes).
pub fn chart(r: &Results, path: &Path) -> Result<(), BenchError> {
    let series = COMPRESSIONS
        .iter()
        .copied()
        .chain(["004"])
        .enumerate()
        .map(|(i, s)| {
            let values = WORKLOADS
                .iter()
                .map(|w| {
                    if s == "004" {
                        let (l, p, _) = published(w)?;
                        return Some(l as f64 / p as f64);
                    }
                    r.bandwidth
                        .iter()
                        .find(|row| row.workload == *w && row.wal_compression == s)
                        .map(|row| row.ratio_logical_to_physical)
                })
                .collect::<Vec<_>>();
            let name = if s == "004" {
                "reference 004 (pglogical, PG 9.6)".to_string()
            } else {
                format!("wal_compression = {s}")
            };
            Series::labelled(name, colour(i + 1), values, |v| format!("{v:.2}"))
        })
        .collect();
    grouped(
        &Bars {
            title: format!(
                "herd bench {}: logical / physical bytes ({})",
                r.scenario, r.date
            ),
            y_desc: "logical bytes / physical bytes (1 = equal)".into(),
            y_format: |v| format!("{v:.1}"),
            groups: WORKLOADS.iter().map(|w| w.to_string()).collect(),
            series,
            reference: Some(1.0),
            legend: SeriesLabelPosition::UpperRight,
            width: 800,
        },
        path,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(workload: &str, compression: &str, logical: u64, physical: u64) -> BandwidthRow {
        let bytes = |b| StreamBytes {
            socket_bytes: b,
            sent_lsn_bytes: b,
            spill_bytes: 0,
        };
        BandwidthRow {
            workload: workload.into(),
            wal_compression: compression.into(),
            physical: bytes(physical),
            logical: bytes(logical),
            wal_bytes: physical,
            units: 1000,
            unit: "row".into(),
            seconds: 1.5,
            ratio_logical_to_physical: logical as f64 / physical as f64,
        }
    }

    #[test]
    fn table_orders_rows_and_shows_the_reference() {
        let mut r = crate::report::tests_sample();
        r.scenario = "bandwidth".into();
        r.bandwidth = vec![
            row("single-commits", "off", 3_000_000, 2_000_000),
            row("bulk-insert", "zstd", 1_048_576, 3_145_728),
            row("bulk-insert", "off", 1_048_576, 3_145_728),
        ];
        let t = table(&r);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[2].starts_with("| bulk-insert | off | 1.0 | 3.0 | 0.33 | 1049 /row"));
        assert!(lines[3].starts_with("| bulk-insert | zstd |"), "{t}");
        assert!(lines[4].starts_with("| single-commits | off |"), "{t}");
        assert!(t.contains("logical 2.9 / 2.9 / 0.0; physical 1.9"), "{t}");
        assert!(t.contains("(0.33, 50,000,001 rows)"), "{t}");
        let dir = tempfile::tempdir().expect("tempdir");
        let (md, _) = crate::report::write_all(&r, dir.path()).expect("write");
        assert!(md.contains("| bulk-insert | off |"), "{md}");
        let svg = std::fs::read_to_string(dir.path().join("bandwidth.svg")).expect("svg");
        assert!(svg.contains("wal_compression = off") && svg.contains("reference 004"));
        let back: Results =
            serde_json::from_value(serde_json::to_value(&r).expect("json")).expect("parse");
        assert_eq!(back, r);
    }
}
