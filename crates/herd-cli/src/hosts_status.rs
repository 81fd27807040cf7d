//! `herd status --dcs …`: the members as their agents last published them in the store.
//!
//! While the store is unreachable (etcd down, or its quorum lost) the command still answers:
//! it says which etcd endpoints answer, then asks each agent's API for its member record
//! (`/member`), at the addresses of the last good read (kept in
//! `$XDG_STATE_HOME/herd/<cluster>.json`, else `~/.local/state/herd/<cluster>.json`) or given
//! with `--agent-api`. Those rows are marked as coming from the agents, and the command exits
//! with code 2 ([`StoreUnreachable`]), so scripts can tell a degraded answer from a good one.

use std::path::PathBuf;
use std::time::Duration;

use herd_agent::member::Member;
use herd_agent::store::Read;
use serde::{Deserialize, Serialize};

use crate::hosts::StoreArgs;

/// How long an agent's API may take to answer `/member`.
const AGENT_TIMEOUT: Duration = Duration::from_secs(2);

/// What marks rows read from the agents rather than from the store.
const FROM_AGENT: &str = "from the agent; store unreachable";

/// `herd status` answered, but from the agents: the store did not (exit code 2).
#[derive(Debug)]
pub struct StoreUnreachable;

impl std::fmt::Display for StoreUnreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the store is unreachable: the members above are as their agents report them")
    }
}

impl std::error::Error for StoreUnreachable {}

/// `herd status --dcs …`.
/// The key the agents' APIs of the cluster whose secrets are in `layout` answer to; `None`
/// when that directory holds no secrets.
pub fn api_key(layout: &herd_cluster::Layout) -> Option<herd_agent::api::ApiKey> {
    let password = std::fs::read_to_string(layout.secrets().join("superuser.password")).ok()?;
    Some(herd_agent::api::ApiKey::from_password(password.trim()))
}

pub async fn status(
    store: &StoreArgs,
    json: bool,
    agent_apis: &[String],
    key: Option<herd_agent::api::ApiKey>,
) -> anyhow::Result<()> {
    match read_groups(store).await {
        Ok((reads, wide)) => {
            if let Some(cluster) = &store.cluster {
                let members: Vec<Member> = reads
                    .iter()
                    .flat_map(|r| r.store.members.iter().cloned())
                    .collect();
                remember_agents(cluster, &members);
            }
            print_groups(&reads, &wide, json)
        }
        Err(e) => from_agents(store, json, agent_apis, key, e).await,
    }
}

/// What the store says beyond each group's keys: the agent holding the coordinator lease and
/// the registered proxies (id and listen address).
struct ClusterWide {
    coordinator: Option<String>,
    proxies: Vec<(String, String)>,
}

/// Every shard group's keys, group 0 first, and what is cluster-wide.
async fn read_groups(store: &StoreArgs) -> anyhow::Result<(Vec<Read>, ClusterWide)> {
    let root = store.open().await?;
    let dcs = root.dcs();
    let wide = tokio::task::spawn_blocking(move || -> Result<ClusterWide, herd_dcs::DcsError> {
        let coordinator = dcs.lease_holder(herd_agent::coordinator::COORDINATOR)?;
        let proxies = dcs
            .list(herd_dcs::PROXIES)?
            .into_iter()
            .map(|(key, v)| {
                let listen = serde_json::from_slice::<serde_json::Value>(&v.value)
                    .ok()
                    .and_then(|j| j["listen"].as_str().map(str::to_string))
                    .unwrap_or_default();
                (
                    key.trim_start_matches(herd_dcs::PROXIES).to_string(),
                    listen,
                )
            })
            .collect();
        Ok(ClusterWide {
            coordinator,
            proxies,
        })
    })
    .await??;
    let count = herd_agent::groups::count(&root)
        .await
        .map_err(anyhow::Error::msg)?
        .unwrap_or(1);
    let mut reads = Vec::new();
    for g in 0..count {
        let client = herd_agent::store::StoreClient::new(herd_agent::groups::scoped(root.dcs(), g));
        reads.push(client.read().await.map_err(anyhow::Error::msg)?);
    }
    Ok((reads, wide))
}

