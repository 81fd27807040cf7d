//! Command-line definitions and dispatch.

use clap::{Parser, Subcommand};

mod args;
pub use args::*;

/// Herd: stock PostgreSQL 15 made highly available and read-scaled, from one binary.
#[derive(Debug, Parser)]
#[command(name = "herd", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create (first run) or resume the cluster and supervise it.
    Up(UpArgs),
    /// Stop the supervisor and every server cleanly.
    Down(DataDirArg),
    /// Show every node's role, state, positions and lag.
    Status(StatusArgs),
    /// Print a libpq connection URL (credentials included).
    Url(UrlArgs),
    /// Planned, loss-free change of primary (new transactions pause briefly).
    Switchover(SwitchArgs),
    /// Promote a replica now, fencing the current primary.
    Failover(FailoverArgs),
    /// Restart a replica's server out of the read pool, or every server of a shard group (the
    /// primary last, through a switchover).
    Restart(RestartArgs),
    /// Reproduce the reference measurements on this machine (results.json, report.md, SVG).
    /// Ctrl-C stops and removes what the run started (scratch clusters, helpers, the lab of
    /// `failover --hosts 3`, CPU groups) before exiting.
    Bench(crate::bench::BenchArgs),
    /// Change settings of a cluster.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Shard groups: check where distributed rows live, move shards between groups.
    Shards {
        #[command(subcommand)]
        command: ShardsCommand,
    },
    /// Shard groups of a running cluster: `herd group add` adds one online.
    Group {
        #[command(subcommand)]
        command: GroupCommand,
    },
    /// Logical copies of tables (subsets of rows and columns) to another PostgreSQL or Herd
    /// cluster, kept streaming across failovers.
    Copy {
        #[command(subcommand)]
        command: crate::copy::CopyCommand,
    },
    /// Back up every shard group with pgBackRest (needs `[backup]` in herd.toml): a full,
    /// differential or incremental backup, copied from a streaming standby when there is one;
    /// `herd backup list` lists them. With --dcs, a multi-host cluster's, through its agents.
    Backup(BackupArgs),
    /// Restore a backed-up cluster into a new data directory, to a moment (point-in-time
    /// recovery) or to the end of its archived WAL; `herd up --data-dir NEW` then runs it.
    Restore(crate::restore::RestoreArgs),
    /// The cluster's certificate authority: make it, issue certificates from it, show them
    /// with their expiry.
    Certs {
        #[command(subcommand)]
        command: crate::certs::CertsCommand,
    },
    /// The cluster's passwords: `herd secrets rotate` replaces them on the running cluster.
    Secrets {
        #[command(subcommand)]
        command: crate::secrets_cmd::SecretsCommand,
    },
    /// Run this host's PostgreSQL node of a multi-host cluster kept in etcd.
    Agent(crate::hosts::AgentArgs),
    /// The fencing watchdog `herd agent` starts (not for direct use).
    #[command(hide = true)]
    AgentWatchdog(crate::hosts::WatchdogArgs),
    /// The endpoint of a multi-host cluster, following its leader in etcd (run any number).
    Proxy(crate::hosts::ProxyArgs),
}

