//! `herd agent`, its fencing watchdog, and `herd proxy`: a cluster over several hosts, kept
//! in an etcd cluster.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use herd_agent::member::ClusterSettings;
use herd_agent::store::StoreClient;
use herd_agent::AgentConfig;
use herd_cluster::{Layout, Secrets};
use herd_dcs::{Dcs, EtcdConfig, EtcdDcs};
use tokio::sync::watch;

/// Where the cluster's store is: shared by `herd agent`, `herd proxy` and the commands that
/// act on a multi-host cluster (given `--dcs`, they act on it instead of a data directory).
#[derive(Debug, Args, Clone)]
pub struct StoreArgs {
    /// A multi-host cluster's etcd: etcd://h1:2379,h2:2379,h3:2379 (etcds:// for TLS).
    #[arg(long, env = "HERD_DCS", value_name = "URL", requires = "cluster")]
    pub dcs: Option<String>,
    /// The Herd cluster's name in etcd (its keys live under /herd/NAME/).
    #[arg(long, env = "HERD_CLUSTER", value_name = "NAME")]
    pub cluster: Option<String>,
    /// TLS: the CA certificate that signed etcd's certificates (PEM).
    #[arg(long, value_name = "FILE")]
    pub etcd_ca: Option<PathBuf>,
    /// TLS: this client's certificate (PEM), with --etcd-key.
    #[arg(long, value_name = "FILE", requires = "etcd_key")]
    pub etcd_cert: Option<PathBuf>,
    /// TLS: this client's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
    /// etcd user name (authentication on), with --etcd-password-file.
    #[arg(long, requires = "etcd_password_file")]
    pub etcd_user: Option<String>,
    /// File holding the etcd user's password.
    #[arg(long, value_name = "FILE", requires = "etcd_user")]
    pub etcd_password_file: Option<PathBuf>,
    /// How long one store operation may take before the store counts as unreachable.
    #[arg(long, default_value = "2000", value_name = "MS")]
    pub etcd_timeout_ms: u64,
}

impl StoreArgs {
    /// Whether a store was named (the command then acts on a multi-host cluster).
    pub fn given(&self) -> bool {
        self.dcs.is_some()
    }

    /// Connects to the store off the async threads.
    pub async fn open(&self) -> anyhow::Result<StoreClient> {
        let args = self.clone();
        let dcs = tokio::task::spawn_blocking(move || args.connect()).await??;
        Ok(StoreClient::new(dcs))
    }

    /// Connects to the store and takes shard group `group`'s view of it (group 0: the root).
    pub async fn open_group(&self, group: u32) -> anyhow::Result<StoreClient> {
        let root = self.open().await?;
        Ok(StoreClient::new(herd_agent::groups::scoped(
            root.dcs(),
            group,
        )))
    }

    /// How many shard groups the cluster has (1 before it is created).
    pub async fn groups(&self) -> anyhow::Result<u32> {
        let root = self.open().await?;
        Ok(herd_agent::groups::count(&root)
            .await
            .map_err(anyhow::Error::msg)?
            .unwrap_or(1))
    }

    /// The shard group whose member `name` is (searched in every group), for operator verbs
    /// given `--to NAME` without `--group`; group 0 when no group has it.
    pub async fn group_of(&self, name: &str) -> anyhow::Result<u32> {
        let root = self.open().await?;
        for g in 0..self.groups().await? {
            let store = StoreClient::new(herd_agent::groups::scoped(root.dcs(), g));
            let read = store.read().await.map_err(anyhow::Error::msg)?;
            if read.store.members.iter().any(|m| m.name == name) {
                return Ok(g);
            }
        }
        Ok(0)
    }

    /// The shard group an operator verb acts on: `--group`, else the group of `--to`, else 0.
    pub async fn verb_group(&self, group: Option<u32>, to: Option<&str>) -> anyhow::Result<u32> {
        match (group, to) {
            (Some(g), _) => Ok(g),
            (None, Some(name)) => self.group_of(name).await,
            (None, None) => Ok(0),
        }
    }

    /// Connects to the store (blocking; call off the async threads or before serving).
    pub fn connect(&self) -> anyhow::Result<Arc<dyn Dcs>> {
        let config = self.etcd_config()?;
        let url = self.dcs.as_deref().unwrap_or_default();
        let dcs = EtcdDcs::connect(&config)
            .with_context(|| format!("cannot reach etcd at {url}; start it or correct --dcs"))?;
        Ok(Arc::new(dcs))
    }

