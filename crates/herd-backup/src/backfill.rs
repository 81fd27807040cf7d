//! After a promotion: the previous timeline's WAL the old primary may not have archived.
//!
//! With `archive_mode = on` a standby archives nothing: it marks each segment it receives as
//! archived already (`.done`). A primary killed while its archiver lagged (or while archiving
//! failed) leaves completed segments that only it and the standbys hold; the promoted standby
//! would never archive them and the archive would have a gap a restore cannot cross. So the new
//! primary pushes the completed segments of the previous timelines it still holds, those
//! wholly before the switch point its newest `.history` file records. pgBackRest accepts a
//! segment already archived with the same checksum, so pushing one twice is harmless. The
//! former primary, before it is rewound to follow, pushes in the same way the segments before
//! the switch that it had not archived: the new primary may have recycled them already (its
//! archive broken for longer than `wal_keep_size` of WAL).
//! (`archive_mode = always` on the standbys would do this continuously, but pgBackRest's
//! `backup` and `check` refuse that mode.)

use std::path::{Path, PathBuf};

use crate::{BackupError, Runner};

/// The completed segments of earlier timelines in `pg_wal` that lie wholly before the switch
/// to the newest timeline, oldest first. Nothing when there is no `.history` file (timeline 1).
pub fn previous_timeline_segments(pg_wal: &Path) -> Result<Vec<PathBuf>, BackupError> {
    match newest_history(pg_wal)? {
        Some(history) => segments_before_switch(pg_wal, &history, false),
        None => Ok(Vec::new()),
    }
}

/// The text of the newest `.history` file in `pg_wal`, if any.
pub fn newest_history(pg_wal: &Path) -> Result<Option<String>, BackupError> {
    let Some(history) = names(pg_wal)?
        .iter()
        .filter_map(|n| history_timeline(n).map(|t| (t, n)))
        .max()
        .map(|(_, n)| pg_wal.join(n))
    else {
        return Ok(None);
    };
    std::fs::read_to_string(&history)
        .map(Some)
        .map_err(|e| BackupError::io("reading", &history, e))
}

