//! Interrupting `herd bench proxy --quick`: its scratch cluster runs detached (supervisor and
//! servers outside the bench's process group), so a bench that just died would leave it running
//! and its directory in /tmp. Ctrl-C (SIGINT to the whole process group, as a terminal sends it)
//! and SIGTERM to the bench alone must both stop the cluster and PgBouncer, remove the scratch
//! directory, and exit with 130 / 143 in bounded time. Everything the bench started is stopped by
//! the test itself if the bench fails to.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::bench_child::{processes_naming, BenchChild, ScratchClusters, CLUSTER};
use nix::sys::signal::{kill, killpg, Signal};

/// Until the scratch cluster is up (and PgBouncer runs, for the SIGTERM case).
const READY_LIMIT: Duration = Duration::from_secs(300);

/// A running `herd bench proxy --quick` and its scratch cluster: fields drop in order, so the
/// bench's process group is killed first, then whatever is left of its cluster stopped.
struct Run {
    bench: BenchChild,
    clusters: ScratchClusters,
}

impl Run {
    /// Starts the bench; with the scratch directory it announced as its cluster started.
    fn start() -> (Run, PathBuf) {
        let mut run = Run {
            bench: BenchChild::start(&["proxy", "--quick"]),
            clusters: ScratchClusters::default(),
        };
        let dir = PathBuf::from(run.bench.line(CLUSTER, READY_LIMIT, &mut |_| {}));
        run.clusters.0.push(dir.clone());
        (run, dir)
    }
}

/// Checks that the bench exited with `code` and left neither `dir` nor a process naming it.
fn assert_cleaned_up(bench: &mut BenchChild, dir: &Path, code: i32) {
    let stderr = bench.assert_interrupted(code);
    let left = processes_naming(dir);
    assert!(
        left.is_empty(),
        "processes {left:?} still use {dir:?}:\n{stderr}"
    );
    assert!(!dir.exists(), "{dir:?} is left:\n{stderr}");
}

#[test]
fn ctrl_c_stops_and_removes_the_scratch_cluster() {
    let (mut run, dir) = Run::start();
    let ready = dir.join("data/run/supervisor.json");
    run.bench
        .wait_for("a running cluster", READY_LIMIT, || ready.exists());
    // What a terminal's Ctrl-C does: SIGINT to every process of the foreground group.
    killpg(run.bench.pid(), Signal::SIGINT).expect("SIGINT");
    assert_cleaned_up(&mut run.bench, &dir, 130);
}

#[test]
fn sigterm_to_the_bench_alone_stops_the_cluster_and_pgbouncer() {
    let (mut run, dir) = Run::start();
    let config = dir.join("pgbouncer");
    run.bench.wait_for(
        "PgBouncer (run scripts/install-deps if it is not installed)",
        READY_LIMIT,
        || !processes_naming(&config).is_empty(),
    );
    // Only the bench: PgBouncer, its child, gets no signal and would outlive it.
    kill(run.bench.pid(), Signal::SIGTERM).expect("SIGTERM");
    assert_cleaned_up(&mut run.bench, &dir, 143);
}
