//! `herd bench bandwidth` (reference 004): bytes sent to one standby by physical streaming
//! replication and to one logical subscription of the same tables, for three workloads, under
//! the publisher's `wal_compression` off, lz4 and zstd.
//!
//! The publisher is a Herd cluster with one replica (the physical stream) and
//! `postgres.wal_level = "logical"` in its `herd.toml`; the subscriber is a second Herd cluster
//! without replicas whose PostgreSQL subscribes (`CREATE SUBSCRIPTION`, native `pgoutput`) to a
//! publication of the pgbench tables and the table `bw (id int)`. Both clusters get the same
//! pgbench data from their own `pgbench -i` (pgbench's data is deterministic), so the
//! subscription starts with `copy_data = false` and every UPDATE finds its row.
//!
//! Per workload: `CHECKPOINT` (except before the steady-state pgbench run, which follows the
//! post-checkpoint one), wait until both streams have caught up, read each walsender's
//! counters, run the workload, wait again, read again. The figure is the TCP payload the
//! walsender's socket sent (`bytes_sent` of `ss -ti`, the kernel's `tcpi_bytes_sent`); the
//! `sent_lsn` advance is recorded as a cross-check. (`/proc/PID/io` `wchar` cannot serve: it
//! counts write(2)-family calls, and walsenders send with send(2).)
//!
//! `--scale N`: rows of the bulk insert (default 1,000,000; quick 100,000); the single-row
//! commits are N / 100 (at least 100). `--duration S`: each of the two pgbench runs does
//! rate × S transactions (`-R 1000 -t 1000·S/3` per client; default 15; quick 5 at 200 tps), as
//! long as that takes on this machine. The pgbench scale factor is 1, pgbench's default
//! (004 gives none), so the post-checkpoint run has touched nearly every page before the
//! steady-state run starts.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;

use super::bandwidth_report::{BandwidthRow, StreamBytes, COMPRESSIONS, WORKLOADS};
use crate::cluster::ScratchCluster;
use crate::pgbench::Pgbench;
use crate::process::{run_limited, write_script};
use crate::report::{Machine, Results, Settings};
use crate::{BenchError, BenchOptions};

/// The subscription's name, also its slot's and its walsender's `application_name`.
const SUB: &str = "herd_bench_sub";
/// The publication on the publisher.
const PUBLICATION: &str = "herd_bench_pub";
/// The published tables.
const TABLES: [&str; 5] = [
    "pgbench_accounts",
    "pgbench_branches",
    "pgbench_tellers",
    "pgbench_history",
    "bw",
];
/// pgbench clients, as in reference 004 (`-c 3`).
const CLIENTS: u32 = 3;
/// pgbench's fixed rate (`-R`) in the full run, as in reference 004.
const RATE: u32 = 1000;
/// The single-row commit of the third workload.
const ONE_ROW: &str = "\\set id random(1, 2000000000)\ninsert into bw values (:id);\n";

/// Runs the scenario; the figures for the report.
pub fn run(opts: &BenchOptions, bar: &ProgressBar) -> Result<Results, BenchError> {
    let quick = opts.quick;
    let rows = opts
        .scale
        .map_or(if quick { 100_000 } else { 1_000_000 }, u64::from)
        .max(1);
    let commits = (rows / 100).max(100);
    let pg_scale = 1;
    let secs = opts.duration.unwrap_or(if quick { 5 } else { 15 });
    let rate = if quick { 200 } else { RATE };
    let pgbench = Pgbench::locate()?;
    bar.set_length((COMPRESSIONS.len() * WORKLOADS.len()) as u64);

    bar.set_message("starting the publisher (1 replica, wal_level = logical)");
    let publisher = ScratchCluster::start_with_config(
        opts,
        &["--replicas", "1", "--commit-mode", "async"],
        "[postgres]\nwal_level = \"logical\"\n",
    )?;
    bar.set_message("starting the subscriber (no replicas)");
    let subscriber =
        ScratchCluster::start_with(opts, &["--replicas", "0", "--commit-mode", "async"])?;
    bar.set_message(format!("pgbench -i -s {pg_scale} on both, subscribing"));
    subscribe(&publisher, &subscriber, &pgbench, pg_scale)?;
    let one_row = write_script(publisher.dir(), "one_row.sql", ONE_ROW)?;

    let work = Workloads {
        pgbench: &pgbench,
        secs,
        rate,
        rows,
        commits,
        one_row: one_row.display().to_string(),
    };
    let mut table = Vec::new();
    for compression in COMPRESSIONS {
        bar.set_message(format!("herd config set wal-compression {compression}"));
        publisher.config_set(
            "wal-compression",
            compression,
            "wal_compression",
            compression,
        )?;
        for workload in WORKLOADS {
            bar.set_message(format!("wal_compression {compression}: {workload}"));
            table.push(measure(&publisher, &work, workload, compression)?);
            bar.inc(1);
        }
    }
    publisher.config_set("wal-compression", "off", "wal_compression", "off")?;
    let progress = |text: &str| bar.set_message(text.to_string());
    let copies = super::bandwidth_copies::run(&publisher, &subscriber, rows, &progress)?;
    drop(subscriber);
    drop(publisher);
    let mut r = results(opts, table, &work, pg_scale);
    r.copy_bandwidth = copies;
    Ok(r)
}

