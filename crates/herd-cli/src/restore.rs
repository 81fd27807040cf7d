//! `herd restore`: every shard group of a backed-up cluster, restored by pgBackRest into a new
//! data directory at a moment (or the end of the archive), made a complete Herd cluster again
//! (each group's replicas cloned from its restored primary), left stopped for `herd up`. A
//! cluster of several groups is restored to a restore point taken across them (a time maps to
//! the newest one before it, see `restore_groups`).
//!
//! The restored cluster gets new passwords (the repository holds the database, not Herd's
//! secrets, and a restore from `--repository` alone has no old data directory to take them
//! from): they are set while the restored server accepts only its superuser on the private
//! socket. It archives into a repository of its own (`<NEW>/backup-repo`), so the source
//! repository's history is never written by the copy.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use herd_backup::{BackupInfo, Event, Paths, PgNode, Runner, Setup, Stanza, Target};
use herd_cluster::{Cluster, ClusterState, Layout, Progress, Secrets, REPLICATION_USER, SUPERUSER};
use herd_config::Config;
use herd_pg::{OsUser, Pg, PgBinaries, StopMode};

use crate::cli::DataDirArg;
use crate::progress::TermProgress;

/// Recovery settings pgBackRest writes into postgresql.auto.conf, reset once the restored
/// server is promoted: a replica cloned from it must not inherit a recovery target (it would
/// stop replaying there) nor fetch WAL from the source repository.
const RECOVERY_SETTINGS: [&str; 9] = [
    "restore_command",
    "recovery_target",
    "recovery_target_lsn",
    "recovery_target_name",
    "recovery_target_time",
    "recovery_target_xid",
    "recovery_target_inclusive",
    "recovery_target_timeline",
    "recovery_target_action",
];

/// Options of `herd restore`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["from_data_dir", "repository"])))]
pub struct RestoreArgs {
    /// The NEW data directory (must not exist, or be empty).
    #[command(flatten)]
    pub dir: DataDirArg,
    /// `latest` (the end of the archived WAL); a time: every transaction committed by then,
    /// none after ('YYYY-MM-DD HH:MM:SS[.ffffff][+HH[:MM]]', UTC without a zone); a WAL
    /// position such as 0/3000060; or the name of a restore point (`herd backup restore-point`).
    #[arg(long, value_name = "TIME|LSN|NAME|latest")]
    pub to: String,
    /// The data directory of the backed-up cluster (its herd.toml names the repository and
    /// gives the restored cluster its settings).
    #[arg(long, value_name = "DIR")]
    pub from_data_dir: Option<PathBuf>,
    /// The repository itself, when the old data directory is gone (default settings).
    #[arg(long, value_name = "PATH")]
    pub repository: Option<PathBuf>,
    /// The restored cluster's endpoint port (its nodes use the ports after it); needed when
    /// the backed-up cluster still runs on its own.
    #[arg(long)]
    pub port: Option<u16>,
}

