//! The status document of `herd up` on the agent engine (issue #39 slice 10): on one host every
//! server is reachable from this process, so each node is probed as `herd status` probes it
//! (postmaster pid, live positions and lag from the primary's `pg_stat_replication`, live
//! `sync_state`, the archiver), over the agents' own probe connections (one monitoring session
//! per server, as under the supervisor engine; a second prober per node made `bench_sharding`'s
//! node0 hold 16 connections where its bound is 15). The member records in
//! the store are published by each agent at its own moment, so a lag computed from two of them
//! compares positions of different instants; probing gives the API and the health checks the
//! same meaning on both engines.
//!
//! The groups and their members come from the store's projections (`state.json`, kept by
//! `herd_agent::host::projection`); `ha_note` is the newest failover, switchover, rejoin or
//! fence event the agents wrote in the store (also left in the file `herd status` reads).

use std::sync::Arc;
use std::time::Duration;

use herd_agent::host::Host;
use herd_agent::store::StoreClient;
use herd_cluster::{Cluster, Layout, Probers};
use herd_config::Config;
use herd_core::{ClusterEvent, ClusterStatus, EventKind};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::copies_task::SharedCopies;

/// The `ha_note` line of a group's events (oldest first): its newest high-availability event,
/// as the supervisor engine writes it (`<unix seconds> <text>`); restarts and read-pool moves
/// are not notes.
pub fn note(events: &[ClusterEvent]) -> Option<String> {
    events
        .iter()
        .rev()
        .find(|e| {
            matches!(
                e.kind,
                EventKind::Failover
                    | EventKind::RefusedFailover
                    | EventKind::Switchover
                    | EventKind::Rejoin
                    | EventKind::Fenced
            )
        })
        .map(|e| format!("{} {}", e.unix_ms / 1000, e.text))
}

/// Keeps `tx` current (every `[supervisor] probe_interval_ms`) until `shutdown`; the copies'
/// latest status is carried into each document.
pub fn spawn(
    host: Arc<Host>,
    layout: Layout,
    config: Config,
    root: StoreClient,
    copies: SharedCopies,
    tx: watch::Sender<ClusterStatus>,
    mut shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let every = Duration::from_millis(config.supervisor.probe_interval_ms.max(100));
        loop {
            if let Some(mut status) = round(&layout, &config, &root, &host).await {
                status.copies = copies.lock().map(|c| c.clone()).unwrap_or_default();
                tx.send_replace(status);
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = shutdown.changed() => return,
            }
            if *shutdown.borrow() {
                return;
            }
        }
    })
}

/// One probe of every group; `None` while no group has a `state.json` yet.
pub async fn round(
    layout: &Layout,
    fallback: &Config,
    root: &StoreClient,
    host: &Host,
) -> Option<ClusterStatus> {
    // herd.toml as `herd config set` left it (the document's commit mode and bounds).
    let config = Config::load(&layout.config()).unwrap_or_else(|_| fallback.clone());
    let count = herd_agent::groups::count(root)
        .await
        .ok()
        .flatten()
        .unwrap_or(config.cluster.shards.max(1)) as usize;
    let shared = host.probers();
    let mut tasks = JoinSet::new();
    for g in 0..count {
        let group = layout.for_group(g as u32);
        let dcs = herd_agent::groups::scoped(root.dcs(), g as u32);
        let events = tokio::task::spawn_blocking(move || herd_agent::events::read(dcs.as_ref()))
            .await
            .ok()
            .and_then(Result::ok);
        if let Some(events) = events {
            let events: Vec<ClusterEvent> = events.into_iter().map(|(_, e)| e).collect();
            write_note(&group, note(&events));
        }
        let Ok(cluster) = Cluster::open(group, config.clone()) else {
            continue;
        };
        let mut mine = Probers::sharing(shared.clone());
        tasks.spawn(async move {
            let observed = herd_cluster::observe_with(&cluster, &mut mine).await;
            (g, observed.status)
        });
    }
    let mut statuses: Vec<Option<ClusterStatus>> = vec![None; count];
    while let Some(joined) = tasks.join_next().await {
        if let Ok((g, status)) = joined {
            statuses[g] = Some(status);
        }
    }
    herd_cluster::combine(statuses.into_iter().flatten().collect())
}

/// Leaves `line` where `herd status` reads the group's note (nothing when unchanged).
fn write_note(group: &Layout, line: Option<String>) {
    let Some(line) = line else { return };
    let path = group.ha_note();
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current.trim() != line {
        if let Err(e) = std::fs::write(&path, format!("{line}\n")) {
            tracing::debug!("writing {}: {e}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(ms: u64, kind: EventKind, text: &str) -> ClusterEvent {
        ClusterEvent {
            unix_ms: ms,
            group: 0,
            kind,
            node: None,
            text: text.into(),
            ok: true,
        }
    }

    #[test]
    fn the_note_is_the_newest_ha_event() {
        let cases: Vec<(Vec<ClusterEvent>, Option<&str>)> = vec![
            (vec![], None),
            (vec![e(5000, EventKind::Restart, "restarted")], None),
            (
                vec![
                    e(1000, EventKind::Failover, "promoted node1"),
                    e(3000, EventKind::JoinedReadPool, "node0 joined"),
                ],
                Some("1 promoted node1"),
            ),
            (
                vec![
                    e(1000, EventKind::Failover, "promoted node1"),
                    e(2500, EventKind::Rejoin, "node0 rejoined as a replica"),
                ],
                Some("2 node0 rejoined as a replica"),
            ),
            (
                vec![e(7000, EventKind::RefusedFailover, "no safe candidate")],
                Some("7 no safe candidate"),
            ),
        ];
        for (events, want) in cases {
            assert_eq!(note(&events).as_deref(), want, "{events:?}");
        }
    }
}
