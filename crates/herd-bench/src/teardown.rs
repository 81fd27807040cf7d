//! Stopping one scratch cluster and removing its directory, by its owner or after an
//! interrupt.

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::run_limited;
use crate::BenchError;

/// Stops the cluster in the scratch directory `dir` with `herd down --data-dir DIR/data`
/// (killed at `deadline`), then removes `dir` unless a process still names its data directory
/// (removing the files under running servers would leave them with no `herd down` to stop
/// them). `herd down` refuses while the supervisor is still starting, so that is waited out
/// first (also bounded by `deadline`). An error says what went wrong; the directory is gone
/// whenever no process was left using it.
pub(crate) fn stop(herd: &Path, dir: &Path, deadline: Instant) -> Result<(), BenchError> {
    let data = dir.join("data");
    let mut down = Ok(());
    if data.exists() {
        let layout = herd_cluster::Layout::new(&data);
        while starting(&layout) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
        let secs = deadline
            .saturating_duration_since(Instant::now())
            .as_secs()
            .max(5);
        let mut cmd = Command::new(herd);
        cmd.arg("down").arg("--data-dir").arg(&data);
        // In a process group of its own: a Ctrl-C at the terminal (a second one, or the first
        // while a scenario's own teardown runs) must not kill the command stopping the cluster.
        cmd.process_group(0);
        down = run_limited("herd down", cmd, secs).map(drop);
    }
    let users = processes_naming(&data);
    if !users.is_empty() {
        let still = BenchError::Missing(format!(
            "processes {users:?} still use {}; stop them with `herd down --data-dir {}`, \
             then remove {}",
            data.display(),
            data.display(),
            dir.display()
        ));
        return Err(down.err().unwrap_or(still));
    }
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(BenchError::io("removing", dir, e))
        }
        _ => down,
    }
}

/// Whether the supervisor of `layout` holds its lock but has not published itself yet.
fn starting(layout: &herd_cluster::Layout) -> bool {
    herd_cluster::supervisor_running(layout) && herd_cluster::read_supervisor(layout).is_none()
}

/// The processes whose command line names `path` (a supervisor's `--data-dir`, a postmaster's
/// `-D`, PgBouncer's configuration file below it).
pub(crate) fn processes_naming(path: &Path) -> Vec<u32> {
    let needle = path.as_os_str().as_encoded_bytes();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != std::process::id())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmd| cmd.windows(needle.len()).any(|w| w == needle))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_without_a_cluster_is_just_removed() {
        let dir = crate::cluster::scratch_dir().expect("scratch dir").keep();
        std::fs::write(dir.join("file"), "x").expect("write");
        stop(
            Path::new("/nonexistent/herd"),
            &dir,
            Instant::now() + Duration::from_secs(5),
        )
        .expect("stop");
        assert!(!dir.exists());
        // Gone already: nothing to do, no error.
        stop(Path::new("/nonexistent/herd"), &dir, Instant::now()).expect("stop again");
    }

    #[test]
    fn finds_processes_by_command_line() {
        let dir = crate::cluster::scratch_dir().expect("scratch dir");
        let marker = dir.path().join("marker");
        // The marker is the shell's $0; `; :` keeps the shell from exec-ing sleep in its place.
        let mut child = Command::new("sh")
            .arg("-c")
            .arg("sleep 30; :")
            .arg(&marker)
            .spawn()
            .expect("sh");
        // A vfork-style spawn returns before the kernel has set the new command line up, and
        // the shell's fork for `sleep` names the marker too until it has exec'd: wait for the
        // shell alone.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut found = processes_naming(&marker);
        while found != vec![child.id()] && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            found = processes_naming(&marker);
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(found, vec![child.id()]);
    }
}
