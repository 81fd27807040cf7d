//! A Herd cluster in a scratch directory, on free ports, always taken down.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use herd_core::ports::{scratch_port_base, API_PORT_OFFSET};

use crate::process::run_limited;
use crate::scratches::Scratches;
use crate::{BenchError, BenchOptions};

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

/// A base port `p` with `p..p + SPAN` and `p + 100` free on 127.0.0.1 at the time of the check,
/// below the kernel's ephemeral range so no outgoing connection takes one meanwhile.
pub fn free_port_block() -> Result<u16, BenchError> {
    (0..100u32)
        .map(|i| scratch_port_base(std::process::id(), i, 2 * SPAN))
        .find(|&base| {
            (base..base + SPAN)
                .chain([base + API_PORT_OFFSET])
                .all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok())
        })
        .ok_or_else(|| BenchError::Missing("no block of free ports found on 127.0.0.1".into()))
}

/// One free port on 127.0.0.1 for a helper server (PgBouncer), in the gaps between the blocks
/// [`free_port_block`] hands out and below the ephemeral range.
pub fn free_port() -> Result<u16, BenchError> {
    (0..100u32)
        .map(|i| scratch_port_base(std::process::id(), i, 2 * SPAN) + SPAN + 1)
        .find(|&p| TcpListener::bind(("127.0.0.1", p)).is_ok())
        .ok_or_else(|| BenchError::Missing("no free port found on 127.0.0.1".into()))
}

/// A running cluster created by `herd up --detach` in a scratch directory on free ports;
/// dropping it runs `herd down` and removes the directory. Every scenario uses this one handle.
/// It is listed in the run's [`Scratches`] from before `herd up` until dropped, so an
/// interrupted run stops it too.
pub struct ScratchCluster {
    herd: PathBuf,
    psql: PathBuf,
    port: u16,
    // Removed by `Drop` after `herd down` (not by a `TempDir`: an interrupt may be stopping
    // the cluster instead, and the files must outlive its servers).
    dir: PathBuf,
    scratches: Scratches,
    /// The URL of Herd's proxy (`herd url`).
    pub proxy_url: String,
    /// The URL of the primary server (`herd url --primary`).
    pub primary_url: String,
}

impl ScratchCluster {
    /// Creates and starts a default cluster with the run's `herd` binary.
    pub fn start(opts: &BenchOptions) -> Result<ScratchCluster, BenchError> {
        ScratchCluster::start_with(opts, &[])
    }

    /// Creates and starts a cluster with extra `herd up` flags (e.g. `--commit-mode on`,
    /// `--replicas 0`).
    pub fn start_with(opts: &BenchOptions, flags: &[&str]) -> Result<ScratchCluster, BenchError> {
        ScratchCluster::start_with_config(opts, flags, "")
    }

    /// Like [`ScratchCluster::start_with`], with `herd_toml` (e.g. `[postgres]` settings that
    /// need a restart, such as `wal_level`) written as the data directory's `herd.toml` before
    /// `herd up`, which reads it; `herd up` flags still override it. Empty: the defaults.
    pub fn start_with_config(
        opts: &BenchOptions,
        flags: &[&str],
        herd_toml: &str,
    ) -> Result<ScratchCluster, BenchError> {
        let port = free_port_block()?;
        let psql = herd_pg::PgBinaries::locate(None)?.program("psql");
        let dir = scratch_dir()?.keep();
        if let Err(e) = opts.scratches.add(&opts.herd_exe, &dir) {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        // From here on, dropping `cluster` (also on an error below) stops it.
        let mut cluster = ScratchCluster {
            herd: opts.herd_exe.clone(),
            psql,
            port,
            dir,
            scratches: opts.scratches.clone(),
            proxy_url: String::new(),
            primary_url: String::new(),
        };
        // Where to look if something is left behind; tests read this line to find the cluster.
        opts.scratches.say(&format!(
            "herd bench: scratch cluster in {}",
            cluster.dir.display()
        ));
        if !herd_toml.is_empty() {
            let data = cluster.data_dir();
            std::fs::create_dir_all(&data).map_err(|e| BenchError::io("creating", &data, e))?;
            crate::process::write_script(&data, "herd.toml", herd_toml)?;
        }
        let port = port.to_string();
        let mut up = vec!["up", "--detach", "--port", &port];
        up.extend_from_slice(flags);
        cluster.herd_limited(&up, 600)?;
        cluster.proxy_url = cluster.herd_ok(&["url"])?.trim().to_string();
        cluster.primary_url = cluster.herd_ok(&["url", "--primary"])?.trim().to_string();
        Ok(cluster)
    }

    /// The `herd` binary the cluster runs.
    pub fn herd_exe(&self) -> PathBuf {
        self.herd.clone()
    }

    /// The scratch directory (the data directory is `data` inside it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The directory of the Unix socket of the server on `port`, when it has one.
    pub fn socket_dir(&self, port: u16) -> Option<PathBuf> {
        let dir = herd_cluster::Layout::new(self.data_dir()).sockets();
        herd_pg::socket_path(&dir, port).exists().then_some(dir)
    }

    /// The process id of the cluster's supervisor (which runs its proxy), from `herd status`.
    pub fn supervisor_pid(&self) -> Result<u32, BenchError> {
        let text = self.herd_ok(&["status", "--json"])?;
        serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|s| s["supervisor"]["pid"].as_u64())
            .and_then(|p| u32::try_from(p).ok())
            .ok_or(BenchError::Parse {
                what: "herd status --json (the supervisor's pid)".into(),
                output: text,
            })
    }

