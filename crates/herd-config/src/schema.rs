//! The configuration's structure and defaults.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use herd_core::{CommitMode, Consistency, PoolMode, SyncStandbys};
use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// Highest replica count `herd up` accepts on one machine.
pub const MAX_REPLICAS: u32 = 8;

/// Highest number of shard groups `herd up` accepts on one machine.
pub const MAX_SHARDS: u32 = 8;

/// The whole `herd.toml`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Topology and commit mode.
    pub cluster: ClusterConfig,
    /// Addresses and ports.
    pub network: NetworkConfig,
    /// The PostgreSQL servers.
    pub postgres: PostgresConfig,
    /// The supervisor's timings.
    pub supervisor: SupervisorConfig,
    /// The client endpoint: pooling, routing, consistency.
    pub proxy: ProxyConfig,
    /// The live page the HTTP API serves.
    pub dashboard: DashboardConfig,
    /// Backups and point-in-time recovery with pgBackRest (off unless configured).
    pub backup: BackupConfig,
    /// Per shard group overrides of `[cluster]`'s commit settings: `[group.1]`,
    /// `commit_mode = "remote_apply"`. Keys are group numbers.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub group: std::collections::BTreeMap<String, GroupConfig>,
}

/// `[dashboard]`
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DashboardConfig {
    /// A `herd bench --out` directory whose latest reports the page shows, relative to
    /// herd.toml's directory; empty: none.
    pub bench_results: String,
}

/// `[backup]`: continuous WAL archiving and backups with pgBackRest. Off unless `enabled = true`
/// or a `repository` is given, so clusters without the section run exactly as before (no
/// `archive_mode`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackupConfig {
    /// Archive WAL and allow `herd backup` / `herd restore`.
    pub enabled: bool,
    /// The pgBackRest repository (a directory; relative paths are from the data directory);
    /// empty: `<data-dir>/backup-repo`. Setting it enables backups.
    pub repository: String,
    /// Full backups kept; older ones (and the WAL only they need) are expired after each backup.
    pub retention_full: u32,
    /// Seconds a completed WAL segment may wait on the primary for archiving before `herd
    /// status`, `/metrics` and the dashboard report the archive as behind.
    pub archive_lag_warning_s: u64,
    /// Seconds between scheduled full backups of each shard group, taken by `herd up`'s
    /// supervisor (0: none; a cluster with no full backup gets one at once).
    pub full_every_s: u64,
    /// Seconds between scheduled incremental backups (0: none; measured from the group's
    /// newest backup of any type).
    pub incr_every_s: u64,
    /// Build a new replica of `herd up` with `pgbackrest restore --type=standby` from the
    /// repository's newest backup (then the archive and streaming) instead of pg_basebackup of
    /// the primary, sparing the primary the copy; pg_basebackup when the repository holds no
    /// backup of the group or the restore fails.
    pub replicas_from_repository: bool,
    /// `[backup.s3]`: the repository in an S3-compatible object store (`repository` is then
    /// the path inside the bucket). Setting it enables backups.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub s3: Option<crate::S3Config>,
}

impl Default for BackupConfig {
    fn default() -> Self {
        BackupConfig {
            enabled: false,
            repository: String::new(),
            retention_full: 2,
            archive_lag_warning_s: 300,
            full_every_s: 0,
            incr_every_s: 0,
            replicas_from_repository: false,
            s3: None,
        }
    }
}

impl BackupConfig {
    /// Whether backups are configured: `enabled = true` or a repository named.
    pub fn is_enabled(&self) -> bool {
        self.enabled || !self.repository.is_empty() || self.s3.is_some()
    }

    /// The path inside the bucket when the repository is in S3 (`repository`, default
    /// `/herd`).
    pub fn s3_path(&self) -> String {
        if self.repository.is_empty() {
            "/herd".into()
        } else {
            self.repository.clone()
        }
    }

    /// The repository directory of the cluster whose data directory is `root`.
    pub fn repository_path(&self, root: &Path) -> PathBuf {
        if self.repository.is_empty() {
            root.join("backup-repo")
        } else {
            // An absolute path replaces `root` in `join`.
            root.join(&self.repository)
        }
    }
}

