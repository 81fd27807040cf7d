//! `herd bench lag` (reference 001, AlloyDB's replication lag article): pgbench TPC-B on the
//! primary of a 1-replica cluster, first alone, then together with select-only pgbench reading
//! the replica directly, then reading through Herd's proxy (consistency `eventual`, so reads go
//! to the lag-aware read pool) with the default pool limits and with tight ones. A sampler reads
//! the lag at 10 Hz from the servers' WAL positions (bytes and time) during every phase.
//!
//! In `results.json`, `lag` maps each phase to its [`LagResult`] (percentiles, routing, the
//! samples) and `modes` maps each phase to the tps of its targets `writer` (ratio: to the
//! writer alone) and `reader` (ratio: to the reader reading the replica directly).
//! `--scale` is pgbench's scale factor (default 10, quick 1); `--duration` the seconds of each
//! phase (default 60, quick 3).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::ProgressBar;

use super::lag_sampler::{percentile, sample_until, Sampled};
use crate::cluster::ScratchCluster;
use crate::pgbench::{Pgbench, PgbenchRun};
use crate::report::{LagResult, Machine, ModeResult, Percentiles, Results, Settings, TargetResult};
use crate::{BenchError, BenchOptions};

/// TPC-B clients on the primary and select-only clients on the read side: equal, as in the
/// article (128 + 128 on 16 vCPUs); 8 + 8 saturate this machine's 2 cores and stay below the
/// proxy's default pool of 10 server connections per node, so no reader queues in the proxy.
const WRITERS: u32 = 8;
const READERS: u32 = 8;
const THREADS: u32 = 2;
/// The tight read-pool limits of the last phase: about one poll interval of the proxy (100 ms),
/// so the replica leaves the pool as soon as replay falls visibly behind.
const TIGHT_BYTES: u64 = 1024 * 1024;
const TIGHT_MS: u64 = 100;

/// Where a phase's select-only clients read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reader {
    /// No readers.
    None,
    /// Straight to the replica.
    Replica,
    /// Through Herd's proxy with `herd.consistency=eventual`.
    Herd,
}

impl Reader {
    fn name(self) -> &'static str {
        match self {
            Reader::None => "none",
            Reader::Replica => "replica",
            Reader::Herd => "herd",
        }
    }
}

/// A phase: name, readers, whether the proxy runs the tight limits, description.
struct Phase {
    name: &'static str,
    reader: Reader,
    tight: bool,
    description: &'static str,
    published: &'static str,
}

/// The phases in the order run (the tight one last: it restarts the cluster).
const PHASES: [Phase; 4] = [
    Phase {
        name: "primary-alone",
        reader: Reader::None,
        tight: false,
        description: "TPC-B on the primary, replica idle",
        published: "TPC-C-like, idle replica, 16 vCPU: AlloyDB's median lag > 25× lower than \
                    PostgreSQL 14's at equal TPM (figures only in the article's charts)",
    },
    Phase {
        name: "replica-direct",
        reader: Reader::Replica,
        tight: false,
        description: "TPC-B on the primary + pgbench -S straight to the replica (no read pool)",
        published: "TPC-B 128 clients + select-only 128 clients on the replica, 16 vCPU, 1 h: \
                    PostgreSQL 14's lag grows without bound; AlloyDB's stays bounded (median \
                    < 100 ms) with 3× PostgreSQL's primary TPS",
    },
    Phase {
        name: "herd-pool",
        reader: Reader::Herd,
        tight: false,
        description: "TPC-B on the primary + pgbench -S through Herd (eventual), default \
                      read-pool limits",
        published: "— (AlloyDB throttles reads on a lagging read node; Herd takes the node out \
                    of the read pool and reads go to the primary)",
    },
    Phase {
        name: "herd-pool-tight",
        reader: Reader::Herd,
        tight: true,
        description: "as herd-pool, read-pool limits 1 MiB / 100 ms",
        published: "—",
    },
];

/// The run's shape: full or quick.
struct Plan {
    duration: u64,
    scale: u32,
}