/// Creates the same tables on both clusters, the publication and the subscription, and waits
/// until the subscription streams.
fn subscribe(
    publisher: &ScratchCluster,
    subscriber: &ScratchCluster,
    pgbench: &Pgbench,
    pg_scale: u32,
) -> Result<(), BenchError> {
    let init: Vec<String> = ["-i", "-q", "-s", &pg_scale.to_string()]
        .map(String::from)
        .into();
    for (name, c) in [("publisher", publisher), ("subscriber", subscriber)] {
        let what = format!("pgbench -i on the {name}");
        pgbench.run_raw(&what, &init, &c.primary_url, Duration::from_secs(900))?;
        c.psql(&c.primary_url, &["create table bw (id int)"])?;
    }
    // As in reference 004: no autovacuum traffic in the physical stream.
    let mut sql: Vec<String> = TABLES
        .iter()
        .map(|t| format!("alter table {t} set (autovacuum_enabled = off)"))
        .collect();
    sql.push(format!(
        "create publication {PUBLICATION} for table {}",
        TABLES.join(", ")
    ));
    let sql: Vec<&str> = sql.iter().map(String::as_str).collect();
    publisher.psql(&publisher.primary_url, &sql)?;
    let create = format!(
        "create subscription {SUB} connection '{}' publication {PUBLICATION} \
         with (copy_data = false)",
        publisher.primary_url.replace('\'', "''")
    );
    subscriber.psql(&subscriber.primary_url, &[&create])?;
    let q = "select count(*) from pg_stat_replication where state = 'streaming'";
    let deadline = Instant::now() + Duration::from_secs(60);
    while publisher.psql(&publisher.primary_url, &[q])?.trim() != "2" {
        if Instant::now() > deadline {
            return Err(BenchError::Missing(format!(
                "the subscription {SUB} did not start streaming from the publisher within 60 s \
                 (see the subscriber's PostgreSQL log)"
            )));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(())
}

/// How the workloads are run.
struct Workloads<'a> {
    pgbench: &'a Pgbench,
    secs: u64,
    rate: u32,
    rows: u64,
    commits: u64,
    one_row: String,
}

impl Workloads<'_> {
    /// Transactions per pgbench client: a fixed count (the rate times the duration), not a fixed
    /// time, so that every run writes the same changes whatever rate this machine achieves (after
    /// a checkpoint, full-page images make the bytes per transaction depend on the count).
    fn per_client(&self) -> u64 {
        (u64::from(self.rate) * self.secs / u64::from(CLIENTS)).max(1)
    }

    /// The pgbench arguments of the TPC-B run.
    fn tpcb_args(&self) -> Vec<String> {
        format!(
            "-n -c {CLIENTS} -j 1 -R {} -t {}",
            self.rate,
            self.per_client()
        )
        .split(' ')
        .map(String::from)
        .collect()
    }

    /// The pgbench arguments of the single-row commits.
    fn one_row_args(&self) -> Vec<String> {
        [
            "-n",
            "-c",
            "1",
            "-t",
            &self.commits.to_string(),
            "-f",
            &self.one_row,
        ]
        .map(String::from)
        .into()
    }

    /// Runs `workload` on the publisher; how many units (transactions, rows, commits) it did
    /// and the unit's name.
    fn run(
        &self,
        publisher: &ScratchCluster,
        workload: &str,
    ) -> Result<(u64, &'static str), BenchError> {
        let url = &publisher.primary_url;
        match workload {
            "pgbench" | "pgbench-checkpoint" => {
                let what = format!("pgbench -R {} -t {}", self.rate, self.per_client());
                let limit = Duration::from_secs(self.secs * 10 + 600);
                let r = self.pgbench.run(&what, &self.tpcb_args(), url, limit)?;
                Ok((r.transactions, "txn"))
            }
            "bulk-insert" => {
                let sql = format!("insert into bw select generate_series(1, {})", self.rows);
                publisher.psql(url, &[&sql])?;
                Ok((self.rows, "row"))
            }
            _ => {
                let what = format!("pgbench -t {} (single-row commits)", self.commits);
                let limit = Duration::from_secs(900);
                let r = self.pgbench.run(&what, &self.one_row_args(), url, limit)?;
                Ok((r.transactions, "commit"))
            }
        }
    }
}

