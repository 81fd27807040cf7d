//! `herd config set`: change the commit mode, sync quorum or WAL compression of a (running)
//! cluster.

use herd_cluster::Layout;
use herd_pg::{OsUser, Pg, PgBinaries};

pub async fn set(layout: &Layout, key: &str, value: &str) -> anyhow::Result<()> {
    let mut cluster = crate::status::open(layout)?;
    let changed = cluster.config.set(key, value)?;
    let pg = Pg::new(
        PgBinaries::locate(cluster.config.postgres.bindir.as_deref())?,
        OsUser::for_servers(&cluster.config.postgres.os_user)?,
    );
    // herd.toml first: a supervisor restarting a server reads it from there.
    std::fs::write(layout.config(), herd_config::render(&cluster.config))?;
    // Every shard group gets the same settings, group 0 first.
    let groups = herd_cluster::open_groups(layout, &cluster.config)?;
    if changed == herd_config::Changed::ServerSetting {
        for group in &groups {
            group.reload_servers(&pg).await?;
        }
        crate::output::emitln!(
            "wal_compression = {} applied",
            cluster.config.postgres.wal_compression
        );
        return Ok(());
    }
    for mut group in groups {
        group.apply_commit_settings(&pg).await?;
    }
    crate::output::emitln!(
        "commit mode {} with {} applied: synchronous_commit = {}, synchronous_standby_names = '{}'",
        cluster.config.cluster.commit_mode,
        cluster.config.cluster.sync_standbys,
        cluster.config.cluster.commit_mode.synchronous_commit(),
        cluster.synchronous_standby_names()
    );
    Ok(())
}
