//! `herd shards move SHARD --to GROUP`: moves one virtual shard's rows to another shard group
//! while the cluster serves reads and writes.
//!
//! 1. The map records the move (`herd.move_begin` through the endpoint): the target group hides
//!    the shard's rows from every statement until the switch.
//! 2. A logical copy (herd-copy, so failover-safe like every copy) of every distributed table's
//!    rows of the shard — a row filter on the shard of the key, computed by PostgreSQL's own
//!    hash functions — plus the move's marker row, from the source group's primary to the
//!    target group's; then it streams until it has caught up.
//! 3. The switch (`herd.move_switch`): statements on the shard wait at the proxy for as long as
//!    it takes the last changes to arrive (measured and printed), and the map names the target.
//! 4. The copy goes; the source group's rows of the shard (hidden since the switch) are
//!    deleted; the map forgets the move (`herd.move_finish`).
//!
//! Run again, it resumes an interrupted move where it stopped; `--cancel` takes back a move
//! that has not switched.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use herd_copy::{CopySpec, TableSpec};
use herd_shard::ShardMap;
use tokio_postgres::Client;

use crate::move_places::Places;
use crate::progress::TermProgress;
use herd_cluster::Progress;

/// Copy lag under which the switch is tried (what is left arrives while statements wait).
const SWITCH_LAG_BYTES: u64 = 256 * 1024;

/// Switch attempts before giving up (each undoes itself after its bound).
const SWITCH_ATTEMPTS: u32 = 5;

/// What to move.
pub struct MoveArgs<'a> {
    /// The shard.
    pub shard: u32,
    /// The group it goes to (ignored with `cancel`).
    pub to: u32,
    /// The database.
    pub database: &'a str,
    /// Take back a move that has not switched.
    pub cancel: bool,
    /// Bound on the initial copy and the catch-up.
    pub wait: Duration,
}

/// Where a move runs: the multi-host cluster of `store` when given (with the secrets in
/// `dir` and the `endpoint`), else the one-host cluster in `dir`.
pub async fn places(
    store: &crate::hosts::StoreArgs,
    dir: &crate::cli::DataDirArg,
    endpoint: Option<&str>,
) -> anyhow::Result<Places> {
    if !store.given() {
        return Ok(Places::Local {
            layout: dir.layout()?,
        });
    }
    Ok(Places::Hosts {
        root: store.open().await?,
        layout: dir.layout()?,
        endpoint: crate::copy_hosts::endpoint_of(endpoint)?,
    })
}

/// `herd shards move` run by this process: on one host, or across hosts by the cluster's
/// coordinator (`move_requests.rs`), which calls [`run_with`].
pub async fn run(places: &Places, args: MoveArgs<'_>) -> anyhow::Result<()> {
    if let Places::Hosts { root, endpoint, .. } = places {
        return crate::move_requests::request_and_follow(root, endpoint, &args).await;
    }
    let progress = TermProgress::new();
    let summary = run_with(places, args, &progress).await?;
    drop(progress);
    crate::output::emitln!("{summary}");
    Ok(())
}

