//! `herd copy`: logical copies of table subsets from this cluster (one shard group) to any
//! PostgreSQL 15 server or another Herd cluster. The work is herd-copy's; this is the glue:
//! arguments, `wal_level = logical` through the running supervisor, progress, output.

use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use herd_cluster::{Cluster, Layout, Progress};
use herd_copy::{CopySpec, Store, TableSpec};

use crate::cli::DataDirArg;
use crate::hosts::StoreArgs;
use crate::progress::TermProgress;

/// `herd copy …`.
#[derive(Debug, Subcommand)]
pub enum CopyCommand {
    /// Create a copy: the tables' rows are copied, then their changes stream.
    Create(CreateArgs),
    /// Every copy with its state, lag and tables.
    List {
        #[command(flatten)]
        dir: DataDirArg,
        #[command(flatten)]
        store: StoreArgs,
        /// Print the copies' status as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop streaming changes to the target (the source keeps the WAL for it, up to
    /// postgres.max_slot_wal_keep_size).
    Pause(NameArgs),
    /// Stream again after a pause; the target catches up.
    Resume(NameArgs),
    /// Bring tables created in a copied schema since the copy was made into it (created on
    /// the target, copied, then streamed).
    Refresh(NameArgs),
    /// Remove the copy: the target's subscription, the source's slot, publication and role
    /// (the target's tables and rows stay).
    Drop {
        #[command(flatten)]
        name: NameArgs,
        /// Drop the source side even when the target cannot be reached (its subscription
        /// then stays there; drop it by hand).
        #[arg(long)]
        force: bool,
        /// With --dcs on a sharded cluster: the `herd proxy` endpoint (HOST:PORT) through
        /// which the copy's role is dropped on every group.
        #[arg(long, value_name = "HOST:PORT")]
        endpoint: Option<String>,
    },
}

/// A copy's name and the cluster's data directory.
#[derive(Debug, Args)]
pub struct NameArgs {
    #[command(flatten)]
    dir: DataDirArg,
    #[command(flatten)]
    store: StoreArgs,
    /// The copy's name.
    name: String,
}

/// Options of `herd copy create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The cluster's data directory; with --dcs, a directory holding the cluster's secrets/.
    #[command(flatten)]
    dir: DataDirArg,
    #[command(flatten)]
    store: StoreArgs,
    /// With --dcs: the `herd proxy` endpoint (HOST:PORT, reachable from the target) the
    /// target subscribes through.
    #[arg(long, value_name = "HOST:PORT")]
    endpoint: Option<String>,
    /// The copy's name (lower-case letters, digits, _).
    name: String,
    /// The target: a PostgreSQL URL (any PostgreSQL 15 server, or another Herd cluster's
    /// endpoint), e.g. postgresql://postgres:secret@127.0.0.1:7500/postgres.
    #[arg(long, value_name = "URL")]
    to: String,
    /// A table to copy (table or schema.table); repeat for more.
    #[arg(long = "table", value_name = "TABLE")]
    tables: Vec<String>,
    /// Copy every table of this schema; repeat for more.
    #[arg(long = "schema", value_name = "SCHEMA")]
    schemas: Vec<String>,
    /// Only these columns of a table: TABLE=col1,col2 (must include its primary key).
    #[arg(long = "columns", value_name = "TABLE=COLS")]
    columns: Vec<String>,
    /// Only rows of a table matching an SQL condition: "TABLE=region = 'eu'" (its columns
    /// must be in the primary key).
    #[arg(long = "where", value_name = "TABLE=CONDITION")]
    filters: Vec<String>,
    /// The source database.
    #[arg(long, default_value = "postgres")]
    database: String,
    /// The source shard group.
    #[arg(long, default_value_t = 0)]
    group: u32,
    /// How long to wait for the initial copy before returning (it goes on in the background).
    #[arg(long, value_name = "SECONDS", default_value_t = 3600)]
    wait_timeout: u64,
}

