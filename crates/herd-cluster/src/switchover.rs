//! Planned change of primary, without losing anything: new transactions pause at the proxy,
//! the target catches up, the old primary shuts down cleanly (its last WAL reaches the target),
//! the target is promoted, and the old primary follows it.

use std::time::{Duration, Instant};

use herd_core::{NodeName, NodeState, Role};
use herd_pg::{Pg, StopMode};

use crate::status::observe;
use crate::{Cluster, ClusterError};

/// How long each wait of a switchover may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(15);

impl Cluster {
    /// Switches the primary to `target` (default: the most advanced streaming replica).
    /// `gate(true)` pauses new transactions at the proxy, `gate(false)` resumes them.
    pub async fn switch_over(
        &mut self,
        pg: &Pg,
        dcs: &dyn herd_dcs::Dcs,
        target: Option<&NodeName>,
        gate: &(dyn Fn(bool) + Send + Sync),
    ) -> Result<NodeName, ClusterError> {
        let status = observe(self).await.status;
        let streaming: Vec<_> = status
            .nodes
            .iter()
            .filter(|n| n.role == Role::Replica && n.state == NodeState::Streaming)
            .collect();
        let chosen = match target {
            Some(t) => streaming.iter().find(|n| &n.name == t).map(|n| n.name.clone()).ok_or_else(|| {
                ClusterError::NotReady(format!("{t} is not a streaming replica; choose one that `herd status` shows streaming"))
            })?,
            None => streaming
                .iter()
                .max_by_key(|n| n.replayed_lsn)
                .map(|n| n.name.clone())
                .ok_or_else(|| ClusterError::NotReady("no replica is streaming".into()))?,
        };
        if status.primary().is_none() {
            return Err(ClusterError::NotReady(
                "the primary is not running; use `herd failover`".into(),
            ));
        }
        gate(true);
        let result = self.switch_paused(pg, dcs, &chosen).await;
        gate(false);
        result?;
        let old = self.state.needs_rewind.last().cloned();
        if let Some(old) = old {
            // The old primary stopped cleanly after the target had its last WAL: it follows at once.
            self.rejoin(pg, dcs, &old).await?;
        }
        Ok(chosen)
    }

    async fn switch_paused(
        &mut self,
        pg: &Pg,
        dcs: &dyn herd_dcs::Dcs,
        target: &NodeName,
    ) -> Result<(), ClusterError> {
        let old = self.state.primary.clone();
        // The target replays everything the primary wrote (in-flight transactions excepted).
        self.wait_for(target, "to catch up with the primary", |s| {
            let primary = s.primary()?.current_lsn?;
            let replayed = s.node(target.as_str())?.replayed_lsn?;
            Some(replayed >= primary)
        })
        .await?;
        let old_dir = self.layout.node(&old);
        pg.stop(&old_dir, StopMode::Fast).await?;
        let checkpoint = pg.latest_checkpoint(&old_dir).await?;
        // The shutdown checkpoint (the last record) must have reached the target.
        self.wait_for(
            target,
            "to receive the old primary's shutdown checkpoint",
            |s| Some(s.node(target.as_str())?.received_lsn? > checkpoint),
        )
        .await?;
        if !self.state.needs_rewind.contains(&old) {
            self.state.needs_rewind.push(old.clone());
        }
        self.promote_replica(pg, dcs, &old, target).await
    }

    async fn wait_for(
        &self,
        target: &NodeName,
        what: &str,
        done: impl Fn(&herd_core::ClusterStatus) -> Option<bool>,
    ) -> Result<(), ClusterError> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            let status = observe(self).await.status;
            if done(&status) == Some(true) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(ClusterError::NotReady(format!(
                    "switchover stopped: {target} did not manage {what} within {} s",
                    STEP_TIMEOUT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
