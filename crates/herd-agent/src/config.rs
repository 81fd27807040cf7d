//! What one agent is told on its command line.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use herd_config::PostgresConfig;

use crate::member::ClusterSettings;

/// One agent's configuration.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The member name: unique in the cluster, a valid replication slot name.
    pub name: String,
    /// The shard group this agent's node belongs to (0 for an unsharded cluster).
    pub group: u32,
    /// When this agent creates the cluster (group 0): how many shard groups it has.
    pub shard_groups: u32,
    /// The agent's directory: `pgdata/`, `secrets/`, `logs/`, `run/`.
    pub data_dir: PathBuf,
    /// The address PostgreSQL listens on.
    pub pg_listen: IpAddr,
    /// PostgreSQL's port.
    pub pg_port: u16,
    /// The address other hosts and the proxy reach PostgreSQL on.
    pub pg_advertise: String,
    /// Where the agent's API listens.
    pub api_listen: SocketAddr,
    /// The address other agents reach the API on (`host:port`).
    pub api_advertise: String,
    /// The leader lease's time to live.
    pub ttl: Duration,
    /// Time between rounds.
    pub loop_wait: Duration,
    /// The primary fences itself this long before its lease could expire.
    pub safety_margin: Duration,
    /// Keep serving while the store is unreachable if every member confirms it cannot reach
    /// the store either.
    pub failsafe: bool,
    /// The settings recorded when this agent creates the cluster.
    pub bootstrap: ClusterSettings,
    /// PostgreSQL's settings on this host.
    pub postgres: PostgresConfig,
    /// Where the node's files are when they are not under `data_dir` (`herd up`'s layout,
    /// shared by several nodes); `None`: `pgdata/`, `logs/` and `run/` of `data_dir`.
    pub paths: Option<NodePaths>,
    /// Across hosts (`paths` is `None`): archive WAL with pgBackRest through
    /// `data_dir/backup/pgbackrest.conf`, which `herd agent` writes from `[backup]` before
    /// the server starts. (`herd up`'s nodes read `[backup]` from their herd.toml instead.)
    pub backup: bool,
    /// With `backup`: seconds a completed WAL file may wait before the archive counts as
    /// behind (`[backup] archive_lag_warning_s`).
    pub archive_lag_warning_s: u64,
    /// With `backup` across hosts: a replica this agent clones is restored from the
    /// repository's newest backup instead of pg_basebackup when there is one (`[backup]
    /// replicas_from_repository`; `herd up`'s nodes read it from their herd.toml instead).
    pub replicas_from_repository: bool,
    /// Dead-vs-hung timeouts and restart back-off (`herd up`: from `[supervisor]`; `herd
    /// agent`: from its lease timings and its herd.toml's `[supervisor]`).
    pub policy: crate::policy::Policy,
}

/// One node's files inside a `herd up` data directory (today's `nodes/<node>/`,
/// `logs/<node>.log`, `run/`, `sockets/`), so the layout stays that of the old engine.
#[derive(Clone, Debug)]
pub struct NodePaths {
    /// The PostgreSQL data directory.
    pub pgdata: PathBuf,
    /// PostgreSQL's log file.
    pub pg_log: PathBuf,
    /// The directory of the node's marker files, each named after the node.
    pub run_dir: PathBuf,
    /// Where the server puts its Unix-domain socket (`None`: TCP only).
    pub socket_dir: Option<PathBuf>,
}

/// Why a configuration is refused.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl AgentConfig {
    /// Checks what the store's timing relies on: the margin leaves time for at least one
    /// more round before the lease could expire, and replicas publish their final positions
    /// before a race can begin.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(ConfigError(format!(
                "member name {:?} must be lower-case letters, digits and '_' (it names a replication slot)",
                self.name
            )));
        }
        if self.shard_groups == 0 || self.shard_groups > herd_config::MAX_SHARDS {
            return Err(ConfigError(format!(
                "--shard-groups must be between 1 and {} (got {})",
                herd_config::MAX_SHARDS,
                self.shard_groups
            )));
        }
        if self.ttl < Duration::from_secs(2) {
            return Err(ConfigError("--ttl must be at least 2 s".into()));
        }
        if self.safety_margin < self.loop_wait * 2 || self.safety_margin * 2 > self.ttl {
            return Err(ConfigError(format!(
                "--safety-margin ({} ms) must be at least twice --loop-wait ({} ms) and at most half of --ttl ({} ms)",
                self.safety_margin.as_millis(),
                self.loop_wait.as_millis(),
                self.ttl.as_millis()
            )));
        }
        Ok(())
    }

    /// The PostgreSQL data directory.
    pub fn pgdata(&self) -> PathBuf {
        match &self.paths {
            Some(p) => p.pgdata.clone(),
            None => self.data_dir.join("pgdata"),
        }
    }

    /// Where the server puts its Unix-domain socket: `herd up`'s socket directory, or across
    /// hosts with backups on `data_dir/sockets` (pgBackRest connects over a socket only);
    /// `None`: TCP only.
    pub fn socket_dir(&self) -> Option<PathBuf> {
        match &self.paths {
            Some(p) => p.socket_dir.clone(),
            None => self.backup.then(|| self.data_dir.join("sockets")),
        }
    }

    /// PostgreSQL's log file.
    pub fn pg_log(&self) -> PathBuf {
        match &self.paths {
            Some(p) => p.pg_log.clone(),
            None => self.data_dir.join("logs").join("postgresql.log"),
        }
    }

    /// The watchdog's deadline file.
    pub fn fence_file(&self) -> PathBuf {
        match &self.paths {
            Some(p) => p.run_dir.join(format!("{}.fence.deadline", self.name)),
            None => self.data_dir.join("run").join("fence.deadline"),
        }
    }

    /// Present while the node may hold WAL no other member has (it ran as primary since it
    /// last rejoined): it must be rewound before following another member.
    pub fn was_primary_file(&self) -> PathBuf {
        match &self.paths {
            Some(p) => p.run_dir.join(format!("{}.was-primary", self.name)),
            None => self.data_dir.join("run").join("was-primary"),
        }
    }
}
