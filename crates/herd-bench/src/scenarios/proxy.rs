//! `herd bench proxy`: read-only pgbench (`-S`) straight to the primary, through Herd's proxy
//! and, when installed, through PgBouncer; simple, extended and prepared protocol, a connection per
//! transaction (`-C`, where a pooler's value shows) and many clients (1,000; direct refuses
//! beyond `max_connections`); interleaved rounds. Each proxy's CPU time and context switches per
//! transaction, and its memory, are read from `/proc` around every run.

use std::collections::BTreeMap;
use std::time::Duration;

use indicatif::ProgressBar;

use crate::cluster::{url_with_options, ScratchCluster, UrlParts};
use crate::forwarder::{Forwarder, Upstream};
use crate::pgbench::{median, Pgbench};
use crate::pgbouncer::{Installed, PgBouncer};
use crate::procstat;
use crate::report::{Machine, ModeResult, ProcessCost, Results, Settings, TargetResult};
use crate::{BenchError, BenchOptions};

use super::proxy_apart::{self, is_apart, APART_FEW, APART_MANY, APART_TARGETS};
use super::proxy_derived::{against_the_floor, generator_share};
use super::proxy_login::{self, LOGIN_ITERATIONS, LOGIN_ROLE};
use super::proxy_targets::{self, ModeNames, Targets};
use crate::affinity::{AffinityError, Apart};

/// Query modes measured, in order: pgbench's protocols, the two pooler shapes, then 16 and many
/// clients again with the load generator apart (last: the pinning is undone once, after them).
const MODES: [&str; 7] = [
    "simple", "extended", "prepared", CONNECT, MANY, APART_FEW, APART_MANY,
];
/// The modes of a run with `--generator-apart`: pgbench's protocols and the pooler shapes, all
/// apart (the two shapes apart of the default run would repeat `simple` and `many clients`).
const ALL_APART_MODES: [&str; 5] = ["simple", "extended", "prepared", CONNECT, MANY];
/// A new connection for every transaction (`pgbench -C`, simple protocol).
const CONNECT: &str = "connect per transaction (-C)";
/// Many client connections at once (`-c MANY_CLIENTS`, simple protocol).
const MANY: &str = "many clients";
/// Targets of the pooler shapes (the replica and Herd's default routing add nothing there).
const POOLER_TARGETS: [&str; 4] = ["direct", "herd-primary", "forwarder", "pgbouncer"];
/// Client connections and pgbench threads, as in the reference measurements.
const CLIENTS: u32 = 16;
const THREADS: u32 = 2;
/// Herd's default `proxy.pool_size`; PgBouncer gets the same pool.
const POOL_SIZE: u32 = 10;

/// The run's shape: full or quick.
struct Plan {
    rounds: u32,
    duration: u64,
    scale: u32,
    warmup: u64,
    /// Clients of the many-clients shape.
    many: u32,
}

impl Plan {
    fn new(opts: &BenchOptions) -> Plan {
        let (rounds, duration, scale, warmup, many) = if opts.quick {
            (1, 2, 1, 0, 100)
        } else {
            (5, 10, 10, 3, 1000)
        };
        Plan {
            // More rounds narrow the medians on a noisy machine (`--iterations`).
            rounds: opts.iterations.unwrap_or(rounds).max(1),
            duration: opts.duration.unwrap_or(duration),
            scale: opts.scale.unwrap_or(scale).max(1),
            warmup,
            many,
        }
    }
}