    /// The etcd client's settings these options name.
    pub fn etcd_config(&self) -> anyhow::Result<EtcdConfig> {
        let (Some(url), Some(cluster)) = (&self.dcs, &self.cluster) else {
            anyhow::bail!(
                "--dcs etcd://host:port[,host:port…] and --cluster NAME are required (or HERD_DCS and HERD_CLUSTER)"
            );
        };
        let mut config = EtcdConfig::from_url(url, cluster)?;
        config.ca_file = self.etcd_ca.clone();
        config.client_cert = self.etcd_cert.clone().zip(self.etcd_key.clone());
        if let (Some(user), Some(file)) = (&self.etcd_user, &self.etcd_password_file) {
            let password = std::fs::read_to_string(file)
                .with_context(|| format!("reading the etcd password from {}", file.display()))?;
            config.credentials = Some((user.clone(), password.trim().to_string()));
        }
        config.timeout = Duration::from_millis(self.etcd_timeout_ms);
        Ok(config)
    }
}

/// Options of `herd agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// This member's name, unique in the cluster (lower-case letters, digits, '_').
    #[arg(long)]
    pub name: String,
    /// The shard group this node belongs to (0 to --shard-groups − 1).
    #[arg(long, default_value_t = 0, value_name = "G")]
    pub group: u32,
    /// When the cluster is created (by a group 0 agent): how many shard groups it has.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub shard_groups: u32,
    /// The agent's directory (PostgreSQL's data, secrets, logs). When secrets/ holds the
    /// cluster's CA (`herd certs init`), PostgreSQL serves TLS with tls/NAME.crt (issued at
    /// start from secrets/ca.key, or by `herd certs issue`) and replication verifies it.
    #[arg(long, env = "HERD_DATA_DIR", default_value = "herd-agent")]
    pub data_dir: PathBuf,
    /// The address PostgreSQL listens on.
    #[arg(long, default_value = "127.0.0.1")]
    pub pg_listen: IpAddr,
    /// PostgreSQL's port.
    #[arg(long, default_value_t = 5432)]
    pub pg_port: u16,
    /// The address other hosts and proxies reach PostgreSQL on (default: --pg-listen).
    #[arg(long)]
    pub pg_advertise: Option<String>,
    /// Where the agent's API listens.
    #[arg(long, default_value = "127.0.0.1:8008")]
    pub api_listen: SocketAddr,
    /// The address other agents reach the API on (default: --api-listen).
    #[arg(long)]
    pub api_advertise: Option<String>,
    /// Serve the live dashboard and HTTP API of the whole cluster here (every group's status
    /// and events from the store, /cluster/metrics, switchover/failover/config), e.g.
    /// 127.0.0.1:8080; beyond 127.0.0.1 requests need the token in --data-dir's secrets.
    #[arg(long, value_name = "ADDR")]
    pub dashboard_listen: Option<SocketAddr>,
    /// The leader lease's time to live.
    #[arg(long, default_value_t = 10_000, value_name = "MS")]
    pub ttl_ms: u64,
    /// Time between rounds.
    #[arg(long, default_value_t = 1_000, value_name = "MS")]
    pub loop_wait_ms: u64,
    /// The primary fences itself this long before its lease could expire.
    #[arg(long, default_value_t = 2_500, value_name = "MS")]
    pub safety_margin_ms: u64,
    /// Fence as soon as the lease runs out even if every member confirms the store is down
    /// for them too (failsafe mode is on by default).
    #[arg(long)]
    pub no_failsafe: bool,
    /// When the cluster is created: its commit mode.
    #[arg(long, default_value = "on")]
    pub commit_mode: String,
    /// When the cluster is created: ANY k / FIRST k.
    #[arg(long, default_value = "ANY 1")]
    pub sync_standbys: String,
    /// Directory of the PostgreSQL 15 server programs (overrides postgres.bindir).
    #[arg(long)]
    pub pg_bindir: Option<PathBuf>,
    /// A herd.toml whose [postgres] section sets the server's settings (shared_buffers,
    /// wal_keep_size, … — the same keys as for `herd up`); the defaults otherwise. Its
    /// [backup] (a repository every host sees, or [backup.s3]) turns on WAL archiving and
    /// `herd backup --dcs`. Its [supervisor] failover_timeout_ms, hung_timeout_ms (at most
    /// --ttl-ms minus --safety-margin-ms) and restart_backoff_ms apply as in `herd up`.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

fn absolute(p: &std::path::Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("invalid directory {}", p.display()))
}

