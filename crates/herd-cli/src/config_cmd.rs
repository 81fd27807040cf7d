//! `herd config set`: change the commit mode, sync quorum or WAL compression of a (running)
//! cluster, for every shard group or (`--group G`) for one.

use herd_cluster::Layout;
use herd_config::Config;

pub async fn set(
    layout: &Layout,
    group: Option<u32>,
    key: &str,
    value: &str,
) -> anyhow::Result<()> {
    set_on_agents(layout, group, key, value).await
}

/// herd.toml first (the next `herd up` records it in the store), then, while the cluster runs,
/// the store through its API, so the agents apply it (the servers' files are theirs to write).
async fn set_on_agents(
    layout: &Layout,
    group: Option<u32>,
    key: &str,
    value: &str,
) -> anyhow::Result<()> {
    crate::status::open(layout)?;
    let mut config = Config::load(&layout.config())?;
    match group {
        Some(g) => config.set_for_group(g, key, value)?,
        None => config.set(key, value)?,
    };
    std::fs::write(layout.config(), herd_config::render(&config))?;
    if herd_cluster::read_supervisor(layout).is_none() {
        crate::output::emitln!("{key} = {value} written to herd.toml; `herd up` applies it");
        return Ok(());
    }
    let mut path = format!("/config?key={}&value={}", query(key), query(value));
    if let Some(g) = group {
        path.push_str(&format!("&group={g}"));
    }
    let text = crate::admin::request_text(layout, path).await?;
    if !matches!(key, "commit-mode" | "sync-standbys") {
        crate::output::emitln!("{}", text.trim_end());
        return Ok(());
    }
    // The agents apply the record in their next round: answered once each primary runs with
    // it, in the words of the supervisor engine.
    let shards = config.cluster.shards;
    for (g, cluster) in herd_cluster::open_groups(layout, &config)?
        .into_iter()
        .enumerate()
        .filter(|(g, _)| group.is_none_or(|x| x as usize == *g))
    {
        let names = applied(&cluster).await?;
        let c = &cluster.config.cluster;
        let which = if shards > 1 {
            format!("shard group {g}: ")
        } else {
            String::new()
        };
        crate::output::emitln!(
            "{which}commit mode {} with {} applied: synchronous_commit = {}, synchronous_standby_names = '{}'",
            c.commit_mode,
            c.sync_standbys,
            c.commit_mode.synchronous_commit(),
            names
        );
    }
    Ok(())
}

/// How long the agents are given to apply a recorded commit setting.
const APPLY_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

/// Waits until the group's primary runs with its configured commit settings; its
/// `synchronous_standby_names`.
async fn applied(cluster: &herd_cluster::Cluster) -> anyhow::Result<String> {
    let c = &cluster.config.cluster;
    let commit = c.commit_mode.synchronous_commit();
    let method = c.sync_standbys.to_string();
    let deadline = tokio::time::Instant::now() + APPLY_WAIT;
    let mut seen = String::new();
    while tokio::time::Instant::now() < deadline {
        // The projection names the primary of the moment (it may change meanwhile).
        let state = herd_cluster::ClusterState::load(&cluster.layout.state())?;
        let primary = state.map_or(cluster.state.primary.clone(), |s| s.primary);
        if let Ok(client) = herd_pg::connect(&cluster.conn_spec(&primary)).await {
            let show = |name: &'static str| {
                let client = &client;
                async move {
                    client
                        .query_one(&format!("show {name}"), &[])
                        .await
                        .map(|r| r.get::<_, String>(0))
                        .unwrap_or_default()
                }
            };
            let (now, names) = (
                show("synchronous_commit").await,
                show("synchronous_standby_names").await,
            );
            let standbys_ok =
                c.commit_mode == herd_core::CommitMode::Async || names.starts_with(&method);
            if now == commit && standbys_ok {
                return Ok(names);
            }
            seen = format!("synchronous_commit = {now}, synchronous_standby_names = '{names}'");
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    anyhow::bail!(
        "recorded, but group {}'s primary did not apply it within {} s ({seen}); see the log",
        cluster.group(),
        APPLY_WAIT.as_secs()
    )
}

/// `text` percent-encoded for a query string.
fn query(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