/// Runs a `herd copy` command.
pub async fn run(command: CopyCommand) -> anyhow::Result<()> {
    use crate::copy_hosts as hosts;
    match command {
        CopyCommand::Create(args) if args.store.given() => {
            let spec = spec_of(&args)?;
            let wait = Duration::from_secs(args.wait_timeout);
            let layout = args.dir.layout()?;
            hosts::create(&args.store, &layout, spec, args.endpoint.as_deref(), wait).await
        }
        CopyCommand::Create(args) => create(args).await,
        CopyCommand::List { dir, store, json } if store.given() => {
            hosts::list(&store, &dir.layout()?, json).await
        }
        CopyCommand::List { dir, json, .. } => list(&dir.layout()?, json).await,
        CopyCommand::Pause(a) if a.store.given() => {
            hosts::set_enabled(&a.store, &a.name, false).await
        }
        CopyCommand::Resume(a) if a.store.given() => {
            hosts::set_enabled(&a.store, &a.name, true).await
        }
        CopyCommand::Pause(a) => set_enabled(&a, false).await,
        CopyCommand::Resume(a) => set_enabled(&a, true).await,
        CopyCommand::Refresh(a) if a.store.given() => bail!(
            "herd copy refresh is not offered across hosts yet: drop the copy and create it again"
        ),
        CopyCommand::Refresh(a) => refresh(&a).await,
        CopyCommand::Drop {
            name,
            force,
            endpoint,
        } if name.store.given() => {
            let layout = name.dir.layout()?;
            hosts::drop_copy(&name.store, &layout, &name.name, endpoint.as_deref(), force).await
        }
        CopyCommand::Drop { name, force, .. } => drop_copy(&name, force).await,
    }
}

/// The copy's definition from the arguments.
fn spec_of(args: &CreateArgs) -> anyhow::Result<CopySpec> {
    let mut tables = Vec::new();
    for t in &args.tables {
        tables.push(TableSpec::new(t)?);
    }
    let find = |given: &str, flag: &str| -> anyhow::Result<usize> {
        let name = herd_copy::qualify(given)?;
        match tables.iter().position(|t: &TableSpec| t.table == name) {
            Some(i) => Ok(i),
            None => {
                bail!("--{flag} names {given}, which is not one of the --table options")
            }
        }
    };
    let split = |text: &str, flag: &str| -> anyhow::Result<(String, String)> {
        text.split_once('=')
            .map(|(t, v)| (t.trim().to_string(), v.trim().to_string()))
            .filter(|(t, v)| !t.is_empty() && !v.is_empty())
            .with_context(|| format!("--{flag} {text:?}: write TABLE=…"))
    };
    let mut columns = Vec::new();
    for c in &args.columns {
        let (t, cols) = split(c, "columns")?;
        let i = find(&t, "columns")?;
        columns.push((
            i,
            cols.split(',')
                .map(|c| c.trim().to_ascii_lowercase())
                .collect(),
        ));
    }
    let mut filters = Vec::new();
    for f in &args.filters {
        let (t, cond) = split(f, "where")?;
        filters.push((find(&t, "where")?, cond));
    }
    for (i, cols) in columns {
        tables[i].columns = Some(cols);
    }
    for (i, cond) in filters {
        tables[i].row_filter = Some(cond);
    }
    let spec = CopySpec {
        name: args.name.clone(),
        group: args.group,
        database: args.database.clone(),
        tables,
        schemas: args.schemas.clone(),
        target: args.to.clone(),
        publish: None,
    };
    spec.validate()?;
    Ok(spec)
}

/// Shard group `group` as its state is now (its primary may have changed since the last look).
pub(crate) fn source_group(layout: &Layout, group: u32) -> anyhow::Result<Cluster> {
    let groups = crate::status::open_all(layout)?;
    let count = groups.len();
    groups.into_iter().nth(group as usize).with_context(|| {
        format!("there is no shard group {group}: the cluster has {count} (numbered from 0)")
    })
}

/// A superuser connection to `group`'s primary, in `database`.
pub(crate) async fn primary_client(
    group: &Cluster,
    database: &str,
) -> anyhow::Result<tokio_postgres::Client> {
    let mut spec = group.conn_spec(&group.state.primary);
    spec.dbname = database.to_string();
    herd_pg::connect(&spec).await.with_context(|| {
        format!(
            "connecting to shard group {}'s primary {} (is the cluster up? `herd up`)",
            group.group(),
            group.state.primary
        )
    })
}

/// The connections a copy's source side is made and dropped with.
pub(crate) struct SourceClients {
    primary: tokio_postgres::Client,
    roles: Option<tokio_postgres::Client>,
}

impl SourceClients {
    /// Connects to `group`'s primary and, on a sharded cluster, to the endpoint.
    pub(crate) async fn open(
        layout: &Layout,
        group: &Cluster,
        database: &str,
    ) -> anyhow::Result<Self> {
        Ok(SourceClients {
            primary: primary_client(group, database).await?,
            roles: roles_client(layout, group, database).await?,
        })
    }

    pub(crate) fn source(&self) -> herd_copy::manage::Source<'_> {
        herd_copy::manage::Source {
            primary: &self.primary,
            roles: self.roles.as_ref().unwrap_or(&self.primary),
        }
    }
}

