//! The agent's own PostgreSQL: probing it and every change of its role. All programs run
//! through `herd-pg`.

use std::net::IpAddr;
use std::time::Duration;

use herd_cluster::{Layout, Secrets, REPLICATION_USER, SUPERUSER};
use herd_core::Lsn;
use herd_pg::{ConnSpec, Pg, PrimaryProbe, Probe, ServerSettings, Upstream};

use crate::config::AgentConfig;
use crate::decide::Local;
use crate::member::Member;
use crate::AgentError;

/// What a probe of the local server found.
#[derive(Clone, Debug)]
pub struct Observed {
    /// The node's state for [`crate::decide::decide`].
    pub local: Local,
    /// As a primary: its position and walsenders.
    pub primary: Option<PrimaryProbe>,
    /// As a replica: its replayed position.
    pub replayed: Option<Lsn>,
}

/// The agent's node.
pub struct Node {
    /// The agent's configuration.
    pub cfg: AgentConfig,
    /// PostgreSQL's programs.
    pub pg: Pg,
    /// Paths of secrets and logs.
    pub layout: Layout,
    /// The cluster's passwords.
    pub secrets: Secrets,
    /// The member the server was last configured to stream from.
    pub upstream: Option<String>,
    /// `synchronous_standby_names` and `synchronous_commit` last written as primary.
    pub primary_settings: (String, String),
}

impl Node {
    /// How the agent reaches its own server as the superuser.
    pub fn spec(&self) -> ConnSpec {
        let host = if self.cfg.pg_listen.is_unspecified() {
            IpAddr::from([127, 0, 0, 1])
        } else {
            self.cfg.pg_listen
        };
        ConnSpec {
            host: host.to_string(),
            port: self.cfg.pg_port,
            user: SUPERUSER.into(),
            password: self.secrets.superuser.clone(),
            dbname: "postgres".into(),
            timeout: Duration::from_secs(2),
        }
    }

    /// Probes the local server.
    pub async fn observe(&self) -> Observed {
        let dir = self.cfg.pgdata();
        let none = |local| Observed {
            local,
            primary: None,
            replayed: None,
        };
        if !dir.join("PG_VERSION").exists() {
            return none(Local::Empty);
        }
        match herd_pg::postmaster_pid(&dir) {
            Ok(Some(_)) => {}
            _ => return none(Local::Stopped),
        }
        match herd_pg::probe(&self.spec()).await {
            Ok(Probe::Primary(p)) => Observed {
                local: Local::Primary,
                primary: Some(p),
                replayed: None,
            },
            Ok(Probe::Replica(r)) => Observed {
                local: Local::Replica {
                    upstream: self.upstream.clone(),
                    streaming: r.receiver_status.as_deref() == Some("streaming"),
                    lsn: r.received_lsn.max(r.replayed_lsn),
                },
                primary: None,
                replayed: r.replayed_lsn,
            },
            Err(e) => {
                tracing::debug!("probe of the local server failed: {e}");
                none(Local::NotAnswering)
            }
        }
    }

    /// The server settings with `upstream` (a replica) or as primary.
    fn settings(&self, upstream: Option<&Member>) -> ServerSettings {
        let pg = &self.cfg.postgres;
        let (names, commit) = self.primary_settings.clone();
        ServerSettings {
            listen_address: self.cfg.pg_listen,
            port: self.cfg.pg_port,
            socket_dir: None,
            shared_buffers: pg.shared_buffers.clone(),
            max_connections: pg.max_connections,
            work_mem: pg.work_mem.clone(),
            max_slot_wal_keep_size: pg.max_slot_wal_keep_size.clone(),
            wal_level: pg.wal_level.clone(),
            wal_compression: pg.wal_compression.clone(),
            synchronous_commit: commit,
            synchronous_standby_names: names,
            upstream: upstream.map(|m| Upstream {
                conninfo: format!(
                    "host={} port={} user={REPLICATION_USER} passfile='{}' application_name={} connect_timeout=5",
                    m.pg_host,
                    m.pg_port,
                    Secrets::pgpass(&self.layout).display(),
                    self.cfg.name,
                ),
                slot: self.cfg.name.clone(),
            }),
        }
    }

    fn write_conf(&mut self, upstream: Option<&Member>) -> Result<(), AgentError> {
        let dir = self.cfg.pgdata();
        let hba = herd_pg::render_hba(self.cfg.pg_listen, REPLICATION_USER);
        herd_pg::write_node_conf(&dir, &self.settings(upstream), &hba)?;
        for file in [
            herd_pg::HERD_CONF,
            "pg_hba.conf",
            "postgresql.conf",
            "standby.signal",
        ] {
            let path = dir.join(file);
            if path.exists() {
                self.pg.hand_over(&path)?;
            }
        }
        self.upstream = upstream.map(|m| m.name.clone());
        Ok(())
    }