/// Runs the scenario; the figures for the report.
pub fn run(opts: &BenchOptions, bar: &ProgressBar) -> Result<Results, BenchError> {
    let plan = Plan {
        duration: opts
            .duration
            .unwrap_or(if opts.quick { 3 } else { 60 })
            .max(1),
        scale: opts.scale.unwrap_or(if opts.quick { 1 } else { 10 }).max(1),
    };
    let pgbench = Pgbench::locate()?;
    bar.set_length(PHASES.len() as u64 + 1);
    bar.set_message("starting a scratch cluster (1 replica, commit mode async)");
    let cluster = ScratchCluster::start_with(opts, &["--replicas", "1", "--commit-mode", "async"])?;
    let defaults = proxy_config(&cluster)?;
    bar.set_message(format!("pgbench -i -s {} on the primary", plan.scale));
    let init = ["-i", "-q", "-s", &plan.scale.to_string()].map(String::from);
    pgbench.run_raw(
        "pgbench -i",
        &init,
        &cluster.primary_url,
        Duration::from_secs(900),
    )?;
    bar.inc(1);

    let mut notes = Vec::new();
    let mut lag = BTreeMap::new();
    let mut tps: BTreeMap<&str, (PgbenchRun, Option<PgbenchRun>)> = BTreeMap::new();
    for phase in &PHASES {
        if phase.tight {
            bar.set_message(format!(
                "{}: restarting the cluster with read-pool limits 1 MiB / {TIGHT_MS} ms",
                phase.name
            ));
            restart_with_limits(&cluster, TIGHT_BYTES, TIGHT_MS)?;
            // The restart emptied both servers' shared buffers: a cold replica replays
            // slower, which would be charged to the tight limits. Warm both up with the
            // previous phases' load first (not measured).
            bar.set_message(format!("{}: warming up after the restart", phase.name));
            let warm = Plan {
                duration: plan.duration.min(10),
                scale: plan.scale,
            };
            run_phase(&cluster, &pgbench, &warm, &PHASES[1])?;
        }
        let limits = limits_text(&proxy_config(&cluster)?);
        bar.set_message(format!("{}: {} s", phase.name, plan.duration));
        let (writer, reader, mut result) = run_phase(&cluster, &pgbench, &plan, phase)?;
        if phase.reader == Reader::Herd {
            result.read_pool_limits = Some(limits);
        }
        if result.skipped_samples > 0 {
            notes.push(format!(
                "{}: {} sampler ticks skipped (a query failed or took > 2 s).",
                phase.name, result.skipped_samples
            ));
        }
        lag.insert(phase.name.to_string(), result);
        tps.insert(phase.name, (writer, reader));
        bar.inc(1);
    }
    drop(cluster);

    let modes = tps_rows(&tps);
    notes.extend(standing_notes(&defaults));
    Ok(Results {
        scenario: "lag".into(),
        date: crate::report::now_utc(),
        quick: opts.quick,
        machine: Machine::detect(),
        settings: Settings {
            command: format!(
                "writer: pgbench -n -c {WRITERS} -j {THREADS} -T {0} PRIMARY (TPC-B); reader: \
                 pgbench -n -S -c {READERS} -j {THREADS} -T {0} REPLICA | HERD \
                 (options=-c herd.consistency=eventual); lag sampled every 100 ms",
                plan.duration
            ),
            rounds: 1,
            duration_s: plan.duration,
            scale: plan.scale,
            modes: PHASES.iter().map(|p| p.name.to_string()).collect(),
            targets: vec!["writer".into(), "reader".into()],
            versions: [("herd".to_string(), env!("CARGO_PKG_VERSION").to_string())].into(),
        },
        modes,
        published: PHASES
            .iter()
            .map(|p| (p.name.to_string(), p.published.to_string()))
            .collect(),
        notes,
        lag,
        ..Default::default()
    })
}

