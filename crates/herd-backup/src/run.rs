//! Running `pgbackrest` as the servers' OS user, reporting its progress line by line.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use herd_pg::OsUser;

use crate::BackupError;

/// `herd backup --type`: pgBackRest's backup types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackupKind {
    /// Every file.
    Full,
    /// Files changed since the last full backup.
    Diff,
    /// Files changed since the last backup of any type.
    Incr,
}

impl BackupKind {
    /// pgBackRest's name.
    pub fn as_str(self) -> &'static str {
        match self {
            BackupKind::Full => "full",
            BackupKind::Diff => "diff",
            BackupKind::Incr => "incr",
        }
    }
}

impl std::str::FromStr for BackupKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "full" => Ok(BackupKind::Full),
            "diff" => Ok(BackupKind::Diff),
            "incr" => Ok(BackupKind::Incr),
            other => Err(format!(
                "'{other}' is not a backup type: full, diff or incr"
            )),
        }
    }
}

/// What pgBackRest is doing, from its console log.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// An INFO message: a step of the command.
    Step(String),
    /// Share of the data copied so far, in percent (from its per-file DETAIL lines).
    Copied(f64),
}

/// Runs pgBackRest commands against one `pgbackrest.conf`.
#[derive(Clone, Debug)]
pub struct Runner {
    /// `pgbackrest.conf`.
    pub config: PathBuf,
    /// The servers' OS user, when Herd runs as root: pgBackRest reads their data directories
    /// and writes a repository `archive-push` (run by PostgreSQL as that user) also writes.
    pub owner: Option<OsUser>,
    /// The superuser's password, for the commands that connect to PostgreSQL (libpq reads it
    /// from PGPASSWORD; pgBackRest has no password option).
    pub password: Option<String>,
}

impl Runner {
    /// Runs `pgbackrest --config=… [--stanza=S] COMMAND ARGS…`, calling `on_event` for each step
    /// it logs; returns what it printed on stdout.
    pub fn run(
        &self,
        stanza: Option<&str>,
        command: &str,
        args: &[String],
        on_event: &mut dyn FnMut(Event),
    ) -> Result<String, BackupError> {
        self.run_with_params(stanza, command, args, &[], on_event)
    }

    /// As [`Runner::run`], with `params` after the command (`archive-push FILE`).
    pub fn run_with_params(
        &self,
        stanza: Option<&str>,
        command: &str,
        args: &[String],
        params: &[String],
        on_event: &mut dyn FnMut(Event),
    ) -> Result<String, BackupError> {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new("pgbackrest");
        cmd.arg(format!("--config={}", self.config.display()));
        if let Some(s) = stanza {
            cmd.arg(format!("--stanza={s}"));
        }
        cmd.args(args)
            .arg(command)
            .args(params)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_remove("PGPASSWORD")
            .env("LC_MESSAGES", "C");
        if let Some(p) = &self.password {
            cmd.env("PGPASSWORD", p);
        }
        if let Some(u) = &self.owner {
            cmd.uid(u.uid()).gid(u.gid());
        }
        let mut child = cmd.spawn().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => BackupError::Missing,
            _ => BackupError::Failed {
                command: command.into(),
                status: "not started".into(),
                output: e.to_string(),
            },
        })?;
        // stderr is drained on its own thread so neither pipe can fill and stall pgBackRest.
        let mut stderr = child.stderr.take();
        let err_thread = std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(e) = stderr.as_mut() {
                let _ = e.read_to_string(&mut text);
            }
            text
        });
        let mut out = String::new();
        if let Some(stdout) = child.stdout.take() {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(event) = parse_event(&line) {
                    on_event(event);
                }
                out.push_str(&line);
                out.push('\n');
            }
        }
        let status = child
            .wait()
            .map_err(|e| BackupError::io("waiting for", "pgbackrest", e))?;
        let err = err_thread.join().unwrap_or_default();
        if status.success() {
            return Ok(out);
        }
        Err(BackupError::Failed {
            command: command.into(),
            status: status.to_string(),
            output: last_lines(&format!("{out}{err}"), 12),
        })
    }
}

/// The step a console log line reports, if any.
fn parse_event(line: &str) -> Option<Event> {
    if let Some((_, msg)) = line.split_once("INFO: ") {
        return Some(Event::Step(msg.trim().to_string()));
    }
    // "P01 DETAIL: backup file /…/base/1/1259 (96KB, 12.34%) checksum …"
    let (_, msg) = line.split_once("DETAIL: ")?;
    if !msg.starts_with("backup file") && !msg.starts_with("restore file") {
        return None;
    }
    let end = msg.find("%)")?;
    let start = msg[..end].rfind([' ', '('])? + 1;
    msg[start..end].parse().ok().map(Event::Copied)
}

/// The last `n` lines of `text`, errors first in pgBackRest's sense: lines naming an ERROR or
/// WARN are kept whole, the rest only when nothing else explains the failure.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let errors: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.contains("ERROR") || l.contains("WARN"))
        .collect();
    let pick = if errors.is_empty() { &lines } else { &errors };
    pick[pick.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_lines_become_steps_and_percentages() {
        assert_eq!(
            parse_event("2026-11-28 13:40:01.123 P00   INFO: backup start archive = 000000010000000000000003, lsn = 0/3000028"),
            Some(Event::Step(
                "backup start archive = 000000010000000000000003, lsn = 0/3000028".into()
            ))
        );
        assert_eq!(
            parse_event(
                "P01 DETAIL: backup file /d/nodes/node0/base/5/1259 (96KB, 12.34%) checksum abc"
            ),
            Some(Event::Copied(12.34))
        );
        assert_eq!(parse_event("P00  DEBUG: something"), None);
        assert_eq!(parse_event("P00 DETAIL: check archive"), None);
    }

    #[test]
    fn failures_keep_the_error_lines() {
        let text = "P00 INFO: a\nP00 INFO: b\nP00 ERROR: [055]: unable to load info file\n";
        assert_eq!(
            last_lines(text, 5),
            "P00 ERROR: [055]: unable to load info file"
        );
        assert_eq!(last_lines("x\ny\nz\n", 2), "y\nz");
    }

    #[test]
    fn backup_kinds() {
        for k in [BackupKind::Full, BackupKind::Diff, BackupKind::Incr] {
            assert_eq!(k.as_str().parse::<BackupKind>(), Ok(k));
        }
        assert!("daily".parse::<BackupKind>().is_err());
    }
}
