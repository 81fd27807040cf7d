//! `herd group add`: a new shard group while the cluster runs. The CLI asks the running `herd
//! up` (`POST /groups`); there the group's agents start and create it (initdb, base backups),
//! it is recorded in herd.toml, and the endpoint admits it (`group_add_agents.rs`). The group
//! holds no shard until `herd shards rebalance` moves some there.

use anyhow::Context;
use herd_cluster::{Layout, Progress};

/// Asks the running `herd up` for a new group and prints what it did.
pub async fn run(layout: &Layout) -> anyhow::Result<()> {
    let progress = crate::progress::TermProgress::new();
    progress.phase("adding a shard group: creating its servers, then giving it the tables");
    let answer = crate::admin::request_text(layout, "/groups".into()).await;
    drop(progress);
    let answer = answer.context("adding a shard group failed")?;
    crate::output::emitln!("{answer}");
    Ok(())
}

/// The operator's answer once group `g` is admitted (its primary's port and replica count
/// when known).
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
