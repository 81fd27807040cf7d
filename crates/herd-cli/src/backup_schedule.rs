//! Scheduled backups (`[backup] full_every_s`, `incr_every_s`), taken by `herd up`'s
//! supervisor: each round looks at every shard group's backups in the repository
//! (herd-backup `Schedule::due`) and takes the ones due, one group after the other, each from a
//! streaming standby of its group when there is one; with several groups, a restore point
//! across them follows (as after `herd backup`). One backup at a time: this task takes them in
//! turn, and pgBackRest's lock (in `run/pgbackrest/`) refuses a `herd backup` of the same group
//! meanwhile (or this task's backup, retried at the next round, while one runs).

use std::sync::Arc;
use std::time::Duration;

use herd_backup::{Runner, Schedule};
use herd_cluster::Layout;
use herd_config::Config;
use herd_core::{ClusterStatus, NodeState, Role};
use herd_pg::OsUser;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the task needs from the running cluster.
pub struct ScheduleLinks {
    /// The data directory.
    pub layout: Layout,
    /// The servers' OS user (pgBackRest runs as it).
    pub owner: Option<OsUser>,
    /// The endpoint (restore points across groups).
    pub proxy: Arc<herd_proxy::ProxyContext>,
    /// The supervisor's status (which groups have a streaming standby).
    pub status: watch::Receiver<ClusterStatus>,
}

/// Starts the scheduled backups when `config` has any (`None` otherwise).
pub fn spawn(
    links: ScheduleLinks,
    config: &Config,
    shutdown: watch::Receiver<bool>,
) -> Option<JoinHandle<()>> {
    let schedule = Schedule {
        full_every_s: config.backup.full_every_s,
        incr_every_s: config.backup.incr_every_s,
    };
    if !config.backup.is_enabled() || !schedule.is_on() {
        return None;
    }
    tracing::info!(
        full_every_s = schedule.full_every_s,
        incr_every_s = schedule.incr_every_s,
        "scheduled backups on"
    );
    Some(tokio::spawn(run(links, schedule, shutdown)))
}

async fn run(links: ScheduleLinks, schedule: Schedule, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(schedule.tick()) => {}
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
        let runner = match crate::backup_setup::runner(&links.layout, links.owner.as_ref()) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("scheduled backups: {e:#}");
                continue;
            }
        };
        // Counted each round: `herd group add` may have added one (with its stanza).
        let groups = herd_cluster::existing_groups(&links.layout);
        let mut first_label = None;
        for group in 0..groups {
            if *shutdown.borrow() {
                return;
            }
            match backup_if_due(&links, &runner, schedule, group).await {
                Ok(Some(label)) => {
                    first_label.get_or_insert(label);
                }
                Ok(None) => {}
                // Retried at the next round (a manual backup holding the lock, a primary
                // being replaced...).
                Err(e) => tracing::warn!(group, "scheduled backup failed: {e:#}"),
            }
        }
        if let (Some(label), true) = (first_label, groups > 1) {
            let name = format!("backup-{label}");
            match crate::restore_point::take(&links.proxy, &links.layout, &name).await {
                Ok(text) => tracing::info!("{text}"),
                Err(e) => tracing::warn!("restore point after scheduled backups: {e:#}"),
            }
        }
    }
}

/// Takes the backup group `group` is due for, if any: its label.
async fn backup_if_due(
    links: &ScheduleLinks,
    runner: &Runner,
    schedule: Schedule,
    group: u32,
) -> anyhow::Result<Option<String>> {
    let stanza = herd_backup::stanza(group);
    let list = {
        let (runner, stanza) = (runner.clone(), stanza.clone());
        tokio::task::spawn_blocking(move || crate::backup::list_backups(&runner, &stanza)).await??
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let Some(kind) = schedule.due(&list, now) else {
        return Ok(None);
    };
    let standby = standby_streams(&links.status.borrow(), group);
    tracing::info!(
        group,
        standby,
        "scheduled {} backup of shard group {group}",
        kind.as_str()
    );
    let started = std::time::Instant::now();
    let mut args = vec![format!("--type={}", kind.as_str())];
    if standby {
        args.push("--backup-standby".to_string());
    }
    let (runner2, stanza2) = (runner.clone(), stanza.clone());
    tokio::task::spawn_blocking(move || runner2.run(Some(&stanza2), "backup", &args, &mut |_| {}))
        .await??;
    let list = {
        let (runner, stanza) = (runner.clone(), stanza.clone());
        tokio::task::spawn_blocking(move || crate::backup::list_backups(&runner, &stanza)).await??
    };
    let label = list.last().map(|b| b.label.clone()).unwrap_or_default();
    tracing::info!(
        group,
        "scheduled {} backup {label} of shard group {group} done in {:.1}s",
        kind.as_str(),
        started.elapsed().as_secs_f64()
    );
    Ok((!label.is_empty()).then_some(label))
}

/// Whether a replica of group `group` streams in the supervisor's status.
fn standby_streams(status: &ClusterStatus, group: u32) -> bool {
    let nodes = if group == 0 {
        Some(&status.nodes)
    } else {
        status.groups.get(group as usize - 1).map(|g| &g.nodes)
    };
    nodes.is_some_and(|nodes| {
        nodes
            .iter()
            .any(|n| n.role == Role::Replica && n.state == NodeState::Streaming)
    })
}

/// How long `herd down` waits for a scheduled backup under way before stopping the servers.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(60);
