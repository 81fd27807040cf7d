//! The supervisor's lock and its published pid / API port.

use std::fs::File;
use std::path::PathBuf;

use herd_core::SupervisorInfo;
use nix::fcntl::{Flock, FlockArg};

use crate::{ClusterError, Layout};

/// Held by the one supervisor of a data directory for as long as it runs. Dropping it (or the
/// process dying) releases it.
#[derive(Debug)]
pub struct SupervisorLock {
    _lock: Flock<File>,
    info_path: PathBuf,
}

impl SupervisorLock {
    /// Takes the lock, failing with the holder's pid when another supervisor has it.
    pub fn acquire(layout: &Layout) -> Result<SupervisorLock, ClusterError> {
        let dir = layout.run();
        std::fs::create_dir_all(&dir).map_err(|e| ClusterError::io("creating", &dir, e))?;
        let path = lock_path(layout);
        // `supervisor_running` briefly holds a shared lock; retry a little before concluding.
        for _ in 0..20 {
            let file = File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(|e| ClusterError::io("opening", &path, e))?;
            if let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                return Ok(SupervisorLock {
                    _lock: lock,
                    info_path: dir.join("supervisor.json"),
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        Err(ClusterError::AlreadyRunning {
            pid: read_supervisor(layout).map(|s| s.pid).unwrap_or(0),
            path: layout.root().to_path_buf(),
        })
    }

    /// Publishes the supervisor's pid and API port for `herd status` and `herd down`.
    pub fn publish(&self, info: &SupervisorInfo) -> Result<(), ClusterError> {
        let text = serde_json::to_string(info).unwrap_or_default();
        std::fs::write(&self.info_path, text)
            .map_err(|e| ClusterError::io("writing", &self.info_path, e))
    }
}

impl Drop for SupervisorLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.info_path);
    }
}

fn lock_path(layout: &Layout) -> PathBuf {
    layout.run().join("supervisor.lock")
}

/// Whether a supervisor holds the data directory's lock (alive, ready or not). The lock dies
/// with its process, so unlike a pid check this cannot be fooled by a zombie or a reused pid.
pub fn supervisor_running(layout: &Layout) -> bool {
    let Ok(file) = File::open(lock_path(layout)) else {
        return false;
    };
    // A shared lock is granted only when no exclusive holder exists; it is dropped at once.
    Flock::lock(file, FlockArg::LockSharedNonblock).is_err()
}

/// The running supervisor of `layout` once it is ready (it publishes its pid after every replica
/// streams), or `None`.
pub fn read_supervisor(layout: &Layout) -> Option<SupervisorInfo> {
    let text = std::fs::read_to_string(layout.run().join("supervisor.json")).ok()?;
    let info: SupervisorInfo = serde_json::from_str(&text).ok()?;
    supervisor_running(layout).then_some(info)
}
