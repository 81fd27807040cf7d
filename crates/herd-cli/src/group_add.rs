//! `herd group add`: a new shard group while the cluster runs. The CLI asks the supervisor
//! (`POST /groups`); the supervisor creates the group's servers (initdb, base backups, like
//! `herd up` does), records it in herd.toml, starts its supervisor, and has the endpoint admit
//! it (`ProxyContext::admit_group`: roles, databases, tables, reference rows, map). The group
//! holds no shard until `herd shards rebalance` moves some there.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use herd_cluster::{Cluster, ClusterState, Layout, Progress};
use herd_config::Config;

use crate::groups::GroupSet;

/// Client side: asks the running supervisor for a new group and prints what it did.
pub async fn run(layout: &Layout) -> anyhow::Result<()> {
    let progress = crate::progress::TermProgress::new();
    progress.phase("adding a shard group: creating its servers, then giving it the tables");
    let answer = crate::admin::request_text(layout, "/groups".into()).await;
    drop(progress);
    let answer = answer.context("adding a shard group failed")?;
    crate::output::emitln!("{answer}");
    Ok(())
}

/// Supervisor side: creates, starts and admits the next group; the answer for the operator
/// (also on the dashboard's timeline).
pub async fn add(set: &Arc<GroupSet>, layout: &Layout) -> anyhow::Result<String> {
    let _one_at_a_time = set.adding.lock().await;
    let outcome = add_next(set, layout).await;
    let group = set.running().len().saturating_sub(1) as u32;
    let text = match &outcome {
        Ok(text) => text.lines().next().unwrap_or_default().to_string(),
        Err(e) => format!("adding a shard group failed: {e:#}"),
    };
    set.event(herd_core::ClusterEvent::now(
        group,
        herd_core::EventKind::GroupAdded,
        None,
        text,
        outcome.is_ok(),
    ));
    outcome
}

async fn add_next(set: &Arc<GroupSet>, layout: &Layout) -> anyhow::Result<String> {
    let runtime = set
        .runtime()
        .context("the supervisor is still starting; retry in a moment")?;
    let proxy = runtime.proxy.clone();
    let next = set.running().len() as u32;
    if proxy.groups() < next {
        // Created earlier, but its admission did not finish: finish it.
        let g = proxy.groups();
        let admitted = proxy
            .admit_group(g)
            .await
            .with_context(|| format!("admitting shard group {g} to the endpoint"))?;
        return Ok(summary(g, None, &admitted));
    }
    let mut config = Config::load(&layout.config())?;
    if next >= herd_config::MAX_SHARDS {
        bail!(
            "the cluster has {next} shard groups, the most one machine runs ({})",
            herd_config::MAX_SHARDS
        );
    }
    config.cluster.shards = next + 1;
    config
        .validate()
        .context("the new group's servers need ports past the last group's")?;
    let group_layout = layout.for_group(next);
    if group_layout.state().exists() {
        bail!(
            "shard group {next} already exists in {} but is not running: restart the cluster \
             (`herd down`, then `herd up`) to start it",
            layout.root().display()
        );
    }
    let progress = LogProgress { group: next };
    if config.backup.is_enabled() {
        // Before its servers start: their archive_command finds the group's stanza there.
        crate::backup_setup::write_config(layout, &config, runtime.pg.os_user())?;
    }
    let cluster =
        match Cluster::bootstrap(group_layout, config.clone(), &runtime.pg, &progress).await {
            Ok(c) => c,
            Err(e) => {
                remove_unfinished(layout, next, config.cluster.replicas);
                return Err(e).with_context(|| format!("creating shard group {next}"));
            }
        };
    // Recorded at once, so `herd up` resumes the group with the others from now on.
    crate::up::save_config(layout, &config)?;
    let timeout = Duration::from_secs(config.supervisor.ready_timeout_s);
    cluster
        .wait_ready(timeout, &progress)
        .await
        .with_context(|| format!("waiting for shard group {next}'s servers"))?;
    if config.backup.is_enabled() {
        if let Err(e) =
            crate::backup_setup::create_stanza(layout, &config, runtime.pg.os_user(), next)
        {
            // The group serves without it; `herd backup` creates it again.
            tracing::warn!(group = next, "creating the pgBackRest stanza: {e:#}");
        }
    }
    let first = herd_cluster::observe(&cluster).await.status;
    let primary_port = cluster.port(&cluster.state.primary);
    let replicas = cluster.state.replicas().len();
    let g = set
        .add(cluster, first)
        .context("the supervisor is still starting; retry in a moment")?;
    let admitted = proxy.admit_group(g).await.with_context(|| {
        format!(
            "shard group {g} runs but the endpoint does not use it yet: run `herd group add` \
             again to finish"
        )
    })?;
    Ok(summary(g, Some((primary_port, replicas)), &admitted))
}

pub(crate) fn summary(
    g: u32,
    servers: Option<(u16, usize)>,
    admitted: &herd_proxy::shards::Admitted,
) -> String {
    let servers = servers.map_or(String::new(), |(port, replicas)| {
        format!(" (primary on port {port}, {replicas} replica(s))")
    });
    format!(
        "shard group {g} added{servers}; {admitted}.\n\
         It holds no shard yet: `herd shards rebalance` moves some there online."
    )
}

/// Removes the node directories of a group whose creation failed (it never held data: its
/// topology file is written last, and is missing).
fn remove_unfinished(layout: &Layout, group: u32, replicas: u32) {
    let group_layout = layout.for_group(group);
    if group_layout.state().exists() {
        return;
    }
    for node in ClusterState::new_group(group, replicas).nodes {
        let dir = group_layout.node(&node);
        if dir.exists() {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "removing an unfinished node");
            }
        }
    }
}

/// The group's creation phases in the supervisor's log.
struct LogProgress {
    group: u32,
}

impl Progress for LogProgress {
    fn phase(&self, text: &str) {
        tracing::info!(group = self.group, "{text}");
    }
    fn done(&self, text: &str) {
        tracing::info!(group = self.group, "{text}");
    }
}
