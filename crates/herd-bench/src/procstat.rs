//! What a process cost over a run, from `/proc`: CPU time (user + system, all threads, and the
//! user-space part alone),
//! context switches (voluntary + involuntary, all threads: a thread that sleeps in
//! `epoll_wait` and is woken counts one voluntary switch per wake-up) and resident memory.

use std::path::Path;

/// One look at a process.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    /// CPU time so far, seconds.
    pub cpu_s: f64,
    /// Of which in user space (the process's own code; the rest is the kernel working for it:
    /// system calls, the network stack), seconds.
    pub user_s: f64,
    /// Context switches so far, every thread that is still alive.
    pub switches: u64,
    /// Resident set size now, KiB.
    pub rss_kib: u64,
}

/// Samples process `pid`; `None` when it is gone or `/proc` cannot be read.
pub fn sample(pid: u32) -> Option<Sample> {
    let base = Path::new("/proc").join(pid.to_string());
    let stat = std::fs::read_to_string(base.join("stat")).ok()?;
    let ticks = clock_ticks()?;
    let cpu_s = cpu_ticks(&stat)? as f64 / ticks;
    let user_s = stat_field(&stat, 14)? as f64 / ticks;
    let mut switches = 0;
    for task in std::fs::read_dir(base.join("task")).ok()?.flatten() {
        if let Ok(status) = std::fs::read_to_string(task.path().join("status")) {
            switches += status_field(&status, "voluntary_ctxt_switches").unwrap_or(0)
                + status_field(&status, "nonvoluntary_ctxt_switches").unwrap_or(0);
        }
    }
    let status = std::fs::read_to_string(base.join("status")).ok()?;
    let rss_kib = status_field(&status, "VmRSS").unwrap_or(0);
    Some(Sample {
        cpu_s,
        user_s,
        switches,
        rss_kib,
    })
}

/// CPU time (user + system) of this process's children that have ended and been waited for,
/// seconds (`cutime` + `cstime` of `/proc/self/stat`): read before and after a pgbench run
/// that this process waits for, the difference is what that pgbench cost.
pub fn children_cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    Some(children_ticks(&stat)? as f64 / clock_ticks()?)
}

/// CPU time the whole machine has spent busy so far, all cores, seconds (`/proc/stat`'s first
/// line: every column but idle, iowait and steal — time the hypervisor gave to others). Read around a run, the difference is what the
/// run cost everyone on the machine: load generator, proxies and servers alike.
pub fn machine_busy_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    Some(busy_ticks(&stat)? as f64 / clock_ticks()?)
}

/// Busy ticks of `/proc/stat`'s `cpu` line: user, nice, system, irq and softirq (guest time is
/// counted in user already, so the guest columns are left out).
fn busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice]
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    (v.len() >= 4).then(|| at(0) + at(1) + at(2) + at(5) + at(6))
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
fn clock_ticks() -> Option<f64> {
    let n = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    (n > 0).then_some(n as f64)
}

/// utime + stime of a `/proc/<pid>/stat` line (fields 14 and 15).
fn cpu_ticks(stat: &str) -> Option<u64> {
    stat_pair(stat, 14)
}

/// cutime + cstime of a `/proc/<pid>/stat` line (fields 16 and 17).
fn children_ticks(stat: &str) -> Option<u64> {
    stat_pair(stat, 16)
}

/// Fields `field` and `field + 1` of a `/proc/<pid>/stat` line, added.
fn stat_pair(stat: &str, field: usize) -> Option<u64> {
    Some(stat_field(stat, field)? + stat_field(stat, field + 1)?)
}

/// Field `field` (numbered from 1, as in proc(5)) of a `/proc/<pid>/stat` line: counted after
/// the command in parentheses, which may itself hold spaces and parentheses.
fn stat_field(stat: &str, field: usize) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    // `after` starts at field 3 (state).
    after
        .split_whitespace()
        .nth(field.checked_sub(3)?)?
        .parse()
        .ok()
}

/// The number at the start of a `/proc/<pid>/status` field (`VmRSS:  1234 kB`).
fn status_field(status: &str, name: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Every live descendant of `pid`, from the parent pids in `/proc/*/stat`.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(p) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            if let Some(ppid) = parent_of(&stat) {
                parents.push((p, ppid));
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for &(child, _) in parents.iter().filter(|(_, pp)| *pp == p) {
            out.push(child);
            frontier.push(child);
        }
    }
    out
}

/// The parent pid in a `/proc/PID/stat` line (the command, in parentheses, may hold spaces).
fn parent_of(stat: &str) -> Option<u32> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_stat_and_status() {
        let stat = "1234 (my (odd) prog) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 4 0";
        assert_eq!(cpu_ticks(stat), Some(300));
        assert_eq!(stat_field(stat, 14), Some(250), "utime alone");
        assert_eq!(children_ticks(stat), Some(0));
        let waited = "1234 (pg) S 1 2 3 4 5 6 7 8 9 10 250 50 70 30 20 0 4 0";
        assert_eq!(children_ticks(waited), Some(100));
        let status = "Name:\therd\nVmRSS:\t  20480 kB\nvoluntary_ctxt_switches:\t17\n";
        assert_eq!(status_field(status, "VmRSS"), Some(20480));
        assert_eq!(status_field(status, "voluntary_ctxt_switches"), Some(17));
        assert_eq!(status_field(status, "nonvoluntary_ctxt_switches"), None);
        let me = sample(std::process::id()).expect("this process");
        assert!(me.rss_kib > 0 && me.switches > 0, "{me:?}");
        // A child that burns CPU and is waited for shows in the children's time.
        let before = children_cpu_s().expect("own stat");
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"])
            .status()
            .expect("sh runs");
        assert!(status.success());
        let after = children_cpu_s().expect("own stat");
        assert!(after > before, "children's CPU {before} -> {after}");
    }

    #[test]
    fn reads_the_machines_busy_time() {
        let stat = "cpu  100 5 30 1000 40 2 3 7 50 0\ncpu0 50 2 15 500 20 1 1 3 25 0\n";
        // user + nice + system + irq + softirq; idle, iowait, steal and guest left out.
        assert_eq!(busy_ticks(stat), Some(140));
        assert_eq!(busy_ticks("cpu  1 2 3\n"), None);
        assert_eq!(busy_ticks("cpu0 1 2 3 4\n"), None);
        assert_eq!(busy_ticks("cpu  1 x 3 4\n"), None);
        let before = machine_busy_s().expect("/proc/stat");
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(200) {
            std::hint::black_box(0u64);
        }
        let after = machine_busy_s().expect("/proc/stat");
        assert!(after > before, "machine busy {before} -> {after}");
    }

    #[test]
    fn descendants_of_this_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep");
        let found = descendants(std::process::id());
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.contains(&child.id()), "{found:?}");
    }

    #[test]
    fn reads_the_parent() {
        assert_eq!(
            parent_of("123 (postgres: idle (x)) S 45 123 123 0 -1"),
            Some(45)
        );
    }
}
