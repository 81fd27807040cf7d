//! Tearing down the lab of `failover --hosts 3` from names alone, the one way both its owners
//! remove it: an interrupt (the benchmark thread still holds the lab's handles) and the
//! handle's `Drop`, whichever claims it first in the run's
//! [`Scratches`](crate::scratches::Scratches). The agents are asked to stop (they stop their
//! PostgreSQL) and waited for together, then every process left inside the hosts or naming the
//! lab's directories is killed, the namespaces and bridges are deleted, and the directories
//! removed.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::teardown::processes_naming;
use crate::TeardownError;

/// How long the agents get to stop their PostgreSQL before everything is killed.
const AGENTS_LIMIT: Duration = Duration::from_secs(20);

/// Every kind of process the lab runs (see [`LabHosts`](super::lab_hosts::LabHosts)), named in
/// the commands that remove it by hand so that a reader knows what they stop.
const PROCESSES: &str = "etcd, herd agent and its PostgreSQL in each host; herd proxy outside them";

/// What an interrupt needs to remove a lab.
#[derive(Clone, Debug)]
pub(crate) struct LabNames {
    /// The hosts' network namespaces.
    pub namespaces: Vec<String>,
    /// The bridges joining them (in the namespace that built the lab).
    pub bridges: Vec<String>,
    /// The scratch directories: the agents' (first), then etcd's once it runs; shared with
    /// the lab's handle, which adds etcd's.
    pub dirs: Arc<Mutex<Vec<PathBuf>>>,
    /// Whether the lab was torn down, held by every step that makes something (the
    /// namespaces, etcd, a host's agent, the proxy): the teardown waits for a step in progress,
    /// then sets it, and a step that finds it set makes nothing (else what it made after the
    /// teardown would be left).
    pub torn_down: Arc<Mutex<bool>>,
}

