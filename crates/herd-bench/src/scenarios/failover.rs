//! `herd bench failover`: kill -9 of the primary's postmaster under a stream of writes through
//! Herd's proxy, per commit mode; RTO (kill → first acknowledged write sent after it) and
//! acknowledged writes missing from the new primary once the cluster is back to full strength.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;

use crate::cluster::ScratchCluster;
use crate::report::{FailoverResult, Machine, Results, Settings};
use crate::{median, BenchError, BenchOptions};

/// Commit modes measured, in order (quick: `on` only).
const MODES: [&str; 3] = ["async", "on", "remote_apply"];
/// The table the writer inserts into.
pub(crate) const TABLE: &str = "herd_bench_failover";
/// Writes acknowledged before the kill, at least this long.
const WARM: Duration = Duration::from_millis(500);
/// How long the writer goes on after the first acknowledged write following the kill.
const AFTER: Duration = Duration::from_secs(1);
/// The longest wait for a write to be acknowledged after the kill.
const RTO_LIMIT: Duration = Duration::from_secs(90);
/// The longest wait for a running primary with every replica streaming.
const FULL_STRENGTH_LIMIT: Duration = Duration::from_secs(120);
/// Target median RTO, seconds.
const RTO_TARGET_S: f64 = 3.0;

/// Runs the scenario; the figures for the report.
pub fn run(opts: &BenchOptions, bar: &ProgressBar) -> Result<Results, BenchError> {
    match opts.hosts {
        None => {}
        Some(3) => {
            return match opts.shards {
                None | Some(1) => super::failover_hosts::run(opts, bar),
                Some(2) => super::failover_shards::run(opts, bar),
                Some(n) => Err(BenchError::Missing(format!(
                    "herd bench failover --hosts 3 --shards {n}: only --shards 2 is supported"
                ))),
            }
        }
        Some(n) => {
            return Err(BenchError::Missing(format!(
                "herd bench failover --hosts {n}: only --hosts 3 is supported (three hosts as \
                 network namespaces)"
            )))
        }
    }
    let modes: Vec<&str> = if opts.quick {
        vec!["on"]
    } else {
        MODES.to_vec()
    };
    let iterations = opts
        .iterations
        .unwrap_or(if opts.quick { 2 } else { 20 })
        .max(1);
    bar.set_length(modes.len() as u64 * u64::from(iterations));
    bar.set_position(0);
    let mut failover = BTreeMap::new();
    for mode in &modes {
        let result = run_mode(opts, bar, mode, iterations)?;
        failover.insert(mode.to_string(), result);
    }
    let mut versions = BTreeMap::new();
    versions.insert("herd".to_string(), env!("CARGO_PKG_VERSION").to_string());
    Ok(Results {
        scenario: "failover".into(),
        date: crate::report::now_utc(),
        quick: opts.quick,
        machine: Machine::detect(),
        settings: Settings {
            command: format!(
                "herd bench failover --iterations {iterations}{}",
                if opts.quick { " --quick" } else { "" }
            ),
            rounds: iterations,
            duration_s: AFTER.as_secs(),
            scale: 0,
            modes: modes.iter().map(|m| m.to_string()).collect(),
            targets: vec!["herd".into()],
            versions,
        },
        modes: BTreeMap::new(),
        published: BTreeMap::new(),
        notes: vec![
            format!(
                "One scratch cluster per mode (`herd up --detach --commit-mode MODE`, default \
                 settings: 1 primary + 2 replicas, ANY 1). Per iteration: one writer connection \
                 through the proxy inserts unique ids (reconnecting on error), the primary's \
                 postmaster gets SIGKILL, the writer goes on {} s after its first acknowledged \
                 write, then the harness waits for a running primary with every replica \
                 streaming and reads the ids back from the primary directly.",
                AFTER.as_secs()
            ),
            "RTO: from just before the kill to the acknowledgement of the first write sent \
             after it by a server other than the killed one (writes in flight at the kill do not \
             count). The killed postmaster's orphaned backends can still commit for a moment \
             (through the proxy's pooled connections): those writes are counted per iteration \
             (`acked_by_killed_primary`) and checked for loss like every other."
                .into(),
            "p95 is the nearest-rank percentile: with fewer than 20 iterations it is the maximum."
                .into(),
            "The writer, the proxy, the supervisor and the three PostgreSQL servers share this \
             machine; kill -9 of the postmaster only (its backends and the machine survive)."
                .into(),
            "The supervisor's herd.log of each mode is copied next to this report \
             (herd-<mode>.log)."
                .into(),
        ],
        failover,
        ..Default::default()
    })
}