/// `[group.N]`: what shard group N does differently from `[cluster]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GroupConfig {
    /// The group's commit mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit_mode: Option<CommitMode>,
    /// The group's synchronous quorum.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_standbys: Option<SyncStandbys>,
}

/// `[cluster]`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Number of hot-standby replicas beside the primary (in every shard group).
    pub replicas: u32,
    /// Number of shard groups, each a primary with its own replicas, quorum and failover
    /// (1: one group, the cluster as it was before sharding).
    pub shards: u32,
    /// When a commit is acknowledged.
    pub commit_mode: CommitMode,
    /// How many standbys confirm a commit in the synchronous modes.
    pub sync_standbys: SyncStandbys,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            replicas: 2,
            shards: 1,
            commit_mode: CommitMode::On,
            sync_standbys: SyncStandbys::default(),
        }
    }
}

/// `[network]`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConfig {
    /// Address every server and Herd's API listen on.
    pub listen_address: IpAddr,
    /// The cluster's endpoint; node `i` listens on `port + 1 + i`.
    pub port: u16,
    /// Herd's HTTP API; 0 means `port + 100`.
    pub api_port: u16,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            listen_address: IpAddr::from([127, 0, 0, 1]),
            port: 7432,
            api_port: 0,
        }
    }
}

/// `[postgres]`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PostgresConfig {
    /// Directory of the PostgreSQL 15 server programs; empty means search for them.
    pub bindir: Option<PathBuf>,
    /// OS user that runs the servers when Herd runs as root.
    pub os_user: String,
    /// `shared_buffers` of every server.
    pub shared_buffers: String,
    /// `max_connections` of every server.
    pub max_connections: u32,
    /// `work_mem` of every server.
    pub work_mem: String,
    /// `max_slot_wal_keep_size`: WAL a slot may hold for an absent replica before it is dropped.
    pub max_slot_wal_keep_size: String,
    /// `wal_keep_size`: WAL every server keeps regardless of slots, so a former primary can
    /// rejoin by pg_rewind from a member promoted moments ago (whose slot for it is new).
    pub wal_keep_size: String,
    /// `wal_level`: "replica", or "logical" for publications and logical replication slots
    /// (more WAL; takes effect at the next server restart).
    pub wal_level: String,
    /// `wal_compression` of full-page images: "off", "pglz", "lz4" or "zstd" (applied by reload).
    pub wal_compression: String,
}

/// The `postgres.wal_level` values Herd accepts ("minimal" would break streaming replication).
pub const WAL_LEVELS: [&str; 2] = ["replica", "logical"];

/// The `postgres.wal_compression` values Herd accepts (those of PostgreSQL 15 built with lz4
/// and zstd, as the PGDG packages are).
pub const WAL_COMPRESSIONS: [&str; 4] = ["off", "pglz", "lz4", "zstd"];

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            bindir: None,
            os_user: "postgres".into(),
            shared_buffers: "128MB".into(),
            max_connections: 100,
            work_mem: "4MB".into(),
            max_slot_wal_keep_size: "2GB".into(),
            wal_keep_size: "256MB".into(),
            wal_level: "replica".into(),
            wal_compression: "off".into(),
        }
    }
}

/// `[supervisor]`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SupervisorConfig {
    /// How often each node is probed, in milliseconds.
    pub probe_interval_ms: u64,
    /// Delay before restarting a replica that died, doubled on each failed attempt, in milliseconds.
    pub restart_backoff_ms: u64,
    /// How long `herd up` waits for every replica to stream, in seconds.
    pub ready_timeout_s: u64,
    /// How long the primary's postmaster may be gone before a replica is promoted, in milliseconds.
    pub failover_timeout_ms: u64,
    /// How long a running primary may not answer (hung, frozen) before a replica is promoted.
    pub hung_timeout_ms: u64,
    /// Async mode: how far behind the lost primary (bytes) a promoted replica may be.
    pub max_lag_on_failover: u64,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        SupervisorConfig {
            probe_interval_ms: 500,
            restart_backoff_ms: 500,
            ready_timeout_s: 120,
            failover_timeout_ms: 2000,
            hung_timeout_ms: 8000,
            max_lag_on_failover: 16 * 1024 * 1024,
        }
    }
}

