//! `herd restart --dcs …`: restarts of a multi-host group's servers through the store. A
//! replica is asked with a request (`requests/<name>`); its agent takes it up, leaves the read
//! pool (its record says `restarting`), stops and starts its server, and streams again. A whole
//! group: every replica in turn, then a switchover to one of them, then the former primary, so
//! the group always has a primary and every restart happens out of the read pool.

use std::time::{Duration, Instant};

use herd_agent::member::{encode, request_key, Request};
use herd_agent::store::StoreClient;

/// Longest wait for one member's restart (the request taken up, the server streaming again).
const ONE_RESTART: Duration = Duration::from_secs(90);

/// Restarts `node` (a replica), or with `None` every server of the group, the primary last
/// through a switchover. What happened, for the caller to print.
pub async fn restart(store: &StoreClient, node: Option<String>) -> anyhow::Result<String> {
    let read = store.read().await.map_err(anyhow::Error::msg)?;
    let leader = read.store.leader.clone();
    match node {
        Some(n) => {
            let Some(m) = read.store.members.iter().find(|m| m.name == n) else {
                anyhow::bail!("{n} is not a member with a heartbeat in the store");
            };
            if leader.as_deref() == Some(n.as_str()) {
                anyhow::bail!(
                    "{n} is the primary: restart it through `herd switchover` first, or restart the \
                     whole group (without --node: the primary goes last, through a switchover)"
                );
            }
            if m.role != "replica" {
                anyhow::bail!("{n} is {} (only a running replica restarts)", m.role);
            }
            restart_one(store, &n).await?;
            Ok(format!("{n} restarted"))
        }
        None => {
            let Some(leader) = leader else {
                anyhow::bail!("no member leads the group now; restart it once one does");
            };
            let replicas: Vec<String> = read
                .store
                .members
                .iter()
                .filter(|m| m.role == "replica" && m.name != leader)
                .map(|m| m.name.clone())
                .collect();
            if replicas.is_empty() {
                anyhow::bail!(
                    "{leader} has no replica: restarting the group would leave it without a primary"
                );
            }
            for r in &replicas {
                restart_one(store, r).await?;
            }
            crate::hosts_admin::hand_over(store, Some(replicas[0].clone()), false, false).await?;
            wait_streaming(store, &leader, false).await?;
            restart_one(store, &leader).await?;
            Ok(format!(
                "restarted {} and {leader} (now a replica; {} leads)",
                replicas.join(", "),
                replicas[0]
            ))
        }
    }
}

/// Asks `name` to restart and waits until it took the request up and streams again.
async fn restart_one(store: &StoreClient, name: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    let key = request_key(name);
    let request = Request {
        id: herd_core::unix_ms().to_string(),
        kind: "restart".into(),
        done: false,
    };
    let dcs = store.dcs();
    tokio::task::spawn_blocking(move || {
        let revision = dcs.get(&key)?.map_or(0, |v| v.revision);
        dcs.compare_and_set(&key, revision, encode(&request))
    })
    .await?
    .map_err(|e| anyhow::anyhow!("{e} (another restart of {name} in progress?)"))?;
    eprintln!("restart: asked {name} …");
    wait_streaming(store, name, true).await?;
    crate::output::emitln!(
        "restart of {name} done in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Waits until `name` is a streaming replica again; with `after_restart`, only once its request
/// was taken up and it was seen out of the read pool (or its request is done and it streams,
/// for a restart quicker than a poll).
async fn wait_streaming(
    store: &StoreClient,
    name: &str,
    after_restart: bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + ONE_RESTART;
    let mut seen_leaving = !after_restart;
    loop {
        if let Ok(read) = store.read().await {
            let pending = read.store.restarts.iter().any(|r| r == name);
            if let Some(m) = read.store.members.iter().find(|m| m.name == name) {
                if m.role == "restarting" {
                    seen_leaving = true;
                }
                let streams = m.role == "replica" && m.streaming_from.is_some();
                if streams && !pending && seen_leaving {
                    return Ok(());
                }
            }
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "{name} did not stream again within {} s (see its agent's log)",
                ONE_RESTART.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
