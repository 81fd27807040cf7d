//! `herd bench shard-move`: how long writes wait while `herd shards move` moves one virtual
//! shard of a large distributed table (pgbench_accounts-shaped, 1 GB by default) between two
//! shard groups under write load, and what the move costs everyone else.
//!
//! Writers through the endpoint update rows by key — half of them on the moved shard, half on
//! other shards of both groups — and every transaction's start and latency is kept. Each move
//! (the shard goes to the other group and, with `--iterations`, back) is timed as a whole, with
//! the wait Herd reports for its switch; the report gives, per move, the longest transaction of
//! the moved shard and of the other shards during the move, their p99, and failures, beside the
//! other shards' longest transaction in an equally long window before the first move (the
//! machine's own noise).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use crate::cluster::ScratchCluster;
use crate::report::{Machine, Results, Settings};
use crate::scenarios::failover::{block_on, sql_error};
use crate::{BenchError, BenchOptions};

/// The moved shard (on group 0 at the start: shard s starts on group s % 2).
const SHARD: u32 = 0;
/// Shards of the map (Herd's default).
const SHARDS: u32 = 32;
/// Writers per class (moved shard, other shards).
const WRITERS: usize = 4;
/// Keys each writer cycles through.
const KEYS: usize = 500;

/// One move's figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoveRow {
    /// "0 → 1".
    pub groups: String,
    /// The whole `herd shards move`, seconds.
    pub total_s: f64,
    /// How long the shard's statements waited at the switch, as Herd reports it (ms).
    pub herd_wait_ms: f64,
    /// Longest transaction on the moved shard during the move (ms).
    pub moved_max_ms: f64,
    /// p99 of its transactions during the move (ms).
    pub moved_p99_ms: f64,
    /// Longest transaction on the other shards during the move (ms).
    pub other_max_ms: f64,
    /// p99 of theirs (ms).
    pub other_p99_ms: f64,
    /// Transactions during the move: moved shard, other shards.
    pub transactions: (u64, u64),
    /// Failed transactions during the move: moved shard, other shards.
    pub failed: (u64, u64),
}

/// What `herd bench shard-move` measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardMoveResult {
    /// Rows of the table.
    pub rows: u64,
    /// Its size on all groups (table, indexes), bytes.
    pub table_bytes: u64,
    /// Rows of the moved shard.
    pub moved_rows: u64,
    /// The moves, in order.
    pub moves: Vec<MoveRow>,
    /// Other shards' longest transaction in a window before the first move, as long as it (ms).
    pub baseline_other_max_ms: f64,
    /// Their p99 in that window (ms).
    pub baseline_other_p99_ms: f64,
}

/// One transaction: when it started (since the load began), how long it took, whether it
/// committed, whether it was on the moved shard.
#[derive(Clone, Copy)]
struct Txn {
    start: Duration,
    latency: Duration,
    ok: bool,
    moved: bool,
}

