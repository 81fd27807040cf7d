//! Replacing a lost primary, and bringing the former one back as a replica.

use herd_core::NodeName;
use herd_pg::Pg;

use crate::cluster::SUPERUSER;
use crate::{Cluster, ClusterError, Secrets};

impl Cluster {
    /// Fences the current primary, records the new topology, promotes `candidate`, and points
    /// every other replica at it. The caller has proved that `candidate` holds every
    /// acknowledged commit (`herd_ha::choose_candidate`).
    pub async fn fail_over(
        &mut self,
        pg: &Pg,
        dcs: &dyn herd_dcs::Dcs,
        candidate: &NodeName,
    ) -> Result<(), ClusterError> {
        let old = self.state.primary.clone();
        // 1. Fencing first: every process of the old primary is killed, so it cannot accept a
        //    write once another node does (also when it was only frozen).
        herd_pg::kill_server(&self.layout.node(&old))?;
        self.promote_replica(pg, dcs, &old, candidate).await
    }

    /// Makes `candidate` the primary in place of the (stopped) `old` one: the topology is
    /// recorded first, then the promotion, the slots and the other replicas' configuration.
    pub(crate) async fn promote_replica(
        &mut self,
        pg: &Pg,
        dcs: &dyn herd_dcs::Dcs,
        old: &NodeName,
        candidate: &NodeName,
    ) -> Result<(), ClusterError> {
        let old = old.clone();
        // 2. Record the new topology before any server changes (state.json is the embedded DCS).
        self.state.primary = candidate.clone();
        if !self.state.needs_rewind.contains(&old) {
            self.state.needs_rewind.push(old.clone());
        }
        self.state.sync_set = self.state.streaming_replicas();
        self.state.record(dcs)?;
        self.state.save(&self.layout.state())?;
        // 3. Promote.
        let dir = self.layout.node(candidate);
        pg.promote(&dir).await?;
        self.archive_previous_timeline(pg, &dir);
        self.write_conf(pg, candidate)?;
        pg.reload(&dir).await?;
        // 4. Slots on the new primary for every other node, then repoint the replicas. The
        //    checkpoint writes the new timeline to pg_control, which pg_rewind reads later.
        let client = herd_pg::connect(&self.conn_spec(candidate)).await?;
        herd_pg::checkpoint(&client).await?;
        for node in self.state.nodes.iter().filter(|n| *n != candidate) {
            herd_pg::create_physical_slot(&client, node.as_str()).await?;
        }
        drop(client);
        for replica in self.state.streaming_replicas() {
            self.write_conf(pg, &replica)?;
            if herd_pg::postmaster_pid(&self.layout.node(&replica))?.is_some() {
                pg.reload(&self.layout.node(&replica)).await?;
            }
        }
        Ok(())
    }

