//! A primary's WAL archiving statistics: `pg_stat_archiver` and the completed WAL files waiting
//! for `archive_command` (the `.ready` files of `pg_wal/archive_status`).

use crate::{PgError, Prober};

/// One reading of a server's archiver. Ages are seconds before the reading.
#[derive(Clone, Debug, PartialEq)]
pub struct ArchiverRow {
    /// `last_archived_wal`.
    pub last_archived_wal: Option<String>,
    /// `now() - last_archived_time`.
    pub last_archived_age: Option<f64>,
    /// `failed_count`.
    pub failed_count: i64,
    /// `last_failed_wal`.
    pub last_failed_wal: Option<String>,
    /// `now() - last_failed_time`.
    pub last_failed_age: Option<f64>,
    /// WAL files waiting (`.ready`).
    pub pending: i64,
    /// How long the oldest waiting file has waited (its `.ready` file's age); `None` when none.
    pub oldest_pending_age: Option<f64>,
}

/// `pg_ls_archive_statusdir()` needs the superuser (or pg_monitor), which probes log in as.
pub(crate) const ARCHIVER_SQL: &str = "select a.last_archived_wal, \
     extract(epoch from now() - a.last_archived_time)::float8, a.failed_count, \
     a.last_failed_wal, extract(epoch from now() - a.last_failed_time)::float8, \
     r.pending, extract(epoch from now() - r.oldest)::float8 \
     from pg_stat_archiver a, \
     (select count(*) as pending, min(modification) as oldest \
      from pg_ls_archive_statusdir() where name like '%.ready') r";

impl Prober {
    /// Reads the archiver over the connection the last probe kept (none: an error), with the
    /// statement prepared there; bounded by the probe's timeout.
    pub async fn archiver(&self) -> Result<ArchiverRow, PgError> {
        let (client, statement) = self
            .kept_archiver()
            .ok_or_else(|| PgError::Timeout("no probe connection to read the archiver".into()))?;
        let sql = |source| PgError::Sql {
            context: "reading pg_stat_archiver".into(),
            source,
        };
        let row = tokio::time::timeout(self.timeout(), client.query_one(statement, &[]))
            .await
            .map_err(|_| PgError::Timeout("reading pg_stat_archiver timed out".into()))?
            .map_err(sql)?;
        Ok(ArchiverRow {
            last_archived_wal: row.try_get(0).map_err(sql)?,
            last_archived_age: row.try_get(1).map_err(sql)?,
            failed_count: row.try_get(2).map_err(sql)?,
            last_failed_wal: row.try_get(3).map_err(sql)?,
            last_failed_age: row.try_get(4).map_err(sql)?,
            pending: row.try_get(5).map_err(sql)?,
            oldest_pending_age: row.try_get(6).map_err(sql)?,
        })
    }
}
