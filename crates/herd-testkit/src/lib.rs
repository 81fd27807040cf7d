//! Test support for Herd's integration tests: scratch data directories PostgreSQL's OS user can
//! reach, blocks of free ports, a handle on a `herd` cluster that is always taken down (even when
//! the test fails), and waiting with deadlines instead of fixed sleeps.

pub mod agents;
pub mod etcd;
pub mod netns;

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use herd_core::ports::{scratch_port_base, API_PORT_OFFSET};
use std::time::{Duration, Instant};

/// Candidates tried so far in this process; each block is checked free before use.
static NEXT_BLOCK: AtomicU32 = AtomicU32::new(0);

/// Every port handed out in this process. Candidates of different sizes are `step` apart by
/// index, so a block of 10 could cover part of an earlier block of 8 (or its API port) that
/// was free when checked only because its cluster had not bound it yet: two tests of one
/// binary then started PostgreSQL on the same port.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// A base port `p` such that `p..p + span` and `p + 100` (Herd's default API port) are free,
/// all below the kernel's ephemeral range (see [`herd_core::ports`]), and none handed out
/// before in this process.
pub fn free_port_block(span: u16) -> u16 {
    let step = span.max(8);
    for _ in 0..100_000 {
        let index = NEXT_BLOCK.fetch_add(1, Ordering::SeqCst);
        let base = scratch_port_base(std::process::id(), index, step);
        let ports: Vec<u16> = (base..base + span)
            .chain([base + API_PORT_OFFSET])
            .collect();
        let mut taken = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if ports.iter().any(|p| taken.contains(p)) {
            continue;
        }
        if ports
            .iter()
            .all(|&p| TcpListener::bind(("127.0.0.1", p)).is_ok())
        {
            taken.extend(ports);
            return base;
        }
    }
    panic!("no free block of {span} ports in the scratch range")
}

/// A temporary directory that PostgreSQL's unprivileged OS user can enter (mode 0755), removed
/// when dropped.
pub fn scratch_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("herd-test-")
        .tempdir_in("/tmp")
        .expect("creating a temp dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod temp dir");
    dir
}

/// Polls `f` every 100 ms until it returns `Some`, panicking with `what` after `timeout`.
pub fn wait_until<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A `herd` data directory on its own ports. Dropping it runs `herd down` and deletes it.
pub struct TestCluster {
    herd: PathBuf,
    dir: tempfile::TempDir,
    /// The endpoint port; nodes use the ports after it.
    pub port: u16,
}

impl TestCluster {
    /// A fresh data directory (nothing started yet) for the `herd` binary at `herd`.
    pub fn new(herd: &Path) -> TestCluster {
        TestCluster {
            herd: herd.to_path_buf(),
            dir: scratch_dir(),
            port: free_port_block(12),
        }
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The HTTP API's port.
    pub fn api_port(&self) -> u16 {
        self.port + 100
    }

    /// Runs `herd <args> --data-dir <dir>` and returns its output, whatever the exit status.
    pub fn herd(&self, args: &[&str]) -> Output {
        self.herd_with_env(args, &[])
    }

    /// As [`TestCluster::herd`], with extra environment variables.
    pub fn herd_with_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(&self.herd);
        cmd.args(args).arg("--data-dir").arg(self.data_dir());
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().expect("running herd")
    }

