//! `herd config set`, `herd switchover` and `herd failover` against a multi-host cluster,
//! through its store (`--dcs … --cluster …`); `herd status` is in `hosts_status.rs`.

use std::time::{Duration, Instant};

use herd_agent::member::{encode, ClusterSettings, Handover, CONFIG, HANDOVER};
use herd_agent::store::{Read, StoreClient};

/// `herd config set --dcs … commit-mode|sync-standbys VALUE`: written with compare-and-set;
/// the primary's agent applies it on its next round.
pub async fn config_set(store: &StoreClient, key: &str, value: &str) -> anyhow::Result<()> {
    let dcs = store.dcs();
    let current = tokio::task::spawn_blocking(move || dcs.get(CONFIG)).await??;
    let (mut settings, revision) = match current {
        Some(v) => (
            herd_agent::member::decode::<ClusterSettings>(CONFIG, &v.value)
                .map_err(anyhow::Error::msg)?,
            v.revision,
        ),
        None => (ClusterSettings::default(), 0),
    };
    match key {
        "commit-mode" => settings.commit_mode = value.parse()?,
        "sync-standbys" => settings.sync_standbys = value.parse()?,
        "wal-compression" => {
            if !herd_config::WAL_COMPRESSIONS.contains(&value) {
                anyhow::bail!(
                    "invalid value for wal-compression: '{value}' (one of {})",
                    herd_config::WAL_COMPRESSIONS.join(", ")
                );
            }
            settings.wal_compression = Some(value.to_string());
        }
        other => anyhow::bail!(
            "{other} cannot be set on a multi-host cluster (commit-mode, sync-standbys or \
             wal-compression)"
        ),
    }
    store
        .write(CONFIG, revision, encode(&settings))
        .await
        .map_err(|e| anyhow::anyhow!("{e} (changed concurrently? run the command again)"))?;
    crate::output::emitln!(
        "{key} = {value} recorded; {} within a round",
        if key == "wal-compression" {
            "every member's agent applies it"
        } else {
            "the primary's agent applies it"
        }
    );
    Ok(())
}

/// `herd switchover|failover --dcs …`: asks the leader to step down and waits (60 s) for
/// another member to lead; cancels the request if none did. Answers the new leader and how
/// long the handover took.
pub async fn hand_over(
    store: &StoreClient,
    to: Option<String>,
    immediate: bool,
    allow_data_loss: bool,
) -> anyhow::Result<(String, Duration)> {
    let read = store.read().await.map_err(anyhow::Error::msg)?;
    let Some(from) = read.store.leader.clone() else {
        anyhow::bail!("no member holds the leader lease now; the agents elect one on their own");
    };
    if let Some(t) = &to {
        let target = read.store.members.iter().find(|m| m.name == *t);
        match target {
            None => anyhow::bail!("{t} is not a member with a heartbeat in the store"),
            Some(m) if m.role != "replica" => {
                anyhow::bail!("{t} is {} (a switchover needs a running replica)", m.role)
            }
            Some(_) if *t == from => anyhow::bail!("{t} already leads"),
            Some(_) => {}
        }
        // A failover does not wait for the target to catch up (a switchover does): refuse at
        // once a target the agents would not promote, rather than after their 60 s wait.
        if immediate {
            herd_agent::verbs::check_failover_target(&read.store, t, allow_data_loss)
                .map_err(anyhow::Error::msg)?;
        }
    } else if !read.store.members.iter().any(|m| m.role == "replica") {
        anyhow::bail!("no replica to hand over to");
    }
    let request = Handover {
        from: from.clone(),
        to: to.clone(),
        immediate,
        allow_data_loss,
        done: false,
    };
    store
        .write(HANDOVER, read.handover_revision, encode(&request))
        .await
        .map_err(|e| anyhow::anyhow!("{e} (another switchover in progress?)"))?;
    let started = Instant::now();
    let what = if immediate { "failover" } else { "switchover" };
    eprintln!(
        "{what}: asked {from} to step down{} …",
        to.as_deref()
            .map(|t| format!(" for {t}"))
            .unwrap_or_default()
    );
    while started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let Ok(now) = store.read().await else {
            continue;
        };
        if let Some(leader) = led_by_other(&now, &from) {
            let took = started.elapsed();
            crate::output::emitln!("{what} to {leader} done in {:.1} s", took.as_secs_f64());
            return Ok((leader, took));
        }
    }
    // Nobody took over: cancel, so the normal election resumes (the old leader included).
    if let Ok(now) = store.read().await {
        if now.store.handover.is_some() {
            let cancelled = Handover {
                done: true,
                ..request
            };
            let _ = store
                .write(HANDOVER, now.handover_revision, encode(&cancelled))
                .await;
        }
    }
    anyhow::bail!(
        "no member took over within 60 s; the request was cancelled (see the agents' logs)"
    )
}

fn led_by_other(read: &Read, from: &str) -> Option<String> {
    let leader = read.store.leader.as_deref()?;
    let primary = read
        .store
        .members
        .iter()
        .any(|m| m.name == leader && m.role == "primary");
    (leader != from && primary).then(|| leader.to_string())
}