/// Runs the scenario; the figures for the report.
pub fn run(opts: &BenchOptions, bar: &ProgressBar) -> Result<Results, BenchError> {
    let plan = Plan::new(opts);
    let mode_list: &[&str] = if opts.generator_apart {
        &ALL_APART_MODES
    } else {
        &MODES
    };
    // Whether a mode's runs keep the load generator apart.
    let runs_apart = |mode: &str| opts.generator_apart || is_apart(mode);
    let pgbench = Pgbench::locate()?;
    let bouncer_bin = Installed::find();
    let mut notes = Vec::new();

    bar.set_message("starting a scratch cluster (herd up)");
    let cluster = ScratchCluster::start(opts)?;
    bar.set_message(format!("pgbench -i -s {} on the primary", plan.scale));
    let init = vec![
        "-i".into(),
        "-q".into(),
        "-s".into(),
        plan.scale.to_string(),
    ];
    pgbench.run_raw(
        "pgbench -i",
        &init,
        &cluster.primary_url,
        Duration::from_secs(600),
    )?;

    // `herd-primary` isolates the proxy's own cost (same server as `direct` and PgBouncer);
    // `replica` shows what a hot standby costs for the same reads, which Herd's default routing
    // pays on top.
    let replica_url = cluster
        .herd_ok(&["url", "--replica", "1"])?
        .trim()
        .to_string();
    let mut targets = vec![
        ("direct".to_string(), cluster.primary_url.clone()),
        ("herd".to_string(), cluster.proxy_url.clone()),
        (
            "herd-primary".to_string(),
            url_with_options(&cluster.proxy_url, "-c herd.consistency=primary"),
        ),
        ("replica".to_string(), replica_url),
    ];
    // The floor of one extra hop: bytes copied both ways, nothing parsed, no pooling.
    let primary = UrlParts::parse(&cluster.primary_url)
        .ok_or_else(|| BenchError::Missing(format!("cannot parse {}", cluster.primary_url)))?;
    // PgBouncer and the forwarder reach the primary the way Herd's proxy does: by its Unix
    // socket when the cluster has one, so the comparison is of the proxies, not of the sockets.
    let socket_dir = cluster.socket_dir(primary.port);
    let upstream = match &socket_dir {
        Some(dir) => Upstream::Unix(herd_pg::socket_path(dir, primary.port)),
        None => Upstream::Tcp(std::net::SocketAddr::from(([127, 0, 0, 1], primary.port))),
    };
    // `-C` logs in as a role with a low-iteration verifier (why: proxy_login.rs).
    let login_verifier = proxy_login::create(&cluster, &cluster.primary_url, &primary.password)?;
    let forwarder = Forwarder::start(upstream)?;
    targets.push((
        "forwarder".to_string(),
        format!(
            "postgresql://{}:{}@127.0.0.1:{}/{}",
            primary.user, primary.password, forwarder.port, primary.dbname
        ),
    ));
    let mut versions = BTreeMap::new();
    versions.insert("herd".to_string(), env!("CARGO_PKG_VERSION").to_string());
    let mut bouncer = None;
    match &bouncer_bin {
        Some(installed) => {
            bar.set_message("starting pgbouncer");
            let b = PgBouncer::start(
                &opts.scratches,
                installed,
                cluster.dir(),
                &cluster.primary_url,
                socket_dir.as_deref(),
                POOL_SIZE,
                &[(LOGIN_ROLE, login_verifier.as_str())],
            )?;
            targets.push(("pgbouncer".to_string(), b.url.clone()));
            versions.insert("pgbouncer".to_string(), installed.version.clone());
            if !installed.supports_prepared() {
                notes.push(format!(
                    "PgBouncer {} cannot keep protocol-level prepared statements in transaction \
                     pooling (max_prepared_statements needs ≥ 1.21): not run in prepared mode.",
                    installed.version
                ));
            }
            bouncer = Some((b, installed.supports_prepared()));
        }
        None => notes.push("PgBouncer is not installed: not compared.".into()),
    }
    let runs_for = |mode: &str, target: &str| {
        let pooler_shape = mode == CONNECT || mode == MANY;
        !(target == "pgbouncer" && mode == "prepared" && !bouncer.as_ref().is_some_and(|b| b.1))
            && (!pooler_shape || POOLER_TARGETS.contains(&target))
            // The forwarder opens a server connection per client: nothing to learn at 1,000.
            && !(mode == MANY && target == "forwarder")
            && (!is_apart(mode) || APART_TARGETS.contains(&target))
    };
    // Whose /proc figures a target's runs are: Herd's supervisor (its proxy runs inside it),
    // PgBouncer, and this process for the forwarder (pgbench is a process of its own).
    let herd_pid = cluster.supervisor_pid()?;
    let pid_of = |target: &str| -> Option<u32> {
        match target {
            "herd" | "herd-primary" => Some(herd_pid),
            "pgbouncer" => bouncer.as_ref().map(|(b, _)| b.pid()),
            "forwarder" => Some(std::process::id()),
            _ => None,
        }
    };

    let mut jobs = Vec::new();
    for &mode in mode_list {
        for round in 0..plan.rounds as usize {
            // Rotate the order every round so no target always runs first or last.
            for k in 0..targets.len() {
                let (name, url) = &targets[(k + round) % targets.len()];
                if runs_for(mode, name) {
                    jobs.push((mode, round, name.as_str(), url.as_str()));
                }
            }
        }
    }
    bar.set_length(jobs.len() as u64);
    bar.set_position(0);

    if plan.warmup > 0 {
        for (name, url) in &targets {
            bar.set_message(format!("warming up {name}"));
            let args = bench_args(plan.warmup, "simple", plan.many);
            pgbench.run(
                &format!("warm-up on {name}"),
                &args,
                url,
                limit(plan.warmup),
            )?;
        }
    }

    let mut tps: BTreeMap<(&str, &str), (Vec<f64>, u64)> = BTreeMap::new();
    let mut costs: BTreeMap<(&str, &str), Cost> = BTreeMap::new();
    let mut refused: BTreeMap<(&str, &str), String> = BTreeMap::new();
    // The generator apart: the servers, Herd, PgBouncer and the forwarder's thread on some
    // cores, this process (so pgbench) on the others.
    let keep_apart = || {
        let proxies: Vec<u32> = ["herd-primary", "pgbouncer"]
            .into_iter()
            .filter_map(pid_of)
            .collect();
        Apart::new(
            proxy_apart::server_roots(&cluster.data_dir(), &proxies),
            vec![forwarder.tid],
        )
    };
    // Every run apart: pinned now, or the run stops with the reason. Otherwise pinned at the
    // first run of the last modes; undone after them either way.
    let mut apart: Option<Result<Apart, AffinityError>> = if opts.generator_apart {
        let pinned = keep_apart().map_err(|e| {
            BenchError::Missing(format!(
                "--generator-apart: the load generator cannot be kept apart: {e}"
            ))
        })?;
        Some(Ok(pinned))
    } else {
        None
    };
    for (mode, round, name, url) in jobs {
        if runs_apart(mode) {
            let pinned = apart.get_or_insert_with(keep_apart);
            // Again before every run: the proxies open connections, the servers fork backends.
            let failed = match pinned {
                Ok(a) => a.pin().err().map(|e| e.to_string()),
                Err(e) => Some(e.to_string()),
            };
            if let Some(why) = failed {
                let why = format!("the load generator cannot be kept apart: {why}");
                refused.insert((mode, name), why);
                bar.inc(1);
                continue;
            }
        }
        bar.set_message(format!(
            "{mode}: round {}/{} on {name}",
            round + 1,
            plan.rounds
        ));
        let what = format!("pgbench -S ({mode}) on {name}");
        // Many clients take a while to log in (a SCRAM exchange each, and pgbench's clock
        // runs meanwhile): twice the duration, never less than 5 s (20 s in a full run).
        // A quick run's apart modes too: their 16 clients log in through the forwarder on a
        // loaded CI machine, and 2 s once ended before any transaction.
        let secs = match (mode == MANY || mode == APART_MANY, opts.quick) {
            (true, true) => plan.duration.max(5),
            (true, false) => (plan.duration * 2).max(20),
            (false, true) if is_apart(mode) => plan.duration.max(4),
            _ => plan.duration,
        };
        let args = bench_args(secs, mode, plan.many);
        // Both pooler shapes log in as the low-iteration role (why: proxy_login.rs).
        let url = if mode == CONNECT || mode == MANY || is_apart(mode) {
            proxy_login::url_as(url, LOGIN_ROLE)
        } else {
            url.to_string()
        };
        let url = url.as_str();
        let pid = pid_of(name);
        let before = pid.and_then(procstat::sample);
        let pgbench_before = procstat::children_cpu_s();
        let machine_before = procstat::machine_busy_s();
        let (run, mid) = std::thread::scope(|s| {
            // Halfway through, the proxy's memory.
            let mid = s.spawn(|| {
                std::thread::sleep(Duration::from_millis(secs * 500));
                pid.and_then(procstat::sample)
            });
            let run = pgbench.run(&what, &args, url, limit(secs));
            (run, mid.join().ok().flatten())
        });
        let r = match run {
            Ok(r) => r,
            // PostgreSQL alone refuses clients beyond max_connections: that is the finding.
            // Many clients: PostgreSQL alone refuses those beyond max_connections, and a
            // proxy may not finish the logins in time; either is the finding, not a failure.
            Err(e) if mode == MANY || mode == APART_MANY => {
                // PostgreSQL's own words, e.g. "FATAL:  sorry, too many clients already".
                let text = e.to_string();
                let why = match text.lines().find(|l| l.contains("FATAL")) {
                    Some(line) => line.to_string(),
                    None if text.contains("actually processed: 0") => format!(
                        "no transaction completed within {secs} s (the clients were still \
                         logging in)"
                    ),
                    None => text.lines().next().unwrap_or_default().to_string(),
                };
                refused.insert((mode, name), why.trim().to_string());
                bar.inc(1);
                continue;
            }
            Err(e) => return Err(e),
        };
        if let (Some(b), Some(a)) = (before, pid.and_then(procstat::sample)) {
            let c = costs.entry((mode, name)).or_default();
            c.cpu_s += a.cpu_s - b.cpu_s;
            c.user_s += a.user_s - b.user_s;
            if let (Some(pb), Some(pa)) = (pgbench_before, procstat::children_cpu_s()) {
                c.pgbench_cpu_s += pa - pb;
            }
            if let (Some(mb), Some(ma)) = (machine_before, procstat::machine_busy_s()) {
                c.machine_cpu_s += ma - mb;
            }
            c.switches += a.switches.saturating_sub(b.switches);
            c.transactions += r.transactions;
            c.rss_kib = mid.map_or(a.rss_kib, |m| m.rss_kib);
        }
        let entry = tps.entry((mode, name)).or_default();
        entry.0.push(r.tps);
        entry.1 += r.failed;
        bar.inc(1);
    }
    let apart_cores = match &apart {
        Some(Ok(a)) => Some((a.cores().0.to_vec(), a.cores().1.to_vec())),
        _ => None,
    };
    drop(apart); // every core back to everyone
    drop(bouncer);
    drop(forwarder);
    drop(cluster);

    let mut modes = BTreeMap::new();
    for &mode in mode_list {
        let base = tps
            .get(&(mode, "direct"))
            .and_then(|(runs, _)| median(runs))
            .unwrap_or(0.0);
        let mut per_target = ModeResult::new();
        for ((m, name), (runs, failed)) in &tps {
            if *m != mode {
                continue;
            }
            let median_tps = median(runs).unwrap_or(0.0);
            per_target.insert(
                name.to_string(),
                TargetResult {
                    runs: runs.clone(),
                    median_tps,
                    ratio_to_direct: if base > 0.0 { median_tps / base } else { 0.0 },
                    failed_transactions: *failed,
                },
            );
        }
        modes.insert(mode.to_string(), per_target);
    }
    for ((mode, target), why) in &refused {
        let clients = if *mode == MANY || *mode == APART_MANY {
            format!(" ({} clients)", plan.many)
        } else {
            String::new()
        };
        notes.push(format!("{mode}{clients} on {target}: no figure — {why}"));
    }
    let mut process_costs: BTreeMap<String, BTreeMap<String, ProcessCost>> = BTreeMap::new();
    for ((mode, target), c) in &costs {
        if c.transactions == 0 {
            continue;
        }
        let n = c.transactions as f64;
        process_costs.entry(mode.to_string()).or_default().insert(
            target.to_string(),
            ProcessCost {
                cpu_us_per_txn: c.cpu_s * 1e6 / n,
                user_us_per_txn: c.user_s * 1e6 / n,
                switches_per_txn: c.switches as f64 / n,
                rss_mib: c.rss_kib as f64 / 1024.0,
                pgbench_cpu_us_per_txn: c.pgbench_cpu_s * 1e6 / n,
                machine_cpu_us_per_txn: c.machine_cpu_s * 1e6 / n,
            },
        );
    }
    // The 1,000-client target compares runs apart: every mode in a run apart, the two shapes
    // apart in the default run.
    let (few, many) = if opts.generator_apart {
        ("simple", MANY)
    } else {
        (APART_FEW, APART_MANY)
    };
    let names = ModeNames {
        connect: CONNECT,
        few,
        many,
    };
    let checked = Targets {
        generator_apart: opts.generator_apart,
        checks: proxy_targets::checks(
            &modes,
            &process_costs,
            &names,
            plan.many,
            plan.rounds as usize,
        ),
    };
    notes.extend(memory_per_client(&process_costs, plan.many));
    notes.extend(against_the_floor(&modes));
    let median_of = |mode: &str, target: &str| {
        tps.get(&(mode, target))
            .and_then(|(runs, _)| median(runs))
            .filter(|v| *v > 0.0)
    };
    let machine = Machine::detect();
    let cores = machine.cores;
    for target in ["herd-primary", "pgbouncer"] {
        if let (Some(many), Some(few)) = (median_of(MANY, target), median_of("simple", target)) {
            let mut note = format!(
                "With {} clients {target} ran {:.2}× its rate with {CLIENTS} ({many:.0} against \
                 {few:.0} tps).",
                plan.many,
                many / few
            );
            let cost = |mode: &str| process_costs.get(mode).and_then(|m| m.get(target));
            // Apart, the generator's growth takes nothing from the servers' cores.
            if let Some(c) = (!opts.generator_apart)
                .then(|| cost("simple").zip(cost(MANY)))
                .flatten()
                .and_then(|(f, m)| generator_share(f, m, few, cores))
            {
                note.push_str(&format!(
                    " pgbench's own CPU rose from {:.1} to {:.1} µs per transaction. With \
                     {CLIENTS} clients the machine spent {:.1} µs of CPU per transaction, \
                     {:.2} of its {cores} cores busy; with every core busy and the proxy and the \
                     servers costing what they did then, pgbench's rise alone would leave \
                     {:.2}× of the {CLIENTS}-client rate (an estimate: the proxy's and the \
                     servers' own costs change with many connections too).",
                    c.generator_few, c.generator_many, c.machine_few, c.busy_few, c.ratio,
                ));
            }
            notes.push(note);
        }
        if let (Some(many), Some(few), Some((servers, generator))) = (
            median_of(APART_MANY, target),
            median_of(APART_FEW, target),
            &apart_cores,
        ) {
            notes.push(proxy_apart::note(
                target,
                few,
                many,
                plan.many,
                (servers, generator),
            ));
        }
    }
    let shapes_apart = if opts.generator_apart {
        String::new()
    } else {
        format!(
            " `{APART_FEW}` and `{APART_MANY}` are the 16-client simple mode and `{MANY}` again \
             through Herd and PgBouncer, logged in like the pooler shapes, with pgbench kept on \
             cores of its own."
        )
    };
    notes.push(format!(
        "Modes: `simple`, `extended` and `prepared` are `pgbench -S -c {CLIENTS} -j {THREADS} \
         -M simple|extended|prepared` (extended: Parse, Bind and Execute of an unnamed statement \
         for every query, as drivers send parameters without preparing; prepared: named \
         statements prepared once per connection); `{CONNECT}` adds `-C` (a new connection, with its authentication, for every \
         transaction: what a pooler saves the server); `{MANY}` is `-c {} -j {THREADS} -M simple` \
         (PostgreSQL alone refuses clients beyond `max_connections`; a pooler serves them all \
         from its pool of {POOL_SIZE}).{shapes_apart} CPU and context switches are the proxy \
         process's own \
         (Herd: its supervisor, which runs the proxy and a few monitoring queries; the \
         forwarder: this harness, in which it runs).",
        plan.many
    ));
    notes.push(format!(
        "`{CONNECT}` and `{MANY}` log in as `{LOGIN_ROLE}`, whose SCRAM verifier has \
         {LOGIN_ITERATIONS} PBKDF2 iterations instead of PostgreSQL's 4,096 (PostgreSQL 15 \
         accepts such a pre-hashed verifier; PgBouncer's auth_file holds the same verifier): \
         with 4,096, pgbench's own client-side key derivation set the pace of every target on a \
         small machine, and {} clients' logins filled pgbench's CPU figure. The servers' and \
         proxies' side of SCRAM does not depend on the count, so what `{CONNECT}` shows is the \
         cost of a connection: a new backend (direct, forwarder) or a pooled one (Herd, \
         PgBouncer).",
        plan.many
    ));
    let generator_role = if opts.generator_apart {
        "on cores of its own here, it takes nothing from the proxies' and the servers' cores, \
         even where it grows (many clients: each pgbench thread polls all of its connections \
         on every wait). The machine's CPU per transaction is every process's (`/proc/stat`, \
         all cores, busy time but idle, iowait and steal, over the same runs)."
    } else {
        "on a small machine it shares the cores with the proxy and the servers, so where it \
         grows (many clients: each pgbench thread polls all of its connections on every wait) \
         the rate of every target falls with it. The machine's CPU per transaction is every \
         process's (`/proc/stat`, all cores, busy time but idle, iowait and steal, over the \
         same runs): with the generator's rise it estimates what that rise alone costs the \
         many-client rate."
    };
    notes.push(format!(
        "pgbench's CPU per transaction is the load generator's own (user + system, its logins \
         included), read from this process's children's times around each run: \
         {generator_role}"
    ));
    notes.push(proxy_apart::placement_note(
        apart_cores
            .as_ref()
            .filter(|_| opts.generator_apart)
            .map(|(s, g)| (s.as_slice(), g.as_slice())),
    ));
    notes.push(
        "Herd runs its default cluster (1 primary + 2 replicas) and routes these reads to the \
         replicas (`herd`); `herd-primary` is the same endpoint with `herd.consistency=primary`, \
         so it reaches the primary like `direct` and PgBouncer and measures the proxy alone; \
         `replica` is pgbench directly on a replica (its ratio is what a hot standby costs for \
         these reads on this machine, without any proxy); `forwarder` is a plain TCP forwarder \
         on tokio (one thread, bytes copied both ways, no parsing, no pooling): the floor of one \
         extra hop."
            .into(),
    );
    notes.push(match &socket_dir {
        Some(_) => "pgbench reaches every target over TCP (127.0.0.1); Herd's proxy, PgBouncer \
                    and the forwarder reach the servers by their Unix sockets."
            .into(),
        None => "pgbench and every proxy use TCP (127.0.0.1): the servers have no Unix socket \
                 (the data directory's path is too long for one)."
            .into(),
    });
    Ok(Results {
        scenario: "proxy".into(),
        date: crate::report::now_utc(),
        quick: opts.quick,
        machine,
        settings: Settings {
            command: format!(
                "pgbench -S -c {CLIENTS} -j {THREADS} -T {} -M {{simple|extended|prepared}} URL",
                plan.duration
            ),
            rounds: plan.rounds,
            duration_s: plan.duration,
            scale: plan.scale,
            modes: mode_list.iter().map(|m| m.to_string()).collect(),
            targets: targets.into_iter().map(|(n, _)| n).collect(),
            versions,
        },
        modes,
        // The article's figures; Herd's targets are in their own table.
        published: [(
            "simple".to_string(),
            "PgBouncer 0.57×, PgCat/PgDog ≈ 0.5×".to_string(),
        )]
        .into(),
        notes,
        process_costs,
        targets: Some(checked),
        ..Default::default()
    })
}