/// Runs one phase: the writer on the primary, the readers if any, the sampler throughout.
fn run_phase(
    cluster: &ScratchCluster,
    pgbench: &Pgbench,
    plan: &Plan,
    phase: &Phase,
) -> Result<(PgbenchRun, Option<PgbenchRun>, LagResult), BenchError> {
    let primary = cluster.herd_ok(&["url", "--primary"])?.trim().to_string();
    let replica = cluster
        .herd_ok(&["url", "--replica", "1"])?
        .trim()
        .to_string();
    // What pgbench's own vacuum would do, done here so writer and readers (both -n) start
    // together. Then a checkpoint: the first change of each page after one is logged as a
    // full-page image, so every phase starts with the same WAL volume ahead (the tight phase
    // follows a restart, i.e. a shutdown checkpoint). Then replay catches up, so no phase
    // inherits the previous one's backlog.
    cluster.psql(
        &primary,
        &[
            "vacuum pgbench_branches",
            "vacuum pgbench_tellers",
            "truncate pgbench_history",
            "checkpoint",
        ],
    )?;
    cluster.settle()?;
    let reader_url = match phase.reader {
        Reader::None => None,
        Reader::Replica => Some(replica.clone()),
        Reader::Herd => Some(with_eventual(&herd_proxy_url(cluster)?)),
    };
    let proxied = phase.reader == Reader::Herd;
    let routed_before = if proxied { routed(cluster) } else { (0, 0) };
    let in_pool = || {
        cluster
            .metrics(&["herd_replica_in_read_pool"])
            .values()
            .next()
            .map(|v| *v > 0.5)
    };
    let in_pool: Option<&(dyn Fn() -> Option<bool> + Sync)> =
        if proxied { Some(&in_pool) } else { None };
    let limit = Duration::from_secs(plan.duration + 120);
    let writer_args = format!("-n -c {WRITERS} -j {THREADS} -T {}", plan.duration);
    let reader_args = format!("-n -S -c {READERS} -j {THREADS} -T {}", plan.duration);
    let split = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
    let stop = AtomicBool::new(false);

    let (writer, reader, sampled) = std::thread::scope(|s| {
        let sampler = s.spawn(|| sample_until(&primary, &replica, &stop, in_pool));
        let reader = reader_url.as_ref().map(|url| {
            let args = split(&reader_args);
            s.spawn(move || {
                pgbench.run(
                    &format!("pgbench -S on {}", phase.reader.name()),
                    &args,
                    url,
                    limit,
                )
            })
        });
        let writer = pgbench.run(
            "pgbench TPC-B on the primary",
            &split(&writer_args),
            &primary,
            limit,
        );
        let reader = reader.map(|h| h.join().unwrap_or_else(|_| Err(panicked("pgbench -S"))));
        // Stop the sampler whatever happened, so the scope can end.
        stop.store(true, Ordering::Relaxed);
        let sampled = sampler
            .join()
            .unwrap_or_else(|_| Err(panicked("the lag sampler")));
        (writer, reader, sampled)
    });
    let writer = writer?;
    let reader = reader.transpose()?;
    let sampled = sampled?;
    if sampled.samples.is_empty() {
        return Err(BenchError::Missing(format!(
            "{}: the lag sampler got no sample in {:.0} s",
            phase.name, sampled.elapsed_s
        )));
    }
    let mut result = summarize(phase, &sampled);
    if proxied {
        let after = routed(cluster);
        result.reads_to_replica = Some(after.0.saturating_sub(routed_before.0));
        result.reads_to_primary = Some(after.1.saturating_sub(routed_before.1));
    }
    Ok((writer, reader, result))
}

/// Percentiles, pool membership and the series of one phase's samples.
fn summarize(phase: &Phase, sampled: &Sampled) -> LagResult {
    let s = &sampled.samples;
    let stats = |v: Vec<f64>| Percentiles {
        p50: percentile(&v, 50.0),
        p95: percentile(&v, 95.0),
        max: v.iter().copied().fold(0.0, f64::max),
    };
    let pool: Vec<bool> = s.iter().filter_map(|x| x.in_pool).collect();
    let proxied = phase.reader == Reader::Herd;
    LagResult {
        description: phase.description.into(),
        reader: phase.reader.name().into(),
        samples: s.len() as u32,
        sample_hz: s.len() as f64 / sampled.elapsed_s.max(1e-9),
        skipped_samples: sampled.skipped,
        wal_bytes_per_s: sampled.wal_bytes_per_s,
        bytes: stats(s.iter().map(|x| x.bytes as f64).collect()),
        time_ms: stats(s.iter().map(|x| x.time_ms).collect()),
        replay_lag_ms: stats(s.iter().filter_map(|x| x.replay_lag_ms).collect()),
        read_pool_limits: None,
        reads_to_replica: None,
        reads_to_primary: None,
        pool_exits: proxied.then(|| pool.windows(2).filter(|w| w[0] && !w[1]).count() as u32),
        in_pool_share: (proxied && !pool.is_empty())
            .then(|| pool.iter().filter(|p| **p).count() as f64 / pool.len() as f64),
        series: s
            .iter()
            .map(|x| [round(x.t_s, 3), x.bytes as f64, round(x.time_ms, 2)])
            .collect(),
    }
}

fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

fn panicked(what: &str) -> BenchError {
    BenchError::Missing(format!("{what} panicked"))
}

/// The `[proxy]` settings the cluster runs with, from its `herd.toml`.
fn proxy_config(cluster: &ScratchCluster) -> Result<herd_config::ProxyConfig, BenchError> {
    let path = cluster.data_dir().join("herd.toml");
    herd_config::Config::load(&path)
        .map(|c| c.proxy)
        .map_err(|e| BenchError::Missing(format!("reading the scratch cluster's settings: {e}")))
}

