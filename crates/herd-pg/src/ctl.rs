//! Running initdb, pg_ctl and pg_basebackup as the servers' OS user.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

use crate::{OsUser, PgBinaries, PgError};

/// How `pg_ctl stop` ends sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopMode {
    /// Roll back open transactions, checkpoint, and (on a primary) send all WAL to the standbys.
    Fast,
    /// Abort without a checkpoint; crash recovery runs on the next start. Used for fencing.
    Immediate,
}

/// Runs PostgreSQL programs with the right binaries and OS user.
#[derive(Clone, Debug)]
pub struct Pg {
    bins: PgBinaries,
    user: Option<OsUser>,
    /// With a cluster CA: `pg_basebackup` and `pg_rewind` verify the server they copy from
    /// (`sslmode=verify-full`); `None`: no TLS asked for.
    peer_tls: Option<crate::PeerTls>,
}

impl Pg {
    /// Programs from `bins`, run as `user` (or as the current user when `None`).
    pub fn new(bins: PgBinaries, user: Option<OsUser>) -> Self {
        Pg {
            bins,
            user,
            peer_tls: None,
        }
    }

    /// The same, with `pg_basebackup` and `pg_rewind` connecting over TLS and verifying the
    /// server's certificate with the cluster's CA and its name with the host asked for.
    pub fn with_peer_tls(mut self, tls: crate::PeerTls) -> Self {
        self.peer_tls = Some(tls);
        self
    }

    /// libpq's TLS settings for a program connecting to another member.
    fn peer_tls(&self, cmd: &mut Command) {
        if let Some(tls) = &self.peer_tls {
            cmd.env("PGSSLMODE", "verify-full").envs(tls.env());
        }
    }

    /// The binaries in use.
    pub fn binaries(&self) -> &PgBinaries {
        &self.bins
    }

    /// The OS user the servers run as, when not the current one.
    pub fn os_user(&self) -> Option<&OsUser> {
        self.user.as_ref()
    }

    /// Gives `path` to the servers' OS user (no-op when Herd is not root).
    pub fn hand_over(&self, path: &Path) -> Result<(), PgError> {
        match &self.user {
            Some(u) => u.chown_tree(path),
            None => Ok(()),
        }
    }

    fn command(&self, program: &str, cwd: &Path) -> Command {
        let mut cmd = Command::new(self.bins.program(program));
        cmd.current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_remove("PGDATA")
            .env_remove("PGPASSWORD")
            .env("LC_MESSAGES", "C")
            // Own process group: a Ctrl-C aimed at Herd's terminal must not reach the servers;
            // Herd shuts them down itself, in order.
            .process_group(0)
            .kill_on_drop(true);
        if let Some(u) = &self.user {
            cmd.uid(u.uid()).gid(u.gid());
        }
        cmd
    }

    async fn run(
        &self,
        program: &str,
        cwd: &Path,
        args: &[String],
        timeout: Duration,
    ) -> Result<String, PgError> {
        let mut cmd = self.command(program, cwd);
        cmd.args(args);
        self.run_command(program, args, cmd, timeout).await
    }

    async fn run_command(
        &self,
        program: &str,
        args: &[String],
        mut cmd: Command,
        timeout: Duration,
    ) -> Result<String, PgError> {
        let label = format!(
            "{program} {}",
            args.first().map(String::as_str).unwrap_or("")
        );
        let child = cmd.spawn().map_err(|e| PgError::Command {
            program: label.clone(),
            status: "not started".into(),
            detail: e.to_string(),
        })?;
        let out = tokio::time::timeout(timeout, child.wait_with_output())
            .await
            .map_err(|_| {
                PgError::Timeout(format!(
                    "{label} did not finish within {}s",
                    timeout.as_secs()
                ))
            })?
            .map_err(|e| PgError::Command {
                program: label.clone(),
                status: "wait failed".into(),
                detail: e.to_string(),
            })?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        let mut detail = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if detail.is_empty() {
            detail = String::from_utf8_lossy(&out.stdout).trim().to_string();
        }
        Err(PgError::Command {
            program: label,
            status: out.status.to_string(),
            detail: tail(&detail, 1500),
        })
    }

