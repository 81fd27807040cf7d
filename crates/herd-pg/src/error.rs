//! Errors of PostgreSQL program runs and probes.

use std::path::PathBuf;

/// What went wrong while running or talking to PostgreSQL.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// The server programs were not found.
    #[error(
        "PostgreSQL {major} server programs (initdb, pg_ctl, pg_basebackup) not found; looked in: {searched}.\n\
         Install them with `apt-get install postgresql-{major}`, or set postgres.bindir in herd.toml (or --pg-bindir)."
    )]
    NotFound {
        /// Required major version.
        major: u32,
        /// Where Herd looked.
        searched: String,
    },
    /// The programs found are of another major version.
    #[error("{bindir} holds PostgreSQL {found}, Herd needs PostgreSQL {major}. Install postgresql-{major} or point postgres.bindir at it.")]
    WrongVersion {
        /// The directory.
        bindir: PathBuf,
        /// The version string found.
        found: String,
        /// Required major version.
        major: u32,
    },
    /// A program exited unsuccessfully.
    #[error("{program} failed ({status}): {detail}")]
    Command {
        /// The program and its main arguments.
        program: String,
        /// Exit status description.
        status: String,
        /// The end of its error output.
        detail: String,
    },
    /// A file or directory operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What Herd was doing.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The OS user for the servers could not be found, created or used.
    #[error("OS user '{user}': {detail}")]
    OsUser {
        /// The user name.
        user: String,
        /// What went wrong and what to do.
        detail: String,
    },
    /// A SQL connection or query failed.
    #[error("{context}: {source}")]
    Sql {
        /// Which server and what for.
        context: String,
        /// The driver's error (carries the SQLSTATE when the server sent one).
        source: tokio_postgres::Error,
    },
    /// A server did not answer in time.
    #[error("{0}")]
    Timeout(String),
    /// TLS to the servers could not be set up (the CA file, a name).
    #[error("TLS to the servers: {0}")]
    Tls(String),
    /// A server answered with something Herd cannot interpret.
    #[error("unexpected answer from {context}: {detail}")]
    Protocol {
        /// Which server and query.
        context: String,
        /// What was wrong.
        detail: String,
    },
}

impl PgError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        PgError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
