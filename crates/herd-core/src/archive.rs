//! WAL archiving health of a shard group's primary (`pg_stat_archiver` and the segments
//! waiting in `pg_wal/archive_status`), as `herd status`, `/metrics` and the dashboard show it.

use serde::{Deserialize, Serialize};

/// How the primary's WAL archiving is doing. Ages are in seconds before the observation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ArchiveStatus {
    /// The last WAL file archived successfully (a segment, `.history` or `.partial` file);
    /// `null` before the first since the statistics were reset.
    pub last_archived_wal: Option<String>,
    /// How long ago it was archived.
    pub last_archived_age_seconds: Option<f64>,
    /// Failed attempts since the statistics were reset (each retry counts).
    pub failed_count: u64,
    /// The WAL file of the last failed attempt.
    pub last_failed_wal: Option<String>,
    /// How long ago that attempt failed.
    pub last_failed_age_seconds: Option<f64>,
    /// Completed WAL files waiting to be archived.
    pub pending: u64,
    /// How long the oldest of them has waited (0 when none waits): how far behind the archive
    /// is.
    pub behind_seconds: f64,
    /// The bound (`[backup] archive_lag_warning_s`) beyond which the archive counts as behind.
    pub warning_after_seconds: u64,
    /// Set when the archive is behind more than the bound, or the primary could not be asked:
    /// what is wrong, in a sentence.
    pub warning: Option<String>,
}

impl ArchiveStatus {
    /// Sets [`ArchiveStatus::warning`] from the other fields.
    pub fn judge(mut self) -> ArchiveStatus {
        self.warning = (self.behind_seconds > self.warning_after_seconds as f64).then(|| {
            let failing = match (&self.last_failed_wal, self.last_failed_age_seconds) {
                (Some(wal), Some(age))
                    if self.last_archived_age_seconds.is_none_or(|ok| age < ok) =>
                {
                    format!("; archiving fails (last failure: {wal}, {age:.0} s ago; see the primary's log)")
                }
                _ => String::new(),
            };
            format!(
                "WAL archiving is behind: {} file(s) waiting, the oldest for {:.0} s (more than \
                 backup.archive_lag_warning_s = {}){failing}",
                self.pending, self.behind_seconds, self.warning_after_seconds
            )
        });
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(behind: f64, failed: Option<f64>) -> ArchiveStatus {
        ArchiveStatus {
            last_archived_wal: Some("000000010000000000000003".into()),
            last_archived_age_seconds: Some(400.0),
            failed_count: u64::from(failed.is_some()),
            last_failed_wal: failed.map(|_| "000000010000000000000004".into()),
            last_failed_age_seconds: failed,
            pending: u64::from(behind > 0.0),
            behind_seconds: behind,
            warning_after_seconds: 300,
            warning: None,
        }
        .judge()
    }

    #[test]
    fn behind_more_than_the_bound_is_a_warning() {
        assert_eq!(status(0.0, None).warning, None);
        assert_eq!(status(299.0, Some(1.0)).warning, None);
        let w = status(301.0, Some(2.0)).warning.expect("warning");
        assert!(w.contains("behind") && w.contains("archiving fails"), "{w}");
        let w = status(301.0, None).warning.expect("warning");
        assert!(!w.contains("fails"), "{w}");
    }
}