/// `[proxy]`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    /// When a server connection returns to its pool: after each transaction, or at disconnect.
    pub pool_mode: PoolMode,
    /// Server connections per node, user and database.
    pub pool_size: u32,
    /// How long a transaction may wait for a pooled connection when all are in use, in
    /// milliseconds; past it the client gets SQLSTATE 53300.
    pub pool_wait_ms: u64,
    /// Default read consistency of new connections.
    pub consistency: Consistency,
    /// The primary also serves reads, balanced with the replicas by outstanding requests
    /// (N nodes read instead of N − 1); off keeps it for writes and for reads no replica can
    /// take.
    pub read_from_primary: bool,
    /// `session`: how long a read may wait for a replica to replay the session's writes.
    pub max_wait_ms: u64,
    /// `bounded`: how far (in time) a replica may be behind.
    pub max_staleness_ms: u64,
    /// A replica further behind than this (bytes of replay) leaves the read pool.
    pub max_replica_lag_bytes: u64,
    /// A replica further behind than this (time) leaves the read pool.
    pub max_replica_lag_ms: u64,
    /// A replica out of the read pool returns once below this fraction of both limits.
    pub readmit_fraction: f64,
    /// How often replica positions are polled, in milliseconds.
    pub poll_interval_ms: u64,
    /// Largest protocol message accepted from a client, in bytes.
    pub max_message_bytes: u32,
    /// PEM certificate chain for TLS with clients (relative paths: from herd.toml's directory);
    /// empty: no TLS.
    pub tls_cert_file: String,
    /// Its PEM private key (mode 0600).
    pub tls_key_file: String,
    /// Clients that do not ask for TLS are refused.
    pub tls_required: bool,
    /// TLS from the proxy to the servers (pooled and administrative connections): `auto`
    /// (verify-full when the cluster has a CA, `secrets/ca.crt`; off without), `verify-full`
    /// (the certificate of the cluster's CA and naming the address dialled), `require`
    /// (encrypted, not verified) or `off`.
    pub server_tls: String,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            pool_mode: PoolMode::Transaction,
            pool_size: 10,
            pool_wait_ms: 30_000,
            consistency: Consistency::Session,
            read_from_primary: false,
            max_wait_ms: 20,
            max_staleness_ms: 1000,
            max_replica_lag_bytes: 16 * 1024 * 1024,
            max_replica_lag_ms: 1000,
            readmit_fraction: 0.5,
            poll_interval_ms: 100,
            max_message_bytes: 64 * 1024 * 1024,
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            tls_required: false,
            server_tls: "auto".into(),
        }
    }
}