/// Where the copy's role is made: the primary when the cluster has one group, else the
/// endpoint (it makes roles on every group and checks passwords against group 0's).
async fn roles_client(
    layout: &Layout,
    group: &Cluster,
    database: &str,
) -> anyhow::Result<Option<tokio_postgres::Client>> {
    if herd_cluster::existing_groups(layout) <= 1 {
        return Ok(None);
    }
    endpoint_client(group, database).await.map(Some)
}

/// A superuser connection to the cluster's endpoint, in `database`.
pub(crate) async fn endpoint_client(
    group: &Cluster,
    database: &str,
) -> anyhow::Result<tokio_postgres::Client> {
    let mut spec = group.conn_spec(&group.state.primary);
    spec.port = group.config.network.port;
    spec.dbname = database.to_string();
    herd_pg::connect(&spec)
        .await
        .context("connecting to the cluster's endpoint (is the cluster up? `herd up`)")
}

async fn create(args: CreateArgs) -> anyhow::Result<()> {
    let layout = args.dir.layout()?;
    let spec = spec_of(&args)?;
    let store = Store::new(layout.copies());
    if store.load(&spec.name)?.is_some() {
        return Err(herd_copy::manage::exists_already(&spec.name).into());
    }
    let progress = TermProgress::new();
    ensure_logical(&layout, spec.group, &progress).await?;
    let group = source_group(&layout, spec.group)?;
    let clients = SourceClients::open(&layout, &group, &spec.database).await?;
    let host = group.host().to_string();
    let endpoint = (host.as_str(), group.config.network.port);
    let phase = |text: &str| progress.phase(text);
    let created =
        herd_copy::manage::create(&spec, &clients.source(), endpoint, false, &phase).await?;
    store.save(&spec)?;
    progress.done(&format!(
        "copy {} created: {} table(s){}",
        spec.name,
        created.tables.len(),
        if created.created_on_target.is_empty() {
            String::new()
        } else {
            format!(
                ", created on the target: {}",
                created.created_on_target.join(", ")
            )
        }
    ));
    wait_initial_copy(&spec, Duration::from_secs(args.wait_timeout), &progress).await?;
    drop(progress);
    crate::output::emitln!(
        "copy {} streams from shard group {}'s primary ({}) to {}; `herd copy list` shows its state and lag",
        spec.name,
        spec.group,
        spec.database,
        herd_copy::target::redacted(&spec.target)
    );
    Ok(())
}

/// Waits (at most `wait`) until the target has copied every table's rows, showing progress.
pub(crate) async fn wait_initial_copy(
    spec: &CopySpec,
    wait: Duration,
    progress: &TermProgress,
) -> anyhow::Result<()> {
    let target = herd_copy::target::connect(&spec.target).await?;
    let last = std::sync::Mutex::new(String::new());
    let report = |text: &str| {
        if let Ok(mut last) = last.lock() {
            if *last != text {
                progress.phase(&format!("initial copy: {text}"));
                *last = text.to_string();
            }
        }
    };
    herd_copy::manage::wait_copied(spec, &target, wait, &report).await?;
    progress.done("initial copy done; changes stream");
    Ok(())
}

/// Makes sure shard group `group`'s primary runs with `wal_level = logical` (see
/// [`enable_logical`]).
pub(crate) async fn ensure_logical(
    layout: &Layout,
    group: u32,
    progress: &dyn herd_cluster::Progress,
) -> anyhow::Result<()> {
    let level: String = primary_client(&source_group(layout, group)?, "postgres")
        .await?
        .query_one("show wal_level", &[])
        .await
        .context("reading wal_level on the source primary")?
        .get(0);
    if level != "logical" {
        enable_logical(layout, group, progress).await?;
    }
    Ok(())
}

/// Sets `wal_level = logical` in herd.toml and has the running supervisor restart the group's
/// servers: replicas first, then a switchover, then the former primary.
async fn enable_logical(
    layout: &Layout,
    group: u32,
    progress: &dyn herd_cluster::Progress,
) -> anyhow::Result<()> {
    if herd_cluster::read_supervisor(layout).is_none() {
        bail!(
            "copies need wal_level = logical, which takes a restart; start the cluster with `herd up` \
             so Herd can restart its servers safely (replicas first, then a switchover)"
        );
    }
    let mut config = herd_config::Config::load(&layout.config())?;
    config.postgres.wal_level = "logical".into();
    std::fs::write(layout.config(), herd_config::render(&config))
        .with_context(|| format!("writing {}", layout.config().display()))?;
    progress.phase(&format!(
        "wal_level = logical: restarting shard group {group}'s servers (replicas first, then a switchover)"
    ));
    let done = crate::admin::request_text(layout, format!("/restart?group={group}")).await?;
    progress.done(&format!("wal_level = logical: {done}"));
    Ok(())
}

