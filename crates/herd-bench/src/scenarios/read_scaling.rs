//! `herd bench read-scaling`: queries per second of time-series reads through Herd's proxy on
//! clusters of 1, 3 and 5 nodes, each node's PostgreSQL held to a fixed CPU share so that it
//! behaves like a separate small machine (reference 000, read table).
//!
//! The data set is commit-modes' (`--scale` = devices). Each query type runs on its own (one
//! query per pgbench transaction, so qps = tps), and all of them together as a mix; rounds
//! interleave the clusters and query types so machine noise spreads over all of them.

use std::collections::BTreeMap;
use std::time::Duration;

use indicatif::ProgressBar;

use super::dataset::{load, METRICS, T0};
use crate::cgroup::{CgroupError, CpuLimits};
use crate::cluster::{url_with_options, ScratchCluster};
use crate::pgbench::{median, Pgbench};
use crate::process::write_script;
use crate::report::{Machine, ModeResult, ReadScaling, Results, Settings, TargetResult};
use crate::{BenchError, BenchOptions};

/// Every node serves reads, the primary included (the article's clusters read on all nodes).
const HERD_TOML: &str = "[proxy]\nread_from_primary = true\n";
/// Client connections and pgbench threads: 8 clients as in the article. More clients put more
/// backends under one node's quota, which penalises the 1-node baseline (backends throttled
/// while holding locks) and made the speedups superlinear in a 16-client run.
const CLIENTS: u32 = 8;
const THREADS: u32 = 2;
/// Each node's CPU quota: 1.5 ms per 10 ms period, 0.15 CPU. Five nodes take 0.75 of the 2
/// cores at most (and only the 4 read nodes are busy), which leaves the rest to Herd's proxy
/// and pgbench. The short period keeps throttling pauses short for millisecond queries.
const QUOTA_US: u64 = 1_500;
pub(super) const PERIOD_US: u64 = 10_000;
/// The quota of the "front" group (every Herd supervisor with its proxy, this process and
/// pgbench): one CPU, so together with the nodes the run cannot take more than ~1.75 cores of
/// a shared machine, and is not starved by other work on it either (see `CpuLimits`).
pub(super) const FRONT_QUOTA_US: u64 = 10_000;
/// The baseline mode's node count.
pub(super) const BASE: u32 = 1;
/// The target holding every query type at once.
const MIX: &str = "mix";

/// The run's shape: full or quick.
pub(super) struct Plan {
    nodes: Vec<u32>,
    rounds: u32,
    duration: u64,
    pub(super) devices: u32,
    pub(super) points: u32,
    warmup: u64,
}

impl Plan {
    fn new(opts: &BenchOptions) -> Plan {
        // Full: 1000 devices × 2 hours of readings (720 000 rows); quick: 50 × 1 hour.
        let (nodes, rounds, duration, devices, points, warmup) = match opts.quick {
            true => (vec![1, 3], 1, 2, 50, 360, 2),
            false => (vec![1, 3, 5], 3, 6, 1000, 720, 2),
        };
        Plan {
            nodes,
            rounds,
            duration: opts.duration.unwrap_or(duration).max(1),
            devices: opts.scale.unwrap_or(devices).max(8),
            points,
            warmup,
        }
    }
}

/// The name of the mode with `n` nodes.
pub(super) fn mode(n: u32) -> String {
    match n {
        1 => "1 node".into(),
        _ => format!("{n} nodes"),
    }
}

