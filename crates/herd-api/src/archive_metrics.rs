//! Each shard group's WAL archiving health as Prometheus text (appended to the proxy's in
//! `/metrics`), from the status document's `archiving`.

use std::fmt::Write as _;

use herd_core::{ArchiveStatus, ClusterStatus};

/// The archiving metrics of every group of `status` that reports archiving (none when backups
/// are off or no primary answered).
pub fn archive_metrics(status: &ClusterStatus) -> String {
    let groups: Vec<(u32, &ArchiveStatus)> = status
        .all_groups()
        .into_iter()
        .filter_map(|g| g.archiving.as_ref().map(|a| (g.group, a)))
        .collect();
    let mut out = String::new();
    if groups.is_empty() {
        return out;
    }
    let mut family =
        |name: &str, kind: &str, help: &str, value: &dyn Fn(&ArchiveStatus) -> Option<f64>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (g, a) in &groups {
                if let Some(v) = value(a) {
                    let _ = writeln!(out, "{name}{{group=\"{g}\"}} {v}");
                }
            }
        };
    family(
        "herd_archive_failed_total",
        "counter",
        "Failed WAL archiving attempts on the group's primary (pg_stat_archiver.failed_count, since its statistics were reset).",
        &|a| Some(a.failed_count as f64),
    );
    family(
        "herd_archive_last_archived_age_seconds",
        "gauge",
        "Seconds since the group's primary last archived a WAL file (absent before the first).",
        &|a| a.last_archived_age_seconds,
    );
    family(
        "herd_archive_pending_files",
        "gauge",
        "Completed WAL files waiting on the group's primary to be archived.",
        &|a| Some(a.pending as f64),
    );
    family(
        "herd_archive_behind_seconds",
        "gauge",
        "How long the oldest WAL file waiting to be archived has waited (0 when none waits).",
        &|a| Some(a.behind_seconds),
    );
    family(
        "herd_archive_behind",
        "gauge",
        "1 when the group's archive is behind more than backup.archive_lag_warning_s (or its primary's archiver could not be read), else 0.",
        &|a| Some(if a.warning.is_some() { 1.0 } else { 0.0 }),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_sample_per_group_that_archives() {
        let mut status: ClusterStatus = serde_json::from_value(serde_json::json!({
            "version": 1, "commit_mode": "on", "sync_standbys": "ANY 1",
            "synchronous_standby_names": null, "endpoint": "", "supervisor": null, "nodes": []
        }))
        .expect("status");
        assert_eq!(archive_metrics(&status), "");
        status.archiving = Some(
            ArchiveStatus {
                last_archived_wal: None,
                last_archived_age_seconds: None,
                failed_count: 3,
                last_failed_wal: Some("000000010000000000000004".into()),
                last_failed_age_seconds: Some(2.0),
                pending: 2,
                behind_seconds: 400.5,
                warning_after_seconds: 300,
                warning: None,
            }
            .judge(),
        );
        let text = archive_metrics(&status);
        for line in [
            "# TYPE herd_archive_failed_total counter",
            "herd_archive_failed_total{group=\"0\"} 3",
            "herd_archive_pending_files{group=\"0\"} 2",
            "herd_archive_behind_seconds{group=\"0\"} 400.5",
            "herd_archive_behind{group=\"0\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
        assert!(
            !text.contains("herd_archive_last_archived_age_seconds{"),
            "{text}"
        );
    }
}