#[derive(Debug, Subcommand)]
enum ShardsCommand {
    /// Check that every row of every distributed table is on the group the placement rule
    /// names (computed by PostgreSQL's own hash functions); exit 1 and list where not.
    Verify {
        #[command(flatten)]
        dir: DataDirArg,
        /// The database whose tables are checked.
        #[arg(long, default_value = "postgres")]
        database: String,
    },
    /// Move one virtual shard's rows to another group while the cluster serves reads and
    /// writes: a logical copy catches up, the shard's statements wait briefly at the endpoint
    /// for the switch, the source group's rows are deleted. Run again to resume; --cancel
    /// takes back a move that has not switched.
    Move {
        #[command(flatten)]
        dir: DataDirArg,
        /// A multi-host cluster's store (then --data-dir names a directory holding its
        /// secrets/, and --endpoint the `herd proxy` the move goes through). The agent holding
        /// the cluster's coordinator lease runs the move (another resumes it if that one dies);
        /// this command asks and follows it.
        #[command(flatten)]
        store: crate::hosts::StoreArgs,
        /// With --dcs: the `herd proxy` endpoint (HOST:PORT) the move's statements and its
        /// copy go through (reachable from every agent's host).
        #[arg(long, value_name = "HOST:PORT")]
        endpoint: Option<String>,
        /// The virtual shard (0 to the map's shard count − 1; `SELECT * FROM herd.shards`).
        shard: u32,
        /// The group it goes to.
        #[arg(long, required_unless_present = "cancel")]
        to: Option<u32>,
        /// The database whose distributed tables move.
        #[arg(long, default_value = "postgres")]
        database: String,
        /// Take back a move that has not switched yet.
        #[arg(long)]
        cancel: bool,
        /// How long to wait for the copy and its catch-up.
        #[arg(long, value_name = "SECONDS", default_value_t = 3600)]
        wait_timeout: u64,
    },
    /// Spread the shards evenly over the shard groups (after a group was added): the fewest
    /// moves, one after the other, each as `herd shards move` does it.
    Rebalance {
        #[command(flatten)]
        dir: DataDirArg,
        /// A multi-host cluster's store (then --data-dir names a directory holding its
        /// secrets/, and --endpoint the `herd proxy` the move goes through). The agent holding
        /// the cluster's coordinator lease runs the move (another resumes it if that one dies);
        /// this command asks and follows it.
        #[command(flatten)]
        store: crate::hosts::StoreArgs,
        /// With --dcs: the `herd proxy` endpoint (HOST:PORT) the move's statements and its
        /// copy go through (reachable from every agent's host).
        #[arg(long, value_name = "HOST:PORT")]
        endpoint: Option<String>,
        /// The database whose distributed tables move.
        #[arg(long, default_value = "postgres")]
        database: String,
        /// Print the moves without making them.
        #[arg(long)]
        dry_run: bool,
        /// How long to wait for each move's copy and its catch-up.
        #[arg(long, value_name = "SECONDS", default_value_t = 3600)]
        wait_timeout: u64,
    },
}

#[derive(Debug, Subcommand)]
enum GroupCommand {
    /// Add a shard group while the cluster serves: its servers are created (initdb, base
    /// backups), it receives the roles, databases, distributed tables' definitions, reference
    /// tables' rows and the shard map, then the endpoint uses it. It holds no shard until
    /// `herd shards rebalance`. With --dcs (a multi-host cluster): records the next group,
    /// prints the `herd agent` line to run on its hosts, waits for its primary and follows its
    /// admission by the cluster's coordinator (an agent asks a registered `herd proxy` with an
    /// API), or has the `herd proxy` at --proxy-api admit it.
    Add {
        #[command(flatten)]
        dir: DataDirArg,
        /// A multi-host cluster's store (then --data-dir names a directory holding the
        /// proxy's API token in secrets/, needed beyond 127.0.0.1).
        #[command(flatten)]
        store: crate::hosts::StoreArgs,
        /// With --dcs: the HTTP API (HOST:PORT, its --api-listen) of the `herd proxy` that
        /// admits the group; without it the cluster's coordinator asks a registered proxy
        /// with an API, and the command follows that until the group is admitted.
        #[arg(long, value_name = "HOST:PORT", requires = "dcs")]
        proxy_api: Option<String>,
        /// With --dcs: how long to wait for the new group's primary, and then for its
        /// admission.
        #[arg(long, value_name = "SECONDS", default_value_t = 600)]
        wait_timeout: u64,
    },
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Set commit-mode, sync-standbys or wal-compression; applied to the running servers by reload.
    Set {
        #[command(flatten)]
        dir: DataDirArg,
        /// A multi-host cluster: change it through its store.
        #[command(flatten)]
        store: crate::hosts::StoreArgs,
        /// Only this shard group (commit-mode and sync-standbys; kept in herd.toml as [group.G]).
        #[arg(long)]
        group: Option<u32>,
        /// commit-mode, sync-standbys or wal-compression.
        key: String,
        /// The new value, e.g. remote_apply, "ANY 2" or lz4.
        value: String,
    },
}

