//! Changing the commit mode, the sync quorum and reloadable settings of a running cluster.

use herd_pg::Pg;

use crate::{Cluster, ClusterError};

impl Cluster {
    /// Applies the configured commit mode and sync quorum to every node by reload, no restart.
    /// The sync set is recorded in `state.json` before any server setting changes, so that
    /// failover can always tell which standbys held acknowledged commits.
    pub async fn apply_commit_settings(&mut self, pg: &Pg) -> Result<(), ClusterError> {
        self.state.sync_set = self.state.streaming_replicas();
        self.state.save(&self.layout.state())?;
        self.reload_servers(pg).await
    }

    /// Rewrites every node's `herd.conf` from the configuration and reloads the running servers
    /// (reloadable settings such as `wal_compression`); the recorded sync set is left alone.
    pub async fn reload_servers(&self, pg: &Pg) -> Result<(), ClusterError> {
        let mut order = vec![self.state.primary.clone()];
        order.extend(self.state.replicas());
        for node in &order {
            self.write_conf(pg, node)?;
            if herd_pg::postmaster_pid(&self.layout.node(node))?.is_some() {
                pg.reload(&self.layout.node(node)).await?;
            }
        }
        Ok(())
    }
}