/// One mode: a fresh cluster, a table, `iterations` failovers.
fn run_mode(
    opts: &BenchOptions,
    bar: &ProgressBar,
    mode: &str,
    iterations: u32,
) -> Result<FailoverResult, BenchError> {
    bar.set_message(format!("{mode}: starting a scratch cluster (herd up)"));
    let cluster = Cluster::start(opts, mode)?;
    let outcome = measure(&cluster, bar, mode, iterations);
    // Keep the supervisor's log whatever happened: it is the evidence of a misbehaving failover.
    let log = cluster.data_dir().join("logs").join("herd.log");
    let kept = opts.out.join(format!("herd-{mode}.log"));
    if let Err(e) = std::fs::copy(&log, &kept) {
        eprintln!("herd bench: cannot copy {}: {e}", log.display());
    }
    outcome
}

fn measure(
    cluster: &Cluster,
    bar: &ProgressBar,
    mode: &str,
    iterations: u32,
) -> Result<FailoverResult, BenchError> {
    let primary = cluster.herd_ok(&["url", "--primary"])?;
    sql(
        primary.trim(),
        &format!("create table {TABLE} (id bigint primary key)"),
    )?;
    let proxy_url = cluster.herd_ok(&["url"])?.trim().to_string();

    let mut next_id: i64 = 1;
    let (mut rtos, mut fulls, mut primaries) = (Vec::new(), Vec::new(), Vec::new());
    let mut by_killed = Vec::new();
    let (mut acked_total, mut lost_total, mut failed_total) = (0u64, 0u64, 0u64);
    for i in 1..=iterations {
        let what = format!("{mode}: failover {i}/{iterations}");
        bar.set_message(format!("{what}: waiting for full strength"));
        let (victim, pid, victim_port) = cluster.full_strength(FULL_STRENGTH_LIMIT, None)?;

        bar.set_message(format!("{what}: writing"));
        let writer = Writer::start(&proxy_url, next_id);
        writer
            .wait_acked(|_| true, WARM, Duration::from_secs(30))
            .ok_or_else(|| {
                cluster.failure(
                    &what,
                    "no write was acknowledged through the proxy within 30 s",
                )
            })?;

        bar.set_message(format!("{what}: kill -9 {victim} (pid {pid})"));
        let killed_at = Instant::now();
        kill9(pid)?;
        // The killed postmaster's orphaned backends may still commit for a moment: the service
        // is back when a write sent after the kill is acknowledged by another server.
        let first = writer.wait_acked(
            |a| a.sent >= killed_at && a.port != victim_port,
            Duration::ZERO,
            RTO_LIMIT,
        );
        let Some(first) = first else {
            let (_, failed, _) = writer.stop();
            return Err(cluster.failure(
                &what,
                &format!(
                    "no write sent after the kill of {victim} was acknowledged by another \
                     server within {} s ({failed} writes failed)",
                    RTO_LIMIT.as_secs()
                ),
            ));
        };
        rtos.push((first.acked - killed_at).as_secs_f64());
        std::thread::sleep(AFTER);
        let (acks, failed, end_id) = writer.stop();
        next_id = end_id;

        bar.set_message(format!("{what}: waiting for full strength after the kill"));
        let (new_primary, _, _) = cluster.full_strength(FULL_STRENGTH_LIMIT, Some(pid))?;
        fulls.push(killed_at.elapsed().as_secs_f64());
        primaries.push(new_primary);

        let start_id = acks.first().map_or(end_id, |a| a.id);
        let present = ids_on_primary(cluster, start_id, end_id)?;
        let lost = acks.iter().filter(|a| !present.contains(&a.id)).count() as u64;
        if lost > 0 {
            eprintln!("herd bench: {what}: {lost} acknowledged writes missing on the new primary");
        }
        acked_total += acks.len() as u64;
        by_killed.push(
            acks.iter()
                .filter(|a| a.sent >= killed_at && a.port == victim_port)
                .count() as u64,
        );
        lost_total += lost;
        failed_total += failed;
        bar.inc(1);
    }

    let (p50, p95, max) = spread(&rtos);
    let must_keep = mode != "async";
    let target_met = p50 <= RTO_TARGET_S && (!must_keep || lost_total == 0);
    Ok(FailoverResult {
        iterations,
        rto_p50_s: p50,
        rto_p95_s: p95,
        rto_max_s: max,
        rto_s: rtos,
        full_strength_s: fulls,
        new_primaries: primaries,
        acked_by_killed_primary: by_killed,
        writable_window_s: Vec::new(),
        two_writable: 0,
        other_group: Vec::new(),
        acked: acked_total,
        lost: lost_total,
        failed_writes: failed_total,
        target: if must_keep {
            format!("RTO p50 ≤ {RTO_TARGET_S:.0} s, 0 lost")
        } else {
            format!("RTO p50 ≤ {RTO_TARGET_S:.0} s (loss allowed)")
        },
        target_met,
    })
}

