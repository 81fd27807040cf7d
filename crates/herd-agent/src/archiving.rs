//! A primary's WAL archiving health across hosts (`[backup]` on `herd agent`): read by its own
//! agent over the probe's kept connection and published in its member record, so `herd status
//! --dcs` shows what `herd status` shows on one host (herd-cluster reads it for `herd up`).

use herd_core::ArchiveStatus;
use herd_pg::{ArchiverRow, PgError};

/// The archiving health from one reading of the archiver, judged against `bound`
/// (`[backup] archive_lag_warning_s`); a failed reading is a warning of its own.
pub fn archive_status(row: Result<ArchiverRow, PgError>, bound: u64) -> ArchiveStatus {
    herd_cluster::archive_status_of(row, bound)
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
