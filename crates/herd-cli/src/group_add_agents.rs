//! `herd group add` and `herd up --shards N` (a larger N) on the agent engine: the new
//! group's agents start in the running host (`Host::add_group`, its node 0 creating it), the
//! endpoint follows it through the store, and once its servers run the endpoint admits it
//! (`ProxyContext::admit_group`: roles, databases, tables, reference rows, map) exactly as
//! with the supervisor engine (`group_add.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use herd_agent::host::Host;
use herd_agent::store::StoreClient;
use herd_cluster::{Cluster, Layout};
use herd_config::Config;
use herd_core::{ClusterEvent, EventKind};
use herd_proxy::ProxyContext;
use tokio::sync::watch;

use crate::proxy_groups::Holds;

/// What adding a group needs from the running `herd up`.
pub struct AgentGroups {
    /// The agents.
    pub host: Arc<Host>,
    /// The data directory.
    pub layout: Layout,
    /// The store's root.
    pub root: StoreClient,
    /// The endpoint.
    pub ctx: Arc<ProxyContext>,
    /// The endpoint's switchover holds (a new group's follower joins them).
    pub holds: Arc<Holds>,
    /// Turns true when the cluster stops.
    pub shutdown: watch::Receiver<bool>,
    /// One addition at a time.
    pub adding: tokio::sync::Mutex<()>,
    /// The servers' OS user (pgBackRest runs as it).
    pub owner: Option<herd_pg::OsUser>,
}

impl AgentGroups {
    /// Has the endpoint follow group `g` (created with the cluster's others or just added),
    /// waiting (within `timeout`) until it knows the group's leader.
    pub async fn follow(&self, g: u32, timeout: Duration) -> anyhow::Result<u32> {
        let (rx, follower) = crate::proxy_groups::group(&self.root, g).await;
        let mut leader = rx.clone();
        let number = self.ctx.add_group(rx, self.shutdown.clone());
        crate::proxy_groups::spawn(follower, &self.holds, self.shutdown.clone());
        crate::up_agents::leads(&mut leader, timeout)
            .await
            .with_context(|| format!("shard group {g}"))?;
        // Admission talks to the primary the endpoint's view names (a poll after the lead).
        let deadline = Instant::now() + timeout;
        while self.ctx.view_of(number).primary.is_none() {
            if Instant::now() >= deadline {
                bail!(
                    "the endpoint did not reach shard group {g}'s primary within {} s",
                    timeout.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(number)
    }

    /// Admits group `g`, whose servers run and which the endpoint follows; the operator's
    /// answer, also put on the timeline.
    pub async fn admit(&self, g: u32, servers: Option<(u16, usize)>) -> anyhow::Result<String> {
        let outcome = self
            .ctx
            .admit_group(g)
            .await
            .with_context(|| {
                format!(
                    "shard group {g} runs but the endpoint does not use it yet: run `herd group \
                     add` again to finish"
                )
            })
            .map(|admitted| crate::group_add::summary(g, servers, &admitted));
        let text = match &outcome {
            Ok(text) => text.lines().next().unwrap_or_default().to_string(),
            Err(e) => format!("adding a shard group failed: {e:#}"),
        };
        let store = StoreClient::new(herd_agent::groups::scoped(self.root.dcs(), g));
        let event = ClusterEvent::now(g, EventKind::GroupAdded, None, text, outcome.is_ok());
        herd_agent::events::record(&store, "herd", event);
        outcome
    }

    /// `herd group add` (`POST /groups`): creates the next group, waits for its servers and
    /// admits it.
    pub async fn add(&self) -> anyhow::Result<String> {
        let _one_at_a_time = self.adding.lock().await;
        let mut config = Config::load(&self.layout.config())?;
        let next = config.cluster.shards.max(1);
        if self.ctx.groups() < next {
            // Created earlier, but its admission did not finish: finish it (following it
            // first when its creation was cut before the endpoint followed it).
            let g = self.ctx.groups();
            if self.ctx.known_groups() <= g {
                let timeout = Duration::from_secs(config.supervisor.ready_timeout_s);
                wait_created(&self.layout, &config, g, timeout).await?;
                self.follow(g, timeout).await?;
            }
            return self.admit(g, None).await;
        }
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
        if config.backup.is_enabled() {
            // Before its servers start: the pgBackRest configuration names the group's stanza
            // (its servers' archive_command and the stanza's creation below read it).
            crate::backup_setup::write_config(&self.layout, &config, self.owner.as_ref())?;
        }
        let g = self
            .host
            .add_group(&config)
            .await
            .with_context(|| format!("starting shard group {next}'s agents"))?;
        // Recorded at once, so `herd up` resumes the group with the others from now on.
        crate::up::save_config(&self.layout, &config)?;
        let timeout = Duration::from_secs(config.supervisor.ready_timeout_s);
        let cluster = wait_created(&self.layout, &config, g, timeout).await?;
        if config.backup.is_enabled() {
            // Its servers archive from their first start (herd.toml's `[backup]`); its stanza
            // makes the archive and its backups (scheduled ones included) work.
            let (layout, owner) = (self.layout.clone(), self.owner.clone());
            let with = config.clone();
            let made = tokio::task::spawn_blocking(move || {
                crate::backup_setup::create_stanza(&layout, &with, owner.as_ref(), g)
            })
            .await;
            match made {
                Ok(Ok(())) => {}
                // The group serves without it; `herd backup` creates it again.
                Ok(Err(e)) => tracing::warn!(group = g, "creating the pgBackRest stanza: {e:#}"),
                Err(e) => tracing::warn!(group = g, "creating the pgBackRest stanza: {e}"),
            }
        }
        self.follow(g, timeout).await?;
        let primary_port = cluster.port(&cluster.state.primary);
        let replicas = cluster.state.replicas().len();
        self.admit(g, Some((primary_port, replicas))).await
    }
}

/// Waits (within `timeout`) until group `g` has a primary and its replicas stream.
pub async fn wait_created(
    layout: &Layout,
    config: &Config,
    g: u32,
    timeout: Duration,
) -> anyhow::Result<Cluster> {
    let deadline = Instant::now() + timeout;
    let group = layout.for_group(g);
    while !group.state().exists() {
        if Instant::now() >= deadline {
            bail!(
                "shard group {g} had no primary after {} s; see the server logs in {}",
                timeout.as_secs(),
                layout.logs().display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cluster = Cluster::open(group, config.clone())?;
    let left = deadline.saturating_duration_since(Instant::now());
    cluster
        .wait_ready(left, &herd_cluster::SilentProgress)
        .await
        .with_context(|| format!("waiting for shard group {g}'s servers"))?;
    Ok(cluster)
}
