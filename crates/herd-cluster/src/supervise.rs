//! The supervisor loop: observe every node, let `herd-ha` decide, carry the decisions out.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use herd_config::Config;
use herd_core::{Assignment, ClusterStatus, Lsn, NodeName, NodeState, Role, SyncState};
use herd_ha::{decide, Action, Candidate, FailoverRules, NodeObservation, Policy, PrimaryLoss};
use herd_pg::Pg;
use tokio::sync::watch;

use crate::status::observe;
use crate::{Cluster, ClusterState};

/// Start attempts per node, for the restart backoff.
#[derive(Default)]
struct StartBook {
    failed: BTreeMap<NodeName, u32>,
    last_attempt: BTreeMap<NodeName, Instant>,
}

/// What the supervisor remembers about the primary between rounds.
#[derive(Default)]
struct PrimaryWatch {
    /// Since when the primary has not been serving.
    down_since: Option<Instant>,
    /// Its last observed WAL position.
    last_lsn: Lsn,
    /// The standbys it last reported as synchronous (FIRST k).
    last_sync: Vec<NodeName>,
}

impl PrimaryWatch {
    /// Updates from one observation; returns the loss to decide on, if the primary is down.
    fn observe(&mut self, status: &ClusterStatus, cluster: &Cluster) -> Option<PrimaryLoss> {
        let primary = status.nodes.iter().find(|n| n.role == Role::Primary);
        if let Some(p) = primary.filter(|p| p.state == NodeState::Running) {
            self.down_since = None;
            self.last_lsn = p.current_lsn.unwrap_or(self.last_lsn);
            let sync: Vec<NodeName> = status
                .nodes
                .iter()
                .filter(|n| n.sync_state == Some(SyncState::Sync))
                .map(|n| n.name.clone())
                .collect();
            if !sync.is_empty() {
                self.last_sync = sync;
            }
            return None;
        }
        let since = *self.down_since.get_or_insert_with(Instant::now);
        let candidates = status
            .nodes
            .iter()
            .filter(|n| n.role == Role::Replica && !cluster.state.needs_rewind.contains(&n.name))
            .map(|n| Candidate {
                name: n.name.clone(),
                reachable: matches!(n.state, NodeState::Streaming | NodeState::Disconnected),
                flushed: n.received_lsn,
            })
            .collect();
        Some(PrimaryLoss {
            down_for: since.elapsed(),
            candidates,
            rules: FailoverRules {
                mode: cluster.config.cluster.commit_mode,
                sync: cluster.config.cluster.sync_standbys,
                sync_set: cluster.state.sync_set.clone(),
                last_sync: self.last_sync.clone(),
                primary_lsn: self.last_lsn,
                max_lag_bytes: cluster.config.supervisor.max_lag_on_failover,
                allow_data_loss: false,
            },
        })
    }
}

/// Runs until `shutdown` turns true: every `probe_interval_ms`, observes the nodes, publishes
/// the status on `status_tx` and the roles on `assignment_tx` (for the proxy), and restarts dead servers with backoff. The configuration and
/// topology are re-read from the data directory each round, so `herd config set` is honoured
/// when a server is restarted.
pub async fn supervise(
    mut cluster: Cluster,
    pg: &Pg,
    status_tx: &watch::Sender<ClusterStatus>,
    assignment_tx: &watch::Sender<Assignment>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut book = StartBook::default();
    let mut watch = PrimaryWatch::default();
    let mut reported: BTreeSet<String> = BTreeSet::new();
    loop {
        let interval = Duration::from_millis(cluster.config.supervisor.probe_interval_ms);
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            return;
        }
        refresh(&mut cluster);
        let assignment = cluster.assignment();
        assignment_tx.send_if_modified(|current| {
            let changed = *current != assignment;
            if changed {
                *current = assignment;
            }
            changed
        });
        let observation = observe(&cluster).await;
        let observations: Vec<NodeObservation> = observation
            .status
            .nodes
            .iter()
            .zip(&observation.in_recovery)
            .map(|(n, in_recovery)| NodeObservation {
                name: n.name.clone(),
                role: n.role,
                postmaster_alive: n.pid.is_some(),
                answered_in_recovery: *in_recovery,
                failed_starts: book.failed.get(&n.name).copied().unwrap_or(0),
                since_last_start: book.last_attempt.get(&n.name).map(Instant::elapsed),
                needs_rewind: cluster.state.needs_rewind.contains(&n.name),
            })
            .collect();
        let loss = watch.observe(&observation.status, &cluster);
        let _ = status_tx.send(observation.status);
        let policy = Policy {
            restart_backoff: Duration::from_millis(cluster.config.supervisor.restart_backoff_ms),
            max_restart_backoff: Duration::from_secs(30),
            failover_timeout: Duration::from_millis(cluster.config.supervisor.failover_timeout_ms),
        };
        let decisions = decide(&observations, &policy, loss.as_ref());
        let mut still_reported = BTreeSet::new();
        for d in decisions {
            match d.action {
                Action::Start(node) => {
                    tracing::warn!(node = %node, "restarting: {}", d.reason);
                    book.last_attempt.insert(node.clone(), Instant::now());
                    match cluster.start_node(pg, &node).await {
                        Ok(()) => {
                            book.failed.remove(&node);
                            tracing::info!(node = %node, "restarted; it catches up from its replication slot");
                        }
                        Err(e) => {
                            *book.failed.entry(node.clone()).or_default() += 1;
                            tracing::error!(node = %node, "restart failed: {e}");
                        }
                    }
                }
                Action::Failover(candidate) => {
                    tracing::warn!("failover: {}", d.reason);
                    let started = Instant::now();
                    match cluster.fail_over(pg, &candidate).await {
                        Ok(()) => {
                            watch = PrimaryWatch::default();
                            let _ = assignment_tx.send(cluster.assignment());
                            tracing::warn!(primary = %candidate, "failover done in {:.1} s", started.elapsed().as_secs_f64());
                        }
                        Err(e) => tracing::error!(candidate = %candidate, "failover failed: {e}"),
                    }
                }
                Action::Rejoin(node) => {
                    tracing::warn!(node = %node, "rejoining: {}", d.reason);
                    book.last_attempt.insert(node.clone(), Instant::now());
                    match cluster.rejoin(pg, &node).await {
                        Ok(()) => {
                            book.failed.remove(&node);
                            tracing::info!(node = %node, "rejoined as a replica");
                        }
                        Err(e) => {
                            *book.failed.entry(node.clone()).or_default() += 1;
                            tracing::error!(node = %node, "rejoin failed: {e}");
                        }
                    }
                }
                Action::ReportPrimaryDown(_)
                | Action::ReportWrongRole(_)
                | Action::RefuseFailover => {
                    // Log a condition once when it appears, not on every round.
                    let key = format!("{:?}", d.action);
                    if !reported.contains(&key) {
                        tracing::error!("{}", d.reason);
                    }
                    still_reported.insert(key);
                }
            }
        }
        reported = still_reported;
    }
}

fn refresh(cluster: &mut Cluster) {
    match Config::load(&cluster.layout.config()) {
        Ok(config) => cluster.config = config,
        Err(e) => tracing::warn!("keeping the previous configuration: {e}"),
    }
    match ClusterState::load(&cluster.layout.state()) {
        Ok(Some(state)) => cluster.state = state,
        Ok(None) => tracing::warn!("state.json vanished; keeping the topology in memory"),
        Err(e) => tracing::warn!("keeping the previous topology: {e}"),
    }
}