/// The completed segments in `pg_wal` of the timelines `history` (a `.history` file's text)
/// lists, wholly before each one's switch point, oldest first; with `waiting_only`, only those
/// still marked as waiting for archiving (`archive_status/<segment>.ready`): a former primary's
/// own WAL that it never archived.
pub fn segments_before_switch(
    pg_wal: &Path,
    history: &str,
    waiting_only: bool,
) -> Result<Vec<PathBuf>, BackupError> {
    let switches = parse_history(history);
    let mut out = Vec::new();
    for name in names(pg_wal)? {
        let Some((tli, log, seg)) = segment(&name) else {
            continue;
        };
        let Some(switch) = switches.iter().find(|(t, _)| *t == tli).map(|(_, l)| *l) else {
            continue;
        };
        if waiting_only && !pg_wal.join(format!("archive_status/{name}.ready")).exists() {
            continue;
        }
        let path = pg_wal.join(&name);
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        if size == 0 {
            continue;
        }
        // A segment's end, from its number and its size (wal_segment_size).
        let end = (log << 32) + (seg + 1) * size;
        if end <= switch {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// The file names in `pg_wal`.
fn names(pg_wal: &Path) -> Result<Vec<String>, BackupError> {
    let entries = std::fs::read_dir(pg_wal).map_err(|e| BackupError::io("reading", pg_wal, e))?;
    Ok(entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect())
}

/// Pushes each of `segments` (absolute paths in the data directory `pg_path`) to the
/// repository of shard group `group`; returns how many were pushed.
pub fn push_segments(
    runner: &Runner,
    group: u32,
    pg_path: &Path,
    segments: &[PathBuf],
) -> Result<usize, BackupError> {
    let stanza = crate::stanza(group);
    let option = format!("--pg1-path={}", pg_path.display());
    for s in segments {
        // The new primary's archiver pushes to the same stanza at the same moments (right
        // after a failover it archives its first segments): a push that fails is tried again,
        // a few times, before the failure is reported.
        let mut attempt = 0;
        loop {
            attempt += 1;
            match runner.run_with_params(
                Some(&stanza),
                "archive-push",
                std::slice::from_ref(&option),
                &[s.display().to_string()],
                &mut |_| {},
            ) {
                Ok(_) => break,
                Err(e) if attempt >= PUSH_ATTEMPTS => return Err(e),
                Err(_) => {
                    std::thread::sleep(std::time::Duration::from_millis(500 * attempt as u64));
                }
            }
        }
    }
    Ok(segments.len())
}

/// How many times one segment's push is tried.
const PUSH_ATTEMPTS: u32 = 4;

/// `(timeline, log, segment)` of a segment file name (24 hex digits, nothing after).
fn segment(name: &str) -> Option<(u32, u64, u64)> {
    if name.len() != 24 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some((
        u32::from_str_radix(&name[..8], 16).ok()?,
        u64::from_str_radix(&name[8..16], 16).ok()?,
        u64::from_str_radix(&name[16..], 16).ok()?,
    ))
}

/// The timeline of a `.history` file name.
fn history_timeline(name: &str) -> Option<u32> {
    let tli = name.strip_suffix(".history")?;
    (tli.len() == 8)
        .then(|| u32::from_str_radix(tli, 16).ok())
        .flatten()
}

/// `(parent timeline, switch point)` of each line of a `.history` file
/// (`1\t0/5000060\tno recovery target specified`).
fn parse_history(text: &str) -> Vec<(u32, u64)> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let tli = fields.next()?.parse().ok()?;
            let (hi, lo) = fields.next()?.split_once('/')?;
            let lsn =
                (u64::from_str_radix(hi, 16).ok()? << 32) + u64::from_str_radix(lo, 16).ok()?;
            Some((tli, lsn))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEG: u64 = 16 * 1024 * 1024;

    #[test]
    fn history_lines_and_names() {
        assert_eq!(
            parse_history("1\t0/5000060\tno recovery target specified\n\n2\t1/A0\tx\n"),
            vec![(1, 0x500_0060), (2, (1 << 32) + 0xA0)]
        );
        assert_eq!(segment("000000010000000000000005"), Some((1, 0, 5)));
        assert_eq!(segment("000000010000000000000005.partial"), None);
        assert_eq!(history_timeline("00000002.history"), Some(2));
        assert_eq!(history_timeline("archive_status"), None);
    }

    #[test]
    fn only_whole_segments_before_the_switch() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let wal = tmp.path();
        // Timeline 1 switched to 2 inside segment 5.
        std::fs::write(wal.join("00000002.history"), "1\t0/5000060\tpromoted\n").expect("h");
        for name in [
            "000000010000000000000003",
            "000000010000000000000004",
            "000000010000000000000005.partial",
            "000000020000000000000005",
        ] {
            let file = std::fs::File::create(wal.join(name)).expect("segment");
            file.set_len(SEG).expect("sparse segment");
        }
        let names: Vec<String> = previous_timeline_segments(wal)
            .expect("list")
            .iter()
            .map(|p| p.file_name().expect("name").to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            ["000000010000000000000003", "000000010000000000000004"]
        );
    }

    #[test]
    fn a_former_primary_pushes_only_what_it_never_archived() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let wal = tmp.path();
        std::fs::create_dir(wal.join("archive_status")).expect("status dir");
        // The former primary's own timeline 1, past the switch inside segment 5.
        for (name, status) in [
            ("000000010000000000000003", "done"),
            ("000000010000000000000004", "ready"),
            ("000000010000000000000005", "ready"),
        ] {
            let file = std::fs::File::create(wal.join(name)).expect("segment");
            file.set_len(SEG).expect("sparse segment");
            std::fs::write(wal.join(format!("archive_status/{name}.{status}")), b"")
                .expect("status");
        }
        let names: Vec<String> = segments_before_switch(wal, "1\t0/5000060\tpromoted\n", true)
            .expect("list")
            .iter()
            .map(|p| p.file_name().expect("name").to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["000000010000000000000004"]);
    }

    #[test]
    fn nothing_on_the_first_timeline() {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::write(tmp.path().join("000000010000000000000003"), b"x").expect("segment");
        assert!(previous_timeline_segments(tmp.path())
            .expect("list")
            .is_empty());
    }
}
