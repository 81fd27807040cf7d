//! Watching PostgreSQL's log for the one failure a standby cannot get out of by itself: its
//! upstream no longer has the WAL it needs ("requested WAL segment … has already been
//! removed"). It happens to a former primary rewound onto a member promoted moments ago when
//! the WAL since its last checkpoint before the fork was recycled; only a fresh clone helps.

use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The walreceiver's error when the upstream removed the segment it asks for (servers are
/// initialised with the C locale, so messages are in English).
const WAL_REMOVED: &str = "has already been removed";

/// At most this much of the log is read per round (the retry lines are short and recur every
/// `wal_retrieve_retry_interval`).
const MAX_READ: u64 = 64 * 1024;

/// How long a sighting counts: streaming retries every second, rounds come about as often.
const RECENT: Duration = Duration::from_secs(10);

/// Reads the log from where it last stopped and remembers when the message was last seen.
#[derive(Debug)]
pub struct LogWatch {
    path: PathBuf,
    offset: Option<u64>,
    seen_at: Option<Instant>,
}

impl LogWatch {
    /// Watches `path` from its current end (older lines may describe an earlier upstream).
    pub fn new(path: PathBuf) -> LogWatch {
        LogWatch {
            path,
            offset: None,
            seen_at: None,
        }
    }

    /// Forgets every sighting and skips what the log holds now: called when the server gets
    /// a new upstream or a new data directory.
    pub fn reset(&mut self) {
        self.seen_at = None;
        self.offset = std::fs::metadata(&self.path).ok().map(|m| m.len());
    }

    /// Reads the lines written since the last call.
    pub fn poll(&mut self) {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return;
        };
        let Ok(len) = file.metadata().map(|m| m.len()) else {
            return;
        };
        let start = match self.offset {
            // The first poll only finds the end; a shorter file was replaced: start over.
            None => {
                self.offset = Some(len);
                return;
            }
            Some(at) if at > len => 0,
            Some(at) => at.max(len.saturating_sub(MAX_READ)),
        };
        let mut text = Vec::new();
        if file.seek(SeekFrom::Start(start)).is_err()
            || file.take(len - start).read_to_end(&mut text).is_err()
        {
            return;
        }
        self.offset = Some(len);
        if String::from_utf8_lossy(&text).contains(WAL_REMOVED) {
            self.seen_at = Some(Instant::now());
        }
    }

    /// The upstream said, recently, that it no longer has the WAL this server needs.
    pub fn upstream_lacks_wal(&self) -> bool {
        self.seen_at.is_some_and(|t| t.elapsed() < RECENT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sees_only_lines_written_after_it_started_watching() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("postgresql.log");
        let line = "FATAL:  could not receive data from WAL stream: ERROR:  requested WAL segment 000000010000000000000005 has already been removed\n";
        std::fs::write(&path, line).expect("write");
        let mut watch = LogWatch::new(path.clone());
        watch.poll();
        assert!(!watch.upstream_lacks_wal(), "an old line does not count");
        let append = |text: &str| {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .expect("open");
            f.write_all(text.as_bytes()).expect("append");
        };
        append("LOG:  started streaming WAL from primary at 0/5000000 on timeline 1\n");
        watch.poll();
        assert!(!watch.upstream_lacks_wal());
        append(line);
        watch.poll();
        assert!(watch.upstream_lacks_wal(), "a new line counts");
        watch.reset();
        assert!(!watch.upstream_lacks_wal(), "a new upstream starts afresh");
        watch.poll();
        assert!(!watch.upstream_lacks_wal());
    }

    #[test]
    fn a_replaced_log_is_read_from_its_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("postgresql.log");
        std::fs::write(&path, "x".repeat(1000)).expect("write");
        let mut watch = LogWatch::new(path.clone());
        watch.poll();
        std::fs::write(
            &path,
            "ERROR:  requested WAL segment 1 has already been removed\n",
        )
        .expect("write");
        watch.poll();
        assert!(watch.upstream_lacks_wal());
    }
}
