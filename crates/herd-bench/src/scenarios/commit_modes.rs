//! `herd bench commit-modes`: rows inserted per second with no replication and with each commit
//! mode on a 2-replica cluster (reference 000, write table), plus Herd's `session` consistency
//! (async commits, read-your-writes reads through the proxy).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use indicatif::ProgressBar;

use super::dataset::{load, random_metrics, T0};
use crate::cluster::ScratchCluster;
use crate::pgbench::{median, Pgbench};
use crate::process::write_script;
use crate::report::{Machine, ModeResult, Results, Settings, TargetResult};
use crate::{BenchError, BenchOptions};

/// Herd's commit modes, weakest first.
pub(super) const COMMIT_MODES: [&str; 4] = ["async", "remote_write", "on", "remote_apply"];
/// Rows of the report: the baseline, the four modes, then the proxy's `session` consistency.
const ROWS: [&str; 6] = [
    "none",
    "async",
    "remote_write",
    "on",
    "remote_apply",
    "session",
];
const CLIENTS: u32 = 8;
const THREADS: u32 = 2;
/// Rows per inserted batch (one transaction).
const BATCH: u32 = 100;

/// The insert of one batch: `BATCH` devices' ten metrics at the client's next time point.
fn insert_sql(devices: u32) -> String {
    let metrics = random_metrics();
    format!(
        "insert into cpu select to_timestamp({T0} + :n * 10), \
         'host_' || ((:client_id * {BATCH} + g) % {devices}), {metrics} \
         from generate_series(1, {BATCH}) g;\n"
    )
}

