//! Herd's client endpoint: a PostgreSQL wire-protocol proxy that pools server connections,
//! sends reads to replicas and writes to the primary, and keeps read-your-writes by WAL LSN.
//!
//! Layout: `session` (one client: startup, units, relay), `router` (target choice and answer
//! tracking, pure), `pool` / `server` (server connections), `monitor` / `topology` (positions
//! and lag of the nodes), `users` (SCRAM verifiers and keys), `analysis` (SQL facts from
//! `herd-sql`), `cancel`, `metrics`.

pub mod analysis;
pub mod cancel;
pub mod catalog;
pub mod client;
pub mod commit_gate;
mod drained;
mod error;
mod feed;
pub mod merge;
pub mod metrics;
mod metrics_help;
pub mod monitor;
pub mod pool;
pub mod restore_point;
mod roles;
pub mod router;
pub mod server;
mod server_stream;
pub mod session;
pub mod shards;
pub mod tls;
pub mod tls_stream;
pub mod topology;
pub mod users;
mod views;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use herd_config::ProxyConfig;
use herd_core::NodeName;
use herd_sql::ClassifierCache;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use error::ProxyError;

use crate::cancel::CancelRegistry;
use crate::catalog::ProcCatalog;
use crate::metrics::Metrics;
use crate::monitor::AdminLogin;
use crate::pool::Pools;
use crate::topology::{Assignment, LagLimits, TopologyView};
use crate::users::Users;

/// Statements whose classification is kept.
const CLASSIFIER_CAPACITY: usize = 10_000;
/// Longest pause of new work (a switchover normally takes well under it).
const PAUSE_LIMIT: Duration = Duration::from_secs(30);
/// How long a client waits for a primary to appear before its write fails.
const PRIMARY_WAIT: Duration = Duration::from_secs(10);

/// How long a login waits for a primary before checking its password on a replica (or
/// failing at once when none answers): short, so a client's 2 s connect timeout still sees the
/// proxy's answer.
const LOGIN_PRIMARY_WAIT: Duration = Duration::from_millis(500);

/// The error while no member has ever led `group` (its agents are still electing one).
fn no_leader_yet(group: u32) -> ProxyError {
    ProxyError::Unavailable(format!(
        "no member leads group {group} yet; the agents are electing one, retry in a few seconds"
    ))
}

/// ParameterStatus name/value pairs.
type ServerParams = Vec<(String, String)>;

/// A user, a database and the ParameterStatus messages their new clients receive.
type ClientParams = (String, String, Arc<[u8]>);

/// Shared by every session of the proxy.
pub struct ProxyContext {
    /// Settings.
    pub config: ProxyConfig,
    /// Each shard group's topology and primary (index = group; never empty). Grows when a group is
    /// added while the proxy runs; only the first `visible` are served.
    views: RwLock<Vec<feed::GroupFeed>>,
    /// How many groups sessions use: a group added while the proxy runs counts once it holds
    /// everything the others share (`shards::add_group`).
    visible: std::sync::atomic::AtomicU32,
    /// Server connection pools.
    pub pools: Pools,
    /// Roles, verifiers and keys.
    pub users: Users,
    catalog: RwLock<Arc<ProcCatalog>>,
    /// Statement classifications by text.
    pub classifier: ClassifierCache,
    /// Client cancel keys.
    pub cancels: CancelRegistry,
    /// Counters for `/metrics`.
    pub metrics: Metrics,
    /// Secret for mock authentication of unknown roles.
    pub mock_secret: Vec<u8>,
    avoided: Mutex<HashMap<NodeName, Instant>>,
    /// The ParameterStatus messages new clients receive, encoded, by settings hash, then user
    /// and database (looked up without building a key: a connect-per-transaction client asks
    /// on every login).
    params: Mutex<HashMap<u64, Vec<ClientParams>>>,
    paused: watch::Sender<bool>,
    /// Passed by two-phase commits' second phases, closed by restore points across groups.
    pub commits: commit_gate::CommitGate,
    tokens: std::sync::atomic::AtomicU64,
    /// Server-side statement name → generation of the last client Close of it.
    closed: Mutex<HashMap<String, u64>>,
    /// The schema generation: raised whenever what statements kept prepared on servers refer
    /// to may have changed (see [`ProxyContext::schema_changed`]).
    schema: std::sync::atomic::AtomicU64,
    /// The superuser login of the proxy's own connections (shard map changes).
    admin: AdminLogin,
    /// TLS for clients, when configured.
    pub tls: Option<tls::ServerTls>,
    /// Shard maps by database.
    shard_maps: shards::ShardMaps,
    /// Two-phase work left in doubt is resolved by the cluster's coordinator (multi-host), not
    /// by this proxy: see [`ProxyContext::leave_in_doubt_to_coordinator`].
    in_doubt_elsewhere: std::sync::atomic::AtomicBool,
}