/// `herd agent`.
pub async fn agent(args: AgentArgs) -> anyhow::Result<()> {
    crate::up::init_logging();
    let bootstrap = ClusterSettings {
        commit_mode: args.commit_mode.parse()?,
        sync_standbys: args.sync_standbys.parse()?,
        ..ClusterSettings::default()
    };
    let file_config = match &args.config {
        Some(path) => herd_config::Config::load(path)?,
        None => herd_config::Config::default(),
    };
    let mut postgres = file_config.postgres.clone();
    if args.pg_bindir.is_some() {
        postgres.bindir = args.pg_bindir.clone();
    }
    let backup = file_config.backup.is_enabled();
    let (ttl, loop_wait, safety_margin) = (
        Duration::from_millis(args.ttl_ms),
        Duration::from_millis(args.loop_wait_ms),
        Duration::from_millis(args.safety_margin_ms),
    );
    let (policy, capped) = herd_agent::policy::Policy::for_agent_config(
        ttl,
        loop_wait,
        safety_margin,
        &file_config.supervisor,
    );
    if let Some(why) = capped {
        tracing::warn!("{why}");
    }
    let cfg = AgentConfig {
        name: args.name.clone(),
        group: args.group,
        shard_groups: args.shard_groups,
        data_dir: absolute(&args.data_dir)?,
        pg_listen: args.pg_listen,
        pg_port: args.pg_port,
        pg_advertise: args
            .pg_advertise
            .clone()
            .unwrap_or_else(|| args.pg_listen.to_string()),
        api_listen: args.api_listen,
        api_advertise: args
            .api_advertise
            .clone()
            .unwrap_or_else(|| args.api_listen.to_string()),
        ttl,
        loop_wait,
        safety_margin,
        failsafe: !args.no_failsafe,
        bootstrap,
        postgres,
        paths: None,
        backup,
        archive_lag_warning_s: file_config.backup.archive_lag_warning_s,
        replicas_from_repository: backup && file_config.backup.replicas_from_repository,
        policy,
    };
    if backup {
        // Before the server starts: its archive_command reads this configuration.
        let config_dir = args
            .config
            .as_deref()
            .and_then(|p| absolute(p).ok())
            .and_then(|p| p.parent().map(std::path::Path::to_path_buf))
            .unwrap_or_default();
        crate::agent_backup::prepare(&cfg, &file_config.backup, &config_dir)?;
    }
    let root = args.store.open().await?;
    let dcs = root.dcs();
    let mut watchdog = std::process::Command::new(
        std::env::current_exe().context("locating the herd binary for the watchdog")?,
    );
    watchdog.arg("agent-watchdog");
    std::os::unix::process::CommandExt::process_group(&mut watchdog, 0);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    tokio::spawn(async move {
        let _ = crate::up::wait_for_signal().await;
        let _ = shutdown_tx.send(true);
    });
    if let Some(listen) = args.dashboard_listen {
        let layout = Layout::new(cfg.data_dir.clone());
        crate::agent_dashboard::serve(listen, &layout, root, shutdown_rx.clone()).await?;
    }
    // Logical copies' slots carried to this member while it is a replica (failover-safe copies).
    crate::agent_slots::spawn(
        &cfg,
        herd_agent::groups::scoped(dcs.clone(), cfg.group),
        shutdown_rx.clone(),
    )?;
    if backup {
        // The stanza while this agent leads, and the backups `herd backup --dcs` asks of it.
        crate::agent_backup::spawn(
            &cfg,
            &file_config.backup,
            herd_agent::groups::scoped(dcs.clone(), cfg.group),
            dcs.clone(),
            shutdown_rx.clone(),
        )?;
    }
    // Work done once for the whole cluster, by whichever agent holds the coordinator lease.
    crate::coordinator_tasks::spawn(
        dcs.clone(),
        cfg.data_dir.clone(),
        cfg.name.clone(),
        cfg.ttl,
        shutdown_rx.clone(),
    );
    herd_agent::launch::run(cfg, dcs, watchdog, shutdown_rx).await?;
    Ok(())
}

/// Options of the hidden `herd agent-watchdog` (started by `herd agent`).
#[derive(Debug, Args)]
pub struct WatchdogArgs {
    /// The deadline file.
    pub deadline: PathBuf,
    /// The data directory to fence.
    pub pgdata: PathBuf,
    /// The agent's pid.
    pub agent_pid: u32,
}

/// `herd agent-watchdog`: its own process (and process group, so the terminal's Ctrl-C meant
/// for the agent does not reach it), so a frozen agent still fences in time. It exits once its
/// agent is gone with nothing armed.
pub fn watchdog(args: WatchdogArgs) -> anyhow::Result<()> {
    herd_agent::watchdog::run(&args.deadline, &args.pgdata, args.agent_pid);
    Ok(())
}

