//! What one `herd bench` run has started that must not outlive it, so that an interrupted run
//! (Ctrl-C, SIGTERM) can stop it: the scratch clusters (their supervisors and servers run
//! detached, outside the bench's process group, and would keep running) and helper processes
//! that would survive their parent (PgBouncer). Shared by the run's threads and the caller's
//! signal handler through [`BenchOptions::scratches`](crate::BenchOptions::scratches).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget};

use crate::teardown;
use crate::BenchError;

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
    /// Scratch directories whose owner is stopping them now (the cluster's `Drop`).
    closing: Vec<PathBuf>,
    /// Helper processes by pid, not yet reaped (so the pid cannot have been reused).
    helpers: Vec<u32>,
    /// Set by [`Scratches::stop_all`]: from then on no cluster may start.
    stopping: bool,
    /// The bar of the scenario running now: lines are printed above it, and it is hidden once
    /// the run is interrupted so its redraws do not overwrite the caller's messages.
    bar: Option<ProgressBar>,
}

/// A scratch directory that [`Scratches::stop_all`] could not clean up.
#[derive(Debug)]
pub struct Left {
    /// The scratch directory (the cluster's data directory is `data` inside it).
    pub dir: PathBuf,
    /// Why it is left.
    pub why: String,
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

    /// Every scratch directory alive or being stopped, for messages.
    pub fn dirs(&self) -> Vec<PathBuf> {
        let state = self.lock();
        let live = state.live.iter().map(|(_, dir)| dir.clone());
        live.chain(state.closing.iter().cloned()).collect()
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

    /// Takes the cluster in `dir` over for its owner to stop, unless an interrupt already took
    /// it (then the owner leaves it alone); whether the owner should stop it.
    pub(crate) fn claim(&self, dir: &Path) -> bool {
        let mut state = self.lock();
        let Some(k) = state.live.iter().position(|(_, d)| d == dir) else {
            return false;
        };
        state.live.remove(k);
        state.closing.push(dir.to_path_buf());
        true
    }

    /// The owner has stopped the cluster it claimed.
    pub(crate) fn release(&self, dir: &Path) {
        self.lock().closing.retain(|d| d != dir);
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
    /// cluster nobody is stopping yet (`herd down`, then its directory removed; all at once),
    /// waits for the clusters whose owners are stopping them, and refuses new ones. What could
    /// not be cleaned up.
    pub fn stop_all(&self, limit: Duration) -> Vec<Left> {
        let deadline = Instant::now() + limit;
        self.hide_progress();
        let live = {
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
            std::mem::take(&mut state.live)
        };
        let mut left: Vec<Left> = std::thread::scope(|s| {
            let stops: Vec<_> = live
                .iter()
                .map(|(herd, dir)| (dir, s.spawn(move || teardown::stop(herd, dir, deadline))))
                .collect();
            stops
                .into_iter()
                .filter_map(|(dir, stop)| {
                    let why = match stop.join() {
                        Ok(Ok(())) => return None,
                        Ok(Err(e)) => e.to_string(),
                        Err(_) => "stopping it panicked".to_string(),
                    };
                    dir.exists().then(|| Left {
                        dir: dir.clone(),
                        why,
                    })
                })
                .collect()
        });
        // Clusters a scenario was already stopping when the interrupt came (its pgbench was
        // interrupted too, say): their owner finishes the job.
        loop {
            let closing = self.lock().closing.clone();
            if closing.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                left.extend(closing.into_iter().map(|dir| Left {
                    dir,
                    why: format!("still being stopped after {} s", limit.as_secs()),
                }));
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        left
    }
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
}