impl ProxyContext {
    /// The superuser's password was rotated (`herd secrets rotate`): the proxy's own new
    /// connections log in with `password` (those it keeps stay up, already authenticated),
    /// and the next login as that role reads its verifier afresh instead of the one cached.
    /// Called when the password files changed (the proxy's own logins may have taken up the
    /// new password already, from [`ProxyContext::next_admin_password`]).
    pub fn rotate_admin_password(&self, password: &str) {
        self.admin.password.set(password);
        self.users.forget(&self.admin.user);
        tracing::info!("the superuser's password was rotated: new connections use the new one");
    }

    /// A rotation of the superuser's password is under way with `next` as the new one (`None`:
    /// none is): the proxy's own logins try it when the current one is refused.
    pub fn next_admin_password(&self, next: Option<&str>) {
        self.admin.password.set_next(next);
    }

    /// Leaves the background resolution of two-phase work in doubt to the cluster's elected
    /// coordinator (`herd agent`), so that a cluster with many proxies resolves it in one place.
    /// Called right after [`Proxy::start`] (the resolver's first round comes seconds later).
    pub fn leave_in_doubt_to_coordinator(&self) {
        self.in_doubt_elsewhere
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether [`ProxyContext::leave_in_doubt_to_coordinator`] was called.
    pub fn in_doubt_resolved_elsewhere(&self) -> bool {
        self.in_doubt_elsewhere
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The function catalog in use.
    pub fn catalog(&self) -> Arc<ProcCatalog> {
        self.catalog.read().map(|c| c.clone()).unwrap_or_default()
    }

    /// The address of the function catalog in use, to tell whether it is one seen before
    /// (never dereferenced; taken without cloning the catalog's handle).
    pub fn catalog_ptr(&self) -> *const ProcCatalog {
        self.catalog
            .read()
            .map_or(std::ptr::null(), |c| Arc::as_ptr(&c))
    }

    /// `/metrics`: the counters, plus gauges of the read pool, the server pools and the
    /// classification cache as they are now.
    pub fn render_metrics(&self) -> String {
        use std::fmt::Write;
        let mut out = self.metrics.render();
        let views: Vec<Arc<TopologyView>> = (0..self.groups()).map(|g| self.view_of(g)).collect();
        let view = &views[0];
        let header = crate::metrics_help::header;
        out.push_str(&header("herd_primary_available", "gauge"));
        let _ = writeln!(
            out,
            "herd_primary_available {}",
            u8::from(view.primary.is_some())
        );
        if views.len() > 1 {
            out.push_str(&header("herd_group_primary_available", "gauge"));
            for (g, v) in views.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "herd_group_primary_available{{group=\"{g}\"}} {}",
                    u8::from(v.primary.is_some())
                );
            }
        }
        let replicas: Vec<_> = views.iter().flat_map(|v| v.replicas.iter()).collect();
        out.push_str(&header("herd_replica_lag_bytes", "gauge"));
        for r in &replicas {
            let _ = writeln!(
                out,
                "herd_replica_lag_bytes{{node=\"{}\"}} {}",
                r.endpoint.name, r.lag_bytes
            );
        }
        out.push_str(&header("herd_replica_staleness_seconds", "gauge"));
        for r in &replicas {
            let s = r.staleness.map_or(f64::NAN, |d| d.as_secs_f64());
            let _ = writeln!(
                out,
                "herd_replica_staleness_seconds{{node=\"{}\"}} {s}",
                r.endpoint.name
            );
        }
        out.push_str(&header("herd_replica_in_read_pool", "gauge"));
        for r in &replicas {
            let _ = writeln!(
                out,
                "herd_replica_in_read_pool{{node=\"{}\"}} {}",
                r.endpoint.name,
                u8::from(r.healthy && r.in_read_pool)
            );
        }
        let pools = self.pools.snapshot();
        let labels = |p: &pool::PoolStats| {
            format!(
                "node=\"{}\",user=\"{}\",database=\"{}\"",
                p.node,
                escape(&p.user),
                escape(&p.database)
            )
        };
        out.push_str(&header("herd_pool_connections", "gauge"));
        for p in &pools {
            let l = labels(p);
            let _ = writeln!(
                out,
                "herd_pool_connections{{{l},state=\"in_use\"}} {}",
                p.in_use
            );
            let _ = writeln!(
                out,
                "herd_pool_connections{{{l},state=\"idle\"}} {}",
                p.idle
            );
        }
        type Field = fn(&pool::PoolStats) -> f64;
        let counters: [(&str, &str, Field); 4] = [
            ("herd_pool_waits_total", "counter", |p| p.waits as f64),
            ("herd_pool_wait_seconds_total", "counter", |p| {
                p.wait_seconds
            }),
            ("herd_pool_timeouts_total", "counter", |p| p.timeouts as f64),
            ("herd_pool_connects_total", "counter", |p| p.connects as f64),
        ];
        for (name, kind, value) in counters {
            out.push_str(&header(name, kind));
            for p in &pools {
                let _ = writeln!(out, "{name}{{{}}} {}", labels(p), value(p));
            }
        }
        let stats = self.classifier.stats();
        out.push_str(&header("herd_classifier_cache_hits_total", "counter"));
        let _ = writeln!(out, "herd_classifier_cache_hits_total {}", stats.hits);
        out.push_str(&header("herd_classifier_cache_misses_total", "counter"));
        let _ = writeln!(out, "herd_classifier_cache_misses_total {}", stats.misses);
        out
    }

