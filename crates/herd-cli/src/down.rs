//! `herd down`: stop the supervisor, which stops the servers; or the servers alone when no
//! supervisor runs.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use herd_cluster::{read_supervisor, supervisor_running, Layout};
use herd_pg::{OsUser, Pg, PgBinaries};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::progress::TermProgress;

pub async fn run(layout: &Layout) -> anyhow::Result<()> {
    let groups = crate::status::open_all(layout)?;
    let cluster = &groups[0];
    if supervisor_running(layout) && read_supervisor(layout).is_none() {
        bail!(
            "the Herd supervisor of {} is still starting; try again once `herd up` has finished",
            layout.root().display()
        );
    }
    if let Some(sup) = read_supervisor(layout) {
        let pid = Pid::from_raw(i32::try_from(sup.pid).context("invalid supervisor pid")?);
        eprintln!(
            "Stopping the Herd supervisor (pid {}) and its servers…",
            sup.pid
        );
        kill(pid, Signal::SIGTERM).with_context(|| format!("signalling supervisor {}", sup.pid))?;
        let deadline = Instant::now() + Duration::from_secs(300);
        while supervisor_running(layout) {
            if Instant::now() >= deadline {
                bail!(
                    "the supervisor (pid {}) is still stopping after 300 s; see {}",
                    sup.pid,
                    layout.supervisor_log().display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Whatever still runs (no supervisor, or one that died): stop it here.
    let pg = Pg::new(
        PgBinaries::locate(cluster.config.postgres.bindir.as_deref())?,
        OsUser::for_servers(&cluster.config.postgres.os_user)?,
    );
    herd_cluster::stop_groups(&groups, &pg, &TermProgress::new()).await?;
    eprintln!("Cluster stopped; `herd up` resumes it with its data.");
    Ok(())
}