/// The read queries, modelled on the time-series queries the article's read table used
/// (its stored text names none): name → pgbench script of one query.
fn queries(devices: u32, points: u32) -> Vec<(&'static str, String)> {
    let first = T0 - u64::from(points) * 10;
    let span = u64::from(points) * 10;
    // A random window of `secs` inside the loaded readings, as `:t`.
    let window = |secs: u64| {
        let secs = secs.min(span);
        format!("\\set t random({first}, {})\n", first + span - secs)
    };
    let all_max: Vec<String> = METRICS
        .split_whitespace()
        .map(|m| format!("max({m})"))
        .collect();
    let all_avg: Vec<String> = METRICS
        .split_whitespace()
        .map(|m| format!("avg({m})"))
        .collect();
    let hosts: Vec<String> = (0..8).map(|k| format!("'host_' || (:h + {k})")).collect();
    vec![
        (
            "lastpoint",
            format!(
                "\\set h random(0, {})\n\
                 select * from cpu where hostname = 'host_' || :h order by time desc limit 1;\n",
                devices - 1
            ),
        ),
        (
            "max-1h-8-hosts",
            format!(
                "\\set h random(0, {})\n{}\
                 select date_trunc('minute', time) m, {} from cpu \
                 where hostname in ({}) and time >= to_timestamp(:t) \
                 and time < to_timestamp(:t + 3600) group by m order by m;\n",
                devices - 8,
                window(3600),
                all_max.join(", "),
                hosts.join(", ")
            ),
        ),
        (
            "high-cpu-10m",
            format!(
                "{}select hostname, count(*), max(usage_user) from cpu where usage_user > 90 \
                 and time >= to_timestamp(:t) and time < to_timestamp(:t + 600) \
                 group by hostname order by 3 desc limit 10;\n",
                window(600)
            ),
        ),
        (
            "avg-5m-all-hosts",
            format!(
                "{}select hostname, {} from cpu where time >= to_timestamp(:t) \
                 and time < to_timestamp(:t + 300) group by hostname order by 2 desc limit 10;\n",
                window(300),
                all_avg.join(", ")
            ),
        ),
    ]
}

/// One cluster under test.
struct Config {
    nodes: u32,
    cluster: ScratchCluster,
    /// The proxy's URL asking for `eventual` consistency (reads to any healthy replica).
    url: String,
    /// Node names, primary first.
    names: Vec<String>,
}