/// One group's JSON document.
fn group_doc(read: &Read) -> serde_json::Value {
    let s = &read.store;
    serde_json::json!({
        "leader": s.leader,
        "members": s.members,
        "sync_set": s.sync_set,
        "settings": s.settings,
        "handover": s.handover,
        "archiving": archiving(read),
    })
}

/// The group primary's WAL archiving as its agent read it (`[backup]` on), as `herd status`
/// shows it on one host.
fn archiving(read: &Read) -> Option<&herd_core::ArchiveStatus> {
    let s = &read.store;
    s.members
        .iter()
        .find(|m| s.leader.as_deref() == Some(m.name.as_str()) && m.role == "primary")
        .and_then(|m| m.archiving.as_ref())
}

/// Group 0 as the document always was (its fields at the top), and with several groups a
/// `groups` list of every group's; in text, one block per group.
fn print_groups(reads: &[Read], wide: &ClusterWide, json: bool) -> anyhow::Result<()> {
    let coordinator = wide.coordinator.as_deref();
    if json {
        let mut doc = reads.first().map(group_doc).unwrap_or_default();
        if reads.len() > 1 {
            doc["groups"] = reads.iter().map(group_doc).collect();
        }
        doc["coordinator"] = coordinator.into();
        doc["proxies"] = wide
            .proxies
            .iter()
            .map(|(id, listen)| serde_json::json!({ "id": id, "listen": listen }))
            .collect();
        crate::output::emitln!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    for (g, read) in reads.iter().enumerate() {
        if reads.len() > 1 {
            if g > 0 {
                crate::output::emitln!("");
            }
            crate::output::emitln!("shard group {g}");
        }
        print_store(read)?;
    }
    if reads.len() > 1 {
        crate::output::emitln!(
            "\ncoordinator (two-phase work left in doubt): {}",
            coordinator.unwrap_or("none yet")
        );
    }
    let proxies: Vec<String> = wide
        .proxies
        .iter()
        .map(|(id, listen)| format!("{listen} ({id})"))
        .collect();
    crate::output::emitln!(
        "proxies: {}",
        if proxies.is_empty() {
            "none registered".to_string()
        } else {
            proxies.join(", ")
        }
    );
    Ok(())
}

fn print_store(read: &Read) -> anyhow::Result<()> {
    let s = &read.store;
    crate::output::emitln!(
        "leader: {}   commit mode: {} ({})   recorded sync set: [{}]",
        s.leader.as_deref().unwrap_or("none"),
        s.settings.commit_mode.as_str(),
        s.settings.sync_standbys,
        s.sync_set.join(", ")
    );
    header();
    for m in &s.members {
        row(m, "");
    }
    if s.members.is_empty() {
        crate::output::emitln!("(no member has published a heartbeat; are the agents running?)");
    }
    if let Some(a) = archiving(read) {
        crate::output::emit!("{}", crate::status::archive_lines(a));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    for line in herd_agent::status::certificate_lines(&s.members, now) {
        crate::output::emitln!("{line}");
    }
    if let Some(line) = herd_agent::rotation::status_line(&s.members) {
        crate::output::emitln!("{line}");
    }
    Ok(())
}

fn header() {
    crate::output::emitln!(
        "{:<12} {:<12} {:<22} {:<14} {:<14} {:<12} {}",
        "MEMBER",
        "ROLE",
        "POSTGRES",
        "LSN",
        "REPLAYED",
        "STREAMS FROM",
        "SOURCE"
    );
}

fn row(m: &Member, source: &str) {
    let lsn = |l: Option<herd_core::Lsn>| l.map_or("-".to_string(), |l| l.to_string());
    crate::output::emitln!(
        "{:<12} {:<12} {:<22} {:<14} {:<14} {:<12} {}",
        m.name,
        m.role,
        format!("{}:{}", m.pg_host, m.pg_port),
        lsn(m.lsn),
        lsn(m.replayed),
        m.streaming_from.as_deref().unwrap_or("-"),
        if source.is_empty() { "store" } else { source }
    );
}

/// The store did not answer (`why`): each etcd endpoint's own answer, then each agent's.
async fn from_agents(
    store: &StoreArgs,
    json: bool,
    agent_apis: &[String],
    key: Option<herd_agent::api::ApiKey>,
    why: anyhow::Error,
) -> anyhow::Result<()> {
    let config = store.etcd_config()?;
    let probes = tokio::task::spawn_blocking(move || herd_dcs::probe_endpoints(&config)).await?;
    let cluster = store.cluster.clone().unwrap_or_default();
    let apis: Vec<String> = if agent_apis.is_empty() {
        load_agents(&cluster).into_iter().map(|a| a.api).collect()
    } else {
        agent_apis.iter().map(|a| api_address(a)).collect()
    };
    use herd_agent::api::Fetched;
    let mut answers: Vec<(String, Option<Member>)> = Vec::new();
    let mut refused = Vec::new();
    if let Some(key) = key {
        let key = std::sync::Arc::new(key);
        let asks: Vec<_> = apis
            .iter()
            .map(|api| {
                tokio::spawn(herd_agent::api::fetch_member(
                    api.clone(),
                    AGENT_TIMEOUT,
                    key.clone(),
                ))
            })
            .collect();
        for (api, ask) in apis.iter().zip(asks) {
            match ask.await.unwrap_or(Fetched::Nothing) {
                Fetched::Member(m) => answers.push((api.clone(), Some(*m))),
                Fetched::Refused(code) => {
                    refused.push(format!("{api} ({code})"));
                    answers.push((api.clone(), None));
                }
                Fetched::Nothing => answers.push((api.clone(), None)),
            }
        }
    } else {
        answers.extend(apis.iter().map(|a| (a.clone(), None)));
        eprintln!(
            "warning: no cluster secrets in --data-dir (its secrets/superuser.password): the \
             agents' APIs answer only requests signed with the cluster's key; pass --data-dir \
             DIR holding a copy of the agents' secrets directory"
        );
    }
    if !refused.is_empty() {
        eprintln!(
            "warning: refused by {}: the secrets in --data-dir are not this cluster's",
            refused.join(", ")
        );
    }
    let leaders: Vec<&str> = answers
        .iter()
        .filter_map(|(_, m)| m.as_ref())
        .filter(|m| m.role == "primary")
        .map(|m| m.name.as_str())
        .collect();
    if json {
        let doc = serde_json::json!({
            "store": {
                "reachable": false,
                "error": format!("{why:#}"),
                "etcd": probes.iter().map(|p| serde_json::json!({
                    "endpoint": p.endpoint,
                    "answers": !matches!(p.state, herd_dcs::EndpointState::Silent(_)),
                    "has_leader": matches!(p.state, herd_dcs::EndpointState::Leader(_)),
                    "state": p.to_string(),
                })).collect::<Vec<_>>(),
            },
            "source": "agents",
            "leader": leaders.first(),
            "members": answers.iter().filter_map(|(_, m)| m.as_ref()).collect::<Vec<_>>(),
            "unanswered": answers.iter().filter(|(_, m)| m.is_none()).map(|(a, _)| a).collect::<Vec<_>>(),
        });
        crate::output::emitln!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        crate::output::emitln!("store unreachable: {why:#}");
        crate::output::emitln!("etcd endpoints:");
        for p in &probes {
            crate::output::emitln!("  {p}");
        }
        crate::output::emitln!(
            "leader: {} ({FROM_AGENT})",
            if leaders.is_empty() {
                "none".to_string()
            } else {
                leaders.join(", ")
            }
        );
        header();
        for (api, m) in &answers {
            match m {
                Some(m) => row(m, FROM_AGENT),
                None => crate::output::emitln!("(the agent at {api} does not answer)"),
            }
        }
    }
    if apis.is_empty() {
        anyhow::bail!(
            "{why:#}; and no agent address is known for cluster {cluster} (none cached from an \
             earlier `herd status`): pass --agent-api HOST:PORT for each agent"
        );
    }
    Err(StoreUnreachable.into())
}

/// `http://h1:8008/` → `h1:8008` (the agent helpers take an address).
fn api_address(given: &str) -> String {
    let a = given.trim();
    let a = a
        .strip_prefix("http://")
        .or_else(|| a.strip_prefix("https://"))
        .unwrap_or(a);
    a.trim_end_matches('/').to_string()
}

/// One agent as remembered from the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct KnownAgent {
    name: String,
    api: String,
}

/// The file the agents' addresses are kept in.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Known {
    cluster: String,
    agents: Vec<KnownAgent>,
}

