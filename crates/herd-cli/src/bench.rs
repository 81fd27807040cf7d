//! `herd bench SCENARIO`: runs a benchmark scenario and prints where its reports are.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

/// Options of `herd bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The scenario to run: proxy, failover, commit-modes, commit-waits, read-scaling, lag,
    /// bandwidth, sharding, shard-move, or `all` (each into its own directory under --out).
    pub scenario: String,
    /// Short runs (smoke test); figures are not meaningful.
    #[arg(long)]
    pub quick: bool,
    /// Directory for results.json, report.md and the SVG charts.
    #[arg(long, value_name = "DIR", default_value = "bench-results")]
    pub out: PathBuf,
    /// Seconds per measured run (default: the scenario's own).
    #[arg(long, value_name = "S")]
    pub duration: Option<u64>,
    /// Iterations per mode, e.g. failovers, or the interleaved rounds of proxy (default: the
    /// scenario's own).
    #[arg(long, value_name = "N")]
    pub iterations: Option<u32>,
    /// Data set size (default: the scenario's own): pgbench's scale factor for proxy and lag,
    /// devices of the time-series data set for commit-modes and read-scaling, rows of the bulk
    /// insert for bandwidth, 100 000 accounts per unit for sharding and shard-move.
    #[arg(long, value_name = "N")]
    pub scale: Option<u32>,
    /// failover only: run on 3 hosts (network namespaces, each with an etcd member, `herd
    /// agent` and its PostgreSQL; needs root) instead of one `herd up` cluster.
    #[arg(long, value_name = "N")]
    pub hosts: Option<u32>,
    /// failover --hosts only: the agents' leader lease TTL (default: the agents' 10 000).
    #[arg(long, value_name = "MS", requires = "hosts")]
    pub ttl_ms: Option<u64>,
    /// failover --hosts only: shard groups, each with a member on every host (only 2): the
    /// host of group 1's primary is killed; group 1's RTO and group 0's writes meanwhile.
    #[arg(long, value_name = "N", requires = "hosts")]
    pub shards: Option<u32>,
    /// proxy only: run every mode with the load generator apart — pgbench pinned to half of the
    /// cores, the servers and the proxies to the other half — as if pgbench ran on another
    /// machine (by default pgbench shares the cores, and two shapes run apart at the end).
    #[arg(long)]
    pub generator_apart: bool,
}

/// Runs the scenario on a blocking thread and prints its table and files. SIGINT or SIGTERM
/// meanwhile stops the scratch clusters, helpers, lab and CPU groups the run started and exits
/// with 130 or 143 (`bench_interrupt`).
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.generator_apart && args.scenario != "proxy" {
        anyhow::bail!(
            "--generator-apart applies to `herd bench proxy` only, not to `{}`",
            args.scenario
        );
    }
    let scratches = herd_bench::Scratches::new();
    let mut signals = crate::bench_interrupt::Signals::install()?;
    let opts = herd_bench::BenchOptions {
        quick: args.quick,
        out: args.out,
        duration: args.duration,
        iterations: args.iterations,
        scale: args.scale,
        hosts: args.hosts,
        ttl_ms: args.ttl_ms,
        shards: args.shards,
        generator_apart: args.generator_apart,
        herd_exe: std::env::current_exe().context("locating the herd binary")?,
        scratches: scratches.clone(),
    };
    let scenario = args.scenario;
    let bench = tokio::task::spawn_blocking(move || herd_bench::run(&scenario, &opts));
    let report = tokio::select! {
        done = bench => done.context("the benchmark thread failed")??,
        caught = signals.next() => {
            crate::bench_interrupt::stop_and_exit(caught, signals, scratches).await
        }
    };
    crate::output::emitln!("{}", report.markdown);
    for file in &report.files {
        crate::output::emitln!("wrote {}", file.display());
    }
    Ok(())
}
