//! `herd backup restore-point NAME`: a named point in the WAL that `herd restore --to NAME`
//! restores to, recorded in the data directory (herd-backup's `RestorePoint`, one record per
//! shard group). One group: `pg_create_restore_point` on its primary, from here. Several
//! groups: the supervisor takes it (`POST /restore-point`, [`take`]) with the endpoint's
//! two-phase commits held, so that no cross-group transaction is half in it.

use std::time::Duration;

use anyhow::{bail, Context};
use herd_backup::{Paths, RestorePoint};
use herd_cluster::Layout;
use herd_config::Config;
use herd_core::Lsn;
use herd_pg::OsUser;

/// How long a restore point across groups waits for the second phases of two-phase commits
/// under way before it refuses (they take milliseconds; a longer wait means a group's primary
/// is in trouble, and every cross-group commit would wait as long).
const COMMITS_WAIT: Duration = Duration::from_secs(5);

/// One restore point at a time, so that two requests cannot both find a name unused.
static TAKING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Refuses a name PostgreSQL or a restore could not use, or one recorded already.
fn check_name(layout: &Layout, name: &str) -> anyhow::Result<()> {
    if !herd_backup::valid_point_name(name) {
        bail!(
            "'{name}' cannot name a restore point: a letter or '_' first, then letters, digits, \
             '_', '-' or '.', at most 63 characters"
        );
    }
    let file = Paths::new(layout.root()).restore_points();
    if let Some(p) = herd_backup::read_points(&file)?
        .into_iter()
        .find(|p| p.name == name)
    {
        // PostgreSQL would accept it, and a restore would stop at the first of the two.
        bail!("a restore point named {name} exists already ({p}): choose another name");
    }
    Ok(())
}

/// Records `point` in the data directory and in the repository's copy (handed to the servers'
/// OS user, who owns the repository); a failure of the copy is a warning, returned (the data
/// directory's record is what a restore with --from-data-dir reads).
fn record(
    layout: &Layout,
    config: &Config,
    point: &RestorePoint,
) -> anyhow::Result<Option<String>> {
    herd_backup::record_point(&Paths::new(layout.root()).restore_points(), point)?;
    if config.backup.s3.is_some() {
        // No local directory to keep the copy in (a restore from the bucket is not offered yet).
        return Ok(None);
    }
    let copy = herd_backup::repository_points(&config.backup.repository_path(layout.root()));
    let kept = herd_backup::record_point(&copy, point)
        .map_err(anyhow::Error::from)
        .and_then(|()| {
            if let Some(owner) = OsUser::for_servers(&config.postgres.os_user)? {
                owner.chown_tree(&copy)?;
            }
            Ok(())
        });
    Ok(kept.err().map(|e| {
        format!(
            "warning: the repository's copy of the restore points was not written ({e:#}): a \
             restore from --repository alone cannot find this point by name"
        )
    }))
}

