//! Interrupting `herd bench read-scaling --quick` once its nodes are confined: the CPU groups
//! it made under the cgroup file system outlive the bench unless removed, and can only be
//! removed once the processes in them are gone or moved out. Ctrl-C (SIGINT to the whole
//! process group) must stop the scratch clusters, then remove the groups, and exit with 130 in
//! bounded time. Whatever the bench leaves is removed by the test itself.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::bench_child::{processes_naming, BenchChild, ScratchClusters, CLUSTER};
use nix::sys::signal::{killpg, Signal};

/// Until the nodes are confined (clusters up, data loaded, warm-up run).
const READY_LIMIT: Duration = Duration::from_secs(600);
/// What the bench prints once it made the base of its CPU groups.
const GROUPS: &str = "herd bench: CPU groups in ";

/// The CPU groups' base, as the test learns it; dropping it removes whatever is left.
#[derive(Default)]
struct Groups(Option<PathBuf>);

impl Drop for Groups {
    fn drop(&mut self) {
        let Some(base) = self.0.as_ref().filter(|b| b.exists()) else {
            return;
        };
        // The groups' parent takes their processes back (v1: the bench's own group; v2: the
        // root), then the empty groups can go.
        let Some(home) = base.parent().map(|p| p.join("cgroup.procs")) else {
            return;
        };
        for group in std::fs::read_dir(base).into_iter().flatten().flatten() {
            let group = group.path();
            if !group.is_dir() {
                continue;
            }
            let procs = std::fs::read_to_string(group.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.split_whitespace() {
                let _ = std::fs::write(&home, pid);
            }
            let _ = std::fs::remove_dir(&group);
        }
        let _ = std::fs::remove_dir(base);
    }
}

/// The bench and what it made: fields drop in order, so the bench is killed first, then its
/// clusters stopped, then the groups (empty by then) removed.
struct Run {
    bench: BenchChild,
    clusters: ScratchClusters,
    groups: Groups,
}

/// Whether this machine lets the bench make CPU groups (root, and a writable cgroup
/// hierarchy with the `cpu` controller, v2 or v1): elsewhere `read-scaling` runs its nodes
/// unconfined and there is nothing of this kind to remove.
fn cpu_groups_possible() -> bool {
    if !nix::unistd::geteuid().is_root() {
        return false;
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts.lines().any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(dir), Some(kind), Some(options)) = (f.get(1), f.get(2), f.get(3)) else {
            return false;
        };
        let writable = options.split(',').any(|o| o == "rw");
        let cpu = match *kind {
            "cgroup2" => std::fs::read_to_string(PathBuf::from(dir).join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|x| x == "cpu")),
            "cgroup" => options.split(',').any(|o| o == "cpu"),
            _ => false,
        };
        writable && cpu
    })
}

#[test]
fn ctrl_c_removes_the_cpu_groups_after_the_clusters() {
    if !cpu_groups_possible() {
        eprintln!("SKIPPED: CPU groups need root and a writable cgroup hierarchy with `cpu`");
        return;
    }
    let mut run = Run {
        bench: BenchChild::start(&["read-scaling", "--quick"]),
        clusters: ScratchClusters::default(),
        groups: Groups::default(),
    };
    let clusters = &mut run.clusters.0;
    let mut seen = |line: &str| {
        if let Some(dir) = line.strip_prefix(CLUSTER) {
            clusters.push(PathBuf::from(dir.trim()));
        }
    };
    let base = PathBuf::from(run.bench.line(GROUPS, READY_LIMIT, &mut seen));
    run.groups.0 = Some(base.clone());
    assert!(!run.clusters.0.is_empty(), "{}", run.bench.stderr());
    // The front group is made last, once every node is confined.
    let front = base.join("front");
    run.bench
        .wait_for("the confined nodes", READY_LIMIT, || front.exists());

    // What a terminal's Ctrl-C does: SIGINT to every process of the foreground group.
    killpg(run.bench.pid(), Signal::SIGINT).expect("SIGINT");
    let stderr = run.bench.assert_interrupted(130);
    eprintln!("herd bench said:\n{stderr}");

    assert!(!base.exists(), "{base:?} is left:\n{stderr}");
    for dir in &run.clusters.0 {
        let users = processes_naming(dir);
        assert!(
            users.is_empty(),
            "processes {users:?} use {dir:?}:\n{stderr}"
        );
        assert!(!dir.exists(), "{dir:?} is left:\n{stderr}");
    }
}