/// Median, nearest-rank 95th percentile and maximum of `values` (zeros when empty).
pub(crate) fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let Some(&max) = sorted.last() else {
        return (0.0, 0.0, 0.0);
    };
    let p95 = sorted[((sorted.len() as f64 * 0.95).ceil() as usize).clamp(1, sorted.len()) - 1];
    (median(values).unwrap_or(0.0), p95, max)
}

/// The ids in `start..end` present on the current primary, read there directly.
fn ids_on_primary(cluster: &Cluster, start: i64, end: i64) -> Result<HashSet<i64>, BenchError> {
    let url = cluster.herd_ok(&["url", "--primary"])?;
    ids_at(&url, start, end)
}

/// The ids in `start..end` present on the server at `url`.
pub(crate) fn ids_at(url: &str, start: i64, end: i64) -> Result<HashSet<i64>, BenchError> {
    let query = format!("select id from {TABLE} where id >= {start} and id < {end}");
    block_on(async {
        let (client, conn) = tokio_postgres::connect(url.trim(), tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        let rows = client.query(query.as_str(), &[]).await?;
        Ok::<_, tokio_postgres::Error>(rows.iter().map(|r| r.get::<_, i64>(0)).collect())
    })?
    .map_err(|e| sql_error("reading the ids back from the primary", e))
}

/// Runs one statement on `url`.
pub(crate) fn sql(url: &str, statement: &str) -> Result<(), BenchError> {
    block_on(async {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        client.batch_execute(statement).await
    })?
    .map_err(|e| sql_error(statement, e))
}

/// A failed SQL statement of a scenario's own client, as a bench error.
pub(crate) fn sql_error(what: &str, e: tokio_postgres::Error) -> BenchError {
    BenchError::Failed {
        what: what.into(),
        status: "SQL error".into(),
        output: e.to_string(),
    }
}

/// Runs `fut` on a current-thread runtime of its own.
pub(crate) fn block_on<F: std::future::Future>(fut: F) -> Result<F::Output, BenchError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| BenchError::io("starting a runtime for", "tokio", e))?;
    Ok(rt.block_on(fut))
}

