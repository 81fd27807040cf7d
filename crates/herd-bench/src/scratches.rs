//! What one `herd bench` run has started that must not outlive it, so that an interrupted run
//! (Ctrl-C, SIGTERM) can stop it: the scratch clusters (their supervisors and servers run
//! detached, outside the bench's process group, and would keep running) and helper processes
//! that would survive their parent (PgBouncer), and the other things a scenario builds outside
//! its own process: the network-namespace lab of `failover --hosts 3` and the CPU groups of
//! `read-scaling` and `sharding`. Shared by the run's threads and the caller's signal handler
//! through [`BenchOptions::scratches`](crate::BenchOptions::scratches).
//!
//! Each registered thing has one owner at a time: its handle's `Drop` claims it before tearing
//! it down, and an interrupt takes what is not claimed yet; whoever comes second leaves it
//! alone.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget};

use crate::teardown;
use crate::{BenchError, TeardownError};

/// A teardown an interrupt runs for something other than a scratch cluster: given the deadline,
/// what could not be removed.
pub(crate) type Stop = Box<dyn FnOnce(Instant) -> Result<(), TeardownError> + Send>;

/// When an interrupt runs an [`Extra`]'s teardown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Together with the clusters' (a lab's hosts: processes of their own).
    WithClusters,
    /// Once every process was stopped (CPU groups: only empty groups can be removed, and
    /// moving a server out of its group while it stops would only unthrottle it).
    Last,
}

/// Something other than a scratch cluster that an interrupt must tear down, named by a path.
struct Extra {
    /// The directory that names it (the lab's scratch directory, the CPU groups' base).
    dir: PathBuf,
    stage: Stage,
    /// How to remove it by hand, for messages.
    remove: String,
    stop: Stop,
}

impl std::fmt::Debug for Extra {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extra")
            .field("dir", &self.dir)
            .field("stage", &self.stage)
            .finish_non_exhaustive()
    }
}

/// The scratch clusters and helper processes of one run, and the progress bar it draws; cloning
/// shares them.
#[derive(Clone, Debug, Default)]
pub struct Scratches {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    /// Clusters nobody is stopping yet: the `herd` binary and the scratch directory.
    live: Vec<(PathBuf, PathBuf)>,
    /// Labs and CPU groups nobody is tearing down yet.
    extras: Vec<Extra>,
    /// Directories whose owner is tearing them down now (the handle's `Drop`), and how to
    /// remove each by hand.
    closing: Vec<(PathBuf, String)>,
    /// Helper processes by pid, not yet reaped (so the pid cannot have been reused).
    helpers: Vec<u32>,
    /// Set by [`Scratches::stop_all`]: from then on no cluster may start.
    stopping: bool,
    /// The bar of the scenario running now: lines are printed above it, and it is hidden once
    /// the run is interrupted so its redraws do not overwrite the caller's messages.
    bar: Option<ProgressBar>,
}

/// Something [`Scratches::stop_all`] could not clean up.
#[derive(Debug)]
pub struct Left {
    /// The directory naming it: a scratch cluster's (its data directory is `data` inside it),
    /// a lab's, a CPU group's.
    pub dir: PathBuf,
    /// Why it is left.
    pub why: String,
    /// The shell commands that remove it by hand.
    pub remove: String,
}

/// How to stop and remove the scratch cluster in `dir` by hand.
fn remove_cluster(dir: &Path) -> String {
    format!(
        "herd down --data-dir {} && rm -rf {}",
        dir.join("data").display(),
        dir.display()
    )
}

