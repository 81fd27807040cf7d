//! Restarting servers on purpose: one replica (to load files Herd put in its data directory,
//! such as copied logical slots), or every server of a group so a setting that needs a restart
//! (`wal_level`) takes effect without a surprise: replicas first, then a switchover to one of
//! them, then the former primary (it rejoins with the new setting). With no replica, the
//! primary restarts while new transactions wait at the proxy.

use std::time::{Duration, Instant};

use herd_core::{NodeName, NodeState, Role};
use herd_pg::{Pg, StopMode};

use crate::status::observe;
use crate::{Cluster, ClusterError};

/// How long a restarted server may take to run (and a replica to stream) again.
const RESTART_TIMEOUT: Duration = Duration::from_secs(60);

impl Cluster {
    /// Restarts the replica `node` (stopped fast, started with its configuration rewritten)
    /// and waits until it streams again.
    pub async fn restart_replica(&self, pg: &Pg, node: &NodeName) -> Result<(), ClusterError> {
        if self.state.index(node).is_none() {
            return Err(ClusterError::NotReady(format!(
                "there is no node named {node} in shard group {}",
                self.group()
            )));
        }
        if self.role(node) != Role::Replica {
            return Err(ClusterError::NotReady(format!(
                "{node} is the primary; restart the group instead (a switchover moves the primary away first)"
            )));
        }
        let dir = self.layout.node(node);
        if herd_pg::postmaster_pid(&dir)?.is_some() {
            pg.stop(&dir, StopMode::Fast).await?;
        }
        self.start_node(pg, node).await?;
        self.wait_running(node, NodeState::Streaming).await
    }

    /// Restarts every server of the group, the primary last through a switchover (or, with no
    /// replica, with new transactions paused by `gate`); answers what was done.
    pub async fn restart_all(
        &mut self,
        pg: &Pg,
        dcs: &dyn herd_dcs::Dcs,
        gate: &(dyn Fn(bool) + Send + Sync),
    ) -> Result<String, ClusterError> {
        let started = Instant::now();
        let replicas = self.state.replicas();
        for replica in &replicas {
            self.restart_replica(pg, replica).await?;
        }
        if replicas.is_empty() {
            let primary = self.state.primary.clone();
            let dir = self.layout.node(&primary);
            gate(true);
            let restarted = async {
                pg.stop(&dir, StopMode::Fast).await?;
                self.start_node(pg, &primary).await?;
                self.wait_running(&primary, NodeState::Running).await
            }
            .await;
            gate(false);
            restarted?;
            return Ok(format!(
                "restarted the primary {primary} (no replica to switch over to; new transactions waited) in {:.1} s",
                started.elapsed().as_secs_f64()
            ));
        }
        let old = self.state.primary.clone();
        let new = self.switch_over(pg, dcs, None, gate).await?;
        // The former primary rejoined (restarted) as a replica of `new`.
        self.wait_running(&old, NodeState::Streaming).await?;
        Ok(format!(
            "restarted {} replica(s), switched over from {old} to {new}, restarted {old} as a replica, in {:.1} s",
            replicas.len(),
            started.elapsed().as_secs_f64()
        ))
    }

    /// Waits until `node` is observed in `state`.
    async fn wait_running(&self, node: &NodeName, state: NodeState) -> Result<(), ClusterError> {
        let deadline = Instant::now() + RESTART_TIMEOUT;
        loop {
            let status = observe(self).await.status;
            if status.node(node.as_str()).is_some_and(|n| n.state == state) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(ClusterError::NotReady(format!(
                    "{node} did not become {state:?} within {} s after its restart; see its log in {}",
                    RESTART_TIMEOUT.as_secs(),
                    self.layout.logs().display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
