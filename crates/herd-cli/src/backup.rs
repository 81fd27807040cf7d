//! `herd backup` (a full, differential or incremental backup of every shard group, one after
//! the other, each copied from a streaming standby of its group when there is one, so the
//! primary is spared; with several groups, a restore point across them afterwards) and
//! `herd backup list`.

use std::time::Instant;

use anyhow::{bail, Context};
use herd_backup::{BackupError, BackupInfo, BackupKind, Event, Runner};
use herd_cluster::{Layout, Progress};
use herd_config::Config;
use herd_pg::OsUser;

use crate::progress::TermProgress;

/// The configuration of the cluster in `layout`, which must have `[backup]`.
pub fn backup_config(layout: &Layout) -> anyhow::Result<Config> {
    if !layout.config().exists() {
        bail!(
            "{} holds no Herd cluster (no herd.toml); give its --data-dir",
            layout.root().display()
        );
    }
    let config = Config::load(&layout.config())?;
    if !config.backup.is_enabled() {
        return Err(BackupError::NotConfigured(layout.config()).into());
    }
    Ok(config)
}

/// `herd backup --type KIND [--from-primary]`.
pub async fn run(layout: &Layout, kind: BackupKind, from_primary: bool) -> anyhow::Result<()> {
    let config = backup_config(layout)?;
    if !herd_cluster::supervisor_running(layout) {
        bail!(
            "the cluster in {} is not running: start it with `herd up` (backups are taken from its primary)",
            layout.root().display()
        );
    }
    let repository = config.backup.repository_path(layout.root());
    if config.backup.s3.is_none() && !repository.is_dir() {
        // `herd up` created it: gone now, the WAL archived since is gone with it (or a mount
        // is missing). Not created again here, which would hide that.
        bail!(
            "the backup repository {} does not exist (herd up created it): was it removed, or \
             is its file system not mounted? Restore it, or point backup.repository at the \
             right place; nothing was changed",
            repository.display()
        );
    }
    let owner = OsUser::for_servers(&config.postgres.os_user)?;
    let progress = TermProgress::new();
    progress.phase("refreshing pgBackRest's configuration and stanza");
    // The cluster's nodes may have changed since `herd up` wrote the configuration.
    crate::backup_setup::write_config(layout, &config, owner.as_ref())?;
    crate::backup_setup::create_stanzas(layout, &config, owner.as_ref())?;
    progress.done("configuration and stanza ready");
    let runner = crate::backup_setup::runner(layout, owner.as_ref())?;
    let groups = herd_cluster::existing_groups(layout).max(config.cluster.shards);
    let mut labels = Vec::new();
    for group in 0..groups {
        labels.push(backup_group(layout, &runner, &progress, group, kind, from_primary).await?);
    }
    let mut point = None;
    if groups > 1 {
        // A point consistent across groups right after the backups: a restore of the whole
        // cluster needs one (each group's WAL alone is not consistent with the others').
        let name = format!("backup-{}", labels[0].0);
        progress.phase(&format!(
            "restore point {name} across the {groups} shard groups"
        ));
        match crate::admin::request_text(layout, format!("/restore-point?name={name}")).await {
            Ok(_) => point = Some(name),
            Err(e) => eprintln!(
                "warning: no restore point with the backups ({e:#}); take one with `herd backup \
                 restore-point NAME` before restoring to one"
            ),
        }
    }
    drop(progress);
    for (group, (label, text)) in labels.iter().enumerate() {
        let prefix = if groups > 1 {
            format!("Shard group {group}: backup ")
        } else {
            "Backup ".to_string()
        };
        crate::output::emitln!("{prefix}{label} ({text}).");
    }
    crate::output::emitln!("Repository: {}", repository.display());
    let to = point.as_deref().unwrap_or("latest");
    if groups > 1 && point.is_none() {
        crate::output::emitln!(
            "Restore after a restore point with: herd restore --to NAME --from-data-dir {} --data-dir NEW-DIR",
            layout.root().display()
        );
    } else {
        if let Some(p) = &point {
            crate::output::emitln!("Restore point {p} taken across the {groups} shard groups.");
        }
        crate::output::emitln!(
            "Restore with: herd restore --to {to} --from-data-dir {} --data-dir NEW-DIR",
            layout.root().display()
        );
    }
    Ok(())
}

