//! `herd backup list --dcs … --cluster … --config FILE`: the backups of every shard group of a
//! multi-host cluster, read from the repository its agents' herd.toml names (the `--config`
//! each `herd agent` was given), so nobody has to find an agent's `pgbackrest.conf` and run
//! pgBackRest by hand. The number of groups comes from the store.
//!
//! pgBackRest reads the repository itself (a directory this host sees — the shared mount the
//! agents write to — or `[backup.s3]`) through a configuration of its own in a private temporary
//! directory, as the servers' OS user (`[postgres] os_user`) when Herd runs as root: the agents'
//! files in the repository belong to that user.

use std::path::{Path, PathBuf};

use anyhow::Context;
use herd_backup::{Paths, Setup};
use herd_pg::OsUser;

/// `herd backup list --dcs …`: every group's backups, as `herd backup list` prints them.
pub async fn run(store: &crate::hosts::StoreArgs, config: Option<&Path>) -> anyhow::Result<()> {
    let Some(path) = config else {
        anyhow::bail!(
            "`herd backup list --dcs` needs --config FILE: the herd.toml the agents read \
             (`herd agent --config FILE`), whose [backup] names the repository"
        );
    };
    let file =
        herd_config::Config::load(path).with_context(|| format!("reading {}", path.display()))?;
    if !file.backup.is_enabled() {
        anyhow::bail!(
            "{} has no [backup] section: the agents reading it take no backups (add [backup] \
             with a repository every host sees, or [backup.s3])",
            path.display()
        );
    }
    let base = std::path::absolute(path)?
        .parent()
        .map_or_else(|| PathBuf::from("/"), Path::to_path_buf);
    let groups = store.groups().await?;
    let backup = file.backup.clone();
    let os_user = file.postgres.os_user.clone();
    let (rows, where_) =
        tokio::task::spawn_blocking(move || read_rows(&backup, &os_user, &base, groups)).await??;
    let empty = format!(
        "No backup yet in {where_}: take one with `herd backup --dcs …` (or set full_every_s / \
         incr_every_s in [backup])."
    );
    crate::backup::print_list(&rows, groups, &empty);
    Ok(())
}

/// Each group's backups (oldest first within a group) and a description of the repository.
fn read_rows(
    backup: &herd_config::BackupConfig,
    os_user: &str,
    base: &Path,
    groups: u32,
) -> anyhow::Result<(Vec<(u32, herd_backup::BackupInfo)>, String)> {
    let s3 = crate::backup_setup::s3_repo(backup, base)?;
    let (repository, where_) = match &s3 {
        Some(s) => (
            PathBuf::from(backup.s3_path()),
            format!("s3://{}{}", s.bucket, backup.s3_path()),
        ),
        None => {
            let dir = crate::agent_backup::repository(backup)?
                .context("[backup] names no repository directory")?;
            // Never created here: a missing directory is a mount this host lacks.
            if !dir.is_dir() {
                anyhow::bail!(
                    "the backup repository {} is not on this host (the agents' herd.toml names \
                     it; run this where the shared repository is mounted)",
                    dir.display()
                );
            }
            let shown = dir.display().to_string();
            (dir, shown)
        }
    };
    let owner = OsUser::for_servers(os_user)?;
    // pgBackRest's configuration (the S3 key among it) in a directory only the servers' user
    // reads, removed when the listing ends.
    let scratch = Scratch::create()?;
    if let Some(u) = &owner {
        u.chown_tree(scratch.path())?;
    }
    let setup = Setup {
        paths: Paths::new(scratch.path()),
        repository,
        s3,
        retention_full: backup.retention_full,
        stanzas: Vec::new(),
    };
    setup
        .write(owner.as_ref())
        .context("writing a pgBackRest configuration to read the repository")?;
    let runner = herd_backup::Runner {
        config: setup.paths.config(),
        owner,
        password: None,
    };
    let mut rows = Vec::new();
    for group in 0..groups {
        let stanza = herd_backup::stanza(group);
        let list = crate::backup::list_backups(&runner, &stanza)
            .with_context(|| format!("reading shard group {group}'s backups in {where_}"))?;
        rows.extend(list.into_iter().map(|b| (group, b)));
    }
    Ok((rows, where_))
}

/// A private (0700) temporary directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn create() -> anyhow::Result<Scratch> {
        use std::os::unix::fs::DirBuilderExt;
        let path = std::env::temp_dir().join(format!(
            "herd-backup-list-{}-{}",
            std::process::id(),
            herd_core::unix_ms()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        Ok(Scratch(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
