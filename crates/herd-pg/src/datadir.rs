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

/// Removes `standby.signal` and `recovery.signal` from the stopped data directory of a former
/// primary before pg_rewind: after a crash pg_rewind runs single-user crash recovery itself,
/// and a single-user server refuses standby mode ("standby mode is not supported by
/// single-user servers"). Only for a server that crashed as a primary: crash recovery as a
/// primary on a standby's directory would write WAL the new primary does not have. The role's
/// signal file is written again when the server is configured to follow.
pub fn clear_recovery_signals(dir: &Path) -> Result<(), PgError> {
    for signal in ["standby.signal", "recovery.signal"] {
        let path = dir.join(signal);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(PgError::io("removing", &path, e)),
        }
    }
    Ok(())
}

/// Fencing: kills every process of the server in `dir` with SIGKILL (which also ends stopped
/// processes) and waits until all are gone. Backends are found by their working directory
/// (PostgreSQL's processes run in their data directory), so backends orphaned by an earlier
/// death of the postmaster are killed too: none may go on acknowledging writes.
pub fn kill_server(dir: &Path) -> Result<(), PgError> {
    let mut victims = processes_in(dir);
    if let Some(pid) = postmaster_pid(dir)? {
        victims.extend(children_of(pid));
        victims.push(pid);
    }
    victims.sort_unstable();
    victims.dedup();
    for p in &victims {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*p as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while victims
        .iter()
        .any(|p| std::path::Path::new(&format!("/proc/{p}/stat")).exists() && !is_zombie(*p))
    {
        if std::time::Instant::now() > deadline {
            return Err(PgError::Timeout(format!(
                "processes of {} did not exit after SIGKILL",
                dir.display()
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // A killed postmaster may linger as a zombie until its parent reaps it, and PostgreSQL
    // would take its pid in the lock file for a live server. It is dead: remove the file.
    let lock = dir.join("postmaster.pid");
    if let Err(e) = std::fs::remove_file(&lock) {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(PgError::io("removing", lock, e));
        }
    }
    Ok(())
}

/// Processes whose working directory is `dir`.
fn processes_in(dir: &Path) -> Vec<u32> {
    let Ok(target) = std::fs::canonicalize(dir) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == target))
        .collect()
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// Direct children of `pid` (PostgreSQL's backends and auxiliary processes).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                })
                == Some(pid)
        })
        .collect()
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
