//! `herd bench backup` (issue #41): what a backup and a restore cost on this machine, side by
//! side in one run. A one-host cluster (primary and one streaming standby, `[backup]` on) is
//! loaded with pgbench's tables (scale 80, about 1.2 GB, by default — a few minutes on two cores;
//! `--scale 300` for about 4.5 GB); then, in rotated order each round:
//!
//! * `pg_basebackup` of the primary (plain format, WAL streamed, fast checkpoint): the copy every
//!   PostgreSQL user knows, the baseline;
//! * `herd backup --type full` (pgBackRest, from the standby, sparing the primary) and the same
//!   `--from-primary`;
//! * `herd restore --to latest` of the newest backup into a new data directory (files and the
//!   archived WAL replayed to its end);
//! * a copy (`cp -a`) of a pg_basebackup taken before the rounds: restoring a pg_basebackup, the
//!   restore's baseline;
//!
//! each as seconds and MB/s of the cluster's size, and its time over its baseline's
//! (pg_basebackup for the backups, the copy of one for the restore). And the primary's pgbench TPC-B rate with no
//! backup, while backups run from the standby, and while they run from the primary: what a
//! backup costs the application, and what taking it from a standby spares.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use crate::cluster::ScratchCluster;
use crate::pgbench::{median, Pgbench};
use crate::report::{Machine, Results, Settings};
use crate::{BenchError, BenchOptions};

/// The copies timed, in the report's order.
pub const COPIES: [&str; 5] = [
    "pg_basebackup (primary)",
    "herd backup (standby)",
    "herd backup --from-primary",
    "herd restore --to latest",
    "cp -a of a pg_basebackup",
];

/// The index in [`COPIES`] of each copy's baseline: pg_basebackup for the backups, the copy of
/// a pg_basebackup for the restore.
pub const BASELINE: [usize; 5] = [0, 0, 0, 4, 4];

/// Where the pg_basebackup the restore's baseline copies is kept (in the cluster's directory).
const BASE_COPY: &str = "base-copy";

/// One copy's figures (medians over the rounds).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CopyRow {
    /// One of [`COPIES`].
    pub copy: String,
    /// Seconds, each round.
    pub seconds: Vec<f64>,
    /// Median seconds.
    pub median_s: f64,
    /// The cluster's size over the median time, MB/s (10^6 bytes).
    pub mb_per_s: f64,
    /// Median time over the baseline's median time ([`BASELINE`]; 1 for a baseline itself).
    #[serde(default)]
    pub vs_baseline: f64,
}

/// The primary's rate in one condition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadRow {
    /// "no backup", "backup from the standby", "backup from the primary".
    pub during: String,
    /// pgbench TPC-B transactions per second, each round.
    pub tps: Vec<f64>,
    /// Median.
    pub median_tps: f64,
    /// Median over the no-backup median.
    pub ratio: f64,
    /// Backups completed while pgbench ran (all rounds).
    pub backups: u32,
}

/// What `herd bench backup` measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackupResult {
    /// pgbench scale loaded.
    pub scale: u32,
    /// Every database of the cluster, bytes (what a physical copy carries, WAL aside).
    pub cluster_bytes: u64,
    /// The copies, in [`COPIES`] order.
    pub copies: Vec<CopyRow>,
    /// The primary's rate, no backup first.
    pub load: Vec<LoadRow>,
}