async fn list(layout: &Layout, json: bool) -> anyhow::Result<()> {
    // Says clearly when there is no cluster here (rather than "no copies").
    crate::status::open(layout)?;
    let statuses = read_statuses(layout).await?;
    if json {
        crate::output::emitln!("{}", serde_json::to_string_pretty(&statuses)?);
        return Ok(());
    }
    if statuses.is_empty() {
        crate::output::emitln!("no copies (`herd copy create` makes one)");
    }
    for s in &statuses {
        crate::output::emit!("{}", crate::status::copy_lines(s));
    }
    Ok(())
}

/// Every copy's status, read now from its source group's primary and its target.
pub async fn read_statuses(layout: &Layout) -> anyhow::Result<Vec<herd_core::CopyStatus>> {
    let specs = Store::new(layout.copies()).list()?;
    let mut out = Vec::new();
    for spec in &specs {
        let source = match source_group(layout, spec.group) {
            Ok(g) => primary_client(&g, &spec.database)
                .await
                .map_err(|e| format!("{e:#}")),
            Err(e) => Err(format!("{e:#}")),
        };
        let target = herd_copy::target::connect(&spec.target)
            .await
            .map_err(|e| e.to_string());
        out.push(
            herd_copy::status::read(
                spec,
                source.as_ref().map_err(Clone::clone),
                target.as_ref().map_err(Clone::clone),
                warn_bytes(layout),
            )
            .await,
        );
    }
    Ok(out)
}

/// Retained WAL above which a copy's status warns: half of `max_slot_wal_keep_size`.
pub fn warn_bytes(layout: &Layout) -> u64 {
    let keep = herd_config::Config::load(&layout.config())
        .map(|c| c.postgres.max_slot_wal_keep_size)
        .unwrap_or_default();
    herd_config::parse_size_bytes(&keep).map_or(1 << 30, |b| b / 2)
}

fn load(layout: &Layout, name: &str) -> anyhow::Result<CopySpec> {
    Store::new(layout.copies())
        .load(name)?
        .with_context(|| format!("there is no copy named {name} (`herd copy list`)"))
}

async fn set_enabled(args: &NameArgs, enabled: bool) -> anyhow::Result<()> {
    let layout = args.dir.layout()?;
    let spec = load(&layout, &args.name)?;
    let target = herd_copy::target::connect(&spec.target).await?;
    herd_copy::manage::set_enabled(&spec, &target, enabled).await?;
    crate::output::emitln!(
        "copy {} {}",
        spec.name,
        if enabled {
            "resumed: the target catches up"
        } else {
            "paused: the source keeps its WAL meanwhile (up to postgres.max_slot_wal_keep_size)"
        }
    );
    Ok(())
}

async fn refresh(args: &NameArgs) -> anyhow::Result<()> {
    let layout = args.dir.layout()?;
    let spec = load(&layout, &args.name)?;
    let group = source_group(&layout, spec.group)?;
    let clients = SourceClients::open(&layout, &group, &spec.database).await?;
    let target = herd_copy::target::connect(&spec.target).await?;
    let added = herd_copy::manage::refresh(&spec, &clients.source(), &target).await?;
    if added.is_empty() {
        crate::output::emitln!("copy {}: no table to add", spec.name);
    } else {
        crate::output::emitln!(
            "copy {}: added {} (copied now, then streamed); `herd copy list` shows their state",
            spec.name,
            added.join(", ")
        );
    }
    Ok(())
}

async fn drop_copy(args: &NameArgs, force: bool) -> anyhow::Result<()> {
    let layout = args.dir.layout()?;
    let store = Store::new(layout.copies());
    let spec = load(&layout, &args.name)?;
    match herd_copy::target::connect(&spec.target).await {
        Ok(target) => herd_copy::manage::drop_target_side(&spec, &target).await?,
        Err(e) if force => crate::output::emitln!(
            "the target cannot be reached ({e}); its subscription {} stays there: drop it by hand \
             (ALTER SUBSCRIPTION … DISABLE; ALTER SUBSCRIPTION … SET (slot_name = NONE); DROP SUBSCRIPTION …)",
            spec.object_name()
        ),
        Err(e) => bail!(
            "{e}; nothing was dropped. `herd copy drop {} --force` drops the source side anyway",
            spec.name
        ),
    }
    let group = source_group(&layout, spec.group)?;
    let clients = SourceClients::open(&layout, &group, &spec.database).await?;
    herd_copy::manage::drop_source_side(&spec, &clients.source()).await?;
    store.remove(&spec.name)?;
    crate::output::emitln!(
        "copy {} dropped (the target's tables and rows stay); its slot copies on the replicas go within seconds",
        spec.name
    );
    Ok(())
}