    /// The port of Herd's HTTP API.
    pub fn api_port(&self) -> u16 {
        self.port + 100
    }

    /// Runs `herd <args> --data-dir DIR` (killed after two minutes); its stdout, or an error
    /// with its output.
    pub fn herd_ok(&self, args: &[&str]) -> Result<String, BenchError> {
        self.herd_limited(args, 120)
    }

    /// Runs `herd <args> --data-dir DIR`, killed after `secs`; its stdout.
    pub fn herd_limited(&self, args: &[&str], secs: u64) -> Result<String, BenchError> {
        let mut cmd = Command::new(&self.herd);
        cmd.args(args).arg("--data-dir").arg(self.data_dir());
        run_limited(&format!("herd {}", args.join(" ")), cmd, secs)
    }

    /// psql running each statement of `sql` in turn (autocommit, one session) on `url`.
    pub fn psql_cmd(&self, url: &str, sql: &[&str]) -> Command {
        let mut cmd = Command::new(&self.psql);
        cmd.args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", url]);
        for s in sql {
            cmd.arg("-c").arg(s);
        }
        cmd
    }

    /// Runs [`ScratchCluster::psql_cmd`] (killed after 15 minutes); its output.
    pub fn psql(&self, url: &str, sql: &[&str]) -> Result<String, BenchError> {
        let what = format!("psql -c {:?}", sql.join("; "));
        run_limited(&what, self.psql_cmd(url, sql), 900)
    }

    /// `herd config set commit-mode MODE`, then waits until the primary reports the setting.
    pub fn set_commit_mode(&self, mode: &str) -> Result<(), BenchError> {
        let want = if mode == "async" { "local" } else { mode };
        self.config_set("commit-mode", mode, "synchronous_commit", want)
    }

    /// `herd config set KEY VALUE`, then waits (at most 15 s) until the primary's `SHOW setting`
    /// says `want`: the reload has reached the server.
    pub fn config_set(
        &self,
        key: &str,
        value: &str,
        setting: &str,
        want: &str,
    ) -> Result<(), BenchError> {
        self.herd_ok(&["config", "set", key, value])?;
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let got = self.psql(&self.primary_url, &[&format!("show {setting}")])?;
            if got.trim() == want {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(BenchError::Failed {
                    what: format!("herd config set {key} {value}"),
                    status: "setting not applied".into(),
                    output: format!("the primary still reports {setting} = {got}"),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits (at most 60 s) until every standby has replayed to within 1 MiB of the primary, so
    /// one run's backlog does not slow the next; whether they caught up.
    pub fn settle(&self) -> Result<bool, BenchError> {
        let q = "select coalesce(bool_and(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn) \
                 < 1048576), true) from pg_stat_replication";
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.psql(&self.primary_url, &[q])?.trim() == "t" {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        Ok(false)
    }

    /// Herd's `/metrics` text (Prometheus format); empty when the API is unreachable.
    pub fn metrics_text(&self) -> String {
        let mut text = String::new();
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.api_port())) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
            if s.write_all(req.as_bytes()).is_ok() {
                let _ = s.read_to_string(&mut text);
            }
        }
        text
    }

    /// The samples of `/metrics` whose names start with one of `prefixes`, keyed by the
    /// sample's name with its labels.
    pub fn metrics(&self, prefixes: &[&str]) -> BTreeMap<String, f64> {
        self.metrics_text()
            .lines()
            .filter(|l| prefixes.iter().any(|p| l.starts_with(p)))
            .filter_map(|l| l.rsplit_once(' '))
            .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
            .collect()
    }
}

impl Drop for ScratchCluster {
    fn drop(&mut self) {
        // Not ours to stop when an interrupt already took it over.
        if !self.scratches.claim(&self.dir) {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(180);
        if let Err(e) = crate::teardown::stop(&self.herd, &self.dir, deadline) {
            self.scratches.say(&format!("herd bench: {e}"));
        }
        self.scratches.release(&self.dir);
    }
}

/// `url` with libpq's `options` parameter set to `options` (percent-encoded).
pub fn url_with_options(url: &str, options: &str) -> String {
    let encoded: String = options
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options={encoded}")
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
    fn options_are_percent_encoded() {
        assert_eq!(
            url_with_options("postgresql://u:p@h:1/db", "-c herd.consistency=primary"),
            "postgresql://u:p@h:1/db?options=-c%20herd.consistency%3Dprimary"
        );
        assert_eq!(
            url_with_options("postgresql://h/db?x=1", "-c a=b"),
            "postgresql://h/db?x=1&options=-c%20a%3Db"
        );
    }

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