/// `herd restore`.
pub async fn run(args: RestoreArgs) -> anyhow::Result<()> {
    let layout = args.dir.layout()?;
    let target: Target = args.to.parse()?;
    refuse_used_dir(&layout)?;
    let (mut config, repository, old) = source(&args, &layout)?;
    let groups = crate::restore_groups::source_groups(&config, old.as_ref(), &repository)?;
    // From --repository alone: as many groups as it holds stanzas (default settings otherwise).
    config.cluster.shards = config.cluster.shards.max(groups);
    let recorded = crate::restore_groups::recorded_points(old.as_ref(), &repository)?;
    let (target, points) = if groups > 1 {
        crate::restore_groups::plan(target, recorded.as_ref(), groups)?
    } else {
        let point = point_position(&target, recorded.as_ref())?;
        (target, vec![point])
    };
    if let (Target::Lsn(lsn), Some(old)) = (&target, old.as_ref()) {
        refuse_future_position(*lsn, old).await?;
    }
    if let Some(p) = args.port {
        config.network.port = p;
    }
    // The copy archives into a repository of its own, never into its source's.
    config.backup.enabled = true;
    config.backup.repository = String::new();
    config.validate()?;
    if !repository.is_dir() {
        bail!(
            "the backup repository {} does not exist (or is not a directory)",
            repository.display()
        );
    }
    if !herd_pg::socket_dir_fits(&layout.sockets()) {
        bail!(
            "{} is too long a path for the servers' Unix-domain sockets, which pgBackRest and \
             the restore need: choose a shorter --data-dir",
            layout.root().display()
        );
    }
    let owner = OsUser::for_servers(&config.postgres.os_user)?;
    let pg = Pg::new(
        PgBinaries::locate(config.postgres.bindir.as_deref())?,
        owner.clone(),
    );

    if let Some(old) = old.filter(herd_cluster::supervisor_running) {
        // The source still runs: its current WAL segment (holding, say, the DROP TABLE just
        // made) is archived now, not up to archive_timeout later, so the moments just before
        // it can be reached.
        eprintln!("  … archiving the running source's current WAL (pgbackrest check)");
        for group in 0..groups {
            let stanza = herd_backup::stanza(group);
            let checked = crate::backup_setup::runner(&old, owner.as_ref())
                .and_then(|r| Ok(r.run(Some(&stanza), "check", &[], &mut |_| {})?));
            if let Err(e) = checked {
                eprintln!("warning: {e:#}\n(restoring from what is archived already)");
            }
        }
    }
    // Checked before anything is written: a target the repository cannot reach changes nothing.
    let mut sets = Vec::new();
    for (group, point) in points.iter().enumerate() {
        let set = choose_backup(&repository, owner.as_ref(), &target, *point, group as u32);
        sets.push(if groups > 1 {
            set.with_context(|| format!("shard group {group}"))?
        } else {
            set?
        });
    }
    let progress = TermProgress::new();
    let created = !layout.root().exists();
    let restored = build_all(&layout, config, &pg, &repository, &sets, &target, &progress).await;
    match restored {
        Ok(clusters) => {
            drop(progress);
            let to = target.to_string();
            let mut lines = Vec::new();
            for (cluster, set) in clusters.iter().zip(&sets) {
                lines.push(format!(
                    "shard group {} from backup {} ({} nodes)",
                    cluster.group(),
                    set.label,
                    cluster.state.nodes.len()
                ));
            }
            crate::output::emitln!(
                "Restored {} to {to} into {} (new passwords; WAL archived to {}).\n\
                 Start it with: herd up --data-dir {}",
                lines.join(", "),
                layout.root().display(),
                clusters[0]
                    .config
                    .backup
                    .repository_path(layout.root())
                    .display(),
                layout.root().display()
            );
            Ok(())
        }
        Err(e) => {
            drop(progress);
            discard(&layout, &pg, created).await;
            Err(e.context(format!(
                "the restore failed; {} was {}",
                layout.root().display(),
                if created { "removed" } else { "emptied" }
            )))
        }
    }
}

/// Refuses a live cluster's directory and any non-empty one.
fn refuse_used_dir(layout: &Layout) -> anyhow::Result<()> {
    if herd_cluster::supervisor_running(layout) {
        bail!(
            "{} is the data directory of a running Herd cluster: restore into a new directory",
            layout.root().display()
        );
    }
    let non_empty = std::fs::read_dir(layout.root())
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    if non_empty {
        bail!(
            "{} exists and is not empty: restore into a new (or empty) directory; nothing was changed",
            layout.root().display()
        );
    }
    Ok(())
}

/// The restored cluster's settings, the repository to restore from, and the backed-up
/// cluster's data directory when given.
fn source(
    args: &RestoreArgs,
    layout: &Layout,
) -> anyhow::Result<(Config, PathBuf, Option<Layout>)> {
    if let Some(old) = &args.from_data_dir {
        let old = Layout::new(
            std::path::absolute(old)
                .with_context(|| format!("invalid data directory {}", old.display()))?,
        );
        if old.root() == layout.root() {
            bail!("--from-data-dir and --data-dir name the same directory");
        }
        let config = Config::load(&old.config()).with_context(|| {
            format!("reading the backed-up cluster's {}", old.config().display())
        })?;
        if !config.backup.is_enabled() {
            return Err(herd_backup::BackupError::NotConfigured(old.config()).into());
        }
        let repository = config.backup.repository_path(old.root());
        return Ok((config, repository, Some(old)));
    }
    let repository = args.repository.as_deref().unwrap_or(Path::new(""));
    let repository = std::path::absolute(repository)
        .with_context(|| format!("invalid repository {}", repository.display()))?;
    Ok((Config::default(), repository, None))
}