    /// Creates a new primary data directory with SCRAM authentication and `superuser`, whose
    /// password is read from `pwfile`.
    pub async fn initdb(
        &self,
        datadir: &Path,
        superuser: &str,
        pwfile: &Path,
    ) -> Result<(), PgError> {
        let args = vec![
            "-D".into(),
            path_arg(datadir),
            "-U".into(),
            superuser.into(),
            format!("--pwfile={}", path_arg(pwfile)),
            "--auth=scram-sha-256".into(),
            "--encoding=UTF8".into(),
            "--locale=C.UTF-8".into(),
            "--data-checksums".into(),
            "--no-instructions".into(),
        ];
        self.run("initdb", parent(datadir), &args, Duration::from_secs(300))
            .await
            .map(drop)
    }

    /// Starts the server and waits until it accepts connections (or, for a standby, reaches a
    /// consistent state). The postmaster outlives Herd: it is not Herd's child process.
    pub async fn start(&self, datadir: &Path, logfile: &Path) -> Result<(), PgError> {
        self.start_within(datadir, logfile, 120).await
    }

    /// As [`Pg::start`], waiting at most `wait_s` seconds for the server to accept
    /// connections; when that runs out pg_ctl fails but leaves the server starting.
    pub async fn start_within(
        &self,
        datadir: &Path,
        logfile: &Path,
        wait_s: u64,
    ) -> Result<(), PgError> {
        let args = vec![
            "start".into(),
            "-D".into(),
            path_arg(datadir),
            "-l".into(),
            path_arg(logfile),
            "-w".into(),
            "-t".into(),
            wait_s.to_string(),
            "-s".into(),
        ];
        match self
            .run(
                "pg_ctl",
                parent(datadir),
                &args,
                Duration::from_secs(wait_s + 10),
            )
            .await
        {
            Ok(_) => Ok(()),
            // pg_ctl's own message is terse; the server log says why.
            Err(PgError::Command {
                program,
                status,
                detail,
            }) => Err(PgError::Command {
                program,
                status,
                detail: format!(
                    "{detail}\nlast lines of {}:\n{}",
                    logfile.display(),
                    log_tail(logfile, 12)
                ),
            }),
            Err(e) => Err(e),
        }
    }

    /// Stops the server and waits for it to exit.
    pub async fn stop(&self, datadir: &Path, mode: StopMode) -> Result<(), PgError> {
        let mut args = stop_args(datadir, mode);
        args.extend(["-w".into(), "-t".into(), "120".into()]);
        self.run("pg_ctl", parent(datadir), &args, Duration::from_secs(130))
            .await
            .map(drop)
    }

    /// Asks the server to stop and returns without waiting for it to exit (`pg_ctl stop -W`).
    /// For a caller that waits itself, for a new postmaster: an agent may start the server
    /// again the moment the old one is gone, and `pg_ctl stop -w` would then wait, until its
    /// timeout, for the new server's pid file to go away.
    pub async fn request_stop(&self, datadir: &Path, mode: StopMode) -> Result<(), PgError> {
        let mut args = stop_args(datadir, mode);
        args.push("-W".into());
        self.run("pg_ctl", parent(datadir), &args, Duration::from_secs(30))
            .await
            .map(drop)
    }

    /// Promotes a standby and waits until it accepts writes.
    pub async fn promote(&self, datadir: &Path) -> Result<(), PgError> {
        let args = vec![
            "promote".into(),
            "-D".into(),
            path_arg(datadir),
            "-w".into(),
            "-t".into(),
            "60".into(),
            "-s".into(),
        ];
        self.run("pg_ctl", parent(datadir), &args, Duration::from_secs(70))
            .await
            .map(drop)
    }

    /// Rewinds a former primary's (stopped) data directory onto the new primary's timeline.
    /// `source` is a libpq connection string to the new primary as a superuser whose password is
    /// `password` (passed in the environment, never on the command line).
    pub async fn rewind(
        &self,
        datadir: &Path,
        source: &str,
        password: &str,
    ) -> Result<(), PgError> {
        let args = vec![
            format!("--target-pgdata={}", path_arg(datadir)),
            format!("--source-server={source}"),
        ];
        let mut cmd = self.command("pg_rewind", parent(datadir));
        cmd.args(&args)
            .env("PGPASSWORD", password)
            .env("PGCONNECT_TIMEOUT", "10");
        self.peer_tls(&mut cmd);
        self.run_command("pg_rewind", &args, cmd, Duration::from_secs(600))
            .await
            .map(drop)
    }

