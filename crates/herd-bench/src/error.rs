//! The error type of every benchmark step.

use std::path::PathBuf;

/// Why a benchmark could not be run or reported.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The scenario name is not in the registry.
    #[error("unknown scenario {name:?}; known scenarios: {known}")]
    UnknownScenario {
        /// The name asked for.
        name: String,
        /// The registered names, comma-separated.
        known: String,
    },
    /// A file or directory operation failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done, e.g. "writing".
        what: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A program could not be started or waited for.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A program ran and failed; `output` holds its stderr (and stdout when useful).
    #[error("{what} failed ({status}):\n{output}")]
    Failed {
        /// What was being run, e.g. "pgbench -S on herd (simple)".
        what: String,
        /// Exit status or other cause.
        status: String,
        /// The program's own messages.
        output: String,
    },
    /// A program did not finish in time and was killed.
    #[error("{what} did not finish within {seconds} s and was killed; output so far:\n{output}")]
    Hang {
        /// What was being run.
        what: String,
        /// The time allowed.
        seconds: u64,
        /// Whatever it printed.
        output: String,
    },
    /// A program's output did not have the expected shape.
    #[error("cannot understand the output of {what}:\n{output}")]
    Parse {
        /// What produced the output.
        what: String,
        /// The output.
        output: String,
    },
    /// A required program or resource is missing.
    #[error("{0}")]
    Missing(String),
    /// The PostgreSQL programs or OS user could not be found.
    #[error(transparent)]
    Pg(#[from] herd_pg::PgError),
    /// results.json could not be encoded.
    #[error("encoding results.json: {0}")]
    Json(#[from] serde_json::Error),
    /// The run is being stopped (SIGINT or SIGTERM): no new scratch cluster may start.
    #[error("interrupted")]
    Interrupted,
    /// The SVG chart could not be drawn.
    #[error("drawing {}: {detail}", path.display())]
    Chart {
        /// The chart file.
        path: PathBuf,
        /// The drawing error.
        detail: String,
    },
}

impl BenchError {
    /// An [`BenchError::Io`] for `path`.
    pub fn io(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        BenchError::Io {
            what,
            path: path.into(),
            source,
        }
    }
}
