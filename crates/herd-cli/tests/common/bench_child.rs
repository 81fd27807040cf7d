//! A running `herd bench …` in its own process group, for the interrupt tests: its stderr
//! lines as they come, bounded waits, and SIGKILL to the whole group when dropped (what it
//! started is the dropping test's to clean up).

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// From the signal to the bench's exit (its teardown is bounded at 90 s).
pub const EXIT_LIMIT: Duration = Duration::from_secs(120);
/// What the bench prints as each scratch cluster starts.
pub const CLUSTER: &str = "herd bench: scratch cluster in ";

/// The scratch clusters a bench announced; dropping it stops and removes whatever is left of
/// them (`herd down`, then any process still naming the directory, such as PgBouncer), so a
/// failing test leaves nothing behind.
#[derive(Default)]
pub struct ScratchClusters(pub Vec<PathBuf>);

impl Drop for ScratchClusters {
    fn drop(&mut self) {
        for dir in self.0.iter().filter(|d| d.exists()) {
            let data = dir.join("data");
            if data.exists() {
                let mut down = Command::new(env!("CARGO_BIN_EXE_herd"));
                down.arg("down").arg("--data-dir").arg(&data);
                let _ = herd_testkit::output_within(&mut down, Duration::from_secs(120));
            }
            for pid in processes_naming(dir) {
                let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The bench process and what it printed.
pub struct BenchChild {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: Arc<Mutex<String>>,
    _out: tempfile::TempDir,
}

impl BenchChild {
    /// Starts `herd bench ARGS --out TMP`.
    pub fn start(args: &[&str]) -> BenchChild {
        let out = herd_testkit::scratch_dir();
        let mut child = Command::new(env!("CARGO_BIN_EXE_herd"))
            .arg("bench")
            .args(args)
            .arg("--out")
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
        BenchChild {
            child,
            lines,
            stderr,
            _out: out,
        }
    }

    /// The bench's pid (also its process group's).
    pub fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("pid"))
    }

    /// Everything it printed on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().expect("stderr").clone()
    }

    /// The rest of the next stderr line starting with `prefix`, within `limit`; every line
    /// before it is passed to `seen`.
    pub fn line(&mut self, prefix: &str, limit: Duration, seen: &mut dyn FnMut(&str)) -> String {
        let deadline = Instant::now() + limit;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.trim().to_string();
                    }
                    seen(&line);
                }
                Err(_) => break,
            }
        }
        panic!("no {prefix:?} line; stderr:\n{}", self.stderr());
    }

    /// Waits for `ready` to hold, failing if the bench exits or `limit` passes first.
    pub fn wait_for(&mut self, what: &str, limit: Duration, ready: impl Fn() -> bool) {
        let deadline = Instant::now() + limit;
        while !ready() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "herd bench exited ({status}) before {what}:\n{}",
                    self.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no {what} after {limit:?}:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The bench's exit status, or a failure after [`EXIT_LIMIT`].
    pub fn wait_exit(&mut self) -> ExitStatus {
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

    /// Checks that it exited with `code` after saying it was interrupted; its stderr.
    pub fn assert_interrupted(&mut self, code: i32) -> String {
        let status = self.wait_exit();
        let stderr = self.stderr();
        assert_eq!(status.code(), Some(code), "{status}:\n{stderr}");
        assert!(stderr.contains("interrupted"), "{stderr}");
        stderr
    }
}

impl Drop for BenchChild {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = killpg(self.pid(), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// The processes whose command line names `path`.
pub fn processes_naming(path: &Path) -> Vec<i32> {
    let needle = path.as_os_str().as_encoded_bytes();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != std::process::id() as i32)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmd| cmd.windows(needle.len()).any(|w| w == needle))
        })
        .collect()
}

/// Whether process `pid` still runs (a zombie does not).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}
