//! `herd copy … --dcs URL --cluster NAME`: logical copies of a multi-host cluster. The work is
//! herd-copy's, as on one host; what differs is where things are found. A copy's definition is
//! kept in the agents' store (`copies/<name>` at the cluster's root, so any host sees every
//! copy; it holds the target's URL, password included: protect etcd as the `secrets/`
//! directory). The source group's primary is the member leading it in the store, reached with
//! the superuser's password from `--data-dir`'s `secrets/` (copied from the first host, as for
//! `herd proxy`). The target subscribes through a `herd proxy` endpoint (`--endpoint`), which
//! holds back what a failover could lose; each replica's agent keeps the copy's slot
//! (crates/herd-cli/src/agent_slots.rs), so a failover keeps the copy streaming.

use std::time::Duration;

use anyhow::{bail, Context};
use herd_agent::store::StoreClient;
use herd_cluster::{Layout, Progress, Secrets};
use herd_copy::CopySpec;
use herd_pg::ConnSpec;

use crate::hosts::StoreArgs;
use crate::progress::TermProgress;

/// Prefix of the copies' definitions in the store (at the root: copies of every group).
const COPIES: &str = "copies/";

/// Retained WAL above which a copy's status warns: half of the default
/// `max_slot_wal_keep_size` (2 GB); each agent may set its own, which the CLI does not see.
pub(crate) const WARN_BYTES: u64 = 1 << 30;

fn key(name: &str) -> String {
    format!("{COPIES}{name}")
}

/// The definition named `name` and its revision (0: none). A dropped copy leaves an empty
/// value (the store has no delete), which counts as none.
pub(crate) async fn load(
    root: &StoreClient,
    name: &str,
) -> anyhow::Result<(Option<CopySpec>, u64)> {
    herd_copy::validate_name(name)?;
    let (dcs, key) = (root.dcs(), key(name));
    let found = tokio::task::spawn_blocking(move || dcs.get(&key)).await??;
    match found {
        Some(v) if v.value.is_empty() => Ok((None, v.revision)),
        Some(v) => {
            let spec = serde_json::from_slice(&v.value)
                .with_context(|| format!("the store's definition of copy {name} is damaged"))?;
            Ok((Some(spec), v.revision))
        }
        None => Ok((None, 0)),
    }
}

/// Writes `value` (a definition, or empty for a dropped copy) if the key is still at `revision`.
pub(crate) async fn write(
    root: &StoreClient,
    name: &str,
    revision: u64,
    value: Vec<u8>,
) -> anyhow::Result<()> {
    let (dcs, key) = (root.dcs(), key(name));
    tokio::task::spawn_blocking(move || dcs.compare_and_set(&key, revision, value))
        .await?
        .map_err(|e| anyhow::anyhow!("{e} (another command changed copy {name} meanwhile?)"))?;
    Ok(())
}

/// Every copy's definition.
async fn list_specs(root: &StoreClient) -> anyhow::Result<Vec<CopySpec>> {
    let dcs = root.dcs();
    let entries = tokio::task::spawn_blocking(move || dcs.list(COPIES)).await??;
    let mut specs = Vec::new();
    for (key, v) in entries {
        if v.value.is_empty() {
            continue;
        }
        let spec = serde_json::from_slice(&v.value)
            .with_context(|| format!("the store's {key} is damaged"))?;
        specs.push(spec);
    }
    Ok(specs)
}

/// The superuser's password from `layout`'s `secrets/`.
pub(crate) fn password(layout: &Layout) -> anyhow::Result<String> {
    Secrets::load(layout).map(|s| s.superuser).with_context(|| {
        format!(
            "with --dcs, --data-dir names a directory holding the cluster's secrets/ (copied from \
             the first host, as for `herd proxy`); none usable in {}",
            layout.root().display()
        )
    })
}

