//! `herd bench commit-waits` (reference 002): 5 pgbench clients each committing
//! `insert into demo select from generate_series(1,1000)` on the primary of a 2-replica cluster,
//! once per commit mode, while a second connection samples the wait events of the committing
//! backends from `pg_stat_activity` every 50 ms.
//!
//! In `results.json` every mode has the targets `tps`, `latency_ms` (pgbench's latency average),
//! `sample_hz` (samples per second achieved) and one `wait:EVENT` per wait event seen
//! (`wait:CPU` when `wait_event` is NULL); a `wait:` target's `median_tps` is its share of all
//! backend samples of that mode over every run, so the shares of a mode sum to 1, and its `runs`
//! are the shares per run. `ratio_to_direct` is the median relative to mode `async`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use indicatif::ProgressBar;

use super::commit_modes::COMMIT_MODES;
use crate::cluster::ScratchCluster;
use crate::pgbench::{median, parse_output, Pgbench};
use crate::process::{run_limited, write_script};
use crate::report::{Machine, ModeResult, Results, Settings, TargetResult};
use crate::{BenchError, BenchOptions};

const CLIENTS: u32 = 5;
const THREADS: u32 = 2;
/// Sampling period.
const PERIOD_MS: u32 = 50;
/// The statement of reference 002, committed on its own (autocommit), so the commit's waits
/// happen while `pg_stat_activity.query` shows it.
const STATEMENT: &str = "insert into demo select from generate_series(1,1000);\n";
/// The events the table shows in their own columns; the rest are summed as "other".
const MAIN: [&str; 4] = ["IO:WALSync", "IPC:SyncRep", "LWLock:WALWrite", "CPU"];

/// A plpgsql loop sampling the committing backends every `PERIOD_MS` for `secs` seconds into a
/// temporary table (a fresh statistics snapshot each time), then one `event|count` line per
/// event plus `#samples|N` and `#ms|elapsed`.
fn sampler_sql(secs: u64) -> [String; 3] {
    let setup = "create temp table w (ev text); create temp table n (samples int, ms float8)";
    let sample = format!(
        "do $$ declare k int := 0; t0 timestamptz := clock_timestamp(); \
         next timestamptz := clock_timestamp(); begin \
         while clock_timestamp() < t0 + interval '{secs} s' loop \
           perform pg_stat_clear_snapshot(); \
           insert into w select coalesce(wait_event_type || ':' || wait_event, 'CPU') \
             from pg_stat_activity where backend_type = 'client backend' and state = 'active' \
             and query like 'insert into demo%'; \
           k := k + 1; next := next + interval '{PERIOD_MS} ms'; \
           if next > clock_timestamp() then \
             perform pg_sleep(extract(epoch from next - clock_timestamp())); \
           else next := clock_timestamp(); end if; \
         end loop; \
         insert into n values (k, extract(epoch from clock_timestamp() - t0) * 1000); end $$"
    );
    let report = "select ev, count(*) from w group by ev union all \
                  select '#samples', samples from n union all select '#ms', ms::bigint from n";
    [setup.to_string(), sample, report.to_string()]
}

/// What one run measured.
struct Run {
    tps: f64,
    failed: u64,
    latency_ms: f64,
    hz: f64,
    counts: BTreeMap<String, u64>,
}