/// Runs the scenario.
pub fn run(opts: &BenchOptions, bar: &ProgressBar) -> Result<Results, BenchError> {
    let scale = opts.scale.unwrap_or(if opts.quick { 5 } else { 80 }).max(1);
    let rounds = opts
        .iterations
        .unwrap_or(if opts.quick { 1 } else { 3 })
        .max(1);
    let duration = Duration::from_secs(opts.duration.unwrap_or(if opts.quick { 4 } else { 20 }));
    let pgbench = Pgbench::locate()?;
    let basebackup = herd_pg::PgBinaries::locate(None)?.program("pg_basebackup");
    bar.set_message("starting a primary and a standby with [backup] on");
    let cluster = ScratchCluster::start_with_config(
        opts,
        &["--replicas", "1"],
        "[backup]\nenabled = true\nretention_full = 1\n",
    )?;
    bar.set_message(format!("loading pgbench scale {scale}"));
    pgbench.run_raw(
        "pgbench -i",
        &["-i".into(), "-q".into(), "-s".into(), scale.to_string()],
        &cluster.primary_url,
        Duration::from_secs(7200),
    )?;
    let cluster_bytes: u64 = cluster
        .psql(
            &cluster.primary_url,
            &["select sum(pg_database_size(oid)) from pg_database"],
        )?
        .trim()
        .parse()
        .map_err(|_| BenchError::Missing("the cluster's size".into()))?;
    // A first backup, so the timed ones and the restore find a stanza and a base.
    bar.set_message("a first backup (stanza, archive check)");
    cluster.herd_limited(&["backup", "--type", "full"], 7200)?;
    // And a pg_basebackup, which the restore's baseline copies.
    bar.set_message("a pg_basebackup for the restore's baseline");
    basebackup_into(&cluster, &basebackup, &cluster.dir().join(BASE_COPY))?;
    let mut seconds = vec![Vec::new(); COPIES.len()];
    let mut tps: Vec<Vec<f64>> = vec![Vec::new(); 3];
    let mut during_backups = [0u32; 3];
    for round in 0..rounds as usize {
        for i in 0..COPIES.len() {
            let k = (i + round) % COPIES.len();
            bar.set_message(format!("round {}/{rounds}: {}", round + 1, COPIES[k]));
            seconds[k].push(time_copy(&cluster, k, &basebackup)?);
        }
        for i in 0..3 {
            let k = (i + round) % 3;
            bar.set_message(format!(
                "round {}/{rounds}: pgbench TPC-B {} s, {}",
                round + 1,
                duration.as_secs(),
                LOADS[k]
            ));
            let (rate, backups) = rate_during(&cluster, &pgbench, duration, k)?;
            tps[k].push(rate);
            during_backups[k] += backups;
        }
    }
    let _ = std::fs::remove_dir_all(cluster.dir().join(BASE_COPY));
    let copies = copy_rows(cluster_bytes, seconds);
    let base = median(&tps[0]).unwrap_or(0.0);
    let load = LOADS
        .iter()
        .zip(tps)
        .zip(during_backups)
        .map(|((during, t), backups)| {
            let median_tps = median(&t).unwrap_or(0.0);
            LoadRow {
                during: (*during).into(),
                tps: t,
                median_tps,
                ratio: if base > 0.0 { median_tps / base } else { 0.0 },
                backups,
            }
        })
        .collect();
    let result = BackupResult {
        scale,
        cluster_bytes,
        copies,
        load,
    };
    Ok(results(opts, rounds, duration, result))
}

/// The conditions of the primary's load.
const LOADS: [&str; 3] = [
    "no backup",
    "backup from the standby",
    "backup from the primary",
];

/// The copies' rows from each copy's seconds per round ([`COPIES`] order).
fn copy_rows(cluster_bytes: u64, seconds: Vec<Vec<f64>>) -> Vec<CopyRow> {
    let medians: Vec<f64> = seconds.iter().map(|s| median(s).unwrap_or(0.0)).collect();
    COPIES
        .iter()
        .zip(seconds)
        .enumerate()
        .map(|(k, (copy, s))| {
            let median_s = medians[k];
            let base = medians[BASELINE[k]];
            CopyRow {
                copy: (*copy).into(),
                mb_per_s: if median_s > 0.0 {
                    cluster_bytes as f64 / 1e6 / median_s
                } else {
                    0.0
                },
                vs_baseline: if base > 0.0 { median_s / base } else { 0.0 },
                seconds: s,
                median_s,
            }
        })
        .collect()
}

/// `pg_basebackup` of the primary into `target` (plain, WAL streamed, fast checkpoint).
fn basebackup_into(
    cluster: &ScratchCluster,
    basebackup: &Path,
    target: &Path,
) -> Result<(), BenchError> {
    let _ = std::fs::remove_dir_all(target);
    let mut cmd = std::process::Command::new(basebackup);
    cmd.args(["-X", "stream", "-c", "fast", "-F", "plain", "-d"])
        .arg(replication_url(cluster)?)
        .arg("-D")
        .arg(target);
    crate::process::run_limited("pg_basebackup", cmd, 7200).map(|_| ())
}

/// Seconds copy `k` of [`COPIES`] took.
fn time_copy(cluster: &ScratchCluster, k: usize, basebackup: &Path) -> Result<f64, BenchError> {
    let target = cluster.dir().join(format!("copy-{k}"));
    let _ = std::fs::remove_dir_all(&target);
    let started = Instant::now();
    match k {
        0 => basebackup_into(cluster, basebackup, &target)?,
        1 => {
            cluster.herd_limited(&["backup", "--type", "full"], 7200)?;
        }
        2 => {
            cluster.herd_limited(&["backup", "--type", "full", "--from-primary"], 7200)?;
        }
        4 => {
            let mut cmd = std::process::Command::new("cp");
            cmd.arg("-a")
                .arg(cluster.dir().join(BASE_COPY))
                .arg(&target);
            crate::process::run_limited("cp -a (a pg_basebackup)", cmd, 7200)?;
        }
        _ => {
            let mut cmd = std::process::Command::new(cluster.herd_exe());
            cmd.args(["restore", "--to", "latest", "--data-dir"])
                .arg(&target)
                .arg("--from-data-dir")
                .arg(cluster.data_dir())
                // The source runs on its own ports.
                .arg("--port")
                .arg(crate::cluster::free_port()?.to_string());
            crate::process::run_limited("herd restore --to latest", cmd, 7200)?;
        }
    }
    let took = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&target);
    Ok(took)
}