/// Options of `herd proxy`.
#[derive(Debug, Args)]
pub struct ProxyArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Where clients connect.
    #[arg(long, default_value = "127.0.0.1:6432")]
    pub listen: SocketAddr,
    /// A directory holding the cluster's `secrets/` (copied from the first agent's host): the
    /// proxy logs in to watch replica positions.
    #[arg(long, env = "HERD_DATA_DIR", default_value = "herd-agent")]
    pub data_dir: PathBuf,
    /// A herd.toml whose [proxy] section sets pooling, consistency and lag limits (the same
    /// keys as for `herd up`); the defaults otherwise.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// PEM certificate (chain) for TLS with clients (overrides proxy.tls_cert_file).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Its PEM private key, mode 0600 (overrides proxy.tls_key_file).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Refuse clients that do not use TLS.
    #[arg(long)]
    pub tls_required: bool,
    /// Serve the HTTP API and live dashboard here (status of every group from the store,
    /// this proxy's metrics, switchover/failover/config); beyond 127.0.0.1 requests need the
    /// token kept in --data-dir's secrets.
    #[arg(long, value_name = "ADDR")]
    pub api_listen: Option<SocketAddr>,
}

/// What `herd proxy` says when it cannot load the cluster's passwords: the directory it looked
/// in and the commands that put them there (the proxy's host is often not an agent's).
fn missing_secrets(layout: &Layout) -> String {
    let root = layout.root().display();
    format!(
        "herd proxy needs the cluster's passwords and looked for them in {} (from --data-dir {root}); \
         copy the secrets directory of the host whose agent created the cluster, e.g. \
         `install -d -m 0700 {root} && scp -rp HOST:AGENT_DATA_DIR/secrets {root}/`, \
         or point --data-dir at a directory holding secrets/",
        layout.secrets().display()
    )
}

