//! CPU quotas for process trees through Linux control groups, so that several PostgreSQL servers
//! on one machine each get a fixed CPU share, like separate (small) machines.
//!
//! cgroup v2 (`cpu.max`) is used when its `cpu` controller is available, else cgroup v1's `cpu`
//! hierarchy (`cpu.cfs_quota_us` / `cpu.cfs_period_us`). The groups live under
//! `herd-bench-PID` and are removed on drop, after their processes have been moved back to the
//! group this process runs in; they are listed in the run's [`Scratches`] meanwhile, so an
//! interrupted run removes them too (after stopping the processes in them).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::procstat;
use crate::scratches::{Scratches, Stage};
use crate::{BenchError, TeardownError};

/// How long removing one group is retried at most while its last processes exit.
const GROUP_LIMIT: Duration = Duration::from_secs(5);
/// How long the owner's `Drop` may take to remove every group (its processes were stopped
/// before, so the groups are empty or about to be).
const OWNER_LIMIT: Duration = Duration::from_secs(30);
/// The pause between two attempts at removing a group.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Why CPU groups cannot be made here: printed by the scenarios that use them as the reason
/// their nodes are not confined (the run goes on), except an interrupted run, which stops.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A file of `/proc` this needs could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        path: &'static str,
        source: std::io::Error,
    },
    /// Neither cgroup interface offers the `cpu` controller.
    #[error(
        "no cgroup hierarchy with the cpu controller is mounted (neither cgroup v2 with `cpu` \
         in cgroup.controllers nor cgroup v1 `cpu`)"
    )]
    NoCpuController,
    /// `/proc/self/cgroup` names no group of the hierarchy found.
    #[error("cannot find this process's cpu cgroup in /proc/self/cgroup")]
    OwnGroupUnknown,
    /// A group could not be made (a read-only cgroup file system, no permission, …).
    #[error("cannot create {}: {source}", path.display())]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The cpu controller could not be delegated to the groups.
    #[error("cannot enable the cpu controller in {}: {source}", path.display())]
    Enable {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A control file refused its value.
    #[error("cannot write {value} to {}: {source}", path.display())]
    Write {
        value: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The run is being stopped: not a reason to go on unconfined.
    #[error(transparent)]
    Run(#[from] BenchError),
}

/// Which cgroup interface is in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// A set of CPU-limited groups, removed (after moving their processes home) when dropped.
#[derive(Debug)]
pub struct CpuLimits {
    version: Version,
    /// `herd-bench-PID`, the parent of every group made here.
    base: PathBuf,
    /// The group this process runs in: where confined processes go back to.
    home: PathBuf,
    quota_us: u64,
    period_us: u64,
    /// Where the base is registered until dropped.
    scratches: Scratches,
}

impl CpuLimits {
    /// Prepares groups limited to `quota_us` of CPU time per `period_us` each; the reason when
    /// this machine does not allow it (no cpu controller, read-only cgroup file system, …).
    /// Listed in `scratches` until dropped.
    pub fn new(
        quota_us: u64,
        period_us: u64,
        scratches: &Scratches,
    ) -> Result<CpuLimits, CgroupError> {
        let read = |path: &'static str| {
            std::fs::read_to_string(path).map_err(|source| CgroupError::Read { path, source })
        };
        let mounts = read("/proc/mounts")?;
        let own = read("/proc/self/cgroup")?;
        let (version, mount) = find_cpu_hierarchy(&mounts).ok_or(CgroupError::NoCpuController)?;
        let own_path = own_group(&own, version).ok_or(CgroupError::OwnGroupUnknown)?;
        let home = mount.join(own_path.trim_start_matches('/'));
        // v2 forbids processes in a group whose controllers are delegated to children ("no
        // internal processes"), so the base hangs off the hierarchy's root there; v1 nests it
        // under this process's own group.
        let parent = match version {
            Version::V1 => home.clone(),
            Version::V2 => mount.clone(),
        };
        let base = parent.join(format!("herd-bench-{}", std::process::id()));
        std::fs::create_dir(&base).map_err(|source| CgroupError::Create {
            path: base.clone(),
            source,
        })?;
        let stop = {
            let (base, home) = (base.clone(), home.clone());
            Box::new(move |deadline: Instant| remove_groups(&base, &home, deadline))
        };
        let remove = format!(
            "for g in {0}/*/; do for p in $(cat $g/cgroup.procs); do echo $p > {1}; done; \
             rmdir $g; done; rmdir {0}",
            base.display(),
            home.join("cgroup.procs").display()
        );
        if let Err(e) = scratches.add_extra(&base, Stage::Last, remove, stop) {
            let _ = std::fs::remove_dir(&base);
            return Err(e.into());
        }
        // From here on, dropping `limits` removes the base.
        let limits = CpuLimits {
            version,
            base,
            home,
            quota_us,
            period_us,
            scratches: scratches.clone(),
        };
        // Where to look if something is left behind; tests read this line to find the groups.
        scratches.say(&format!(
            "herd bench: CPU groups in {}",
            limits.base.display()
        ));
        if version == Version::V2 {
            for dir in [&parent, &limits.base] {
                let control = dir.join("cgroup.subtree_control");
                let enabled = std::fs::read_to_string(&control).unwrap_or_default();
                if !enabled.split_whitespace().any(|c| c == "cpu") {
                    std::fs::write(&control, "+cpu").map_err(|source| CgroupError::Enable {
                        path: control,
                        source,
                    })?;
                }
            }
        }
        // The base weighs like ~250 ordinary processes (the maximum weight), so that on a busy
        // machine the groups get their quotas: a group competes as one entity with the
        // processes beside it, and at the default weight a load of 20 would starve it.
        let (file, weight) = match version {
            Version::V1 => ("cpu.shares", "262144"),
            Version::V2 => ("cpu.weight", "10000"),
        };
        let path = limits.base.join(file);
        std::fs::write(&path, weight).map_err(|source| CgroupError::Write {
            value: weight,
            path,
            source,
        })?;
        Ok(limits)
    }

    /// What the limits are, for reports: interface, quota and period.
    pub fn describe(&self) -> String {
        let cpus = self.cpus();
        match self.version {
            Version::V1 => format!(
                "cgroup v1 cpu controller: cpu.cfs_quota_us = {} per cpu.cfs_period_us = {} \
                 ({cpus:.2} CPU) per node",
                self.quota_us, self.period_us
            ),
            Version::V2 => format!(
                "cgroup v2: cpu.max = \"{} {}\" ({cpus:.2} CPU) per node",
                self.quota_us, self.period_us
            ),
        }
    }

    /// CPUs each group may use.
    pub fn cpus(&self) -> f64 {
        self.quota_us as f64 / self.period_us as f64
    }

    /// Creates the group `name` with the quota and moves `pid` and all its descendants into it
    /// (processes forked later inherit it); how many processes were moved.
    pub fn confine(&mut self, name: &str, pid: u32) -> Result<usize, BenchError> {
        let procs = self.group(name, self.quota_us, 1)?;
        // The parent first: children it forks from now on start in the group; then every
        // descendant that already exists (twice, for any forked while the first pass ran).
        write(&procs, &pid.to_string())?;
        let mut moved = std::collections::BTreeSet::from([pid]);
        for _ in 0..2 {
            for child in procstat::descendants(pid) {
                // A backend may exit between the scan and the move: not an error.
                if moved.insert(child) {
                    let _ = std::fs::write(&procs, child.to_string());
                }
            }
        }
        Ok(moved.len())
    }

    /// Creates the group `name`, limited to `quota_us` per period and weighted like 8 node
    /// groups, and moves exactly `pids` into it (not their descendants): for the processes
    /// that play the client and load-balancer machines.
    pub fn front(&mut self, name: &str, pids: &[u32], quota_us: u64) -> Result<(), BenchError> {
        let procs = self.group(name, quota_us, 8)?;
        pids.iter()
            .try_for_each(|pid| write(&procs, &pid.to_string()))
    }

    /// Creates group `name` with `quota_us` per period and `weight` times the default weight;
    /// its `cgroup.procs`.
    fn group(&mut self, name: &str, quota_us: u64, weight: u64) -> Result<PathBuf, BenchError> {
        let group = self.base.join(name);
        std::fs::create_dir(&group).map_err(|e| BenchError::io("creating", &group, e))?;
        match self.version {
            Version::V1 => {
                write(
                    &group.join("cpu.cfs_period_us"),
                    &self.period_us.to_string(),
                )?;
                write(&group.join("cpu.cfs_quota_us"), &quota_us.to_string())?;
                write(&group.join("cpu.shares"), &(1024 * weight).to_string())?;
            }
            Version::V2 => {
                write(
                    &group.join("cpu.max"),
                    &format!("{quota_us} {}", self.period_us),
                )?;
                write(&group.join("cpu.weight"), &(100 * weight).to_string())?;
            }
        }
        Ok(group.join("cgroup.procs"))
    }

    /// `(periods, throttled periods)` of group `name` so far, from its `cpu.stat`.
    pub fn throttling(&self, name: &str) -> Option<(u64, u64)> {
        let stat = std::fs::read_to_string(self.base.join(name).join("cpu.stat")).ok()?;
        let get = |key: &str| {
            stat.lines()
                .filter_map(|l| l.split_once(' '))
                .find(|(k, _)| *k == key)
                .and_then(|(_, v)| v.trim().parse::<u64>().ok())
        };
        Some((get("nr_periods")?, get("nr_throttled")?))
    }
}

impl Drop for CpuLimits {
    fn drop(&mut self) {
        // Not ours to remove when an interrupt already took the groups over.
        if !self.scratches.claim(&self.base) {
            return;
        }
        if let Err(e) = remove_groups(&self.base, &self.home, Instant::now() + OWNER_LIMIT) {
            self.scratches.say(&format!("herd bench: {e}"));
        }
        self.scratches.release(&self.base);
    }
}

/// Moves what is left in each group under `base` to `home`, removes the groups, then `base`;
/// what could not be removed. By the owner on drop and by an interrupt once every process is
/// stopped. Each group is retried for at most [`GROUP_LIMIT`] and none past `deadline` (an
/// interrupt's whole teardown is bounded; still, each group is tried once, since that costs
/// nothing and a group already empty goes).
fn remove_groups(base: &Path, home: &Path, deadline: Instant) -> Result<(), TeardownError> {
    let home = home.join("cgroup.procs");
    let groups: Vec<PathBuf> = std::fs::read_dir(base)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    for group in &groups {
        // A group can only be removed once empty: send what is left home, retrying briefly
        // for processes that are just exiting.
        let until = deadline.min(Instant::now() + GROUP_LIMIT);
        retry_until(until, RETRY_PAUSE, || {
            let procs = std::fs::read_to_string(group.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.split_whitespace() {
                let _ = std::fs::write(&home, pid);
            }
            std::fs::remove_dir(group).is_ok() || !group.exists()
        });
    }
    match std::fs::remove_dir(base) {
        Err(source) if source.kind() != std::io::ErrorKind::NotFound => {
            Err(TeardownError::CpuGroups {
                base: base.to_path_buf(),
                home,
                source,
            })
        }
        _ => Ok(()),
    }
}

/// Runs `attempt` every `pause` until it succeeds or `deadline` passes (the last pause cut
/// short so as not to sleep past it); whether it succeeded. Always attempts once, even past the
/// deadline.
fn retry_until(deadline: Instant, pause: Duration, mut attempt: impl FnMut() -> bool) -> bool {
    loop {
        if attempt() {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        std::thread::sleep(pause.min(left));
    }
}

/// Writes `text` to a cgroup control file.
fn write(path: &Path, text: &str) -> Result<(), BenchError> {
    std::fs::write(path, text).map_err(|e| BenchError::io("writing", path, e))
}

/// The mounted hierarchy that has the cpu controller: cgroup v2 when its root lists `cpu` in
/// `cgroup.controllers`, else cgroup v1's `cpu` hierarchy.
fn find_cpu_hierarchy(mounts: &str) -> Option<(Version, PathBuf)> {
    let entries: Vec<(&str, &str, &str)> = mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((*f.get(1)?, *f.get(2)?, *f.get(3)?))
        })
        .collect();
    let v2 = entries.iter().find(|(dir, fs, _)| {
        *fs == "cgroup2"
            && std::fs::read_to_string(Path::new(dir).join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|x| x == "cpu"))
    });
    if let Some((dir, _, _)) = v2 {
        return Some((Version::V2, PathBuf::from(dir)));
    }
    entries
        .iter()
        .find(|(_, fs, opts)| *fs == "cgroup" && opts.split(',').any(|o| o == "cpu"))
        .map(|(dir, _, _)| (Version::V1, PathBuf::from(dir)))
}

