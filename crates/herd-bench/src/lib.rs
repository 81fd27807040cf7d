//! `herd bench SCENARIO`: scenarios that reproduce Herd's reference measurements.
//!
//! Each scenario creates the cluster it needs in a scratch directory, runs its workload while
//! showing progress (the phase and a bar), tears everything down (also on failure), and writes
//! `results.json`, `report.md` and SVG charts into [`BenchOptions::out`].
//!
//! Dependencies are justified one per line in Cargo.toml; `herd-scram` (the newest) builds the
//! low-iteration verifier of `proxy`'s connect-per-transaction role.

mod affinity;
mod cgroup;
mod chart;
mod cluster;
mod error;
mod forwarder;
mod pgbench;
mod pgbouncer;
mod process;
mod procstat;
pub mod report;
mod scenarios;
mod scratches;
mod teardown;

use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};

pub use error::BenchError;
pub(crate) use error::TeardownError;
pub use pgbench::{median, parse_output, PgbenchRun};
pub use report::{LagResult, Machine, ModeResult, Percentiles, ReadScaling, Results, TargetResult};
pub use scratches::{Left, Scratches};

/// How to run a scenario.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Short runs for smoke tests: fewer rounds, shorter runs, smaller data; figures are not
    /// meaningful.
    pub quick: bool,
    /// Directory the reports are written to (created when absent).
    pub out: PathBuf,
    /// Seconds per measured run, overriding the scenario's default.
    pub duration: Option<u64>,
    /// The `herd` binary used to create the scratch clusters.
    pub herd_exe: PathBuf,
    /// Iterations (e.g. failovers, or `proxy`'s interleaved rounds) per mode, overriding the
    /// scenario's default.
    pub iterations: Option<u32>,
    /// Data set size, overriding the scenario's default: the pgbench scale factor where
    /// pgbench's tables are used, the number of devices of the time-series data set, the
    /// number of rows of a bulk insert (each scenario's docs say which).
    pub scale: Option<u32>,
    /// `failover` only: run on this many hosts (network namespaces with etcd and `herd agent`)
    /// instead of one `herd up` cluster.
    pub hosts: Option<u32>,
    /// `failover --hosts` only: the agents' lease TTL in milliseconds (their default otherwise).
    pub ttl_ms: Option<u64>,
    /// `failover --hosts` only: shard groups of the cluster (each with a member on every host);
    /// 2 measures one group's failover and the other group's writes meanwhile.
    pub shards: Option<u32>,
    /// `proxy` only: every mode with the load generator apart (pgbench on cores of its own, the
    /// servers and the proxies on the others), as if pgbench ran on another machine.
    pub generator_apart: bool,
    /// The scratch clusters and helpers this run has alive, for the caller to stop if the run
    /// is interrupted ([`Scratches::stop_all`]).
    pub scratches: Scratches,
}

/// What a finished run produced.
#[derive(Debug)]
pub struct Report {
    /// The figures of each scenario run, as written to its `results.json`.
    pub results: Vec<Results>,
    /// The Markdown tables, as in `report.md`.
    pub markdown: String,
    /// Every file written, in order.
    pub files: Vec<PathBuf>,
}

/// One registered scenario.
pub struct Scenario {
    /// The name given on the command line.
    pub name: &'static str,
    /// One line for help texts.
    pub about: &'static str,
    run: fn(&BenchOptions, &ProgressBar) -> Result<Results, BenchError>,
}

/// Every scenario `herd bench` knows.
pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "proxy",
        about: "pgbench -S through Herd's proxy (and PgBouncer when installed) against the primary",
        run: scenarios::proxy::run,
    },
    Scenario {
        name: "failover",
        about:
            "kill -9 of the primary under writes: RTO and acknowledged writes lost per commit mode",
        run: scenarios::failover::run,
    },
    Scenario {
        name: "commit-modes",
        about: "rows/s of batched time-series inserts per commit mode, relative to no replication",
        run: scenarios::commit_modes::run,
    },
    Scenario {
        name: "commit-waits",
        about: "wait events (IO:WALSync, IPC:SyncRep, LWLock:WALWrite) of commits per commit mode",
        run: scenarios::commit_waits::run,
    },
    Scenario {
        name: "read-scaling",
        about: "qps of time-series reads through the proxy on 1, 3 and 5 CPU-confined nodes",
        run: scenarios::read_scaling::run,
    },
    Scenario {
        name: "bandwidth",
        about: "bytes sent to a physical standby vs a logical subscription, wal_compression \
                off/lz4/zstd",
        run: scenarios::bandwidth::run,
    },
    Scenario {
        name: "lag",
        about: "replica lag (10 Hz, bytes and time) under pgbench TPC-B, with select-only load \
                on the replica directly and through Herd's lag-aware read pool",
        run: scenarios::lag::run,
    },
    Scenario {
        name: "sharding",
        about: "point selects and a bulk read by key on 1 server, Herd with 1, 2 and 4 shard \
                groups and a postgres_fdw baseline on 2 nodes, every node CPU-confined",
        run: scenarios::sharding::run,
    },
    Scenario {
        name: "shard-move",
        about: "write waits while `herd shards move` moves one shard of a 1 GB table between \
                two shard groups under write load",
        run: scenarios::shard_move::run,
    },
    Scenario {
        name: "backup",
        about: "pg_basebackup vs herd backup (from the standby and the primary) and herd \
                restore, MB/s; the primary's TPC-B rate while backups run",
        run: scenarios::backup::run,
    },
];

