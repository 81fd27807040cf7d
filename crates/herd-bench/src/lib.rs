//! `herd bench SCENARIO`: scenarios that reproduce Herd's reference measurements.
//!
//! Each scenario creates the cluster it needs in a scratch directory, runs its workload while
//! showing progress (the phase and a bar), tears everything down (also on failure), and writes
//! `results.json`, `report.md` and SVG charts into [`BenchOptions::out`].

mod chart;
mod cluster;
mod error;
mod pgbench;
mod pgbouncer;
pub mod report;
mod scenarios;

use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};

pub use error::BenchError;
pub use pgbench::{median, parse_output, PgbenchRun};
pub use report::{Machine, ModeResult, Results, TargetResult};

/// How to run a scenario.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Short runs for smoke tests: fewer rounds, shorter runs, smaller data; figures are not
    /// meaningful.
    pub quick: bool,
    /// Directory the reports are written to (created when absent).
    pub out: PathBuf,
    /// Seconds per measured run, overriding the scenario's default.
    pub duration: Option<u64>,
    /// The `herd` binary used to create the scratch clusters.
    pub herd_exe: PathBuf,
    /// Iterations (e.g. failovers) per mode, overriding the scenario's default.
    pub iterations: Option<u32>,
}

/// What a finished scenario produced.
#[derive(Debug)]
pub struct Report {
    /// The figures, as written to `results.json`.
    pub results: Results,
    /// The Markdown table, as in `report.md`.
    pub markdown: String,
    /// Every file written, in order.
    pub files: Vec<PathBuf>,
}

/// One registered scenario.
pub struct Scenario {
    /// The name given on the command line.
    pub name: &'static str,
    /// One line for help texts.
    pub about: &'static str,
    run: fn(&BenchOptions, &ProgressBar) -> Result<Results, BenchError>,
}

/// Every scenario `herd bench` knows.
pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "proxy",
        about: "pgbench -S through Herd's proxy (and PgBouncer when installed) against the primary",
        run: scenarios::proxy::run,
    },
    Scenario {
        name: "failover",
        about:
            "kill -9 of the primary under writes: RTO and acknowledged writes lost per commit mode",
        run: scenarios::failover::run,
    },
    Scenario {
        name: "commit-modes",
        about: "rows/s of batched time-series inserts per commit mode, relative to no replication",
        run: scenarios::commit_modes::run,
    },
    Scenario {
        name: "commit-waits",
        about: "wait events (IO:WALSync, IPC:SyncRep, LWLock:WALWrite) of commits per commit mode",
        run: scenarios::commit_waits::run,
    },
];

/// Runs the scenario called `scenario` and writes its reports into `opts.out`.
pub fn run(scenario: &str, opts: &BenchOptions) -> Result<Report, BenchError> {
    let Some(found) = SCENARIOS.iter().find(|s| s.name == scenario) else {
        return Err(BenchError::UnknownScenario {
            name: scenario.into(),
            known: SCENARIOS
                .iter()
                .map(|s| s.name)
                .collect::<Vec<_>>()
                .join(", "),
        });
    };
    std::fs::create_dir_all(&opts.out).map_err(|e| BenchError::io("creating", &opts.out, e))?;
    let bar = ProgressBar::new(0);
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
    {
        bar.set_style(style);
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    let outcome = (found.run)(opts, &bar);
    bar.finish_and_clear();
    let results = outcome?;
    let (markdown, files) = report::write_all(&results, &opts.out)?;
    Ok(Report {
        results,
        markdown,
        files,
    })
}