/// This process's group in `version`'s hierarchy, from `/proc/self/cgroup`
/// (`ID:controllers:/path` lines; v2's has empty controllers).
fn own_group(proc_cgroup: &str, version: Version) -> Option<String> {
    proc_cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        let wanted = match version {
            Version::V2 => controllers.is_empty(),
            Version::V1 => controllers.split(',').any(|c| c == "cpu"),
        };
        wanted.then(|| path.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        let own = "2:cpuacct:/\n1:cpu,cpuacct:/a/b\n0::/user.slice\n";
        assert_eq!(own_group(own, Version::V1).as_deref(), Some("/a/b"));
        assert_eq!(own_group(own, Version::V2).as_deref(), Some("/user.slice"));
        let mounts = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n\
                      cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0\n\
                      cgroup /sys/fs/cgroup/cpuset cgroup rw,cpuset 0 0\n";
        assert_eq!(
            find_cpu_hierarchy(mounts),
            Some((Version::V1, PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")))
        );
        assert_eq!(find_cpu_hierarchy("proc /proc proc rw 0 0\n"), None);
    }

    #[test]
    fn retries_stop_at_the_deadline() {
        let mut tries = 0;
        let started = Instant::now();
        let done = retry_until(started + Duration::from_millis(300), RETRY_PAUSE, || {
            tries += 1;
            false
        });
        assert!(!done);
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert!(took < Duration::from_secs(2), "{took:?}");
        assert!(tries >= 2, "{tries}");
        // Past the deadline: one attempt, no pause.
        let mut tries = 0;
        let started = Instant::now();
        assert!(!retry_until(started, Duration::from_secs(10), || {
            tries += 1;
            false
        }));
        assert_eq!(tries, 1);
        assert!(started.elapsed() < Duration::from_secs(1));
        let mut tries = 0;
        let later = Instant::now() + Duration::from_secs(10);
        assert!(retry_until(later, Duration::from_millis(1), || {
            tries += 1;
            tries == 3
        }));
    }

    #[test]
    fn removing_groups_respects_the_deadline() {
        // A plain directory as a group that never empties (rmdir fails on the file in it).
        let base = crate::cluster::scratch_dir().expect("scratch dir");
        let home = crate::cluster::scratch_dir().expect("scratch dir");
        let group = base.path().join("node0");
        std::fs::create_dir(&group).expect("group");
        std::fs::write(group.join("cgroup.procs"), "").expect("procs");
        let started = Instant::now();
        let e = remove_groups(
            base.path(),
            home.path(),
            started + Duration::from_millis(300),
        )
        .expect_err("a group that does not empty is left");
        let took = started.elapsed();
        assert!(
            took < GROUP_LIMIT,
            "{took:?}: the deadline was not respected"
        );
        assert!(matches!(e, TeardownError::CpuGroups { .. }), "{e}");
        assert!(e.to_string().contains("rmdir"), "{e}");
    }
}
