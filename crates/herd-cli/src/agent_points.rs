//! Restore points of a multi-host cluster, copied from the store into the repository's record
//! (`<repository>/herd-restore-points.tsv`, the file a one-host cluster keeps there too), so that
//! `herd restore --to NAME --repository DIR` finds them with nothing but the repository.
//!
//! The proxy that takes a point records it in the store (`restore_points/<name>`, see
//! [`crate::restore_point_hosts`]) and in its own data directory, but it has no `[backup]`: the
//! agents do, and every host sees the repository. So group 0's leading agent (one writer at a
//! time: the group's leader lease) copies each written point (`taken`, or `partial`: a restore to
//! it is refused, but the name must never be reused) into the repository's record, skipping the
//! groups already there (a copy interrupted between two lines is completed, never doubled), then
//! marks the store's record `in_repository`, which `herd backup restore-point --dcs` waits for.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use herd_backup::RestorePoint;
use herd_dcs::Dcs;
use herd_pg::OsUser;

use crate::restore_point_hosts::{Record, POINTS};

/// The points of `record` (named `name`) the repository's record lacks (`kept`): none when the
/// record is already copied or nothing was written under the name.
pub fn missing(name: &str, record: &Record, kept: &[RestorePoint]) -> Vec<RestorePoint> {
    if record.in_repository || !matches!(record.state.as_str(), "taken" | "partial") {
        return Vec::new();
    }
    record
        .groups
        .iter()
        .filter(|(group, _, _)| !kept.iter().any(|p| p.name == name && p.group == *group))
        .filter_map(|(group, lsn, time)| {
            Some(RestorePoint {
                name: name.to_string(),
                lsn: lsn.parse().ok()?,
                time: *time,
                group: *group,
            })
        })
        .collect()
}

/// Copies the store's written points not yet in the repository's record into it (handed to the
/// servers' OS user, who owns the repository) and marks them copied; how many points were.
pub async fn sync(
    root: &Arc<dyn Dcs>,
    repository: &Path,
    owner: Option<&OsUser>,
) -> anyhow::Result<usize> {
    let dcs = root.clone();
    let listed = tokio::task::spawn_blocking(move || dcs.list(POINTS))
        .await
        .context("the store thread failed")??;
    let file = herd_backup::repository_points(repository);
    let mut copied = 0;
    for (key, value) in listed {
        let Ok(mut record) = serde_json::from_slice::<Record>(&value.value) else {
            continue;
        };
        if record.in_repository || !matches!(record.state.as_str(), "taken" | "partial") {
            continue;
        }
        let name = key.trim_start_matches(POINTS).to_string();
        let kept = herd_backup::read_points(&file)?;
        for point in missing(&name, &record, &kept) {
            herd_backup::record_point(&file, &point)
                .with_context(|| format!("recording the restore point {name}"))?;
        }
        if let Some(u) = owner {
            u.chown_tree(&file)?;
        }
        record.in_repository = true;
        let (dcs, encoded) = (root.clone(), serde_json::to_vec(&record)?);
        // A conflict: rewritten meanwhile (it cannot be, once written); looked at again later.
        let marked =
            tokio::task::spawn_blocking(move || dcs.compare_and_set(&key, value.revision, encoded))
                .await
                .context("the store thread failed")?;
        if marked.is_ok() {
            copied += 1;
            tracing::info!(
                "restore point {name} recorded in {} ({} shard groups)",
                file.display(),
                record.groups.len()
            );
        }
    }
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(state: &str, groups: &[u32], in_repository: bool) -> Record {
        Record {
            state: state.into(),
            groups: groups
                .iter()
                .map(|g| (*g, format!("0/{:X}", 0x3000060 + g), 1_700_000_000_000_000))
                .collect(),
            acknowledged: Vec::new(),
            error: None,
            in_repository,
        }
    }

    fn kept(name: &str, group: u32) -> RestorePoint {
        RestorePoint {
            name: name.into(),
            lsn: "0/1".parse().expect("lsn"),
            time: 1,
            group,
        }
    }

    #[test]
    fn the_written_groups_not_in_the_repository_are_copied_once() {
        let groups = |v: Vec<RestorePoint>| v.iter().map(|p| p.group).collect::<Vec<_>>();
        // (record, already in the repository, groups to copy)
        let cases: Vec<(Record, Vec<RestorePoint>, Vec<u32>)> = vec![
            (record("taken", &[0, 1], false), vec![], vec![0, 1]),
            // A copy interrupted after group 0's line: only group 1's is added.
            (record("taken", &[0, 1], false), vec![kept("p", 0)], vec![1]),
            // Another point's lines do not count.
            (
                record("taken", &[0, 1], false),
                vec![kept("q", 0)],
                vec![0, 1],
            ),
            (record("partial", &[0], false), vec![], vec![0]),
            (record("taken", &[0, 1], true), vec![], vec![]),
            (record("taking", &[], false), vec![], vec![]),
            (record("refused", &[], false), vec![], vec![]),
        ];
        for (r, k, want) in cases {
            assert_eq!(groups(missing("p", &r, &k)), want, "{r:?} {k:?}");
        }
        let p = missing("p", &record("taken", &[1], false), &[]);
        assert_eq!(p[0].lsn.to_string(), "0/3000061");
        assert_eq!(p[0].name, "p");
    }
}
