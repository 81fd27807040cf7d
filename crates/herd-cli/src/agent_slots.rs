//! Logical copies' slots on a multi-host replica: PostgreSQL 15 keeps a logical slot on the
//! primary only, so each replica's agent process copies the primary's copy slots (`herd_copy_*`)
//! into its own data directory and moves them forward, exactly as the one-host supervisor does
//! for every replica (herd-copy's `SlotSync`, the method and its proof in `herd_copy::slots`).
//! Only this host can write its data directory, hence one keeper per replica, not one for the
//! cluster. Loading a newly copied slot takes a restart, asked through the store like `herd
//! restart --node` (the replica leaves the read pool first); herd-copy asks for it only when the
//! primary keeps acknowledging commits without this replica.

use std::sync::Arc;
use std::time::Duration;

use herd_agent::config::AgentConfig;
use herd_agent::store::StoreClient;
use herd_cluster::{Layout, Secrets};
use herd_copy::sync::{ReplicaRef, RestartFn, SlotSync};
use herd_dcs::Dcs;
use herd_pg::{ConnSpec, OsUser, Pg, PgBinaries};
use tokio::sync::watch;

/// How often the slots are brought in line (the one-host supervisor's round).
const EVERY: Duration = Duration::from_secs(1);

/// Keeps this member's copy slots in line with its group leader's while it is a streaming
/// replica, until `shutdown`. `group` is the group's view of the store.
pub fn spawn(
    cfg: &AgentConfig,
    group: Arc<dyn Dcs>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let pg = Pg::new(
        PgBinaries::locate(cfg.postgres.bindir.as_deref())?,
        OsUser::for_servers(&cfg.postgres.os_user)?,
    );
    let me = cfg.name.clone();
    let layout = Layout::new(&cfg.data_dir);
    let datadir = cfg.pgdata();
    let local_host = if cfg.pg_listen.is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        cfg.pg_listen.to_string()
    };
    let port = cfg.pg_port;
    // With a CA (not for `herd up`-style nodes, which serve no TLS) the servers take the
    // superuser from other hosts over TLS only; this server's certificate names its advertised
    // address, not the listen address dialled here.
    let tls = match cfg.paths {
        Some(_) => None,
        None => crate::client_tls::to_cluster(&layout)?,
    };
    let local_tls = match &tls {
        Some(t) => Some(t.expecting(&cfg.pg_advertise)?),
        None => None,
    };
    let store = StoreClient::new(group);
    tokio::spawn(async move {
        let mut sync = SlotSync::default();
        let mut shutdown = shutdown;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(EVERY) => {}
                _ = shutdown.changed() => return,
            }
            let Ok(password) = Secrets::load(&layout).map(|s| s.superuser) else {
                continue;
            };
            let Ok(read) = store.read().await else {
                continue;
            };
            let s = &read.store;
            let mine = s.members.iter().find(|m| m.name == me);
            let leader = s
                .leader
                .as_deref()
                .and_then(|l| s.members.iter().find(|m| m.name == l))
                .filter(|m| m.role == "primary");
            let (Some(mine), Some(leader)) = (mine, leader) else {
                continue;
            };
            // Only a replica streaming from the leader: its replay position is the bound the
            // slots are advanced to, and a member rejoining or cloning has no stable data yet.
            if mine.role != "replica" || mine.streaming_from.as_deref() != Some(&leader.name) {
                continue;
            }
            let spec = |host: &str, port: u16, tls: &Option<herd_pg::ClientTls>| ConnSpec {
                host: host.to_string(),
                port,
                user: herd_cluster::SUPERUSER.into(),
                password: password.clone(),
                dbname: "postgres".into(),
                timeout: Duration::from_secs(2),
                tls: tls.clone(),
            };
            let replica = ReplicaRef {
                name: me.clone(),
                conn: spec(&local_host, port, &local_tls),
                datadir: datadir.clone(),
            };
            let restart_store = store.clone();
            let restart: RestartFn = Arc::new(move |name: String| {
                let store = restart_store.clone();
                Box::pin(async move {
                    crate::hosts_restart::restart(&store, Some(name))
                        .await
                        .map_err(|e| format!("{e:#}"))
                })
            });
            let primary = spec(&leader.pg_host, leader.pg_port, &tls);
            if let Err(e) = sync.round(&pg, &primary, &[replica], &restart).await {
                tracing::debug!("copy slots: {e}");
            }
        }
    });
    Ok(())
}