/// The member leading shard group `group` as primary now.
pub(crate) async fn leader_member(
    root: &StoreClient,
    group: u32,
) -> anyhow::Result<herd_agent::member::Member> {
    let count = herd_agent::groups::count(root)
        .await
        .map_err(anyhow::Error::msg)?
        .unwrap_or(1);
    if group >= count {
        bail!("there is no shard group {group}: the cluster has {count} (numbered from 0)");
    }
    let store = StoreClient::new(herd_agent::groups::scoped(root.dcs(), group));
    let read = store.read().await.map_err(anyhow::Error::msg)?;
    let s = read.store;
    s.leader
        .as_deref()
        .and_then(|l| s.members.iter().find(|m| m.name == l))
        .filter(|m| m.role == "primary")
        .cloned()
        .with_context(|| {
            format!(
                "shard group {group} has no primary now (`herd status --dcs …`); try again once one leads"
            )
        })
}

/// The superuser's connection settings for `member`'s server, in `database`.
pub(crate) fn superuser_spec(
    member: &herd_agent::member::Member,
    layout: &Layout,
    database: &str,
) -> anyhow::Result<ConnSpec> {
    Ok(ConnSpec {
        host: member.pg_host.clone(),
        port: member.pg_port,
        user: herd_cluster::SUPERUSER.into(),
        password: password(layout)?,
        dbname: database.into(),
        timeout: Duration::from_secs(5),
        // The member's certificate names its advertised address, which this dials.
        tls: crate::client_tls::to_cluster(layout)?,
    })
}

/// A superuser connection to shard group `group`'s primary (the member leading it in the
/// store), in `database`.
pub(crate) async fn primary_client(
    root: &StoreClient,
    layout: &Layout,
    group: u32,
    database: &str,
) -> anyhow::Result<tokio_postgres::Client> {
    let primary = leader_member(root, group).await?;
    let spec = superuser_spec(&primary, layout, database)?;
    herd_pg::connect(&spec).await.with_context(|| {
        format!(
            "connecting to shard group {group}'s primary {} ({}:{})",
            primary.name, primary.pg_host, primary.pg_port
        )
    })
}

/// `HOST:PORT` of the `herd proxy` the target subscribes through.
pub(crate) fn endpoint_of(endpoint: Option<&str>) -> anyhow::Result<(String, u16)> {
    let Some(text) = endpoint else {
        bail!(
            "with --dcs, name the `herd proxy` endpoint the target subscribes through: \
             --endpoint HOST:PORT (reachable from the target)"
        );
    };
    let (host, port) = text
        .rsplit_once(':')
        .with_context(|| format!("--endpoint {text}: write HOST:PORT"))?;
    let port = port
        .parse()
        .with_context(|| format!("--endpoint {text}: {port} is not a port"))?;
    Ok((host.to_string(), port))
}

/// Where the copy's role is made and dropped: the endpoint on a sharded cluster (it makes
/// roles on every group), else the primary (`None`).
pub(crate) async fn roles_client(
    root: &StoreClient,
    layout: &Layout,
    database: &str,
    (host, port): (&str, u16),
) -> anyhow::Result<Option<tokio_postgres::Client>> {
    let groups = herd_agent::groups::count(root)
        .await
        .map_err(anyhow::Error::msg)?
        .unwrap_or(1);
    if groups <= 1 {
        return Ok(None);
    }
    let spec = ConnSpec {
        host: host.to_string(),
        port,
        user: herd_cluster::SUPERUSER.into(),
        password: password(layout)?,
        dbname: database.to_string(),
        timeout: Duration::from_secs(5),
        // A `herd proxy`, not a server: it relays to the servers over TLS itself.
        tls: None,
    };
    let client = herd_pg::connect(&spec)
        .await
        .with_context(|| format!("connecting to the endpoint {host}:{port}"))?;
    Ok(Some(client))
}