/// `$XDG_STATE_HOME/herd/<cluster>.json`, else under `~/.local/state`; `None` without either.
fn cache_file(cluster: &str) -> Option<PathBuf> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .map(|h| h.join(".local/state"))
        })?;
    // A cluster name is a key segment in etcd; keep it one file name here too.
    let safe: String = cluster
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    Some(base.join("herd").join(format!("{safe}.json")))
}

/// Keeps the agents' API addresses for the next `herd status` that finds the store down. Best
/// effort: a status read must not fail because the state directory is not writable.
fn remember_agents(cluster: &str, members: &[Member]) {
    let Some(path) = cache_file(cluster) else {
        return;
    };
    let known = Known {
        cluster: cluster.to_string(),
        agents: members
            .iter()
            .map(|m| KnownAgent {
                name: m.name.clone(),
                api: m.api.clone(),
            })
            .collect(),
    };
    if known.agents.is_empty() {
        return; // an outage of the agents must not erase what a later store outage needs
    }
    if let Err(e) = write_atomically(&path, &known) {
        tracing::debug!(
            "cannot keep the agents' addresses in {}: {e}",
            path.display()
        );
    }
}

fn write_atomically(path: &std::path::Path, known: &Known) -> std::io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("no parent directory"))?;
    std::fs::create_dir_all(dir)?;
    let text = serde_json::to_vec_pretty(known).map_err(std::io::Error::other)?;
    // Written aside and renamed: two `herd status` at once never leave half a file.
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("agents"),
        std::process::id()
    ));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// The agents remembered for `cluster` (none when nothing was kept or the file is unreadable).