    fn mark_primary(&self, yes: bool) -> Result<(), AgentError> {
        let path = self.cfg.was_primary_file();
        let result = if yes {
            std::fs::write(&path, "")
        } else {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                other => other,
            }
        };
        result.map_err(|e| AgentError::Io(format!("{}: {e}", path.display())))
    }

    /// Whether the node ran as primary since it last rejoined.
    pub fn was_primary(&self) -> bool {
        self.cfg.was_primary_file().exists()
    }

    /// A new cluster: initdb, start as primary, create the replication role.
    pub async fn initialize(&mut self) -> Result<(), AgentError> {
        let dir = self.cfg.pgdata();
        self.mark_primary(true)?;
        self.pg
            .initdb(&dir, SUPERUSER, &Secrets::superuser_file(&self.layout))
            .await?;
        self.start_primary().await?;
        let client = herd_pg::connect(&self.spec()).await?;
        herd_pg::ensure_role(&client, REPLICATION_USER, &self.secrets.replication, true).await?;
        Ok(())
    }

    /// Clones `leader` and starts following it. A partial copy is removed on failure.
    pub async fn clone_from(&mut self, leader: &Member) -> Result<(), AgentError> {
        let dir = self.cfg.pgdata();
        let result = self
            .pg
            .basebackup(
                &dir,
                &leader.pg_host,
                leader.pg_port,
                REPLICATION_USER,
                &self.cfg.name,
                &Secrets::pgpass(&self.layout),
            )
            .await;
        if let Err(e) = result {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e.into());
        }
        self.mark_primary(false)?;
        self.start_replica(Some(leader)).await
    }

    /// Starts the stopped server as primary.
    pub async fn start_primary(&mut self) -> Result<(), AgentError> {
        self.write_conf(None)?;
        self.pg
            .start(&self.cfg.pgdata(), &self.cfg.pg_log())
            .await?;
        Ok(())
    }

    /// Starts the stopped server in recovery, following `upstream` when there is one.
    pub async fn start_replica(&mut self, upstream: Option<&Member>) -> Result<(), AgentError> {
        self.write_conf(upstream)?;
        herd_pg::write_private(&self.cfg.pgdata().join("standby.signal"), "")
            .map_err(|e| AgentError::Io(e.to_string()))?;
        self.pg
            .hand_over(&self.cfg.pgdata().join("standby.signal"))?;
        self.pg
            .start(&self.cfg.pgdata(), &self.cfg.pg_log())
            .await?;
        Ok(())
    }

    /// Promotes the replica (the agent holds the leader lease).
    pub async fn promote(&mut self) -> Result<(), AgentError> {
        self.mark_primary(true)?;
        // PostgreSQL removes standby.signal itself while promoting; the configuration as
        // primary is written after.
        self.pg.promote(&self.cfg.pgdata()).await?;
        self.write_conf(None)?;
        self.pg.reload(&self.cfg.pgdata()).await?;
        // pg_rewind of the former primary reads the new timeline from pg_control.
        let client = herd_pg::connect(&self.spec()).await?;
        herd_pg::checkpoint(&client).await?;
        Ok(())
    }

    /// Fencing: every process of the server is killed; it accepts no further write.
    pub fn fence(&self) -> Result<(), AgentError> {
        herd_pg::kill_server(&self.cfg.pgdata())?;
        Ok(())
    }

    /// Points the running replica at `leader` (primary_conninfo is reloadable).
    pub async fn follow(&mut self, leader: &Member) -> Result<(), AgentError> {
        self.write_conf(Some(leader))?;
        self.pg.reload(&self.cfg.pgdata()).await?;
        Ok(())
    }

    /// Makes the node a replica of `leader` again: pg_rewind, else a fresh clone (the old
    /// directory kept aside), then start following.
    pub async fn rejoin(&mut self, leader: &Member) -> Result<(), AgentError> {
        let dir = self.cfg.pgdata();
        // pg_rewind wants a cleanly stopped target: a fast stop when it runs; after a crash it
        // runs single-user recovery itself, which refuses standby mode.
        if herd_pg::postmaster_pid(&dir)?.is_some()
            && self.pg.stop(&dir, herd_pg::StopMode::Fast).await.is_err()
        {
            herd_pg::kill_server(&dir)?;
        }
        for signal in ["standby.signal", "recovery.signal"] {
            let path = dir.join(signal);
            if path.exists() {
                std::fs::remove_file(&path)
                    .map_err(|e| AgentError::Io(format!("removing {}: {e}", path.display())))?;
            }
        }
        let source = format!(
            "host={} port={} user={SUPERUSER} dbname=postgres",
            leader.pg_host, leader.pg_port
        );
        if let Err(e) = self.pg.rewind(&dir, &source, &self.secrets.superuser).await {
            tracing::warn!("pg_rewind failed ({e}); cloning {} afresh", leader.name);
            let aside = dir.with_extension(format!("failed-{}", std::process::id()));
            std::fs::rename(&dir, &aside)
                .map_err(|e| AgentError::Io(format!("moving {} aside: {e}", dir.display())))?;
            return self.clone_from(leader).await;
        }
        self.mark_primary(false)?;
        self.start_replica(Some(leader)).await
    }

    /// Writes the primary's commit settings and reloads when they changed.
    pub async fn apply_primary(&mut self, names: String, commit: &str) -> Result<(), AgentError> {
        let wanted = (names, commit.to_string());
        if wanted == self.primary_settings {
            return Ok(());
        }
        self.primary_settings = wanted;
        self.write_conf(None)?;
        self.pg.reload(&self.cfg.pgdata()).await?;
        Ok(())
    }

    /// Creates a replication slot on the primary for each member (cloning needs it).
    pub async fn ensure_slots(&self, members: &[String]) -> Result<(), AgentError> {
        let client = herd_pg::connect(&self.spec()).await?;
        for m in members {
            herd_pg::create_physical_slot(&client, m).await?;
        }
        Ok(())
    }

    /// The running server's system identifier.
    pub async fn system_identifier(&self) -> Result<String, AgentError> {
        let client = herd_pg::connect(&self.spec()).await?;
        let row = client
            .query_one(
                "select system_identifier::text from pg_control_system()",
                &[],
            )
            .await
            .map_err(|e| AgentError::Io(format!("reading the system identifier: {e}")))?;
        Ok(row.get(0))
    }
}