/// Whether a subscription on one of the cluster's servers can verify the endpoint `(host,
/// port)`: the cluster has a CA and the endpoint serves TLS with a certificate of it naming
/// `host` (tried as the superuser). When not, says so: the subscription then reaches the
/// endpoint as before (libpq's `sslmode=prefer`), and the endpoint relays it to the source
/// over verified TLS. The sentence that says which, for the user (none without a CA): the
/// move runs in the coordinator, so its caller returns it with the move's outcome.
pub(crate) async fn endpoint_verifies(
    layout: &Layout,
    (host, port): (&str, u16),
    database: &str,
) -> anyhow::Result<(bool, Option<String>)> {
    let Some(tls) = crate::client_tls::to_cluster(layout)? else {
        return Ok((false, None));
    };
    let spec = ConnSpec {
        host: host.to_string(),
        port,
        user: herd_cluster::SUPERUSER.into(),
        password: password(layout)?,
        dbname: database.to_string(),
        timeout: Duration::from_secs(5),
        tls: Some(tls),
    };
    match herd_pg::connect(&spec).await {
        Ok(_) => Ok((
            true,
            Some(format!(
                "the destination's subscription verifies the endpoint {host}:{port} \
                 (sslmode=verify-full, the cluster's CA)"
            )),
        )),
        Err(e) => Ok((
            false,
            Some(format!(
                "note: the endpoint {host}:{port} does not serve TLS with a certificate of the \
                 cluster's CA ({e}); the destination's subscription reaches it as before and \
                 the endpoint relays it to the source over verified TLS. To verify that leg \
                 too, give every proxy a certificate (`herd certs issue NAME --host {host}`, \
                 then --tls-cert/--tls-key)"
            )),
        )),
    }
}

/// Refuses, with what to do, a source primary (of shard group `group`) without
/// `wal_level = logical`: across hosts Herd does not rewrite the agents' herd.toml itself.
pub(crate) async fn require_logical(
    primary: &tokio_postgres::Client,
    group: u32,
) -> anyhow::Result<()> {
    let level: String = primary
        .query_one("show wal_level", &[])
        .await
        .context("reading wal_level on the source primary")?
        .get(0);
    if level != "logical" {
        bail!(
            "copies (and shard moves, which use them) need wal_level = logical, which is {level} on \
             shard group {group}'s primary: set wal_level = \"logical\" under [postgres] in every \
             agent's herd.toml (herd agent --config), then `herd restart --dcs … --group {group}` \
             (replicas first, the primary last through a switchover)"
        );
    }
    Ok(())
}

/// `herd copy create --dcs …`.
pub async fn create(
    store: &StoreArgs,
    layout: &Layout,
    spec: CopySpec,
    endpoint: Option<&str>,
    wait: Duration,
) -> anyhow::Result<()> {
    let (host, port) = endpoint_of(endpoint)?;
    let root = store.open().await?;
    let (existing, revision) = load(&root, &spec.name).await?;
    if existing.is_some() {
        return Err(herd_copy::manage::exists_already(&spec.name).into());
    }
    let primary = primary_client(&root, layout, spec.group, &spec.database).await?;
    require_logical(&primary, spec.group).await?;
    let roles = roles_client(&root, layout, &spec.database, (&host, port)).await?;
    let source = herd_copy::manage::Source {
        primary: &primary,
        roles: roles.as_ref().unwrap_or(&primary),
    };
    let progress = TermProgress::new();
    let phase = |text: &str| progress.phase(text);
    // Any server can be a copy's target: its CA is not known to be the cluster's, so its
    // subscription reaches the endpoint as before (see docs/multi-host.md, "TLS").
    let created = herd_copy::manage::create(&spec, &source, (&host, port), false, &phase).await?;
    let encoded = serde_json::to_vec(&spec)?;
    if let Err(e) = write(&root, &spec.name, revision, encoded).await {
        // Not recorded: undo, so nothing is left that no command knows of.
        if let Ok(target) = herd_copy::target::connect(&spec.target).await {
            let _ = herd_copy::manage::drop_target_side(&spec, &target).await;
        }
        let _ = herd_copy::manage::drop_source_side(&spec, &source).await;
        return Err(e);
    }
    progress.done(&format!(
        "copy {} created: {} table(s)",
        spec.name,
        created.tables.len()
    ));
    crate::copy::wait_initial_copy(&spec, wait, &progress).await?;
    drop(progress);
    crate::output::emitln!(
        "copy {} streams from shard group {}'s primary ({}) to {} through {host}:{port}; \
         `herd copy list --dcs …` shows its state and lag",
        spec.name,
        spec.group,
        spec.database,
        herd_copy::target::redacted(&spec.target)
    );
    Ok(())
}