/// Runs the scenario; the figures for the report.
pub fn run(opts: &BenchOptions, bar: &ProgressBar) -> Result<Results, BenchError> {
    let plan = Plan::new(opts);
    let pgbench = Pgbench::locate()?;
    let mut notes = Vec::new();
    let queries = queries(plan.devices, plan.points);
    let mut targets: Vec<&str> = vec![MIX];
    targets.extend(queries.iter().map(|(name, _)| *name));

    let mut configs = Vec::new();
    for &n in &plan.nodes {
        bar.set_message(format!("{}: starting a scratch cluster", mode(n)));
        let replicas = (n - 1).to_string();
        let cluster =
            ScratchCluster::start_with_config(opts, &["--replicas", &replicas], HERD_TOML)?;
        bar.set_message(format!(
            "{}: loading {} devices × {} readings",
            mode(n),
            plan.devices,
            plan.points
        ));
        load(&cluster, plan.devices, plan.points)?;
        if !cluster.settle()? {
            notes.push(format!(
                "{}: replicas still > 1 MiB behind 60 s after the load.",
                mode(n)
            ));
        }
        let url = url_with_options(&cluster.proxy_url, "-c herd.consistency=eventual");
        let names = status(&cluster)?
            .1
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        configs.push(Config {
            nodes: n,
            cluster,
            url,
            names,
        });
    }
    let dir = configs
        .first()
        .map(|c| c.cluster.dir().to_path_buf())
        .ok_or_else(|| BenchError::Missing("no cluster configuration to run".into()))?;
    let mut scripts = Vec::new();
    for (name, text) in &queries {
        scripts.push(write_script(&dir, &format!("{name}.sql"), text)?);
    }
    // The mix, as the script set pgbench picks from at random (equal weights).
    let mix: Vec<String> = scripts
        .iter()
        .flat_map(|p| ["-f".to_string(), p.display().to_string()])
        .collect();
    let args_for = |target: &str, secs: u64| -> Vec<String> {
        let mut args: Vec<String> = format!("-n -c {CLIENTS} -j {THREADS} -T {secs}")
            .split(' ')
            .map(String::from)
            .collect();
        match targets.iter().position(|t| *t == target) {
            Some(k) if k > 0 => args.extend(["-f".into(), scripts[k - 1].display().to_string()]),
            _ => args.extend(mix.iter().cloned()),
        }
        args
    };
    let limit = |secs: u64| Duration::from_secs(secs + 120);
    // Before confinement: this also opens the proxy's pooled server connections, whose logins
    // would otherwise compete with running queries for a node's small quota (and could miss the
    // proxy's 5 s login timeout).
    if plan.warmup > 0 {
        for c in &configs {
            bar.set_message(format!("{}: warm-up", mode(c.nodes)));
            // Only its side effects count: run_raw, as a short run may print no rate.
            pgbench.run_raw(
                "warm-up",
                &args_for(MIX, plan.warmup),
                &c.url,
                limit(plan.warmup),
            )?;
        }
    }

    // Declared after the clusters, so dropped first: processes go home, then groups go.
    let mut limits = match CpuLimits::new(QUOTA_US, PERIOD_US, &opts.scratches) {
        Ok(l) => Some(l),
        Err(CgroupError::Run(e)) => return Err(e),
        Err(why) => {
            notes.push(format!(
                "**Nodes NOT confined**: {why}. Every PostgreSQL server could use all cores, so \
                 the nodes share the machine instead of behaving like separate machines and the \
                 speedups below do not show read scaling."
            ));
            None
        }
    };
    if let Some(l) = limits.as_mut() {
        let mut front = vec![std::process::id()];
        for c in &configs {
            bar.set_message(format!(
                "{}: confining each node's PostgreSQL",
                mode(c.nodes)
            ));
            let (supervisor, nodes) = status(&c.cluster)?;
            front.push(supervisor);
            for (name, pid) in nodes {
                l.confine(&group(c.nodes, &name), pid)?;
            }
        }
        l.front("front", &front, FRONT_QUOTA_US)?;
    }
    // Rotate both orders every round so no cluster or query always runs first or last.
    let jobs: Vec<_> = super::rotated_jobs(plan.rounds, configs.len(), targets.len())
        .into_iter()
        .map(|(round, i, k)| (round, i, targets[k]))
        .collect();
    bar.set_length(jobs.len() as u64);
    bar.set_position(0);
    let routed_before: Vec<_> = configs.iter().map(|c| routed(&c.cluster)).collect();
    let throttled_before = throttling(limits.as_ref(), &configs);
    let mut qps: BTreeMap<(u32, &str), (Vec<f64>, u64)> = BTreeMap::new();
    for (round, i, target) in jobs {
        let c = &configs[i];
        bar.set_message(format!(
            "round {}/{}: {target} on {}",
            round + 1,
            plan.rounds,
            mode(c.nodes)
        ));
        let what = format!("pgbench ({target}) on {}", mode(c.nodes));
        let r = pgbench.run(
            &what,
            &args_for(target, plan.duration),
            &c.url,
            limit(plan.duration),
        )?;
        let e = qps.entry((c.nodes, target)).or_default();
        e.0.push(r.tps);
        e.1 += r.failed;
        bar.inc(1);
    }
    let throttled_after = throttling(limits.as_ref(), &configs);

    let mut section = ReadScaling {
        confined: limits.is_some(),
        confinement: limits.as_ref().map_or_else(
            || "none: cgroup CPU quotas are not available here (see notes)".into(),
            CpuLimits::describe,
        ),
        cpu_per_node: limits.as_ref().map_or(0.0, CpuLimits::cpus),
        routed: BTreeMap::new(),
        serving_nodes: BTreeMap::new(),
        throttled_share: BTreeMap::new(),
    };
    for (k, c) in configs.iter().enumerate() {
        let after = routed(&c.cluster);
        let per_node: BTreeMap<String, u64> = c
            .names
            .iter()
            .map(|n| {
                let was = routed_before[k].get(n).copied().unwrap_or(0);
                (
                    n.clone(),
                    after.get(n).copied().unwrap_or(0).saturating_sub(was),
                )
            })
            .collect();
        let total: u64 = per_node.values().sum();
        let serving = per_node
            .values()
            .filter(|&&v| total > 0 && v * 20 >= total)
            .count() as u32;
        section.serving_nodes.insert(mode(c.nodes), serving);
        section.routed.insert(mode(c.nodes), per_node);
        let shares: BTreeMap<String, f64> = c
            .names
            .iter()
            .filter_map(|n| {
                let key = group(c.nodes, n);
                let (p0, t0) = throttled_before.get(&key).copied().unwrap_or((0, 0));
                let (p1, t1) = throttled_after.get(&key).copied()?;
                let periods = p1.saturating_sub(p0);
                Some((
                    n.clone(),
                    if periods > 0 {
                        t1.saturating_sub(t0) as f64 / periods as f64
                    } else {
                        0.0
                    },
                ))
            })
            .collect();
        if !shares.is_empty() {
            section.throttled_share.insert(mode(c.nodes), shares);
        }
    }
    drop(limits);
    drop(configs);

    let mut modes = BTreeMap::new();
    for &n in &plan.nodes {
        let mut per_target = ModeResult::new();
        for &t in &targets {
            let Some((runs, failed)) = qps.get(&(n, t)) else {
                continue;
            };
            let m = median(runs).unwrap_or(0.0);
            let base = qps
                .get(&(BASE, t))
                .and_then(|(r, _)| median(r))
                .unwrap_or(0.0);
            per_target.insert(
                t.to_string(),
                TargetResult {
                    runs: runs.clone(),
                    median_tps: m,
                    ratio_to_direct: if base > 0.0 { m / base } else { 0.0 },
                    failed_transactions: *failed,
                },
            );
        }
        modes.insert(mode(n), per_target);
    }
    notes.extend(super::read_scaling_report::explain(&section, &plan));
    Ok(Results {
        scenario: "read-scaling".into(),
        date: crate::report::now_utc(),
        quick: opts.quick,
        machine: Machine::detect(),
        settings: Settings {
            command: format!(
                "pgbench -n -c {CLIENTS} -j {THREADS} -T {} -f QUERY.sql (mix: every -f) \
                 'PROXY_URL?options=-c herd.consistency=eventual'",
                plan.duration
            ),
            rounds: plan.rounds,
            duration_s: plan.duration,
            scale: plan.devices,
            modes: plan.nodes.iter().map(|&n| mode(n)).collect(),
            targets: targets.iter().map(|t| t.to_string()).collect(),
            versions: [("herd".to_string(), env!("CARGO_PKG_VERSION").to_string())].into(),
        },
        modes,
        published: super::read_scaling_report::published(),
        notes,
        failover: BTreeMap::new(),
        read_scaling: Some(section),
        ..Default::default()
    })
}

