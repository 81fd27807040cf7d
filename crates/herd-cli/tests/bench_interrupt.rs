//! Interrupting `herd bench proxy --quick`: its scratch cluster runs detached (supervisor and
//! servers outside the bench's process group), so a bench that just died would leave it running
//! and its directory in /tmp. Ctrl-C (SIGINT to the whole process group, as a terminal sends it)
//! and SIGTERM to the bench alone must both stop the cluster and PgBouncer, remove the scratch
//! directory, and exit with 130 / 143 in bounded time. Everything the bench started is stopped by
//! the test itself if the bench fails to.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

/// Until the scratch cluster is up (and PgBouncer runs, for the SIGTERM case).
const READY_LIMIT: Duration = Duration::from_secs(300);
/// From the signal to the bench's exit (its teardown is bounded at 90 s).
const EXIT_LIMIT: Duration = Duration::from_secs(120);
/// What the bench prints as each scratch cluster starts.
const ANNOUNCE: &str = "herd bench: scratch cluster in ";

/// A running `herd bench proxy --quick` in its own process group; dropping it kills the group
/// and stops whatever is left of its cluster, so a failing test leaves nothing behind.
struct Bench {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: Arc<Mutex<String>>,
    dir: Option<PathBuf>,
    _out: tempfile::TempDir,
}

impl Bench {
    fn start() -> Bench {
        let out = herd_testkit::scratch_dir();
        let mut child = Command::new(env!("CARGO_BIN_EXE_herd"))
            .args(["bench", "proxy", "--quick", "--out"])
            .arg(out.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("starting herd bench");
        let (tx, lines) = mpsc::channel();
        let stderr = Arc::new(Mutex::new(String::new()));
        let (pipe, all) = (child.stderr.take().expect("stderr"), Arc::clone(&stderr));
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                all.lock().expect("stderr").push_str(&format!("{line}\n"));
                let _ = tx.send(line);
            }
        });
        Bench {
            child,
            lines,
            stderr,
            dir: None,
            _out: out,
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("pid"))
    }

    fn stderr(&self) -> String {
        self.stderr.lock().expect("stderr").clone()
    }

    /// The scratch directory, from the line the bench prints as the cluster starts.
    fn scratch_dir(&mut self) -> PathBuf {
        let deadline = Instant::now() + READY_LIMIT;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(dir) = line.strip_prefix(ANNOUNCE) {
                        let dir = PathBuf::from(dir.trim());
                        self.dir = Some(dir.clone());
                        return dir;
                    }
                }
                Err(_) => break,
            }
        }
        panic!("no {ANNOUNCE:?} line; stderr:\n{}", self.stderr());
    }

    /// Waits for `ready` to hold, failing if the bench exits or `READY_LIMIT` passes first.
    fn wait_for(&mut self, what: &str, ready: impl Fn() -> bool) {
        let deadline = Instant::now() + READY_LIMIT;
        while !ready() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "herd bench exited ({status}) before {what}:\n{}",
                    self.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no {what} after {READY_LIMIT:?}:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The bench's exit status, or a failure after `EXIT_LIMIT`.
    fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + EXIT_LIMIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for herd bench") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "herd bench still runs {EXIT_LIMIT:?} after the signal:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = killpg(self.pid(), Signal::SIGKILL);
            let _ = self.child.wait();
        }
        let Some(dir) = self.dir.as_ref().filter(|d| d.exists()) else {
            return;
        };
        let data = dir.join("data");
        if data.exists() {
            let mut down = Command::new(env!("CARGO_BIN_EXE_herd"));
            down.arg("down").arg("--data-dir").arg(&data);
            let _ = herd_testkit::output_within(&mut down, Duration::from_secs(120));
        }
        // What `herd down` does not know of (PgBouncer).
        for pid in processes_naming(dir) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The processes whose command line names `path` (the supervisor's --data-dir, a postmaster's
/// -D, PgBouncer's configuration file).
fn processes_naming(path: &Path) -> Vec<i32> {
    let needle = path.as_os_str().as_encoded_bytes();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmd| cmd.windows(needle.len()).any(|w| w == needle))
        })
        .collect()
}

/// Checks that the bench exited with `code` and left neither `dir` nor a process naming it.
fn assert_cleaned_up(bench: &mut Bench, dir: &Path, code: i32) {
    let status = bench.wait_exit();
    let stderr = bench.stderr();
    assert_eq!(status.code(), Some(code), "{status}:\n{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    let left = processes_naming(dir);
    assert!(
        left.is_empty(),
        "processes {left:?} still use {dir:?}:\n{stderr}"
    );
    assert!(!dir.exists(), "{dir:?} is left:\n{stderr}");
}

#[test]
fn ctrl_c_stops_and_removes_the_scratch_cluster() {
    let mut bench = Bench::start();
    let dir = bench.scratch_dir();
    let ready = dir.join("data/run/supervisor.json");
    bench.wait_for("a running cluster", || ready.exists());
    // What a terminal's Ctrl-C does: SIGINT to every process of the foreground group.
    killpg(bench.pid(), Signal::SIGINT).expect("SIGINT");
    assert_cleaned_up(&mut bench, &dir, 130);
}

#[test]
fn sigterm_to_the_bench_alone_stops_the_cluster_and_pgbouncer() {
    let mut bench = Bench::start();
    let dir = bench.scratch_dir();
    let config = dir.join("pgbouncer");
    bench.wait_for(
        "PgBouncer (run scripts/install-deps if it is not installed)",
        || !processes_naming(&config).is_empty(),
    );
    // Only the bench: PgBouncer, its child, gets no signal and would outlive it.
    kill(bench.pid(), Signal::SIGTERM).expect("SIGTERM");
    assert_cleaned_up(&mut bench, &dir, 143);
}
