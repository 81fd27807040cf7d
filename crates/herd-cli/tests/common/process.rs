//! Outside programs (driver scripts, psql) run with a deadline.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd` with a deadline; returns (success, stdout + stderr).
pub fn run_bounded(mut cmd: Command, timeout: Duration) -> (bool, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + timeout;
    let (ok, note) = loop {
        match child.try_wait().expect("waiting for the driver script") {
            Some(status) => break (status.success(), format!("{status}")),
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break (false, format!("killed after {timeout:?}"));
            }
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let out = out_reader.join().unwrap_or_default();
    let err = err_reader.join().unwrap_or_default();
    (ok, format!("{note}\n--- stdout\n{out}\n--- stderr\n{err}"))
}

/// Fails (never skips) when a prerequisite is missing.
pub fn require(ok: bool, what: &str) {
    assert!(
        ok,
        "{what} is not installed: run `scripts/install-deps` (the driver tests fail rather than skip)"
    );
}

/// How long one driver's check script may run.
pub const SCRIPT_TIMEOUT: Duration = Duration::from_secs(100);

/// `tests/drivers` of the repository.
pub fn drivers_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/drivers")
}

/// Runs psycopg 3's checks (`tests/drivers/psycopg_check.py`) through the endpoint at `url`,
/// verifying on the primary at `primary`; returns (success, output).
pub fn psycopg_checks(url: &str, primary: &str) -> (bool, String) {
    let probe = Command::new("python3")
        .args(["-c", "import psycopg; print(psycopg.__version__)"])
        .output();
    require(
        probe.as_ref().is_ok_and(|o| o.status.success()),
        "python3 with psycopg 3 (`import psycopg`)",
    );
    let mut cmd = Command::new("python3");
    cmd.arg(drivers_dir().join("psycopg_check.py"))
        .arg(url)
        .arg(primary)
        .env("PYTHONUNBUFFERED", "1");
    run_bounded(cmd, SCRIPT_TIMEOUT)
}

/// Runs node-postgres's checks (`tests/drivers/node/check.js`); returns (success, output).
pub fn node_checks(url: &str, primary: &str) -> (bool, String) {
    let node_dir = drivers_dir().join("node");
    let probe = Command::new("node").arg("--version").output();
    require(
        probe.as_ref().is_ok_and(|o| o.status.success()),
        "node (Node.js)",
    );
    for module in ["pg", "pg-copy-streams", "pg-cursor"] {
        require(
            node_dir
                .join("node_modules")
                .join(module)
                .join("package.json")
                .exists(),
            &format!("the node module {module} (tests/drivers/node/node_modules)"),
        );
    }
    let mut cmd = Command::new("node");
    cmd.arg(node_dir.join("check.js"))
        .arg(url)
        .arg(primary)
        .current_dir(&node_dir);
    run_bounded(cmd, SCRIPT_TIMEOUT)
}
