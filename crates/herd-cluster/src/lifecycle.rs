//! Starting, adopting, stopping and waiting for the servers of a cluster.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use herd_core::{NodeName, NodeState, Role};
use herd_pg::{DataDirState, Pg, StopMode};

use crate::status::observe;
use crate::{Cluster, ClusterError, Progress};

impl Cluster {
    /// Fails unless every node directory holds a PostgreSQL 15 data directory. Nothing is changed.
    pub fn verify_data_dirs(&self) -> Result<(), ClusterError> {
        for node in &self.state.nodes {
            let dir = self.layout.node(node);
            let problem = match herd_pg::check_data_dir(&dir) {
                DataDirState::Valid => continue,
                DataDirState::Empty => "is missing or empty".to_string(),
                DataDirState::OtherVersion(v) => format!(
                    "belongs to PostgreSQL {v}, not {}; run it with that version or upgrade it (pg_upgrade) first",
                    herd_pg::PG_MAJOR
                ),
                DataDirState::Damaged(why) => format!("is damaged ({why})"),
            };
            return Err(ClusterError::DataDir {
                path: self.layout.root().to_path_buf(),
                detail: format!(
                    "node {node}'s data directory {} {problem}. Herd does not re-initialise existing clusters; \
                     restore the directory from a backup, or remove the whole data directory to start afresh",
                    dir.display()
                ),
            });
        }
        Ok(())
    }

    /// Fails when a port this cluster needs is taken by something other than its own servers.
    pub fn check_ports(&self, api_port: Option<u16>) -> Result<(), ClusterError> {
        let host = self.host();
        for node in &self.state.nodes {
            let running = herd_pg::postmaster_pid(&self.layout.node(node))
                .ok()
                .flatten()
                .is_some();
            if !running {
                ensure_free(host, self.port(node), &format!("node {node}"))?;
            }
        }
        if let Some(port) = api_port {
            ensure_free(host, port, "Herd's HTTP API")?;
        }
        Ok(())
    }

    /// Writes `node`'s configuration for its current role and hands the files to the servers' user.
    pub fn write_conf(&self, pg: &Pg, node: &NodeName) -> Result<(), ClusterError> {
        if let Some(sockets) = self.socket_dir() {
            // Created here rather than at bootstrap so clusters made before it existed get it.
            create_private_dir(&sockets)?;
            pg.hand_over(&sockets)?;
        }
        pg.write_conf(
            &self.layout.node(node),
            &self.server_settings(node),
            &self.hba(),
        )?;
        Ok(())
    }

    /// Starts `node` in its assigned role (configuration rewritten first).
    pub async fn start_node(&self, pg: &Pg, node: &NodeName) -> Result<(), ClusterError> {
        self.write_conf(pg, node)?;
        pg.start(&self.layout.node(node), &self.layout.node_log(node))
            .await?;
        Ok(())
    }

    /// Starts every node that is not running, primary first; running ones are adopted as they are.
    pub async fn start_all(&self, pg: &Pg, progress: &dyn Progress) -> Result<(), ClusterError> {
        let mut order = vec![self.state.primary.clone()];
        order.extend(self.state.replicas());
        for node in &order {
            let role = self.role(node);
            if let Some(pid) = herd_pg::postmaster_pid(&self.layout.node(node))? {
                // Adopted servers still get the current configuration.
                self.write_conf(pg, node)?;
                pg.reload(&self.layout.node(node)).await?;
                progress.done(&format!(
                    "{role} {node} already running (pid {pid}), adopted"
                ));
                continue;
            }
            progress.phase(&format!(
                "starting {role} {node} on port {}",
                self.port(node)
            ));
            self.start_node(pg, node).await?;
            progress.done(&format!(
                "{role} {node} started on port {}",
                self.port(node)
            ));
        }
        Ok(())
    }

    /// Stops every running node cleanly: the primary first, so that it sends its last WAL (the
    /// shutdown checkpoint) to the replicas before they stop.
    pub async fn stop_all(&self, pg: &Pg, progress: &dyn Progress) -> Result<(), ClusterError> {
        let mut order = vec![self.state.primary.clone()];
        order.extend(self.state.replicas());
        let mut first_error = None;
        for node in &order {
            let dir = self.layout.node(node);
            if herd_pg::postmaster_pid(&dir)?.is_none() {
                continue;
            }
            progress.phase(&format!("stopping {} {node}", self.role(node)));
            match pg.stop(&dir, StopMode::Fast).await {
                Ok(()) => progress.done(&format!("{} {node} stopped", self.role(node))),
                // Keep stopping the others; report the first failure at the end.
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
        first_error.map_or(Ok(()), |e| Err(e.into()))
    }

    /// Waits until the primary runs and every replica streams from it.
    pub async fn wait_ready(
        &self,
        timeout: Duration,
        progress: &dyn Progress,
    ) -> Result<(), ClusterError> {
        progress.phase("waiting for every replica to stream from the primary");
        let deadline = Instant::now() + timeout;
        loop {
            let status = observe(self).await.status;
            let lagging: Vec<String> = status
                .nodes
                .iter()
                .filter(|n| match n.role {
                    Role::Primary => n.state != NodeState::Running,
                    Role::Replica => n.state != NodeState::Streaming,
                })
                .map(|n| format!("{} {} is {:?}", n.role, n.name, n.state).to_lowercase())
                .collect();
            if lagging.is_empty() {
                progress.done("every replica is streaming");
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ClusterError::NotReady(format!(
                    "the cluster was not ready after {}s: {}. See the server logs in {}",
                    timeout.as_secs(),
                    lagging.join(", "),
                    self.layout.logs().display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn ensure_free(host: std::net::IpAddr, port: u16, what: &str) -> Result<(), ClusterError> {
    TcpListener::bind((host, port))
        .map(drop)
        .map_err(|_| ClusterError::PortInUse {
            port,
            address: host.to_string(),
            what: what.to_string(),
        })
}

/// Creates `dir` (mode 0700) unless it exists.
fn create_private_dir(dir: &std::path::Path) -> Result<(), ClusterError> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            Err(ClusterError::io("creating", dir, e))
        }
        _ => Ok(()),
    }
}
