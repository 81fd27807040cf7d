//! `herd proxy --api-listen ADDR`: the HTTP API and live dashboard of `herd up`, served by a
//! multi-host proxy from what the agents publish in the store. `/status` (and the dashboard's
//! topology) is `herd_agent::status::cluster_status` over every shard group, re-read every
//! second; the agents' events in the store (promotions, fences, rejoins, restarts) are its
//! timeline; `/metrics` is this
//! proxy's counters; switchover, failover and `config set` go through the store like the CLI's
//! `--dcs` verbs, restarts too (`hosts_restart`). `POST /groups` admits the next group `herd
//! group add --dcs` recorded (`proxy_group_add.rs`).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use herd_agent::store::{Read, StoreClient};
use herd_api::AdminAction;
use herd_cluster::{Layout, Secrets};
use herd_core::{ClusterEvent, ClusterStatus};
use herd_proxy::ProxyContext;
use tokio::sync::watch;

/// How often the status is rebuilt from the store.
const REFRESH: Duration = Duration::from_secs(1);

/// Every shard group's keys, group 0 first.
async fn read_groups(root: &StoreClient) -> Result<Vec<Read>, String> {
    let count = herd_agent::groups::count(root).await?.unwrap_or(1);
    let mut reads = Vec::new();
    for g in 0..count {
        let store = StoreClient::new(herd_agent::groups::scoped(root.dcs(), g));
        reads.push(store.read().await?);
    }
    Ok(reads)
}

/// The group a verb acts on: `group`, else the group whose member `to` is, else 0.
async fn verb_group(
    root: &StoreClient,
    group: Option<u32>,
    to: Option<&str>,
) -> Result<u32, String> {
    if let Some(g) = group {
        return Ok(g);
    }
    let Some(name) = to else { return Ok(0) };
    let reads = read_groups(root).await?;
    Ok(reads
        .iter()
        .position(|r| r.store.members.iter().any(|m| m.name == name))
        .map_or(0, |g| g as u32))
}

fn group_store(root: &StoreClient, g: u32) -> StoreClient {
    StoreClient::new(herd_agent::groups::scoped(root.dcs(), g))
}