fn load_agents(cluster: &str) -> Vec<KnownAgent> {
    let Some(path) = cache_file(cluster) else {
        return Vec::new();
    };
    let Ok(text) = std::fs::read(&path) else {
        return Vec::new();
    };
    match serde_json::from_slice::<Known>(&text) {
        Ok(k) if k.cluster == cluster => k.agents,
        Ok(_) => Vec::new(),
        Err(e) => {
            eprintln!("warning: ignoring {}: {e}", path.display());
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_addresses_accept_urls() {
        assert_eq!(api_address("http://h1:8008/"), "h1:8008");
        assert_eq!(api_address("h1:8008"), "h1:8008");
        assert_eq!(api_address(" https://10.0.0.1:8008 "), "10.0.0.1:8008");
    }

    #[test]
    fn known_agents_round_trip_through_the_file() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("herd/main.json");
        let known = Known {
            cluster: "main".into(),
            agents: vec![KnownAgent {
                name: "h0".into(),
                api: "10.0.0.1:8008".into(),
            }],
        };
        write_atomically(&path, &known).expect("write");
        let back: Known =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("parse");
        assert_eq!(back.agents, known.agents);
        assert_eq!(
            std::fs::read_dir(dir.path().join("herd"))
                .expect("dir")
                .count(),
            1,
            "no temporary file left behind"
        );
    }
}