/// The name that runs every scenario in turn.
pub const ALL: &str = "all";

/// Runs the scenario called `scenario` (or every one, for [`ALL`]) and writes its reports into
/// `opts.out`.
pub fn run(scenario: &str, opts: &BenchOptions) -> Result<Report, BenchError> {
    if scenario == ALL {
        return run_all(opts);
    }
    let Some(found) = SCENARIOS.iter().find(|s| s.name == scenario) else {
        return Err(BenchError::UnknownScenario {
            name: scenario.into(),
            known: SCENARIOS
                .iter()
                .map(|s| s.name)
                .chain([ALL])
                .collect::<Vec<_>>()
                .join(", "),
        });
    };
    run_one(found, opts, "")
}

/// Runs `found`, showing `prefix` before its progress messages.
fn run_one(found: &Scenario, opts: &BenchOptions, prefix: &str) -> Result<Report, BenchError> {
    std::fs::create_dir_all(&opts.out).map_err(|e| BenchError::io("creating", &opts.out, e))?;
    let bar = ProgressBar::new(0);
    if let Ok(style) = ProgressStyle::with_template(&format!(
        "{{spinner}} {prefix}[{{elapsed_precise}}] {{bar:30}} {{pos}}/{{len}} {{msg}}"
    )) {
        bar.set_style(style);
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    opts.scratches.set_bar(Some(&bar));
    let outcome = (found.run)(opts, &bar);
    opts.scratches.set_bar(None);
    bar.finish_and_clear();
    let results = outcome?;
    let (markdown, files) = report::write_all(&results, &opts.out)?;
    Ok(Report {
        results: vec![results],
        markdown,
        files,
    })
}

/// Runs every scenario, each into its own directory under `opts.out`, and writes `report.md`
/// there with every table. A failed scenario is reported and the others still run; the run
/// fails at the end if any did.
fn run_all(opts: &BenchOptions) -> Result<Report, BenchError> {
    std::fs::create_dir_all(&opts.out).map_err(|e| BenchError::io("creating", &opts.out, e))?;
    let mut all = Report {
        results: Vec::new(),
        markdown: String::new(),
        files: Vec::new(),
    };
    let mut failed = Vec::new();
    let started = std::time::Instant::now();
    for (k, scenario) in SCENARIOS.iter().enumerate() {
        let sub = BenchOptions {
            out: opts.out.join(scenario.name),
            ..opts.clone()
        };
        let prefix = format!("{}/{} {} ", k + 1, SCENARIOS.len(), scenario.name);
        match run_one(scenario, &sub, &prefix) {
            Ok(mut report) => {
                all.markdown += &format!("## {}\n\n{}\n", scenario.name, report.markdown);
                all.results.append(&mut report.results);
                all.files.append(&mut report.files);
            }
            Err(e) => {
                all.markdown += &format!("## {}\n\nFailed: {e}\n\n", scenario.name);
                failed.push(format!("{}: {e}", scenario.name));
            }
        }
    }
    all.markdown += &format!(
        "All scenarios took {:.1} minutes.\n",
        started.elapsed().as_secs_f64() / 60.0
    );
    let path = opts.out.join("report.md");
    std::fs::write(&path, &all.markdown).map_err(|e| BenchError::io("writing", &path, e))?;
    all.files.push(path);
    if failed.is_empty() {
        Ok(all)
    } else {
        Err(BenchError::Missing(format!(
            "{} of {} scenarios failed (the others' reports are in {}): {}",
            failed.len(),
            SCENARIOS.len(),
            opts.out.display(),
            failed.join("; ")
        )))
    }
}
