//! Ctrl-C (SIGINT) and SIGTERM during `herd bench`: the scratch clusters run detached (their
//! supervisors and servers are outside the bench's process group, so the signal does not
//! reach them), and the benchmark thread cannot be unwound from outside to run their `Drop`;
//! so the run's [`Scratches`] are stopped here (with them the lab of `failover --hosts 3` and
//! the CPU groups of `read-scaling` and `sharding`), then the process exits as a killed one
//! would report it (128 + the signal's number).

use std::time::Duration;

use anyhow::Context;
use herd_bench::{Left, Scratches};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// How long stopping everything may take before the process exits anyway: `herd down` takes
/// seconds, but a cluster interrupted while starting is stopped once its supervisor is ready.
const STOP_LIMIT: Duration = Duration::from_secs(90);

/// SIGINT and SIGTERM, caught from the start of the run.
pub struct Signals {
    int: Signal,
    term: Signal,
}

/// A signal that arrived: its name and the exit code it stands for.
#[derive(Clone, Copy, Debug)]
pub struct Caught {
    name: &'static str,
    code: i32,
}

impl Signals {
    /// Replaces the default action of SIGINT and SIGTERM (ending the process at once).
    pub fn install() -> anyhow::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
        })
    }

    /// The next SIGINT or SIGTERM.
    pub async fn next(&mut self) -> Caught {
        tokio::select! {
            _ = self.int.recv() => Caught { name: "SIGINT", code: 130 },
            _ = self.term.recv() => Caught { name: "SIGTERM", code: 143 },
        }
    }
}

/// Stops every scratch cluster, helper, lab and CPU group of `scratches` (bounded by [`STOP_LIMIT`]), says what
/// is left, and exits with `caught`'s code; another signal meanwhile exits at once, naming
/// what may be left and how to remove it.
pub async fn stop_and_exit(caught: Caught, mut signals: Signals, scratches: Scratches) -> ! {
    scratches.hide_progress();
    // Named again if a second signal cuts the stop short (those being stopped are no longer
    // listed then).
    let known = scratches.pending("it was being stopped");
    let dirs: Vec<_> = known.iter().map(|l| l.dir.clone()).collect();
    if dirs.is_empty() {
        eprintln!("\nherd bench: interrupted ({}); stopping…", caught.name);
    } else {
        eprintln!(
            "\nherd bench: interrupted ({}): stopping {} … \
             (interrupt again to exit without waiting)",
            caught.name,
            list(&dirs)
        );
    }
    let stopping = {
        let scratches = scratches.clone();
        tokio::task::spawn_blocking(move || scratches.stop_all(STOP_LIMIT))
    };
    // The blocking stop bounds itself; this is the backstop should it not return.
    let backstop = STOP_LIMIT + Duration::from_secs(30);
    tokio::select! {
        stopped = tokio::time::timeout(backstop, stopping) => {
            let left = match stopped {
                Ok(Ok(left)) => left,
                _ => existing(scratches.pending("not stopped in time")),
            };
            report(&left);
        }
        again = signals.next() => {
            eprintln!("herd bench: interrupted again ({}); exiting without waiting.", again.name);
            let mut all = known;
            for l in scratches.pending("it was being stopped") {
                if !all.iter().any(|k| k.dir == l.dir) {
                    all.push(l);
                }
            }
            report(&existing(all));
        }
    }
    std::process::exit(caught.code)
}

/// Those of `left` whose directory is still there.
fn existing(left: Vec<Left>) -> Vec<Left> {
    left.into_iter().filter(|l| l.dir.exists()).collect()
}

/// Says whether everything was stopped and removed, or what is left and how to remove it.
fn report(left: &[Left]) {
    if left.is_empty() {
        eprintln!("herd bench: stopped; nothing it started is left.");
        return;
    }
    eprintln!("herd bench: these may still run or be on disk:");
    for l in left {
        eprintln!(
            "  {} ({}); remove with: {}",
            l.dir.display(),
            brief(&l.why),
            l.remove
        );
    }
}

/// `why` on one line, at most about 200 characters (a failed `herd down` quotes its output).
fn brief(why: &str) -> String {
    let line = why
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    match line.char_indices().nth(200) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    }
}

fn list(dirs: &[std::path::PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
