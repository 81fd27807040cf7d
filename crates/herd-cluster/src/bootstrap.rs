//! Creating a new cluster: initdb the primary, create the replication role and slots, clone
//! each replica with pg_basebackup, start everything.

use herd_config::Config;
use herd_pg::Pg;

use crate::cluster::{REPLICATION_USER, SUPERUSER};
use crate::{Cluster, ClusterError, ClusterState, Layout, Progress, Secrets};

impl Cluster {
    /// Creates a cluster in an empty data directory. `state.json` is written last, so a directory
    /// without it never passes for a usable cluster. On failure the servers started so far are
    /// stopped and the error says how to retry.
    pub async fn bootstrap(
        layout: Layout,
        config: Config,
        pg: &Pg,
        progress: &dyn Progress,
    ) -> Result<Cluster, ClusterError> {
        let group = layout.group();
        // The group's own commit settings (`[group.N]`) over the cluster's.
        let config = config.for_group(group);
        let state = ClusterState::new_group(group, config.cluster.replicas);
        let leftovers = state.nodes.iter().any(|n| {
            std::fs::read_dir(layout.node(n))
                .map(|mut d| d.next().is_some())
                .unwrap_or(false)
        });
        if leftovers {
            return Err(ClusterError::DataDir {
                path: layout.root().to_path_buf(),
                detail: format!(
                    "{} holds node directories of shard group {group} but no {}: an earlier initialisation did not finish. \
                     Remove the data directory to start afresh",
                    layout.nodes().display(),
                    layout.state().display()
                ),
            });
        }
        // One set of passwords for the whole cluster: group 0 makes them, the others share them.
        let secrets = if group == 0 {
            Secrets::generate()
        } else {
            Secrets::load(&layout)?
        };
        let mut cluster = Cluster {
            state,
            layout,
            config,
            secrets,
        };
        // Before anything is written: a taken port fails the run with the directory untouched.
        cluster.check_ports(None)?;
        let layout = &cluster.layout;
        for dir in [
            layout.root().to_path_buf(),
            layout.nodes(),
            layout.logs(),
            layout.run(),
        ] {
            std::fs::create_dir_all(&dir).map_err(|e| ClusterError::io("creating", &dir, e))?;
        }
        if group == 0 {
            cluster.secrets.save(layout, REPLICATION_USER)?;
        }
        pg.hand_over(layout.root())?;
        if let Some(user) = pg.os_user() {
            user.check_access(layout.root())?;
        }
        // No synchronous standby until the replicas exist: commits (CREATE ROLE among them)
        // would otherwise wait for standbys that are not there yet.
        cluster.state.sync_set.clear();
        let created = match cluster.create_nodes(pg, progress).await {
            // Records the sync set and writes state.json: the cluster is complete only now.
            Ok(()) => cluster.apply_commit_settings(pg).await,
            Err(e) => Err(e),
        };
        match created {
            Ok(()) => Ok(cluster),
            Err(e) => {
                // Leave no server of a half-made cluster running.
                let _ = cluster.stop_all(pg, progress).await;
                Err(e)
            }
        }
    }

    async fn create_nodes(&self, pg: &Pg, progress: &dyn Progress) -> Result<(), ClusterError> {
        let primary = &self.state.primary;
        let primary_dir = self.layout.node(primary);
        progress.phase(&format!(
            "initialising primary {primary} (initdb, SCRAM-SHA-256)"
        ));
        pg.initdb(
            &primary_dir,
            SUPERUSER,
            &Secrets::superuser_file(&self.layout),
        )
        .await?;
        progress.done(&format!("primary {primary} initialised"));
        progress.phase(&format!(
            "starting primary {primary} on port {}",
            self.port(primary)
        ));
        self.start_node(pg, primary).await?;
        progress.done(&format!(
            "primary {primary} started on port {}",
            self.port(primary)
        ));

        progress.phase("creating the replication role");
        let client = herd_pg::connect(&self.conn_spec(primary)).await?;
        herd_pg::ensure_role(&client, REPLICATION_USER, &self.secrets.replication, true).await?;
        if self.group() > 0 {
            // One SCRAM proof for every group: the superuser's verifier is group 0's.
            progress.phase("giving the superuser group 0's password verifier");
            let group0 = Cluster {
                layout: self.layout.for_group(0),
                state: crate::ClusterState::load(&self.layout.for_group(0).state())?.ok_or_else(
                    || ClusterError::NotReady("shard group 0 has no topology".into()),
                )?,
                config: self.config.clone(),
                secrets: self.secrets.clone(),
            };
            let source = herd_pg::connect(&group0.conn_spec(&group0.state.primary)).await?;
            herd_pg::copy_verifier(&source, &client, SUPERUSER).await?;
        }
        drop(client);
        progress.done("replication role created");
        self.clone_replicas(pg, progress).await
    }

    /// Makes every replica of the recorded topology from the running primary: a slot each,
    /// then pg_basebackup and start, one after the other. Used by bootstrap and by
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