    /// A number no other call returns (tokens of clients' unnamed statements).
    pub fn next_token(&self) -> u64 {
        self.tokens
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1
    }

    /// The generation a newly parsed statement `server_name` gets: after a client closed it,
    /// newer than every server's copy, so each server prepares it afresh.
    pub fn closed_generation(&self, server_name: &str) -> u64 {
        self.closed
            .lock()
            .ok()
            .and_then(|m| m.get(server_name).copied())
            .unwrap_or(0)
    }

    /// The schema generation now (a value of [`ProxyContext::next_token`]'s sequence, like
    /// a statement's generation after a client's Close of it). A named statement a client
    /// parses gets it, and a server's copy prepared before it is not used for that statement:
    /// the client gets what a fresh prepare gives, as on a new connection. Statements the
    /// client parsed before the change keep their server's copy, which PostgreSQL revalidates
    /// as it would the client's own (0A000 when the result type changed).
    pub fn schema_generation(&self) -> u64 {
        self.schema.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Something may have changed what statements kept prepared on servers refer to: DDL
    /// through the endpoint (raised when the server confirms it, and again when its
    /// transaction ends), or a server's error saying a kept statement is out of date (DDL from
    /// elsewhere). Every server connection prepares its kept statements again on demand.
    pub fn schema_changed(&self) {
        let generation = self.next_token();
        self.schema
            .fetch_max(generation, std::sync::atomic::Ordering::AcqRel);
        self.metrics.inc("herd_schema_changes_total", "");
    }

    /// A client closed statement `server_name`.
    pub fn note_closed(&self, server_name: &str) {
        let generation = self.next_token();
        if let Ok(mut m) = self.closed.lock() {
            if m.len() >= CLOSED_CAPACITY {
                // Forgetting makes old copies look current again: rare, and no worse than a
                // statement the server re-validates itself.
                m.clear();
            }
            m.insert(server_name.to_string(), generation);
        }
    }

    /// The ParameterStatus messages a new client of `user` on `database` receives in
    /// transaction pooling, encoded: a real server's parameters, after the client's own startup
    /// settings were applied there, so they read as PostgreSQL would report them to this
    /// client. Cached by settings.
    pub async fn client_params(
        &self,
        user: &str,
        database: &str,
        state: &session::state::SessionState,
    ) -> Result<Arc<[u8]>, ProxyError> {
        let cached = self.params.lock().ok().and_then(|m| {
            m.get(&state.hash)?
                .iter()
                .find(|(u, d, _)| u == user && d == database)
                .map(|(_, _, p)| p.clone())
        });
        if let Some(p) = cached {
            return Ok(p);
        }
        let primary = self.current_primary().await?;
        let creds = self
            .users
            .credentials(user)
            .ok_or_else(|| ProxyError::AuthFailed(user.to_string()))?;
        let pool = self.pools.get_by(&primary, user, database);
        let mut lease = pool
            .acquire(
                &creds,
                Duration::from_millis(self.config.pool_wait_ms),
                Duration::from_secs(5),
            )
            .await?;
        if lease.conn.state_hash != state.hash {
            // A setting the server rejects fails the login, as it would on PostgreSQL (the
            // connection, in an unknown state, is closed rather than returned).
            lease.conn.internal_query(&state.replay_sql()).await?;
            lease.conn.state_hash = state.hash;
        }
        // The connection's parameters as last reported: the login's, updated by every report.
        let mut encoded = Vec::new();
        for (name, value) in &lease.conn.params {
            herd_wire::encode::parameter_status(&mut encoded, name, value)?;
        }
        lease.release();
        let encoded: Arc<[u8]> = encoded.into();
        if let Ok(mut m) = self.params.lock() {
            if m.values().map(Vec::len).sum::<usize>() >= PARAMS_CAPACITY {
                m.clear();
            }
            m.entry(state.hash).or_default().push((
                user.to_string(),
                database.to_string(),
                encoded.clone(),
            ));
        }
        Ok(encoded)
    }
}

/// Statement names whose last Close is remembered.
const CLOSED_CAPACITY: usize = 100_000;

/// Distinct (user, database, settings) whose parameters are kept.
const PARAMS_CAPACITY: usize = 1_000;

/// Applies `reported` ParameterStatus values over `params` (the last report of a name wins).
pub fn overlay_params(params: &mut ServerParams, reported: &[(String, String)]) {
    for (name, value) in reported {
        match params.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = value.clone(),
            None => params.push((name.clone(), value.clone())),
        }
    }
}

