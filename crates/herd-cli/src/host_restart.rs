//! `herd restart` of a whole group that has no replica, on the agent engine's one host: there
//! is no member to switch over to, so the primary restarts in place, as the supervisor engine
//! does it. Its server is stopped here (this host runs it); its agent sees no postmaster and,
//! with no other member to take over, starts it again in place, with herd.toml's settings as
//! of now (`herd copy`'s `wal_level = logical`). New transactions wait at the endpoint
//! meanwhile, bounded by the proxy's hold.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use herd_agent::store::StoreClient;
use herd_cluster::{Cluster, Layout};
use herd_config::Config;
use herd_core::NodeName;
use herd_pg::Pg;
use herd_proxy::ProxyContext;

/// Longest wait for the primary to serve again.
const BACK_WITHIN: Duration = Duration::from_secs(60);

/// Whether group `g` has a leader and no other member (a group restart cannot switch over).
pub async fn lone_leader(root: &StoreClient, g: u32) -> Result<Option<String>, String> {
    let store = StoreClient::new(herd_agent::groups::scoped(root.dcs(), g));
    let read = store.read().await?;
    let Some(leader) = read.store.leader.clone() else {
        return Ok(None);
    };
    let others = read.store.members.iter().any(|m| m.name != leader);
    Ok((!others).then_some(leader))
}

/// Restarts `leader`, group `g`'s only server, in place; what happened.
pub async fn restart(
    layout: &Layout,
    pg: &Pg,
    ctx: &Arc<ProxyContext>,
    g: u32,
    leader: &str,
) -> anyhow::Result<String> {
    let config = Config::load(&layout.config())?;
    let cluster = Cluster::open(layout.for_group(g), config)?;
    let name = NodeName::from_text(leader);
    let dir = layout.node(&name);
    let old_pid = herd_pg::postmaster_pid(&dir).ok().flatten();
    let began = Instant::now();
    ctx.set_paused(true);
    let outcome = async {
        // Not `pg_ctl stop -w`: the agent starts the server again as soon as the old one is
        // gone, and pg_ctl would then wait for the new one's pid file (CI saw it time out).
        pg.request_stop(&dir, herd_pg::StopMode::Fast)
            .await
            .with_context(|| format!("stopping {leader}"))?;
        loop {
            let pid = herd_pg::postmaster_pid(&dir).ok().flatten();
            if pid.is_some() && pid != old_pid {
                let status = herd_cluster::observe(&cluster).await.status;
                if status.primary().is_some_and(|p| p.name == name) {
                    return Ok(());
                }
            }
            if began.elapsed() > BACK_WITHIN {
                bail!(
                    "{leader} did not serve again within {} s; see {}",
                    BACK_WITHIN.as_secs(),
                    layout.node_log(&name).display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    .await;
    ctx.set_paused(false);
    outcome?;
    Ok(format!(
        "restarted the primary {leader} (no replica to switch over to; new transactions waited) in {:.1} s",
        began.elapsed().as_secs_f64()
    ))
}
