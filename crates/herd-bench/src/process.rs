//! Child processes with a time limit, and the small files scenarios hand to them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::BenchError;

/// Runs `cmd` with piped output, killing it (by its pid, not yet reaped) after `secs`; its
/// stdout when it succeeds.
pub fn run_limited(what: &str, mut cmd: Command, secs: u64) -> Result<String, BenchError> {
    let spawn = |source| BenchError::Spawn {
        program: what.to_string(),
        source,
    };
    let io = (Stdio::null(), Stdio::piped(), Stdio::piped());
    let child = cmd
        .stdin(io.0)
        .stdout(io.1)
        .stderr(io.2)
        .spawn()
        .map_err(spawn)?;
    let pid = child.id().to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    let Ok(out) = rx.recv_timeout(Duration::from_secs(secs)) else {
        let _ = Command::new("kill").args(["-9", &pid]).status();
        return Err(BenchError::Hang {
            what: what.into(),
            seconds: secs,
            output: String::new(),
        });
    };
    let out = out.map_err(spawn)?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    if out.status.success() {
        return Ok(text(&out.stdout));
    }
    Err(BenchError::Failed {
        what: what.into(),
        status: out.status.to_string(),
        output: text(&out.stderr) + &text(&out.stdout),
    })
}

/// Writes `text` to `dir/name`; the path.
pub fn write_script(dir: &Path, name: &str, text: &str) -> Result<PathBuf, BenchError> {
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|e| BenchError::io("writing", &path, e))?;
    Ok(path)
}