/// Runs the scenario; the figures for the report.
pub fn run(opts: &BenchOptions, bar: &ProgressBar) -> Result<Results, BenchError> {
    // Devices with `points` preloaded readings each (one every 10 s).
    let (rounds, default_secs, devices, points) = match opts.quick {
        true => (1u32, 2, 800u32, 5u32),
        false => (3, 10, 4000, 90),
    };
    let devices = opts.scale.unwrap_or(devices).max(1);
    let duration = opts.duration.unwrap_or(default_secs);
    let pgbench = Pgbench::locate()?;
    let mut notes = Vec::new();
    let mut runs: BTreeMap<&str, (Vec<f64>, u64)> = BTreeMap::new();
    // Jobs: (label, mode to set). Replicated rows rotate their order every round.
    let replicated: Vec<&str> = ROWS[1..].to_vec();
    let mut jobs = vec![("none", None); rounds as usize];
    for round in 0..rounds as usize {
        for k in 0..replicated.len() {
            let row = replicated[(k + round) % replicated.len()];
            jobs.push((row, Some(if row == "session" { "async" } else { row })));
        }
    }
    bar.set_length(jobs.len() as u64);
    let mut offset = 0u64;
    for replicas in [0u32, 2] {
        bar.set_message(format!(
            "starting a scratch cluster with {replicas} replicas"
        ));
        let herd = ScratchCluster::start_with(opts, &["--replicas", &replicas.to_string()])?;
        bar.set_message(format!("loading {} × {} rows", devices, points));
        load(&herd, devices, points)?;
        let direct = write_script(herd.dir(), "insert.sql", &insert_sql(devices))?;
        let session = write_script(
            herd.dir(),
            "session.sql",
            &format!(
                "{}select 1 / count(*) from cpu where time = to_timestamp({T0} + :n * 10) \
                 and hostname = 'host_' || ((:client_id * {BATCH} + 1) % {});\n",
                insert_sql(devices),
                devices
            ),
        )?;
        let before = herd.metrics(&["herd_routed_total", "herd_ryw_"]);
        for &(row, mode) in &jobs {
            if (replicas == 0) != mode.is_none() {
                continue;
            }
            if let Some(m) = mode {
                bar.set_message(format!("{row}: herd config set commit-mode {m}"));
                herd.set_commit_mode(m)?;
                if !herd.settle()? {
                    notes.push(format!(
                        "{row}: replicas still > 1 MiB behind when it started."
                    ));
                }
            }
            bar.set_message(format!("{row}: pgbench -c {CLIENTS} -T {duration}"));
            let (script, url) = match row {
                "session" => (&session, &herd.proxy_url),
                _ => (&direct, &herd.primary_url),
            };
            // Each run starts at fresh time points, so a read-back can only find its own row.
            offset += 1_000_000;
            let args: Vec<String> =
                format!("-n -c {CLIENTS} -j {THREADS} -T {duration} -D n={offset} -f")
                    .split(' ')
                    .map(String::from)
                    .chain([script.display().to_string()])
                    .collect();
            let what = format!("pgbench ({row}) on {url}");
            let r = pgbench.run(&what, &args, url, Duration::from_secs(duration + 120))?;
            let e = runs.entry(row).or_default();
            e.0.push(r.tps * f64::from(BATCH));
            e.1 += r.failed;
            bar.inc(1);
        }
        if replicas == 2 {
            let after = herd.metrics(&["herd_routed_total", "herd_ryw_"]);
            let moved: Vec<String> = after
                .iter()
                .map(|(k, v)| (k, v - before.get(k).copied().unwrap_or(0.0)))
                .filter(|(_, d)| *d > 0.0)
                .map(|(k, d)| format!("`{k}` +{d:.0}"))
                .collect();
            notes.push(format!(
                "Proxy counters during the replicated runs (only `session` goes through the \
                 proxy): {}.",
                if moved.is_empty() {
                    "none read".into()
                } else {
                    moved.join(", ")
                }
            ));
        } else {
            let names = herd.psql(&herd.primary_url, &["show synchronous_standby_names"])?;
            notes.push(format!(
                "`none`: a cluster started with `--replicas 0` (synchronous_standby_names = \
                 '{}'), measured before the replicated cluster was created.",
                names.trim()
            ));
        }
    }
    let base = runs.get("none").and_then(|(r, _)| median(r)).unwrap_or(0.0);
    let modes = ROWS
        .iter()
        .filter_map(|row| {
            let (r, failed) = runs.get(row)?;
            let m = median(r).unwrap_or(0.0);
            let t = TargetResult {
                runs: r.clone(),
                median_tps: m,
                ratio_to_direct: if base > 0.0 { m / base } else { 0.0 },
                failed_transactions: *failed,
            };
            Some((row.to_string(), ModeResult::from([("rows".to_string(), t)])))
        })
        .collect();
    notes.push(format!(
        "Each transaction inserts {BATCH} rows (pgbench tps × {BATCH} = rows/s); `session` also \
         reads one of its rows back through the proxy (`select 1 / count(*)`, so a missed row \
         would fail the run) and counts only the inserted rows."
    ));
    notes.push(
        "pgbench, Herd and all PostgreSQL servers share this machine's cores and disk; the \
         article used three 8-core VMs with network-attached SSDs."
            .into(),
    );
    Ok(Results {
        scenario: "commit-modes".into(),
        date: crate::report::now_utc(),
        quick: opts.quick,
        machine: Machine::detect(),
        settings: Settings {
            command: format!(
                "pgbench -n -c {CLIENTS} -j {THREADS} -T {duration} -f insert.sql (batch of \
                 {BATCH} rows) URL"
            ),
            rounds,
            duration_s: duration,
            scale: devices,
            modes: ROWS.iter().map(|m| m.to_string()).collect(),
            targets: vec!["rows".into()],
            versions: [("herd".to_string(), env!("CARGO_PKG_VERSION").to_string())].into(),
        },
        modes,
        published: published(),
        notes,
        ..Default::default()
    })
}

/// What reference 000 says about each mode's insert rate relative to no replication.
fn published() -> BTreeMap<String, String> {
    let sync_write = "Synchronous Write: between the two (figures not in the stored text)";
    [
        ("none", "1.00× (baseline)"),
        ("async", "negligible drop (≈ 1.0×)"),
        ("remote_write", sync_write),
        ("on", sync_write),
        ("remote_apply", "Synchronous Apply: ~50 % drop (≈ 0.5×)"),
        ("session", "not in the article"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The report's table: mode | rows/s | ratio to none | failed | runs | reference 000.
pub(crate) fn table(r: &Results) -> String {
    let mut md =
        "| mode | rows/s | ratio to none | failed txns | runs (rows/s) | reference 000 |\n\
                  |---|---|---|---|---|---|\n"
            .to_string();
    for (mode, targets) in crate::report::ordered_modes(r) {
        let Some(t) = targets.get("rows") else {
            continue;
        };
        let runs: Vec<String> = t.runs.iter().map(|v| format!("{v:.0}")).collect();
        let _ = writeln!(
            md,
            "| {mode} | {:.0} | {:.2}× | {} | {} | {} |",
            t.median_tps,
            t.ratio_to_direct,
            t.failed_transactions,
            runs.join(", "),
            r.published.get(mode).map_or("", String::as_str)
        );
    }
    md
}