impl Config {
    /// Reads and validates a `herd.toml`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text, path)
    }

    /// Parses and validates configuration text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Nodes of the whole cluster: every shard group's primary and replicas.
    pub fn node_count(&self) -> u32 {
        self.cluster.shards.max(1) * (self.cluster.replicas + 1)
    }

    /// The port of node `index` of shard group `group` (group 0's node 0 is the first primary;
    /// the groups' nodes follow each other).
    pub fn group_node_port(&self, group: u32, index: usize) -> u16 {
        let per_group = self.cluster.replicas as usize + 1;
        self.node_port(group as usize * per_group + index)
    }

    /// The port of node `index` (0 is the first primary).
    pub fn node_port(&self, index: usize) -> u16 {
        // validate() guarantees the sum fits.
        self.network
            .port
            .saturating_add(1)
            .saturating_add(index as u16)
    }

    /// The HTTP API's port.
    pub fn api_port(&self) -> u16 {
        if self.network.api_port == 0 {
            self.network.port.saturating_add(100)
        } else {
            self.network.api_port
        }
    }

    /// The configuration as shard group `group` runs it: `[cluster]` with the group's own
    /// `[group.N]` commit settings in place.
    pub fn for_group(&self, group: u32) -> Config {
        let mut c = self.clone();
        if let Some(o) = self.group.get(&group.to_string()) {
            if let Some(m) = o.commit_mode {
                c.cluster.commit_mode = m;
            }
            if let Some(s) = o.sync_standbys {
                c.cluster.sync_standbys = s;
            }
        }
        c
    }

    /// Changes a commit setting (`commit-mode`, `sync-standbys`) of shard group `group` only,
    /// kept as a `[group.N]` override; validating the result.
    pub fn set_for_group(
        &mut self,
        group: u32,
        key: &str,
        value: &str,
    ) -> Result<Changed, ConfigError> {
        if group >= self.cluster.shards {
            return Err(ConfigError::invalid(
                "group",
                group,
                format!("0 to {}", self.cluster.shards.saturating_sub(1)),
            ));
        }
        let invalid = |e: herd_core::ParseError| ConfigError::invalid(key, value, e.expected);
        let mut next = self.clone();
        let entry = next.group.entry(group.to_string()).or_default();
        match key.replace('_', "-").trim_start_matches("cluster.") {
            "commit-mode" => entry.commit_mode = Some(value.parse().map_err(invalid)?),
            "sync-standbys" => entry.sync_standbys = Some(value.parse().map_err(invalid)?),
            _ => {
                return Err(ConfigError::invalid(
                    "key",
                    key,
                    "commit-mode or sync-standbys (per group)",
                ))
            }
        }
        next.validate()?;
        *self = next;
        Ok(Changed::CommitSettings)
    }

    /// Changes one run-time setting named as on the command line (`commit-mode`, `sync-standbys`),
    /// validating the result.
    pub fn set(&mut self, key: &str, value: &str) -> Result<Changed, ConfigError> {
        let invalid = |e: herd_core::ParseError| ConfigError::invalid(key, value, e.expected);
        // Work on a copy so a rejected value leaves `self` untouched.
        let mut next = self.clone();
        let changed = match key.replace('_', "-").trim_start_matches("cluster.") {
            "commit-mode" => {
                next.cluster.commit_mode = value.parse().map_err(invalid)?;
                Changed::CommitSettings
            }
            "sync-standbys" => {
                next.cluster.sync_standbys = value.parse().map_err(invalid)?;
                Changed::CommitSettings
            }
            // Reloadable in PostgreSQL, so it can change while the cluster runs.
            "wal-compression" | "postgres.wal-compression" => {
                next.postgres.wal_compression = value.to_string();
                Changed::ServerSetting
            }
            _ => {
                return Err(ConfigError::invalid(
                    "key",
                    key,
                    "one of commit-mode, sync-standbys, wal-compression \
                 (other settings: edit herd.toml, then restart)",
                ))
            }
        };
        next.validate()?;
        *self = next;
        Ok(changed)
    }
}

