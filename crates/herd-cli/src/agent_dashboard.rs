//! `herd agent --dashboard-listen ADDR`: the live dashboard and HTTP API of a multi-host proxy
//! (`proxy_api.rs`), served by an agent from the store, so any host of the cluster shows the
//! whole of it: every group's members (`/status`), the agents' events as its timeline,
//! `/cluster/metrics` of every agent and proxy, and the operator verbs that go through the
//! store (switchover, failover, restart, config). Adding a group and restore points hold the
//! proxies' routing and are a proxy's (`herd proxy --api-listen`). The token rules are the
//! proxy's (`herd_api::auth`): beyond 127.0.0.1 every request but the health checks needs the
//! token of the agent's `secrets/api-token`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use herd_agent::store::StoreClient;
use herd_cluster::Layout;
use tokio::sync::watch;

/// The cluster's endpoint as the status document names it: the first registered proxy's
/// address (none registered, or the store slow: empty).
async fn endpoint(root: &StoreClient) -> String {
    let dcs = root.dcs();
    match tokio::time::timeout(Duration::from_secs(2), crate::proxy_registry::listens(&dcs)).await {
        Ok(Ok(listens)) => listens
            .first()
            .map(|l| format!("postgresql://postgres@{l}/postgres"))
            .unwrap_or_default(),
        _ => String::new(),
    }
}

/// Serves the dashboard on `listen` until `shutdown`; `layout` holds the agent's secrets (the
/// token, when one is needed).
pub async fn serve(
    listen: SocketAddr,
    layout: &Layout,
    root: StoreClient,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let (listener, token) = crate::proxy_api::bind(listen, layout, "--dashboard-listen").await?;
    let dashboard = herd_api::Dashboard::default();
    let endpoint = endpoint(&root).await;
    let status =
        crate::store_view::follow(root.clone(), endpoint, dashboard.clone(), shutdown.clone())
            .await;
    // No proxy counters here: the primaries' archiving health (backups on), as a proxy adds.
    let archiving = status.clone();
    let metrics: herd_api::MetricsSource =
        Arc::new(move || herd_api::archive_metrics(&archiving.borrow()));
    tokio::spawn(dashboard.clone().run_sampler(
        status.clone(),
        metrics.clone(),
        None,
        shutdown.clone(),
    ));
    let token: Option<Arc<str>> = token.map(Into::into);
    let cluster_metrics = crate::cluster_scrape::source(root.clone(), None, token.clone());
    let admin: herd_api::AdminSource =
        Arc::new(move |action| Box::pin(crate::store_view::dispatch(root.clone(), action)));
    let api = herd_api::Api {
        status,
        metrics,
        admin,
        dashboard,
        token,
        bench_results: None,
        cluster_metrics: Some(cluster_metrics),
    };
    crate::proxy_api::spawn(listener, listen, api, shutdown);
    Ok(())
}