/// A Prometheus label value with `\\`, `"` and newlines escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A running proxy.
pub struct Proxy {
    /// Shared state (metrics for `/metrics`).
    pub ctx: Arc<ProxyContext>,
}

impl Proxy {
    /// Starts the monitors (one per shard group: `assignments[g]` is group g's roles), the
    /// catalog loader and the accept loop on `listener`; everything stops when `shutdown`
    /// turns true. A group's roles are an [`Assignment`], or an `Option<Assignment>` that is
    /// `None` until a member first leads (`herd proxy` serves at once, before any election).
    pub fn start<A>(
        config: ProxyConfig,
        assignments: Vec<watch::Receiver<A>>,
        login: AdminLogin,
        listener: TcpListener,
        tls: Option<tls::ServerTls>,
        shutdown: watch::Receiver<bool>,
    ) -> Proxy
    where
        A: Clone + Into<Option<Assignment>> + Send + Sync + 'static,
    {
        let limits = lag_limits(&config);
        let interval = Duration::from_millis(config.poll_interval_ms);
        let mut views = Vec::new();
        for assignment in assignments {
            let (views_tx, views_rx) = watch::channel(Arc::new(TopologyView::default()));
            tokio::spawn(monitor::run(
                assignment,
                login.clone(),
                interval,
                limits,
                views_tx,
                shutdown.clone(),
            ));
            views.push(feed::GroupFeed::follow(views_rx));
        }
        if views.is_empty() {
            // No group given: a proxy with no servers, whose clients are told so.
            views.push(feed::GroupFeed::empty());
        }
        let groups = views.len() as u32;
        let ctx = Arc::new(ProxyContext {
            pools: Pools::new(config.pool_size as usize, login.tls.clone()),
            config,
            views: RwLock::new(views),
            visible: std::sync::atomic::AtomicU32::new(groups),
            users: Users::new(login.clone()),
            catalog: RwLock::new(Arc::new(ProcCatalog::default())),
            classifier: ClassifierCache::new(CLASSIFIER_CAPACITY),
            cancels: CancelRegistry::default(),
            metrics: Metrics::default(),
            mock_secret: (0..32).map(|_| rand::random::<u8>()).collect(),
            avoided: Mutex::new(HashMap::new()),
            params: Mutex::new(HashMap::new()),
            paused: watch::channel(false).0,
            commits: commit_gate::CommitGate::default(),
            tokens: std::sync::atomic::AtomicU64::new(0),
            closed: Mutex::new(HashMap::new()),
            schema: std::sync::atomic::AtomicU64::new(0),
            admin: login.clone(),
            tls,
            shard_maps: shards::ShardMaps::default(),
            in_doubt_elsewhere: std::sync::atomic::AtomicBool::new(false),
        });
        tokio::spawn(load_catalog(ctx.clone(), login, shutdown.clone()));
        tokio::spawn(shards::resolve_in_doubt(ctx.clone(), shutdown.clone()));
        tokio::spawn(accept(listener, ctx.clone(), shutdown));
        Proxy { ctx }
    }
}

