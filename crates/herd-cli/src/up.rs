//! `herd up`: create or resume the cluster, then run it in the foreground (or detached) on the
//! agent engine (`up_agents.rs`).

use anyhow::{bail, Context};
use herd_cluster::{ClusterState, Layout};
use herd_config::Config;

use crate::cli::UpArgs;

/// Set in the environment of a detached supervisor.
const DETACHED_ENV: &str = "HERD_DETACHED";

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    let layout = args.dir.layout()?;
    check_foreign_dir(&layout)?;
    crate::up_agents::check_engine()?;
    let config = effective_config(&layout, &args)?;
    // A bad certificate fails here, before anything starts (and before detaching).
    crate::client_tls::load(&config.proxy, layout.root())?;
    if args.detach {
        return crate::detach::run(&layout, &config).await;
    }
    crate::up_agents::run(layout, config).await
}

/// Refuses a non-empty directory that is not a Herd data directory, so nothing foreign is touched.
fn check_foreign_dir(layout: &Layout) -> anyhow::Result<()> {
    let root = layout.root();
    let non_empty = std::fs::read_dir(root)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    if non_empty && !layout.config().exists() {
        bail!(
            "{} is not empty and holds no herd.toml: it is not a Herd data directory. \
             Choose an empty or new directory with --data-dir",
            root.display()
        );
    }
    Ok(())
}

/// herd.toml (or the defaults) with this run's flags applied, validated.
fn effective_config(layout: &Layout, args: &UpArgs) -> anyhow::Result<Config> {
    let mut config = if layout.config().exists() {
        Config::load(&layout.config())?
    } else {
        Config::default()
    };
    let invalid =
        |key: &str, e: herd_core::ParseError| anyhow::anyhow!("invalid value for --{key}: {e}");
    if let Some(r) = args.replicas {
        config.cluster.replicas = r;
    }
    if let Some(n) = args.shards {
        config.cluster.shards = n;
    }
    if let Some(m) = &args.commit_mode {
        config.cluster.commit_mode = m.parse().map_err(|e| invalid("commit-mode", e))?;
    }
    if let Some(s) = &args.sync_standbys {
        config.cluster.sync_standbys = s.parse().map_err(|e| invalid("sync-standbys", e))?;
    }
    if let Some(p) = args.port {
        config.network.port = p;
    }
    if let Some(p) = args.api_port {
        config.network.api_port = p;
    }
    if let Some(dir) = &args.pg_bindir {
        config.postgres.bindir = Some(dir.clone());
    }
    config.validate()?;
    if let Some(state) = ClusterState::load(&layout.state())? {
        let existing = state.nodes.len() as u32 - 1;
        if existing != config.cluster.replicas {
            bail!(
                "this cluster has {existing} replicas; changing the count of an existing cluster is not supported \
                 (drop --replicas, or set cluster.replicas = {existing} in herd.toml)"
            );
        }
        let groups = herd_cluster::existing_groups(layout);
        if config.cluster.shards < groups {
            bail!(
                "this cluster has {groups} shard groups; removing groups is not supported \
                 (drop --shards, or set cluster.shards = {groups} in herd.toml)"
            );
        }
    }
    Ok(config)
}

pub(crate) fn save_config(layout: &Layout, config: &Config) -> anyhow::Result<()> {
    std::fs::create_dir_all(layout.root())
        .with_context(|| format!("creating {}", layout.root().display()))?;
    std::fs::write(layout.config(), herd_config::render(config))
        .with_context(|| format!("writing {}", layout.config().display()))
}

pub(crate) fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HERD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,tokio_postgres=warn"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Waits for SIGINT or SIGTERM. A detached supervisor also ignores SIGHUP, so closing the
/// terminal it was started from does not stop the cluster.
pub(crate) async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let detached = std::env::var_os(DETACHED_ENV).is_some();
    loop {
        tokio::select! {
            _ = int.recv() => return Ok(()),
            _ = term.recv() => return Ok(()),
            _ = hup.recv() => if !detached { return Ok(()) },
        }
    }
}

pub(crate) fn detached_env() -> &'static str {
    DETACHED_ENV
}
