//! Interrupting `herd bench failover --hosts 3 --quick`: its lab (three network namespaces
//! joined by two bridges, an etcd member, a `herd agent` and its PostgreSQL in each, `herd
//! proxy` outside) is nothing the bench's own exit would remove. Ctrl-C (SIGINT to the whole
//! process group) and SIGTERM to the bench alone (the agents and etcd get no signal) must both
//! stop every process of the lab, delete the namespaces and bridges, remove the lab's
//! directories, and exit with 130 / 143 in bounded time.
//! Whatever the bench leaves is removed by the test itself.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::bench_child::{alive, processes_naming, BenchChild};
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

/// Until the lab's cluster is whole and its proxy starts.
const READY_LIMIT: Duration = Duration::from_secs(300);
/// What the bench prints once the namespaces exist.
const ANNOUNCE: &str = "herd bench: lab hosts in ";

/// What the lab is made of, as the test learns it; dropping it removes whatever is left.
struct LabLeft {
    dir: PathBuf,
    namespaces: Vec<String>,
    bridges: Vec<String>,
    /// etcd's data directory (the parent of its members').
    etcd_dir: Option<PathBuf>,
}

impl LabLeft {
    /// From the rest of the announcing line: `DIR (network namespaces NS NS NS)`.
    fn parse(rest: &str) -> LabLeft {
        let (dir, names) = rest
            .split_once(" (network namespaces ")
            .unwrap_or_else(|| panic!("unexpected line {rest:?}"));
        let namespaces: Vec<String> = names
            .trim_end_matches(')')
            .split_whitespace()
            .map(str::to_string)
            .collect();
        // hdNNNNh0 → bridges hdNNNNe (store) and hdNNNNp (database), as the testkit names them.
        let prefix = namespaces[0]
            .rsplit_once('h')
            .map(|(p, _)| p.to_string())
            .expect("namespace name");
        LabLeft {
            dir: PathBuf::from(dir),
            bridges: vec![format!("{prefix}e"), format!("{prefix}p")],
            namespaces,
            etcd_dir: None,
        }
    }

    fn pids_inside(&self) -> Vec<i32> {
        self.namespaces
            .iter()
            .filter_map(|ns| Command::new("ip").args(["netns", "pids", ns]).output().ok())
            .flat_map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect()
    }

    fn dirs(&self) -> Vec<&Path> {
        std::iter::once(self.dir.as_path())
            .chain(self.etcd_dir.as_deref())
            .collect()
    }
}

impl Drop for LabLeft {
    fn drop(&mut self) {
        for _ in 0..50 {
            let mut pids = self.pids_inside();
            pids.extend(self.dirs().iter().flat_map(|d| processes_naming(d)));
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        for bridge in &self.bridges {
            let _ = Command::new("ip").args(["link", "del", bridge]).output();
        }
        for dir in self.dirs() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// etcd's `--data-dir` among the arguments of process `pid`, if it is an etcd member.
fn etcd_data_dir(pid: i32) -> Option<PathBuf> {
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
    let program = Path::new(std::str::from_utf8(args.first()?).ok()?);
    if program.file_name()? != "etcd" {
        return None;
    }
    let k = args.iter().position(|a| *a == b"--data-dir")?;
    Some(PathBuf::from(std::str::from_utf8(args.get(k + 1)?).ok()?))
}

/// The bench and its lab: fields drop in order, so the bench is killed before the lab is
/// removed.
struct Run {
    bench: BenchChild,
    lab: Option<LabLeft>,
}

/// One test, one lab at a time: two labs at once would share the 2 cores of a small machine
/// (the bench's own waits are bounded) and could draw the same subnet for their bridges.
#[test]
fn interrupts_remove_the_three_host_lab() {
    // What a terminal's Ctrl-C does: SIGINT to every process of the foreground group.
    interrupt_the_lab(|bench| killpg(bench, Signal::SIGINT).expect("SIGINT"), 130);
    // Only the bench: the agents, etcd and the proxy get no signal and would outlive it.
    interrupt_the_lab(|bench| kill(bench, Signal::SIGTERM).expect("SIGTERM"), 143);
}

/// Interrupts the bench with `signal` once the lab's cluster is whole, and checks that it exits
/// with `code` leaving nothing of the lab.
fn interrupt_the_lab(signal: impl FnOnce(Pid), code: i32) {
    if !herd_testkit::netns::Lab::available() {
        eprintln!("SKIPPED: `herd bench failover --hosts 3` needs root and `ip netns`");
        return;
    }
    let mut run = Run {
        bench: BenchChild::start(&["failover", "--hosts", "3", "--quick"]),
        lab: None,
    };
    let announced = run.bench.line(ANNOUNCE, READY_LIMIT, &mut |_| {});
    let lab = run.lab.insert(LabLeft::parse(&announced));
    let bench = &mut run.bench;
    let proxy_log = lab.dir.join("proxy.log");
    bench.wait_for("the lab's proxy (a whole cluster)", READY_LIMIT, || {
        proxy_log.exists()
    });
    let inside = lab.pids_inside();
    lab.etcd_dir = inside
        .iter()
        .find_map(|&pid| etcd_data_dir(pid))
        .and_then(|d| d.parent().map(Path::to_path_buf));
    assert!(
        lab.etcd_dir.is_some(),
        "no etcd member among {inside:?}:\n{}",
        bench.stderr()
    );
    let mut started = inside.clone();
    started.extend(processes_naming(&lab.dir));
    // The bridges' names are derived here as the testkit makes them: they must exist now, or
    // the check that they are gone afterwards would prove nothing.
    for bridge in &lab.bridges {
        let shown = Command::new("ip").args(["link", "show", bridge]).output();
        assert!(
            shown.expect("ip").status.success(),
            "no bridge {bridge} in the running lab: the test's names are stale"
        );
    }

    signal(bench.pid());
    let stderr = bench.assert_interrupted(code);
    eprintln!("herd bench said:\n{stderr}");

    let listed = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip");
    let listed = String::from_utf8_lossy(&listed.stdout);
    for ns in &lab.namespaces {
        assert!(
            !listed.split_whitespace().any(|n| n == ns),
            "namespace {ns} is left:\n{stderr}"
        );
    }
    for bridge in &lab.bridges {
        let shown = Command::new("ip").args(["link", "show", bridge]).output();
        assert!(
            !shown.expect("ip").status.success(),
            "bridge {bridge} is left:\n{stderr}"
        );
    }
    let running: Vec<i32> = started.into_iter().filter(|&p| alive(p)).collect();
    assert!(
        running.is_empty(),
        "processes {running:?} still run:\n{stderr}"
    );
    for dir in lab.dirs() {
        let users = processes_naming(dir);
        assert!(
            users.is_empty(),
            "processes {users:?} use {dir:?}:\n{stderr}"
        );
        assert!(!dir.exists(), "{dir:?} is left:\n{stderr}");
    }
}
