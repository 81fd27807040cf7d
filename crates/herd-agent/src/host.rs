//! `herd up` on the agent engine: one agent per local node, all in this process, over one
//! embedded store kept in the data directory (`store.json`), each group's agents over that
//! group's view of it. The data directory keeps the old engine's layout (`nodes/<node>/`,
//! `logs/<node>.log`, ports from `[network]`, `sockets/`).
//!
//! What differs from `herd agent` ([`crate::launch`]):
//! - no watchdog process and no failsafe: the store lives in this process, so a frozen process
//!   freezes the store with it and no other holder can appear; a leader whose own task stalls
//!   loses the lease to a member that fences the old leader's server before promoting
//!   ([`crate::run::PeerFence`]);
//! - no agent API: nothing outside this process asks the agents anything;
//! - on shutdown the servers stop leader first and the lease is *kept* (it is in the store
//!   file), so the next `herd up` resumes with the same primary.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use herd_cluster::{Layout, Secrets, REPLICATION_USER};
use herd_config::Config;
use herd_core::NodeName;
use herd_dcs::{Dcs, EmbeddedDcs};
use herd_pg::{Pg, SharedProber};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::Shared;
use crate::config::{AgentConfig, NodePaths};
use crate::member::{decode, encode, ClusterSettings, CONFIG, INITIALIZE};
use crate::node::Node;
use crate::policy::{Policy, MAX_RESTART_BACKOFF};
use crate::run::{Agent, PeerFence};
use crate::store::StoreClient;
use crate::watchdog::Deadline;
use crate::AgentError;

pub mod archive;
pub mod from_repository;
pub mod migrate;
pub mod projection;

/// The store's file in a `herd up` data directory.
pub fn store_path(layout: &Layout) -> PathBuf {
    layout.root().join("store.json")
}

fn setup(e: impl std::fmt::Display) -> AgentError {
    AgentError::Setup(e.to_string())
}

/// The lease timings of `herd up`'s agents, from `[supervisor]`: a round every
/// `probe_interval_ms`; the lease outlives `hung_timeout_ms` by the margin (two rounds), so
/// a leader whose server is silent abdicates (an explicit step) before its lease could expire,
/// and the TTL only matters for an agent task that stalled.
pub struct Timings {
    /// Time between rounds.
    pub loop_wait: Duration,
    /// The leader lease's time to live.
    pub ttl: Duration,
    /// The margin the agent keeps before the lease could expire.
    pub safety_margin: Duration,
    /// Dead-vs-hung timeouts and restart back-off.
    pub policy: Policy,
}

impl Timings {
    /// The timings `config` asks for.
    pub fn of(config: &Config) -> Timings {
        let s = &config.supervisor;
        let loop_wait = Duration::from_millis(s.probe_interval_ms.max(10));
        let safety_margin = loop_wait * 2;
        let failover_timeout = Duration::from_millis(s.failover_timeout_ms);
        let hung_timeout = Duration::from_millis(s.hung_timeout_ms).max(failover_timeout);
        // At least 2 s (the agent's rule) and twice the margin (so the margin is at most half).
        let ttl = (hung_timeout + safety_margin)
            .max(Duration::from_secs(2))
            .max(safety_margin * 2);
        Timings {
            loop_wait,
            ttl,
            safety_margin,
            policy: Policy {
                restart_backoff: Duration::from_millis(s.restart_backoff_ms),
                max_restart_backoff: MAX_RESTART_BACKOFF,
                failover_timeout,
                hung_timeout,
            },
        }
    }
}

/// One local node: its group, its index in the group, its name.
#[derive(Clone, Debug)]
pub struct LocalNode {
    /// The shard group.
    pub group: u32,
    /// Its index in the group (its port is the group's port block + index).
    pub index: usize,
    /// Its name (`node<i>`, `g<G>_node<i>`).
    pub name: NodeName,
}

/// Every node `config` describes, group by group.
pub fn local_nodes(config: &Config) -> Vec<LocalNode> {
    (0..config.cluster.shards.max(1))
        .flat_map(|group| {
            (0..=config.cluster.replicas as usize).map(move |index| LocalNode {
                group,
                index,
                name: NodeName::in_group(group, index),
            })
        })
        .collect()
}

/// One agent's task.
type AgentTask = JoinHandle<Result<(), AgentError>>;

