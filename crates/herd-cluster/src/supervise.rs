//! The supervisor loop: observe every node, let `herd-ha` decide, carry the decisions out.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use herd_config::Config;
use herd_core::{Assignment, ClusterStatus, NodeName};
use herd_ha::{decide, Action, NodeObservation, Policy};
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
            })
            .collect();
        let _ = status_tx.send(observation.status);
        let policy = Policy {
            restart_backoff: Duration::from_millis(cluster.config.supervisor.restart_backoff_ms),
            max_restart_backoff: Duration::from_secs(30),
        };
        let decisions = decide(&observations, &policy);
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
                Action::ReportPrimaryDown(_) | Action::ReportWrongRole(_) => {
                    // Log a condition once when it appears, not on every round.
                    if !reported.contains(&d.reason) {
                        tracing::error!("{}", d.reason);
                    }
                    still_reported.insert(d.reason);
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