/// The cgroup of node `name` in the cluster with `nodes` nodes.
fn group(nodes: u32, name: &str) -> String {
    format!("{nodes}n-{name}")
}

/// The supervisor's pid (it runs the proxy) and each node's name and postmaster pid, from
/// `herd status --json`.
fn status(cluster: &ScratchCluster) -> Result<(u32, Vec<(String, u32)>), BenchError> {
    let text = cluster.herd_ok(&["status", "--json"])?;
    let status: serde_json::Value = serde_json::from_str(&text).map_err(|_| BenchError::Parse {
        what: "herd status --json".into(),
        output: text.clone(),
    })?;
    let nodes = status["nodes"].as_array().cloned().unwrap_or_default();
    let found: Vec<(String, u32)> = nodes
        .iter()
        .filter_map(|n| {
            let pid = u32::try_from(n["pid"].as_u64()?).ok()?;
            Some((n["name"].as_str()?.to_string(), pid))
        })
        .collect();
    let supervisor = status["supervisor"]["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok());
    match supervisor {
        Some(pid) if !found.is_empty() && found.len() == nodes.len() => Ok((pid, found)),
        _ => Err(BenchError::Parse {
            what: "herd status --json (the supervisor's pid, a name and pid for every node)".into(),
            output: text,
        }),
    }
}

/// Statements Herd's proxy routed to each node so far (`herd_routed_total`, every reason).
fn routed(cluster: &ScratchCluster) -> BTreeMap<String, u64> {
    let mut per_node = BTreeMap::new();
    for (key, v) in cluster.metrics(&["herd_routed_total{"]) {
        let node = key
            .split("node=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next());
        if let Some(node) = node {
            *per_node.entry(node.to_string()).or_insert(0) += v as u64;
        }
    }
    per_node
}

/// `(periods, throttled periods)` of every node's group so far.
fn throttling(limits: Option<&CpuLimits>, configs: &[Config]) -> BTreeMap<String, (u64, u64)> {
    let Some(l) = limits else {
        return BTreeMap::new();
    };
    configs
        .iter()
        .flat_map(|c| c.names.iter().map(move |n| group(c.nodes, n)))
        .filter_map(|g| Some((g.clone(), l.throttling(&g)?)))
        .collect()
}