/// The agents of a running `herd up`.
pub struct Host {
    layout: Layout,
    /// herd.toml as of the last start or `herd group add` (its group count grows).
    config: std::sync::Mutex<Config>,
    pg: Pg,
    root: Arc<dyn Dcs>,
    secrets: Secrets,
    shutdown: watch::Sender<bool>,
    agents: std::sync::Mutex<Vec<(LocalNode, AgentTask)>>,
    /// Each agent's prober, shared with the status probes of this process.
    probers: std::sync::Mutex<HashMap<NodeName, SharedProber>>,
    projection: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Host {
    /// Opens the store of `layout` and starts one agent per node of `config` (group 0's
    /// first). The caller holds the data directory's `SupervisorLock`.
    pub async fn start(layout: Layout, config: Config, pg: Pg) -> Result<Host, AgentError> {
        for dir in [
            layout.root().to_path_buf(),
            layout.nodes(),
            layout.logs(),
            layout.run(),
        ] {
            std::fs::create_dir_all(&dir)
                .map_err(|e| setup(format!("cannot create {}: {e}", dir.display())))?;
        }
        let secrets = if layout.secrets().join("superuser.password").exists() {
            Secrets::load(&layout).map_err(setup)?
        } else {
            let s = Secrets::generate();
            s.save(&layout, REPLICATION_USER).map_err(setup)?;
            s
        };
        let sockets = layout.sockets();
        if herd_pg::socket_dir_fits(&sockets) {
            // Open to the servers' OS user only (handed over below), as the old engine makes it.
            use std::os::unix::fs::DirBuilderExt;
            match std::fs::DirBuilder::new().mode(0o700).create(&sockets) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                    return Err(setup(format!("cannot create {}: {e}", sockets.display())))
                }
                _ => {}
            }
        }
        pg.hand_over(layout.root())?;
        if let Some(user) = pg.os_user() {
            user.check_access(layout.root())?;
        }
        let fresh = !store_path(&layout).exists();
        let store = EmbeddedDcs::open(&store_path(&layout))
            .map_err(|e| AgentError::Store(e.to_string()))?;
        let root: Arc<dyn Dcs> = Arc::new(store);
        let timings = Timings::of(&config);
        // Made by the supervisor engine: its state.json files become the store's records.
        let migrated =
            fresh && migrate::from_state_json(&layout, &config, &pg, &root, timings.ttl).await? > 0;
        if fresh && !migrated {
            // Recorded before any agent runs: a group ≥ 1 agent that found group 0's creation
            // claimed before its creator recorded the count would take the cluster for one
            // made before groups existed (one group) and stop.
            crate::groups::record_count(
                &StoreClient::new(root.clone()),
                config.cluster.shards.max(1),
            )
            .await
            .map_err(AgentError::Store)?;
        } else if !fresh {
            settings_from_config(&root, &config)?;
        }
        // Groups in herd.toml beyond the recorded count are new (`herd up --shards N` on an
        // existing cluster): recorded before their agents run, created like a new cluster's.
        let recorded = match crate::groups::count(&StoreClient::new(root.clone())).await {
            Ok(Some(n)) if !fresh || migrated => n,
            _ => 0,
        };
        if !fresh && config.cluster.shards.max(1) > recorded {
            crate::groups::raise_count(&root, config.cluster.shards.max(1))
                .map_err(AgentError::Store)?;
        }
        let (shutdown, stop_rx) = watch::channel(false);
        let mut agents = Vec::new();
        let mut probers = HashMap::new();
        for node in local_nodes(&config) {
            let creating = node.group >= recorded;
            let (task, prober) = spawn_agent(
                (&layout, &config, &pg, &secrets, &root, &timings),
                node.clone(),
                creating,
                stop_rx.clone(),
            );
            probers.insert(node.name.clone(), prober);
            agents.push((node, task));
        }
        let projection = tokio::spawn(projection::run(
            layout.clone(),
            config.clone(),
            root.clone(),
            timings.loop_wait,
            stop_rx,
        ));
        Ok(Host {
            layout,
            config: std::sync::Mutex::new(config),
            pg,
            root,
            secrets,
            shutdown,
            agents: std::sync::Mutex::new(agents),
            probers: std::sync::Mutex::new(probers),
            projection: std::sync::Mutex::new(Some(projection)),
        })
    }

    /// `herd group add`: starts the agents of the next shard group (`config` is herd.toml
    /// with the new count), its node 0 creating it as in a new cluster; its number. The
    /// caller admits the group to the endpoint once it has a primary.
    pub async fn add_group(&self, config: &Config) -> Result<u32, AgentError> {
        let group = self.config().cluster.shards.max(1);
        if config.cluster.shards.max(1) != group + 1 {
            return Err(setup(format!(
                "adding shard group {group} needs herd.toml with {} groups",
                group + 1
            )));
        }
        crate::groups::raise_count(&self.root, group + 1).map_err(AgentError::Store)?;
        let timings = Timings::of(config);
        let stop = self.shutdown.subscribe();
        // The passwords as they are now: `herd secrets rotate` may have replaced them.
        let secrets = self.secrets();
        let new: Vec<_> = local_nodes(config)
            .into_iter()
            .filter(|n| n.group == group)
            .map(|node| {
                let (task, prober) = spawn_agent(
                    (
                        &self.layout,
                        config,
                        &self.pg,
                        &secrets,
                        &self.root,
                        &timings,
                    ),
                    node.clone(),
                    true,
                    stop.clone(),
                );
                self.probers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(node.name.clone(), prober);
                (node, task)
            })
            .collect();
        self.agents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(new);
        *self.config.lock().unwrap_or_else(|e| e.into_inner()) = config.clone();
        Ok(group)
    }

    fn config(&self) -> Config {
        self.config
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The store's root (cluster-wide keys; group g's keys under `groups/<g>/`).
    pub fn root(&self) -> Arc<dyn Dcs> {
        self.root.clone()
    }

    /// Each local node's prober: status probes made through them reuse the agents'
    /// monitoring sessions instead of opening a second one per server.
    pub fn probers(&self) -> HashMap<NodeName, SharedProber> {
        self.probers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The cluster's passwords as `secrets/` holds them now (`herd secrets rotate` replaces
    /// them while the cluster runs); those read at start when the files cannot be read.
    pub fn secrets(&self) -> Secrets {
        Secrets::load(&self.layout).unwrap_or_else(|_| self.secrets.clone())
    }

    /// The first agent that stopped on its own (an error an operator must fix), if any.
    pub fn failed(&self) -> Option<String> {
        self.agents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(_, t)| t.is_finished())
            .map(|(n, _)| format!("the agent of {} stopped", n.name))
    }

    /// Stops the agents (no further decision), then the servers of each group, its leader
    /// first so it sends its shutdown checkpoint to the standbys before they stop (the old
    /// engine's `stop_all` order). The leader lease stays in the store file: the next start
    /// resumes with the same primary.
    pub async fn stop(&self) -> Result<(), AgentError> {
        let _ = self.shutdown.send(true);
        let mut first_error = None;
        let agents = std::mem::take(&mut *self.agents.lock().unwrap_or_else(|e| e.into_inner()));
        for (node, task) in agents {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::error!("the agent of {} failed: {e}", node.name);
                    first_error = first_error.or(Some(e));
                }
                Err(e) => tracing::error!("the agent of {} panicked: {e}", node.name),
            }
        }
        let projection = self
            .projection
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(p) = projection {
            let _ = p.await;
        }
        let root = StoreClient::new(self.root.clone());
        let config = self.config();
        for group in 0..config.cluster.shards.max(1) {
            let leader = projection::leader(&root, group).await;
            let mut order: Vec<NodeName> = local_nodes(&config)
                .into_iter()
                .filter(|n| n.group == group)
                .map(|n| n.name)
                .collect();
            order.sort_by_key(|n| Some(n.as_str()) != leader.as_deref());
            for name in order {
                let dir = self.layout.node(&name);
                if herd_pg::postmaster_pid(&dir).ok().flatten().is_none() {
                    continue;
                }
                tracing::info!("stopping {name}");
                if let Err(e) = self.pg.stop(&dir, herd_pg::StopMode::Fast).await {
                    tracing::warn!("fast stop of {name} failed ({e}); killing it");
                    let _ = herd_pg::kill_server(&dir);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Starts the agent of `node`; `creating`: its group is being created now, so node 0 creates
/// it and leads first, as with the old engine (tests, docs and operators expect `node0` as the
/// first primary), and the others start once it claimed the creation.
fn spawn_agent(
    (layout, config, pg, secrets, root, timings): (
        &Layout,
        &Config,
        &Pg,
        &Secrets,
        &Arc<dyn Dcs>,
        &Timings,
    ),
    node: LocalNode,
    creating: bool,
    stop: watch::Receiver<bool>,
) -> (AgentTask, SharedProber) {
    let agent = build_agent(layout, config, pg, secrets, root, &node, timings);
    let prober = agent.node.prober.clone();
    let root_client = StoreClient::new(root.clone());
    let group = node.group;
    let first = node.index == 0;
    let task = tokio::spawn(async move {
        if creating && !first {
            let mut waiting = stop.clone();
            if !wait_for_creation(&root_client, group, &mut waiting).await {
                return Ok(());
            }
        }
        if group > 0 {
            let mut waiting = stop.clone();
            if !crate::groups::wait_for_group_zero(&root_client, group, &mut waiting).await? {
                return Ok(());
            }
        }
        let mut agent = agent;
        agent.run(stop).await
    });
    (task, prober)
}

/// How often a node waits for its group's creation to be claimed by node 0.
const CREATION_STEP: Duration = Duration::from_millis(100);

/// Waits until group `group`'s `initialize` key exists; `false` when `stop` came first.
async fn wait_for_creation(
    root: &StoreClient,
    group: u32,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let store = StoreClient::new(crate::groups::scoped(root.dcs(), group));
    loop {
        if let Ok(Some(_)) = store.get::<serde_json::Value>(INITIALIZE).await {
            return true;
        }
        tokio::select! {
            _ = tokio::time::sleep(CREATION_STEP) => {}
            _ = stop.changed() => return false,
        }
    }
}

/// herd.toml is what the operator edits on one host: its commit settings (`[cluster]`,
/// `[group.N]`) replace each group's `config` record when they differ, before any agent reads
/// it. Other recorded settings (the failover lag bound) stay.
fn settings_from_config(root: &Arc<dyn Dcs>, config: &Config) -> Result<(), AgentError> {
    let store = |e: herd_dcs::DcsError| AgentError::Store(e.to_string());
    for group in 0..config.cluster.shards.max(1) {
        let dcs = crate::groups::scoped(root.clone(), group);
        let Some(current) = dcs.get(CONFIG).map_err(store)? else {
            continue;
        };
        let Ok(recorded) = decode::<ClusterSettings>(CONFIG, &current.value) else {
            continue;
        };
        let wanted = config.for_group(group).cluster;
        let next = ClusterSettings {
            commit_mode: wanted.commit_mode,
            sync_standbys: wanted.sync_standbys,
            ..recorded.clone()
        };
        if next != recorded {
            tracing::info!(
                "group {group}: commit settings from herd.toml ({:?}, {})",
                next.commit_mode,
                next.sync_standbys
            );
            dcs.compare_and_set(CONFIG, current.revision, encode(&next))
                .map_err(store)?;
        }
    }
    Ok(())
}

/// The agent of `node`, with `herd up`'s paths, ports and timings.
fn build_agent(
    layout: &Layout,
    config: &Config,
    pg: &Pg,
    secrets: &Secrets,
    root: &Arc<dyn Dcs>,
    node: &LocalNode,
    timings: &Timings,
) -> Agent {
    let group_config = config.for_group(node.group);
    let listen = config.network.listen_address;
    let host = if listen.is_unspecified() {
        std::net::IpAddr::from([127, 0, 0, 1])
    } else {
        listen
    };
    let sockets = layout.sockets();
    let cfg = AgentConfig {
        name: node.name.to_string(),
        group: node.group,
        shard_groups: config.cluster.shards.max(1),
        data_dir: layout.root().to_path_buf(),
        pg_listen: listen,
        pg_port: config.group_node_port(node.group, node.index),
        pg_advertise: host.to_string(),
        // No agent API in `herd up` (nothing outside the process asks the agents).
        api_listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        api_advertise: String::new(),
        ttl: timings.ttl,
        loop_wait: timings.loop_wait,
        safety_margin: timings.safety_margin,
        failsafe: false,
        bootstrap: ClusterSettings {
            commit_mode: group_config.cluster.commit_mode,
            sync_standbys: group_config.cluster.sync_standbys,
            ..ClusterSettings::default()
        },
        postgres: config.postgres.clone(),
        paths: Some(NodePaths {
            pgdata: layout.node(&node.name),
            pg_log: layout.node_log(&node.name),
            run_dir: layout.run(),
            socket_dir: herd_pg::socket_dir_fits(&sockets).then_some(sockets),
        }),
        backup: false,
        archive_lag_warning_s: config.backup.archive_lag_warning_s,
        replicas_from_repository: config.backup.replicas_from_repository,
        policy: timings.policy,
    };
    let dcs = crate::groups::scoped(root.clone(), node.group);
    let shared = Arc::new(std::sync::Mutex::new(Shared {
        ttl: cfg.ttl,
        group: cfg.group,
        ..Shared::default()
    }));
    let peers: Vec<PathBuf> = local_nodes(config)
        .into_iter()
        .filter(|n| n.group == node.group && n.name != node.name)
        .map(|n| layout.node(&n.name))
        .collect();
    let fence: PeerFence = Arc::new(move |me: &str| fence_writable_peers(me, &peers));
    let built = Node {
        primary_settings: (
            String::new(),
            cfg.bootstrap.commit_mode.synchronous_commit().into(),
        ),
        cfg: cfg.clone(),
        pg: pg.clone(),
        layout: layout.clone(),
        secrets: secrets.clone(),
        upstream: None,
        wal_compression: None,
        fresh_secrets: false,
        next_superuser: None,
        log_watch: crate::pglog::LogWatch::new(cfg.pg_log()),
        prober: Default::default(),
        // `herd up`'s nodes listen on loopback only: no TLS between them.
        tls: None,
    };
    // Armed and disarmed by the rounds as in `herd agent`; no watchdog reads it here.
    let deadline = Deadline::new(cfg.fence_file());
    let store = StoreClient::new(dcs);
    Agent::new(
        built,
        store,
        deadline,
        shared,
        node.name.to_string(),
        StoreClient::new(root.clone()),
    )
    .with_peer_fence(fence)
}

/// Kills the server of every peer data directory that is not a standby (no `standby.signal`):
/// before `me` promotes, no other node of its group may still accept writes. A standby's
/// server is left alone (it cannot write).
fn fence_writable_peers(me: &str, peers: &[PathBuf]) {
    for dir in peers {
        if !may_write(dir) {
            continue;
        }
        tracing::warn!(
            "{me} promotes: fencing the server in {} (not a standby)",
            dir.display()
        );
        if let Err(e) = herd_pg::kill_server(dir) {
            tracing::error!("cannot fence {}: {e}", dir.display());
        }
    }
}

/// A data directory whose server may accept writes if it runs: it exists and is no standby.
fn may_write(dir: &Path) -> bool {
    dir.join("PG_VERSION").exists() && !dir.join("standby.signal").exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_follow_the_supervisor_section() {
        let mut config = Config::default();
        config.supervisor.probe_interval_ms = 500;
        config.supervisor.failover_timeout_ms = 2000;
        config.supervisor.hung_timeout_ms = 8000;
        let t = Timings::of(&config);
        assert_eq!(t.loop_wait, Duration::from_millis(500));
        assert_eq!(t.safety_margin, Duration::from_secs(1));
        assert_eq!(t.ttl, Duration::from_secs(9));
        assert_eq!(t.policy.failover_timeout, Duration::from_secs(2));
        assert_eq!(t.policy.hung_timeout, Duration::from_secs(8));
        // The agent's own rules on lease timings hold.
        assert!(t.safety_margin >= t.loop_wait * 2 && t.safety_margin * 2 <= t.ttl);
    }

    #[test]
    fn local_nodes_are_named_and_numbered_per_group() {
        let mut config = Config::default();
        config.cluster.shards = 2;
        config.cluster.replicas = 1;
        let names: Vec<String> = local_nodes(&config)
            .iter()
            .map(|n| format!("{}:{}:{}", n.group, n.index, n.name))
            .collect();
        assert_eq!(
            names,
            ["0:0:node0", "0:1:node1", "1:0:g1_node0", "1:1:g1_node1"]
        );
    }

    #[test]
    fn only_non_standbys_may_write() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        assert!(!may_write(d), "no data directory");
        std::fs::write(d.join("PG_VERSION"), "15").expect("write");
        assert!(may_write(d), "a primary's directory");
        std::fs::write(d.join("standby.signal"), "").expect("write");
        assert!(!may_write(d), "a standby's directory");
    }
}
