//! `herd proxy --api-listen ADDR`: the HTTP API and live dashboard of `herd up`, served by a
//! multi-host proxy from what the agents publish in the store. `/status` (and the dashboard's
//! topology) is `herd_agent::status::cluster_status` over every shard group, re-read every
//! second; leader changes seen between reads become timeline events; `/metrics` is this
//! proxy's counters; switchover, failover and `config set` go through the store like the CLI's
//! `--dcs` verbs, restarts too (`hosts_restart`). Adding groups is not offered across hosts yet
//! (409 says so).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use herd_agent::store::{Read, StoreClient};
use herd_api::AdminAction;
use herd_cluster::{Layout, Secrets};
use herd_core::{ClusterEvent, ClusterStatus, EventKind};
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
        AdminAction::AddGroup => Err(
            "not offered by a multi-host proxy yet: create every shard group with the cluster \
             (--shard-groups)"
                .into(),
        ),
    }
}

/// Leader changes between two reads, as timeline events.
fn leader_events(before: &[Read], now: &[Read]) -> Vec<ClusterEvent> {
    let mut events = Vec::new();
    for (g, (b, n)) in before.iter().zip(now).enumerate() {
        let (was, is) = (&b.store.leader, &n.store.leader);
        if was == is {
            continue;
        }
        if let Some(new) = is {
            // A pending request in the previous read: the operator asked for it.
            let kind = match &b.store.handover {
                Some(h) if !h.immediate => EventKind::Switchover,
                _ => EventKind::Failover,
            };
            let text = match was {
                Some(old) => format!("{new} leads shard group {g} (was {old})"),
                None => format!("{new} leads shard group {g}"),
            };
            events.push(ClusterEvent::now(
                g as u32,
                kind,
                Some(new.clone()),
                text,
                true,
            ));
        }
    }
    events
}

/// Keeps `tx` current from the store until `shutdown`, recording leader changes.
async fn follow_status(
    root: StoreClient,
    endpoint: String,
    tx: watch::Sender<ClusterStatus>,
    dashboard: herd_api::Dashboard,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut previous: Option<Vec<Read>> = None;
    loop {
        if let Ok(reads) = read_groups(&root).await {
            if let Some(before) = &previous {
                for e in leader_events(before, &reads) {
                    dashboard.record_event(e);
                }
            }
            let stores: Vec<_> = reads.iter().map(|r| r.store.clone()).collect();
            tx.send_replace(herd_agent::status::cluster_status(&stores, &endpoint));
            previous = Some(reads);
        }
        tokio::select! {
            _ = tokio::time::sleep(REFRESH) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// Serves the API on `listen` until `shutdown`. Beyond 127.0.0.1 every request but the health
/// checks needs the token kept in `layout`'s secrets (created on first use, mode 0600).
pub async fn serve(
    listen: SocketAddr,
    layout: &Layout,
    root: StoreClient,
    ctx: Arc<ProxyContext>,
    endpoint: String,
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
    let first = match read_groups(&root).await {
        Ok(reads) => {
            let stores: Vec<_> = reads.iter().map(|r| r.store.clone()).collect();
            herd_agent::status::cluster_status(&stores, &endpoint)
        }
        Err(_) => herd_agent::status::cluster_status(&[], &endpoint),
    };
    let (status_tx, status_rx) = watch::channel(first);
    let dashboard = herd_api::Dashboard::default();
    tokio::spawn(follow_status(
        root.clone(),
        endpoint,
        status_tx,
        dashboard.clone(),
        shutdown.clone(),
    ));
    let metrics: herd_api::MetricsSource = Arc::new(move || ctx.render_metrics());
    tokio::spawn(dashboard.clone().run_sampler(
        status_rx.clone(),
        metrics.clone(),
        None,
        shutdown.clone(),
    ));
    let admin: herd_api::AdminSource = Arc::new(move |action| {
        let root = root.clone();
        Box::pin(dispatch(root, action))
    });
    let api = herd_api::Api {
        status: status_rx,
        metrics,
        admin,
        dashboard,
        token: token.map(Into::into),
        bench_results: None,
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
    use herd_agent::decide::Store;
    use herd_agent::member::{Handover, SyncRecord};

    fn read(leader: Option<&str>, handover: Option<Handover>) -> Read {
        Read {
            store: Store {
                initialized: true,
                leader: leader.map(str::to_string),
                members: Vec::new(),
                sync_set: Vec::new(),
                last_sync: Vec::new(),
                last_leader: None,
                settings: Default::default(),
                handover,
                restarts: Vec::new(),
            },
            initialized: None,
            sync_revision: 0,
            sync: SyncRecord::default(),
            handover_revision: 0,
        }
    }

    #[test]
    fn leader_changes_become_events_of_their_group() {
        let before = [read(Some("a"), None), read(Some("x"), None)];
        let same = [read(Some("a"), None), read(Some("x"), None)];
        assert!(leader_events(&before, &same).is_empty());
        let failed = [read(Some("a"), None), read(Some("y"), None)];
        let e = leader_events(&before, &failed);
        assert_eq!(e.len(), 1);
        assert_eq!((e[0].group, e[0].kind), (1, EventKind::Failover));
        assert_eq!(e[0].text, "y leads shard group 1 (was x)");
        let asked = Handover {
            from: "a".into(),
            ..Handover::default()
        };
        let before = [read(Some("a"), Some(asked)), read(Some("x"), None)];
        let switched = [read(Some("b"), None), read(Some("x"), None)];
        let e = leader_events(&before, &switched);
        assert_eq!((e[0].group, e[0].kind), (0, EventKind::Switchover));
        // No leader now: nothing to say until one leads.
        assert!(leader_events(&switched, &[read(None, None), read(Some("x"), None)]).is_empty());
    }
}
