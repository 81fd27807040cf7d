//! The options of commands that take more than a few flags (`herd up`, `backup`, `status`,
//! `switchover`, `failover`, `restart`, `url`) and the data directory every command names.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use herd_cluster::Layout;

/// Options of `herd backup`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BackupArgs {
    #[command(subcommand)]
    pub(crate) command: Option<BackupCommand>,
    #[command(flatten)]
    pub(crate) dir: DataDirArg,
    /// full (every file), diff (changed since the last full) or incr (changed since the last
    /// backup of any type).
    #[arg(long = "type", value_name = "TYPE", default_value = "full")]
    pub(crate) kind: herd_backup::BackupKind,
    /// Copy the files from the primary even when a standby streams (by default a streaming
    /// standby's are copied, sparing the primary).
    #[arg(long)]
    pub(crate) from_primary: bool,
    /// A multi-host cluster: the backups are taken by its agents (the primary's of each group),
    /// asked through its store; one at a time per group.
    #[command(flatten)]
    pub(crate) store: crate::hosts::StoreArgs,
    /// With --dcs: back up this shard group only (default: every group, in turn).
    #[arg(long, value_name = "G", requires = "dcs")]
    pub(crate) group: Option<u32>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum BackupCommand {
    /// The backups in the repository: label, type, start and stop times, sizes. With --dcs, a
    /// multi-host cluster's, from the repository its agents' herd.toml (--config) names.
    List(BackupListArgs),
    /// A named point in the WAL of the running cluster (pg_create_restore_point on every shard
    /// group's primary, two-phase commits held meanwhile), for `herd restore --to NAME`. With
    /// --dcs (a multi-host cluster): taken by a registered `herd proxy` serving an HTTP API (or
    /// the one at --proxy-api), every other registered proxy holding its two-phase commits too.
    RestorePoint {
        /// The point's name: a letter or '_' first, then letters, digits, '_', '-' or '.'.
        name: String,
        /// (With --dcs: a directory holding the proxy's API token in secrets/, needed beyond
        /// 127.0.0.1.)
        #[command(flatten)]
        dir: DataDirArg,
        /// A multi-host cluster's store.
        #[command(flatten)]
        store: crate::hosts::StoreArgs,
        /// With --dcs: the HTTP API (HOST:PORT, its --api-listen) of the `herd proxy` that
        /// takes the point (default: a registered proxy's, each registration names its API).
        #[arg(long, value_name = "HOST:PORT", requires = "dcs")]
        proxy_api: Option<String>,
    },
}

/// Options of `herd backup list`.
#[derive(Debug, Args)]
pub struct BackupListArgs {
    #[command(flatten)]
    pub(crate) dir: DataDirArg,
    /// A multi-host cluster: every shard group's backups (the store says how many groups).
    #[command(flatten)]
    pub(crate) store: crate::hosts::StoreArgs,
    /// With --dcs: the herd.toml the agents read (`herd agent --config FILE`); its [backup]
    /// names the repository.
    #[arg(long, value_name = "FILE", requires = "dcs")]
    pub(crate) config: Option<PathBuf>,
}

/// `--data-dir`, shared by every command.
#[derive(Debug, Args)]
pub struct DataDirArg {
    /// The cluster's data directory.
    #[arg(long, env = "HERD_DATA_DIR", default_value = "herd-data")]
    pub data_dir: PathBuf,
}

impl DataDirArg {
    /// The layout of the (absolute) data directory.
    pub fn layout(&self) -> anyhow::Result<Layout> {
        let dir = std::path::absolute(&self.data_dir).map_err(|e| {
            anyhow::anyhow!("invalid data directory {}: {e}", self.data_dir.display())
        })?;
        Ok(Layout::new(dir))
    }
}

