//! `herd bench sharding`: reference 003's table (`A New Approach to Sharding for Distributed
//! PostgreSQL`) on this machine. Point selects by key (simple and prepared) and a bulk read (one
//! key's 200 rows) against one PostgreSQL server, Herd with 1, 2 and 4 shard groups, and the
//! article's baseline — a hash-partitioned table whose partitions are postgres_fdw foreign tables
//! on 2 nodes, built here — every node held to the same CPU quota so that it behaves like a
//! separate small machine, as in `read-scaling`. Also reported: server connections per node.
//! Sharding II's workloads across groups (`sharding_mix.rs`): a merged aggregate and ordered
//! read, and transfers with 0, 10 and 50 % of them across groups (two-phase commit).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use indicatif::ProgressBar;

use crate::cgroup::{CgroupError, CpuLimits};
use crate::cluster::{ScratchCluster, UrlParts};
use crate::pgbench::{median, Pgbench};
use crate::process::write_script;
use crate::report::{Machine, ModeResult, Results, Settings, TargetResult};
use crate::{BenchError, BenchOptions};

/// Each node's CPU quota: 1 ms per 10 ms period, 0.1 CPU; 4 busy nodes take 0.4 of the 2 cores,
/// which leaves the front group (Herd's proxies, pgbench, this harness) its 1 CPU. At 0.2 CPU
/// per node the front group, not the nodes, limited 4 groups in prepared mode (5,087 tps against
/// 2,443 for 1 group on 2026-11-25), which measures the harness rather than the sharding.
const QUOTA_US: u64 = 1_000;
const PERIOD_US: u64 = super::read_scaling::PERIOD_US;
const FRONT_QUOTA_US: u64 = super::read_scaling::FRONT_QUOTA_US;
/// Client connections and pgbench threads of every target (the FDW baseline splits them over
/// its two nodes, as an application spread over both would).
const CLIENTS: u32 = 16;
const THREADS: u32 = 2;
/// Rows of `events` per customer: the bulk read's result size.
const EVENTS_PER_CUSTOMER: u32 = 200;
/// The baseline target of the ratios.
pub(super) const ONE_SERVER: &str = "1 server";
/// The FDW baseline's target.
pub(super) const FDW: &str = "FDW 2 nodes";

/// The target name of Herd with `n` groups.
pub(super) fn herd_target(n: u32) -> String {
    match n {
        1 => "Herd 1 group".into(),
        _ => format!("Herd {n} groups"),
    }
}

/// The workloads (report rows): name, pgbench protocol, script.
const POINT_SIMPLE: &str = "point select, simple";
const POINT_PREPARED: &str = "point select, prepared";
const BULK: &str = "bulk read (200 rows), prepared";

/// The run's shape.
pub(super) struct Plan {
    pub(super) groups: Vec<u32>,
    rounds: u32,
    duration: u64,
    /// pgbench_accounts-style rows: scale × 100 000.
    pub(super) rows: u32,
    /// Customers of `events`.
    pub(super) customers: u32,
}

impl Plan {
    fn new(opts: &BenchOptions) -> Plan {
        let (groups, rounds, duration, scale) = match opts.quick {
            // 4 s: under the CPU quotas the FDW target's new backends open their remote
            // connections first; 2 s once ended with no transaction at all on a busy machine.
            true => (vec![1, 2], 1, 4, 1),
            false => (vec![1, 2, 4], 3, 8, 5),
        };
        let scale = opts.scale.unwrap_or(scale).max(1);
        Plan {
            groups,
            rounds,
            duration: opts.duration.unwrap_or(duration).max(1),
            rows: scale * 100_000,
            customers: scale * 200,
        }
    }
}

/// One measured target: where pgbench connects (several URLs share the clients) and the nodes
/// whose connections are counted.
struct Target {
    name: String,
    urls: Vec<String>,
    /// (node, URL) of every server behind the target.
    nodes: Vec<(String, String)>,
}

/// A URL on the same server for another database.
fn with_database(url: &str, db: &str) -> Result<String, BenchError> {
    let p = UrlParts::parse(url)
        .ok_or_else(|| BenchError::Missing(format!("cannot read the server URL {url}")))?;
    Ok(format!(
        "postgresql://{}:{}@{}:{}/{db}",
        p.user, p.password, p.host, p.port
    ))
}

