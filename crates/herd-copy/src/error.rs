//! Errors of logical copies, each saying what happened and what to do.

use std::path::PathBuf;

/// Why a copy operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// The request itself is wrong (a name, a table, a filter); nothing was changed.
    #[error("{0}")]
    Invalid(String),
    /// The target's tables differ from the source's; nothing was changed.
    #[error("{0}")]
    Schema(String),
    /// A statement failed.
    #[error("{context}: {detail}")]
    Sql {
        /// What Herd was doing.
        context: String,
        /// PostgreSQL's message (with its SQLSTATE).
        detail: String,
    },
    /// The cluster's servers could not be reached.
    #[error(transparent)]
    Pg(#[from] herd_pg::PgError),
    /// A definition file could not be read or written.
    #[error("{action} {path}: {detail}")]
    File {
        /// What Herd was doing.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        detail: String,
    },
    /// Waited too long.
    #[error("{0}")]
    Timeout(String),
}

impl CopyError {
    /// Wraps a tokio-postgres error with what was being done, keeping the SQLSTATE visible.
    pub fn sql(context: impl Into<String>, e: &tokio_postgres::Error) -> CopyError {
        let detail = match e.as_db_error() {
            Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
            None => e.to_string(),
        };
        CopyError::Sql {
            context: context.into(),
            detail,
        }
    }
}