/// Runs the scenario; the figures for the report.
pub fn run(opts: &BenchOptions, bar: &ProgressBar) -> Result<Results, BenchError> {
    let (rounds, default_secs) = if opts.quick { (1, 2) } else { (2, 10) };
    let secs = opts.duration.unwrap_or(default_secs);
    let pgbench = Pgbench::locate()?;
    let mut notes = Vec::new();
    bar.set_message("starting a scratch cluster with 2 replicas");
    let herd = ScratchCluster::start_with(opts, &["--replicas", "2"])?;
    let create = "create table demo (id bigint generated always as identity primary key, \
                  created timestamptz not null default now())";
    herd.psql(&herd.primary_url, &[create])?;
    let script = write_script(herd.dir(), "demo.sql", STATEMENT)?;
    let args: Vec<String> = format!("-n -c {CLIENTS} -j {THREADS} -T {secs} -f")
        .split(' ')
        .map(String::from)
        .chain([script.display().to_string()])
        .collect();

    let mut jobs = Vec::new();
    for round in 0..rounds {
        for k in 0..COMMIT_MODES.len() {
            jobs.push(COMMIT_MODES[(k + round) % COMMIT_MODES.len()]);
        }
    }
    bar.set_length(jobs.len() as u64);
    let mut runs: BTreeMap<&str, Vec<Run>> = BTreeMap::new();
    for mode in jobs {
        bar.set_message(format!("{mode}: herd config set commit-mode {mode}"));
        herd.set_commit_mode(mode)?;
        if !herd.settle()? {
            notes.push(format!(
                "{mode}: replicas still > 1 MiB behind when it started."
            ));
        }
        bar.set_message(format!(
            "{mode}: pgbench -c {CLIENTS} -T {secs}, sampling waits"
        ));
        let sql = sampler_sql(secs);
        let sampler = herd.psql_cmd(&herd.primary_url, &sql.each_ref().map(String::as_str));
        let sampling =
            std::thread::spawn(move || run_limited("the wait-event sampler", sampler, secs + 120));
        let what = format!("pgbench -c {CLIENTS} ({mode})");
        let out = pgbench.run_raw(
            &what,
            &args,
            &herd.primary_url,
            Duration::from_secs(secs + 120),
        );
        let sampled = sampling.join().unwrap_or_else(|_| {
            Err(BenchError::Missing(
                "the wait-event sampler thread panicked".into(),
            ))
        });
        let (out, sampled) = (out?, sampled?);
        let pg = parse_output(&out).ok_or_else(|| BenchError::Parse {
            what: what.clone(),
            output: out.clone(),
        })?;
        let latency_ms = out
            .lines()
            .find_map(|l| l.trim().strip_prefix("latency average = "))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .ok_or_else(|| BenchError::Parse {
                what: format!("{what}: latency average"),
                output: out.clone(),
            })?;
        let mut counts = BTreeMap::new();
        for line in sampled.lines() {
            if let Some((ev, n)) = line.rsplit_once('|') {
                counts.insert(ev.to_string(), n.trim().parse::<u64>().unwrap_or(0));
            }
        }
        let samples = counts.remove("#samples").unwrap_or(0);
        let ms = counts.remove("#ms").unwrap_or(0);
        runs.entry(mode).or_default().push(Run {
            tps: pg.tps,
            failed: pg.failed,
            latency_ms,
            hz: if ms > 0 {
                samples as f64 * 1000.0 / ms as f64
            } else {
                0.0
            },
            counts,
        });
        bar.inc(1);
    }
    drop(herd);

    let mut modes = BTreeMap::new();
    for mode in COMMIT_MODES {
        modes.insert(
            mode.to_string(),
            summarise(runs.get(mode).map_or(&[][..], |r| r)),
        );
    }
    // Ratios relative to async, target by target.
    let base = modes.get("async").cloned().unwrap_or_default();
    for per_target in modes.values_mut() {
        for (name, t) in per_target.iter_mut() {
            let b = base.get(name).map_or(0.0, |b| b.median_tps);
            t.ratio_to_direct = if b > 0.0 { t.median_tps / b } else { 0.0 };
        }
    }
    let mut others: BTreeMap<String, u64> = BTreeMap::new();
    for r in runs.values().flatten() {
        for (ev, n) in &r.counts {
            if !MAIN.contains(&ev.as_str()) {
                *others.entry(ev.clone()).or_default() += n;
            }
        }
    }
    if !others.is_empty() {
        let list: Vec<String> = others.iter().map(|(e, n)| format!("{e} ({n})")).collect();
        notes.push(format!(
            "\"other\" wait events seen (samples): {}.",
            list.join(", ")
        ));
    }
    notes.push(format!(
        "Samples: `pg_stat_activity` rows of client backends that are active in \
         `insert into demo…`, read every {PERIOD_MS} ms by a plpgsql loop on its own connection \
         (fresh statistics snapshot each time); a share is that event's samples over all \
         samples of the mode. `CPU` = no wait event (running, or waiting on something \
         PostgreSQL does not instrument)."
    ));
    notes.push(
        "pgbench, the sampler and all three PostgreSQL servers share this machine's cores and \
         disk; reference 002 ran against RDS over a network (its latencies include round trips \
         for BEGIN and COMMIT)."
            .into(),
    );
    let mut targets = vec!["tps".to_string(), "latency_ms".into(), "sample_hz".into()];
    targets.extend(MAIN.iter().map(|e| format!("wait:{e}")));
    Ok(Results {
        scenario: "commit-waits".into(),
        date: crate::report::now_utc(),
        quick: opts.quick,
        machine: Machine::detect(),
        settings: Settings {
            command: format!(
                "pgbench -n -c {CLIENTS} -j {THREADS} -T {secs} -f demo.sql PRIMARY_URL \
                 (demo.sql: {})",
                STATEMENT.trim()
            ),
            rounds: rounds as u32,
            duration_s: secs,
            scale: 0,
            modes: COMMIT_MODES.iter().map(|m| m.to_string()).collect(),
            targets,
            versions: [("herd".to_string(), env!("CARGO_PKG_VERSION").to_string())].into(),
        },
        modes,
        published: published(),
        notes,
        ..Default::default()
    })
}

