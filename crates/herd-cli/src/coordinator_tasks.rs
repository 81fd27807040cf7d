//! What `herd agent`'s coordinator does for the whole cluster while its agent holds the
//! coordinator lease (`herd_agent::coordinator`): two-phase work left in doubt (DDL, writes and
//! COPY across shard groups whose session or proxy died between the phases) is resolved here,
//! once for the cluster, instead of by every `herd proxy`; shard moves asked with `herd shards
//! move|rebalance --dcs` run here too (`move_requests.rs`), one at a time, resumed by the next
//! holder when this one dies; shard groups recorded by `herd group add --dcs` are admitted
//! from here too (`group_admission.rs`: a registered proxy is asked once the group leads).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use herd_agent::coordinator::Coordinator;
use herd_agent::store::StoreClient;
use herd_cluster::{Layout, Secrets};
use herd_dcs::Dcs;
use herd_pg::ConnSpec;
use tokio::sync::watch;
use tokio_postgres::Client;

/// How often the holder looks for work in doubt (as each proxy of a one-host cluster does).
const EVERY: Duration = Duration::from_secs(herd_proxy::shards::IN_DOUBT_AFTER_S / 3);

/// Races for the coordinator lease with the other agents and, while held, resolves work in
/// doubt, until `shutdown`.
pub fn spawn(
    dcs: Arc<dyn Dcs>,
    data_dir: PathBuf,
    me: String,
    ttl: Duration,
    shutdown: watch::Receiver<bool>,
) {
    let (held_tx, held) = watch::channel(false);
    let name = me.clone();
    let coordinator = Coordinator {
        me,
        ttl,
        every: EVERY,
        held: Some(Arc::new(held_tx)),
    };
    let root = StoreClient::new(dcs.clone());
    let layout = Layout::new(&data_dir);
    // The moves outlive a round (each is bounded by half the lease): they run beside the
    // rounds, while the lease is held, started again by a round when none runs.
    let moves: Arc<std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>> = Arc::default();
    // So do the admissions (a proxy's admission may take minutes).
    let admissions: Arc<std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>> = Arc::default();
    tokio::spawn(coordinator.run(
        dcs,
        move || {
            let (root, layout, held, moves) =
                (root.clone(), layout.clone(), held.clone(), moves.clone());
            let (admissions, name) = (admissions.clone(), name.clone());
            async move {
                if let Ok(mut running) = admissions.lock() {
                    if running.as_ref().is_none_or(|t| t.is_finished()) {
                        *running = Some(tokio::spawn(crate::group_admission::run(
                            root.clone(),
                            layout.clone(),
                            name,
                            held.clone(),
                        )));
                    }
                }
                if let Ok(mut running) = moves.lock() {
                    if running.as_ref().is_none_or(|t| t.is_finished()) {
                        *running = Some(tokio::spawn(crate::move_requests::run_requests(
                            root.clone(),
                            layout.clone(),
                            held,
                        )));
                    }
                }
                if let Err(why) = resolve_round(&root, &layout).await {
                    tracing::debug!("in-doubt resolution skipped this round: {why}");
                }
            }
        },
        shutdown,
    ));
}

/// One pass over every database with a shard map: each group's primary from the store, the
/// resolution of herd-proxy (the same code a one-host proxy runs).
async fn resolve_round(root: &StoreClient, layout: &Layout) -> Result<(), String> {
    let groups = herd_agent::groups::count(root).await?.unwrap_or(1);
    if groups < 2 {
        return Ok(());
    }
    let password = Secrets::load(layout)
        .map_err(|e| format!("no secrets: {e}"))?
        .superuser;
    // With a CA the primaries take the superuser from other hosts over TLS only.
    let tls = crate::client_tls::to_cluster(layout).map_err(|e| format!("{e:#}"))?;
    let mut primaries = Vec::new();
    for g in 0..groups {
        let store = StoreClient::new(herd_agent::groups::scoped(root.dcs(), g));
        let read = store.read().await?;
        let primary = read
            .store
            .leader
            .as_deref()
            .and_then(|l| read.store.members.iter().find(|m| m.name == l))
            .filter(|m| m.role == "primary")
            .ok_or_else(|| format!("shard group {g} has no primary now"))?;
        primaries.push((primary.pg_host.clone(), primary.pg_port));
    }
    let spec = |g: usize, dbname: &str| ConnSpec {
        host: primaries[g].0.clone(),
        port: primaries[g].1,
        user: herd_cluster::SUPERUSER.into(),
        password: password.clone(),
        dbname: dbname.into(),
        timeout: Duration::from_secs(2),
        tls: tls.clone(),
    };
    let connect = |g: usize, dbname: &str| {
        let spec = spec(g, dbname);
        async move {
            herd_pg::connect(&spec)
                .await
                .map_err(|e| format!("shard group {g}, database {}: {e}", spec.dbname))
        }
    };
    let first = connect(0, "postgres").await?;
    let databases: Vec<String> = first
        .query(
            "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate",
            &[],
        )
        .await
        .map_err(|e| format!("listing databases: {e}"))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for database in databases {
        let zero = connect(0, &database).await?;
        let sharded: bool = zero
            .query_one("SELECT to_regclass('herd.shard_map') IS NOT NULL", &[])
            .await
            .map_err(|e| format!("{database}: {e}"))?
            .get(0);
        if !sharded {
            continue;
        }
        let mut clients: Vec<Client> = vec![zero];
        for g in 1..groups as usize {
            clients.push(connect(g, &database).await?);
        }
        match herd_proxy::shards::resolve_database(&clients).await {
            Ok((0, 0)) => {}
            Ok((committed, rolled_back)) => tracing::warn!(
                database = %database,
                "resolved two-phase work left in doubt: {committed} part(s) committed, \
                 {rolled_back} rolled back"
            ),
            Err(e) => {
                tracing::warn!(database = %database, "resolving two-phase work in doubt: {e}")
            }
        }
    }
    Ok(())
}