    /// Runs `herd <args>` and panics with its output unless it succeeds; returns stdout.
    pub fn herd_ok(&self, args: &[&str]) -> String {
        let out = self.herd(args);
        assert!(
            out.status.success(),
            "herd {args:?} failed: {}\n{}",
            describe(&out),
            self.log_tails()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The last lines of every log in the data directory, for failure messages.
    pub fn log_tails(&self) -> String {
        let mut out = String::new();
        let Ok(entries) = std::fs::read_dir(self.data_dir().join("logs")) else {
            return out;
        };
        for entry in entries.flatten() {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!(
                "--- {}\n{}\n",
                entry.path().display(),
                lines[lines.len().saturating_sub(15)..].join("\n")
            ));
        }
        out
    }

    /// `herd up --detach` on this cluster's ports with `extra` flags.
    pub fn up(&self, extra: &[&str]) -> String {
        let port = self.port.to_string();
        let mut args = vec!["up", "--detach", "--port", &port];
        args.extend_from_slice(extra);
        self.herd_ok(&args)
    }

    /// `herd status --json`, parsed.
    pub fn status(&self) -> serde_json::Value {
        serde_json::from_str(&self.herd_ok(&["status", "--json"])).expect("status JSON")
    }

    /// `herd status --json`, parsed, or `None` while there is no cluster to report on yet.
    pub fn try_status(&self) -> Option<serde_json::Value> {
        let out = self.herd(&["status", "--json"]);
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).ok())
            .flatten()
    }

    /// `herd url` with `args` (e.g. `--replica 1`).
    pub fn url(&self, args: &[&str]) -> String {
        let mut all = vec!["url"];
        all.extend_from_slice(args);
        self.herd_ok(&all).trim().to_string()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The test failed: its cluster's logs explain more than the assertion alone.
            eprintln!("logs of the failed test's cluster:\n{}", self.log_tails());
        }
        if self.data_dir().join("state.json").exists() {
            let out = self.herd(&["down"]);
            if !out.status.success() {
                eprintln!("cleanup: herd down failed: {}", describe(&out));
            }
        }
    }
}

/// Exit status, stdout and stderr of a finished command, for assertion messages.
pub fn describe(out: &Output) -> String {
    format!(
        "{}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// What `herd bench SCENARIO --quick` left behind.
pub struct QuickBench {
    /// The output directory (removed when dropped).
    pub out: tempfile::TempDir,
    /// results.json, parsed.
    pub results: serde_json::Value,
    /// results.json as written (for failure messages).
    pub text: String,
}

/// How long a quick benchmark may run before its test fails (they take 1–2 minutes here).
pub const QUICK_BENCH_LIMIT: Duration = Duration::from_secs(900);

/// Runs `cmd` to completion like `Command::output`, but kills it (and gives `None`) once
/// `limit` has passed, so a hung child cannot stall the test suite.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Option<Output> {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting a child process");
    // Drained on threads so a chatty child cannot block on a full pipe.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    status.map(|status| Output {
        status,
        stdout,
        stderr,
    })
}

/// Runs `herd bench SCENARIO --quick --out DIR` with the `herd` binary at `herd`, and checks what
/// every scenario must leave: a successful exit, a non-empty `report.md` and `SCENARIO.svg`, and
/// a results.json naming the scenario as a quick run. A failure shows the command's output and
/// the end of every `*.log` the scenario wrote.
pub fn quick_bench(herd: &str, scenario: &str) -> QuickBench {
    quick_bench_with(herd, scenario, &[], scenario)
}

/// As [`quick_bench`], with `extra` arguments; `reported` is the scenario name the results
/// and the chart carry (e.g. `failover-hosts` for `failover --hosts 3`).
pub fn quick_bench_with(herd: &str, scenario: &str, extra: &[&str], reported: &str) -> QuickBench {
    let out = scratch_dir();
    let run = output_within(
        Command::new(herd)
            .args(["bench", scenario, "--quick"])
            .args(extra)
            .arg("--out")
            .arg(out.path()),
        QUICK_BENCH_LIMIT,
    )
    .unwrap_or_else(|| {
        panic!(
            "herd bench {scenario} --quick did not finish within {} s (killed)",
            QUICK_BENCH_LIMIT.as_secs()
        )
    });
    if !run.status.success() {
        let mut logs = String::new();
        for entry in std::fs::read_dir(out.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "log") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                logs += &format!(
                    "\n--- {}:\n{}",
                    path.display(),
                    lines[lines.len().saturating_sub(30)..].join("\n")
                );
            }
        }
        panic!(
            "herd bench {scenario} --quick failed: {}{logs}",
            describe(&run)
        );
    }
    for file in ["report.md".to_string(), format!("{reported}.svg")] {
        let meta = std::fs::metadata(out.path().join(&file)).expect("report file");
        assert!(meta.len() > 0, "{file} is empty");
    }
    let text = std::fs::read_to_string(out.path().join("results.json")).expect("results.json");
    let results: serde_json::Value = serde_json::from_str(&text).expect("results.json is JSON");
    assert_eq!(results["scenario"], reported, "{text}");
    assert_eq!(results["quick"], true, "{text}");
    QuickBench { out, results, text }
}
