//! Starting an agent: checks that fail clearly before anything changes (binaries, ports, a
//! second agent on the directory or under the name, missing secrets), then the watchdog, the
//! API and the rounds; on shutdown the server stops and the lease is given up.

use std::sync::Arc;
use std::time::Duration;

use herd_cluster::{Layout, Secrets, SupervisorLock, REPLICATION_USER};
use herd_dcs::Dcs;
use herd_pg::{OsUser, Pg, PgBinaries};
use rand::distributions::{Alphanumeric, DistString};
use tokio::sync::watch;

use crate::api::{self, Shared};
use crate::member::{member_key, Member, INITIALIZE};
use crate::node::Node;
use crate::run::Agent;
use crate::store::StoreClient;
use crate::watchdog::Deadline;
use crate::{AgentConfig, AgentError};

fn setup(e: impl std::fmt::Display) -> AgentError {
    AgentError::Setup(e.to_string())
}

/// Runs the agent of `cfg` over `dcs` until `shutdown` turns true. `watchdog` is the command
/// that runs [`crate::watchdog::run`] in a separate process (the `herd` binary re-executed);
/// it is given the deadline file, the data directory and this process's pid.
pub async fn run(
    cfg: AgentConfig,
    dcs: Arc<dyn Dcs>,
    watchdog: std::process::Command,
    shutdown: watch::Receiver<bool>,
) -> Result<(), AgentError> {
    cfg.validate().map_err(setup)?;
    let pg = Pg::new(
        PgBinaries::locate(cfg.postgres.bindir.as_deref())?,
        OsUser::for_servers(&cfg.postgres.os_user)?,
    );
    let layout = Layout::new(&cfg.data_dir);
    for dir in [cfg.data_dir.clone(), layout.logs(), layout.run()] {
        std::fs::create_dir_all(&dir)
            .map_err(|e| setup(format!("cannot create {}: {e}", dir.display())))?;
    }
    let _lock = SupervisorLock::acquire(&layout).map_err(setup)?;
    // Cluster-wide keys live at the root; the group's own under groups/<g>/ (group 0: the root).
    let root = StoreClient::new(dcs.clone());
    if cfg.group > 0 {
        let mut waiting = shutdown.clone();
        if !crate::groups::wait_for_group_zero(&root, cfg.group, &mut waiting).await? {
            return Ok(());
        }
    }
    let dcs = crate::groups::scoped(dcs, cfg.group);
    let store = StoreClient::new(dcs.clone());
    let instance = Alphanumeric.sample_string(&mut rand::thread_rng(), 12);
    let (secrets, fresh_secrets) = secrets(&cfg, &layout, dcs.as_ref())?;
    let key = Arc::new(api::ApiKey::from_password(&secrets.superuser));
    check_name(&cfg, &store, &instance, key.clone()).await?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let tls = crate::tls::prepare(&cfg, &layout, now)?;
    let pg = match &tls {
        Some(t) => {
            tracing::info!(
                "TLS on: PostgreSQL serves {}; replication verifies peers with {}",
                t.server.cert_file.display(),
                t.ca_file.display()
            );
            pg.with_peer_tls(t.peer())
        }
        None => pg,
    };
    // The certificate's files too: PostgreSQL reads its key as its own OS user.
    pg.hand_over(&cfg.data_dir)?;
    if let Some(user) = pg.os_user() {
        user.check_access(&cfg.data_dir)?;
    }
    let listener = tokio::net::TcpListener::bind(cfg.api_listen)
        .await
        .map_err(|e| {
            setup(format!(
                "cannot listen on {} for the agent's API ({e}); choose another --api-listen",
                cfg.api_listen
            ))
        })?;
    let deadline = Deadline::new(cfg.fence_file());
    deadline
        .adopt()
        .map_err(|e| setup(format!("cannot write {}: {e}", cfg.fence_file().display())))?;
    let mut watchdog = watchdog;
    watchdog
        .arg(cfg.fence_file())
        .arg(cfg.pgdata())
        .arg(std::process::id().to_string());
    let child = watchdog
        .spawn()
        .map_err(|e| setup(format!("cannot start the fencing watchdog: {e}")))?;
    tracing::info!("fencing watchdog running (pid {})", child.id());
    let shared = Arc::new(std::sync::Mutex::new(Shared {
        ttl: cfg.ttl,
        group: cfg.group,
        ..Shared::default()
    }));
    let mut api_shutdown = shutdown.clone();
    let router = api::router(api::Api {
        state: shared.clone(),
        store: store.clone(),
        key,
        nonces: Arc::default(),
    });
    tokio::spawn(async move {
        let service = router.into_make_service_with_connect_info::<std::net::SocketAddr>();
        let _ = axum::serve(listener, service)
            .with_graceful_shutdown(async move {
                let _ = api_shutdown.changed().await;
            })
            .await;
    });
    let node = Node {
        primary_settings: (
            String::new(),
            cfg.bootstrap.commit_mode.synchronous_commit().into(),
        ),
        cfg: cfg.clone(),
        pg,
        layout,
        secrets,
        upstream: None,
        wal_compression: None,
        fresh_secrets,
        next_superuser: None,
        log_watch: crate::pglog::LogWatch::new(cfg.pg_log()),
        prober: Default::default(),
        tls,
    };
    let mut agent = Agent::new(
        node,
        store.clone(),
        deadline.clone(),
        shared,
        instance,
        root,
    );
    let result = agent.run(shutdown).await;
    // Leaving: stop the server, then give the lease up so a replica takes over at once.
    tracing::info!("stopping PostgreSQL");
    if let Err(e) = agent
        .node
        .pg
        .stop(&cfg.pgdata(), herd_pg::StopMode::Fast)
        .await
    {
        if herd_pg::postmaster_pid(&cfg.pgdata())
            .ok()
            .flatten()
            .is_some()
        {
            tracing::warn!("fast stop failed ({e}); fencing");
            let _ = agent.node.fence();
        }
    }
    let _ = deadline.disarm();
    let _ = store.release(&cfg.name).await;
    result
}