/// The primary's URL for Herd's replication role (the one pg_hba.conf lets replicate), as
/// replicas connect.
fn replication_url(cluster: &ScratchCluster) -> Result<String, BenchError> {
    let parts = crate::cluster::UrlParts::parse(&cluster.primary_url)
        .ok_or_else(|| BenchError::Missing("the primary's URL".into()))?;
    let layout = herd_cluster::Layout::new(cluster.data_dir());
    let secrets = herd_cluster::Secrets::load(&layout)
        .map_err(|e| BenchError::Missing(format!("the cluster's secrets: {e}")))?;
    Ok(format!(
        "postgresql://{}:{}@{}:{}/postgres",
        herd_cluster::REPLICATION_USER,
        secrets.replication,
        parts.host,
        parts.port
    ))
}

/// The primary's TPC-B rate over `duration` while condition `k` of [`LOADS`] holds (backups
/// one after the other until pgbench ends), and how many backups completed meanwhile.
fn rate_during(
    cluster: &ScratchCluster,
    pgbench: &Pgbench,
    duration: Duration,
    k: usize,
) -> Result<(f64, u32), BenchError> {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU32::new(0));
    let backups = (k > 0).then(|| {
        let (herd, data) = (cluster.herd_exe(), cluster.data_dir());
        let (stop, done) = (stop.clone(), done.clone());
        std::thread::spawn(move || -> Result<(), BenchError> {
            while !stop.load(Ordering::Relaxed) {
                let mut cmd = std::process::Command::new(&herd);
                cmd.args(["backup", "--type", "full", "--data-dir"])
                    .arg(&data);
                if k == 2 {
                    cmd.arg("--from-primary");
                }
                crate::process::run_limited("herd backup (under load)", cmd, 7200)?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        })
    });
    let args: Vec<String> = [
        "-n",
        "-c",
        "4",
        "-j",
        "2",
        "-T",
        &duration.as_secs().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let run = pgbench.run(
        "pgbench TPC-B",
        &args,
        &cluster.primary_url,
        duration + Duration::from_secs(600),
    );
    // The backup under way finishes (counted only if it ended within the run).
    let counted = done.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    if let Some(t) = backups {
        t.join()
            .map_err(|_| BenchError::Missing("the backup thread panicked".into()))??;
    }
    Ok((run?.tps, counted))
}

fn results(opts: &BenchOptions, rounds: u32, duration: Duration, r: BackupResult) -> Results {
    Results {
        scenario: "backup".into(),
        date: crate::report::now_utc(),
        quick: opts.quick,
        machine: Machine::detect(),
        settings: Settings {
            command: "pg_basebackup -X stream -c fast; herd backup --type full [--from-primary]; \
                      herd restore --to latest; cp -a of a pg_basebackup; pgbench -n -c 4 -j 2 \
                      (TPC-B) on the primary"
                .into(),
            rounds,
            duration_s: duration.as_secs(),
            scale: r.scale,
            modes: Vec::new(),
            targets: Vec::new(),
            versions: Default::default(),
        },
        notes: vec![
            "2-core noisy machine: one machine shared by the primary, the standby, pgBackRest, \
             pg_basebackup and pgbench: figures are noisy, medians of the rounds; copies write \
             to the same disk they read."
                .into(),
            "MB/s is the cluster's size (every database) over the copy's time; pgBackRest \
             compresses (lz4, process-max=2, as Herd configures it), pg_basebackup's plain copy \
             does not; the restore includes replaying the archived WAL to its end and starting \
             the restored cluster's servers, the copy of a pg_basebackup is the file copy only. \
             'vs baseline' is the median time over pg_basebackup's (backups) or the copy's \
             (restore)."
                .into(),
            "The primary's rate during backups: backups run one after the other for the whole \
             pgbench run; `backups` counts those that completed within it."
                .into(),
        ],
        backup: Some(r),
        ..Default::default()
    }
}