/// Writes the data set as CSV files: `accounts.csv` and `events.csv`.
fn write_data(dir: &Path, plan: &Plan) -> Result<(), BenchError> {
    use std::fmt::Write as _;
    let mut accounts = String::with_capacity(plan.rows as usize * 16);
    for aid in 1..=plan.rows {
        let _ = writeln!(accounts, "{aid},{},0,", (aid - 1) / 100_000 + 1);
    }
    write_script(dir, "accounts.csv", &accounts)?;
    let mut events = String::new();
    for cid in 1..=plan.customers {
        for seq in 1..=EVENTS_PER_CUSTOMER {
            let _ = writeln!(events, "{cid},{seq},event {seq} of customer {cid}");
        }
    }
    write_script(dir, "events.csv", &events)?;
    Ok(())
}

const ACCOUNTS: &str =
    "create table accounts (aid int primary key, bid int, abalance int, filler char(84))";
const EVENTS: &str = "create table events (cid int, seq int, payload text, primary key (cid, seq))";

/// Loads the data set through `url` (a server, or Herd's endpoint, which splits the COPY by key).
fn load(
    cluster: &ScratchCluster,
    url: &str,
    dir: &Path,
    distribute: bool,
) -> Result<(), BenchError> {
    let mut sql = vec![ACCOUNTS.to_string(), EVENTS.to_string()];
    if distribute {
        sql.push("select herd.create_distributed_table('accounts', 'aid')".into());
        sql.push("select herd.create_distributed_table('events', 'cid')".into());
    }
    for t in ["accounts", "events"] {
        sql.push(format!(
            "\\copy {t} from '{}' with (format csv)",
            dir.join(format!("{t}.csv")).display()
        ));
    }
    let refs: Vec<&str> = sql.iter().map(String::as_str).collect();
    cluster.psql(url, &refs).map(drop)
}

/// The article's baseline on two servers (`urls`, database `fdw`): on each, `accounts` and
/// `events` partitioned by hash of the key into 2 partitions, its own remainder local and the
/// other a postgres_fdw foreign table on the other server; each loads its own rows.
fn build_fdw(
    cluster: &ScratchCluster,
    urls: &[String],
    plan: &Plan,
) -> Result<Vec<String>, BenchError> {
    let mut fdw_urls = Vec::new();
    for url in urls {
        cluster.psql(url, &["create database fdw"])?;
        fdw_urls.push(with_database(url, "fdw")?);
    }
    // Every node's own partitions and rows first, then the foreign partitions (analysed
    // remotely, so the other node's rows must be there).
    for (x, url) in fdw_urls.iter().enumerate() {
        let y = 1 - x;
        let other = UrlParts::parse(&fdw_urls[y])
            .ok_or_else(|| BenchError::Missing("cannot read the other node's URL".into()))?;
        let lit = |s: &str| s.replace('\'', "''");
        let sql = [
            "create extension postgres_fdw".to_string(),
            format!(
                "create server other foreign data wrapper postgres_fdw options (host '{}', port '{}', dbname 'fdw')",
                lit(&other.host),
                other.port
            ),
            format!(
                "create user mapping for current_user server other options (user '{}', password '{}')",
                lit(&other.user),
                lit(&other.password)
            ),
            "create table accounts (aid int, bid int, abalance int, filler char(84)) partition by hash (aid)".into(),
            format!("create table accounts_{x} partition of accounts (primary key (aid)) for values with (modulus 2, remainder {x})"),
            "create table events (cid int, seq int, payload text) partition by hash (cid)".into(),
            format!("create table events_{x} partition of events (primary key (cid, seq)) for values with (modulus 2, remainder {x})"),
            format!(
                "insert into accounts_{x} select g, (g - 1) / 100000 + 1, 0, '' from generate_series(1, {}) g \
                 where satisfies_hash_partition('accounts'::regclass, 2, {x}, g)",
                plan.rows
            ),
            format!(
                "insert into events_{x} select c, s, 'event ' || s || ' of customer ' || c \
                 from generate_series(1, {}) c, generate_series(1, {EVENTS_PER_CUSTOMER}) s \
                 where satisfies_hash_partition('events'::regclass, 2, {x}, c)",
                plan.customers
            ),
            format!("vacuum analyze accounts_{x}, events_{x}"),
        ];
        let refs: Vec<&str> = sql.iter().map(String::as_str).collect();
        cluster.psql(url, &refs)?;
    }
    for (x, url) in fdw_urls.iter().enumerate() {
        let y = 1 - x;
        let sql = [
            format!("create foreign table accounts_{y} partition of accounts for values with (modulus 2, remainder {y}) server other options (table_name 'accounts_{y}')"),
            format!("create foreign table events_{y} partition of events for values with (modulus 2, remainder {y}) server other options (table_name 'events_{y}')"),
            "analyze accounts, events".into(),
        ];
        let refs: Vec<&str> = sql.iter().map(String::as_str).collect();
        cluster.psql(url, &refs)?;
    }
    Ok(fdw_urls)
}