/// One walsender's counters at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
struct Counters {
    pid: u32,
    client_port: u16,
    socket: u64,
    sent_lsn: u64,
    spill: u64,
}

/// Both streams' counters and the publisher's WAL position.
struct Snapshot {
    physical: Counters,
    logical: Counters,
    wal_lsn: u64,
}

/// Runs `workload` once and measures both streams.
fn measure(
    publisher: &ScratchCluster,
    work: &Workloads,
    workload: &str,
    compression: &str,
) -> Result<BandwidthRow, BenchError> {
    let url = &publisher.primary_url;
    if !workload.starts_with("pgbench") {
        // Each insert workload starts from an empty table; TRUNCATE replicates (both ways)
        // before the counters are read.
        publisher.psql(url, &["truncate bw"])?;
    }
    if workload != "pgbench" {
        publisher.psql(url, &["checkpoint"])?;
    }
    wait_caught_up(publisher)?;
    let before = snapshot(publisher)?;
    let started = Instant::now();
    let (units, unit) = work.run(publisher, workload)?;
    let seconds = started.elapsed().as_secs_f64();
    wait_caught_up(publisher)?;
    let after = snapshot(publisher)?;
    let delta = |a: &Counters, b: &Counters, which: &str| {
        if (a.pid, a.client_port) != (b.pid, b.client_port) {
            return Err(BenchError::Missing(format!(
                "the {which} walsender was replaced during {workload} ({compression}): \
                 pid {} → {}; its counters cannot be compared",
                b.pid, a.pid
            )));
        }
        Ok(StreamBytes {
            socket_bytes: a.socket.saturating_sub(b.socket),
            sent_lsn_bytes: a.sent_lsn.saturating_sub(b.sent_lsn),
            spill_bytes: a.spill.saturating_sub(b.spill),
        })
    };
    let physical = delta(&after.physical, &before.physical, "physical")?;
    let logical = delta(&after.logical, &before.logical, "logical")?;
    let ratio = if physical.socket_bytes > 0 {
        logical.socket_bytes as f64 / physical.socket_bytes as f64
    } else {
        0.0
    };
    Ok(BandwidthRow {
        workload: workload.into(),
        wal_compression: compression.into(),
        physical,
        logical,
        wal_bytes: after.wal_lsn.saturating_sub(before.wal_lsn),
        units,
        unit: unit.into(),
        seconds,
        ratio_logical_to_physical: ratio,
    })
}