/// Moves (or with `cancel` takes back) one shard, showing its phases on `progress`; what it
/// did, in one sentence. Run again, it resumes where an interrupted run stopped.
pub async fn run_with(
    places: &Places,
    args: MoveArgs<'_>,
    progress: &dyn Progress,
) -> anyhow::Result<String> {
    let started = Instant::now();
    let groups = places.groups().await?;
    if groups < 2 {
        bail!("this cluster has one shard group: there is nowhere to move a shard (see `herd up --shards N`)");
    }
    let endpoint = places.endpoint(args.database).await?;
    let map = read_map(&places.primary(0, args.database).await?).await?;
    if args.cancel {
        return cancel(places, &endpoint, &map, &args, progress).await;
    }
    let shard = args.shard;
    let from = match map.moves.get(&shard) {
        Some(m) if m.to != args.to => bail!(
            "shard {shard} is moving from group {} to {} already: run `herd shards move {shard} --to {}` to finish it, or `--cancel`",
            m.from, m.to, m.to
        ),
        Some(m) => m.from,
        None => *map
            .placement
            .get(shard as usize)
            .with_context(|| format!("there is no shard {shard}: the map has {}", map.shard_count))?,
    };
    let to = args.to;
    if to >= groups {
        bail!("there is no shard group {to}: the cluster has {groups}");
    }
    let switched = map.switched(shard);
    let spec = copy_spec(&map, places, to, args.database, shard, from).await?;
    let mut pause = None;
    let mut tls_note = None;
    let mut restarted = false;
    if !switched {
        if from == to {
            bail!("shard {shard} is on group {to} already");
        }
        places.ensure_logical(from, progress).await?;
        progress.phase(&format!(
            "shard {shard}: recording the move from group {from} to {to}"
        ));
        herd_function(
            &endpoint,
            "move_begin",
            &[&shard.to_string(), &to.to_string()],
        )
        .await?;
        if places
            .copy(&spec.name)
            .await?
            .is_some_and(|stored| stored.target != spec.target)
        {
            // The target group changed primary since the copy began. The copy applies without
            // waiting for the target's standbys, so the new primary may lack rows the source
            // counts as delivered: the copy starts over (the source's rows are untouched
            // until the switch).
            progress.phase(&format!(
                "shard {shard}: group {to} changed primary during the copy; copying again"
            ));
            places.drop_copy(&spec).await?;
            delete_rows(places, to, &map, args.database, shard, progress).await?;
            restarted = true;
        } else if places.copy(&spec.name).await?.is_none() && places.copy_left_behind(&spec).await?
        {
            // A run cut between making the copy's objects and recording it (a coordinator
            // killed there): what it made goes, with the rows it may have copied, and the copy
            // is made again.
            progress.phase(&format!(
                "shard {shard}: removing what an interrupted run left of the move's copy"
            ));
            places.drop_copy_objects(&spec).await?;
            delete_rows(places, to, &map, args.database, shard, progress).await?;
        }
        tls_note = copy_rows(places, &spec, progress, args.wait).await?;
        pause = Some(switch(&endpoint, &spec, places, progress, shard, args.wait).await?);
    }
    progress.phase(&format!("shard {shard}: dropping the move's copy"));
    places.drop_copy(&spec).await?;
    let deleted = delete_rows(places, from, &map, args.database, shard, progress).await?;
    herd_function(&endpoint, "move_finish", &[&shard.to_string()]).await?;
    progress.done(&format!("shard {shard}: moved"));
    Ok(format!(
        "shard {shard} moved from group {from} to group {to} in {:.1} s: {deleted} rows deleted on group {from}{}{}{}",
        started.elapsed().as_secs_f64(),
        pause.map_or(String::new(), |p| format!("; {p}")),
        if restarted {
            format!("; the copy started over after group {to} changed primary")
        } else {
            String::new()
        },
        tls_note.map_or(String::new(), |n| format!("\n{n}"))
    ))
}

