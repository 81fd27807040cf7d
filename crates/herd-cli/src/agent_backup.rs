//! `herd agent` with `[backup]` in its `--config` herd.toml: WAL archiving and backups across
//! hosts. Before the server starts, the agent writes its node's pgBackRest configuration
//! (`<data-dir>/backup/pgbackrest.conf`: the repository every host shares, and one stanza,
//! `herd-g<G>`, naming this host's data directory); its server's `archive_command` uses it, so
//! whichever node is primary archives, across failovers (herd-agent's node.rs; a promoted node
//! also pushes the previous timeline's segments it holds, and a former primary its unarchived
//! ones before its rewind, as on one host). While this agent leads its group it creates the
//! stanza (idempotent, once per leadership), and it runs the backups `herd backup --dcs` asks
//! of it ([`crate::backup_hosts`]) under the group's backup lease in the store.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use herd_agent::config::AgentConfig;
use herd_agent::store::StoreClient;
use herd_backup::{BackupKind, Paths, PgNode, Runner, Schedule, Setup, Stanza};
use herd_cluster::{Layout, Secrets};
use herd_config::BackupConfig;
use herd_dcs::Dcs;
use herd_pg::OsUser;
use tokio::sync::watch;

use crate::backup_hosts::{blocking, encode, Request, State, LOCK, LOCK_TTL, REQUEST};

/// How often the task looks at the store.
const TICK: Duration = Duration::from_secs(1);
/// Between two failed attempts at the stanza.
const STANZA_RETRY: Duration = Duration::from_secs(10);

/// The repository directory `[backup]` names for an agent: an absolute path (the same mount on
/// every host); S3 needs none (`None`).
pub fn repository(backup: &BackupConfig) -> anyhow::Result<Option<PathBuf>> {
    if backup.s3.is_some() {
        return Ok(None);
    }
    let path = PathBuf::from(&backup.repository);
    if !path.is_absolute() {
        anyhow::bail!(
            "[backup] repository must be an absolute path on storage every host of the cluster \
             sees (a shared mount), or use [backup.s3]; got {:?}",
            backup.repository
        );
    }
    Ok(Some(path))
}

/// Writes this node's pgBackRest configuration and creates its socket directory (pgBackRest
/// connects to the server over a Unix-domain socket only). `config_dir`: herd.toml's
/// directory, for a relative S3 credentials file.
pub fn prepare(cfg: &AgentConfig, backup: &BackupConfig, config_dir: &Path) -> anyhow::Result<()> {
    let owner = OsUser::for_servers(&cfg.postgres.os_user)?;
    let sockets = cfg
        .socket_dir()
        .context("backups across hosts need the agent's socket directory")?;
    if !herd_pg::socket_dir_fits(&sockets) {
        anyhow::bail!(
            "{}: too long for a Unix-domain socket, which pgBackRest needs; choose a shorter \
             --data-dir",
            sockets.display()
        );
    }
    std::fs::create_dir_all(&sockets).with_context(|| format!("creating {}", sockets.display()))?;
    std::fs::set_permissions(
        &sockets,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )?;
    if let Some(u) = &owner {
        u.chown_tree(&sockets)?;
    }
    let s3 = crate::backup_setup::s3_repo(backup, config_dir)?;
    let setup = Setup {
        paths: Paths::new(&cfg.data_dir),
        repository: match &s3 {
            Some(_) => backup.s3_path().into(),
            None => repository(backup)?.context("[backup] names no repository directory")?,
        },
        s3,
        retention_full: backup.retention_full,
        stanzas: vec![Stanza {
            group: cfg.group,
            nodes: vec![PgNode {
                path: cfg.pgdata(),
                port: cfg.pg_port,
            }],
            socket_dir: Some(sockets),
        }],
    };
    setup
        .write(owner.as_ref())
        .context("writing pgBackRest's configuration")
}

/// Starts the task that creates the stanza while this agent leads, takes the scheduled backups
/// then (`[backup] full_every_s`, `incr_every_s`) and runs the backups asked of it, until
/// `shutdown`; group 0's leader also copies the store's restore points into the repository's
/// record (`agent_points.rs`). `dcs`: the group's view of the store; `root`: the cluster's.
pub fn spawn(
    cfg: &AgentConfig,
    backup: &BackupConfig,
    dcs: Arc<dyn Dcs>,
    root: Arc<dyn Dcs>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let layout = Layout::new(&cfg.data_dir);
    let runner = Runner {
        config: Paths::new(&cfg.data_dir).config(),
        owner: OsUser::for_servers(&cfg.postgres.os_user)?,
        password: None,
    };
    let task = Task {
        me: cfg.name.clone(),
        group: cfg.group,
        store: StoreClient::new(dcs.clone()),
        dcs,
        root,
        repository: repository(backup)?,
        layout,
        runner,
        schedule: Schedule {
            full_every_s: backup.full_every_s,
            incr_every_s: backup.incr_every_s,
        },
    };
    tokio::spawn(task.run(shutdown));
    Ok(())
}

