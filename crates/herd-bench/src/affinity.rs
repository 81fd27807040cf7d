//! Keeping the load generator apart: the servers and proxies pinned to some of this machine's
//! cores and the bench (so the pgbench it starts) to the others, as if pgbench ran on another
//! machine. On a small machine pgbench shares the cores with what it measures, and where its own
//! cost grows (a thousand connections) the rate it reports falls for that reason alone; apart,
//! only the servers' and the proxies' costs set the rate.

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

use crate::procstat;

/// Why the load generator could not be kept apart. Crate-private: the report prints it as the
/// reason the shapes apart have no figure.
#[derive(Debug, thiserror::Error)]
pub enum AffinityError {
    /// The cores a process may run on could not be read.
    #[error("reading the cores of process {pid}: {source}")]
    Read { pid: u32, source: nix::Error },
    /// Nothing to split.
    #[error("{allowed} core(s) allowed: none to keep apart")]
    TooFew { allowed: usize },
    /// A core number this system's CPU sets cannot hold.
    #[error("core {core}: {source}")]
    Core { core: usize, source: nix::Error },
    /// A process's threads could not be listed (it ended, or `/proc` is not there).
    #[error("reading the threads of process {pid}: {source}")]
    Threads { pid: u32, source: std::io::Error },
    /// The pinning did not take (something else restricts which cores it may use).
    #[error("process {pid} could not be pinned to cores {cores:?}")]
    NotPinned { pid: u32, cores: Vec<usize> },
}

/// The cores this process may run on: the first half (rounded up) for the servers and the
/// proxies, the rest for the load generator; `None` with fewer than two.
pub fn split(allowed: &[usize]) -> Option<(Vec<usize>, Vec<usize>)> {
    if allowed.len() < 2 {
        return None;
    }
    let servers = allowed.len().div_ceil(2);
    Some((allowed[..servers].to_vec(), allowed[servers..].to_vec()))
}

/// The cores this process may run on now.
pub fn allowed() -> Result<Vec<usize>, AffinityError> {
    cores_of(std::process::id())
}