/// One mode's targets from its runs.
fn summarise(runs: &[Run]) -> ModeResult {
    let target = |runs: Vec<f64>, median_tps: f64, failed: u64| TargetResult {
        runs,
        median_tps,
        ratio_to_direct: 0.0,
        failed_transactions: failed,
    };
    let of = |f: fn(&Run) -> f64| {
        let v: Vec<f64> = runs.iter().map(f).collect();
        let m = median(&v).unwrap_or(0.0);
        target(v, m, 0)
    };
    let mut out = ModeResult::new();
    let mut tps = of(|r| r.tps);
    tps.failed_transactions = runs.iter().map(|r| r.failed).sum();
    out.insert("tps".into(), tps);
    out.insert("latency_ms".into(), of(|r| r.latency_ms));
    out.insert("sample_hz".into(), of(|r| r.hz));
    let mut events: Vec<String> = MAIN.iter().map(|e| e.to_string()).collect();
    for ev in runs.iter().flat_map(|r| r.counts.keys()) {
        if !events.contains(ev) {
            events.push(ev.clone());
        }
    }
    let total: u64 = runs.iter().flat_map(|r| r.counts.values()).sum();
    for ev in events {
        let share_of = |r: &Run| {
            let all: u64 = r.counts.values().sum();
            let n = r.counts.get(&ev).copied().unwrap_or(0);
            if all > 0 {
                n as f64 / all as f64
            } else {
                0.0
            }
        };
        let n: u64 = runs
            .iter()
            .map(|r| r.counts.get(&ev).copied().unwrap_or(0))
            .sum();
        let pooled = if total > 0 {
            n as f64 / total as f64
        } else {
            0.0
        };
        out.insert(
            format!("wait:{ev}"),
            target(runs.iter().map(share_of).collect(), pooled, 0),
        );
    }
    out
}

/// What reference 002 reports (RDS, one hour, `begin; insert …; commit;` from 5 sessions).
fn published() -> BTreeMap<String, String> {
    [
        (
            "async",
            "closest: RDS Multi-AZ instance (storage-level replication): IO:WALSync + \
             LWLock:WALWrite, no IPC:SyncRep; 106.8 ms/txn, 46.8 tps",
        ),
        ("remote_write", "not measured (expect IPC:SyncRep)"),
        (
            "on",
            "RDS Multi-AZ DB cluster (PostgreSQL sync replication): IO:WALSync + IPC:SyncRep; \
             109.1 ms/txn (insert 39.5 + commit 36.6 ms), 45.8 tps",
        ),
        ("remote_apply", "not measured (expect IPC:SyncRep)"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The report's table: mode | tps | latency | the four main shares | other | samples/s | 002.
pub(crate) fn table(r: &Results) -> String {
    let mut md = "| mode | tps | latency avg (ms) | IO:WALSync | IPC:SyncRep | LWLock:WALWrite \
                  | CPU | other | samples/s | reference 002 |\n"
        .to_string()
        + &"|---".repeat(10)
        + "|\n";
    for (mode, t) in crate::report::ordered_modes(r) {
        let get = |k: &str| t.get(k).map_or(0.0, |x| x.median_tps);
        let shares: Vec<f64> = MAIN.iter().map(|e| get(&format!("wait:{e}"))).collect();
        let all: f64 = t
            .iter()
            .filter(|(k, _)| k.starts_with("wait:"))
            .map(|(_, x)| x.median_tps)
            .sum();
        let _ = write!(
            md,
            "| {mode} | {:.1} | {:.1} |",
            get("tps"),
            get("latency_ms")
        );
        for s in shares.iter().chain([&(all - shares.iter().sum::<f64>())]) {
            let _ = write!(md, " {:.0} % |", s * 100.0);
        }
        let pubd = r.published.get(mode.as_str()).map_or("", String::as_str);
        let _ = writeln!(md, " {:.1} | {pubd} |", get("sample_hz"));
    }
    md
}
