//! A Herd cluster in a scratch directory, on free ports, always taken down.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::BenchError;

/// Ports from `port` on that a cluster needs free: the endpoint, up to 8 nodes, and the API at
/// `port + 100` (checked separately).
const SPAN: u16 = 10;

/// A scratch directory under `/tmp` that PostgreSQL's OS user can enter (mode 0755); removed
/// when dropped.
pub fn scratch_dir() -> Result<tempfile::TempDir, BenchError> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("herd-bench-")
        .tempdir_in("/tmp")
        .map_err(|e| BenchError::io("creating a scratch directory in", "/tmp", e))?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .map_err(|e| BenchError::io("changing the mode of", dir.path(), e))?;
    Ok(dir)
}

/// A base port `p` with `p..p + SPAN` and `p + 100` free on 127.0.0.1 at the time of the check.
pub fn free_port_block() -> Result<u16, BenchError> {
    let start = 30_000 + (std::process::id() % 100) as u16 * 200;
    (0..100u16)
        .map(|i| 20_000 + (start - 20_000 + i * 2 * SPAN) % 40_000)
        .find(|&base| {
            (base..base + SPAN)
                .chain([base + 100])
                .all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok())
        })
        .ok_or_else(|| BenchError::Missing("no block of free ports found on 127.0.0.1".into()))
}

/// One free port on 127.0.0.1 (chosen by the kernel).
pub fn free_port() -> Result<u16, BenchError> {
    let l = TcpListener::bind(("127.0.0.1", 0))
        .map_err(|e| BenchError::io("binding a port on", "127.0.0.1", e))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| BenchError::io("reading the port of", "127.0.0.1", e))
}

/// A running cluster created by `herd up --detach`; dropping it runs `herd down` and removes
/// the directory.
pub struct ScratchCluster {
    herd: PathBuf,
    // Removed after `herd down`: fields are dropped once `Drop::drop` has run.
    dir: tempfile::TempDir,
    /// The URL of Herd's proxy (`herd url`).
    pub proxy_url: String,
    /// The URL of the primary server (`herd url --primary`).
    pub primary_url: String,
}

impl ScratchCluster {
    /// Creates and starts a default cluster with the `herd` binary at `herd`.
    pub fn start(herd: &Path) -> Result<ScratchCluster, BenchError> {
        ScratchCluster::start_with(herd, &[])
    }

    /// Creates and starts a cluster with extra `herd up` flags (e.g. `--commit-mode on`).
    pub fn start_with(herd: &Path, flags: &[&str]) -> Result<ScratchCluster, BenchError> {
        let port = free_port_block()?.to_string();
        let mut cluster = ScratchCluster {
            herd: herd.to_path_buf(),
            dir: scratch_dir()?,
            proxy_url: String::new(),
            primary_url: String::new(),
        };
        let mut up = vec!["up", "--detach", "--port", &port];
        up.extend_from_slice(flags);
        cluster.herd_ok(&up)?;
        cluster.proxy_url = cluster.herd_ok(&["url"])?.trim().to_string();
        cluster.primary_url = cluster.herd_ok(&["url", "--primary"])?.trim().to_string();
        Ok(cluster)
    }

    /// The scratch directory (the data directory is `data` inside it).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn herd(&self, args: &[&str]) -> Result<Output, BenchError> {
        Command::new(&self.herd)
            .args(args)
            .arg("--data-dir")
            .arg(self.data_dir())
            .output()
            .map_err(|source| BenchError::Spawn {
                program: self.herd.display().to_string(),
                source,
            })
    }

    /// Runs `herd <args> --data-dir DIR`; its stdout, or an error with its output.
    pub fn herd_ok(&self, args: &[&str]) -> Result<String, BenchError> {
        let out = self.herd(args)?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        Err(BenchError::Failed {
            what: format!("herd {}", args.join(" ")),
            status: out.status.to_string(),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            ),
        })
    }
}

impl Drop for ScratchCluster {
    fn drop(&mut self) {
        if !self.data_dir().exists() {
            return;
        }
        match self.herd(&["down"]) {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "herd bench: herd down failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => eprintln!("herd bench: {e}"),
        }
    }
}

/// The parts of a `postgresql://user:password@host:port/db` URL PgBouncer's config needs.
#[derive(Debug, PartialEq, Eq)]
pub struct UrlParts {
    /// User name.
    pub user: String,
    /// Password (empty when absent).
    pub password: String,
    /// Host name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Database name.
    pub dbname: String,
}

impl UrlParts {
    /// Splits a URL as printed by `herd url` (no percent-encoding, no query parameters needed).
    pub fn parse(url: &str) -> Option<UrlParts> {
        let rest = url
            .strip_prefix("postgresql://")
            .or_else(|| url.strip_prefix("postgres://"))?;
        let (auth, rest) = rest.rsplit_once('@')?;
        let (user, password) = auth.split_once(':').unwrap_or((auth, ""));
        let (hostport, db) = rest.split_once('/').unwrap_or((rest, "postgres"));
        let db = db.split('?').next().unwrap_or(db);
        let (host, port) = hostport.rsplit_once(':')?;
        Some(UrlParts {
            user: user.into(),
            password: password.into(),
            host: host.into(),
            port: port.parse().ok()?,
            dbname: if db.is_empty() { "postgres" } else { db }.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_parts() {
        let p =
            UrlParts::parse("postgresql://postgres:s3cret@127.0.0.1:5433/postgres").expect("parse");
        assert_eq!(
            p,
            UrlParts {
                user: "postgres".into(),
                password: "s3cret".into(),
                host: "127.0.0.1".into(),
                port: 5433,
                dbname: "postgres".into(),
            }
        );
        assert!(UrlParts::parse("host=x port=1").is_none());
    }
}
