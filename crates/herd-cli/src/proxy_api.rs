//! `herd proxy --api-listen ADDR`: the HTTP API and live dashboard of `herd up`, served by a
//! multi-host proxy from what the agents publish in the store. `/status` (and the dashboard's
//! topology) is `herd_agent::status::cluster_status` over every shard group, re-read every
//! second; the agents' events in the store (promotions, fences, rejoins, restarts) are its
//! timeline (`store_view.rs`); `/metrics` is this proxy's counters, `/cluster/metrics` every
//! agent's and proxy's (`cluster_scrape.rs`); switchover, failover and `config set` go through the store like the CLI's
//! `--dcs` verbs, restarts too (`hosts_restart`). `POST /groups` admits the next group `herd
//! group add --dcs` recorded (`proxy_group_add.rs`).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use herd_agent::store::StoreClient;
use herd_api::AdminAction;
use herd_cluster::{Layout, Secrets};
use herd_core::ClusterStatus;
use herd_proxy::ProxyContext;
use tokio::sync::watch;

/// Listens on `listen` (`flag` names the option that chose it); beyond 127.0.0.1 every request
/// but the health checks needs the token kept in `layout`'s secrets (created on first use, mode
/// 0600), returned then.
pub(crate) async fn bind(
    listen: SocketAddr,
    layout: &Layout,
    flag: &str,
) -> anyhow::Result<(tokio::net::TcpListener, Option<String>)> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}; choose another {flag}"))?;
    let token = if herd_api::auth::needs_token(listen.ip()) {
        let token = Secrets::ensure_api_token(layout)?;
        eprintln!(
            "The HTTP API listens on {listen}: requests need the token in {}",
            Secrets::api_token_file(layout).display()
        );
        Some(token)
    } else {
        None
    };
    Ok((listener, token))
}

/// Records `key = value` (for every group, or `group`) in herd.toml of `layout`.
fn write_toml(layout: &Layout, group: Option<u32>, key: &str, value: &str) -> anyhow::Result<()> {
    let mut config = herd_config::Config::load(&layout.config())?;
    match group {
        Some(g) => config.set_for_group(g, key, value)?,
        None => config.set(key, value)?,
    };
    std::fs::write(layout.config(), herd_config::render(&config))
        .with_context(|| format!("writing {}", layout.config().display()))
}

/// What `herd up` on the agent engine serves beyond a multi-host proxy's API: its servers are
/// on this host, so the status is probed (`host_status.rs`), `/metrics` adds the copies' and
/// the archiver's figures, the dashboard samples the commit waits and shows bench results.
pub struct Local {
    /// The probed status document.
    pub status: watch::Receiver<ClusterStatus>,
    /// Text appended to the proxy's `/metrics`.
    pub metrics: Arc<dyn Fn() -> String + Send + Sync>,
    /// The dashboard's commit-wait sample.
    pub waits: herd_api::dashboard::WaitsSource,
    /// `[dashboard] bench_results`, when set.
    pub bench_results: Option<std::path::PathBuf>,
    /// `herd group add` (`POST /groups`) in this process.
    pub add_group: AddGroup,
    /// A group restart when the group has no replica (its leader named): in place.
    pub restart_alone: RestartAlone,
}

/// Restarts group `g`'s only server (named) in place.
pub type RestartAlone = Arc<
    dyn Fn(
            u32,
            String,
        )
            -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, String>> + Send>>
        + Send
        + Sync,
>;

/// Adds a shard group, answering with what happened or why not.
pub type AddGroup = Arc<
    dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, String>> + Send>>
        + Send
        + Sync,
>;

/// Takes a restore point across every group (its name), answering with what happened or why
/// not (a multi-host proxy's `POST /restore-point`, `restore_point_hosts.rs`).
pub type TakePoint = Arc<
    dyn Fn(
            String,
        )
            -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, String>> + Send>>
        + Send
        + Sync,
>;