/// Runs the scenario.
pub fn run(opts: &BenchOptions, bar: &ProgressBar) -> Result<Results, BenchError> {
    let scale = opts.scale.unwrap_or(if opts.quick { 2 } else { 75 }).max(1);
    let rows = u64::from(scale) * 100_000;
    let iterations = opts
        .iterations
        .unwrap_or(if opts.quick { 1 } else { 3 })
        .max(1);
    bar.set_message("starting 2 shard groups (1 replica each, wal_level = logical)");
    let cluster = ScratchCluster::start_with_config(
        opts,
        &["--shards", "2", "--replicas", "1"],
        "[postgres]\nwal_level = \"logical\"\n",
    )?;
    bar.set_message(format!("loading {rows} rows (pgbench_accounts-shaped)"));
    let (table_bytes, moved_rows) = load(&cluster, rows)?;
    let keys = keys(rows);
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Mutex::new(Vec::<Txn>::new()));
    let mut writers = Vec::new();
    for w in 0..2 * WRITERS {
        let moved = w < WRITERS;
        let ks: Vec<i64> = if moved { &keys.0 } else { &keys.1 }
            .iter()
            .skip(w % WRITERS)
            .step_by(WRITERS)
            .copied()
            .collect();
        let (url, stop, log) = (cluster.proxy_url.clone(), stop.clone(), log.clone());
        writers.push(std::thread::spawn(move || {
            block_on(write_loop(url, ks, moved, started, stop, log))
        }));
    }
    // A window as long as a move is expected to take, before any move: the noise floor.
    let baseline = Duration::from_secs(if opts.quick { 5 } else { 20 });
    bar.set_message(format!(
        "writes on the moved and other shards: {} s before the first move",
        baseline.as_secs()
    ));
    std::thread::sleep(baseline);
    let mut windows = Vec::new();
    for i in 0..iterations {
        let (from, to) = if i % 2 == 0 { (0, 1) } else { (1, 0) };
        bar.set_message(format!(
            "move {}/{iterations}: shard {SHARD} from group {from} to {to} under load",
            i + 1
        ));
        let t0 = started.elapsed();
        let out = cluster.herd_limited(
            &[
                "shards",
                "move",
                &SHARD.to_string(),
                "--to",
                &to.to_string(),
                "--wait-timeout",
                "3600",
            ],
            4000,
        )?;
        let t1 = started.elapsed();
        windows.push((from, to, t0, t1, herd_wait_ms(&out)));
        std::thread::sleep(Duration::from_secs(2));
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join()
            .map_err(|_| BenchError::Missing("a writer thread panicked".into()))???;
    }
    let log = log.lock().map(|l| l.clone()).unwrap_or_default();
    let in_window = |t0: Duration, t1: Duration, moved: bool| -> Vec<Txn> {
        log.iter()
            .filter(|t| t.moved == moved && t.start + t.latency >= t0 && t.start <= t1)
            .copied()
            .collect()
    };
    let before = in_window(Duration::ZERO, baseline, false);
    let moves = windows
        .iter()
        .map(|(from, to, t0, t1, wait)| {
            let moved = in_window(*t0, *t1, true);
            let other = in_window(*t0, *t1, false);
            MoveRow {
                groups: format!("{from} → {to}"),
                total_s: (*t1 - *t0).as_secs_f64(),
                herd_wait_ms: *wait,
                moved_max_ms: max_ms(&moved),
                moved_p99_ms: p99_ms(&moved),
                other_max_ms: max_ms(&other),
                other_p99_ms: p99_ms(&other),
                transactions: (moved.len() as u64, other.len() as u64),
                failed: (
                    moved.iter().filter(|t| !t.ok).count() as u64,
                    other.iter().filter(|t| !t.ok).count() as u64,
                ),
            }
        })
        .collect();
    let result = ShardMoveResult {
        rows,
        table_bytes,
        moved_rows,
        moves,
        baseline_other_max_ms: max_ms(&before),
        baseline_other_p99_ms: p99_ms(&before),
    };
    Ok(results(opts, scale, iterations, result))
}

fn results(opts: &BenchOptions, scale: u32, iterations: u32, r: ShardMoveResult) -> Results {
    Results {
        scenario: "shard-move".into(),
        date: crate::report::now_utc(),
        quick: opts.quick,
        machine: Machine::detect(),
        settings: Settings {
            command: format!(
                "herd shards move {SHARD} --to G, {WRITERS} writers on the moved shard and {WRITERS} on others (UPDATE … WHERE aid = $1)"
            ),
            rounds: iterations,
            duration_s: 0,
            scale,
            modes: Vec::new(),
            targets: Vec::new(),
            versions: Default::default(),
        },
        notes: vec![
            "2 shard groups, 1 replica each, on one 2-vCPU machine shared by every server, \
             Herd and the writers: figures are noisy; the baseline row is the same writers' \
             longest transaction before any move."
                .into(),
            format!(
                "Target (issue): the moved shard's writes wait ≤ 1 s (p99), the other shards' \
                 not at all. Reference: {SHARDS} virtual shards, so one shard is 1/{SHARDS} of \
                 the table."
            ),
        ],
        shard_move: Some(r),
        ..Default::default()
    }
}

