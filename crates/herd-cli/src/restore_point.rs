//! `herd backup restore-point NAME`: a named point in the WAL (`pg_create_restore_point` on
//! shard group 0's primary) that `herd restore --to NAME` restores to, recorded in the data
//! directory (herd-backup's `RestorePoint`).

use anyhow::{bail, Context};
use herd_backup::{Paths, RestorePoint};
use herd_cluster::Layout;
use herd_core::Lsn;

/// `herd backup restore-point NAME`.
pub async fn run(layout: &Layout, name: &str) -> anyhow::Result<()> {
    let config = crate::backup::backup_config(layout)?;
    if !herd_backup::valid_point_name(name) {
        bail!(
            "'{name}' cannot name a restore point: a letter or '_' first, then letters, digits, \
             '_', '-' or '.', at most 63 characters"
        );
    }
    let groups = herd_cluster::existing_groups(layout).max(config.cluster.shards);
    if groups > 1 {
        bail!(
            "the cluster has {groups} shard groups: a restore point consistent across groups \
             needs two-phase commits held while every group takes its point, which is not done \
             yet (docs/backup-status.md)"
        );
    }
    if !herd_cluster::supervisor_running(layout) {
        bail!(
            "the cluster in {} is not running: start it with `herd up` (the point is written \
             by its primary)",
            layout.root().display()
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
    };
    // The segment holding the point is archived now, not at the next archive_timeout: a
    // restore from the repository alone can reach it at once.
    client
        .batch_execute("select pg_switch_wal()")
        .await
        .context("switching WAL so the point is archived")?;
    herd_backup::record_point(&file, &point)?;
    crate::output::emitln!(
        "Restore point {point} on shard group 0.\n\
         Restore to it with: herd restore --to {name} --from-data-dir {} --data-dir NEW-DIR",
        layout.root().display()
    );
    Ok(())
}