/// The read-pool limits as "16 MiB / 1000 ms" (bytes below 1 MiB in KiB).
fn limits_text(p: &herd_config::ProxyConfig) -> String {
    let bytes = p.max_replica_lag_bytes;
    if bytes >= 1024 * 1024 {
        format!(
            "{} MiB / {} ms",
            bytes / (1024 * 1024),
            p.max_replica_lag_ms
        )
    } else {
        format!("{} KiB / {} ms", bytes / 1024, p.max_replica_lag_ms)
    }
}

/// The proxy's URL as `herd url` prints it now.
fn herd_proxy_url(cluster: &ScratchCluster) -> Result<String, BenchError> {
    Ok(cluster.herd_ok(&["url"])?.trim().to_string())
}

/// `url` with the startup option `-c herd.consistency=eventual`: reads may go to any replica
/// in the read pool, however far behind within the pool's limits.
fn with_eventual(url: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-c%20herd.consistency%3Deventual")
}

/// Reads the proxy has routed so far: (to a replica, to the primary). Replicas are the nodes
/// with a `herd_replica_lag_bytes` gauge; routes of writes and DDL are not reads.
fn routed(cluster: &ScratchCluster) -> (u64, u64) {
    let m = cluster.metrics(&["herd_routed_total", "herd_replica_lag_bytes"]);
    let replicas: Vec<String> = m
        .keys()
        .filter(|k| k.starts_with("herd_replica_lag_bytes"))
        .filter_map(|k| label(k, "node"))
        .collect();
    let mut out = (0, 0);
    for (k, v) in m.iter().filter(|(k, _)| k.starts_with("herd_routed_total")) {
        let reason = label(k, "reason").unwrap_or_default();
        if reason == "write" || reason == "ddl" {
            continue;
        }
        let node = label(k, "node").unwrap_or_default();
        if replicas.contains(&node) {
            out.0 += *v as u64;
        } else {
            out.1 += *v as u64;
        }
    }
    out
}

/// The value of label `name` in a Prometheus sample name `metric{a="x",b="y"}`.
fn label(sample: &str, name: &str) -> Option<String> {
    let inner = sample.split_once('{')?.1.strip_suffix('}')?;
    inner
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim_matches('"').to_string())
}

/// Takes the cluster down, sets the proxy's read-pool limits in its `herd.toml` (the proxy
/// reads them at start; `herd config set` covers only commit settings) and brings it back up.
fn restart_with_limits(cluster: &ScratchCluster, bytes: u64, ms: u64) -> Result<(), BenchError> {
    cluster.herd_limited(&["down"], 180)?;
    let path = cluster.data_dir().join("herd.toml");
    let text = std::fs::read_to_string(&path).map_err(|e| BenchError::io("reading", &path, e))?;
    let text = set_limits(&text, bytes, ms)?;
    std::fs::write(&path, text).map_err(|e| BenchError::io("writing", &path, e))?;
    cluster.herd_limited(&["up", "--detach"], 600)?;
    Ok(())
}

