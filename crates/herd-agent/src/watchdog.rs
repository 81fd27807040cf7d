//! Fencing that does not depend on the agent being able to run: the agent writes the instant
//! (host monotonic clock) by which its primary must have stopped accepting writes; a separate
//! watchdog process kills the server at that instant unless the agent has pushed it later.
//! A frozen agent (SIGSTOP, a stalled disk, a long pause) thus still fences in time, like
//! Patroni's use of the kernel watchdog, without needing /dev/watchdog.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Milliseconds on CLOCK_MONOTONIC, which every process of a host shares.
fn monotonic_ms() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| {
            u64::try_from(t.tv_sec()).unwrap_or(0) * 1000
                + u64::try_from(t.tv_nsec()).unwrap_or(0) / 1_000_000
        })
        .unwrap_or(0)
}

/// The agent's side: arms and disarms the deadline.
#[derive(Clone, Debug)]
pub struct Deadline {
    path: PathBuf,
}

impl Deadline {
    /// The deadline kept in `path`.
    pub fn new(path: PathBuf) -> Self {
        Deadline { path }
    }

    /// The server must be fenced at `at` unless armed again later.
    pub fn arm(&self, at: Instant) -> std::io::Result<()> {
        let left = at.saturating_duration_since(Instant::now());
        let when = monotonic_ms() + u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
        self.write(&format!("{when} {}\n", std::process::id()))
    }

    /// Takes over the file from an earlier agent process: its deadline stands (the server it
    /// left running may hold writes only as long as that agent's lease), now answered for by
    /// this process and its watchdog; the earlier watchdog exits on seeing another writer.
    pub fn adopt(&self) -> std::io::Result<()> {
        let deadline = read(&self.path).map_or(0, |(d, _)| d);
        self.write(&format!("{deadline} {}\n", std::process::id()))
    }

    /// No deadline: the node is not a primary the agent answers for.
    pub fn disarm(&self) -> std::io::Result<()> {
        self.write(&format!("0 {}\n", std::process::id()))
    }

    fn write(&self, text: &str) -> std::io::Result<()> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // Whole or not at all: the watchdog never reads half a line.
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &self.path)
    }
}

/// The deadline (monotonic ms, 0 when disarmed) and the agent pid that wrote it.
fn read(path: &Path) -> Option<(u64, u32)> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut words = text.split_whitespace();
    Some((words.next()?.parse().ok()?, words.next()?.parse().ok()?))
}

/// The watchdog process: every 50 ms, fences `pgdata` once the armed deadline has passed.
/// Exits when its agent (`agent_pid`) is gone and nothing is armed, or when a newer agent has
/// taken over the file (that agent runs its own watchdog).
pub fn run(path: &Path, pgdata: &Path, agent_pid: u32) {
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let (deadline, writer) = read(path).unwrap_or((0, agent_pid));
        if writer != agent_pid {
            return;
        }
        if deadline != 0 && monotonic_ms() >= deadline {
            eprintln!(
                "herd watchdog: the leader lease was not renewed in time; stopping PostgreSQL in {} (fencing)",
                pgdata.display()
            );
            if let Err(e) = herd_pg::kill_server(pgdata) {
                eprintln!("herd watchdog: fencing failed: {e}");
                continue;
            }
            let _ = Deadline::new(path.to_path_buf()).write(&format!("0 {agent_pid}\n"));
            continue;
        }
        let agent_alive = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(agent_pid).unwrap_or(i32::MAX)),
            None,
        )
        .is_ok();
        if !agent_alive && deadline == 0 {
            return;
        }
    }
}
