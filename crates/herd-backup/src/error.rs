//! Errors of backup operations, each saying what happened and what to do.

use std::path::PathBuf;

/// Why a backup operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The `pgbackrest` program is not installed.
    #[error("pgbackrest is not installed (or not on PATH): run scripts/install-deps, or apt-get install pgbackrest")]
    Missing,
    /// The cluster has no `[backup]` section.
    #[error("backups are not configured for {0}: add `[backup]` with `enabled = true` (or a `repository`) to its herd.toml, then restart it with `herd down` and `herd up`")]
    NotConfigured(PathBuf),
    /// The repository cannot be created or written by the servers' OS user.
    #[error("the backup repository {path} is not writable{user}: {detail}")]
    RepositoryUnwritable {
        /// The repository directory.
        path: PathBuf,
        /// " by user X" when pgBackRest runs as another user.
        user: String,
        /// The cause and what to do.
        detail: String,
    },
    /// A file could not be read or written.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// pgBackRest ran and failed.
    #[error("pgbackrest {command} failed ({status}):\n{output}")]
    Failed {
        /// The pgBackRest command (`backup`, `restore`, …).
        command: String,
        /// Its exit status.
        status: String,
        /// The last lines it printed.
        output: String,
    },
    /// pgBackRest's output could not be understood.
    #[error("cannot read pgbackrest's {what}: {detail}")]
    Output {
        /// Which output.
        what: &'static str,
        /// The parser's message.
        detail: String,
    },
    /// A restore target is not a moment the repository can restore to.
    #[error("{0}")]
    Target(String),
    /// The servers' OS user could not be handed the files.
    #[error(transparent)]
    Pg(#[from] herd_pg::PgError),
}

impl BackupError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        BackupError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