/// `herd.toml` text with `max_replica_lag_bytes` and `max_replica_lag_ms` replaced.
fn set_limits(text: &str, bytes: u64, ms: u64) -> Result<String, BenchError> {
    let mut found = 0;
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let key = line.split('=').next().unwrap_or("").trim();
        match key {
            "max_replica_lag_bytes" => {
                found += 1;
                let _ = writeln!(out, "max_replica_lag_bytes = {bytes}");
            }
            "max_replica_lag_ms" => {
                found += 1;
                let _ = writeln!(out, "max_replica_lag_ms = {ms}");
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    if found != 2 {
        return Err(BenchError::Missing(
            "herd.toml has no max_replica_lag_bytes / max_replica_lag_ms lines to change".into(),
        ));
    }
    Ok(out)
}

/// phase → writer and reader tps, with their ratios to the writer alone and to the readers
/// reading the replica directly.
fn tps_rows(
    tps: &BTreeMap<&str, (PgbenchRun, Option<PgbenchRun>)>,
) -> BTreeMap<String, ModeResult> {
    let writer_alone = tps.get("primary-alone").map_or(0.0, |(w, _)| w.tps);
    let reader_direct = tps
        .get("replica-direct")
        .and_then(|(_, r)| r.as_ref())
        .map_or(0.0, |r| r.tps);
    let row = |run: &PgbenchRun, base: f64| TargetResult {
        runs: vec![run.tps],
        median_tps: run.tps,
        ratio_to_direct: if base > 0.0 { run.tps / base } else { 0.0 },
        failed_transactions: run.failed,
    };
    tps.iter()
        .map(|(phase, (writer, reader))| {
            let mut m = ModeResult::new();
            m.insert("writer".into(), row(writer, writer_alone));
            if let Some(r) = reader {
                m.insert("reader".into(), row(r, reader_direct));
            }
            (phase.to_string(), m)
        })
        .collect()
}

/// The caveats every run carries.
fn standing_notes(defaults: &herd_config::ProxyConfig) -> Vec<String> {
    vec![
        "One 2-core machine runs the primary, the replica, both pgbench processes, Herd's proxy \
         and the sampler: the replica's replay competes with the primary for the same CPUs, \
         which is the main limit of this reproduction (the article gives each node 16 vCPUs)."
            .into(),
        format!(
            "Cluster: 1 primary + 1 replica, commit mode async (plain streaming replication, as \
             in the article), hot_standby_feedback on (Herd's default, as in the article). One \
             replica, not two: a second replay process would only take more of the 2 cores. \
             Clients: {WRITERS} TPC-B + {READERS} select-only, equal like the article's 128 + 128."
        ),
        "Lag: every 100 ms the sampler reads pg_last_wal_replay_lsn() on the replica, then \
         pg_current_wal_lsn() and pg_stat_replication.replay_lag on the primary. bytes = \
         current − replayed; time lag = how long ago the primary's position (from the earlier \
         samples, linearly interpolated) passed the replayed one; replay_lag is PostgreSQL's \
         own figure (flush on the primary → replay reported by the standby, NULL when idle)."
            .into(),
        format!(
            "Read pool: a replica leaves when its lag exceeds max_replica_lag_bytes or \
             max_replica_lag_ms (default {} MiB / {} ms) and returns below {}× both; the proxy \
             polls every {} ms, so its time lag is only known to about one poll interval. \
             herd-pool-tight restarts the cluster with 1 MiB / {TIGHT_MS} ms in herd.toml (then \
             an unmeasured warm-up of ≤ 10 s of the replica-direct load refills the caches). Pool \
             exits are counted from herd_replica_in_read_pool at 10 Hz (shorter absences may \
             be missed); reads routed are herd_routed_total deltas.",
            defaults.max_replica_lag_bytes / (1024 * 1024),
            defaults.max_replica_lag_ms,
            defaults.readmit_fraction,
            defaults.poll_interval_ms
        ),
        "Reads on the primary write WAL: Herd's servers run with data checksums and \
         wal_log_hints, so the first hint-bit change of a page after a checkpoint is logged as \
         a full-page image. Readers moved to the primary (herd-pool-tight) right after the \
         phase's checkpoint therefore add replay work, which can keep the replica out of the \
         pool longer; compare the phases' WAL MiB/s."
            .into(),
        "Phases run once each, in table order, on the same data; before each the tables are \
         vacuumed and pgbench_history truncated (what pgbench does without -n), a checkpoint \
         runs (each phase starts with the same full-page writes ahead) and replay catches up."
            .into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_replaced_in_herd_toml() {
        let text = "[proxy]\n# comment max_replica_lag_ms\nmax_replica_lag_bytes = 16777216\n\
                    max_replica_lag_ms = 1000\nreadmit_fraction = 0.5\n";
        let out = set_limits(text, 1024, 100).expect("replaced");
        assert!(out.contains("max_replica_lag_bytes = 1024\n"), "{out}");
        assert!(out.contains("max_replica_lag_ms = 100\n"), "{out}");
        assert!(out.contains("# comment max_replica_lag_ms\n"), "{out}");
        assert!(out.contains("readmit_fraction = 0.5\n"), "{out}");
        assert!(set_limits("[proxy]\n", 1, 1).is_err());
    }

    #[test]
    fn labels_and_urls() {
        let k = "herd_routed_total{node=\"node1\",reason=\"read\"}";
        assert_eq!(label(k, "node").as_deref(), Some("node1"));
        assert_eq!(label(k, "reason").as_deref(), Some("read"));
        assert_eq!(label(k, "user"), None);
        assert_eq!(
            with_eventual("postgresql://u:p@h:1/db"),
            "postgresql://u:p@h:1/db?options=-c%20herd.consistency%3Deventual"
        );
        assert!(with_eventual("postgresql://h/db?sslmode=disable").contains("disable&options="));
    }
}