/// `herd proxy`: the endpoint as its own process, following the leader lease in etcd.
pub async fn proxy(args: ProxyArgs) -> anyhow::Result<()> {
    crate::up::init_logging();
    let layout = Layout::new(absolute(&args.data_dir)?);
    let secrets = Secrets::load(&layout).with_context(|| missing_secrets(&layout))?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}; choose another --listen", args.listen))?;
    let (mut config, base) = match &args.config {
        Some(path) => (
            herd_config::Config::load(path)?.proxy,
            absolute(path)?
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default(),
        ),
        None => (
            herd_config::Config::default().proxy,
            absolute(Path::new("."))?,
        ),
    };
    let cwd = absolute(Path::new("."))?;
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        config.tls_cert_file = cwd.join(cert).display().to_string();
        config.tls_key_file = cwd.join(key).display().to_string();
    }
    config.tls_required |= args.tls_required;
    let tls = crate::client_tls::load(&config, &base)?;
    let server_tls = crate::client_tls::to_servers(&config, &layout.secrets())?;
    tracing::info!(
        "TLS to the servers: {}",
        server_tls
            .as_ref()
            .map_or("off".to_string(), |t| format!("{:?}", t.mode()))
    );
    let root = args.store.open().await?;
    // Serve at once: until a member leads, logins are refused with 57P03 and a message saying
    // so (a client's connect timeout is shorter than an election). One bounded read of each
    // group first, so a proxy (re)started under a running cluster routes from its first poll.
    let known = crate::proxy_groups::groups_at_start(&root).await;
    let (recorded, served) = known.unwrap_or((1, 1));
    let mut receivers = Vec::new();
    let mut followers = Vec::new();
    for g in 0..recorded {
        let (rx, follower) = crate::proxy_groups::group(&root, g).await;
        receivers.push(rx);
        followers.push(follower);
    }
    // Groups recorded but not admitted yet (`herd group add --dcs` under way) are followed
    // but not served until `POST /groups` admits them.
    let pending = receivers.split_off(served.min(recorded).max(1) as usize);
    let group0 = receivers[0].clone();
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let login = herd_proxy::monitor::AdminLogin {
        user: herd_cluster::SUPERUSER.into(),
        password: secrets.superuser.clone().into(),
        tls: server_tls,
    };
    // Registered before it serves anyone: shard map changes see every proxy that may route.
    let registry = crate::proxy_registry::Registry::start(
        &root,
        &args.listen.to_string(),
        // An API on every address is registered by no address the others could use.
        args.api_listen
            .filter(|a| !a.ip().is_unspecified())
            .map(|a| a.to_string()),
        shutdown_rx.clone(),
    )
    .await?;
    let proxy =
        herd_proxy::Proxy::start(config, receivers, login, listener, tls, shutdown_rx.clone());
    proxy
        .ctx
        .set_map_gate(Arc::new(crate::proxy_registry::Gate(registry.clone())));
    // Closed while another proxy takes a restore point across the groups.
    registry.set_commit_gate(proxy.ctx.commits.clone());
    // The agents' elected coordinator resolves two-phase work left in doubt, once for the
    // cluster, not each proxy.
    proxy.ctx.leave_in_doubt_to_coordinator();
    // A rotated secrets directory copied here (`herd secrets rotate`) is taken up at once.
    crate::secrets_cmd::follow_rotations(layout.clone(), proxy.ctx.clone(), shutdown_rx.clone());
    // A rotation across hosts (`herd secrets rotate --dcs`) reaches it through the store.
    registry.follow_rotations(layout.clone(), shutdown_rx.clone());
    for rx in pending {
        proxy.ctx.add_group(rx, shutdown_rx.clone());
    }
    // A planned switchover of any group holds new work here instead of sending it to a
    // stopping primary.
    let holds = crate::proxy_groups::Holds::new(proxy.ctx.clone());
    // Groups admitted through another proxy are served here too, once this proxy serves the
    // groups the cluster was created with (at once, or when it learnt them).
    let admitted = crate::proxy_groups::Admitted::new(
        root.clone(),
        proxy.ctx.clone(),
        holds.clone(),
        shutdown_rx.clone(),
    );
    if let Some(api) = args.api_listen {
        let endpoint = format!("postgresql://postgres@{}/postgres", args.listen);
        crate::proxy_api::serve(
            api,
            &layout,
            root.clone(),
            proxy.ctx.clone(),
            endpoint,
            None,
            Some(crate::proxy_group_add::adder(
                root.clone(),
                proxy.ctx.clone(),
                holds.clone(),
                shutdown_rx.clone(),
            )),
            Some(point_taker(
                proxy.ctx.clone(),
                registry.clone(),
                root.clone(),
                layout.clone(),
            )),
            shutdown_rx.clone(),
        )
        .await?;
    }
    for follower in followers {
        crate::proxy_groups::spawn(follower, &holds, shutdown_rx.clone());
    }
    let learning = match known {
        Some(_) => {
            registry.serve_groups(admitted);
            None
        }
        None => Some(tokio::spawn(async move {
            let learnt =
                crate::proxy_groups::learn(root, proxy.ctx.clone(), group0, holds, shutdown_rx)
                    .await;
            if learnt.is_ok() {
                registry.serve_groups(admitted);
            }
            learnt
        })),
    };
    eprintln!("Serving the cluster on {}", args.listen);
    let outcome = match learning {
        Some(learning) => {
            tokio::select! {
                signal = crate::up::wait_for_signal() => signal,
                learnt = learning => match learnt {
                    Ok(Err(e)) => Err(anyhow::anyhow!(e)),
                    // Learnt (or nothing to learn): serve until a signal.
                    _ => crate::up::wait_for_signal().await,
                },
            }
        }
        None => crate::up::wait_for_signal().await,
    };
    let _ = shutdown_tx.send(true);
    outcome
}

/// `POST /restore-point` of this proxy: one point at a time, every other proxy held.
fn point_taker(
    ctx: Arc<herd_proxy::ProxyContext>,
    registry: Arc<crate::proxy_registry::Registry>,
    root: herd_agent::store::StoreClient,
    layout: Layout,
) -> crate::proxy_api::TakePoint {
    let one = Arc::new(tokio::sync::Mutex::new(()));
    Arc::new(move |name: String| {
        let (ctx, registry, root, layout, one) = (
            ctx.clone(),
            registry.clone(),
            root.clone(),
            layout.clone(),
            one.clone(),
        );
        Box::pin(async move {
            let _one = one.lock().await;
            crate::restore_point_hosts::take(&ctx, &registry, &root, &layout, &name)
                .await
                .map_err(|e| format!("{e:#}"))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_secrets_names_the_directory_and_the_copy() {
        let text = missing_secrets(&Layout::new("/srv/proxy"));
        assert!(text.contains("/srv/proxy/secrets"), "{text}");
        assert!(
            text.contains(
                "install -d -m 0700 /srv/proxy && scp -rp HOST:AGENT_DATA_DIR/secrets /srv/proxy/"
            ),
            "{text}"
        );
    }
}
