//! `herd bench proxy`: read-only pgbench (`-S`) straight to the primary, through Herd's proxy
//! and, when installed, through PgBouncer; simple and prepared protocol; interleaved rounds.

use std::collections::BTreeMap;
use std::time::Duration;

use indicatif::ProgressBar;

use crate::cluster::{url_with_options, ScratchCluster, UrlParts};
use crate::forwarder::{Forwarder, Upstream};
use crate::pgbench::{median, Pgbench};
use crate::pgbouncer::{Installed, PgBouncer};
use crate::report::{Machine, ModeResult, Results, Settings, TargetResult};
use crate::{BenchError, BenchOptions};

/// Query modes measured, in order.
const MODES: [&str; 2] = ["simple", "prepared"];
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
}

impl Plan {
    fn new(opts: &BenchOptions) -> Plan {
        let (rounds, duration, scale, warmup) = if opts.quick {
            (1, 2, 1, 0)
        } else {
            (5, 10, 10, 3)
        };
        Plan {
            rounds,
            duration: opts.duration.unwrap_or(duration),
            scale: opts.scale.unwrap_or(scale).max(1),
            warmup,
        }
    }
}

/// Runs the scenario; the figures for the report.
pub fn run(opts: &BenchOptions, bar: &ProgressBar) -> Result<Results, BenchError> {
    let plan = Plan::new(opts);
    let pgbench = Pgbench::locate()?;
    let bouncer_bin = Installed::find();
    let mut notes = Vec::new();

    bar.set_message("starting a scratch cluster (herd up)");
    let cluster = ScratchCluster::start(&opts.herd_exe)?;
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
                installed,
                cluster.dir(),
                &cluster.primary_url,
                socket_dir.as_deref(),
                POOL_SIZE,
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
        !(target == "pgbouncer" && mode == "prepared" && !bouncer.as_ref().is_some_and(|b| b.1))
    };

    let mut jobs = Vec::new();
    for mode in MODES {
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
            let args = bench_args(plan.warmup, "simple");
            pgbench.run(
                &format!("warm-up on {name}"),
                &args,
                url,
                limit(plan.warmup),
            )?;
        }
    }

    let mut tps: BTreeMap<(&str, &str), (Vec<f64>, u64)> = BTreeMap::new();
    for (mode, round, name, url) in jobs {
        bar.set_message(format!(
            "{mode}: round {}/{} on {name}",
            round + 1,
            plan.rounds
        ));
        let what = format!("pgbench -S -M {mode} on {name}");
        let r = pgbench.run(
            &what,
            &bench_args(plan.duration, mode),
            url,
            limit(plan.duration),
        )?;
        let entry = tps.entry((mode, name)).or_default();
        entry.0.push(r.tps);
        entry.1 += r.failed;
        bar.inc(1);
    }
    drop(bouncer);
    drop(forwarder);
    drop(cluster);

    let mut modes = BTreeMap::new();
    for mode in MODES {
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
    notes.push(
        "pgbench, the proxies and every PostgreSQL server share this machine's cores, so the \
         ratios understate what a separate client machine would see."
            .into(),
    );
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
        machine: Machine::detect(),
        settings: Settings {
            command: format!(
                "pgbench -S -c {CLIENTS} -j {THREADS} -T {} -M {{simple|prepared}} URL",
                plan.duration
            ),
            rounds: plan.rounds,
            duration_s: plan.duration,
            scale: plan.scale,
            modes: MODES.iter().map(|m| m.to_string()).collect(),
            targets: targets.into_iter().map(|(n, _)| n).collect(),
            versions,
        },
        modes,
        published: [
            (
                "simple".to_string(),
                "PgBouncer 0.57×, PgCat/PgDog ≈ 0.5×; target Herd ≥ 0.70×".to_string(),
            ),
            ("prepared".to_string(), "target Herd ≥ 0.70×".to_string()),
        ]
        .into(),
        notes,
        ..Default::default()
    })
}

/// `pgbench -S -c 16 -j 2 -T secs -M mode`.
fn bench_args(secs: u64, mode: &str) -> Vec<String> {
    let args = format!("-S -c {CLIENTS} -j {THREADS} -T {secs} -M {mode}");
    args.split(' ').map(String::from).collect()
}

/// How long a run may take before it counts as hung: its duration plus a minute.
fn limit(secs: u64) -> Duration {
    Duration::from_secs(secs + 60)
}