/// `herd backup restore-point NAME`.
pub async fn run(layout: &Layout, name: &str) -> anyhow::Result<()> {
    let config = crate::backup::backup_config(layout)?;
    check_name(layout, name)?;
    if !herd_cluster::supervisor_running(layout) {
        bail!(
            "the cluster in {} is not running: start it with `herd up` (the point is written \
             by its primary)",
            layout.root().display()
        );
    }
    let groups = herd_cluster::existing_groups(layout).max(config.cluster.shards);
    if groups > 1 {
        // The name is checked above (a clear error without a round trip) and again by the
        // supervisor, which alone records points.
        let text =
            crate::admin::request_text(layout, format!("/restore-point?name={name}")).await?;
        crate::output::emitln!(
            "{text}\nRestore to it with: herd restore --to {name} --from-data-dir {} --data-dir NEW-DIR",
            layout.root().display()
        );
        return Ok(());
    }
    let cluster = crate::status::open(layout)?;
    let primary = cluster.state.primary.clone();
    let client = herd_pg::connect(&cluster.conn_spec(&primary))
        .await
        .with_context(|| format!("connecting to the primary {primary}"))?;
    let row = client
        .query_one(
            "select pg_create_restore_point($1)::text, \
             (extract(epoch from clock_timestamp()) * 1000000)::int8",
            &[&name],
        )
        .await
        .with_context(|| format!("creating the restore point on {primary}"))?;
    let lsn: Lsn = row
        .try_get::<_, String>(0)
        .context("reading the restore point's position")?
        .parse()
        .context("reading the restore point's position")?;
    let point = RestorePoint {
        name: name.to_string(),
        lsn,
        time: row.try_get(1).context("reading the time")?,
        group: 0,
    };
    // The segment holding the point is archived now, not at the next archive_timeout: a
    // restore from the repository alone can reach it at once.
    client
        .batch_execute("select pg_switch_wal()")
        .await
        .context("switching WAL so the point is archived")?;
    if let Some(warning) = record(layout, &config, &point)? {
        eprintln!("{warning}");
    }
    crate::output::emitln!(
        "Restore point {point} on shard group 0.\n\
         Restore to it with: herd restore --to {name} --from-data-dir {} --data-dir NEW-DIR",
        layout.root().display()
    );
    Ok(())
}

/// Supervisor side of `POST /restore-point?name=N`: the point on every group's primary while
/// the endpoint holds the second phases of two-phase commits, recorded (even when it failed
/// part way, so the name is never used twice); what happened, or why not.
pub async fn take(
    proxy: &herd_proxy::ProxyContext,
    layout: &Layout,
    name: &str,
) -> anyhow::Result<String> {
    let _one = TAKING.lock().await;
    let config = crate::backup::backup_config(layout)?;
    check_name(layout, name)?;
    let outcome = proxy.restore_point(name, COMMITS_WAIT).await;
    let mut lines = Vec::new();
    let mut warning = None;
    for point in points(&outcome, name)? {
        warning = warning.or(record(layout, &config, &point)?);
        lines.push(format!("  shard group {}: {}", point.group, point.lsn));
    }
    let when = crate::restore_point::settled(&outcome, name, proxy.groups())?;
    if let Some(w) = warning {
        lines.push(w);
    }
    Ok(format!(
        "Restore point {name} at {when} on {} shard groups (two-phase commits held for {:.1} ms):\n{}",
        outcome.written.len(),
        outcome.held.as_secs_f64() * 1000.0,
        lines.join("\n")
    ))
}

/// The point's time (its first group's) once every group of `groups` holds it; the error
/// otherwise: nothing taken, or taken on some groups only (recorded by the caller all the
/// same, so the name is never used again).
pub fn settled(
    outcome: &herd_proxy::restore_point::PointOutcome,
    name: &str,
    groups: u32,
) -> anyhow::Result<String> {
    if let Some(e) = &outcome.error {
        if outcome.written.is_empty() {
            bail!("no restore point was taken: {e}");
        }
        bail!(
            "the restore point {name} failed part way ({e}); written on {} of {groups} groups, \
             recorded so the name is not used again, but a restore to it is refused",
            outcome.written.len(),
        );
    }
    Ok(outcome
        .written
        .first()
        .map(|p| herd_backup::format_utc(p.time))
        .unwrap_or_default())
}

/// The point's record for each group it was written on.
pub fn points(
    outcome: &herd_proxy::restore_point::PointOutcome,
    name: &str,
) -> anyhow::Result<Vec<RestorePoint>> {
    outcome
        .written
        .iter()
        .map(|p| {
            Ok(RestorePoint {
                name: name.to_string(),
                lsn: p
                    .lsn
                    .parse()
                    .with_context(|| format!("reading group {}'s position {}", p.group, p.lsn))?,
                time: p.time,
                group: p.group,
            })
        })
        .collect()
}