/// Refuses a second live agent under the same member name (on another host).
async fn check_name(
    cfg: &AgentConfig,
    store: &StoreClient,
    instance: &str,
    api_key: Arc<api::ApiKey>,
) -> Result<(), AgentError> {
    let key = member_key(&cfg.name);
    let dcs = store.dcs();
    let existing = tokio::task::spawn_blocking(move || dcs.get(&key))
        .await
        .map_err(setup)?
        .map_err(|e| setup(format!("{e}; start etcd or check --dcs")))?;
    let Some(v) = existing else { return Ok(()) };
    let Ok(other) = serde_json::from_slice::<Member>(&v.value) else {
        return Ok(());
    };
    if other.instance == instance {
        return Ok(());
    }
    if let api::Fetched::Member(live) =
        api::fetch_member(other.api.clone(), Duration::from_secs(2), api_key).await
    {
        if live.name == cfg.name && live.instance == other.instance {
            return Err(setup(format!(
                "another agent named {} is running (its API at {} answers); give each host its own --name",
                cfg.name, other.api
            )));
        }
    }
    Ok(())
}

/// The cluster's passwords: read from `secrets/`, made afresh (`true`) by an agent that may
/// create the cluster, else a clear request to copy them from the first host.
fn secrets(
    cfg: &AgentConfig,
    layout: &Layout,
    dcs: &dyn Dcs,
) -> Result<(Secrets, bool), AgentError> {
    if layout.secrets().join("superuser.password").exists() {
        return Secrets::load(layout).map(|s| (s, false)).map_err(setup);
    }
    let initialized = dcs
        .get(INITIALIZE)
        .map_err(|e| setup(format!("{e}; start etcd or check --dcs")))?
        .is_some();
    // Every shard group shares group 0's passwords (group 0 exists: waited for above).
    if initialized || cfg.group > 0 {
        return Err(setup(format!(
            "this cluster exists but {} is missing: copy the secrets directory (mode 0700, files 0600) \
             from the host that created it, e.g. `scp -rp host1:{} {}`",
            layout.secrets().display(),
            layout.secrets().display(),
            cfg.data_dir.display()
        )));
    }
    let secrets = Secrets::generate();
    secrets.save(layout, REPLICATION_USER).map_err(setup)?;
    tracing::warn!(
        "generated the cluster's passwords in {}; copy that directory to every other host before starting its agent",
        layout.secrets().display()
    );
    Ok((secrets, true))
}
