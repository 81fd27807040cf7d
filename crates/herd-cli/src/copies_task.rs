//! Inside `herd up`: every second, each shard group's copy slots are kept in line on its
//! replicas (herd-copy's slot sync; a replica is restarted through a request in the store to
//! load a copied slot), and every two seconds each copy's status is read for `/status`, `/metrics` and
//! `herd status` (and a table whose initial copy lost its slot in a failover is copied again:
//! `copy_repair`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use herd_cluster::{Cluster, Layout};
use herd_copy::sync::{ReplicaRef, RestartFn, SlotSync};
use herd_core::{ClusterStatus, CopyStatus, NodeState, Role};
use herd_pg::Pg;
use tokio::sync::watch;

/// The copies' latest status, shared with the status document and `/metrics`.
pub type SharedCopies = Arc<Mutex<Vec<CopyStatus>>>;

/// The running groups (an interface, so the task is tested apart from the store).
pub trait Groups: Send + Sync {
    /// Each group's ports, data directories and credentials (index = group).
    fn clusters(&self) -> Vec<Cluster>;
    /// How a replica of group `group` is restarted (it leaves the read pool first).
    fn restart(&self, group: usize) -> RestartFn;
}

/// The groups of `herd up` on the agent engine: read from the store's projections, a
/// replica restarted by a request in the store, as `herd restart --node` asks it.
pub struct StoreGroups {
    /// The data directory.
    pub layout: Layout,
    /// herd.toml as `herd up` started.
    pub config: herd_config::Config,
    /// The store's root.
    pub root: herd_agent::store::StoreClient,
}

impl Groups for StoreGroups {
    fn clusters(&self) -> Vec<Cluster> {
        let count = herd_cluster::existing_groups(&self.layout);
        (0..count)
            .map_while(|g| Cluster::open(self.layout.for_group(g), self.config.clone()).ok())
            .collect()
    }

    fn restart(&self, group: usize) -> RestartFn {
        let store = herd_agent::store::StoreClient::new(herd_agent::groups::scoped(
            self.root.dcs(),
            group as u32,
        ));
        Arc::new(move |node: String| {
            let store = store.clone();
            Box::pin(async move {
                crate::hosts_restart::restart(&store, Some(node))
                    .await
                    .map_err(|e| format!("{e:#}"))
            })
        })
    }
}

/// What the task needs from the rest of `herd up`.
pub struct CopiesLinks {
    /// The cluster's data directory.
    pub layout: Layout,
    /// Every group (ports, data directories, credentials, how a replica restarts).
    pub groups: Arc<dyn Groups>,
    /// The combined status (roles and positions of every node).
    pub status: watch::Receiver<ClusterStatus>,
    /// Where the copies' status goes.
    pub copies: SharedCopies,
    /// Called after the copies' status changed, to republish the status document.
    pub publish: Arc<dyn Fn() + Send + Sync>,
}

/// Runs until `shutdown` turns true.
pub fn spawn(
    links: CopiesLinks,
    pg: Pg,
    mut shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut syncs: Vec<SlotSync> = Vec::new();
        let mut suspects = crate::copy_repair::Suspects::new();
        let mut round: u64 = 0;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = shutdown.changed() => return,
            }
            if *shutdown.borrow() {
                return;
            }
            let status = links.status.borrow().clone();
            // Groups added while the cluster runs join the rounds.
            let running = links.groups.clusters();
            syncs.resize_with(running.len(), SlotSync::default);
            for (g, cluster) in running.iter().enumerate() {
                let Some(group_status) = status.all_groups().get(g).map(|s| (*s).clone()) else {
                    continue;
                };
                let restart = links.groups.restart(g);
                sync_group(&mut syncs[g], &pg, cluster, &group_status, restart).await;
            }
            round += 1;
            if round.is_multiple_of(2) {
                let statuses = match crate::copy::read_statuses(&links.layout).await {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!("reading the copies' status: {e:#}");
                        continue;
                    }
                };
                crate::copy_repair::repair(&links.layout, &statuses, &mut suspects).await;
                let changed = match links.copies.lock() {
                    Ok(mut current) => {
                        let changed = *current != statuses;
                        *current = statuses;
                        changed
                    }
                    Err(_) => false,
                };
                if changed {
                    (links.publish)();
                }
            }
        }
    })
}

/// One slot-sync round for one group: its running primary and streaming replicas.
async fn sync_group(
    sync: &mut SlotSync,
    pg: &Pg,
    cluster: &Cluster,
    status: &ClusterStatus,
    restart: RestartFn,
) {
    let Some(primary) = status.primary() else {
        return;
    };
    let replicas: Vec<ReplicaRef> = status
        .nodes
        .iter()
        .filter(|n| n.role == Role::Replica && n.state == NodeState::Streaming)
        .map(|n| ReplicaRef {
            name: n.name.to_string(),
            conn: cluster.conn_spec(&n.name),
            datadir: cluster.layout.node(&n.name),
        })
        .collect();
    if let Err(e) = sync
        .round(pg, &cluster.conn_spec(&primary.name), &replicas, &restart)
        .await
    {
        tracing::debug!("copy slots of shard group {}: {e}", cluster.group());
    }
}
