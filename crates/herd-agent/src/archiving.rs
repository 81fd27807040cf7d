//! A primary's WAL archiving health across hosts (`[backup]` on `herd agent`): read by its own
//! agent over the probe's kept connection and published in its member record, so `herd status
//! --dcs` shows what `herd status` shows on one host (herd-cluster reads it for `herd up`).

use herd_core::ArchiveStatus;
use herd_pg::{ArchiverRow, PgError};

/// The archiving health from one reading of the archiver, judged against `bound`
/// (`[backup] archive_lag_warning_s`); a failed reading is a warning of its own.
pub fn archive_status(row: Result<ArchiverRow, PgError>, bound: u64) -> ArchiveStatus {
    match row {
        Ok(r) => ArchiveStatus {
            last_archived_wal: r.last_archived_wal,
            last_archived_age_seconds: r.last_archived_age,
            failed_count: r.failed_count.max(0) as u64,
            last_failed_wal: r.last_failed_wal,
            last_failed_age_seconds: r.last_failed_age,
            pending: r.pending.max(0) as u64,
            behind_seconds: r.oldest_pending_age.unwrap_or(0.0).max(0.0),
            warning_after_seconds: bound,
            warning: None,
        }
        .judge(),
        Err(e) => ArchiveStatus {
            last_archived_wal: None,
            last_archived_age_seconds: None,
            failed_count: 0,
            last_failed_wal: None,
            last_failed_age_seconds: None,
            pending: 0,
            behind_seconds: 0.0,
            warning_after_seconds: bound,
            warning: Some(format!(
                "cannot read the primary's archiver statistics: {e}"
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pending: i64, oldest: Option<f64>) -> ArchiverRow {
        ArchiverRow {
            last_archived_wal: Some("000000020000000000000005".into()),
            last_archived_age: Some(3.0),
            failed_count: -1,
            last_failed_wal: None,
            last_failed_age: None,
            pending,
            oldest_pending_age: oldest,
        }
    }

    #[test]
    fn readings_become_the_status_documents_archiving() {
        let ok = archive_status(Ok(row(0, None)), 300);
        assert_eq!(ok.warning, None);
        assert_eq!(
            (ok.failed_count, ok.pending, ok.behind_seconds),
            (0, 0, 0.0)
        );
        let behind = archive_status(Ok(row(4, Some(400.0))), 300);
        assert!(behind
            .warning
            .expect("behind")
            .contains("4 file(s) waiting"));
        let failed = archive_status(Err(PgError::Timeout("slow".into())), 300);
        assert!(failed.warning.expect("unread").contains("cannot read"));
    }
}