/// A proxy's accumulated cost over a mode's runs.
#[derive(Default)]
struct Cost {
    cpu_s: f64,
    /// Of which in user space.
    user_s: f64,
    /// The load generator's (pgbench's) CPU time over the same runs.
    pgbench_cpu_s: f64,
    /// The whole machine's busy CPU time over the same runs.
    machine_cpu_s: f64,
    switches: u64,
    transactions: u64,
    /// Resident memory halfway through the last run.
    rss_kib: u64,
}

/// Memory per client connection of each proxy: its resident memory with `many` clients less
/// that with the 16 of the simple mode, per additional client.
fn memory_per_client(
    costs: &BTreeMap<String, BTreeMap<String, ProcessCost>>,
    many: u32,
) -> Vec<String> {
    let (Some(with_many), Some(with_few)) = (costs.get(MANY), costs.get("simple")) else {
        return Vec::new();
    };
    with_many
        .iter()
        .filter_map(|(target, c)| {
            let few = with_few.get(target)?;
            let per = (c.rss_mib - few.rss_mib) * 1024.0 / f64::from(many - CLIENTS);
            Some(format!(
                "Memory per client connection on {target}: {per:.1} KiB (resident {:.1} MiB with \
                 {many} clients, {:.1} MiB with {CLIENTS}).",
                c.rss_mib, few.rss_mib
            ))
        })
        .collect()
}

