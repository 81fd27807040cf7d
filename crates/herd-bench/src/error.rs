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

/// Why a teardown that runs from names alone (the lab of `failover --hosts 3`, the CPU groups of
/// `read-scaling` and `sharding`) left something behind. Crate-private: an interrupt reports it
/// as text beside the commands that remove what is left by hand
/// ([`Left`](crate::Left)), and the owner's `Drop` prints it with them.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TeardownError {
    /// A step building the lab still held its gate when time ran out: nothing was removed,
    /// since what the step was making would have been left anyway.
    #[error(
        "the lab's hosts were still being made when time ran out, so nothing of the lab was \
         removed"
    )]
    StillBuilding,
    /// `ip` could not be started.
    #[error("cannot run `ip {args}` (is iproute2 installed?): {source}")]
    IpSpawn {
        /// Its arguments.
        args: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// `ip` ran and refused (a namespace or bridge is left).
    #[error("`ip {args}` failed: {stderr}")]
    Ip {
        /// Its arguments.
        args: String,
        /// What it printed.
        stderr: String,
    },
    /// Processes of the lab were still running at the deadline, after SIGKILL.
    #[error(
        "processes {pids:?} still run after SIGKILL (stuck in the kernel?); the lab's \
         directories are kept until they are gone"
    )]
    Running {
        /// Their process ids.
        pids: Vec<u32>,
    },
    /// A scratch directory could not be removed.
    #[error("cannot remove {}: {source}", path.display())]
    Remove {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The CPU groups' base could not be removed: most often a group in it still holds a
    /// process that could not be moved out.
    #[error(
        "cannot remove the CPU groups in {}: {source} (a process may still be in one of \
         them: move it to {} and remove the groups, then the base, with rmdir)",
        base.display(),
        home.display()
    )]
    CpuGroups {
        /// The groups' base (`herd-bench-PID`).
        base: PathBuf,
        /// The `cgroup.procs` file of the group their processes go back to.
        home: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Several steps failed, in the order they ran.
    #[error("{}", joined(.0))]
    Several(Vec<TeardownError>),
}

impl TeardownError {
    /// `Ok` when `problems` is empty, else the one problem, or all of them.
    pub(crate) fn from_all(mut problems: Vec<TeardownError>) -> Result<(), TeardownError> {
        match problems.len() {
            0 => Ok(()),
            1 => Err(problems.remove(0)),
            _ => Err(TeardownError::Several(problems)),
        }
    }
}

fn joined(problems: &[TeardownError]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_teardown_problems_are_one_error_naming_each() {
        assert!(TeardownError::from_all(Vec::new()).is_ok());
        let one = TeardownError::from_all(vec![TeardownError::Running { pids: vec![7] }]);
        assert!(matches!(one, Err(TeardownError::Running { .. })));
        let two = TeardownError::from_all(vec![
            TeardownError::Ip {
                args: "netns del hd1h0".into(),
                stderr: "Device busy".into(),
            },
            TeardownError::Running { pids: vec![7, 8] },
        ])
        .expect_err("two problems");
        let text = two.to_string();
        assert!(
            text.starts_with("`ip netns del hd1h0` failed: Device busy; processes [7, 8]"),
            "{text}"
        );
    }
}
