//! `herd up` on the agent engine (the only one since issue #39 slice 11): the nodes are
//! run by one agent each in this process over the store kept in the data directory
//! (`herd_agent::host`), and the endpoint follows that store as `herd proxy` does. The old
//! engine's `state.json` files are kept current from the store, so `herd status`, `herd url`
//! and `herd down` work unchanged.
//!
//! The HTTP API and dashboard are `herd proxy --api-listen`'s (`proxy_api.rs`): status from
//! the agents' member records, operator verbs as requests in the store.
//!
//! A data directory made by the retired supervisor engine is taken over at its first start
//! here (its `state.json` files imported into the store).
//!
//! `herd group add` starts the new group's agents here (`group_add_agents.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use herd_agent::host::{store_path, Host};
use herd_agent::store::StoreClient;
use herd_cluster::{Cluster, Layout, SupervisorLock};
use herd_config::Config;
use herd_core::SupervisorInfo;
use herd_pg::{OsUser, Pg, PgBinaries};
use tokio::sync::watch;

use crate::progress::TermProgress;

/// The environment variable that chooses the engine of `herd up`.
pub const ENGINE_ENV: &str = "HERD_ENGINE";

/// Refuses an engine other than the agents: the per-group supervisor that `HERD_ENGINE=supervisor`
/// chose until issue #39 slice 11 is retired (a directory it made is imported at its first start
/// here, `herd_agent::host::migrate`). `HERD_ENGINE` unset, empty or `agents` is the engine.
pub fn check_engine() -> anyhow::Result<()> {
    match std::env::var(ENGINE_ENV) {
        Err(_) => Ok(()),
        Ok(v) if v.is_empty() || v == "agents" => Ok(()),
        Ok(v) if v == "supervisor" => bail!(
            "{ENGINE_ENV}=supervisor: the supervisor engine was retired (issue #39); `herd up` \
             runs one agent per node and takes over a directory the supervisor made at its \
             first start. Unset {ENGINE_ENV}"
        ),
        Ok(v) => bail!("{ENGINE_ENV}={v:?} is not an engine: unset it (the agents are the engine)"),
    }
}

