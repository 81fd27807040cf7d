//! Inspecting a node's PostgreSQL data directory without starting it.

use std::path::Path;

use crate::{PgError, PG_MAJOR};

/// What a node directory holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataDirState {
    /// Absent or empty: safe to initialise.
    Empty,
    /// A PostgreSQL 15 data directory with its control file.
    Valid,
    /// A data directory of another major version.
    OtherVersion(String),
    /// Files are present but essential ones are missing or unreadable.
    Damaged(String),
}

/// Classifies `dir` by its `PG_VERSION` and `global/pg_control` files.
pub fn check_data_dir(dir: &Path) -> DataDirState {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries.count(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return DataDirState::Empty,
        Err(e) => return DataDirState::Damaged(format!("cannot read {}: {e}", dir.display())),
    };
    if entries == 0 {
        return DataDirState::Empty;
    }
    let version = match std::fs::read_to_string(dir.join("PG_VERSION")) {
        Ok(v) => v.trim().to_string(),
        Err(e) => return DataDirState::Damaged(format!("PG_VERSION unreadable: {e}")),
    };
    if version != PG_MAJOR.to_string() {
        return DataDirState::OtherVersion(version);
    }
    for required in ["global/pg_control", "base", "pg_wal"] {
        if !dir.join(required).exists() {
            return DataDirState::Damaged(format!("{required} is missing"));
        }
    }
    DataDirState::Valid
}

/// The pid of a live postmaster for `dir`, from its `postmaster.pid`; `None` when the file is
/// absent, stale, or names a process that is not running.
pub fn postmaster_pid(dir: &Path) -> Result<Option<u32>, PgError> {
    let text = match std::fs::read_to_string(dir.join("postmaster.pid")) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(PgError::io("reading", dir.join("postmaster.pid"), e)),
    };
    let Some(pid) = text
        .lines()
        .next()
        .and_then(|l| l.trim().parse::<i32>().ok())
    else {
        return Ok(None);
    };
    if pid <= 0 {
        return Ok(None);
    }
    // Signal 0 tests for existence; EPERM also means it exists (owned by another user).
    let alive = match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(nix::errno::Errno::EPERM) => true,
        Err(_) => false,
    };
    // A recycled pid would belong to some other program: check it is a postgres process.
    let is_postgres = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).contains("postgres"))
        .unwrap_or(true);
    Ok((alive && is_postgres).then_some(pid as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_directories() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let d = tmp.path().join("node");
        assert_eq!(check_data_dir(&d), DataDirState::Empty);
        std::fs::create_dir(&d).expect("mkdir");
        assert_eq!(check_data_dir(&d), DataDirState::Empty);
        std::fs::write(d.join("junk"), "x").expect("write");
        assert!(matches!(check_data_dir(&d), DataDirState::Damaged(_)));
        std::fs::write(d.join("PG_VERSION"), "14\n").expect("write");
        assert_eq!(check_data_dir(&d), DataDirState::OtherVersion("14".into()));
        std::fs::write(d.join("PG_VERSION"), "15\n").expect("write");
        assert!(matches!(check_data_dir(&d), DataDirState::Damaged(m) if m.contains("pg_control")));
        for sub in ["global", "base", "pg_wal"] {
            std::fs::create_dir(d.join(sub)).expect("mkdir");
        }
        std::fs::write(d.join("global/pg_control"), "x").expect("write");
        assert_eq!(check_data_dir(&d), DataDirState::Valid);
    }

    #[test]
    fn stale_or_missing_pid_files_mean_not_running() {
        let tmp = tempfile::tempdir().expect("tempdir");
        assert_eq!(postmaster_pid(tmp.path()).expect("ok"), None);
        std::fs::write(tmp.path().join("postmaster.pid"), "999999999\n/x\n").expect("write");
        assert_eq!(postmaster_pid(tmp.path()).expect("ok"), None);
        std::fs::write(tmp.path().join("postmaster.pid"), "garbage").expect("write");
        assert_eq!(postmaster_pid(tmp.path()).expect("ok"), None);
    }
}