/// `herd shards rebalance`: every shard group gets an even share of the shards (a move under
/// way is finished first), one move after the other; with `dry_run` only the plan is printed.
pub async fn rebalance(
    places: &Places,
    database: &str,
    dry_run: bool,
    wait: Duration,
) -> anyhow::Result<()> {
    let groups = places.groups().await?;
    let map = read_map(&places.primary(0, database).await?).await?;
    if let Some((shard, m)) = map.moves.iter().next() {
        if dry_run {
            crate::output::emitln!(
                "shard {shard} is moving from group {} to {}: that move is finished first",
                m.from,
                m.to
            );
        } else {
            let args = MoveArgs {
                shard: *shard,
                to: m.to,
                database,
                cancel: false,
                wait,
            };
            Box::pin(run(places, args)).await?;
            return Box::pin(rebalance(places, database, dry_run, wait)).await;
        }
    }
    let moves = herd_shard::rebalance(&map.placement, groups);
    if moves.is_empty() {
        crate::output::emitln!(
            "{database}: the {} shards are spread evenly over {} groups already",
            map.shard_count,
            groups
        );
        return Ok(());
    }
    crate::output::emitln!(
        "{database}: {} move(s) spread the {} shards over {} groups: {}",
        moves.len(),
        map.shard_count,
        groups,
        moves
            .iter()
            .map(|(s, f, t)| format!("shard {s} {f}→{t}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if dry_run {
        return Ok(());
    }
    for (i, (shard, _, to)) in moves.iter().enumerate() {
        crate::output::emitln!("move {}/{}:", i + 1, moves.len());
        let args = MoveArgs {
            shard: *shard,
            to: *to,
            database,
            cancel: false,
            wait,
        };
        run(places, args).await?;
    }
    Ok(())
}

/// Creates the move's copy (unless an interrupted run did) and waits until it has copied and
/// caught up; what creating it said about TLS, if it was created now.
async fn copy_rows(
    places: &Places,
    spec: &CopySpec,
    progress: &dyn Progress,
    wait: Duration,
) -> anyhow::Result<Option<String>> {
    let mut said = None;
    if places.copy(&spec.name).await?.is_none() {
        said = places.create_copy(spec, progress).await?;
    }
    let target = herd_copy::target::connect(&spec.target).await?;
    let last = std::sync::Mutex::new(String::new());
    let report = |text: &str| {
        if let Ok(mut last) = last.lock() {
            if *last != text {
                progress.phase(&format!("copying the shard's rows: {text}"));
                *last = text.to_string();
            }
        }
    };
    herd_copy::manage::wait_copied(spec, &target, wait, &report).await?;
    progress.done("the shard's rows are copied; changes stream");
    Ok(said)
}

/// Waits for the copy to catch up, then switches (retrying a switch that ran out of time).
/// The answer names how long the shard's statements waited.
async fn switch(
    endpoint: &Client,
    spec: &CopySpec,
    places: &Places,
    progress: &dyn Progress,
    shard: u32,
    wait: Duration,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + wait;
    let mut attempt = 0;
    loop {
        progress.phase(&format!("shard {shard}: waiting for the copy to catch up"));
        loop {
            let lag = copy_lag(places, spec).await?;
            if lag.is_some_and(|l| l <= SWITCH_LAG_BYTES) {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "the copy of shard {shard} has not caught up within {} s (lag {}): the move stays under way; run the command again to go on, or --cancel",
                    wait.as_secs(),
                    lag.map_or("unknown".into(), |l| format!("{l} bytes"))
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        attempt += 1;
        progress.phase(&format!(
            "shard {shard}: switching (its statements wait meanwhile)"
        ));
        match herd_function(endpoint, "move_switch", &[&shard.to_string()]).await {
            Ok(answer) => {
                progress.done(&answer);
                return Ok(answer);
            }
            Err(e) if attempt < SWITCH_ATTEMPTS => {
                progress.done(&format!("switch attempt {attempt} undone: {e:#}"));
            }
            Err(e) => return Err(e.context(format!(
                "the switch of shard {shard} failed {attempt} times; the move stays under way (run again, or --cancel)"
            ))),
        }
    }
}

/// The copy's lag in bytes (`None` while unknown).
async fn copy_lag(places: &Places, spec: &CopySpec) -> anyhow::Result<Option<u64>> {
    let primary = places.primary(spec.group, &spec.database).await?;
    let target = herd_copy::target::connect(&spec.target).await?;
    let status =
        herd_copy::status::read(spec, Ok(&primary), Ok(&target), places.warn_bytes()).await;
    if status.state == herd_core::CopyState::Broken {
        bail!(
            "the move's copy is broken: {}",
            status.reason.unwrap_or_default()
        );
    }
    Ok(status.lag_bytes)
}

/// Deletes `shard`'s rows of every distributed table on `group` (hidden there: the source
/// after a switch, the target of a cancelled move) and its marker rows. Triggers do not fire
/// (`session_replication_role = replica`): the source's guard refuses these rows' writes.
async fn delete_rows(
    places: &Places,
    group: u32,
    map: &ShardMap,
    database: &str,
    shard: u32,
    progress: &dyn Progress,
) -> anyhow::Result<u64> {
    let client = places.primary(group, database).await?;
    client
        .batch_execute("SET session_replication_role = replica")
        .await
        .context("preparing to delete the shard's rows")?;
    let mut total = 0;
    for (table, column, key_type) in map.distributed() {
        progress.phase(&format!(
            "deleting shard {shard}'s rows of {table} on group {group}"
        ));
        let key = map.key_shard_sql(column, key_type, None);
        total += client
            .execute(
                &format!(
                    "DELETE FROM {} WHERE {key} = {shard}",
                    herd_copy::quote_qualified(table)
                ),
                &[],
            )
            .await
            .with_context(|| format!("deleting shard {shard}'s rows of {table}"))?;
    }
    client
        .execute(
            "DELETE FROM herd.move_marks WHERE shard = $1",
            &[&(shard as i32)],
        )
        .await
        .context("deleting the move's marker")?;
    Ok(total)
}

/// Takes back a move that has not switched: its copy, the rows copied to the target, the map's
/// record.
async fn cancel(
    places: &Places,
    endpoint: &Client,
    map: &ShardMap,
    args: &MoveArgs<'_>,
    progress: &dyn Progress,
) -> anyhow::Result<String> {
    let shard = args.shard;
    let Some(m) = map.moves.get(&shard) else {
        return Ok(format!("shard {shard} is not moving"));
    };
    if map.switched(shard) {
        bail!(
            "shard {shard} has switched to group {} already: run `herd shards move {shard} --to {}` to finish the move",
            m.to, m.to
        );
    }
    let spec = copy_spec(map, places, m.to, args.database, shard, m.from).await?;
    progress.phase(&format!("shard {shard}: dropping the move's copy"));
    places.drop_copy(&spec).await?;
    let deleted = delete_rows(places, m.to, map, args.database, shard, progress).await?;
    herd_function(endpoint, "move_cancel", &[&shard.to_string()]).await?;
    progress.done(&format!("shard {shard}: move cancelled"));
    Ok(format!(
        "the move of shard {shard} to group {} is cancelled: {deleted} copied rows deleted there; the shard stays on group {}",
        m.to, m.from
    ))
}

/// The move's copy: every distributed table's rows of the shard, and its marker row, from
/// group `from` to `target`'s primary. Without TRUNCATE: a TRUNCATE on the source group would
/// empty the target's whole table (it runs on every group anyway).
async fn copy_spec(
    map: &ShardMap,
    places: &Places,
    to: u32,
    database: &str,
    shard: u32,
    from: u32,
) -> anyhow::Result<CopySpec> {
    let mut tables = Vec::new();
    for (table, column, key_type) in map.distributed() {
        let mut t = TableSpec::new(table)?;
        t.row_filter = Some(format!(
            "{} = {shard}",
            map.key_shard_sql(column, key_type, None)
        ));
        tables.push(t);
    }
    if tables.is_empty() {
        bail!("{database} has no distributed table: there is nothing to move");
    }
    let mut marks = TableSpec::new("herd.move_marks")?;
    marks.row_filter = Some(format!("shard = {shard}"));
    tables.push(marks);
    let conninfo = places.target_conninfo(to, database).await?;
    Ok(CopySpec {
        name: format!("move_s{shard}"),
        group: from,
        database: database.to_string(),
        tables,
        schemas: Vec::new(),
        target: conninfo,
        publish: Some("insert, update, delete".into()),
    })
}

/// `SELECT herd.<function>(args…)` through the endpoint: its answer.
async fn herd_function(endpoint: &Client, function: &str, args: &[&str]) -> anyhow::Result<String> {
    let list: Vec<String> = args.iter().map(|a| herd_copy::quote_literal(a)).collect();
    let sql = format!("SELECT herd.{function}({})", list.join(", "));
    let rows = endpoint
        .simple_query(&sql)
        .await
        .map_err(|e| {
            anyhow::anyhow!(e
                .as_db_error()
                .map_or(e.to_string(), |d| d.message().to_string()))
        })
        .with_context(|| format!("herd.{function}"))?;
    Ok(rows
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .unwrap_or_default())
}

/// The newest shard map, read from group 0's primary.
async fn read_map(client: &Client) -> anyhow::Result<ShardMap> {
    crate::shards::stored_map(client)
        .await?
        .context("nothing is distributed in this database (no shard map)")
}
