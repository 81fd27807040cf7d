//! PgBouncer, when installed, as a comparison point: transaction pooling in front of the primary.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::{free_port, UrlParts};
use crate::scratches::Scratches;
use crate::BenchError;

/// Where Debian and most distributions install the program, besides PATH.
const SEARCH: [&str; 2] = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"];
/// PgBouncer built from Debian's source package by `scripts/install-pgbouncer-src` (≥ 1.21,
/// which keeps prepared statements in transaction pooling): preferred over the one on `PATH`.
const FROM_SOURCE: &str = "/opt/pgbouncer-src/bin/pgbouncer";

/// The installed PgBouncer: its path and version.
#[derive(Clone, Debug)]
pub struct Installed {
    program: PathBuf,
    /// e.g. "1.18.0".
    pub version: String,
}

impl Installed {
    /// PgBouncer on PATH or in the usual directories, or `None`.
    pub fn find() -> Option<Installed> {
        let on_path: Vec<PathBuf> = std::env::var_os("PATH")
            .map(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join("pgbouncer"))
                    .collect()
            })
            .unwrap_or_default();
        let program = std::iter::once(PathBuf::from(FROM_SOURCE))
            .chain(on_path)
            .chain(SEARCH.iter().map(PathBuf::from))
            .find(|p| p.is_file())?;
        let out = Command::new(&program).arg("--version").output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let version = text
            .lines()
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("unknown")
            .to_string();
        Some(Installed { program, version })
    }

    /// Whether this version keeps protocol-level prepared statements working in transaction
    /// pooling (`max_prepared_statements`, PgBouncer ≥ 1.21).
    pub fn supports_prepared(&self) -> bool {
        let mut parts = self
            .version
            .split('.')
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let major = parts.next().unwrap_or(0);
        let minor = parts.next().unwrap_or(0);
        (major, minor) >= (1, 21)
    }
}

/// A PgBouncer child process; killed when dropped. Listed in the run's [`Scratches`] while it
/// runs: only this process waits for it, so it would outlive an interrupted run.
pub struct PgBouncer {
    child: Child,
    scratches: Scratches,
    /// The URL clients use to reach the primary through PgBouncer.
    pub url: String,
}

impl PgBouncer {
    /// Writes a configuration under `scratch/pgbouncer` for the server at `upstream` (a URL with
    /// the superuser's password; by its Unix socket in `socket_dir` when given), with
    /// `extra_users` (name, password or verifier) in its `auth_file` too, and starts PgBouncer
    /// in the foreground, as the `postgres` OS user when running as root (PgBouncer refuses
    /// root); listed in `scratches` until dropped.
    pub fn start(
        scratches: &Scratches,
        installed: &Installed,
        scratch: &Path,
        upstream: &str,
        socket_dir: Option<&Path>,
        pool_size: u32,
        extra_users: &[(&str, &str)],
    ) -> Result<PgBouncer, BenchError> {
        let up = UrlParts::parse(upstream)
            .ok_or_else(|| BenchError::Missing(format!("cannot read the URL {upstream:?}")))?;
        let dir = scratch.join("pgbouncer");
        std::fs::create_dir_all(&dir).map_err(|e| BenchError::io("creating", &dir, e))?;
        let port = free_port()?;
        let prepared = if installed.supports_prepared() {
            "max_prepared_statements = 200\n"
        } else {
            ""
        };
        let ini = format!(
            "[databases]\n\
             {db} = host={host} port={pport} dbname={db}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = scram-sha-256\n\
             auth_file = {auth}\n\
             pool_mode = transaction\n\
             default_pool_size = {pool_size}\n\
             max_client_conn = 2000\n\
             logfile = {log}\n\
             {prepared}",
            db = up.dbname,
            host = socket_dir.map_or(up.host.clone(), |d| d.display().to_string()),
            pport = up.port,
            auth = dir.join("userlist.txt").display(),
            log = dir.join("pgbouncer.log").display(),
        );
        // The plain password lets PgBouncer log in to PostgreSQL with SCRAM; the directory
        // holding it is private to the user PgBouncer runs as.
        let mut users = format!("\"{}\" \"{}\"\n", up.user, up.password);
        // More roles, each with its password or SCRAM verifier (a verifier: PgBouncer checks
        // the client with it and logs in to the server with the client's proof).
        for (user, secret) in extra_users {
            users.push_str(&format!("\"{user}\" \"{secret}\"\n"));
        }
        write_private(&dir.join("pgbouncer.ini"), &ini)?;
        write_private(&dir.join("userlist.txt"), &users)?;
        let mut cmd = Command::new(&installed.program);
        cmd.arg(dir.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(user) = herd_pg::OsUser::for_servers("postgres")? {
            use std::os::unix::process::CommandExt;
            user.chown_tree(&dir)?;
            cmd.uid(user.uid()).gid(user.gid());
        }
        let child = cmd.spawn().map_err(|source| BenchError::Spawn {
            program: installed.program.display().to_string(),
            source,
        })?;
        scratches.add_helper(child.id());
        let mut bouncer = PgBouncer {
            child,
            scratches: scratches.clone(),
            url: format!(
                "postgresql://{}:{}@127.0.0.1:{port}/{}",
                up.user, up.password, up.dbname
            ),
        };
        bouncer.wait_listening(port, &dir.join("pgbouncer.log"))?;
        Ok(bouncer)
    }

    /// PgBouncer's process id (its CPU and context switches are read from `/proc`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn wait_listening(&mut self, port: u16, log: &Path) -> Result<(), BenchError> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(());
            }
            let exited = matches!(self.child.try_wait(), Ok(Some(_)));
            if exited || Instant::now() > deadline {
                return Err(BenchError::Failed {
                    what: "starting pgbouncer".into(),
                    status: if exited {
                        "exited"
                    } else {
                        "not listening after 10 s"
                    }
                    .into(),
                    output: std::fs::read_to_string(log).unwrap_or_default(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        // Forgotten before it is reaped, so an interrupt never signals a reused pid.
        self.scratches.remove_helper(self.child.id());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes `text` to a new file readable by its owner only.
fn write_private(path: &Path, text: &str) -> Result<(), BenchError> {
    herd_pg::write_private(path, text).map_err(|e| BenchError::io("writing", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepared_support_by_version() {
        let v = |s: &str| Installed {
            program: PathBuf::new(),
            version: s.into(),
        };
        assert!(!v("1.18.0").supports_prepared());
        assert!(v("1.21.0").supports_prepared());
        assert!(v("1.23.1").supports_prepared());
        assert!(!v("unknown").supports_prepared());
    }
}
