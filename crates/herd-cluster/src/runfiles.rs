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
        let path = dir.join("supervisor.lock");
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| ClusterError::io("opening", &path, e))?;
        let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|_| {
            ClusterError::AlreadyRunning {
                pid: read_supervisor(layout).map(|s| s.pid).unwrap_or(0),
                path: layout.root().to_path_buf(),
            }
        })?;
        Ok(SupervisorLock { _lock: lock, info_path: dir.join("supervisor.json") })
    }

    /// Publishes the supervisor's pid and API port for `herd status` and `herd down`.
    pub fn publish(&self, info: &SupervisorInfo) -> Result<(), ClusterError> {
        let text = serde_json::to_string(info).unwrap_or_default();
        std::fs::write(&self.info_path, text).map_err(|e| ClusterError::io("writing", &self.info_path, e))
    }
}

impl Drop for SupervisorLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.info_path);
    }
}

/// The running supervisor of `layout`, if its published pid is alive.
pub fn read_supervisor(layout: &Layout) -> Option<SupervisorInfo> {
    let text = std::fs::read_to_string(layout.run().join("supervisor.json")).ok()?;
    let info: SupervisorInfo = serde_json::from_str(&text).ok()?;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(info.pid).ok()?);
    nix::sys::signal::kill(pid, None).is_ok().then_some(info)
}