/// What a [`Config::set`] changed, and so how it is applied to running servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changed {
    /// The commit mode or the sync quorum: the sync set is recorded again before the servers
    /// reload (the failover proof depends on it).
    CommitSettings,
    /// A reloadable server setting: the servers reload, the sync set stays as recorded.
    ServerSetting,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("herd.toml"))
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c = parse("").expect("valid");
        assert_eq!(c, Config::default());
        assert_eq!(c.cluster.replicas, 2);
        assert_eq!(c.cluster.commit_mode, CommitMode::On);
        assert_eq!(c.cluster.sync_standbys.to_string(), "ANY 1");
        assert_eq!(c.node_port(0), 7433);
        assert_eq!(c.api_port(), 7532);
    }

    #[test]
    fn bad_enum_value_names_key_value_and_allowed_values() {
        let err = parse("[cluster]\ncommit_mode = \"fast\"\n")
            .expect_err("invalid")
            .to_string();
        for part in ["commit_mode", "fast", "remote_apply", "line 2"] {
            assert!(err.contains(part), "{part} missing from: {err}");
        }
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err = parse("[cluster]\nreplica = 3\n")
            .expect_err("typo")
            .to_string();
        assert!(err.contains("replica"), "{err}");
    }

    #[test]
    fn cross_field_rules() {
        let cases = [
            (
                "[cluster]\nreplicas = 1\nsync_standbys = \"ANY 2\"\n",
                "cluster.sync_standbys",
            ),
            ("[cluster]\nreplicas = 9\n", "cluster.replicas"),
            ("[cluster]\nshards = 0\n", "cluster.shards"),
            ("[cluster]\nshards = 9\n", "cluster.shards"),
            ("[network]\nport = 80\n", "network.port"),
            ("[network]\nport = 65534\n", "network.port"),
            (
                "[network]\nport = 7000\napi_port = 7002\n",
                "network.api_port",
            ),
            (
                "[postgres]\nmax_connections = 2\n",
                "postgres.max_connections",
            ),
            (
                "[postgres]\nwal_level = \"minimal\"\n",
                "postgres.wal_level",
            ),
            (
                "[postgres]\nwal_compression = \"gzip\"\n",
                "postgres.wal_compression",
            ),
            ("[backup]\nretention_full = 0\n", "backup.retention_full"),
            (
                "[backup]\narchive_lag_warning_s = 0\n",
                "backup.archive_lag_warning_s",
            ),
            ("[backup]\nfull_every_s = 99999999\n", "backup.full_every_s"),
            ("[backup]\nincr_every_s = 99999999\n", "backup.incr_every_s"),
        ];
        for (text, key) in cases {
            let err = parse(text).expect_err(text).to_string();
            assert!(err.contains(key), "{key} missing from: {err}");
        }
    }

    #[test]
    fn backup_is_off_unless_configured() {
        let c = parse("").expect("valid");
        assert!(!c.backup.is_enabled());
        assert_eq!(c.backup.retention_full, 2);
        assert_eq!(c.backup.archive_lag_warning_s, 300);
        let root = Path::new("/data/herd");
        assert_eq!(
            c.backup.repository_path(root),
            PathBuf::from("/data/herd/backup-repo")
        );
        let on = parse("[backup]\nenabled = true\n").expect("valid");
        assert!(on.backup.is_enabled());
        let repo = parse("[backup]\nrepository = \"/srv/backups\"\n").expect("valid");
        assert!(repo.backup.is_enabled(), "a repository enables backups");
        assert_eq!(
            repo.backup.repository_path(root),
            PathBuf::from("/srv/backups")
        );
        let relative = parse("[backup]\nrepository = \"../repo\"\n").expect("valid");
        assert_eq!(
            relative.backup.repository_path(root),
            PathBuf::from("/data/herd/../repo")
        );
    }

    #[test]
    fn set_changes_run_time_keys_only() {
        let mut c = Config::default();
        assert_eq!(
            c.set("commit-mode", "remote_apply").expect("valid"),
            Changed::CommitSettings
        );
        assert_eq!(c.cluster.commit_mode, CommitMode::RemoteApply);
        c.set("sync_standbys", "FIRST 2").expect("valid");
        assert_eq!(c.cluster.sync_standbys.to_string(), "FIRST 2");
        assert!(
            c.set("sync-standbys", "ANY 3").is_err(),
            "more than the replicas"
        );
        assert_eq!(
            c.cluster.sync_standbys.to_string(),
            "FIRST 2",
            "unchanged after a rejection"
        );
        assert!(c.set("commit-mode", "fast").is_err());
        assert!(c.set("port", "1").is_err());
        assert_eq!(
            c.set("wal-compression", "zstd").expect("valid"),
            Changed::ServerSetting
        );
        assert_eq!(c.postgres.wal_compression, "zstd");
        let err = c.set("wal_compression", "gzip").expect_err("invalid");
        assert_eq!(
            c.postgres.wal_compression, "zstd",
            "unchanged after a rejection"
        );
        for part in ["postgres.wal_compression", "gzip", "lz4"] {
            assert!(err.to_string().contains(part), "{part} missing from: {err}");
        }
    }

    #[test]
    fn wal_settings_default_to_replica_and_off_and_accept_their_values() {
        let c = parse("").expect("valid");
        assert_eq!(
            (
                c.postgres.wal_level.as_str(),
                c.postgres.wal_compression.as_str()
            ),
            ("replica", "off")
        );
        for level in WAL_LEVELS {
            for compression in WAL_COMPRESSIONS {
                let text = format!(
                    "[postgres]\nwal_level = \"{level}\"\nwal_compression = \"{compression}\"\n"
                );
                let c = parse(&text).expect(&text);
                assert_eq!(c.postgres.wal_level, level);
                assert_eq!(c.postgres.wal_compression, compression);
            }
        }
        let err = parse("[postgres]\nwal_level = \"logical \"\n")
            .expect_err("trailing space")
            .to_string();
        for part in ["postgres.wal_level", "replica, logical"] {
            assert!(err.contains(part), "{part} missing from: {err}");
        }
    }
}