/// Waits (at most 10 minutes) until both streams have received the publisher's current WAL
/// position and the standby has replayed it. The subscriber reports a position as received
/// only after applying what came before it (its apply loop is sequential).
fn wait_caught_up(publisher: &ScratchCluster) -> Result<(), BenchError> {
    let url = &publisher.primary_url;
    let target = publisher.psql(url, &["select pg_current_wal_lsn()"])?;
    let target = target.trim();
    let q = format!(
        "select count(*) from pg_stat_replication where state = 'streaming' \
         and write_lsn >= '{target}' and (application_name = '{SUB}' or replay_lsn >= '{target}')"
    );
    let deadline = Instant::now() + Duration::from_secs(600);
    while publisher.psql(url, &[&q])?.trim() != "2" {
        if Instant::now() > deadline {
            let state = publisher.psql(
                url,
                &[
                    "select application_name, state, sent_lsn, write_lsn, replay_lsn \
                   from pg_stat_replication",
                ],
            )?;
            return Err(BenchError::Missing(format!(
                "the streams did not reach {target} within 10 minutes:\n{state}"
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Both walsenders' counters: pid, client port and `sent_lsn` from `pg_stat_replication`,
/// socket bytes from `ss`, spilled bytes of the subscription's slot.
fn snapshot(publisher: &ScratchCluster) -> Result<Snapshot, BenchError> {
    let url = &publisher.primary_url;
    let port = crate::cluster::UrlParts::parse(url)
        .map(|p| p.port)
        .ok_or_else(|| BenchError::Parse {
            what: "the publisher's URL".into(),
            output: url.clone(),
        })?;
    let q = format!(
        "select application_name = '{SUB}', pid, client_port, sent_lsn, pg_current_wal_lsn(), \
         coalesce((select spill_bytes from pg_stat_replication_slots where slot_name = '{SUB}'), 0) \
         from pg_stat_replication where state = 'streaming'"
    );
    let out = publisher.psql(url, &[&q])?;
    let mut streams: BTreeMap<bool, Counters> = BTreeMap::new();
    let mut wal_lsn = 0;
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split('|').collect();
        let parsed = (|| {
            let logical = f.first()? == &"t";
            let pid: u32 = f.get(1)?.parse().ok()?;
            let client_port: u16 = f.get(2)?.parse().ok()?;
            let sent_lsn = parse_lsn(f.get(3)?)?;
            wal_lsn = parse_lsn(f.get(4)?)?;
            let spill: u64 = f.get(5)?.parse().ok()?;
            Some((logical, pid, client_port, sent_lsn, spill))
        })();
        let Some((logical, pid, client_port, sent_lsn, spill)) = parsed else {
            return Err(BenchError::Parse {
                what: "pg_stat_replication".into(),
                output: out.clone(),
            });
        };
        let counters = Counters {
            pid,
            client_port,
            socket: socket_bytes_sent(port, client_port)?,
            sent_lsn,
            spill: if logical { spill } else { 0 },
        };
        if streams.insert(logical, counters).is_some() {
            return Err(BenchError::Missing(format!(
                "more than one {} walsender streams from the publisher:\n{out}",
                if logical { "logical" } else { "physical" }
            )));
        }
    }
    match (streams.remove(&false), streams.remove(&true)) {
        (Some(physical), Some(logical)) => Ok(Snapshot {
            physical,
            logical,
            wal_lsn,
        }),
        _ => Err(BenchError::Missing(format!(
            "expected one physical and one logical walsender on the publisher, found:\n{out}"
        ))),
    }
}

/// `X/Y` (hexadecimal halves) as a byte position.
fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.trim().split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}

/// `bytes_sent` of the established TCP socket from 127.0.0.1:`local` to `peer` (the
/// walsender's side of its connection), as `ss -ti` reports it.
pub(super) fn socket_bytes_sent(local: u16, peer: u16) -> Result<u64, BenchError> {
    let mut cmd = Command::new("ss");
    cmd.args(["-t", "-i", "-n", "-H", "state", "established", "("])
        .args(["sport", "=", &format!(":{local}"), "and"])
        .args(["dport", "=", &format!(":{peer}"), ")"]);
    let out = run_limited("ss -ti (iproute2)", cmd, 30)?;
    parse_bytes_sent(&out).ok_or_else(|| BenchError::Parse {
        what: format!("ss -ti for the socket :{local} → :{peer} (bytes_sent)"),
        output: out,
    })
}

/// The `bytes_sent:N` field of `ss -ti` output.
fn parse_bytes_sent(ss: &str) -> Option<u64> {
    ss.split_whitespace()
        .find_map(|w| w.strip_prefix("bytes_sent:"))
        .and_then(|v| v.parse().ok())
}

/// The figures and their explanation.
fn results(opts: &BenchOptions, table: Vec<BandwidthRow>, w: &Workloads, pg_scale: u32) -> Results {
    let notes = vec![
        "Bytes: TCP payload sent by each walsender's socket (`bytes_sent` of `ss -ti`, the \
         kernel's tcpi_bytes_sent), the delta over the workload; reference 004 counted TX bytes \
         of the provider's network interface (its figures include TCP/IP headers and any other \
         traffic). Cross-checks in the list under the table: the advance of each walsender's \
         `sent_lsn` (WAL read; for the logical stream this is WAL decoded, not bytes sent) and \
         the logical slot's spilled bytes. /proc/PID/io `wchar` was tried and dropped: it \
         counts write(2)-family calls, and walsenders send with send(2)."
            .into(),
        "One publisher feeds both streams at once (the same WAL), whereas 004 measured them in \
         separate runs. Each workload starts after CHECKPOINT (same full-page-image state), \
         except `pgbench`, which follows `pgbench-checkpoint` at once: that run touched nearly \
         every page of the scale-1 tables, so `pgbench` shows the steady state with few \
         full-page images (as in 004's 200 s run) and `pgbench-checkpoint` the first seconds \
         after a checkpoint, where wal_compression matters. The pgbench runs do a fixed number \
         of transactions at the fixed rate (-R with -t, not -T), so that every run writes the \
         same changes whatever rate the machine achieves. Both streams' counters are read once the standby has replayed and the subscriber has \
         received everything (publisher's pg_stat_replication)."
            .into(),
        "wal_compression compresses only the full-page images in WAL, so it can shrink the \
         physical stream; the logical stream carries decoded row changes (pgoutput) and should \
         not change with it — its three rows per workload show how repeatable the measurement is."
            .into(),
        format!(
            "Publisher: Herd cluster with 1 replica, commit mode async (004's streaming \
             replication was asynchronous), postgres.wal_level = logical, autovacuum off on the \
             published tables (as in 004). Subscriber: a second Herd cluster, no replicas, \
             native logical replication (PostgreSQL 15 pgoutput, `copy_data = false` after \
             `pgbench -i -s {pg_scale}` on both sides) instead of pglogical 2.2 on 9.6."
        ),
        "004 ran provider and subscriber on two 4-core VMs over a network; here both clusters, \
         pgbench and the standby share this machine's cores over loopback. Byte counts depend \
         little on load, except that pgbench's achieved rate and the walsenders' batching do."
            .into(),
    ];
    Results {
        scenario: "bandwidth".into(),
        date: crate::report::now_utc(),
        quick: opts.quick,
        machine: Machine::detect(),
        settings: Settings {
            command: format!(
                "pgbench -n -c {CLIENTS} -j 1 -R {} -t {} (scale {pg_scale}); insert into bw \
                 select generate_series(1, {}); pgbench -n -c 1 -t {} -f one_row.sql ({})",
                w.rate,
                w.per_client(),
                w.rows,
                w.commits,
                ONE_ROW.replace('\n', " ").trim()
            ),
            rounds: 1,
            duration_s: w.secs,
            scale: u32::try_from(w.rows).unwrap_or(u32::MAX),
            modes: COMPRESSIONS.iter().map(|c| c.to_string()).collect(),
            targets: vec!["logical".into(), "physical".into()],
            versions: [("herd".to_string(), env!("CARGO_PKG_VERSION").to_string())].into(),
        },
        modes: BTreeMap::new(),
        published: super::bandwidth_report::WORKLOADS
            .iter()
            .filter_map(|wl| {
                let (l, p, what) = super::bandwidth_report::published(wl)?;
                Some((
                    wl.to_string(),
                    format!("logical {l} B, physical {p} B ({what})"),
                ))
            })
            .collect(),
        notes,
        failover: BTreeMap::new(),
        bandwidth: table,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsns() {
        assert_eq!(parse_lsn("0/0"), Some(0));
        assert_eq!(parse_lsn("16/B374D848"), Some(0x16_B374_D848));
        assert_eq!(parse_lsn("x"), None);
    }

    #[test]
    fn ss_bytes_sent() {
        let out = "0 0 127.0.0.1:30001 127.0.0.1:41234\n\t cubic wscale:7,7 rto:204 \
                   bytes_sent:123456 bytes_acked:123457 bytes_received:999 segs_out:10\n";
        assert_eq!(parse_bytes_sent(out), Some(123_456));
        assert_eq!(parse_bytes_sent("no such socket"), None);
    }
}
