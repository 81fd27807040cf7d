//! The cluster as the store shows it, for any process that follows the store (`herd proxy
//! --api-listen`, `herd agent --dashboard-listen`): every group's status rebuilt every second,
//! the agents' events put on a dashboard's timeline once each, and the operator verbs of the
//! HTTP API (switchover, failover, config, restart) carried out through the store like the
//! CLI's `--dcs` verbs.

use std::collections::BTreeSet;
use std::time::Duration;

use herd_agent::store::{Read, StoreClient};
use herd_api::AdminAction;
use herd_core::{ClusterEvent, ClusterStatus};
use tokio::sync::watch;

/// How often the status is rebuilt from the store.
const REFRESH: Duration = Duration::from_secs(1);

/// Every shard group's keys, group 0 first.
pub(crate) async fn read_groups(root: &StoreClient) -> Result<Vec<Read>, String> {
    let count = herd_agent::groups::count(root).await?.unwrap_or(1);
    let mut reads = Vec::new();
    for g in 0..count {
        let store = StoreClient::new(herd_agent::groups::scoped(root.dcs(), g));
        reads.push(store.read().await?);
    }
    Ok(reads)
}

/// The group a verb acts on: `group`, else the group whose member `to` is, else 0.
pub(crate) async fn verb_group(
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

pub(crate) fn group_store(root: &StoreClient, g: u32) -> StoreClient {
    StoreClient::new(herd_agent::groups::scoped(root.dcs(), g))
}

/// Carries out one API action through the store.
pub(crate) async fn dispatch(root: StoreClient, action: AdminAction) -> Result<String, String> {
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

/// The events of `now` (one group's, keyed) not in `seen`, oldest first; `seen` becomes the
/// keys of `now` (events expire from the store, so the set stays as small as the timeline).
pub(crate) fn unseen(
    seen: &mut BTreeSet<String>,
    now: Vec<(String, ClusterEvent)>,
) -> Vec<ClusterEvent> {
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
pub(crate) async fn read_events(
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
pub(crate) async fn follow_status(
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

/// The status of every group from the store, kept current (every [`REFRESH`]) until
/// `shutdown`, the agents' events put on `dashboard`'s timeline meanwhile.
pub(crate) async fn follow(
    root: StoreClient,
    endpoint: String,
    dashboard: herd_api::Dashboard,
    shutdown: watch::Receiver<bool>,
) -> watch::Receiver<ClusterStatus> {
    let first = match read_groups(&root).await {
        Ok(reads) => {
            let stores: Vec<_> = reads.iter().map(|r| r.store.clone()).collect();
            herd_agent::status::cluster_status(&stores, &endpoint)
        }
        Err(_) => herd_agent::status::cluster_status(&[], &endpoint),
    };
    let (status_tx, status_rx) = watch::channel(first);
    tokio::spawn(follow_status(
        root,
        endpoint,
        Some(status_tx),
        dashboard,
        shutdown,
    ));
    status_rx
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
