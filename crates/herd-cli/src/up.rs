//! `herd up`: create or resume the cluster, then supervise it in the foreground (or detached).

use std::time::Duration;

use anyhow::{bail, Context};
use herd_cluster::{Cluster, ClusterState, Layout, SupervisorLock};
use herd_config::Config;
use herd_core::SupervisorInfo;
use herd_pg::{OsUser, Pg, PgBinaries};
use tokio::sync::watch;

use crate::cli::UpArgs;
use crate::groups::GroupLinks;
use crate::progress::TermProgress;

/// Set in the environment of a detached supervisor.
const DETACHED_ENV: &str = "HERD_DETACHED";

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    let layout = args.dir.layout()?;
    check_foreign_dir(&layout)?;
    crate::up_agents::check_engine(&layout)?;
    let config = effective_config(&layout, &args)?;
    // A bad certificate fails here, before anything starts (and before detaching).
    crate::client_tls::load(&config.proxy, layout.root())?;
    if args.detach {
        return crate::detach::run(&layout, &config).await;
    }
    if crate::up_agents::chosen()? {
        return crate::up_agents::run(layout, config).await;
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

/// Creates or resumes the cluster, supervises it until Ctrl-C / SIGTERM, then stops it cleanly.
async fn supervise_foreground(layout: Layout, config: Config) -> anyhow::Result<()> {
    // Programs first: a machine without PostgreSQL fails here with nothing written.
    let pg = Pg::new(
        PgBinaries::locate(config.postgres.bindir.as_deref())?,
        OsUser::for_servers(&config.postgres.os_user)?,
    );
    let client_tls = crate::client_tls::load(&config.proxy, layout.root())?;
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
    // Groups that exist start now; groups added to an existing cluster (a larger --shards)
    // are added once the endpoint runs, as `herd group add` does, so they receive what the
    // others share before clients use them.
    let existing = if fresh {
        config.cluster.shards
    } else {
        herd_cluster::existing_groups(&layout).min(config.cluster.shards)
    };
    if config.backup.is_enabled() {
        // Before the servers start: their archive_command reads this configuration.
        crate::backup_setup::write_config(&layout, &config, pg.os_user())?;
    }
    let groups = start_groups(&layout, &config, &pg, &progress, existing).await?;
    let timeout = Duration::from_secs(config.supervisor.ready_timeout_s);
    for cluster in &groups {
        if let Err(e) = cluster.wait_ready(timeout, &progress).await {
            let _ = herd_cluster::stop_groups(&groups, &pg, &progress).await;
            return Err(e).context("the servers were stopped again");
        }
    }
    if config.backup.is_enabled() {
        use herd_cluster::Progress;
        progress.phase("creating the pgBackRest stanzas (WAL archiving)");
        match crate::backup_setup::create_stanzas(&layout, &config, pg.os_user()) {
            Ok(()) => progress.done("WAL archiving to the backup repository is on"),
            // The cluster serves without it; `herd backup` creates the stanzas again.
            Err(e) => eprintln!("warning: {e:#}\n(WAL archiving fails until this is fixed; `herd backup` tries again)"),
        }
    }
    let cluster = groups[0].clone();
    let info = SupervisorInfo {
        pid: std::process::id(),
        api_port: api_addr.1,
    };
    let first = herd_cluster::observe_groups(&groups)
        .await
        .context("observing the shard groups")?;
    crate::output::emit!("{}", crate::status::summary(&cluster, &first));
    drop(progress);

    let (status_tx, status_rx) = watch::channel(first.clone());
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let links = GroupLinks::new(&groups, &first, status_tx);
    let set = links.set.clone();
    let login = herd_proxy::monitor::AdminLogin {
        user: herd_cluster::SUPERUSER.into(),
        password: cluster.secrets.superuser.clone(),
    };
    let proxy = herd_proxy::Proxy::start(
        config.proxy.clone(),
        links.assignments.iter().map(|a| a.subscribe()).collect(),
        login,
        proxy_listener,
        client_tls,
        shutdown_rx.clone(),
    );
    let proxy_ctx = proxy.ctx.clone();
    let copies = set.copies.clone();
    let archive_status = status_rx.clone();
    let metrics: herd_api::MetricsSource = std::sync::Arc::new(move || {
        let mut text = proxy_ctx.render_metrics();
        if let Ok(c) = copies.lock() {
            text.push_str(&herd_copy::status::render_metrics(&c));
        }
        text.push_str(&herd_api::archive_metrics(&archive_status.borrow()));
        text
    });
    let admin_set = set.clone();
    let admin_layout = layout.clone();
    let admin: herd_api::AdminSource = std::sync::Arc::new(move |action| {
        let (set, layout) = (admin_set.clone(), admin_layout.clone());
        Box::pin(async move { crate::admin::dispatch(&set, &layout, action).await })
    });
    let token = api_token(&layout, config.network.listen_address)?;
    let dashboard = herd_api::Dashboard::default();
    let waits = crate::commit_waits::source(cluster.clone(), status_rx.clone());
    let sampler = tokio::spawn(dashboard.clone().run_sampler(
        status_rx.clone(),
        metrics.clone(),
        Some(waits),
        shutdown_rx.clone(),
    ));
    let mut api_shutdown = shutdown_rx.clone();
    let api = herd_api::Api {
        status: status_rx.clone(),
        metrics,
        admin,
        dashboard: dashboard.clone(),
        token: token.map(Into::into),
        bench_results: (!config.dashboard.bench_results.is_empty())
            .then(|| layout.root().join(&config.dashboard.bench_results)),
    };
    let api = tokio::spawn(herd_api::serve(api_listener, api, async move {
        let _ = api_shutdown.changed().await;
    }));
    let copies_links = crate::copies_task::CopiesLinks {
        layout: layout.clone(),
        groups: set.clone() as std::sync::Arc<dyn crate::copies_task::Groups>,
        status: status_rx.clone(),
        copies: set.copies.clone(),
        publish: set.publisher(),
    };
    let copies_task = crate::copies_task::spawn(copies_links, pg.clone(), shutdown_rx.clone());
    links.spawn(crate::groups::Runtime::new(
        &pg,
        &proxy.ctx,
        &dashboard.event_sink(),
        &shutdown_rx,
    ));
    let schedule_links = crate::backup_schedule::ScheduleLinks {
        layout: layout.clone(),
        owner: pg.os_user().cloned(),
        proxy: proxy.ctx.clone(),
        status: status_rx.clone(),
    };
    init_logging();
    let scheduled = crate::backup_schedule::spawn(schedule_links, &config, shutdown_rx.clone());
    for _ in existing..config.cluster.shards {
        match crate::group_add::add(&set, &layout).await {
            Ok(text) => eprintln!("{text}"),
            Err(e) => {
                eprintln!(
                    "warning: {e:#}\n(the cluster runs without it; `herd group add` tries again)"
                );
                break;
            }
        }
    }
    // Published last: `herd up --detach` returns once the supervisor is, groups added included.
    lock.publish(&info)?;
    let running = set.clusters();
    tracing::info!(
        "supervising {} nodes in {} shard group(s); Ctrl-C or `herd down` stops the cluster",
        running.iter().map(|g| g.state.nodes.len()).sum::<usize>(),
        running.len()
    );
    wait_for_signal().await?;
    tracing::info!("shutting down");
    let _ = shutdown_tx.send(true);
    set.join().await;
    let _ = copies_task.await;
    let _ = sampler.await;
    let _ = api.await;
    if let Some(task) = scheduled {
        // A scheduled backup under way finishes first (bounded): stopping the servers under it
        // would fail it.
        if tokio::time::timeout(crate::backup_schedule::SHUTDOWN_WAIT, task)
            .await
            .is_err()
        {
            tracing::warn!("a scheduled backup still runs: stopping the servers under it");
        }
    }
    let progress = TermProgress::new();
    // Groups added while the cluster ran included.
    herd_cluster::stop_groups(&set.clusters(), &pg, &progress).await?;
    drop(lock);
    eprintln!("Cluster stopped; `herd up` resumes it with its data.");
    Ok(())
}

/// The API's token when it listens beyond 127.0.0.1 (created on first use, mode 0600); `None`
/// on 127.0.0.1, where only local users reach it.
fn api_token(layout: &Layout, listen: std::net::IpAddr) -> anyhow::Result<Option<String>> {
    if !herd_api::auth::needs_token(listen) {
        return Ok(None);
    }
    let token = herd_cluster::Secrets::ensure_api_token(layout)?;
    eprintln!(
        "The HTTP API listens on {listen}: requests need the token in {}",
        herd_cluster::Secrets::api_token_file(layout).display()
    );
    Ok(Some(token))
}

/// Creates (first run) or resumes shard groups 0 to `count` − 1, group 0 first; when one fails,
/// the servers of the groups already started are stopped again.
async fn start_groups(
    layout: &Layout,
    config: &Config,
    pg: &Pg,
    progress: &TermProgress,
    count: u32,
) -> anyhow::Result<Vec<Cluster>> {
    let mut groups: Vec<Cluster> = Vec::new();
    for g in 0..count {
        let layout = layout.for_group(g);
        let started = if layout.state().exists() {
            resume_group(layout, config, pg, progress).await
        } else {
            Cluster::bootstrap(layout, config.clone(), pg, progress)
                .await
                .map_err(anyhow::Error::from)
        };
        match started {
            Ok(cluster) => groups.push(cluster),
            Err(e) => {
                let _ = herd_cluster::stop_groups(&groups, pg, progress).await;
                return Err(e);
            }
        }
    }
    Ok(groups)
}

async fn resume_group(
    layout: Layout,
    config: &Config,
    pg: &Pg,
    progress: &TermProgress,
) -> anyhow::Result<Cluster> {
    let cluster = Cluster::open(layout, config.clone())?;
    cluster.verify_data_dirs()?;
    cluster.check_ports(None)?;
    cluster.start_all(pg, progress).await?;
    Ok(cluster)
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
