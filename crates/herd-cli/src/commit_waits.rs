//! The dashboard's commit-wait sample: once a second, while someone watches, which wait events
//! the primary's active client backends are in (`IPC:SyncRep` waits for the standbys,
//! `IO:WALSync` for the local disk), as `herd bench commit-waits` counts them. One kept
//! connection to shard group 0's primary, reopened when the primary changes.

use std::collections::BTreeMap;
use std::sync::Arc;

use herd_api::dashboard::{CommitWaits, WaitsSource};
use herd_cluster::Cluster;
use herd_core::{ClusterStatus, NodeName};
use tokio::sync::{watch, Mutex};

const QUERY: &str = "select coalesce(wait_event_type || ':' || wait_event, 'CPU'), count(*)::int4 \
     from pg_stat_activity where backend_type = 'client backend' and state = 'active' \
     and pid <> pg_backend_pid() group by 1";

/// The sampler's source of commit waits for `cluster` (group 0), following `status`.
pub fn source(cluster: Cluster, status: watch::Receiver<ClusterStatus>) -> WaitsSource {
    let kept: Arc<Mutex<Option<(NodeName, tokio_postgres::Client)>>> = Arc::default();
    Arc::new(move || {
        let (cluster, status, kept) = (cluster.clone(), status.clone(), kept.clone());
        Box::pin(async move {
            let primary = status.borrow().primary()?.name.clone();
            let mut kept = kept.lock().await;
            if kept
                .as_ref()
                .is_none_or(|(n, c)| *n != primary || c.is_closed())
            {
                let mut spec = cluster.conn_spec(&primary);
                spec.timeout = std::time::Duration::from_millis(500);
                *kept = Some((primary, herd_pg::connect(&spec).await.ok()?));
            }
            let client = &kept.as_ref()?.1;
            let rows = tokio::time::timeout(
                std::time::Duration::from_millis(500),
                client.query(QUERY, &[]),
            )
            .await
            .ok()?
            .ok()?;
            let by_event: BTreeMap<String, u32> = rows
                .iter()
                .filter_map(|r| {
                    let name: String = r.try_get(0).ok()?;
                    let count: i32 = r.try_get(1).ok()?;
                    Some((name, count.max(0) as u32))
                })
                .collect();
            Some(CommitWaits { by_event })
        })
    })
}