impl LabNames {
    fn dirs(&self) -> Vec<PathBuf> {
        // Each change is one push: a panicked holder left the list consistent.
        self.dirs.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The shell commands that remove the lab by hand, in the teardown's order: what runs in
    /// the hosts, the namespaces and bridges, then what names the lab's directories (`herd
    /// proxy`, which runs outside the hosts, and anything a deleted namespace hides), then the
    /// directories; a closing comment names the processes they stop.
    pub fn remove_by_hand(&self) -> String {
        let mut steps: Vec<String> = self
            .namespaces
            .iter()
            .map(|ns| format!("kill -9 $(ip netns pids {ns}); ip netns del {ns}"))
            .collect();
        steps.extend(self.bridges.iter().map(|b| format!("ip link del {b}")));
        let dirs: Vec<String> = self
            .dirs()
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        steps.extend(dirs.iter().map(|d| format!("pkill -9 -f {d}")));
        steps.push(format!("rm -rf {}", dirs.join(" ")));
        // A comment, last: the line stays one runnable command list.
        format!("{}  # stops {PROCESSES}", steps.join("; "))
    }
}

/// Stops and removes everything of the lab named by `names` by `deadline`; what is left.
pub(crate) fn tear_down(names: &LabNames, deadline: Instant) -> Result<(), TeardownError> {
    // Held to the end: nothing is made while the lab is removed, nor after.
    let mut torn_down = wait_for_build(names, deadline)?;
    *torn_down = true;
    let dirs = names.dirs();
    let agents_done = deadline.min(Instant::now() + AGENTS_LIMIT);
    // Agents first, gently: SIGTERM makes an agent stop its PostgreSQL and exit.
    let agents = || -> Vec<u32> {
        in_hosts(names)
            .into_iter()
            .filter(|&pid| argv(pid).get(1).is_some_and(|a| a == "agent"))
            .collect()
    };
    signal(&agents(), Signal::SIGTERM);
    while !agents().is_empty() && Instant::now() < agents_done {
        std::thread::sleep(Duration::from_millis(100));
    }
    // Then everything else: etcd, watchdogs, what did not stop, the proxy (outside the hosts,
    // naming the agents' directory). Again until none is left: the benchmark thread may still
    // be starting a host's processes.
    let everything = || -> Vec<u32> {
        let mut pids = in_hosts(names);
        pids.extend(dirs.iter().flat_map(|d| processes_naming(d)));
        pids.sort_unstable();
        pids.dedup();
        pids
    };
    kill_until_none(&everything, deadline);
    let mut problems = Vec::new();
    for ns in &names.namespaces {
        if let Err(e) = ip(&["netns", "del", ns]) {
            problems.push(e);
        }
    }
    for bridge in &names.bridges {
        if let Err(e) = ip(&["link", "del", bridge]) {
            problems.push(e);
        }
    }
    // A process started into a host just before its namespace went is found by its
    // directory only now.
    let naming = || -> Vec<u32> { dirs.iter().flat_map(|d| processes_naming(d)).collect() };
    kill_until_none(&naming, deadline);
    let left = naming();
    if !left.is_empty() {
        problems.push(TeardownError::Running { pids: left });
    }
    // The directories name the lab in what the interrupt reports as left: kept while anything
    // of it (a namespace, a bridge, a process) may remain, so that it is reported with the
    // commands that remove it by hand.
    if problems.is_empty() {
        for dir in &dirs {
            match std::fs::remove_dir_all(dir) {
                Err(source) if source.kind() != std::io::ErrorKind::NotFound => {
                    problems.push(TeardownError::Remove {
                        path: dir.clone(),
                        source,
                    })
                }
                _ => {}
            }
        }
    }
    TeardownError::from_all(problems)
}

/// The lab's gate, once no step is making something (the namespaces take about a second,
/// etcd a few), or an error at `deadline`.
fn wait_for_build(
    names: &LabNames,
    deadline: Instant,
) -> Result<std::sync::MutexGuard<'_, bool>, TeardownError> {
    loop {
        match names.torn_down.try_lock() {
            Ok(guard) => return Ok(guard),
            // A build that panicked is over.
            Err(std::sync::TryLockError::Poisoned(e)) => return Ok(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(std::sync::TryLockError::WouldBlock) => return Err(TeardownError::StillBuilding),
        }
    }
}

/// SIGKILLs what `pids` finds until it finds nothing or `deadline` passes.
fn kill_until_none(pids: &dyn Fn() -> Vec<u32>, deadline: Instant) {
    loop {
        let found = pids();
        if found.is_empty() || Instant::now() >= deadline {
            return;
        }
        signal(&found, Signal::SIGKILL);
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn signal(pids: &[u32], sig: Signal) {
    let me = std::process::id();
    for &pid in pids.iter().filter(|&&p| p != me) {
        if let Ok(pid) = i32::try_from(pid) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
        }
    }
}

/// Every process inside the lab's namespaces (`ip netns pids`; none once they are deleted).
fn in_hosts(names: &LabNames) -> Vec<u32> {
    names
        .namespaces
        .iter()
        .filter_map(|ns| Command::new("ip").args(["netns", "pids", ns]).output().ok())
        .flat_map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// The arguments of process `pid` (empty once it is gone).
fn argv(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            c.split(|&b| b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn ip(args: &[&str]) -> Result<(), TeardownError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|source| TeardownError::IpSpawn {
            args: args.join(" "),
            source,
        })?;
    let err = String::from_utf8_lossy(&out.stderr);
    // Gone already (deleted by a fault of the scenario, or never built): nothing to do.
    if out.status.success() || err.contains("No such file") || err.contains("Cannot find") {
        Ok(())
    } else {
        Err(TeardownError::Ip {
            args: args.join(" "),
            stderr: err.trim().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removing_by_hand_stops_every_kind_of_process_the_lab_runs() {
        let names = LabNames {
            namespaces: vec!["hd1h0".into(), "hd1h1".into()],
            bridges: vec!["hd1e".into(), "hd1p".into()],
            dirs: Arc::new(Mutex::new(vec![
                PathBuf::from("/tmp/lab"),
                PathBuf::from("/tmp/etcd"),
            ])),
            torn_down: Arc::new(Mutex::new(false)),
        };
        let text = names.remove_by_hand();
        let (commands, comment) = text.split_once('#').expect("a closing comment");
        for kind in ["etcd", "herd agent", "PostgreSQL", "herd proxy"] {
            assert!(comment.contains(kind), "{kind} not named: {text}");
        }
        // herd proxy runs outside the hosts: only its directory finds it.
        let steps: Vec<&str> = commands.split(';').map(str::trim).collect();
        let at = |step: &str| {
            steps
                .iter()
                .position(|s| *s == step)
                .unwrap_or_else(|| panic!("no `{step}` in {text}"))
        };
        assert!(at("ip netns del hd1h1") < at("pkill -9 -f /tmp/lab"));
        assert!(at("ip link del hd1p") < at("pkill -9 -f /tmp/etcd"));
        assert!(at("pkill -9 -f /tmp/etcd") < at("rm -rf /tmp/lab /tmp/etcd"));
        assert_eq!(at("rm -rf /tmp/lab /tmp/etcd"), steps.len() - 1);
    }

    /// Processes the test started, killed and reaped however it ends, and its namespace.
    struct Started(Vec<std::process::Child>, String);

    impl Drop for Started {
        fn drop(&mut self) {
            for c in &mut self.0 {
                let _ = c.kill();
                let _ = c.wait();
            }
            let _ = Command::new("ip").args(["netns", "del", &self.1]).output();
        }
    }

    #[test]
    fn stops_the_agents_together_then_kills_the_rest() {
        if !herd_testkit::netns::Lab::available() {
            eprintln!("SKIPPED: network namespaces need root and `ip netns`");
            return;
        }
        let ns = format!("hdtest{}g", std::process::id() % 10_000);
        let lab = crate::cluster::scratch_dir().expect("scratch dir").keep();
        let work = crate::cluster::scratch_dir().expect("scratch dir");
        let mut started = Started(Vec::new(), ns.clone());
        let added = Command::new("ip").args(["netns", "add", &ns]).status();
        assert!(added.expect("ip").success(), "ip netns add {ns}");
        // `sh agent` has "agent" as its argv[1], as `herd agent` has: it takes 2 s to stop
        // once asked, so three stopped one by one would take 6 s.
        let script = "trap 'sleep 2; echo >> stopped; exit 0' TERM; echo >> ready; \
                      while :; do sleep 0.1; done";
        std::fs::write(work.path().join("agent"), script).expect("agent script");
        let in_host = |program: &str, arg: &str| {
            Command::new("ip")
                .args(["netns", "exec", &ns, program, arg])
                .current_dir(work.path())
                .spawn()
                .expect("ip netns exec")
        };
        for _ in 0..3 {
            started.0.push(in_host("sh", "agent"));
        }
        started.0.push(in_host("sleep", "60"));
        // Outside the host, naming the lab's directory, as herd proxy does (`; :` keeps the
        // shell from exec-ing sleep in its place, so the marker stays its $0).
        let proxy = Command::new("sh")
            .args(["-c", "sleep 60; :"])
            .arg(lab.join("proxy"))
            .spawn()
            .expect("sh");
        started.0.push(proxy);
        let lines =
            |f: &str| std::fs::read_to_string(work.path().join(f)).map_or(0, |t| t.lines().count());
        let ready = Instant::now() + Duration::from_secs(10);
        while (lines("ready") < 3 || processes_naming(&lab).is_empty()) && Instant::now() < ready {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(lines("ready"), 3, "the agents did not start");
        let names = LabNames {
            namespaces: vec![ns.clone()],
            bridges: Vec::new(),
            dirs: Arc::new(Mutex::new(vec![lab.clone()])),
            torn_down: Arc::new(Mutex::new(false)),
        };
        let begun = Instant::now();
        tear_down(&names, begun + Duration::from_secs(30)).expect("tear down");
        let took = begun.elapsed();
        assert_eq!(lines("stopped"), 3, "every agent was asked to stop");
        assert!(took < Duration::from_secs(5), "waited one by one: {took:?}");
        for c in &mut started.0 {
            let exited = c.try_wait().expect("try_wait");
            assert!(exited.is_some(), "process {} still runs", c.id());
        }
        let listed = Command::new("ip").args(["netns", "list"]).output();
        let listed = String::from_utf8_lossy(&listed.expect("ip").stdout).to_string();
        assert!(!listed.split_whitespace().any(|n| n == ns), "{listed}");
        assert!(!lab.exists());
    }

    #[test]
    fn waits_for_the_build_then_removes_what_is_named() {
        if !herd_testkit::netns::Lab::available() {
            eprintln!("SKIPPED: removing network namespaces needs root and `ip netns`");
            return;
        }
        let dir = crate::cluster::scratch_dir().expect("scratch dir").keep();
        let names = LabNames {
            // Never built: deleting them is no error.
            namespaces: vec!["hdtesth0".into()],
            bridges: vec!["hdteste".into()],
            dirs: Arc::new(Mutex::new(vec![dir.clone()])),
            torn_down: Arc::new(Mutex::new(false)),
        };
        let started = Instant::now();
        let building = Arc::clone(&names.torn_down);
        let (held, hold) = std::sync::mpsc::channel();
        let builder = std::thread::spawn(move || {
            let _build = building.lock().expect("build lock");
            held.send(()).expect("send");
            std::thread::sleep(Duration::from_millis(500));
        });
        hold.recv_timeout(Duration::from_secs(5))
            .expect("build started");
        tear_down(&names, Instant::now() + Duration::from_secs(20)).expect("tear down");
        assert!(started.elapsed() >= Duration::from_millis(500));
        assert!(!dir.exists());
        builder.join().expect("builder");
        assert!(names.remove_by_hand().contains("ip netns del hdtesth0"));
        // A step that comes after the teardown finds it done and makes nothing.
        assert!(*names.torn_down.lock().expect("gate"));
    }
}
