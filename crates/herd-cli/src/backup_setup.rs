//! pgBackRest's set-up for a one-host cluster with `[backup]`: its configuration (every node of
//! each shard group) and the stanzas, written by `herd up` and refreshed by `herd backup`.

use anyhow::Context;
use herd_backup::{Paths, PgNode, Runner, S3Repo, Setup, Stanza};
use herd_cluster::{ClusterState, Layout, Secrets};
use herd_config::Config;
use herd_pg::OsUser;

/// The pgBackRest configuration of the cluster in `layout`: every node of each group, from its
/// recorded topology (a group not created yet: the nodes bootstrap makes). Which node is
/// primary does not matter: pgBackRest finds it.
pub fn setup(layout: &Layout, config: &Config) -> anyhow::Result<Setup> {
    let groups = herd_cluster::existing_groups(layout).max(config.cluster.shards);
    let mut stanzas = Vec::new();
    for g in 0..groups {
        let state = ClusterState::load(&layout.for_group(g).state())?
            .unwrap_or_else(|| ClusterState::new_group(g, config.cluster.replicas));
        let sockets = layout.sockets();
        let group_layout = layout.for_group(g);
        stanzas.push(Stanza {
            group: g,
            nodes: state
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| PgNode {
                    path: group_layout.node(n),
                    port: config.group_node_port(g, i),
                })
                .collect(),
            socket_dir: herd_pg::socket_dir_fits(&sockets).then_some(sockets),
        });
    }
    let s3 = s3_repo(&config.backup, layout.root())?;
    Ok(Setup {
        paths: Paths::new(layout.root()),
        repository: match s3 {
            Some(_) => config.backup.s3_path().into(),
            None => config.backup.repository_path(layout.root()),
        },
        s3,
        retention_full: config.backup.retention_full,
        stanzas,
    })
}

/// `[backup.s3]` as pgBackRest's settings, the access key read from its credentials file
/// (relative to `base`, herd.toml's directory); `None` for a repository directory.
pub fn s3_repo(
    backup: &herd_config::BackupConfig,
    base: &std::path::Path,
) -> anyhow::Result<Option<S3Repo>> {
    let Some(s3) = &backup.s3 else {
        return Ok(None);
    };
    let file = base.join(&s3.credentials_file);
    let text = std::fs::read_to_string(&file).with_context(|| {
        format!(
            "reading backup.s3.credentials_file {} (the access key id, then the secret)",
            file.display()
        )
    })?;
    let Some((key, key_secret)) = herd_config::parse_credentials(&text) else {
        anyhow::bail!(
            "{} must hold two lines: the S3 access key id, then the secret key",
            file.display()
        );
    };
    Ok(Some(S3Repo {
        bucket: s3.bucket.clone(),
        endpoint: s3.endpoint.clone(),
        region: s3.region.clone(),
        uri_style: s3.uri_style.clone(),
        key,
        key_secret,
        verify_tls: s3.verify_tls,
    }))
}

/// Runs pgBackRest with the cluster's configuration as the servers' OS user, with the
/// superuser's password for the commands that connect.
pub fn runner(layout: &Layout, owner: Option<&OsUser>) -> anyhow::Result<Runner> {
    let secrets = Secrets::load(layout)?;
    Ok(Runner {
        config: Paths::new(layout.root()).config(),
        owner: owner.cloned(),
        password: Some(secrets.superuser),
    })
}

/// Writes pgbackrest.conf (before the servers start: their `archive_command` reads it).
pub fn write_config(
    layout: &Layout,
    config: &Config,
    owner: Option<&OsUser>,
) -> anyhow::Result<()> {
    setup(layout, config)?
        .write(owner)
        .context("writing pgBackRest's configuration")
}

/// `pgbackrest stanza-create` for each group: creates the stanza in the repository, or checks
/// that the existing one belongs to this cluster (it is idempotent), so a cluster that turns
/// [backup] on later gets its stanza at its next `herd up`.
pub fn create_stanzas(
    layout: &Layout,
    config: &Config,
    owner: Option<&OsUser>,
) -> anyhow::Result<()> {
    for g in 0..setup(layout, config)?.stanzas.len() as u32 {
        create_stanza(layout, config, owner, g)?;
    }
    Ok(())
}

/// `pgbackrest stanza-create` for shard group `group` (see [`create_stanzas`]).
pub fn create_stanza(
    layout: &Layout,
    config: &Config,
    owner: Option<&OsUser>,
    group: u32,
) -> anyhow::Result<()> {
    let setup = setup(layout, config)?;
    let runner = runner(layout, owner)?;
    for s in setup.stanzas.iter().filter(|s| s.group == group) {
        if s.socket_dir.is_none() {
            anyhow::bail!(
                "the data directory's path is too long for the servers' Unix-domain sockets, \
                 which pgBackRest needs: choose a shorter --data-dir to use backups"
            );
        }
        let name = herd_backup::stanza(s.group);
        runner
            .run(Some(&name), "stanza-create", &[], &mut |_| {})
            .with_context(|| format!("creating the pgBackRest stanza {name}"))?;
    }
    Ok(())
}