/// Options of `herd up`; each overrides herd.toml and is saved there.
#[derive(Debug, Args)]
pub struct UpArgs {
    #[command(flatten)]
    pub dir: DataDirArg,
    /// Number of hot-standby replicas per shard group (first run only).
    #[arg(long)]
    pub replicas: Option<u32>,
    /// Number of shard groups, each a primary with its own replicas and failover (default 1;
    /// groups can be added to an existing cluster, not removed).
    #[arg(long)]
    pub shards: Option<u32>,
    /// When commits are acknowledged: async, remote_write, on, remote_apply.
    #[arg(long)]
    pub commit_mode: Option<String>,
    /// Standbys that confirm commits in synchronous modes: "ANY k" or "FIRST k".
    #[arg(long)]
    pub sync_standbys: Option<String>,
    /// The cluster's endpoint port; node i listens on port + 1 + i.
    #[arg(long)]
    pub port: Option<u16>,
    /// Port of Herd's HTTP API (default: port + 100).
    #[arg(long)]
    pub api_port: Option<u16>,
    /// Directory of the PostgreSQL 15 server programs.
    #[arg(long)]
    pub pg_bindir: Option<PathBuf>,
    /// Return once the cluster is ready, leaving the supervisor running in the background.
    #[arg(long)]
    pub detach: bool,
}

/// Options of `herd switchover`.
#[derive(Debug, Args)]
pub struct SwitchArgs {
    #[command(flatten)]
    pub dir: DataDirArg,
    /// A multi-host cluster: act through its store instead of a data directory.
    #[command(flatten)]
    pub store: crate::hosts::StoreArgs,
    /// The replica to promote (default: the most advanced).
    #[arg(long, value_name = "NODE")]
    pub to: Option<String>,
    /// The shard group (default: the group of --to, else 0).
    #[arg(long, value_name = "G")]
    pub group: Option<u32>,
}

/// Options of `herd failover`.
#[derive(Debug, Args)]
pub struct FailoverArgs {
    #[command(flatten)]
    pub dir: DataDirArg,
    /// A multi-host cluster: act through its store instead of a data directory.
    #[command(flatten)]
    pub store: crate::hosts::StoreArgs,
    /// The replica to promote (default: the one that provably holds every acknowledged commit).
    #[arg(long, value_name = "NODE")]
    pub to: Option<String>,
    /// Promote even if acknowledged commits may be missing from that replica.
    #[arg(long)]
    pub allow_data_loss: bool,
    /// The shard group (default: the group of --to, else 0).
    #[arg(long, value_name = "G")]
    pub group: Option<u32>,
}

/// Options of `herd restart`.
#[derive(Debug, Args)]
pub struct RestartArgs {
    #[command(flatten)]
    pub dir: DataDirArg,
    /// A multi-host cluster: act through its store instead of a data directory.
    #[command(flatten)]
    pub store: crate::hosts::StoreArgs,
    /// The replica to restart (default: every server of the group, the primary last).
    #[arg(long, value_name = "NODE")]
    pub node: Option<String>,
    /// The shard group (default: the group of --node, else 0).
    #[arg(long, value_name = "G")]
    pub group: Option<u32>,
}

/// Options of `herd status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub dir: DataDirArg,
    /// A multi-host cluster: act through its store instead of a data directory.
    #[command(flatten)]
    pub store: crate::hosts::StoreArgs,
    /// Print the status document as JSON (documented in docs/status-json.md).
    #[arg(long)]
    pub json: bool,
    /// A multi-host cluster's agent API (http://HOST:PORT or HOST:PORT), asked for its member
    /// when the store is unreachable; repeat for each agent. Without it, the addresses of the
    /// last successful `herd status` are used. The agents answer requests signed with the
    /// cluster's key, derived from the passwords in --data-dir's secrets/ (a copy of the
    /// agents' secrets directory).
    #[arg(long = "agent-api", value_name = "URL", requires = "dcs")]
    pub agent_api: Vec<String>,
}

/// Options of `herd url`.
#[derive(Debug, Args)]
pub struct UrlArgs {
    #[command(flatten)]
    pub dir: DataDirArg,
    /// The current primary.
    #[arg(long, conflicts_with = "replica")]
    pub primary: bool,
    /// A replica: its position among the replicas (1, 2, …) or its node name.
    #[arg(long, value_name = "N")]
    pub replica: Option<String>,
    /// The shard group whose --primary or --replica is meant (default 0).
    #[arg(long, value_name = "G", default_value_t = 0)]
    pub group: u32,
}
