//! Finding the PostgreSQL 15 server programs.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::PgError;

/// The PostgreSQL major version Herd runs.
pub const PG_MAJOR: u32 = 15;

/// Programs a directory must hold to be used.
const REQUIRED: [&str; 4] = ["postgres", "initdb", "pg_ctl", "pg_basebackup"];

/// Debian's location of the server programs, which are not on PATH by default. Packagers and
/// tests replace this list with `HERD_PG_SEARCH_DIRS` (colon-separated; empty: none).
const STANDARD_DIRS: &str = "/usr/lib/postgresql/15/bin";

/// A directory holding PostgreSQL server programs of the right major version.
#[derive(Clone, Debug)]
pub struct PgBinaries {
    bindir: PathBuf,
    version: String,
}

impl PgBinaries {
    /// Finds the programs: in `configured` when given (and only there), otherwise the directory of
    /// `initdb` on PATH (symlinks followed), `pg_config --bindir`, then Debian's standard location.
    pub fn locate(configured: Option<&Path>) -> Result<PgBinaries, PgError> {
        let candidates: Vec<PathBuf> = match configured {
            Some(dir) => vec![dir.to_path_buf()],
            None => search_candidates(),
        };
        let mut wrong_version = None;
        for dir in &candidates {
            if !REQUIRED.iter().all(|p| is_executable(&dir.join(p))) {
                continue;
            }
            match server_version(dir) {
                Some(v) if major_of(&v) == Some(PG_MAJOR) => {
                    return Ok(PgBinaries {
                        bindir: dir.clone(),
                        version: v,
                    })
                }
                Some(v) => wrong_version = Some((dir.clone(), v)),
                None => {}
            }
        }
        if let Some((bindir, found)) = wrong_version {
            return Err(PgError::WrongVersion {
                bindir,
                found,
                major: PG_MAJOR,
            });
        }
        let mut searched: Vec<String> =
            candidates.iter().map(|d| d.display().to_string()).collect();
        if configured.is_none() {
            searched.insert(0, "PATH".into());
        }
        searched.dedup();
        Err(PgError::NotFound {
            major: PG_MAJOR,
            searched: searched.join(", "),
        })
    }

    /// The directory of the programs.
    pub fn bindir(&self) -> &Path {
        &self.bindir
    }

    /// `postgres --version` output, e.g. `postgres (PostgreSQL) 15.18`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Full path of one program.
    pub fn program(&self, name: &str) -> PathBuf {
        self.bindir.join(name)
    }
}

fn search_candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(initdb) = find_on_path("initdb") {
        if let Some(dir) = std::fs::canonicalize(&initdb)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
        {
            out.push(dir);
        }
    }
    if let Some(pg_config) = find_on_path("pg_config") {
        if let Ok(o) = Command::new(pg_config).arg("--bindir").output() {
            let dir = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if o.status.success() && !dir.is_empty() {
                out.push(PathBuf::from(dir));
            }
        }
    }
    let standard =
        std::env::var("HERD_PG_SEARCH_DIRS").unwrap_or_else(|_| STANDARD_DIRS.to_string());
    out.extend(
        standard
            .split(':')
            .filter(|s| !s.is_empty())
            .map(PathBuf::from),
    );
    let mut seen = std::collections::HashSet::new();
    out.retain(|d| seen.insert(d.clone()));
    out
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn server_version(dir: &Path) -> Option<String> {
    let out = Command::new(dir.join("postgres"))
        .arg("--version")
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The major version in `postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)`.
fn major_of(version: &str) -> Option<u32> {
    let number = version
        .split_whitespace()
        .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))?;
    let digits: String = number.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn major_version_parsing() {
        assert_eq!(
            major_of("postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"),
            Some(15)
        );
        assert_eq!(major_of("postgres (PostgreSQL) 16beta1"), Some(16));
        assert_eq!(major_of("postgres (PostgreSQL) 9.6.24"), Some(9));
        assert_eq!(major_of("garbage"), None);
    }

    #[test]
    fn configured_directory_without_programs_is_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = PgBinaries::locate(Some(dir.path()))
            .expect_err("empty dir")
            .to_string();
        assert!(err.contains("apt-get install postgresql-15"), "{err}");
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
    }
}