/// The table on both groups, loaded inside each group's primary (each keeps the rows of its
/// shards, by PostgreSQL's own partition hash); its total size and the moved shard's rows.
fn load(cluster: &ScratchCluster, rows: u64) -> Result<(u64, u64), BenchError> {
    cluster.psql(
        &cluster.proxy_url,
        &[
            "create table bench_accounts (aid bigint primary key, bid int not null, \
             abalance int not null, filler char(84))",
            "select herd.create_distributed_table('bench_accounts', 'aid')",
        ],
    )?;
    let shard = herd_shard::shard_sql("g", herd_shard::KeyType::Int8, SHARDS);
    let mut bytes = 0;
    let mut moved = 0;
    for g in 0..2u32 {
        let url = cluster.herd_ok(&["url", "--group", &g.to_string(), "--primary"])?;
        let url = url.trim();
        cluster.psql(
            url,
            &[
                &format!(
                    "insert into bench_accounts select g, (g - 1) / 100000 + 1, 0, '' \
                     from generate_series(1, {rows}::bigint) g where {shard} % 2 = {g}"
                ),
                "vacuum analyze bench_accounts",
            ],
        )?;
        let out = cluster.psql(
            url,
            &[&format!(
                "select pg_total_relation_size('bench_accounts'), \
                 (select count(*) from bench_accounts where {} = {SHARD})",
                herd_shard::shard_sql("aid", herd_shard::KeyType::Int8, SHARDS)
            )],
        )?;
        let mut fields = out.trim().split('|');
        bytes += fields
            .next()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        moved += fields
            .next()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok((bytes, moved))
}

/// Keys of the moved shard, and keys of other shards (both groups), `KEYS` × writers each.
fn keys(rows: u64) -> (Vec<i64>, Vec<i64>) {
    let map = herd_shard::ShardMap::new(2, SHARDS);
    let (mut moved, mut other) = (Vec::new(), Vec::new());
    let want = KEYS * WRITERS;
    // Spread over the table: a stride through it.
    let stride = (rows / (want as u64 * SHARDS as u64 * 2)).max(1);
    let mut k = 1u64;
    while (moved.len() < want || other.len() < want) && k <= rows {
        let s = map.shard_of(Some(&herd_shard::KeyValue::Int8(k as i64)));
        if s == SHARD && moved.len() < want {
            moved.push(k as i64);
        } else if s != SHARD && other.len() < want {
            other.push(k as i64);
        }
        k += stride;
    }
    (moved, other)
}

/// One writer: `UPDATE … WHERE aid = $1` in a loop over its keys until `stop`; every
/// transaction logged (a failed one too, then it reconnects if it must).
async fn write_loop(
    url: String,
    keys: Vec<i64>,
    moved: bool,
    started: Instant,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Txn>>>,
) -> Result<(), BenchError> {
    let connect = || async {
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        Ok::<_, tokio_postgres::Error>(client)
    };
    let mut client = connect()
        .await
        .map_err(|e| sql_error("connecting a writer", e))?;
    let mut mine = Vec::new();
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let key = keys[i % keys.len().max(1)];
        i += 1;
        let t = Instant::now();
        let ok = client
            .execute(
                "update bench_accounts set abalance = abalance + 1 where aid = $1",
                &[&key],
            )
            .await
            .is_ok();
        mine.push(Txn {
            start: t - started,
            latency: t.elapsed(),
            ok,
            moved,
        });
        if !ok && client.is_closed() {
            if let Ok(c) = connect().await {
                client = c;
            }
        }
    }
    if let Ok(mut l) = log.lock() {
        l.extend(mine);
    }
    Ok(())
}

/// "its statements waited N ms" in `herd shards move`'s answer.
fn herd_wait_ms(out: &str) -> f64 {
    out.split("waited ")
        .nth(1)
        .and_then(|r| r.split(" ms").next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

fn max_ms(txns: &[Txn]) -> f64 {
    txns.iter()
        .map(|t| t.latency.as_secs_f64() * 1000.0)
        .fold(0.0, f64::max)
}

fn p99_ms(txns: &[Txn]) -> f64 {
    let mut l: Vec<f64> = txns
        .iter()
        .map(|t| t.latency.as_secs_f64() * 1000.0)
        .collect();
    if l.is_empty() {
        return 0.0;
    }
    l.sort_by(f64::total_cmp);
    let i = ((l.len() as f64) * 0.99).ceil() as usize;
    l[i.saturating_sub(1).min(l.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(ms: u64) -> Txn {
        Txn {
            start: Duration::ZERO,
            latency: Duration::from_millis(ms),
            ok: true,
            moved: true,
        }
    }

    #[test]
    fn percentiles_and_the_reported_wait() {
        let t: Vec<Txn> = (1..=100).map(txn).collect();
        assert_eq!(max_ms(&t), 100.0);
        assert_eq!(p99_ms(&t), 99.0);
        assert_eq!(p99_ms(&[]), 0.0);
        assert_eq!(
            herd_wait_ms(
                "shard 0 moved …; shard 0 switched from group 0 to 1; its statements waited 143 ms"
            ),
            143.0
        );
        assert!(herd_wait_ms("no figure").is_nan());
    }

    #[test]
    fn keys_split_by_shard() {
        let (moved, other) = keys(200_000);
        let map = herd_shard::ShardMap::new(2, SHARDS);
        assert_eq!(moved.len(), KEYS * WRITERS);
        assert_eq!(other.len(), KEYS * WRITERS);
        assert!(moved
            .iter()
            .all(|k| map.shard_of(Some(&herd_shard::KeyValue::Int8(*k))) == SHARD));
        assert!(other
            .iter()
            .all(|k| map.shard_of(Some(&herd_shard::KeyValue::Int8(*k))) != SHARD));
    }
}