/// The WAL position of the restore point `target` names, from the restore points recorded in
/// the backed-up cluster's data directory (or the repository's copy); a name they do not hold is
/// refused. Without a record (a repository from before the copy was kept) the name cannot be
/// checked: `None`, and the restore starts from the newest backup (it fails, with nothing left
/// behind, if the point is older or absent).
fn point_position(
    target: &Target,
    recorded: Option<&crate::restore_groups::Recorded>,
) -> anyhow::Result<Option<herd_core::Lsn>> {
    let Target::Name(name) = target else {
        return Ok(None);
    };
    let Some(recorded) = recorded else {
        eprintln!(
            "note: the repository holds no record of restore points, so '{name}' cannot be \
             checked: restoring from the newest backup"
        );
        return Ok(None);
    };
    let points = &recorded.points;
    match points.iter().find(|p| p.name == *name) {
        Some(p) => Ok(Some(p.lsn)),
        None => {
            let known: Vec<&str> = points.iter().map(|p| p.name.as_str()).collect();
            bail!(
                "{} has no restore point named '{name}' (made with `herd backup \
                 restore-point`); it has: {}",
                recorded.place,
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )
        }
    }
}

/// Refuses a WAL position beyond the end of the running source's WAL (a restore would replay
/// all there is and fail). Not checked when the source is stopped or does not answer.
async fn refuse_future_position(lsn: herd_core::Lsn, old: &Layout) -> anyhow::Result<()> {
    if !herd_cluster::supervisor_running(old) {
        return Ok(());
    }
    let Ok(cluster) = crate::status::open(old) else {
        return Ok(());
    };
    let Ok(client) = herd_pg::connect(&cluster.conn_spec(&cluster.state.primary)).await else {
        return Ok(());
    };
    let current = client
        .query_one("select pg_current_wal_lsn()::text", &[])
        .await
        .ok()
        .and_then(|r| r.try_get::<_, String>(0).ok())
        .and_then(|t| t.parse::<herd_core::Lsn>().ok());
    match current {
        Some(current) if lsn > current => bail!(
            "the target {lsn} is in the future: the source's WAL ends at {current}; nothing \
             was written"
        ),
        _ => Ok(()),
    }
}

/// The backup a restore to `target` starts from, read from the repository.
fn choose_backup(
    repository: &Path,
    owner: Option<&OsUser>,
    target: &Target,
    point: Option<herd_core::Lsn>,
    group: u32,
) -> anyhow::Result<BackupInfo> {
    let stanza = herd_backup::stanza(group);
    // Nothing of the new directory exists yet: the repository is named on the command line.
    let runner = Runner {
        config: PathBuf::from("/dev/null"),
        owner: owner.cloned(),
        password: None,
    };
    let args = [
        format!("--repo1-path={}", repository.display()),
        "--log-level-file=off".to_string(),
        "--output=json".to_string(),
    ];
    let json = runner
        .run(Some(&stanza), "info", &args, &mut |_| {})
        .with_context(|| format!("reading the backups in {}", repository.display()))?;
    let backups = herd_backup::parse_info(&json, &stanza)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    Ok(herd_backup::choose_set(&backups, target, now, point)?.clone())
}

/// The stored password verifiers of the new passwords, set on every group.
struct Verifiers {
    superuser: String,
    replication: String,
}