/// `kill -9 PID`.
fn kill9(pid: u64) -> Result<(), BenchError> {
    let out = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .output()
        .map_err(|source| BenchError::Spawn {
            program: "kill".into(),
            source,
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(BenchError::Failed {
        what: format!("kill -9 {pid}"),
        status: out.status.to_string(),
        output: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// One acknowledged insert.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ack {
    pub(crate) id: i64,
    pub(crate) sent: Instant,
    pub(crate) acked: Instant,
    /// `current_setting('port')` of the server that committed it (the proxy may use the socket).
    pub(crate) port: u16,
}

/// The statement writing one id.
pub(crate) type Statement = Box<dyn Fn(i64) -> String + Send>;

/// A thread inserting ids `start..` through one connection, reconnecting on error.
pub(crate) struct Writer {
    stop: Arc<AtomicBool>,
    acks: Arc<Mutex<Vec<Ack>>>,
    failed: Arc<AtomicU64>,
    /// What failed writes were told, and how often (for the report's notes).
    errors: Arc<Mutex<BTreeMap<String, u64>>>,
    thread: JoinHandle<i64>,
}

impl Writer {
    pub(crate) fn start(url: &str, start: i64) -> Writer {
        Writer::start_with(
            url,
            start,
            Box::new(|id| {
                format!(
                    "insert into {TABLE} (id) values ({id}) returning current_setting('port')::int"
                )
            }),
        )
    }

    /// As [`Writer::start`], each write the statement `statement(id)` (its row, if any, names
    /// the port of the server that committed it).
    pub(crate) fn start_with(url: &str, start: i64, statement: Statement) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let acks = Arc::new(Mutex::new(Vec::new()));
        let failed = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(Mutex::new(BTreeMap::new()));
        let (s, a, f, url) = (stop.clone(), acks.clone(), failed.clone(), url.to_string());
        let e = errors.clone();
        let thread = std::thread::spawn(move || {
            block_on(write_loop(url, start, statement, s, a, f, e)).unwrap_or(start)
        });
        Writer {
            stop,
            acks,
            failed,
            errors,
            thread,
        }
    }

    /// What the failed writes so far were told, with how often.
    pub(crate) fn errors(&self) -> BTreeMap<String, u64> {
        self.errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The first ack matching `pred`, once at least `min` has passed; `None` after `limit`.
    pub(crate) fn wait_acked(
        &self,
        pred: impl Fn(&Ack) -> bool,
        min: Duration,
        limit: Duration,
    ) -> Option<Ack> {
        let t0 = Instant::now();
        loop {
            let found = self.lock().iter().find(|a| pred(a)).copied();
            if found.is_some() && t0.elapsed() >= min {
                return found;
            }
            if t0.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Ack>> {
        self.acks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops the thread: the acks, the failed writes and the next unused id.
    pub(crate) fn stop(self) -> (Vec<Ack>, u64, i64) {
        self.stop.store(true, Ordering::SeqCst);
        let Writer {
            acks,
            failed,
            thread,
            ..
        } = self;
        let end = thread.join().unwrap_or(i64::MAX / 2);
        let acks = std::mem::take(&mut *acks.lock().unwrap_or_else(|p| p.into_inner()));
        (acks, failed.load(Ordering::SeqCst), end)
    }
}

/// Inserts one id after another; returns the next unused id.
async fn write_loop(
    url: String,
    mut id: i64,
    statement: Statement,
    stop: Arc<AtomicBool>,
    acks: Arc<Mutex<Vec<Ack>>>,
    failed: Arc<AtomicU64>,
    errors: Arc<Mutex<BTreeMap<String, u64>>>,
) -> i64 {
    let mut client: Option<tokio_postgres::Client> = None;
    let pause = || tokio::time::sleep(Duration::from_millis(20));
    while !stop.load(Ordering::SeqCst) {
        let Some(c) = client.as_ref() else {
            let connect = tokio_postgres::connect(&url, tokio_postgres::NoTls);
            match tokio::time::timeout(Duration::from_secs(3), connect).await {
                Ok(Ok((c, conn))) => {
                    tokio::spawn(conn);
                    client = Some(c);
                }
                _ => pause().await,
            }
            continue;
        };
        let statement = statement(id);
        id += 1;
        let sent = Instant::now();
        let outcome = tokio::time::timeout(Duration::from_secs(10), c.simple_query(&statement));
        match outcome.await {
            Ok(Ok(messages)) => {
                let port = messages
                    .iter()
                    .find_map(|m| match m {
                        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0)?.parse().ok(),
                        _ => None,
                    })
                    .unwrap_or(0);
                let acked = Instant::now();
                let mut a = acks.lock().unwrap_or_else(|p| p.into_inner());
                a.push(Ack {
                    id: id - 1,
                    sent,
                    acked,
                    port,
                });
            }
            other => {
                let told = match other {
                    Ok(Err(e)) => e.as_db_error().map_or_else(
                        || e.to_string(),
                        |d| format!("{}: {}", d.code().code(), d.message()),
                    ),
                    _ => "no answer within 10 s".to_string(),
                };
                *errors
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(told)
                    .or_default() += 1;
                failed.fetch_add(1, Ordering::SeqCst);
                client = None;
                pause().await;
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    id
}

/// A cluster created by `herd up --detach --commit-mode MODE`; `herd down` when dropped.
struct Cluster(ScratchCluster);

impl Cluster {
    fn start(opts: &BenchOptions, mode: &str) -> Result<Cluster, BenchError> {
        ScratchCluster::start_with(opts, &["--commit-mode", mode]).map(Cluster)
    }

    fn data_dir(&self) -> PathBuf {
        self.0.data_dir()
    }

    fn herd_ok(&self, args: &[&str]) -> Result<String, BenchError> {
        self.0.herd_ok(args)
    }

    /// Waits until `herd status --json` shows a running primary (whose postmaster is not
    /// `killed`) and every replica streaming; the primary's name and pid.
    fn full_strength(
        &self,
        limit: Duration,
        killed: Option<u64>,
    ) -> Result<(String, u64, u16), BenchError> {
        let t0 = Instant::now();
        let mut last = String::new();
        while t0.elapsed() < limit {
            match self.herd_ok(&["status", "--json"]) {
                Ok(text) => {
                    if let Some(found) = strong(&text, killed) {
                        return Ok(found);
                    }
                    last = text;
                }
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(self.failure(
            "waiting for full strength",
            &format!(
                "no running primary with every replica streaming within {} s; last status:\n{last}",
                limit.as_secs()
            ),
        ))
    }

    /// An error for `what`, with the end of the supervisor's log.
    fn failure(&self, what: &str, detail: &str) -> BenchError {
        let log = std::fs::read_to_string(self.data_dir().join("logs").join("herd.log"))
            .unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(40)..].join("\n");
        BenchError::Failed {
            what: what.into(),
            status: detail.into(),
            output: format!("last lines of herd.log:\n{tail}"),
        }
    }
}

/// The running primary's name, pid and port when `status` (the `herd status --json` document) shows
/// one that is not `killed`, and every replica streaming.
fn strong(status: &str, killed: Option<u64>) -> Option<(String, u64, u16)> {
    let v: serde_json::Value = serde_json::from_str(status).ok()?;
    let nodes = v["nodes"].as_array()?;
    let mut primary = None;
    for n in nodes {
        match (n["role"].as_str()?, n["state"].as_str()?) {
            ("primary", "running") if primary.is_none() => {
                let pid = n["pid"].as_u64()?;
                if Some(pid) == killed {
                    return None;
                }
                let port = u16::try_from(n["port"].as_u64()?).ok()?;
                primary = Some((n["name"].as_str()?.to_string(), pid, port));
            }
            ("replica", "streaming") => {}
            _ => return None,
        }
    }
    primary
}

#[cfg(test)]
mod tests {
    use super::strong;

    #[test]
    fn full_strength_from_status() {
        let doc = |s1: &str| {
            format!(
                r#"{{"nodes": [{{"name": "node1", "role": "primary", "pid": 7, "port": 5, "state": "running"}},
                {{"name": "node0", "role": "replica", "pid": 8, "state": "streaming"}},
                {{"name": "node2", "role": "replica", "pid": 9, "state": "{s1}"}}]}}"#
            )
        };
        assert_eq!(
            strong(&doc("streaming"), None),
            Some(("node1".into(), 7, 5))
        );
        assert_eq!(
            strong(&doc("streaming"), Some(3)),
            Some(("node1".into(), 7, 5))
        );
        assert_eq!(strong(&doc("streaming"), Some(7)), None);
        assert_eq!(strong(&doc("disconnected"), None), None);
        assert_eq!(strong(&doc("stopped"), None), None);
        assert_eq!(strong("not json", None), None);
    }
}
