//! `herd bench commit-modes`: rows inserted per second with no replication and with each commit
//! mode on a 2-replica cluster (reference 000, write table), plus Herd's `session` consistency
//! (async commits, read-your-writes reads through the proxy). Also the small `herd` helper that
//! `commit-waits` shares: a scratch cluster with a chosen replica count and commit-mode switches.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;

use super::commit_waits::{run_limited, write_script};
use crate::cluster::{free_port_block, scratch_dir};
use crate::pgbench::{median, Pgbench};
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
/// Epoch second where inserted rows start; preloaded rows lie before it.
const T0: u64 = 1_700_000_000;
const METRICS: &str = "usage_user usage_system usage_idle usage_nice usage_iowait usage_irq \
                       usage_softirq usage_steal usage_guest usage_guest_nice";

/// A cluster made by `herd up --detach --replicas N` in a scratch directory; `herd down` on drop.
pub(super) struct Herd {
    exe: PathBuf,
    psql: PathBuf,
    port: u16,
    /// The data directory is `data` inside it.
    dir: tempfile::TempDir,
    /// `herd url --primary`.
    pub primary_url: String,
    /// `herd url` (Herd's proxy).
    pub proxy_url: String,
}

impl Herd {
    /// Creates and starts a cluster with `replicas` hot standbys on free ports.
    pub fn start(exe: &Path, replicas: u32) -> Result<Herd, BenchError> {
        let port = free_port_block()?;
        let mut h = Herd {
            exe: exe.to_path_buf(),
            psql: herd_pg::PgBinaries::locate(None)?.program("psql"),
            port,
            dir: scratch_dir()?,
            primary_url: String::new(),
            proxy_url: String::new(),
        };
        let (port, replicas) = (port.to_string(), replicas.to_string());
        let up = ["up", "--detach", "--port", &port, "--replicas", &replicas];
        h.herd(&up, 600)?;
        h.primary_url = h.herd(&["url", "--primary"], 60)?.trim().to_string();
        h.proxy_url = h.herd(&["url"], 60)?.trim().to_string();
        Ok(h)
    }

    /// The scratch directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `herd ARGS --data-dir DIR`, killed after `secs`; its stdout.
    pub fn herd(&self, args: &[&str], secs: u64) -> Result<String, BenchError> {
        let mut cmd = Command::new(&self.exe);
        cmd.args(args)
            .arg("--data-dir")
            .arg(self.dir.path().join("data"));
        run_limited(&format!("herd {}", args.join(" ")), cmd, secs)
    }

    /// psql running each statement of `sql` in turn (autocommit, one session) on `url`.
    pub fn psql_cmd(&self, url: &str, sql: &[&str]) -> Command {
        let mut cmd = Command::new(&self.psql);
        cmd.args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", url]);
        for s in sql {
            cmd.arg("-c").arg(s);
        }
        cmd
    }

    /// Runs [`Herd::psql_cmd`] (killed after 15 minutes); its output.
    pub fn psql(&self, url: &str, sql: &[&str]) -> Result<String, BenchError> {
        let what = format!("psql -c {:?}", sql.join("; "));
        run_limited(&what, self.psql_cmd(url, sql), 900)
    }

    /// `herd config set commit-mode MODE`, then waits until the primary reports the setting.
    pub fn set_commit_mode(&self, mode: &str) -> Result<(), BenchError> {
        self.herd(&["config", "set", "commit-mode", mode], 120)?;
        let want = if mode == "async" { "local" } else { mode };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let got = self.psql(&self.primary_url, &["show synchronous_commit"])?;
            if got.trim() == want {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(BenchError::Failed {
                    what: format!("herd config set commit-mode {mode}"),
                    status: "setting not applied".into(),
                    output: format!("the primary still reports synchronous_commit = {got}"),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits (at most 60 s) until every standby has replayed to within 1 MiB of the primary, so
    /// one run's backlog does not slow the next; whether they caught up.
    pub fn settle(&self) -> Result<bool, BenchError> {
        let q = "select coalesce(bool_and(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn) \
                 < 1048576), true) from pg_stat_replication";
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.psql(&self.primary_url, &[q])?.trim() == "t" {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        Ok(false)
    }

    /// The proxy's routing counters from `/metrics` (API on port + 100); empty when unreachable.
    pub fn routing(&self) -> BTreeMap<String, f64> {
        let mut text = String::new();
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port + 100)) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
            if s.write_all(req.as_bytes()).is_ok() {
                let _ = s.read_to_string(&mut text);
            }
        }
        text.lines()
            .filter(|l| l.starts_with("herd_routed_total") || l.starts_with("herd_ryw_"))
            .filter_map(|l| l.rsplit_once(' '))
            .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
            .collect()
    }
}

impl Drop for Herd {
    fn drop(&mut self) {
        if self.dir.path().join("data").exists() {
            if let Err(e) = self.herd(&["down"], 180) {
                eprintln!("herd bench: {e}");
            }
        }
    }
}

/// The insert of one batch: `BATCH` devices' ten metrics at the client's next time point.
fn insert_sql(devices: u32) -> String {
    let metrics = vec!["random() * 100"; METRICS.split_whitespace().count()].join(", ");
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
        let herd = Herd::start(&opts.herd_exe, replicas)?;
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
        let before = herd.routing();
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
            let after = herd.routing();
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
        failover: BTreeMap::new(),
    })
}

/// Creates and fills the `cpu` table on the primary (indexes after the load), then checkpoints.
fn load(herd: &Herd, devices: u32, points: u32) -> Result<(), BenchError> {
    let cols: Vec<String> = METRICS
        .split_whitespace()
        .map(|m| format!("{m} double precision"))
        .collect();
    let metrics = vec!["random() * 100"; METRICS.split_whitespace().count()].join(", ");
    let create = format!(
        "create table cpu (time timestamptz not null, hostname text not null, {})",
        cols.join(", ")
    );
    let fill = format!(
        "insert into cpu select to_timestamp({T0} - s * 10), 'host_' || d, {metrics} \
         from generate_series(1, {}) s, generate_series(0, {}) d",
        points,
        devices - 1
    );
    let sql = [
        create.as_str(),
        &fill,
        "create index on cpu (time)",
        "create index on cpu (hostname)",
        "create index on cpu (usage_user)",
        "vacuum analyze cpu",
        "checkpoint",
    ];
    herd.psql(&herd.primary_url, &sql).map(drop)
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
