//! Inside `herd up`: every second, each shard group's copy slots are kept in line on its
//! replicas (herd-copy's slot sync; the group's supervisor restarts a replica to load a copied
//! slot), and every two seconds each copy's status is read for `/status`, `/metrics` and
//! `herd status` (and a table whose initial copy lost its slot in a failover is copied again:
//! `copy_repair`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use herd_cluster::{Cluster, Command, Layout};
use herd_copy::sync::{ReplicaRef, RestartFn, SlotSync};
use herd_core::{ClusterStatus, CopyStatus, NodeName, NodeState, Role};
use herd_pg::Pg;
use tokio::sync::{mpsc, oneshot, watch};

/// The copies' latest status, shared with the status document and `/metrics`.
pub type SharedCopies = Arc<Mutex<Vec<CopyStatus>>>;

/// What the task needs from the rest of `herd up`.
pub struct CopiesLinks {
    /// The cluster's data directory.
    pub layout: Layout,
    /// Every group (ports, data directories, credentials, its supervisor's commands).
    pub groups: Arc<crate::groups::GroupSet>,
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
            let running = links.groups.running();
            syncs.resize_with(running.len(), SlotSync::default);
            for (g, group) in running.iter().enumerate() {
                let Some(group_status) = status.all_groups().get(g).map(|s| (*s).clone()) else {
                    continue;
                };
                sync_group(
                    &mut syncs[g],
                    &pg,
                    &group.cluster,
                    &group_status,
                    &group.commands,
                )
                .await;
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
    commands: &mpsc::Sender<Command>,
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
    let commands = commands.clone();
    let restart: RestartFn = Arc::new(move |node: String| {
        let commands = commands.clone();
        Box::pin(async move {
            let (reply, answer) = oneshot::channel();
            let command = Command::Restart {
                node: Some(NodeName::from_text(&node)),
                reply,
            };
            commands
                .send(command)
                .await
                .map_err(|_| "the supervisor is shutting down".to_string())?;
            answer
                .await
                .map_err(|_| "the supervisor dropped the request".to_string())?
        })
    });
    if let Err(e) = sync
        .round(pg, &cluster.conn_spec(&primary.name), &replicas, &restart)
        .await
    {
        tracing::debug!("copy slots of shard group {}: {e}", cluster.group());
    }
}