/// Serves the API on `listen` until `shutdown`. Beyond 127.0.0.1 every request but the health
/// checks needs the token kept in `layout`'s secrets (created on first use, mode 0600).
/// `hosts_add_group`: a multi-host proxy's `POST /groups` (without `local`); `hosts_point` its
/// `POST /restore-point`.
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    listen: SocketAddr,
    layout: &Layout,
    root: StoreClient,
    ctx: Arc<ProxyContext>,
    endpoint: String,
    local: Option<Local>,
    hosts_add_group: Option<AddGroup>,
    hosts_point: Option<TakePoint>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let (listener, token) = bind(listen, layout, "--api-listen").await?;
    let dashboard = herd_api::Dashboard::default();
    let point_ctx = ctx.clone();
    let (status_rx, metrics, waits, bench_results, add_group, restart_alone) = match local {
        Some(local) => {
            tokio::spawn(crate::store_view::follow_status(
                root.clone(),
                endpoint,
                None,
                dashboard.clone(),
                shutdown.clone(),
            ));
            let extra = local.metrics;
            let metrics: herd_api::MetricsSource =
                Arc::new(move || format!("{}{}", ctx.render_metrics(), extra()));
            (
                local.status,
                metrics,
                Some(local.waits),
                local.bench_results,
                Some(local.add_group),
                Some(local.restart_alone),
            )
        }
        None => {
            let status_rx = crate::store_view::follow(
                root.clone(),
                endpoint,
                dashboard.clone(),
                shutdown.clone(),
            )
            .await;
            // The primaries' archiving health, which their agents publish (backups on).
            let archiving = status_rx.clone();
            let metrics: herd_api::MetricsSource = Arc::new(move || {
                format!(
                    "{}{}",
                    ctx.render_metrics(),
                    herd_api::archive_metrics(&archiving.borrow())
                )
            });
            (status_rx, metrics, None, None, hosts_add_group, None)
        }
    };
    tokio::spawn(dashboard.clone().run_sampler(
        status_rx.clone(),
        metrics.clone(),
        waits,
        shutdown.clone(),
    ));
    // `herd up` on the agent engine: herd.toml is what the operator edits on one host (and
    // what the next `herd up` records in the store), so a change from the dashboard lands
    // there too, as `herd config set` writes it.
    let token: Option<Arc<str>> = token.map(Into::into);
    let cluster_metrics = crate::cluster_scrape::source(
        root.clone(),
        Some((listen.to_string(), metrics.clone())),
        token.clone(),
    );
    let toml = restart_alone.is_some().then(|| layout.clone());
    let admin: herd_api::AdminSource = Arc::new(move |action| {
        if let (AdminAction::AddGroup, Some(add)) = (&action, &add_group) {
            return add();
        }
        // A multi-host proxy: every registered proxy holds its second phases meanwhile.
        if let (AdminAction::RestorePoint { name }, Some(take)) = (&action, &hosts_point) {
            return take(name.clone());
        }
        // `herd up`: the endpoint in this process holds the second phases of two-phase
        // commits while every group's point is written (the supervisor engine's rule).
        if let (AdminAction::RestorePoint { name }, Some(layout)) = (&action, &toml) {
            let (ctx, layout, name) = (point_ctx.clone(), layout.clone(), name.clone());
            return Box::pin(async move {
                crate::restore_point::take(&ctx, &layout, &name)
                    .await
                    .map_err(|e| format!("{e:#}"))
            });
        }
        if let (AdminAction::SetConfig { key, value, group }, Some(layout)) = (&action, &toml) {
            if let Err(e) = write_toml(layout, *group, key, value) {
                return Box::pin(async move { Err(format!("{e:#}")) });
            }
        }
        if let (AdminAction::Restart { node: None, group }, Some(alone)) = (&action, &restart_alone)
        {
            let (root, alone, g) = (root.clone(), alone.clone(), group.unwrap_or(0));
            return Box::pin(async move {
                match crate::host_restart::lone_leader(&root, g).await? {
                    Some(leader) => alone(g, leader).await,
                    None => crate::store_view::dispatch(root, action).await,
                }
            });
        }
        Box::pin(crate::store_view::dispatch(root.clone(), action))
    });
    let api = herd_api::Api {
        status: status_rx,
        metrics,
        admin,
        dashboard,
        token,
        bench_results,
        cluster_metrics: Some(cluster_metrics),
    };
    spawn(listener, listen, api, shutdown);
    Ok(())
}

/// Serves `api` on `listener` (bound to `listen`) until `shutdown`, in the background.
pub(crate) fn spawn(
    listener: tokio::net::TcpListener,
    listen: SocketAddr,
    api: herd_api::Api,
    mut shutdown: watch::Receiver<bool>,
) {
    tokio::spawn(herd_api::serve(listener, api, async move {
        let _ = shutdown.changed().await;
    }));
    eprintln!("Dashboard and HTTP API on http://{listen}/");
}
