//! Cloning a group's replicas from its running primary (`herd restore`; a new cluster's nodes
//! are created by their agents).

use herd_pg::Pg;

use crate::cluster::REPLICATION_USER;
use crate::{Cluster, ClusterError, Progress, Secrets};

impl Cluster {
    /// Makes every replica of the recorded topology from the running primary: a slot each,
    /// then pg_basebackup and start, one after the other. Used by
    /// `herd restore` (whose restored primary needs its replicas again).
    pub async fn clone_replicas(
        &self,
        pg: &Pg,
        progress: &dyn Progress,
    ) -> Result<(), ClusterError> {
        let primary = &self.state.primary;
        progress.phase("creating one replication slot per replica");
        let client = herd_pg::connect(&self.conn_spec(primary)).await?;
        for replica in self.state.replicas() {
            herd_pg::create_physical_slot(&client, replica.as_str()).await?;
        }
        drop(client);
        progress.done("replication slots created");
        for replica in self.state.replicas() {
            progress.phase(&format!(
                "cloning replica {replica} from {primary} (pg_basebackup)"
            ));
            pg.basebackup(
                &self.layout.node(&replica),
                &self.host().to_string(),
                self.port(primary),
                REPLICATION_USER,
                replica.as_str(),
                &Secrets::pgpass(&self.layout),
            )
            .await?;
            progress.done(&format!("replica {replica} cloned"));
            progress.phase(&format!(
                "starting replica {replica} on port {}",
                self.port(&replica)
            ));
            self.start_node(pg, &replica).await?;
            progress.done(&format!(
                "replica {replica} started on port {}",
                self.port(&replica)
            ));
        }
        Ok(())
    }
}