/// Runs the cluster of `layout` on the agent engine until Ctrl-C / SIGTERM / `herd down`.
pub async fn run(layout: Layout, config: Config) -> anyhow::Result<()> {
    let pg = Pg::new(
        PgBinaries::locate(config.postgres.bindir.as_deref())?,
        OsUser::for_servers(&config.postgres.os_user)?,
    );
    let client_tls = crate::client_tls::load(&config.proxy, layout.root())?;
    let lock = SupervisorLock::acquire(&layout)?;
    crate::up::save_config(&layout, &config)?;
    crate::up::init_logging();
    eprintln!(
        "{} the Herd cluster in {} on the agent engine (PostgreSQL: {})",
        if store_path(&layout).exists() || layout.state().exists() {
            "Resuming"
        } else {
            "Creating"
        },
        layout.root().display(),
        pg.binaries().version()
    );
    let endpoint_addr = (config.network.listen_address, config.network.port);
    let proxy_listener = tokio::net::TcpListener::bind(endpoint_addr)
        .await
        .with_context(|| {
            format!(
                "port {} on {} is already in use (the cluster's endpoint); choose another --port",
                endpoint_addr.1, endpoint_addr.0
            )
        })?;
    // Before anything is created: a taken port fails the run with the directory untouched.
    check_ports(&layout, &config)?;
    // A resumed group's nodes must hold their data directories (Herd does not re-initialise).
    for g in 0..config.cluster.shards.max(1) {
        let group = layout.for_group(g);
        if group.state().exists() {
            Cluster::open(group, config.clone())?.verify_data_dirs()?;
        }
    }
    if config.backup.is_enabled() {
        // Before the servers start: their archive_command reads this configuration.
        crate::backup_setup::write_config(&layout, &config, pg.os_user())?;
    }
    // Groups beyond those that exist (a larger --shards) are created with the others but
    // admitted to the endpoint once it runs, as `herd group add` does, so they receive what
    // the others share before clients use them.
    let shards = config.cluster.shards.max(1);
    let existing = if store_path(&layout).exists() || layout.state().exists() {
        herd_cluster::existing_groups(&layout).clamp(1, shards)
    } else {
        shards
    };
    if !matches!(config.proxy.server_tls.as_str(), "auto" | "off") {
        anyhow::bail!(
            "proxy.server_tls = {:?} is for `herd proxy` in front of agents on several hosts: \
             `herd up`'s servers listen on loopback and Unix sockets only and serve no TLS; \
             leave it at \"auto\" (or \"off\")",
            config.proxy.server_tls
        );
    }
    let host = Arc::new(Host::start(layout.clone(), config.clone(), pg.clone()).await?);
    let root = StoreClient::new(host.root());
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut receivers = Vec::new();
    let mut followers = Vec::new();
    for g in 0..existing {
        let (rx, follower) = crate::proxy_groups::group(&root, g).await;
        receivers.push(rx);
        followers.push(follower);
    }
    let mut receivers_ready = receivers.clone();
    let login = herd_proxy::monitor::AdminLogin {
        user: herd_cluster::SUPERUSER.into(),
        password: host.secrets().superuser.into(),
        // `herd up`'s servers never serve TLS (loopback, Unix sockets).
        tls: None,
    };
    let proxy = herd_proxy::Proxy::start(
        config.proxy.clone(),
        receivers,
        login,
        proxy_listener,
        client_tls,
        shutdown_rx.clone(),
    );
    crate::secrets_cmd::follow_rotations(layout.clone(), proxy.ctx.clone(), shutdown_rx.clone());
    let holds = crate::proxy_groups::Holds::new(proxy.ctx.clone());
    for follower in followers {
        crate::proxy_groups::spawn(follower, &holds, shutdown_rx.clone());
    }
    let timeout = Duration::from_secs(config.supervisor.ready_timeout_s);
    let began = Instant::now();
    let mut ready = wait_ready(&layout, &config, &host, timeout).await;
    if ready.is_ok() {
        // The endpoint routes once it follows each group's leader: a group without replicas
        // is ready (its server runs) before its node took the lease.
        let left = timeout.saturating_sub(began.elapsed());
        for (g, rx) in receivers_ready.iter_mut().enumerate() {
            if let Err(e) = leads(rx, left).await {
                ready = Err(e.context(format!("shard group {g}")));
                break;
            }
        }
    }
    let clusters = match ready {
        Ok(c) => c,
        Err(e) => {
            let _ = shutdown_tx.send(true);
            let _ = host.stop().await;
            return Err(e).context("the servers were stopped again");
        }
    };
    if config.backup.is_enabled() {
        eprintln!("creating the pgBackRest stanzas (WAL archiving)");
        match crate::backup_setup::create_stanzas(&layout, &config, pg.os_user()) {
            Ok(()) => eprintln!("WAL archiving to the backup repository is on"),
            // The cluster serves without it; `herd backup` creates the stanzas again.
            Err(e) => eprintln!(
                "warning: {e:#}\n(WAL archiving fails until this is fixed; `herd backup` tries again)"
            ),
        }
    }
    // The HTTP API and dashboard as `herd proxy --api-listen` serves them (switchover,
    // failover, config and restarts as requests in the store), with the status probed from
    // this host (`host_status.rs`) and the copies' slots kept (`copies_task.rs`).
    let copies: crate::copies_task::SharedCopies = Default::default();
    let endpoint = format!(
        "postgresql://postgres@{}:{}/postgres",
        config.network.listen_address, config.network.port
    );
    let first = herd_cluster::observe_groups(&clusters).await;
    let (status_tx, status_rx) = watch::channel(
        first
            .clone()
            .unwrap_or_else(|| herd_agent::status::cluster_status(&[], &endpoint)),
    );
    let status_task = crate::host_status::spawn(
        host.clone(),
        layout.clone(),
        config.clone(),
        root.clone(),
        copies.clone(),
        status_tx,
        shutdown_rx.clone(),
    );
    // Copies' slots on the replicas, their status and re-sync, as under the supervisor engine.
    let copies_links = crate::copies_task::CopiesLinks {
        layout: layout.clone(),
        groups: Arc::new(crate::copies_task::StoreGroups {
            layout: layout.clone(),
            config: config.clone(),
            root: root.clone(),
        }),
        status: status_rx.clone(),
        copies: copies.clone(),
        // The status task carries the copies' latest status into each document.
        publish: Arc::new(|| {}),
    };
    let copies_task = crate::copies_task::spawn(copies_links, pg.clone(), shutdown_rx.clone());
    let (metric_copies, archive_status) = (copies.clone(), status_rx.clone());
    let local = crate::proxy_api::Local {
        status: status_rx.clone(),
        metrics: std::sync::Arc::new(move || {
            let mut text = String::new();
            if let Ok(c) = metric_copies.lock() {
                text.push_str(&herd_copy::status::render_metrics(&c));
            }
            text.push_str(&herd_api::archive_metrics(&archive_status.borrow()));
            text
        }),
        waits: crate::commit_waits::source(clusters[0].clone(), status_rx.clone()),
        bench_results: (!config.dashboard.bench_results.is_empty())
            .then(|| layout.root().join(&config.dashboard.bench_results)),
        add_group: Arc::new(|| Box::pin(async { Err("the cluster is still starting".into()) })),
        restart_alone: {
            let (layout, pg, ctx) = (layout.clone(), pg.clone(), proxy.ctx.clone());
            Arc::new(move |g, leader| {
                let (layout, pg, ctx) = (layout.clone(), pg.clone(), ctx.clone());
                Box::pin(async move {
                    crate::host_restart::restart(&layout, &pg, &ctx, g, &leader)
                        .await
                        .map_err(|e| format!("{e:#}"))
                })
            })
        },
    };
    let agent_groups = Arc::new(crate::group_add_agents::AgentGroups {
        host: host.clone(),
        layout: layout.clone(),
        root: root.clone(),
        ctx: proxy.ctx.clone(),
        holds: holds.clone(),
        shutdown: shutdown_rx.clone(),
        adding: tokio::sync::Mutex::default(),
        owner: pg.os_user().cloned(),
    });
    let adder = agent_groups.clone();
    let local = crate::proxy_api::Local {
        add_group: Arc::new(move || {
            let adder = adder.clone();
            Box::pin(async move { adder.add().await.map_err(|e| format!("{e:#}")) })
        }),
        ..local
    };
    let api_addr = std::net::SocketAddr::new(config.network.listen_address, config.api_port());
    if let Err(e) = crate::proxy_api::serve(
        api_addr,
        &layout,
        root.clone(),
        proxy.ctx.clone(),
        endpoint,
        Some(local),
        None,
        None,
        shutdown_rx.clone(),
    )
    .await
    {
        let _ = shutdown_tx.send(true);
        let _ = host.stop().await;
        return Err(e).context(
            "Herd's HTTP API (choose another --api-port); the servers were stopped again",
        );
    }
    if let Some(first) = first {
        crate::output::emit!("{}", crate::status::summary(&clusters[0], &first));
    }
    for g in existing..shards {
        let _one_at_a_time = agent_groups.adding.lock().await;
        if let Err(e) = agent_groups.follow(g, timeout).await {
            eprintln!(
                "warning: {e:#}\n(the cluster runs without it; `herd group add` tries again)"
            );
            break;
        }
        let cluster = &clusters[g as usize];
        let servers = (
            cluster.port(&cluster.state.primary),
            cluster.state.replicas().len(),
        );
        match agent_groups.admit(g, Some(servers)).await {
            Ok(text) => eprintln!("{text}"),
            Err(e) => {
                eprintln!(
                    "warning: {e:#}\n(the cluster runs without it; `herd group add` tries again)"
                );
                break;
            }
        }
    }
    // Scheduled backups (`[backup] full_every_s`, `incr_every_s`), with their restore points
    // across groups taken behind this process's endpoint, as on the supervisor engine.
    let schedule_links = crate::backup_schedule::ScheduleLinks {
        layout: layout.clone(),
        owner: pg.os_user().cloned(),
        proxy: proxy.ctx.clone(),
        status: status_rx.clone(),
    };
    let scheduled = crate::backup_schedule::spawn(schedule_links, &config, shutdown_rx.clone());
    lock.publish(&SupervisorInfo {
        pid: std::process::id(),
        api_port: config.api_port(),
    })?;
    tracing::info!("the agents run the cluster; Ctrl-C or `herd down` stops it");
    let outcome = tokio::select! {
        signal = crate::up::wait_for_signal() => signal,
        failed = agent_failure(&host) => Err(anyhow::anyhow!(failed)),
    };
    tracing::info!("shutting down");
    let _ = shutdown_tx.send(true);
    let _ = status_task.await;
    let _ = copies_task.await;
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
    host.stop().await?;
    drop(lock);
    eprintln!("Cluster stopped; `herd up` resumes it with its data.");
    outcome
}