/// Carries out one API action through the store.
async fn dispatch(root: StoreClient, action: AdminAction) -> Result<String, String> {
    let text = |e: anyhow::Error| format!("{e:#}");
    match action {
        AdminAction::Switchover { to, group } => {
            let g = verb_group(&root, group, to.as_deref()).await?;
            let (leader, took) =
                crate::hosts_admin::hand_over(&group_store(&root, g), to, false, false)
                    .await
                    .map_err(text)?;
            // The supervisor engine's words (`herd switchover` prints them).
            Ok(format!(
                "switched over to {leader} in {:.1} s (shard group {g})",
                took.as_secs_f64()
            ))
        }
        AdminAction::Failover {
            to,
            allow_data_loss,
            group,
        } => {
            let g = verb_group(&root, group, to.as_deref()).await?;
            let (leader, took) =
                crate::hosts_admin::hand_over(&group_store(&root, g), to, true, allow_data_loss)
                    .await
                    .map_err(text)?;
            Ok(format!(
                "failed over to {leader} in {:.1} s (shard group {g})",
                took.as_secs_f64()
            ))
        }
        AdminAction::SetConfig { key, value, group } => {
            let groups = match group {
                Some(g) => vec![g],
                None => (0..read_groups(&root).await?.len() as u32).collect(),
            };
            for g in &groups {
                crate::hosts_admin::config_set(&group_store(&root, *g), &key, &value)
                    .await
                    .map_err(text)?;
            }
            Ok(format!(
                "{key} = {value} recorded for {} group(s)",
                groups.len()
            ))
        }
        AdminAction::Restart { node, group } => {
            let g = verb_group(&root, group, node.as_deref()).await?;
            crate::hosts_restart::restart(&group_store(&root, g), node)
                .await
                .map_err(text)
        }
        // Served by the `TakePoint` a multi-host proxy gives, or by `herd up`'s own.
        AdminAction::RestorePoint { .. } => {
            Err("restore points are not offered by this endpoint".into())
        }
        // Served by the `AddGroup` the embedding gives (`serve`); never reached without one.
        AdminAction::AddGroup => Err("adding a shard group is not offered here".into()),
    }
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

/// The events of `now` (one group's, keyed) not in `seen`, oldest first; `seen` becomes the
/// keys of `now` (events expire from the store, so the set stays as small as the timeline).
fn unseen(seen: &mut BTreeSet<String>, now: Vec<(String, ClusterEvent)>) -> Vec<ClusterEvent> {
    let keys: BTreeSet<String> = now.iter().map(|(k, _)| k.clone()).collect();
    let fresh = now
        .into_iter()
        .filter(|(k, _)| !seen.contains(k))
        .map(|(_, e)| e)
        .collect();
    *seen = keys;
    fresh
}

/// Every group's events in the store (`None` for a group whose read failed this time).
async fn read_events(
    root: &StoreClient,
    groups: usize,
) -> Vec<Option<Vec<(String, ClusterEvent)>>> {
    let mut all = Vec::new();
    for g in 0..groups {
        let dcs = herd_agent::groups::scoped(root.dcs(), g as u32);
        let events = tokio::task::spawn_blocking(move || herd_agent::events::read(dcs.as_ref()))
            .await
            .ok()
            .and_then(Result::ok);
        all.push(events);
    }
    all
}

/// Keeps `tx` current from the store until `shutdown` (when given: `herd up` on the agent
/// engine probes its servers instead, `host_status.rs`), putting the agents' events on the
/// dashboard's timeline.
async fn follow_status(
    root: StoreClient,
    endpoint: String,
    tx: Option<watch::Sender<ClusterStatus>>,
    dashboard: herd_api::Dashboard,
    mut shutdown: watch::Receiver<bool>,
) {
    // The keys of each group's events already on the timeline.
    let mut seen: Vec<BTreeSet<String>> = Vec::new();
    loop {
        if let Ok(reads) = read_groups(&root).await {
            if let Some(tx) = &tx {
                let stores: Vec<_> = reads.iter().map(|r| r.store.clone()).collect();
                tx.send_replace(herd_agent::status::cluster_status(&stores, &endpoint));
            }
            seen.resize_with(reads.len(), BTreeSet::new);
            for (g, events) in read_events(&root, reads.len())
                .await
                .into_iter()
                .enumerate()
            {
                // A failed read changes nothing: the next one shows what is new since.
                let Some(events) = events else { continue };
                for e in unseen(&mut seen[g], events) {
                    dashboard.record_event(e);
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(REFRESH) => {}
            _ = shutdown.changed() => return,
        }
    }
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
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}; choose another --api-listen"))?;
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
    let dashboard = herd_api::Dashboard::default();
    let point_ctx = ctx.clone();
    let (status_rx, metrics, waits, bench_results, add_group, restart_alone) = match local {
        Some(local) => {
            tokio::spawn(follow_status(
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
            let first = match read_groups(&root).await {
                Ok(reads) => {
                    let stores: Vec<_> = reads.iter().map(|r| r.store.clone()).collect();
                    herd_agent::status::cluster_status(&stores, &endpoint)
                }
                Err(_) => herd_agent::status::cluster_status(&[], &endpoint),
            };
            let (status_tx, status_rx) = watch::channel(first);
            tokio::spawn(follow_status(
                root.clone(),
                endpoint,
                Some(status_tx),
                dashboard.clone(),
                shutdown.clone(),
            ));
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
                    None => dispatch(root, action).await,
                }
            });
        }
        Box::pin(dispatch(root.clone(), action))
    });
    let api = herd_api::Api {
        status: status_rx,
        metrics,
        admin,
        dashboard,
        token: token.map(Into::into),
        bench_results,
    };
    let mut stop = shutdown;
    tokio::spawn(herd_api::serve(listener, api, async move {
        let _ = stop.changed().await;
    }));
    eprintln!("Dashboard and HTTP API on http://{listen}/");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use herd_core::EventKind;

    fn event(ms: u64, text: &str) -> (String, ClusterEvent) {
        let e = ClusterEvent {
            unix_ms: ms,
            group: 1,
            kind: EventKind::Failover,
            node: None,
            text: text.into(),
            ok: true,
        };
        (herd_agent::events::key(&e, "h1"), e)
    }

    #[test]
    fn each_stored_event_reaches_the_timeline_once() {
        let mut seen = BTreeSet::new();
        let texts = |v: Vec<ClusterEvent>| v.into_iter().map(|e| e.text).collect::<Vec<_>>();
        // A proxy started after the events: the history is shown.
        let first = unseen(&mut seen, vec![event(1, "a"), event(2, "b")]);
        assert_eq!(texts(first), ["a", "b"]);
        assert!(unseen(&mut seen, vec![event(1, "a"), event(2, "b")]).is_empty());
        // "a" expired, "c" is new.
        let next = unseen(&mut seen, vec![event(2, "b"), event(3, "c")]);
        assert_eq!(texts(next), ["c"]);
        assert_eq!(seen.len(), 2);
    }
}
