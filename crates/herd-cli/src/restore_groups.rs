//! `herd restore` of a cluster of several shard groups: only a restore point taken across the
//! groups (`herd backup restore-point`, two-phase commits held meanwhile) is a moment at which
//! every group's WAL agrees on each cross-group transaction, so a restore goes to such a point
//! on every group (each from its newest backup ending before its own record). A time maps to
//! the newest point at or before it, and the restore says which; a WAL position (one group's)
//! or `latest` (each group's archive ends at its own moment) are refused. The points are read
//! from the source's data directory, or from the repository's copy of that record.

use std::path::Path;

use anyhow::bail;
use herd_backup::{Paths, RestorePoint, Target};
use herd_cluster::Layout;
use herd_config::Config;
use herd_core::Lsn;

/// How many shard groups the backed-up cluster has: from its data directory, or, with only
/// the repository, from the stanzas in it (`backup/herd-g<N>`).
pub fn source_groups(
    config: &Config,
    old: Option<&Layout>,
    repository: &Path,
) -> anyhow::Result<u32> {
    if let Some(old) = old {
        return Ok(herd_cluster::existing_groups(old).max(config.cluster.shards));
    }
    let mut groups = 1;
    while repository
        .join("backup")
        .join(herd_backup::stanza(groups))
        .exists()
    {
        groups += 1;
    }
    Ok(groups)
}

/// The restore points recorded for the backed-up cluster, and where.
pub struct Recorded {
    /// Oldest first, one record per group.
    pub points: Vec<RestorePoint>,
    /// The data directory or repository they were read from (for messages).
    pub place: String,
}

/// The record of restore points: the source data directory's (`--from-data-dir`), else the
/// copy in the repository (`--repository`; `None` when the repository has none, as one written
/// before the copy was kept).
pub fn recorded_points(
    old: Option<&Layout>,
    repository: &Path,
) -> anyhow::Result<Option<Recorded>> {
    let (file, place) = match old {
        Some(old) => (
            Paths::new(old.root()).restore_points(),
            old.root().display().to_string(),
        ),
        None => {
            let file = herd_backup::repository_points(repository);
            if !file.exists() {
                return Ok(None);
            }
            (file, repository.display().to_string())
        }
    };
    Ok(Some(Recorded {
        points: herd_backup::read_points(&file)?,
        place,
    }))
}

/// The target every group is restored to (a restore point's name) and each group's position of
/// it (index = group).
pub fn plan(
    target: Target,
    recorded: Option<&Recorded>,
    groups: u32,
) -> anyhow::Result<(Target, Vec<Option<Lsn>>)> {
    let Some(recorded) = recorded else {
        bail!(
            "the repository holds {groups} shard groups but no record of the restore points \
             taken across them: restore with --from-data-dir"
        );
    };
    match map_target(&target, &recorded.points, groups) {
        Ok((name, lsns, note)) => {
            if let Some(note) = note {
                eprintln!("note: {note}");
            }
            Ok((Target::Name(name), lsns.into_iter().map(Some).collect()))
        }
        Err(e) => bail!("{}: {e}", recorded.place),
    }
}

/// The restore point `target` means for a cluster of `groups` groups, given the recorded
/// points: its name, each group's position, and a note when a time was mapped to it.
pub fn map_target(
    target: &Target,
    points: &[RestorePoint],
    groups: u32,
) -> Result<(String, Vec<Lsn>, Option<String>), String> {
    let positions = |name: &str| {
        herd_backup::point_on_every_group(points, name, groups)
            .map(|found| found.iter().map(|p| p.lsn).collect::<Vec<_>>())
    };
    match target {
        Target::Name(name) => Ok((name.clone(), positions(name)?, None)),
        Target::Time(t) => {
            let Some(p) = herd_backup::newest_point_before(points, *t, groups) else {
                return Err(format!(
                    "the cluster has {groups} shard groups, which are restored together only to \
                     a restore point taken across them (`herd backup restore-point NAME`, or \
                     one taken with each backup), and none was taken at or before {}",
                    herd_backup::format_utc(*t)
                ));
            };
            let note = format!(
                "the cluster has {groups} shard groups: restoring to the restore point '{}' \
                 taken at {}, the newest at or before {} (only such a point is consistent \
                 across the groups)",
                p.name,
                herd_backup::format_utc(p.time),
                herd_backup::format_utc(*t)
            );
            Ok((p.name.clone(), positions(&p.name)?, Some(note)))
        }
        Target::Lsn(_) | Target::Latest => Err(format!(
            "the cluster has {groups} shard groups: {target} is not one moment across them \
             (each group has its own WAL); restore to a restore point (`herd backup \
             restore-point NAME` while the cluster runs) or to a time (the newest point before \
             it is used)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(name: &str, group: u32, time: i64) -> RestorePoint {
        RestorePoint {
            name: name.into(),
            lsn: Lsn(((group as u64) << 32) + time as u64),
            time,
            group,
        }
    }

    #[test]
    fn targets_map_to_a_point_on_every_group() {
        let points = [
            point("a", 0, 100),
            point("a", 1, 101),
            point("half", 0, 200),
            point("b", 0, 300),
            point("b", 1, 301),
        ];
        // (target, Ok((name, noted)) or a word of the error)
        type Want = Result<(&'static str, bool), &'static str>;
        let cases: [(Target, Want); 8] = [
            (Target::Name("a".into()), Ok(("a", false))),
            (Target::Name("b".into()), Ok(("b", false))),
            (
                Target::Name("half".into()),
                Err("not written on shard group 1"),
            ),
            (
                Target::Name("zz".into()),
                Err("no restore point named 'zz'"),
            ),
            (Target::Time(250), Ok(("a", true))),
            (Target::Time(99), Err("none was taken at or before")),
            (Target::Lsn(Lsn(5)), Err("not one moment across them")),
            (Target::Latest, Err("not one moment across them")),
        ];
        for (target, want) in cases {
            match (map_target(&target, &points, 2), want) {
                (Ok((name, lsns, note)), Ok((want_name, noted))) => {
                    assert_eq!(name, want_name, "{target}");
                    assert_eq!(note.is_some(), noted, "{target}");
                    let own: Vec<Lsn> = (0..2)
                        .map(|g| {
                            points
                                .iter()
                                .find(|p| p.name == name && p.group == g)
                                .expect("recorded")
                                .lsn
                        })
                        .collect();
                    assert_eq!(lsns, own, "each group's own position: {target}");
                }
                (Err(e), Err(word)) => assert!(e.contains(word), "{target}: {e}"),
                (got, want) => panic!("{target}: {got:?}, wanted {want:?}"),
            }
        }
    }
}