/// Fails when a port a node or the HTTP API needs is taken by something other than this
/// cluster's own servers (the supervisor engine's `check_ports`).
fn check_ports(layout: &Layout, config: &Config) -> anyhow::Result<()> {
    let listen = config.network.listen_address;
    let host = if listen.is_unspecified() {
        std::net::IpAddr::from([127, 0, 0, 1])
    } else {
        listen
    };
    let free = |port: u16, what: String| -> anyhow::Result<()> {
        match std::net::TcpListener::bind((host, port)) {
            Ok(_) => Ok(()),
            Err(_) => Err(herd_cluster::ClusterError::PortInUse {
                port,
                address: host.to_string(),
                what,
            }
            .into()),
        }
    };
    for node in herd_agent::host::local_nodes(config) {
        let running = herd_pg::postmaster_pid(&layout.node(&node.name))
            .ok()
            .flatten()
            .is_some();
        if !running {
            free(
                config.group_node_port(node.group, node.index),
                format!("node {}", node.name),
            )?;
        }
    }
    free(config.api_port(), "Herd's HTTP API".into())
}

/// Waits (within `timeout`) until `rx` names a primary that serves.
pub async fn leads(
    rx: &mut watch::Receiver<Option<herd_core::Assignment>>,
    timeout: Duration,
) -> anyhow::Result<()> {
    let serving = |a: &Option<herd_core::Assignment>| a.as_ref().is_some_and(|a| !a.primary_down);
    match tokio::time::timeout(timeout, rx.wait_for(serving)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(_)) => bail!("the endpoint stopped following the store"),
        Err(_) => bail!(
            "no member took the lead within {} s (see the log above)",
            timeout.as_secs()
        ),
    }
}