/// When a replica leaves and rejoins the read pool.
fn lag_limits(config: &ProxyConfig) -> LagLimits {
    LagLimits {
        max_bytes: config.max_replica_lag_bytes,
        max_staleness: Duration::from_millis(config.max_replica_lag_ms),
        readmit_fraction: config.readmit_fraction,
    }
}

async fn accept(
    listener: TcpListener,
    ctx: Arc<ProxyContext>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tokio::spawn(session::serve_client(stream, ctx.clone()));
                }
                Err(e) => {
                    tracing::warn!("accepting a client failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = shutdown.changed() => {
                if *shutdown.borrow() {
                    return;
                }
            }
        }
    }
}

/// Loads `pg_proc` from the primary now and every 30 s (new functions become known).
async fn load_catalog(
    ctx: Arc<ProxyContext>,
    login: AdminLogin,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        if let Some(primary) = ctx.view().primary.clone() {
            if let Some(client) =
                monitor::admin_connect(&primary, &login, Duration::from_secs(3)).await
            {
                match ProcCatalog::load(&client).await {
                    Ok(c) => {
                        if let Ok(mut slot) = ctx.catalog.write() {
                            *slot = Arc::new(c);
                        }
                    }
                    Err(e) => tracing::warn!("loading pg_proc failed: {e}"),
                }
            }
        }
        let wait = if ctx.catalog().is_empty() {
            Duration::from_millis(200)
        } else {
            Duration::from_secs(30)
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => if *shutdown.borrow() { return },
        }
    }
}