/// `pgbench -S -c 16 -j 2 -T secs -M mode`, with `-C` or `many` clients for the pooler shapes
/// (simple protocol), the two shapes apart in simple protocol too.
fn bench_args(secs: u64, mode: &str, many: u32) -> Vec<String> {
    let args = match mode {
        CONNECT => format!("-S -C -c {CLIENTS} -j {THREADS} -T {secs} -M simple"),
        MANY | APART_MANY => format!("-S -c {many} -j {THREADS} -T {secs} -M simple"),
        APART_FEW => format!("-S -c {CLIENTS} -j {THREADS} -T {secs} -M simple"),
        _ => format!("-S -c {CLIENTS} -j {THREADS} -T {secs} -M {mode}"),
    };
    args.split(' ').map(String::from).collect()
}

/// How long a run may take before it counts as hung: its duration plus a minute.
fn limit(secs: u64) -> Duration {
    Duration::from_secs(secs + 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Scratches;

    #[test]
    fn every_mode_gives_pgbench_a_query_mode_it_knows() {
        for mode in MODES {
            let args = bench_args(5, mode, 1000);
            let m = args.iter().position(|a| a == "-M").expect("-M");
            let protocol = args.get(m + 1).map(String::as_str);
            assert!(
                matches!(protocol, Some("simple" | "extended" | "prepared")),
                "{mode}: {args:?}"
            );
            let many = args.iter().any(|a| a == "1000");
            assert_eq!(many, mode == MANY || mode == APART_MANY, "{mode}: {args:?}");
        }
    }

    #[test]
    fn iterations_set_the_rounds() {
        let opts = |quick, iterations| BenchOptions {
            quick,
            out: "out".into(),
            duration: None,
            herd_exe: "herd".into(),
            iterations,
            scale: None,
            hosts: None,
            ttl_ms: None,
            shards: None,
            generator_apart: false,
            scratches: Scratches::default(),
        };
        assert_eq!(Plan::new(&opts(false, None)).rounds, 5);
        assert_eq!(Plan::new(&opts(true, None)).rounds, 1);
        assert_eq!(Plan::new(&opts(false, Some(9))).rounds, 9);
        assert_eq!(Plan::new(&opts(true, Some(3))).rounds, 3);
        // No round is no figure: at least one.
        assert_eq!(Plan::new(&opts(false, Some(0))).rounds, 1);
    }
}
