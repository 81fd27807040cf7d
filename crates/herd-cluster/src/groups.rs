//! A cluster of several shard groups: each group is a [`Cluster`] of its own (a primary, its
//! replicas, its sync set and failover) sharing the data directory, the configuration and the
//! passwords. These helpers open, observe and stop them together.

use herd_config::Config;
use herd_core::ClusterStatus;
use herd_pg::Pg;

use crate::{Cluster, ClusterError, Layout, Progress};

/// Opens every shard group of the cluster in `layout` (`cluster.shards` of `config`), group 0
/// first. Fails clearly when a group's topology is missing.
pub fn open_groups(layout: &Layout, config: &Config) -> Result<Vec<Cluster>, ClusterError> {
    (0..config.cluster.shards.max(1))
        .map(|g| Cluster::open(layout.for_group(g), config.clone()))
        .collect()
}

/// How many shard groups of the cluster in `layout` exist (have a topology), counting group 0
/// as existing.
pub fn existing_groups(layout: &Layout) -> u32 {
    let mut g = 1;
    while layout.for_group(g).state().exists() {
        g += 1;
    }
    g
}

/// One status document for every group: group 0's fields at the top, the others in `groups`.
pub fn combine(mut statuses: Vec<ClusterStatus>) -> Option<ClusterStatus> {
    if statuses.is_empty() {
        return None;
    }
    let mut first = statuses.remove(0);
    first.groups = statuses;
    Some(first)
}

/// Observes every group (in parallel) and combines the statuses.
pub async fn observe_groups(groups: &[Cluster]) -> Option<ClusterStatus> {
    let tasks: Vec<_> = groups
        .iter()
        .cloned()
        .map(|g| tokio::spawn(async move { crate::observe(&g).await.status }))
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        // A probe task does not panic; if one did, its group is left out rather than invented.
        if let Ok(s) = t.await {
            all.push(s);
        }
    }
    combine(all)
}

/// Stops the servers of every group; the first failure is reported after all were tried.
pub async fn stop_groups(
    groups: &[Cluster],
    pg: &Pg,
    progress: &dyn Progress,
) -> Result<(), ClusterError> {
    let mut first_error = None;
    for g in groups {
        if let Err(e) = g.stop_all(pg, progress).await {
            first_error = first_error.or(Some(e));
        }
    }
    first_error.map_or(Ok(()), Err)
}