    /// With backups on: pushes the previous timeline's completed segments the new primary
    /// holds, which the old primary may have died before archiving (herd-backup's backfill).
    /// Listed now, before the checkpoint below may recycle them (`wal_keep_size` keeps them a
    /// while longer), and pushed off the failover's path on a thread of their own; a failure
    /// is logged, and `herd status` reports an archive that falls behind.
    fn archive_previous_timeline(&self, pg: &Pg, dir: &std::path::Path) {
        if !self.config.backup.is_enabled() {
            return;
        }
        let segments = match herd_backup::previous_timeline_segments(&dir.join("pg_wal")) {
            Ok(s) if s.is_empty() => return,
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("cannot list the previous timeline's WAL to archive: {e}");
                return;
            }
        };
        let runner = self.backup_runner(pg);
        let (group, dir) = (self.group(), dir.to_path_buf());
        std::thread::spawn(move || {
            match herd_backup::push_segments(&runner, group, &dir, &segments) {
                Ok(n) => tracing::info!(
                    "archived the previous timeline's {n} segment(s) the new primary holds"
                ),
                Err(e) => tracing::warn!("archiving the previous timeline's WAL: {e}"),
            }
        });
    }

    /// pgBackRest with the cluster's configuration, as the servers' OS user (`archive-push`
    /// connects to no server: no password).
    fn backup_runner(&self, pg: &Pg) -> herd_backup::Runner {
        herd_backup::Runner {
            config: herd_backup::Paths::new(self.layout.root()).config(),
            owner: pg.os_user().cloned(),
            password: None,
        }
    }

    /// With backups on, before a former primary is rewound: pushes the segments before the
    /// switch to the new timeline that it never archived (still `.ready`), which the new
    /// primary may have recycled already. Failures are logged; the rejoin goes on.
    async fn archive_former_primary(&self, pg: &Pg, dir: &std::path::Path, primary: &NodeName) {
        if !self.config.backup.is_enabled() {
            return;
        }
        let wal = self.layout.node(primary).join("pg_wal");
        let listed = herd_backup::newest_history(&wal).and_then(|h| match h {
            Some(h) => herd_backup::segments_before_switch(&dir.join("pg_wal"), &h, true),
            None => Ok(Vec::new()),
        });
        let segments = match listed {
            Ok(s) if s.is_empty() => return,
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("cannot list the former primary's WAL to archive: {e}");
                return;
            }
        };
        let runner = self.backup_runner(pg);
        let (group, dir) = (self.group(), dir.to_path_buf());
        let pushed = tokio::task::spawn_blocking(move || {
            herd_backup::push_segments(&runner, group, &dir, &segments)
        })
        .await;
        match pushed {
            Ok(Ok(n)) => tracing::info!(
                "archived {n} WAL segment(s) the former primary had not, before rewinding it"
            ),
            Ok(Err(e)) => tracing::warn!("archiving the former primary's WAL: {e}"),
            Err(e) => tracing::warn!("archiving the former primary's WAL: {e}"),
        }
    }

    /// Brings a former primary back as a replica of the current primary: pg_rewind onto the new
    /// timeline, or, when that fails, a fresh clone (the old directory is kept aside). Once it
    /// runs, it joins the recorded sync set, then `synchronous_standby_names`.
    pub async fn rejoin(
        &mut self,
        pg: &Pg,
        dcs: &dyn herd_dcs::Dcs,
        node: &NodeName,
    ) -> Result<(), ClusterError> {
        let dir = self.layout.node(node);
        herd_pg::kill_server(&dir)?;
        let primary = self.state.primary.clone();
        // Already a standby when it stopped (rewound or cloned by an earlier, interrupted
        // rejoin): it follows as it is; nothing of its own to rewind.
        let was_standby = pg.was_in_recovery(&dir).await.unwrap_or(false);
        if was_standby {
            tracing::info!(node = %node, "it stopped as a standby: starting it to follow without pg_rewind");
            return self.finish_rejoin(pg, dcs, node, &primary).await;
        }
        herd_pg::clear_recovery_signals(&dir)?;
        self.archive_former_primary(pg, &dir, &primary).await;
        // pg_rewind compares timelines in pg_control: make sure the primary's is written.
        let client = herd_pg::connect(&self.conn_spec(&primary)).await?;
        herd_pg::checkpoint(&client).await?;
        drop(client);
        let source = format!(
            "host={} port={} user={SUPERUSER} dbname=postgres",
            self.host(),
            self.port(&primary)
        );
        if let Err(e) = pg.rewind(&dir, &source, &self.secrets.superuser).await {
            tracing::warn!(node = %node, "pg_rewind failed ({e}); cloning the node afresh");
            let aside = dir.with_extension(format!("failed-{}", std::process::id()));
            std::fs::rename(&dir, &aside).map_err(|e| ClusterError::io("moving aside", &dir, e))?;
            pg.basebackup(
                &dir,
                &self.host().to_string(),
                self.port(&primary),
                crate::REPLICATION_USER,
                node.as_str(),
                &Secrets::pgpass(&self.layout),
            )
            .await?;
        }
        self.finish_rejoin(pg, dcs, node, &primary).await
    }

    /// Starts a rejoining node as a replica and adds it back to the sync set.
    async fn finish_rejoin(
        &mut self,
        pg: &Pg,
        dcs: &dyn herd_dcs::Dcs,
        node: &NodeName,
        primary: &NodeName,
    ) -> Result<(), ClusterError> {
        self.start_node(pg, node).await?;
        self.state.needs_rewind.retain(|n| n != node);
        self.state.sync_set = self.state.streaming_replicas();
        self.state.record(dcs)?;
        self.state.save(&self.layout.state())?;
        self.write_conf(pg, primary)?;
        pg.reload(&self.layout.node(primary)).await?;
        Ok(())
    }
}