/// `herd copy list --dcs …`.
pub async fn list(store: &StoreArgs, layout: &Layout, json: bool) -> anyhow::Result<()> {
    let root = store.open().await?;
    let mut statuses = Vec::new();
    for spec in list_specs(&root).await? {
        let source = primary_client(&root, layout, spec.group, &spec.database)
            .await
            .map_err(|e| format!("{e:#}"));
        let target = herd_copy::target::connect(&spec.target)
            .await
            .map_err(|e| e.to_string());
        statuses.push(
            herd_copy::status::read(
                &spec,
                source.as_ref().map_err(Clone::clone),
                target.as_ref().map_err(Clone::clone),
                WARN_BYTES,
            )
            .await,
        );
    }
    if json {
        crate::output::emitln!("{}", serde_json::to_string_pretty(&statuses)?);
        return Ok(());
    }
    if statuses.is_empty() {
        crate::output::emitln!("no copies (`herd copy create --dcs …` makes one)");
    }
    for s in &statuses {
        crate::output::emit!("{}", crate::status::copy_lines(s));
    }
    Ok(())
}

/// The definition named `name`, or the error a user should see.
async fn named(root: &StoreClient, name: &str) -> anyhow::Result<(CopySpec, u64)> {
    match load(root, name).await? {
        (Some(spec), revision) => Ok((spec, revision)),
        (None, _) => bail!("there is no copy named {name} (`herd copy list --dcs …`)"),
    }
}

/// `herd copy pause|resume --dcs …`.
pub async fn set_enabled(store: &StoreArgs, name: &str, enabled: bool) -> anyhow::Result<()> {
    let root = store.open().await?;
    let (spec, _) = named(&root, name).await?;
    let target = herd_copy::target::connect(&spec.target).await?;
    herd_copy::manage::set_enabled(&spec, &target, enabled).await?;
    crate::output::emitln!(
        "copy {name} {}",
        if enabled {
            "resumed: the target catches up"
        } else {
            "paused: the source keeps its WAL meanwhile (up to postgres.max_slot_wal_keep_size)"
        }
    );
    Ok(())
}

/// `herd copy drop --dcs …`.
pub async fn drop_copy(
    store: &StoreArgs,
    layout: &Layout,
    name: &str,
    endpoint: Option<&str>,
    force: bool,
) -> anyhow::Result<()> {
    let root = store.open().await?;
    let groups = herd_agent::groups::count(&root)
        .await
        .map_err(anyhow::Error::msg)?
        .unwrap_or(1);
    // On a sharded cluster the copy's role is on every group: dropped through the endpoint.
    let endpoint = match endpoint {
        Some(e) => Some(endpoint_of(Some(e))?),
        None if groups > 1 => Some(endpoint_of(None)?),
        None => None,
    };
    let (spec, revision) = named(&root, name).await?;
    match herd_copy::target::connect(&spec.target).await {
        Ok(target) => herd_copy::manage::drop_target_side(&spec, &target).await?,
        Err(e) if force => crate::output::emitln!(
            "the target cannot be reached ({e}); its subscription {} stays there: drop it by hand",
            spec.object_name()
        ),
        Err(e) => bail!(
            "{e}; nothing was dropped. `herd copy drop --dcs … {name} --force` drops the source side anyway"
        ),
    }
    let primary = primary_client(&root, layout, spec.group, &spec.database).await?;
    let roles = match &endpoint {
        Some((host, port)) => roles_client(&root, layout, &spec.database, (host, *port)).await?,
        None => None,
    };
    let source = herd_copy::manage::Source {
        primary: &primary,
        roles: roles.as_ref().unwrap_or(&primary),
    };
    herd_copy::manage::drop_source_side(&spec, &source).await?;
    write(&root, name, revision, Vec::new()).await?;
    crate::output::emitln!(
        "copy {name} dropped (the target's tables and rows stay); the replicas' slot copies go within seconds"
    );
    Ok(())
}
