//! Replicas built from the backup repository (`[backup] replicas_from_repository = true`; `herd
//! up`'s nodes and `herd agent`s across hosts alike): `pgbackrest restore --type=standby` of the group's newest backup into the new
//! replica's directory instead of pg_basebackup of the primary. The primary then only streams
//! the WAL written since the backup's end (the restored standby first replays what the archive
//! holds, through the `restore_command` pgBackRest writes into `postgresql.auto.conf`), rather
//! than reading and sending every file — on a large group the difference between hours of the
//! primary's I/O and minutes. When the repository holds no backup of the group (a new cluster:
//! its replicas are made before any backup exists) or the restore fails, the replica is made
//! with pg_basebackup as before.

use std::path::Path;

use herd_backup::BackupInfo;
use herd_cluster::Layout;
use herd_pg::Pg;

/// Where a new replica's files come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CloneSource {
    /// `pgbackrest restore --type=standby --set=LABEL`.
    Repository {
        /// The newest backup of the group.
        label: String,
    },
    /// pg_basebackup of the primary, and why.
    Basebackup {
        /// Why not the repository (`None`: not asked for).
        why: Option<String>,
    },
}

/// The choice, from whether herd.toml asks for it, the group's backups (oldest first, as
/// `pgbackrest info` lists them) or why they could not be listed, and the primary's system
/// identifier (`None`: it could not be read). The newest backup must be of the primary's
/// cluster: a repository shared by mistake with another cluster would give a replica that
/// never streams.
pub fn choose(
    asked: bool,
    listed: Result<&[BackupInfo], String>,
    primary: Option<u64>,
) -> CloneSource {
    let basebackup = |why: String| CloneSource::Basebackup { why: Some(why) };
    if !asked {
        return CloneSource::Basebackup { why: None };
    }
    let newest = match listed {
        Err(e) => return basebackup(format!("the repository could not be read ({e})")),
        Ok(list) => match list.last() {
            Some(newest) => newest,
            None => return basebackup("the repository holds no backup of the group yet".into()),
        },
    };
    match (newest.system_id, primary) {
        (_, None) => basebackup("the primary's system identifier could not be read".into()),
        (Some(theirs), Some(ours)) if theirs != ours => basebackup(format!(
            "the repository's newest backup {} is of another PostgreSQL cluster (system \
             identifier {theirs}, the primary's {ours})",
            newest.label
        )),
        _ => CloneSource::Repository {
            label: newest.label.clone(),
        },
    }
}

/// When herd.toml of `layout` asks for it, restores the group's newest backup into `pgdata`
/// (which does not exist yet) as a standby; `true` when it did. `false`: make it with
/// pg_basebackup (the reason is logged; a partial restore is removed).
pub async fn restore_standby(
    layout: &Layout,
    pg: &Pg,
    group: u32,
    pgdata: &Path,
    primary: Option<u64>,
) -> bool {
    let asked = herd_config::Config::load(&layout.config())
        .map(|c| c.backup.is_enabled() && c.backup.replicas_from_repository)
        .unwrap_or(false);
    let Some(runner) = asked
        .then(|| crate::host::archive::runner(layout, pg))
        .flatten()
    else {
        return false;
    };
    restore_with(runner, group, pgdata, primary).await
}

/// Restores the group's newest backup into `pgdata` as a standby with `runner` (pgBackRest as
/// the servers' OS user with the node's configuration); `true` when it did, `false`: make it
/// with pg_basebackup (the reason is logged; a partial restore is removed).
/// `primary`: the primary's system identifier, which the backup's must match.
pub async fn restore_with(
    runner: herd_backup::Runner,
    group: u32,
    pgdata: &Path,
    primary: Option<u64>,
) -> bool {
    let stanza = herd_backup::stanza(group);
    let (lister, s) = (runner.clone(), stanza.clone());
    let listed = tokio::task::spawn_blocking(move || {
        let json = lister.run(Some(&s), "info", &["--output=json".into()], &mut |_| {})?;
        herd_backup::parse_info(&json, &s)
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r.map_err(|e| e.to_string()));
    let label = match choose(true, listed.as_deref().map_err(Clone::clone), primary) {
        CloneSource::Repository { label } => label,
        CloneSource::Basebackup { why } => {
            tracing::info!(
                "building the replica with pg_basebackup: {}",
                why.unwrap_or_default()
            );
            return false;
        }
    };
    tracing::info!(
        "building the replica from backup {label} of the repository (pgbackrest restore \
         --type=standby), not pg_basebackup of the primary"
    );
    let dir = pgdata.to_path_buf();
    let restored = tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(&dir)
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        if let Some(u) = &runner.owner {
            u.chown_tree(&dir).map_err(|e| e.to_string())?;
        }
        // The cluster's configuration lists every node of the group; the restore writes this
        // node's directory (and the restore_command it writes names it too).
        let args = [
            format!("--pg1-path={}", dir.display()),
            "--type=standby".to_string(),
            format!("--set={label}"),
        ];
        runner
            .run(Some(&stanza), "restore", &args, &mut |_| {})
            .map(drop)
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r);
    match restored {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(
                "restoring the replica from the repository failed ({e}); using pg_basebackup"
            );
            let _ = std::fs::remove_dir_all(pgdata);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backup(label: &str) -> BackupInfo {
        BackupInfo {
            label: label.into(),
            kind: "full".into(),
            start: 1,
            stop: 2,
            size: 3,
            repo_size: 4,
            stop_lsn: None,
            system_id: Some(7),
        }
    }

    #[test]
    fn the_newest_backup_of_the_primarys_cluster_or_pg_basebackup_and_why() {
        let two = [
            backup("20261129-040000F"),
            backup("20261129-050000F_20261129-051000I"),
        ];
        let mut unknown = backup("20261129-060000F");
        unknown.system_id = None;
        let unknown = [unknown];
        let why = |s: &str| CloneSource::Basebackup {
            why: Some(s.into()),
        };
        let off = CloneSource::Basebackup { why: None };
        type Case<'a> = (
            bool,
            Result<&'a [BackupInfo], String>,
            Option<u64>,
            CloneSource,
        );
        let cases: [Case; 8] = [
            (false, Ok(&two), Some(7), off.clone()),
            (false, Err("x".into()), Some(7), off),
            (
                true,
                Ok(&two),
                Some(7),
                CloneSource::Repository {
                    label: "20261129-050000F_20261129-051000I".into(),
                },
            ),
            (
                true,
                Ok(&[]),
                Some(7),
                why("the repository holds no backup of the group yet"),
            ),
            (
                true,
                Err("missing stanza".into()),
                Some(7),
                why("the repository could not be read (missing stanza)"),
            ),
            (
                true,
                Ok(&two),
                Some(8),
                why(
                    "the repository's newest backup 20261129-050000F_20261129-051000I is of \
                     another PostgreSQL cluster (system identifier 7, the primary's 8)",
                ),
            ),
            (
                true,
                Ok(&two),
                None,
                why("the primary's system identifier could not be read"),
            ),
            // pgBackRest did not say: the restored standby's own identity check still refuses
            // another cluster once it runs.
            (
                true,
                Ok(&unknown),
                Some(7),
                CloneSource::Repository {
                    label: "20261129-060000F".into(),
                },
            ),
        ];
        for (asked, listed, primary, want) in cases {
            assert_eq!(choose(asked, listed, primary), want);
        }
    }
}