/// Runs the parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Up(args) => crate::up::run(args).await,
        Command::Down(dir) => crate::down::run(&dir.layout()?).await,
        Command::Status(args) if args.store.given() => {
            let key = crate::hosts_status::api_key(&args.dir.layout()?);
            crate::hosts_status::status(&args.store, args.json, &args.agent_api, key).await
        }
        Command::Status(args) => crate::status::run(&args.dir.layout()?, args.json).await,
        Command::Switchover(a) if a.store.given() => {
            let g = a.store.verb_group(a.group, a.to.as_deref()).await?;
            crate::hosts_admin::hand_over(&a.store.open_group(g).await?, a.to, false, false)
                .await
                .map(drop)
        }
        Command::Failover(a) if a.store.given() => {
            let g = a.store.verb_group(a.group, a.to.as_deref()).await?;
            let store = a.store.open_group(g).await?;
            crate::hosts_admin::hand_over(&store, a.to, true, a.allow_data_loss)
                .await
                .map(drop)
        }
        Command::Restart(a) if a.store.given() => {
            let g = a.store.verb_group(a.group, a.node.as_deref()).await?;
            let done = crate::hosts_restart::restart(&a.store.open_group(g).await?, a.node).await?;
            crate::output::emitln!("{done}");
            Ok(())
        }
        Command::Restart(a) => {
            let mut query = Vec::new();
            if let Some(n) = &a.node {
                query.push(format!("node={n}"));
            }
            if let Some(g) = a.group {
                query.push(format!("group={g}"));
            }
            let path = format!("/restart?{}", query.join("&"));
            crate::admin::request(&a.dir.layout()?, path).await
        }
        Command::Url(args) => crate::url::run(&args),
        Command::Bench(args) => crate::bench::run(args).await,
        Command::Switchover(a) => {
            let mut query = Vec::new();
            if let Some(to) = &a.to {
                query.push(format!("to={to}"));
            }
            if let Some(g) = a.group {
                query.push(format!("group={g}"));
            }
            let path = format!("/switchover?{}", query.join("&"));
            crate::admin::request(&a.dir.layout()?, path).await
        }
        Command::Failover(a) => {
            let mut path = format!("/failover?allow_data_loss={}", a.allow_data_loss);
            if let Some(to) = &a.to {
                path.push_str(&format!("&to={to}"));
            }
            if let Some(g) = a.group {
                path.push_str(&format!("&group={g}"));
            }
            crate::admin::request(&a.dir.layout()?, path).await
        }
        Command::Config {
            command:
                ConfigCommand::Set {
                    store,
                    group,
                    key,
                    value,
                    ..
                },
        } if store.given() => {
            // As on one host: one group when named, else every group.
            let groups = match group {
                Some(g) => vec![g],
                None => (0..store.groups().await?).collect(),
            };
            for g in groups {
                crate::hosts_admin::config_set(&store.open_group(g).await?, &key, &value).await?;
            }
            Ok(())
        }
        Command::Config {
            command:
                ConfigCommand::Set {
                    dir,
                    group,
                    key,
                    value,
                    ..
                },
        } => crate::config_cmd::set(&dir.layout()?, group, &key, &value).await,
        Command::Shards {
            command: ShardsCommand::Verify { dir, database },
        } => crate::shards::verify(&dir.layout()?, &database).await,
        Command::Shards {
            command:
                ShardsCommand::Move {
                    dir,
                    store,
                    endpoint,
                    shard,
                    to,
                    database,
                    cancel,
                    wait_timeout,
                },
        } => {
            let args = crate::shard_move::MoveArgs {
                shard,
                to: to.unwrap_or(0),
                database: &database,
                cancel,
                wait: std::time::Duration::from_secs(wait_timeout),
            };
            let places = crate::shard_move::places(&store, &dir, endpoint.as_deref()).await?;
            crate::shard_move::run(&places, args).await
        }
        Command::Shards {
            command:
                ShardsCommand::Rebalance {
                    dir,
                    store,
                    endpoint,
                    database,
                    dry_run,
                    wait_timeout,
                },
        } => {
            let wait = std::time::Duration::from_secs(wait_timeout);
            let places = crate::shard_move::places(&store, &dir, endpoint.as_deref()).await?;
            crate::shard_move::rebalance(&places, &database, dry_run, wait).await
        }
        Command::Group {
            command:
                GroupCommand::Add {
                    dir,
                    store,
                    proxy_api,
                    wait_timeout,
                },
        } => {
            if store.given() {
                crate::group_add_hosts::run(crate::group_add_hosts::AddArgs {
                    store: &store,
                    layout: dir.layout()?,
                    proxy_api: proxy_api.as_deref(),
                    wait: std::time::Duration::from_secs(wait_timeout),
                })
                .await
            } else {
                crate::group_add::run(&dir.layout()?).await
            }
        }
        Command::Copy { command } => crate::copy::run(command).await,
        Command::Backup(BackupArgs {
            command: Some(BackupCommand::List(list)),
            ..
        }) if list.store.given() => {
            crate::backup_list_hosts::run(&list.store, list.config.as_deref()).await
        }
        Command::Backup(BackupArgs {
            command: Some(BackupCommand::List(list)),
            ..
        }) => crate::backup::list(&list.dir.layout()?),
        Command::Backup(BackupArgs {
            command:
                Some(BackupCommand::RestorePoint {
                    name,
                    dir,
                    store,
                    proxy_api,
                }),
            ..
        }) => {
            if store.given() {
                crate::restore_point_hosts::run(&store, &dir.layout()?, &name, proxy_api.as_deref())
                    .await
            } else {
                crate::restore_point::run(&dir.layout()?, &name).await
            }
        }
        Command::Backup(args) if args.store.given() => {
            crate::backup_hosts::run(&args.store, &args.dir.layout()?, args.group, args.kind).await
        }
        Command::Backup(args) => {
            crate::backup::run(&args.dir.layout()?, args.kind, args.from_primary).await
        }
        Command::Restore(args) => crate::restore::run(args).await,
        Command::Certs {
            command: crate::certs::CertsCommand::Rotate(args),
        } => crate::certs_rotate::run(args).await,
        Command::Certs { command } => crate::certs::run(command),
        Command::Secrets { command } => crate::secrets_cmd::run(command).await,
        Command::Agent(args) => crate::hosts::agent(args).await,
        Command::AgentWatchdog(args) => crate::hosts::watchdog(args),
        Command::Proxy(args) => crate::hosts::proxy(args).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shell lines of the README's "Several hosts" section (every sh block in it): comments
    /// dropped, continued lines (a trailing `\`) joined.
    fn several_hosts_block() -> Vec<String> {
        let readme = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"));
        let section = readme
            .split("\n## ")
            .find(|s| s.starts_with("Several hosts"))
            .expect("README has a \"Several hosts\" section");
        // Every sh block of the section, in order.
        let blocks: Vec<&str> = section
            .split("```sh\n")
            .skip(1)
            .filter_map(|b| b.split("\n```").next())
            .collect();
        assert!(!blocks.is_empty(), "the section has a sh block");
        let mut lines = Vec::new();
        let mut current = String::new();
        for raw in blocks.iter().flat_map(|b| b.lines()) {
            let line = raw.split(" # ").next().unwrap_or_default().trim();
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            match line.strip_suffix('\\') {
                Some(head) => {
                    current.push_str(head);
                    current.push(' ');
                }
                None => {
                    current.push_str(line);
                    lines.push(std::mem::take(&mut current));
                }
            }
        }
        lines
    }

    /// Each `herd …` line of the README's multi-host block parses with the CLI's definitions
    /// and names its store itself: pasted into a fresh shell (no HERD_* variables), every
    /// command reaches the cluster in etcd, not a `herd up` data directory.
    #[test]
    fn readme_commands_parse() {
        // An empty environment as far as the CLI reads it (clap's `env = "HERD_…"`).
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("HERD_") {
                std::env::remove_var(key);
            }
        }
        let lines = several_hosts_block();
        let mut kinds = Vec::new();
        for line in lines.iter().filter(|l| l.starts_with("herd ")) {
            let words: Vec<&str> = line.split_whitespace().collect();
            let cli = Cli::try_parse_from(&words)
                .unwrap_or_else(|e| panic!("README line does not parse: {line}\n{e}"));
            let (kind, store) = match &cli.command {
                Command::Agent(a) => ("agent", Some(&a.store)),
                Command::Proxy(a) => ("proxy", Some(&a.store)),
                Command::Status(a) => ("status", Some(&a.store)),
                Command::Switchover(a) => ("switchover", Some(&a.store)),
                Command::Failover(a) => ("failover", Some(&a.store)),
                Command::Config {
                    command: ConfigCommand::Set { store, .. },
                } => ("config", Some(store)),
                Command::Group {
                    command: GroupCommand::Add { store, .. },
                } => ("group add", Some(store)),
                Command::Shards {
                    command: ShardsCommand::Rebalance { store, .. },
                } => ("rebalance", Some(store)),
                _ => ("other", None),
            };
            let store = store.unwrap_or_else(|| panic!("not a multi-host command: {line}"));
            assert!(
                store.dcs.is_some() && store.cluster.is_some(),
                "{line}: without --dcs and --cluster it needs an earlier export"
            );
            kinds.push(kind);
        }
        for wanted in ["agent", "proxy", "status", "switchover", "config"] {
            assert!(
                kinds.contains(&wanted),
                "no `herd {wanted}` line found in the block"
            );
        }
        // scp -r into a directory that does not exist yet copies `secrets` as that directory
        // (or fails): each copy follows the `install -d` of its target.
        for (i, line) in lines.iter().enumerate() {
            if let Some(target) = line
                .strip_prefix("scp ")
                .and_then(|l| l.split_whitespace().last())
            {
                let dir = target.trim_end_matches('/');
                assert!(
                    lines[..i]
                        .iter()
                        .rev()
                        .take_while(|l| !l.starts_with("herd "))
                        .any(|l| l.starts_with("install -d -m 0700 ") && l.ends_with(dir)),
                    "`{line}` is not preceded by `install -d -m 0700 {dir}`"
                );
            }
        }
    }
}