/// Resolves when an agent stopped on its own.
async fn agent_failure(host: &Host) -> String {
    loop {
        if let Some(f) = host.failed() {
            return format!("{f}; stopping the cluster (see the log above)");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Waits until every group has a primary and its replicas stream from it (as the old engine's
/// `herd up` does before it prints the summary); the groups' clusters as the readers see them.
async fn wait_ready(
    layout: &Layout,
    config: &Config,
    host: &Host,
    timeout: Duration,
) -> anyhow::Result<Vec<Cluster>> {
    let progress = TermProgress::new();
    let deadline = Instant::now() + timeout;
    let mut clusters = Vec::new();
    for g in 0..config.cluster.shards.max(1) {
        let group = layout.for_group(g);
        while !group.state().exists() {
            if let Some(f) = host.failed() {
                bail!("{f} before group {g} had a primary (see the log above)");
            }
            if Instant::now() >= deadline {
                bail!(
                    "group {g} had no primary after {} s; see the server logs in {}",
                    timeout.as_secs(),
                    layout.logs().display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let cluster = Cluster::open(group, config.clone())?;
        let left = deadline.saturating_duration_since(Instant::now());
        cluster.wait_ready(left, &progress).await?;
        clusters.push(cluster);
    }
    Ok(clusters)
}
