//! WAL archiving around a change of primary on `herd up`'s nodes, as the supervisor engine
//! does it (`herd-cluster/src/failover.rs`), when `[backup]` is on: the new primary pushes the
//! previous timeline's completed segments it holds (the old primary may have died before
//! archiving them), and a former primary, before its rewind, pushes the segments it never
//! archived (still `.ready`), which the new primary may have recycled already. Failures are
//! logged (the promotion or rejoin goes on) and `herd status` reports an archive that falls
//! behind.

use std::path::Path;

use herd_cluster::Layout;
use herd_pg::Pg;

/// pgBackRest as the servers' OS user with the cluster's configuration, when herd.toml of
/// `layout` has `[backup]` on.
pub fn runner(layout: &Layout, pg: &Pg) -> Option<herd_backup::Runner> {
    let config = herd_config::Config::load(&layout.config()).ok()?;
    config.backup.is_enabled().then(|| herd_backup::Runner {
        config: herd_backup::Paths::new(layout.root()).config(),
        owner: pg.os_user().cloned(),
        // `archive-push` connects to no server.
        password: None,
    })
}

/// After `pgdata` was promoted: lists the previous timeline's segments now (before a
/// checkpoint may recycle them) and pushes them off the promotion's path.
pub fn previous_timeline(runner: herd_backup::Runner, group: u32, pgdata: &Path) {
    let segments = match herd_backup::previous_timeline_segments(&pgdata.join("pg_wal")) {
        Ok(s) if s.is_empty() => return,
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot list the previous timeline's WAL to archive: {e}");
            return;
        }
    };
    let dir = pgdata.to_path_buf();
    std::thread::spawn(
        move || match herd_backup::push_segments(&runner, group, &dir, &segments) {
            Ok(n) => {
                tracing::info!(
                    "archived the previous timeline's {n} segment(s) the new primary holds"
                )
            }
            Err(e) => tracing::warn!("archiving the previous timeline's WAL: {e}"),
        },
    );
}

/// Before the former primary `pgdata` is rewound onto the timeline of the primary whose data
/// directory is `primary`: pushes what it never archived.
pub async fn former_primary(
    runner: herd_backup::Runner,
    group: u32,
    pgdata: &Path,
    primary: &Path,
) {
    let wal = primary.join("pg_wal");
    let listed = herd_backup::newest_history(&wal).and_then(|h| match h {
        Some(h) => herd_backup::segments_before_switch(&pgdata.join("pg_wal"), &h, true),
        None => Ok(Vec::new()),
    });
    let segments = match listed {
        Ok(s) if s.is_empty() => return,
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot list the former primary's WAL to archive: {e}");
            return;
        }
    };
    let dir = pgdata.to_path_buf();
    let pushed = tokio::task::spawn_blocking(move || {
        herd_backup::push_segments(&runner, group, &dir, &segments)
    })
    .await;
    match pushed {
        Ok(Ok(n)) => tracing::info!(
            "archived {n} WAL segment(s) the former primary had not, before rewinding it"
        ),
        Ok(Err(e)) => tracing::warn!("archiving the former primary's WAL: {e}"),
        Err(e) => tracing::warn!("archiving the former primary's WAL: {e}"),
    }
}