    /// Whether a stopped server's control file says it was last running in recovery
    /// ("in archive recovery", "shut down in recovery"): a standby, rather than a primary.
    pub async fn was_in_recovery(&self, datadir: &Path) -> Result<bool, PgError> {
        let state = self
            .control_field(datadir, "Database cluster state:")
            .await?;
        Ok(state.contains("recovery"))
    }

    /// The "Latest checkpoint location" of a stopped server's control file (`pg_controldata`).
    pub async fn latest_checkpoint(&self, datadir: &Path) -> Result<herd_core::Lsn, PgError> {
        let value = self
            .control_field(datadir, "Latest checkpoint location:")
            .await?;
        value.parse().map_err(|_| PgError::Protocol {
            context: format!("pg_controldata {}", datadir.display()),
            detail: format!("unreadable latest checkpoint location {value:?}"),
        })
    }

    /// The "Database system identifier" of a data directory's control file (`pg_controldata`).
    pub async fn system_identifier(&self, datadir: &Path) -> Result<String, PgError> {
        self.control_field(datadir, "Database system identifier:")
            .await
    }

    /// One field of `pg_controldata`'s output (its value, trimmed), by its label.
    async fn control_field(&self, datadir: &Path, label: &str) -> Result<String, PgError> {
        let args = vec![path_arg(datadir)];
        let out = self
            .run(
                "pg_controldata",
                parent(datadir),
                &args,
                Duration::from_secs(30),
            )
            .await?;
        out.lines()
            .find_map(|l| l.strip_prefix(label))
            .map(|v| v.trim().to_string())
            .ok_or_else(|| PgError::Protocol {
                context: format!("pg_controldata {}", datadir.display()),
                detail: format!("no {label:?} line"),
            })
    }

    /// Makes the server re-read its configuration files.
    pub async fn reload(&self, datadir: &Path) -> Result<(), PgError> {
        let args = vec!["reload".into(), "-D".into(), path_arg(datadir), "-s".into()];
        self.run("pg_ctl", parent(datadir), &args, Duration::from_secs(30))
            .await
            .map(drop)
    }

    /// Clones the primary at `host:port` into `datadir`, streaming WAL through `slot`, with the
    /// password read from `passfile`.
    pub async fn basebackup(
        &self,
        datadir: &Path,
        host: &str,
        port: u16,
        user: &str,
        slot: &str,
        passfile: &Path,
    ) -> Result<(), PgError> {
        let args: Vec<String> = vec![
            "-D".into(),
            path_arg(datadir),
            "-h".into(),
            host.into(),
            "-p".into(),
            port.to_string(),
            "-U".into(),
            user.into(),
            "-S".into(),
            slot.into(),
            "-X".into(),
            "stream".into(),
            "-c".into(),
            "fast".into(),
            "-w".into(),
        ];
        let mut cmd = self.command("pg_basebackup", parent(datadir));
        cmd.args(&args)
            .env("PGPASSFILE", passfile)
            .env("PGCONNECT_TIMEOUT", "10");
        self.peer_tls(&mut cmd);
        self.run_command("pg_basebackup", &args, cmd, Duration::from_secs(1800))
            .await
            .map(drop)
    }
}

/// `pg_ctl stop` of `datadir` in `mode`, silent; the caller says whether it waits.
fn stop_args(datadir: &Path, mode: StopMode) -> Vec<String> {
    let mode = match mode {
        StopMode::Fast => "fast",
        StopMode::Immediate => "immediate",
    };
    vec![
        "stop".into(),
        "-D".into(),
        path_arg(datadir),
        "-m".into(),
        mode.into(),
        "-s".into(),
    ]
}

fn path_arg(p: &Path) -> String {
    p.display().to_string()
}

fn parent(p: &Path) -> &Path {
    p.parent().unwrap_or(Path::new("/"))
}

fn tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &text[start..])
}

/// The last `lines` lines of a log file, or a note that it cannot be read.
pub fn log_tail(path: &Path, lines: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", PathBuf::from(path).display()),
    }
}