impl Scratches {
    /// An empty registry for a new run.
    pub fn new() -> Scratches {
        Scratches::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A thread that panicked while holding the lock left the lists consistent (each change
        // is one push or remove), so the registry stays usable for the teardown.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Shows `line` on stderr above the progress bar (or alone when none is drawn).
    pub fn say(&self, line: &str) {
        let bar = self.lock().bar.clone();
        match bar {
            Some(bar) => bar.suspend(|| eprintln!("{line}")),
            None => eprintln!("{line}"),
        }
    }

    /// Clears and stops the progress bar for good: an interrupted run's messages come next.
    pub fn hide_progress(&self) {
        if let Some(bar) = self.lock().bar.take() {
            bar.finish_and_clear();
            bar.set_draw_target(ProgressDrawTarget::hidden());
        }
    }

    /// Every scratch directory alive or being stopped (clusters, labs, CPU groups), for
    /// messages.
    pub fn dirs(&self) -> Vec<PathBuf> {
        self.pending("").into_iter().map(|l| l.dir).collect()
    }

    /// Everything alive or being stopped, as left for `why`: what an interrupt that cannot
    /// wait reports.
    pub fn pending(&self, why: &str) -> Vec<Left> {
        let state = self.lock();
        let left = |dir: &Path, remove: String| Left {
            dir: dir.to_path_buf(),
            why: why.to_string(),
            remove,
        };
        let live = state.live.iter().map(|(_, d)| left(d, remove_cluster(d)));
        let extras = state.extras.iter().map(|e| left(&e.dir, e.remove.clone()));
        let closing = state.closing.iter().map(|(d, r)| left(d, r.clone()));
        live.chain(extras).chain(closing).collect()
    }

    pub(crate) fn set_bar(&self, bar: Option<&ProgressBar>) {
        self.lock().bar = bar.cloned();
    }

    /// Records the cluster about to start in `dir` with `herd`, before `herd up` runs: an
    /// interrupt during its start must stop it too. Refused once the run is being stopped.
    pub(crate) fn add(&self, herd: &Path, dir: &Path) -> Result<(), BenchError> {
        let mut state = self.lock();
        if state.stopping {
            return Err(BenchError::Interrupted);
        }
        state.live.push((herd.to_path_buf(), dir.to_path_buf()));
        Ok(())
    }

    /// Records something else to tear down if the run is interrupted, named by `dir` (unique
    /// in the run), with how to `remove` it by hand; `stop` is dropped unused when its owner
    /// claims it first. Refused once the run is being stopped (then the caller tears it down).
    pub(crate) fn add_extra(
        &self,
        dir: &Path,
        stage: Stage,
        remove: String,
        stop: Stop,
    ) -> Result<(), BenchError> {
        let mut state = self.lock();
        if state.stopping {
            return Err(BenchError::Interrupted);
        }
        state.extras.push(Extra {
            dir: dir.to_path_buf(),
            stage,
            remove,
            stop,
        });
        Ok(())
    }

    /// Replaces how to remove the extra named by `dir` by hand (it grew since it was added).
    pub(crate) fn set_remove(&self, dir: &Path, remove: String) {
        let mut state = self.lock();
        if let Some(e) = state.extras.iter_mut().find(|e| e.dir == dir) {
            e.remove = remove;
        }
    }

    /// Takes the cluster, lab or CPU groups named by `dir` over for its owner to tear down,
    /// unless an interrupt already took it (then the owner leaves it alone); whether the owner
    /// should tear it down.
    pub(crate) fn claim(&self, dir: &Path) -> bool {
        let mut state = self.lock();
        let remove = if let Some(k) = state.live.iter().position(|(_, d)| d == dir) {
            state.live.remove(k);
            remove_cluster(dir)
        } else if let Some(k) = state.extras.iter().position(|e| e.dir == dir) {
            state.extras.remove(k).remove
        } else {
            return false;
        };
        state.closing.push((dir.to_path_buf(), remove));
        true
    }

    /// The owner has torn down what it claimed.
    pub(crate) fn release(&self, dir: &Path) {
        self.lock().closing.retain(|(d, _)| d != dir);
    }

    /// Records a helper process to kill if the run is interrupted.
    pub(crate) fn add_helper(&self, pid: u32) {
        self.lock().helpers.push(pid);
    }

    /// Forgets a helper; called before it is reaped.
    pub(crate) fn remove_helper(&self, pid: u32) {
        self.lock().helpers.retain(|&p| p != pid);
    }

    /// Stops everything the run started, within `limit`: kills the helpers, stops every
    /// cluster and lab nobody is stopping yet (clusters with `herd down`, then their
    /// directories removed; all at once), waits for those whose owners are stopping them,
    /// then removes the CPU groups, and refuses new ones. What could not be cleaned up.
    pub fn stop_all(&self, limit: Duration) -> Vec<Left> {
        let deadline = Instant::now() + limit;
        self.hide_progress();
        let (live, extras) = {
            let mut state = self.lock();
            state.stopping = true;
            for pid in state.helpers.drain(..) {
                // Not reaped yet (its owner forgets it first), so the pid is still the helper.
                if let Ok(pid) = i32::try_from(pid) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
            (
                std::mem::take(&mut state.live),
                std::mem::take(&mut state.extras),
            )
        };
        let (first, last): (Vec<Extra>, Vec<Extra>) = extras
            .into_iter()
            .partition(|e| e.stage == Stage::WithClusters);
        let mut left: Vec<Left> = std::thread::scope(|s| {
            let clusters = live.iter().map(|(herd, dir)| {
                let stop =
                    s.spawn(move || teardown::stop(herd, dir, deadline).map_err(|e| e.to_string()));
                (dir.clone(), remove_cluster(dir), stop)
            });
            let labs = first.into_iter().map(|e| {
                let stop = e.stop;
                let stopped = s.spawn(move || stop(deadline).map_err(|e| e.to_string()));
                (e.dir, e.remove, stopped)
            });
            let stops: Vec<_> = clusters.chain(labs).collect();
            stops
                .into_iter()
                .filter_map(|(dir, remove, stop)| joined(dir, remove, stop.join()))
                .collect()
        });
        // What a scenario was already stopping when the interrupt came (its pgbench was
        // interrupted too, say): its owner finishes the job.
        loop {
            let closing = self.lock().closing.clone();
            if closing.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                left.extend(closing.into_iter().map(|(dir, remove)| Left {
                    dir,
                    why: format!("still being stopped after {} s", limit.as_secs()),
                    remove,
                }));
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for e in last {
            let stop = e.stop;
            left.extend(joined(
                e.dir,
                e.remove,
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    stop(deadline).map_err(|e| e.to_string())
                })),
            ));
        }
        left
    }
}

/// What is left of `dir` after its teardown returned `stopped`: nothing when it succeeded or
/// the directory is gone anyway.
fn joined<E>(dir: PathBuf, remove: String, stopped: Result<Result<(), String>, E>) -> Option<Left> {
    let why = match stopped {
        Ok(Ok(())) => return None,
        Ok(Err(e)) => e,
        Err(_) => "stopping it panicked".to_string(),
    };
    dir.exists().then_some(Left { dir, why, remove })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claimed_clusters_are_their_owners_and_none_start_once_stopping() {
        let s = Scratches::new();
        let herd = Path::new("/nonexistent/herd");
        let (a, b) = (Path::new("/nonexistent/a"), Path::new("/nonexistent/b"));
        s.add(herd, a).expect("add a");
        s.add(herd, b).expect("add b");
        assert!(s.claim(a));
        assert!(!s.claim(a), "claimed twice");
        assert_eq!(s.dirs(), vec![b.to_path_buf(), a.to_path_buf()]);
        s.release(a);
        // b is left to stop_all; its directory does not exist, so nothing is reported left.
        let left = s.stop_all(Duration::from_secs(5));
        assert!(left.is_empty(), "{left:?}");
        assert!(!s.claim(b), "taken by stop_all");
        assert!(matches!(s.add(herd, a), Err(BenchError::Interrupted)));
        assert!(s.dirs().is_empty());
    }

    #[test]
    fn stop_all_waits_for_owners_within_its_limit() {
        let s = Scratches::new();
        let dir = Path::new("/nonexistent/c");
        s.add(Path::new("/nonexistent/herd"), dir).expect("add");
        assert!(s.claim(dir));
        let left = s.stop_all(Duration::from_millis(300));
        assert_eq!(left.len(), 1, "{left:?}");
        assert_eq!(left[0].dir, dir);
    }

    #[test]
    fn extras_are_torn_down_once_by_their_owner_or_the_interrupt() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let s = Scratches::new();
        let order = Arc::new(Mutex::new(Vec::new()));
        let runs = Arc::new(AtomicUsize::new(0));
        let extra = |name: &'static str| -> Stop {
            let (order, runs) = (Arc::clone(&order), Arc::clone(&runs));
            Box::new(move |_| {
                runs.fetch_add(1, Ordering::SeqCst);
                order.lock().expect("order").push(name);
                Err(TeardownError::Running { pids: vec![1] })
            })
        };
        let (owned, groups, lab) = (
            Path::new("/nonexistent/owned"),
            Path::new("/nonexistent/groups"),
            Path::new("/nonexistent/lab"),
        );
        s.add_extra(
            owned,
            Stage::WithClusters,
            "rm owned".into(),
            extra("owned"),
        )
        .expect("add owned");
        s.add_extra(groups, Stage::Last, "rmdir groups".into(), extra("groups"))
            .expect("add groups");
        s.add_extra(
            lab,
            Stage::WithClusters,
            "ip netns del".into(),
            extra("lab"),
        )
        .expect("add lab");
        assert!(s.claim(owned));
        let pending = s.pending("why");
        assert_eq!(pending.len(), 3, "{pending:?}");
        assert!(pending
            .iter()
            .any(|l| l.dir == owned && l.remove == "rm owned"));
        s.release(owned);
        // Their directories do not exist: failed teardowns of removed things are not left.
        let left = s.stop_all(Duration::from_secs(5));
        assert!(left.is_empty(), "{left:?}");
        assert_eq!(*order.lock().expect("order"), vec!["lab", "groups"]);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert!(!s.claim(lab), "taken by stop_all");
        let refused = s.add_extra(owned, Stage::Last, String::new(), extra("late"));
        assert!(matches!(refused, Err(BenchError::Interrupted)));
    }
}
