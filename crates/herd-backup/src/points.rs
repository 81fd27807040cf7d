//! The restore points `herd backup restore-point` made, recorded in the data directory
//! (`backup/restore-points.tsv`: name, WAL position, time, one a line) so that a restore to a
//! name can check it exists and start from a backup that ended before it. PostgreSQL itself
//! keeps them only as WAL records, which nothing lists.

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
            })
        })
        .collect())
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
    writeln!(f, "{}\t{}\t{}", point.name, point.lsn, point.time)
        .map_err(|e| BackupError::io("writing", file, e))
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
        };
        record_point(&file, &a).expect("record");
        std::fs::write(
            &file,
            format!(
                "{}garbage line\n",
                std::fs::read_to_string(&file).expect("read")
            ),
        )
        .expect("append garbage");
        assert_eq!(read_points(&file).expect("read"), vec![a]);
    }
}
