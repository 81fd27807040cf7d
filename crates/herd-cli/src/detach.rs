//! `herd up --detach`: start the supervisor in the background and return once it is ready.

use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use herd_cluster::{read_supervisor, Layout};
use herd_config::Config;
use indicatif::{ProgressBar, ProgressStyle};

/// Spawns `herd up` (same arguments, without `--detach`) in its own process group with its
/// output in `logs/herd.log`, follows that log as progress, and returns when the supervisor has
/// published its pid (which it does only once every replica streams).
pub async fn run(layout: &Layout, config: &Config) -> anyhow::Result<()> {
    if herd_cluster::supervisor_running(layout) {
        let pid =
            read_supervisor(layout).map_or("starting".to_string(), |s| format!("pid {}", s.pid));
        bail!(
            "a Herd supervisor ({pid}) already runs for {}; see `herd status`",
            layout.root().display()
        );
    }
    // Fail here, not in the background, on a machine without PostgreSQL.
    herd_pg::PgBinaries::locate(config.postgres.bindir.as_deref())?;
    // herd.toml first: it marks the directory as Herd's for the supervisor about to start.
    crate::up::save_config(layout, config)?;
    std::fs::create_dir_all(layout.logs())
        .with_context(|| format!("creating {}", layout.logs().display()))?;
    let log_path = layout.supervisor_log();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let start_offset = log.metadata().map(|m| m.len()).unwrap_or(0);
    let log_err = log.try_clone().context("duplicating the log file handle")?;
    let exe = std::env::current_exe().context("locating the herd executable")?;
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--detach")
        .collect();
    let mut child = std::process::Command::new(exe)
        .args(&args)
        .env(crate::up::detached_env(), "1")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .process_group(0)
        .spawn()
        .context("starting the background supervisor")?;
    let pid = child.id();

    let bar = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("  {spinner} {msg} ({elapsed})") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(100));
    let deadline = Instant::now() + Duration::from_secs(config.supervisor.ready_timeout_s + 600);
    loop {
        let log_text = new_log_text(&log_path, start_offset);
        if let Some(line) = log_text.lines().rev().find(|l| !l.trim().is_empty()) {
            bar.set_message(line.trim().trim_start_matches(['…', '✓', ' ']).to_string());
        }
        if let Some(status) = child
            .try_wait()
            .context("checking the background supervisor")?
        {
            bar.finish_and_clear();
            bail!(
                "the background supervisor exited ({status}) before the cluster was ready:\n{}",
                log_text.trim_end()
            );
        }
        if read_supervisor(layout).is_some_and(|s| s.pid == pid) {
            bar.finish_and_clear();
            break;
        }
        if Instant::now() >= deadline {
            bar.finish_and_clear();
            bail!(
                "the background supervisor (pid {pid}) is not ready yet; follow {}",
                log_path.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let groups = herd_cluster::open_groups(layout, config)?;
    let status = herd_cluster::observe_groups(&groups)
        .await
        .context("observing the shard groups")?;
    crate::output::emit!("{}", crate::status::summary(&groups[0], &status));
    crate::output::emitln!(
        "Supervisor running in the background (pid {pid}); log: {}",
        log_path.display()
    );
    Ok(())
}

fn new_log_text(path: &std::path::Path, from: u64) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let from = usize::try_from(from).unwrap_or(0).min(bytes.len());
    String::from_utf8_lossy(&bytes[from..]).into_owned()
}