/// The cores process `pid`'s main thread may run on, in ascending order.
fn cores_of(pid: u32) -> Result<Vec<usize>, AffinityError> {
    let set = sched_getaffinity(Pid::from_raw(pid as i32))
        .map_err(|source| AffinityError::Read { pid, source })?;
    Ok((0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect())
}

/// A run with the generator apart: while it lives, the processes it was given (and their
/// descendants, every thread) run on the server cores and this process on the generator cores;
/// dropping it gives everyone every allowed core back.
pub struct Apart {
    roots: Vec<u32>,
    /// Threads of this process that serve rather than generate (the bench's own forwarder).
    serving: Vec<u32>,
    servers: Vec<usize>,
    generator: Vec<usize>,
    all: Vec<usize>,
}

impl Apart {
    /// Pins `roots` (the servers' postmasters, the proxies) and their descendants, and
    /// `serving` (threads of this process that are a proxy measured, such as the forwarder), to
    /// the first half of the allowed cores and the rest of this process to the other half; why
    /// not, when it cannot.
    pub fn new(roots: Vec<u32>, serving: Vec<u32>) -> Result<Apart, AffinityError> {
        let all = allowed()?;
        let (servers, generator) =
            split(&all).ok_or(AffinityError::TooFew { allowed: all.len() })?;
        let apart = Apart {
            roots,
            serving,
            servers,
            generator,
            all,
        };
        apart.pin()?;
        Ok(apart)
    }

    /// Pins again: a proxy or a server may have started processes or threads since (a new
    /// pooled connection's backend inherits its postmaster's cores, but a thread started
    /// before the pinning does not).
    pub fn pin(&self) -> Result<(), AffinityError> {
        for &root in &self.roots {
            pin_tree(root, &self.servers)?;
        }
        pin_threads(std::process::id(), &self.generator)?;
        for &tid in &self.serving {
            pin_thread(tid, &self.servers)?;
        }
        Ok(())
    }

    /// The cores given to the servers and the proxies, and to the load generator.
    pub fn cores(&self) -> (&[usize], &[usize]) {
        (&self.servers, &self.generator)
    }
}

impl Drop for Apart {
    fn drop(&mut self) {
        for &root in &self.roots {
            let _ = pin_tree(root, &self.all);
        }
        let _ = pin_threads(std::process::id(), &self.all);
    }
}

/// Pins `root`, its descendants and all their threads to `cores`. A process that ended meanwhile
/// is skipped; `root` itself must be there.
fn pin_tree(root: u32, cores: &[usize]) -> Result<(), AffinityError> {
    pin_threads(root, cores)?;
    for pid in procstat::descendants(root) {
        let _ = pin_threads(pid, cores);
    }
    Ok(())
}

/// Pins one thread (`tid`, a thread of this process) to `cores`; it must take.
fn pin_thread(tid: u32, cores: &[usize]) -> Result<(), AffinityError> {
    let _ = sched_setaffinity(Pid::from_raw(tid as i32), &cpu_set(cores)?);
    taken(tid, cores)
}

/// Whether thread or process `id` runs on `cores` now: the check after a pinning.
fn taken(id: u32, cores: &[usize]) -> Result<(), AffinityError> {
    if cores_of(id)? == cores {
        Ok(())
    } else {
        Err(AffinityError::NotPinned {
            pid: id,
            cores: cores.to_vec(),
        })
    }
}

/// The CPU set of `cores`.
fn cpu_set(cores: &[usize]) -> Result<CpuSet, AffinityError> {
    let mut set = CpuSet::new();
    for &core in cores {
        set.set(core)
            .map_err(|source| AffinityError::Core { core, source })?;
    }
    Ok(set)
}

/// Pins every thread of `pid` to `cores` (affinity is per thread; a thread started later
/// inherits its creator's).
fn pin_threads(pid: u32, cores: &[usize]) -> Result<(), AffinityError> {
    let set = cpu_set(cores)?;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map_err(|source| AffinityError::Threads { pid, source })?;
    for task in tasks.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok())
        else {
            continue;
        };
        // A thread may end between the listing and here: not an error.
        let _ = sched_setaffinity(Pid::from_raw(tid), &set);
    }
    // The process's main thread must have taken it, or nothing did.
    taken(pid, cores)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_get_the_first_half() {
        assert_eq!(split(&[0]), None);
        assert_eq!(split(&[]), None);
        assert_eq!(split(&[0, 1]), Some((vec![0], vec![1])));
        assert_eq!(split(&[0, 1, 2]), Some((vec![0, 1], vec![2])));
        // A container's allowed set need not start at 0 nor be contiguous.
        assert_eq!(split(&[2, 3, 6, 7]), Some((vec![2, 3], vec![6, 7])));
    }

    #[test]
    fn pins_a_process_tree_and_gives_the_cores_back() {
        let all = allowed().expect("own affinity");
        if all.len() < 2 {
            eprintln!("skipped: {} core(s) allowed here", all.len());
            return;
        }
        let mut parent = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .expect("sh runs");
        // The shell's child must exist before the pinning, to be a descendant it finds.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while procstat::descendants(parent.id()).is_empty() && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let cores_of = |pid: u32| cores_of(pid).expect("affinity");
        let child = procstat::descendants(parent.id())[0];
        // A thread of this process that serves (as the forwarder does), alive until told.
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let serving = std::thread::spawn(move || {
            let _ = tid_tx.send(nix::unistd::gettid().as_raw() as u32);
            let _ = stop_rx.recv();
        });
        let tid = tid_rx.recv().expect("the thread's id");
        {
            let apart = Apart::new(vec![parent.id()], vec![tid]).expect("pinning");
            let (servers, generator) = apart.cores();
            assert_eq!(cores_of(parent.id()), servers);
            assert_eq!(cores_of(child), servers, "the descendant too");
            assert_eq!(cores_of(std::process::id()), generator);
            assert_eq!(
                cores_of(tid),
                servers,
                "the serving thread with the servers"
            );
            // Pinned again (as before every run), the serving thread stays with the servers.
            apart.pin().expect("pinned again");
            assert_eq!(cores_of(tid), servers);
        }
        assert_eq!(cores_of(parent.id()), all, "given back");
        assert_eq!(cores_of(child), all);
        assert_eq!(cores_of(std::process::id()), all);
        assert_eq!(cores_of(tid), all);
        let _ = stop_tx.send(());
        let _ = serving.join();
        let _ = parent.kill();
        let _ = parent.wait();
    }
}
