//! `herd up`: create or resume the cluster, then supervise it in the foreground (or detached).

use std::time::Duration;

use anyhow::{bail, Context};
use herd_cluster::{Cluster, ClusterState, Layout, SupervisorLock};
use herd_config::Config;
use herd_core::SupervisorInfo;
use herd_pg::{OsUser, Pg, PgBinaries};
use tokio::sync::watch;

use crate::cli::UpArgs;
use crate::progress::TermProgress;

/// Set in the environment of a detached supervisor.
const DETACHED_ENV: &str = "HERD_DETACHED";

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    let layout = args.dir.layout()?;
    check_foreign_dir(&layout)?;
    let config = effective_config(&layout, &args)?;
    if args.detach {
        return crate::detach::run(&layout, &config).await;
    }
    supervise_foreground(layout, config).await
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
    }
    Ok(config)
}

/// Creates or resumes the cluster, supervises it until Ctrl-C / SIGTERM, then stops it cleanly.
async fn supervise_foreground(layout: Layout, config: Config) -> anyhow::Result<()> {
    // Programs first: a machine without PostgreSQL fails here with nothing written.
    let pg = Pg::new(
        PgBinaries::locate(config.postgres.bindir.as_deref())?,
        OsUser::for_servers(&config.postgres.os_user)?,
    );
    let lock = SupervisorLock::acquire(&layout)?;
    save_config(&layout, &config)?;
    let api_addr = (config.network.listen_address, config.api_port());
    let progress = TermProgress::new();
    let fresh = !layout.state().exists();
    eprintln!(
        "{} the Herd cluster in {} (PostgreSQL: {})",
        if fresh { "Creating" } else { "Resuming" },
        layout.root().display(),
        pg.binaries().version()
    );
    let api_listener = tokio::net::TcpListener::bind(api_addr)
        .await
        .with_context(|| {
            format!(
                "port {} on {} is already in use (Herd's HTTP API); choose another --api-port",
                api_addr.1, api_addr.0
            )
        })?;
    let endpoint_addr = (config.network.listen_address, config.network.port);
    let proxy_listener = tokio::net::TcpListener::bind(endpoint_addr)
        .await
        .with_context(|| {
            format!(
                "port {} on {} is already in use (the cluster's endpoint); choose another --port",
                endpoint_addr.1, endpoint_addr.0
            )
        })?;
    let cluster = if fresh {
        Cluster::bootstrap(layout.clone(), config.clone(), &pg, &progress).await?
    } else {
        let cluster = Cluster::open(layout.clone(), config.clone())?;
        cluster.verify_data_dirs()?;
        cluster.check_ports(None)?;
        cluster.start_all(&pg, &progress).await?;
        cluster
    };
    let timeout = Duration::from_secs(config.supervisor.ready_timeout_s);
    if let Err(e) = cluster.wait_ready(timeout, &progress).await {
        let _ = cluster.stop_all(&pg, &progress).await;
        return Err(e).context("the servers were stopped again");
    }
    let info = SupervisorInfo {
        pid: std::process::id(),
        api_port: api_addr.1,
    };
    let first = herd_cluster::observe(&cluster).await.status;
    crate::output::emit!("{}", crate::status::summary(&cluster, &first));
    lock.publish(&info)?;
    drop(progress);

    let (status_tx, status_rx) = watch::channel(first);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (assignment_tx, assignment_rx) = watch::channel(cluster.assignment());
    let login = herd_proxy::monitor::AdminLogin {
        user: herd_cluster::SUPERUSER.into(),
        password: cluster.secrets.superuser.clone(),
    };
    let proxy = herd_proxy::Proxy::start(
        config.proxy.clone(),
        assignment_rx,
        login,
        proxy_listener,
        shutdown_rx.clone(),
    );
    let proxy_ctx = proxy.ctx.clone();
    let metrics: herd_api::MetricsSource = std::sync::Arc::new(move || proxy_ctx.render_metrics());
    let (command_tx, command_rx) = tokio::sync::mpsc::channel(4);
    let admin: herd_api::AdminSource = std::sync::Arc::new(move |action| {
        let tx = command_tx.clone();
        Box::pin(async move { crate::admin::dispatch(&tx, action).await })
    });
    let count_ctx = proxy.ctx.clone();
    let count: std::sync::Arc<dyn Fn(&str) + Send + Sync> = std::sync::Arc::new(move |kind| {
        count_ctx
            .metrics
            .inc_labels("herd_ha_decisions_total", &[("action", kind)])
    });
    let gate_ctx = proxy.ctx.clone();
    let gate: herd_cluster::Gate = std::sync::Arc::new(move |paused| gate_ctx.set_paused(paused));
    let mut api_shutdown = shutdown_rx.clone();
    let api = tokio::spawn(herd_api::serve(
        api_listener,
        status_rx,
        metrics,
        admin,
        async move {
            let _ = api_shutdown.changed().await;
        },
    ));
    let supervisor = {
        let cluster = cluster.clone();
        let pg = pg.clone();
        tokio::spawn(async move {
            // Embedded mode: one supervisor, so the store lives in its memory.
            let dcs = herd_dcs::MemoryDcs::default();
            if let Err(e) = cluster.state.record(&dcs) {
                tracing::warn!("recording the topology failed: {e}");
            }
            let links = herd_cluster::Links {
                status: &status_tx,
                assignment: &assignment_tx,
                dcs: &dcs,
                commands: command_rx,
                gate,
                shutdown: shutdown_rx,
                count,
            };
            herd_cluster::supervise(cluster, &pg, links).await
        })
    };
    init_logging();
    tracing::info!(
        "supervising {} nodes; Ctrl-C or `herd down` stops the cluster",
        cluster.state.nodes.len()
    );
    wait_for_signal().await?;
    tracing::info!("shutting down");
    let _ = shutdown_tx.send(true);
    let _ = supervisor.await;
    let _ = api.await;
    let progress = TermProgress::new();
    cluster.stop_all(&pg, &progress).await?;
    drop(lock);
    eprintln!("Cluster stopped; `herd up` resumes it with its data.");
    Ok(())
}

pub(crate) fn save_config(layout: &Layout, config: &Config) -> anyhow::Result<()> {
    std::fs::create_dir_all(layout.root())
        .with_context(|| format!("creating {}", layout.root().display()))?;
    std::fs::write(layout.config(), herd_config::render(config))
        .with_context(|| format!("writing {}", layout.config().display()))
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HERD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Waits for SIGINT or SIGTERM. A detached supervisor also ignores SIGHUP, so closing the
/// terminal it was started from does not stop the cluster.
async fn wait_for_signal() -> anyhow::Result<()> {
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
