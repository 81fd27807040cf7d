//! The restore points `herd backup restore-point` made, recorded in the data directory
//! (`backup/restore-points.tsv`: name, WAL position, time, shard group, one group's record a
//! line; a line of three fields, from before groups were recorded, is group 0's) so that a
//! restore to a name can check it exists on every group and start each group from a backup
//! that ended before its own record. PostgreSQL itself keeps them only as WAL records, which
//! nothing lists.

use std::path::Path;

use herd_core::Lsn;

use crate::{format_utc, BackupError};

/// One restore point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestorePoint {
    /// Its name (`pg_create_restore_point`'s argument).
    pub name: String,
    /// The WAL position of its record.
    pub lsn: Lsn,
    /// When it was made, in microseconds since the Unix epoch.
    pub time: i64,
    /// The shard group whose WAL holds this record.
    pub group: u32,
}

/// The restore points recorded in `file` (none when it does not exist), oldest first; lines
/// that do not parse are skipped.
pub fn read_points(file: &Path) -> Result<Vec<RestorePoint>, BackupError> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(BackupError::io("reading", file, e)),
    };
    Ok(text
        .lines()
        .filter_map(|line| {
            let mut f = line.split('\t');
            Some(RestorePoint {
                name: f.next()?.to_string(),
                lsn: f.next()?.parse().ok()?,
                time: f.next()?.parse().ok()?,
                group: match f.next() {
                    Some(g) => g.parse().ok()?,
                    None => 0,
                },
            })
        })
        .collect())
}

/// The copy of the record kept in the repository `repository` (beside pgBackRest's `backup/`
/// and `archive/`), so that a restore from the repository alone (the data directory lost) can
/// still find a point by name.
pub fn repository_points(repository: &Path) -> std::path::PathBuf {
    repository.join("herd-restore-points.tsv")
}

/// Appends `point` to `file` (created mode 0600).
pub fn record_point(file: &Path, point: &RestorePoint) -> Result<(), BackupError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(file)
        .map_err(|e| BackupError::io("opening", file, e))?;
    writeln!(
        f,
        "{}\t{}\t{}\t{}",
        point.name, point.lsn, point.time, point.group
    )
    .map_err(|e| BackupError::io("writing", file, e))
}

/// The records of the point `name`, one per group of `groups` (index = group), or why a restore
/// of a cluster of `groups` shard groups cannot use it.
pub fn point_on_every_group<'a>(
    points: &'a [RestorePoint],
    name: &str,
    groups: u32,
) -> Result<Vec<&'a RestorePoint>, String> {
    let named: Vec<&RestorePoint> = points.iter().filter(|p| p.name == name).collect();
    if named.is_empty() {
        let mut known: Vec<&str> = Vec::new();
        for p in points {
            if !known.contains(&p.name.as_str()) {
                known.push(&p.name);
            }
        }
        return Err(format!(
            "no restore point named '{name}' (made with `herd backup restore-point`); recorded: {}",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ));
    }
    (0..groups)
        .map(|g| {
            named.iter().copied().find(|p| p.group == g).ok_or_else(|| {
                format!(
                    "the restore point '{name}' was not written on shard group {g} (it failed \
                     part way): a restore to it would not be consistent; choose another point"
                )
            })
        })
        .collect()
}

/// The newest point written on every one of `groups` groups at or before `time` (microseconds
/// since the epoch; a point's time is group 0's): what a restore of a sharded cluster to a time
/// uses, since only a point is consistent across groups.
pub fn newest_point_before(
    points: &[RestorePoint],
    time: i64,
    groups: u32,
) -> Option<&RestorePoint> {
    points
        .iter()
        .filter(|p| p.group == 0 && p.time <= time)
        .filter(|p| point_on_every_group(points, &p.name, groups).is_ok())
        .max_by_key(|p| p.time)
}

impl std::fmt::Display for RestorePoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} at {} ({})",
            self.name,
            self.lsn,
            format_utc(self.time)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_points_read_back() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("restore-points.tsv");
        assert!(read_points(&file).expect("absent").is_empty());
        let a = RestorePoint {
            name: "before-deploy".into(),
            lsn: Lsn(0x300_0060),
            time: 1_795_873_505_000_000,
            group: 1,
        };
        record_point(&file, &a).expect("record");
        std::fs::write(
            &file,
            format!(
                "{}garbage line\nold\t0/3000028\t1795873500000000\n",
                std::fs::read_to_string(&file).expect("read")
            ),
        )
        .expect("append garbage");
        let old = RestorePoint {
            name: "old".into(),
            lsn: Lsn(0x300_0028),
            time: 1_795_873_500_000_000,
            group: 0,
        };
        assert_eq!(read_points(&file).expect("read"), vec![a, old]);
    }

    fn point(name: &str, group: u32, time: i64) -> RestorePoint {
        RestorePoint {
            name: name.into(),
            lsn: Lsn(0x100_0000 * (group as u64 + 1) + time as u64),
            time,
            group,
        }
    }

    #[test]
    fn a_point_must_be_on_every_group() {
        let points = [
            point("a", 0, 10),
            point("a", 1, 11),
            point("half", 0, 20),
            point("b", 0, 30),
            point("b", 1, 30),
        ];
        // (name, groups, Ok(groups found) or a word of the error)
        let cases: [(&str, u32, Result<usize, &str>); 5] = [
            ("a", 2, Ok(2)),
            ("a", 1, Ok(1)),
            ("half", 2, Err("not written on shard group 1")),
            ("half", 1, Ok(1)),
            ("nope", 2, Err("recorded: a, half, b")),
        ];
        for (name, groups, want) in cases {
            match (point_on_every_group(&points, name, groups), want) {
                (Ok(found), Ok(n)) => {
                    assert_eq!(found.len(), n, "{name}");
                    for (g, p) in found.iter().enumerate() {
                        assert_eq!((p.name.as_str(), p.group), (name, g as u32));
                    }
                }
                (Err(e), Err(word)) => assert!(e.contains(word), "{name}: {e}"),
                (got, want) => panic!("{name}: {got:?}, wanted {want:?}"),
            }
        }
        // A time maps to the newest complete point at or before it.
        for (time, want) in [
            (9, None),
            (10, Some("a")),
            (25, Some("a")),
            (30, Some("b")),
            (99, Some("b")),
        ] {
            assert_eq!(
                newest_point_before(&points, time, 2).map(|p| p.name.as_str()),
                want,
                "{time}"
            );
        }
        assert_eq!(
            newest_point_before(&points, 25, 1).map(|p| p.name.as_str()),
            Some("half")
        );
    }
}