/// A node: name, postmaster pid, URL.
type Node = (String, u32, String);

/// Every node's name, postmaster pid and URL (`herd url --group G --primary`), and the
/// supervisor's pid, of a cluster whose groups have no replicas.
fn nodes(cluster: &ScratchCluster, groups: u32) -> Result<(u32, Vec<Node>), BenchError> {
    let text = cluster.herd_ok(&["status", "--json"])?;
    let bad = |text: &str| BenchError::Parse {
        what: "herd status --json (every group's primary with its pid)".into(),
        output: text.to_string(),
    };
    let status: serde_json::Value = serde_json::from_str(&text).map_err(|_| bad(&text))?;
    let supervisor = status["supervisor"]["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .ok_or_else(|| bad(&text))?;
    let mut out = Vec::new();
    for g in 0..groups {
        let group = if g == 0 {
            &status
        } else {
            status["groups"]
                .as_array()
                .and_then(|a| a.iter().find(|s| s["group"] == g))
                .ok_or_else(|| bad(&text))?
        };
        let node = &group["nodes"][0];
        let name = node["name"].as_str().ok_or_else(|| bad(&text))?.to_string();
        let pid = node["pid"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .ok_or_else(|| bad(&text))?;
        let url = cluster
            .herd_ok(&["url", "--group", &g.to_string(), "--primary"])?
            .trim()
            .to_string();
        out.push((name, pid, url));
    }
    Ok((supervisor, out))
}

/// Client backends on each node right now (the counting session excluded).
fn connections(cluster: &ScratchCluster, nodes: &[(String, String)]) -> BTreeMap<String, u64> {
    nodes
        .iter()
        .filter_map(|(name, url)| {
            let n = cluster
                .psql(
                    url,
                    &["select count(*) - 1 from pg_stat_activity where backend_type = 'client backend'"],
                )
                .ok()?;
            Some((name.clone(), n.trim().parse().ok()?))
        })
        .collect()
}

/// Runs the scenario; the figures for the report.
pub fn run(opts: &BenchOptions, bar: &ProgressBar) -> Result<Results, BenchError> {
    let plan = Plan::new(opts);
    let pgbench = Pgbench::locate()?;
    let mut notes = Vec::new();
    let mut workloads: Vec<(String, &str, String)> = vec![
        (
            POINT_SIMPLE.into(),
            "simple",
            format!(
                "\\set aid random(1, {})\nselect abalance from accounts where aid = :aid;\n",
                plan.rows
            ),
        ),
        (
            POINT_PREPARED.into(),
            "prepared",
            format!(
                "\\set aid random(1, {})\nselect abalance from accounts where aid = :aid;\n",
                plan.rows
            ),
        ),
        (
            BULK.into(),
            "prepared",
            format!(
                "\\set cid random(1, {})\nselect * from events where cid = :cid;\n",
                plan.customers
            ),
        ),
    ];
    workloads.extend(super::sharding_mix::workloads(plan.rows));
    // Reference 003's workloads run on every target; those across groups not on the FDW one.
    let runs_on = |t: &Target, k: usize| t.name != FDW || k < super::sharding_mix::FIRST;

    // The clusters: one per group count (groups without replicas: a shard group's primary is
    // the node that serves its reads); group 0 of the 1-group cluster is also the 1-server
    // baseline, and the 2-group cluster's primaries carry the FDW baseline in their own database.
    let mut clusters: Vec<(u32, ScratchCluster)> = Vec::new();
    for &n in &plan.groups {
        bar.set_message(format!("{}: starting a scratch cluster", herd_target(n)));
        let shards = n.to_string();
        let c = ScratchCluster::start_with(opts, &["--shards", &shards, "--replicas", "0"])?;
        clusters.push((n, c));
    }
    let dir = clusters[0].1.dir().to_path_buf();
    bar.set_message(format!(
        "writing {} accounts and {} events",
        plan.rows,
        plan.customers * EVENTS_PER_CUSTOMER
    ));
    write_data(&dir, &plan)?;
    let mut targets: Vec<Target> = Vec::new();
    let mut front = vec![std::process::id()];
    let mut confine: Vec<(String, u32)> = Vec::new();
    for (n, c) in &clusters {
        let (supervisor, nodes) = nodes(c, *n)?;
        front.push(supervisor);
        for (name, pid, _) in &nodes {
            confine.push((format!("{n}g-{name}"), *pid));
        }
        bar.set_message(format!("{}: loading through the endpoint", herd_target(*n)));
        let node_list: Vec<(String, String)> = nodes
            .iter()
            .map(|(name, _, url)| (name.clone(), url.clone()))
            .collect();
        load(c, &c.proxy_url, &dir, *n > 1)?;
        let primaries: Vec<String> = nodes.iter().map(|(_, _, u)| u.clone()).collect();
        super::sharding_mix::load_partners(c, &primaries, &c.proxy_url, &dir)?;
        for (_, _, url) in &nodes {
            c.psql(url, &["vacuum analyze", "checkpoint"])?;
        }
        if *n == 1 {
            targets.push(Target {
                name: ONE_SERVER.into(),
                urls: vec![nodes[0].2.clone()],
                nodes: node_list.clone(),
            });
        }
        targets.push(Target {
            name: herd_target(*n),
            urls: vec![c.proxy_url.clone()],
            nodes: node_list.clone(),
        });
        if *n == 2 {
            bar.set_message("building the postgres_fdw baseline on 2 nodes");
            let urls: Vec<String> = nodes.iter().map(|(_, _, u)| u.clone()).collect();
            let fdw_urls = build_fdw(c, &urls, &plan)?;
            targets.push(Target {
                name: FDW.into(),
                nodes: node_list
                    .iter()
                    .zip(&fdw_urls)
                    .map(|((name, _), u)| (name.clone(), u.clone()))
                    .collect(),
                urls: fdw_urls,
            });
        }
    }
    // Baseline first, then Herd by group count, then the FDW baseline.
    targets.sort_by_key(|t| match t.name.as_str() {
        ONE_SERVER => 0,
        FDW => 100,
        other => other
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(50),
    });
    let mut scripts = Vec::new();
    for (k, (_, _, text)) in workloads.iter().enumerate() {
        scripts.push(write_script(&dir, &format!("workload-{k}.sql"), text)?);
    }
    let args_for = |k: usize, clients: u32, threads: u32, secs: u64| -> Vec<String> {
        let mut args: Vec<String> = format!(
            "-n -c {clients} -j {threads} -T {secs} -M {}",
            workloads[k].1
        )
        .split(' ')
        .map(String::from)
        .collect();
        args.extend(["-f".into(), scripts[k].display().to_string()]);
        args
    };
    let limit = |secs: u64| Duration::from_secs(secs + 120);
    // One run of workload `k` on target `t`: every URL gets its share of the clients at once.
    let run_target = |t: &Target, k: usize, secs: u64, counting: Option<&ScratchCluster>| {
        let share = CLIENTS / t.urls.len() as u32;
        let threads = (THREADS / t.urls.len() as u32).max(1);
        std::thread::scope(|s| {
            let handles: Vec<_> = t
                .urls
                .iter()
                .map(|url| {
                    let args = args_for(k, share, threads, secs);
                    let what = format!("pgbench ({}) on {}", workloads[k].0, t.name);
                    let pgbench = &pgbench;
                    s.spawn(move || pgbench.run(&what, &args, url, limit(secs)))
                })
                .collect();
            // Halfway through, the servers' connections are counted.
            let seen = counting.map(|c| {
                std::thread::sleep(Duration::from_millis(secs * 500));
                connections(c, &t.nodes)
            });
            let mut tps = 0.0;
            let mut failed = 0;
            for h in handles {
                let r = h
                    .join()
                    .map_err(|_| BenchError::Missing("a pgbench thread panicked".into()))??;
                tps += r.tps;
                failed += r.failed;
            }
            Ok::<_, BenchError>((tps, failed, seen))
        })
    };
    let cluster_of = |t: &Target| -> &ScratchCluster {
        let n = match t.name.as_str() {
            ONE_SERVER => 1,
            FDW => 2,
            other => other
                .split_whitespace()
                .nth(1)
                .and_then(|n| n.parse().ok())
                .unwrap_or(1),
        };
        clusters
            .iter()
            .find(|(g, _)| *g == n)
            .map(|(_, c)| c)
            .unwrap_or(&clusters[0].1)
    };
    // Warm-up before confinement: opens the proxies' pools and fills the caches.
    for t in &targets {
        for (k, w) in workloads.iter().enumerate().filter(|(k, _)| runs_on(t, *k)) {
            bar.set_message(format!("warm-up: {} on {}", w.0, t.name));
            run_target(t, k, 1, None)?;
        }
    }

    let mut limits = match CpuLimits::new(QUOTA_US, PERIOD_US, &opts.scratches) {
        Ok(l) => Some(l),
        Err(CgroupError::Run(e)) => return Err(e),
        Err(why) => {
            notes.push(format!(
                "**Nodes NOT confined**: {why}. Every server could use all cores, so the groups \
                 share the machine instead of behaving like separate machines and the ratios \
                 below do not show scaling."
            ));
            None
        }
    };
    if let Some(l) = limits.as_mut() {
        bar.set_message("confining each node's PostgreSQL");
        for (name, pid) in &confine {
            l.confine(name, *pid)?;
        }
        l.front("front", &front, FRONT_QUOTA_US)?;
        // Some kernels starve a throttled group outright (CFS bandwidth control seen leaving
        // runnable backends unscheduled for seconds): measure unconfined, and say so, rather
        // than report zero transactions.
        let urls: Vec<(String, String)> = targets
            .iter()
            .flat_map(|t| t.nodes.iter().cloned())
            .collect();
        if let Some(why) = starved(&dir, &urls)? {
            notes.push(format!(
                "**Nodes NOT confined**: under the CPU quotas {why}; this kernel's CPU bandwidth \
                 control starved the servers, so the quotas were lifted. Every server could use \
                 all cores: the groups share the machine and the ratios below do not show scaling."
            ));
            limits = None;
        }
    }

    let mut jobs = super::rotated_jobs(plan.rounds, targets.len(), workloads.len());
    jobs.retain(|(_, i, k)| runs_on(&targets[*i], *k));
    type Rates = BTreeMap<(usize, usize), (Vec<f64>, u64)>;
    type Seen = BTreeMap<String, BTreeMap<String, u64>>;
    // Every measured round, in the rotated order.
    let measure = || -> Result<(Rates, Seen), BenchError> {
        bar.set_length(jobs.len() as u64);
        bar.set_position(0);
        let mut tps: Rates = BTreeMap::new();
        let mut conns: Seen = BTreeMap::new();
        for &(round, i, k) in &jobs {
            let t = &targets[i];
            bar.set_message(format!(
                "round {}/{}: {} on {}",
                round + 1,
                plan.rounds,
                workloads[k].0,
                t.name
            ));
            let (rate, failed, seen) = run_target(t, k, plan.duration, Some(cluster_of(t)))?;
            let e = tps.entry((i, k)).or_default();
            e.0.push(rate);
            e.1 += failed;
            let per_node = conns.entry(t.name.clone()).or_default();
            for (node, n) in seen.unwrap_or_default() {
                let m = per_node.entry(node).or_insert(0);
                *m = (*m).max(n);
            }
            bar.inc(1);
        }
        Ok((tps, conns))
    };
    let (tps, conns, throttled_before, throttled_after) = loop {
        let before = throttling(limits.as_ref(), &confine);
        match measure() {
            Ok((tps, conns)) => {
                break (tps, conns, before, throttling(limits.as_ref(), &confine));
            }
            // The probe above passed, yet the kernel can still starve a confined server for
            // seconds in a measured round (pgbench then completes nothing and prints no
            // rate): lift the quotas and measure every round again, unconfined, so the
            // targets stay comparable.
            Err(BenchError::Parse { what, .. }) if limits.is_some() => {
                notes.push(format!(
                    "**Nodes NOT confined**: under the CPU quotas {what} completed no \
                     transaction in a measured round; this kernel's CPU bandwidth control \
                     starved the servers, so the quotas were lifted and every round was measured \
                     again. Every server could use all cores: the groups share the machine and \
                     the ratios below do not show scaling."
                ));
                limits = None;
            }
            Err(e) => return Err(e),
        }
    };
    let throttled: BTreeMap<String, f64> = throttled_after
        .iter()
        .map(|(name, (p1, t1))| {
            let (p0, t0) = throttled_before.get(name).copied().unwrap_or((0, 0));
            let periods = p1.saturating_sub(p0);
            let share = if periods > 0 {
                t1.saturating_sub(t0) as f64 / periods as f64
            } else {
                0.0
            };
            (name.clone(), share)
        })
        .collect();
    let confinement = limits
        .as_ref()
        .map(|_| limits_description(QUOTA_US, PERIOD_US));
    drop(limits);

    let mut modes = BTreeMap::new();
    for (k, (workload, _, _)) in workloads.iter().enumerate() {
        let base = tps.get(&(0, k)).and_then(|(r, _)| median(r)).unwrap_or(0.0);
        let mut per_target = ModeResult::new();
        for (i, t) in targets.iter().enumerate() {
            let Some((runs, failed)) = tps.get(&(i, k)) else {
                continue;
            };
            let m = median(runs).unwrap_or(0.0);
            per_target.insert(
                t.name.clone(),
                TargetResult {
                    runs: runs.clone(),
                    median_tps: m,
                    ratio_to_direct: if base > 0.0 { m / base } else { 0.0 },
                    failed_transactions: *failed,
                },
            );
        }
        modes.insert(workload.clone(), per_target);
    }
    notes.extend(super::sharding_report::explain(
        &plan,
        confinement,
        FRONT_QUOTA_US as f64 / PERIOD_US as f64,
        &conns,
        &throttled,
    ));
    drop(clusters);
    Ok(Results {
        scenario: "sharding".into(),
        date: crate::report::now_utc(),
        quick: opts.quick,
        machine: Machine::detect(),
        settings: Settings {
            command: format!(
                "pgbench -n -c {CLIENTS} -j {THREADS} -T {} -M simple|prepared -f WORKLOAD.sql URL \
                 (FDW: {} clients on each of its 2 nodes at once)",
                plan.duration,
                CLIENTS / 2
            ),
            rounds: plan.rounds,
            duration_s: plan.duration,
            scale: plan.rows / 100_000,
            modes: workloads.iter().map(|w| w.0.clone()).collect(),
            targets: targets.iter().map(|t| t.name.clone()).collect(),
            versions: [("herd".to_string(), env!("CARGO_PKG_VERSION").to_string())].into(),
        },
        modes,
        published: super::sharding_report::published(),
        notes,
        connections: conns,
        ..Default::default()
    })
}

/// `(periods, throttled periods)` so far of the front group and of every node's group.
/// The first confined node that cannot keep 4 clients' `select 1` going — fewer than
/// [`MIN_PROBE_TRANSACTIONS`] in 2 s, where a healthy kernel gives a 0.1-CPU node hundreds —
/// described; `None` when every one can.
fn starved(
    dir: &std::path::Path,
    nodes: &[(String, String)],
) -> Result<Option<String>, BenchError> {
    let pgbench = crate::pgbench::Pgbench::locate()?;
    let script = write_script(dir, "probe.sql", "select 1;\n")?;
    let args: Vec<String> = ["-n", "-c", "4", "-j", "1", "-T", "2", "-f"]
        .iter()
        .map(|a| a.to_string())
        .chain([script.display().to_string()])
        .collect();
    for (name, url) in nodes {
        let what = format!("select 1 on {name} under its CPU quota");
        let done = pgbench
            .run(&what, &args, url, std::time::Duration::from_secs(60))
            .map_or(0, |r| r.transactions);
        if done < MIN_PROBE_TRANSACTIONS {
            return Ok(Some(format!(
                "node {name} completed {done} `select 1` in 2 s with 4 clients"
            )));
        }
    }
    Ok(None)
}

/// Transactions a confined node must complete in the 2 s probe.
const MIN_PROBE_TRANSACTIONS: u64 = 50;

fn throttling(limits: Option<&CpuLimits>, nodes: &[(String, u32)]) -> BTreeMap<String, (u64, u64)> {
    let Some(l) = limits else {
        return BTreeMap::new();
    };
    std::iter::once("front")
        .chain(nodes.iter().map(|(n, _)| n.as_str()))
        .filter_map(|g| Some((g.to_string(), l.throttling(g)?)))
        .collect()
}

fn limits_description(quota: u64, period: u64) -> String {
    format!(
        "{:.2} CPU per node ({quota} µs per {period} µs)",
        quota as f64 / period as f64
    )
}