/// Makes the new cluster: its shared files (settings, passwords, pgBackRest's configuration),
/// then each group from `sets[group]`, one after the other.
async fn build_all(
    layout: &Layout,
    config: Config,
    pg: &Pg,
    repository: &Path,
    sets: &[BackupInfo],
    target: &Target,
    progress: &TermProgress,
) -> anyhow::Result<Vec<Cluster>> {
    let secrets = Secrets::generate();
    // One verifier (one salt) per role on every group: the endpoint logs into each group with
    // the key a client proved on group 0.
    let verifiers = Verifiers {
        superuser: herd_pg::scram_verifier(&secrets.superuser),
        replication: herd_pg::scram_verifier(&secrets.replication),
    };
    for dir in [
        layout.root().to_path_buf(),
        layout.nodes(),
        layout.logs(),
        layout.run(),
    ] {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    crate::up::save_config(layout, &config)?;
    secrets.save(layout, REPLICATION_USER)?;
    pg.hand_over(layout.root())?;
    if let Some(user) = pg.os_user() {
        user.check_access(layout.root())?;
    }
    // The cluster's own pgBackRest configuration (its new repository, where it archives).
    crate::backup_setup::write_config(layout, &config, pg.os_user())?;
    let mut clusters = Vec::new();
    for (group, set) in sets.iter().enumerate() {
        let mut state = ClusterState::new_group(group as u32, config.cluster.replicas);
        // No synchronous standby until the replicas exist (commits would wait for them).
        state.sync_set.clear();
        let cluster = Cluster {
            layout: layout.for_group(group as u32),
            state,
            config: config.clone(),
            secrets: secrets.clone(),
        };
        clusters.push(build(cluster, pg, repository, set, target, &verifiers, progress).await?);
    }
    Ok(clusters)
}

/// Makes one group: pgBackRest restores its first node, PostgreSQL replays to the target and
/// promotes, the passwords are set, the replicas are cloned; everything is stopped at the end.
async fn build(
    cluster: Cluster,
    pg: &Pg,
    repository: &Path,
    set: &BackupInfo,
    target: &Target,
    verifiers: &Verifiers,
    progress: &TermProgress,
) -> anyhow::Result<Cluster> {
    let layout = &cluster.layout;
    let group = layout.group();
    let primary = cluster.state.primary.clone();
    let node_dir = layout.node(&primary);
    create_owned_dir(&node_dir, pg)?;
    // A configuration naming the source repository, for the restore and its restore_command.
    let source_conf = Paths::new(layout.root())
        .dir()
        .join(format!("restore-source-g{group}.conf"));
    let source_setup = Setup {
        paths: Paths::new(layout.root()),
        repository: repository.to_path_buf(),
        // A restore reads a repository directory (`--repository`, or the source's).
        s3: None,
        retention_full: cluster.config.backup.retention_full,
        stanzas: vec![Stanza {
            group,
            nodes: vec![PgNode {
                path: node_dir.clone(),
                port: cluster.port(&primary),
            }],
            socket_dir: cluster.socket_dir(),
        }],
    };
    source_setup.write_to(&source_conf, pg.os_user())?;

    progress.phase(&format!(
        "restoring backup {} into {primary} (pgBackRest)",
        set.label
    ));
    let mut args = vec![
        format!("--set={}", set.label),
        "--log-level-console=detail".to_string(),
        format!(
            "--recovery-option=restore_command={}",
            herd_backup::restore_command(&source_conf, group)
        ),
    ];
    args.extend(target.restore_args());
    let runner = Runner {
        config: source_conf.clone(),
        owner: pg.os_user().cloned(),
        password: None,
    };
    let step = crate::backup::percent_step();
    let mut shown = -1i64;
    runner
        .run(
            Some(&herd_backup::stanza(group)),
            "restore",
            &args,
            &mut |e| {
                if let Event::Copied(p) = e {
                    if p as i64 >= shown + step {
                        shown = p as i64 / step * step;
                        progress.phase(&format!("restoring files: {shown}%"));
                    }
                }
            },
        )
        .context("pgbackrest restore")?;
    progress.done(&format!("backup {} restored into {primary}", set.label));

    progress.phase("replaying the archived WAL to the target, then promoting");
    recover(&cluster, pg, verifiers).await?;
    let _ = std::fs::remove_file(&source_conf);
    progress.done("recovered to the target and promoted; passwords set");

    cluster.start_node(pg, &primary).await?;
    if let Err(e) = crate::backup_setup::create_stanza(layout, &cluster.config, pg.os_user(), group)
    {
        // The cluster is whole without it; `herd up` creates the stanza again.
        eprintln!("warning: {e:#}\n(`herd up` tries again)");
    }
    cluster.clone_replicas(pg, progress).await?;
    let mut cluster = cluster;
    cluster.apply_commit_settings(pg).await?;
    cluster.stop_all(pg, progress).await?;
    Ok(cluster)
}

/// Starts the restored primary with only its superuser admitted, on the private socket and
/// without a password (the old passwords are unknown here), waits until recovery reached the
/// target and promoted, resets the recovery settings, sets the new passwords, and stops it.
async fn recover(cluster: &Cluster, pg: &Pg, verifiers: &Verifiers) -> anyhow::Result<()> {
    let primary = &cluster.state.primary;
    let dir = cluster.layout.node(primary);
    cluster.write_conf(pg, primary)?;
    // The socket directory is mode 0700 and the servers' OS user's: only that user (and
    // root) can reach this server while it trusts its superuser; no TCP login is admitted.
    let hba = dir.join("pg_hba.conf");
    std::fs::write(&hba, format!("local all {SUPERUSER} trust\n"))
        .with_context(|| format!("writing {}", hba.display()))?;
    pg.hand_over(&hba)?;
    let log = cluster.layout.node_log(primary);
    // Replaying a long archive can take a while; pg_ctl waits until connections are accepted.
    pg.start_within(&dir, &log, 3600).await?;
    let socket = cluster.socket_dir().context("no socket directory")?;
    let spec = herd_pg::ConnSpec {
        host: socket.display().to_string(),
        port: cluster.port(primary),
        user: SUPERUSER.into(),
        password: String::new(),
        dbname: "postgres".into(),
        timeout: Duration::from_secs(10),
        tls: None,
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(3600);
    let client = loop {
        if herd_pg::postmaster_pid(&dir)?.is_none() {
            bail!(
                "the restored server stopped during recovery; last lines of {}:\n{}",
                log.display(),
                herd_pg::log_tail(&log, 15)
            );
        }
        if let Ok(client) = herd_pg::connect(&spec).await {
            let in_recovery = client
                .query_one("select pg_is_in_recovery()", &[])
                .await
                .map(|r| r.get::<_, bool>(0))
                .unwrap_or(true);
            if !in_recovery {
                break client;
            }
        }
        if std::time::Instant::now() >= deadline {
            bail!(
                "recovery did not finish within an hour; see {}",
                log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for setting in RECOVERY_SETTINGS {
        client
            .batch_execute(&format!("ALTER SYSTEM RESET {setting}"))
            .await
            .with_context(|| format!("resetting {setting}"))?;
    }
    herd_pg::ensure_role_verifier(&client, SUPERUSER, &verifiers.superuser, false).await?;
    herd_pg::ensure_role_verifier(&client, REPLICATION_USER, &verifiers.replication, true).await?;
    drop(client);
    pg.stop(&dir, StopMode::Fast).await?;
    Ok(())
}

fn create_owned_dir(dir: &Path, pg: &Pg) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    pg.hand_over(dir)?;
    Ok(())
}

/// Undoes a failed restore: stops any server it started and removes what it wrote (the whole
/// directory when the restore created it).
async fn discard(layout: &Layout, pg: &Pg, created: bool) {
    if let Ok(entries) = std::fs::read_dir(layout.nodes()) {
        for entry in entries.flatten() {
            if matches!(herd_pg::postmaster_pid(&entry.path()), Ok(Some(_))) {
                let _ = pg.stop(&entry.path(), StopMode::Immediate).await;
            }
        }
    }
    if created {
        let _ = std::fs::remove_dir_all(layout.root());
    } else if let Ok(entries) = std::fs::read_dir(layout.root()) {
        for entry in entries.flatten() {
            let path = entry.path();
            let _ = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
        }
    }
}