/// Backs up shard group `group`: its label and a description of it.
async fn backup_group(
    layout: &Layout,
    runner: &Runner,
    progress: &TermProgress,
    group: u32,
    kind: BackupKind,
    from_primary: bool,
) -> anyhow::Result<(String, String)> {
    let stanza = herd_backup::stanza(group);
    // pgBackRest copies the files from a standby (`--backup-standby`; the primary only starts
    // and stops the backup) when one streams; it refuses that option when none does.
    let standby = !from_primary && standby_streams(layout, group).await;
    let source = if standby {
        "a streaming standby (the primary only starts and stops it)"
    } else {
        "its primary"
    };
    let started = Instant::now();
    progress.phase(&format!(
        "{} backup of shard group {group} from {source}",
        kind.as_str()
    ));
    let mut args = vec![
        format!("--type={}", kind.as_str()),
        // Per-file lines carry the share copied so far: the progress shown.
        "--log-level-console=detail".to_string(),
    ];
    if standby {
        args.push("--backup-standby".to_string());
    }
    let step = percent_step();
    let mut shown = -1i64;
    let mut on_event = |event: Event| match event {
        Event::Step(text) => {
            if let Some(phase) = phase_of(&text) {
                progress.phase(&phase);
            }
        }
        Event::Copied(percent) => {
            if percent as i64 >= shown + step {
                shown = percent as i64 / step * step;
                progress.phase(&format!("copying files: {shown}%"));
            }
        }
    };
    // Blocking is fine: this command has nothing else to do meanwhile.
    runner
        .run(Some(&stanza), "backup", &args, &mut on_event)
        .with_context(|| {
            format!("the backup of shard group {group} failed; see the logs in logs/pgbackrest/")
        })?;
    let list = list_backups(runner, &stanza)?;
    let Some(newest) = list.last() else {
        bail!("pgbackrest reported success but lists no backup");
    };
    progress.done(&format!(
        "shard group {group}: backup {} ({}) done in {:.1}s",
        newest.label,
        newest.kind,
        started.elapsed().as_secs_f64()
    ));
    let text = format!(
        "{}, copied from {}, {} of database, {} in the repository",
        newest.kind,
        if standby { "a standby" } else { "the primary" },
        human_bytes(newest.size),
        human_bytes(newest.repo_size),
    );
    Ok((newest.label.clone(), text))
}

/// Whether a replica of shard group `group` streams from its primary now (`herd status`'s
/// view).
async fn standby_streams(layout: &Layout, group: u32) -> bool {
    let Ok(clusters) = crate::status::open_all(layout) else {
        return false;
    };
    let Some(cluster) = clusters.get(group as usize) else {
        return false;
    };
    herd_cluster::observe(cluster)
        .await
        .status
        .nodes
        .iter()
        .any(|n| n.role == herd_core::Role::Replica && n.state == herd_core::NodeState::Streaming)
}

/// How many percent apart copy progress is shown: every percent on a terminal (a spinner
/// line redrawn), every 10 % in a log, which keeps it readable.
pub fn percent_step() -> i64 {
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        1
    } else {
        10
    }
}

/// The phase shown for one of pgBackRest's INFO lines, or `None` for lines of no interest.
fn phase_of(text: &str) -> Option<String> {
    let phase = if text.starts_with("execute non-exclusive backup start") {
        "checkpoint on the primary, backup start"
    } else if text.starts_with("backup start archive") {
        "copying files"
    } else if text.starts_with("wait for replay on the standby") {
        "waiting for the standby to replay up to the backup's start"
    } else if text.starts_with("execute non-exclusive backup stop") {
        "backup stop, waiting for its WAL to be archived"
    } else if text.starts_with("check archive for segment") {
        "checking the archive holds the backup's WAL"
    } else if text.starts_with("expire command begin") {
        "expiring backups beyond retention_full"
    } else if text.starts_with("new backup label") {
        return Some(text.replace(" = ", ": "));
    } else {
        return None;
    };
    Some(phase.to_string())
}

/// The stanza's backups, oldest first.
pub fn list_backups(runner: &Runner, stanza: &str) -> anyhow::Result<Vec<BackupInfo>> {
    let json = runner.run(
        Some(stanza),
        "info",
        &["--output=json".to_string()],
        &mut |_| {},
    )?;
    Ok(herd_backup::parse_info(&json, stanza)?)
}

/// `herd backup list`: every group's backups (a GROUP column when there are several).
pub fn list(layout: &Layout) -> anyhow::Result<()> {
    let config = backup_config(layout)?;
    let owner = OsUser::for_servers(&config.postgres.os_user)?;
    let runner = crate::backup_setup::runner(layout, owner.as_ref())?;
    let groups = herd_cluster::existing_groups(layout).max(config.cluster.shards);
    let mut rows = Vec::new();
    for group in 0..groups {
        let stanza = herd_backup::stanza(group);
        for b in list_backups(&runner, &stanza)? {
            rows.push((group, b));
        }
    }
    let empty = format!(
        "No backup yet in {}: take one with `herd backup`.",
        config.backup.repository_path(layout.root()).display()
    );
    print_list(&rows, groups, &empty);
    Ok(())
}

/// Prints `rows` (group, backup) as `herd backup list` does (a GROUP column when the cluster
/// has several groups), or `empty` when there is none.
pub fn print_list(rows: &[(u32, BackupInfo)], groups: u32, empty: &str) {
    if rows.is_empty() {
        crate::output::emitln!("{empty}");
        return;
    }
    let group_col = |g: &str| {
        if groups > 1 {
            format!("{g:<5} ")
        } else {
            String::new()
        }
    };
    let mut out = format!(
        "{}{:<36} {:<5} {:<20} {:<20} {:>10} {:>10}\n",
        group_col("GROUP"),
        "LABEL",
        "TYPE",
        "START (UTC)",
        "STOP (UTC)",
        "SIZE",
        "REPO"
    );
    for (group, b) in rows {
        out.push_str(&format!(
            "{}{:<36} {:<5} {:<20} {:<20} {:>10} {:>10}\n",
            group_col(&group.to_string()),
            b.label,
            b.kind,
            seconds(b.start),
            seconds(b.stop),
            human_bytes(b.size),
            human_bytes(b.repo_size)
        ));
    }
    crate::output::emitln!("{}", out.trim_end());
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) of seconds since the epoch.
fn seconds(epoch: i64) -> String {
    let full = herd_backup::format_utc(epoch * 1_000_000);
    full.get(..19).unwrap_or(&full).to_string()
}

pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}