struct Task {
    me: String,
    group: u32,
    store: StoreClient,
    dcs: Arc<dyn Dcs>,
    /// The cluster's view of the store (restore points are the cluster's, not a group's).
    root: Arc<dyn Dcs>,
    /// The shared repository directory (`None`: S3, where no record of points is kept yet).
    repository: Option<PathBuf>,
    layout: Layout,
    runner: Runner,
    schedule: Schedule,
}

impl Task {
    async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut stanza_ready = false;
        let mut last_try: Option<Instant> = None;
        let mut last_look: Option<Instant> = None;
        let mut points_failed: Option<Instant> = None;
        loop {
            if *shutdown.borrow() {
                return;
            }
            let leading = self.leading().await;
            if !leading {
                stanza_ready = false;
            } else if !stanza_ready && last_try.is_none_or(|t| t.elapsed() > STANZA_RETRY) {
                last_try = Some(Instant::now());
                stanza_ready = self.create_stanza().await;
            }
            // Scheduled backups: by the group's leader only, under the same lease as a
            // `herd backup`, so one runs at a time whichever agent leads.
            if leading
                && stanza_ready
                && self.schedule.is_on()
                && last_look.is_none_or(|t| t.elapsed() >= self.schedule.tick())
            {
                last_look = Some(Instant::now());
                if let Err(e) = self.scheduled().await {
                    tracing::warn!("scheduled backup (tried again at the next look): {e:#}");
                }
            }
            if let Err(e) = self.take_request().await {
                tracing::warn!("backup request: {e:#}");
            }
            // One writer of the repository's record of restore points: group 0's leader (after
            // a failure, every STANZA_RETRY rather than every second: one warning, not a flood).
            if let (true, 0, Some(repository)) = (leading, self.group, &self.repository) {
                if points_failed.is_none_or(|t| t.elapsed() > STANZA_RETRY) {
                    let owner = self.runner.owner.as_ref();
                    points_failed = None;
                    if let Err(e) = crate::agent_points::sync(&self.root, repository, owner).await {
                        points_failed = Some(Instant::now());
                        tracing::warn!(
                            "copying restore points into the repository (tried again in 10 s): \
                             {e:#}"
                        );
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                _ = shutdown.changed() => {}
            }
        }
    }

    /// Whether this agent holds its group's leader lease and its server runs as primary.
    async fn leading(&self) -> bool {
        let Ok(read) = self.store.read().await else {
            return false;
        };
        read.store.leader.as_deref() == Some(self.me.as_str())
            && read
                .store
                .members
                .iter()
                .any(|m| m.name == self.me && m.role == "primary")
    }

    /// `pgbackrest stanza-create` (idempotent: an existing stanza of this cluster is checked
    /// and kept). Until it exists, `archive-push` fails and PostgreSQL retries the segment.
    async fn create_stanza(&self) -> bool {
        let runner = match self.with_password() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("backup stanza: {e:#}");
                return false;
            }
        };
        let stanza = herd_backup::stanza(self.group);
        let result = tokio::task::spawn_blocking(move || {
            runner.run(Some(&stanza), "stanza-create", &[], &mut |_| {})
        })
        .await;
        match result {
            Ok(Ok(_)) => {
                tracing::info!(
                    "pgBackRest stanza {} ready",
                    herd_backup::stanza(self.group)
                );
                true
            }
            Ok(Err(e)) => {
                tracing::warn!("creating the pgBackRest stanza (tried again in 10 s): {e}");
                false
            }
            Err(e) => {
                tracing::warn!("creating the pgBackRest stanza: {e}");
                false
            }
        }
    }

    fn with_password(&self) -> anyhow::Result<Runner> {
        let secrets = Secrets::load(&self.layout).context("the cluster's passwords")?;
        Ok(Runner {
            password: Some(secrets.superuser),
            ..self.runner.clone()
        })
    }

    /// Runs the group's pending request when it is addressed to this agent.
    async fn take_request(&self) -> anyhow::Result<()> {
        let me = self.me.clone();
        let found = blocking(&self.dcs, move |dcs| {
            Ok(dcs.get(REQUEST)?.and_then(|v| {
                serde_json::from_slice::<Request>(&v.value)
                    .ok()
                    .filter(|r| r.member == me && r.state == State::Asked)
                    .map(|r| (r, v.revision))
            }))
        })
        .await?;
        let Some((request, revision)) = found else {
            return Ok(());
        };
        let (me, ttl) = (self.me.clone(), LOCK_TTL);
        let locked = blocking(&self.dcs, move |dcs| dcs.acquire_lease(LOCK, &me, ttl)).await?;
        if !locked {
            let holder = blocking(&self.dcs, |dcs| dcs.lease_holder(LOCK)).await?;
            let why = format!(
                "another backup of shard group {} is running (on {}): one backup at a time per \
                 group",
                self.group,
                holder.as_deref().unwrap_or("another agent")
            );
            self.finish(request, revision, State::Failed, why).await;
            return Ok(());
        }
        let mut running = request.clone();
        running.state = State::Running;
        let value = encode(&running);
        let taken = blocking(&self.dcs, move |dcs| {
            dcs.compare_and_set(REQUEST, revision, value)
        })
        .await;
        let revision = match taken {
            Ok(r) => r,
            Err(e) => {
                // Replaced or given up meanwhile: nothing to run.
                self.release().await;
                return Err(e.context("taking the backup request up"));
            }
        };
        tracing::info!(
            "{} backup of shard group {} asked by herd backup: running",
            request.kind,
            self.group
        );
        let kind = request
            .kind
            .parse::<BackupKind>()
            .map_err(anyhow::Error::msg);
        let (state, message) = match kind {
            Ok(kind) => match self.backup(kind).await {
                Ok(text) => (State::Done, text),
                Err(e) => (State::Failed, format!("{e:#}")),
            },
            Err(e) => (State::Failed, format!("{e:#}")),
        };
        tracing::info!("backup of shard group {}: {message}", self.group);
        self.finish(running, revision, state, message).await;
        self.release().await;
        Ok(())
    }

    /// Takes the backup the schedule says is due, if any, under the group's backup lease (a
    /// `herd backup` running holds it: this one waits for the next look).
    async fn scheduled(&self) -> anyhow::Result<()> {
        let runner = self.with_password()?;
        let stanza = herd_backup::stanza(self.group);
        let backups =
            tokio::task::spawn_blocking(move || crate::backup::list_backups(&runner, &stanza))
                .await??;
        let now = (herd_core::unix_ms() / 1000) as i64;
        let Some(kind) = self.schedule.due(&backups, now) else {
            return Ok(());
        };
        let (me, ttl) = (self.me.clone(), LOCK_TTL);
        if !blocking(&self.dcs, move |dcs| dcs.acquire_lease(LOCK, &me, ttl)).await? {
            tracing::info!("a scheduled backup waits: another backup of the group runs");
            return Ok(());
        }
        let result = self.backup(kind).await;
        self.release().await;
        tracing::info!(
            "scheduled {} backup of shard group {}: {}",
            kind.as_str(),
            self.group,
            match &result {
                Ok(text) => text.clone(),
                Err(e) => format!("failed: {e:#}"),
            }
        );
        result.map(drop)
    }

    /// Runs pgBackRest's backup (from this host's primary), renewing the lease meanwhile.
    async fn backup(&self, kind: BackupKind) -> anyhow::Result<String> {
        let runner = self.with_password()?;
        let stanza = herd_backup::stanza(self.group);
        let work = tokio::task::spawn_blocking(move || {
            let args = vec![format!("--type={}", kind.as_str())];
            runner.run(Some(&stanza), "backup", &args, &mut |_| {})?;
            crate::backup::list_backups(&runner, &stanza)
        });
        tokio::pin!(work);
        let started = Instant::now();
        loop {
            tokio::select! {
                done = &mut work => {
                    let list = done??;
                    let Some(newest) = list.last() else {
                        anyhow::bail!("pgbackrest reported success but lists no backup");
                    };
                    return Ok(format!(
                        "backup {} ({}) done in {:.1} s, {} of database",
                        newest.label,
                        newest.kind,
                        started.elapsed().as_secs_f64(),
                        crate::backup::human_bytes(newest.size)
                    ));
                }
                _ = tokio::time::sleep(LOCK_TTL / 5) => {
                    let (me, ttl) = (self.me.clone(), LOCK_TTL);
                    match blocking(&self.dcs, move |dcs| dcs.acquire_lease(LOCK, &me, ttl)).await {
                        Ok(true) => {}
                        Ok(false) => tracing::error!(
                            "the backup lease of shard group {} was lost while a backup runs",
                            self.group
                        ),
                        Err(e) => tracing::warn!("renewing the backup lease: {e:#}"),
                    }
                }
            }
        }
    }

    async fn finish(&self, mut request: Request, revision: u64, state: State, message: String) {
        request.state = state;
        request.message = message;
        let value = encode(&request);
        if let Err(e) = blocking(&self.dcs, move |dcs| {
            dcs.compare_and_set(REQUEST, revision, value)
        })
        .await
        {
            tracing::warn!("recording the backup's end: {e:#}");
        }
    }

    async fn release(&self) {
        let me = self.me.clone();
        if let Err(e) = blocking(&self.dcs, move |dcs| dcs.release_lease(LOCK, &me)).await {
            tracing::warn!("releasing the backup lease (it expires by itself): {e:#}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agents_repository_is_shared_storage_or_s3() {
        let named = |repository: &str| BackupConfig {
            repository: repository.into(),
            ..BackupConfig::default()
        };
        assert_eq!(
            repository(&named("/mnt/backups/herd")).expect("absolute"),
            Some(PathBuf::from("/mnt/backups/herd"))
        );
        for relative in ["", "backup-repo", "./repo"] {
            let err = repository(&named(relative))
                .expect_err(relative)
                .to_string();
            assert!(err.contains("absolute path"), "{relative}: {err}");
        }
        let s3 = BackupConfig {
            s3: Some(herd_config::S3Config::default()),
            ..BackupConfig::default()
        };
        assert_eq!(repository(&s3).expect("s3"), None);
    }
}
