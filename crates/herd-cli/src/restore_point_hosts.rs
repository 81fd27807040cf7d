//! `POST /restore-point?name=N` on a multi-host `herd proxy` (`herd backup restore-point NAME
//! --dcs …`, asking a registered proxy's API or the one `--proxy-api HOST:PORT` names): every other registered proxy holds its second phases of
//! two-phase commits (`proxy_registry/point.rs`), this one closes its own gate, and the point
//! is written on every group's primary (herd-proxy `restore_point.rs`, the one-host code).
//!
//! The name is reserved in the store first (`restore_points/<name>`, by compare-and-set): a
//! restore stops at the first record of a name, so a name written on any group is never used
//! again. The record says what happened (taken, partial, refused) with each group's WAL
//! position; a refused one (nothing written anywhere) frees the name. The proxy's data
//! directory keeps the written groups' records too (`backup/restore-points.tsv`), and group 0's
//! leading agent copies them into the repository's `herd-restore-points.tsv`
//! (`agent_points.rs`), which `herd restore --to NAME --repository DIR` reads.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use herd_agent::store::StoreClient;
use herd_backup::Paths;
use herd_cluster::Layout;
use herd_dcs::{Dcs, DcsError};
use serde::{Deserialize, Serialize};

use crate::proxy_registry::Registry;

/// Prefix of the restore points' records in the store (relative to the cluster's root).
pub const POINTS: &str = "restore_points/";
/// How long this proxy waits for its own second phases under way (as on one host).
const COMMITS_WAIT: Duration = Duration::from_secs(5);
/// How long `herd backup restore-point --dcs` waits for the point to reach the repository's
/// record (group 0's leader looks every second).
const REPOSITORY_WAIT: Duration = Duration::from_secs(15);

/// A restore point's record in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// `taking`, `taken`, `partial` or `refused` (nothing written: the name is free again).
    pub state: String,
    /// Each written group's (group, WAL position, time in µs since the epoch).
    pub groups: Vec<(u32, String, i64)>,
    /// The other proxies that held their second phases meanwhile.
    pub acknowledged: Vec<String>,
    /// Why it is not taken.
    pub error: Option<String>,
    /// Copied into the repository's record of restore points by group 0's leading agent
    /// (`agent_points.rs`), where a restore from the repository alone reads it.
    #[serde(default)]
    pub in_repository: bool,
}

/// Whether a name whose record is `existing` may be used: only when nothing was written.
fn name_free(existing: Option<&Record>) -> bool {
    existing.is_none_or(|r| r.state == "refused")
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DcsError> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .context("the store thread failed")?
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// Writes `record` under `key` at `revision` (0: absent); the new revision.
async fn write(
    dcs: &Arc<dyn Dcs>,
    key: &str,
    revision: u64,
    record: &Record,
) -> anyhow::Result<u64> {
    let (dcs, key, value) = (dcs.clone(), key.to_string(), serde_json::to_vec(record)?);
    blocking(move || dcs.compare_and_set(&key, revision, value)).await
}

/// Takes the restore point `name` across every group (see the module's documentation); what
/// happened, or why not.
pub async fn take(
    proxy: &herd_proxy::ProxyContext,
    registry: &Arc<Registry>,
    root: &StoreClient,
    layout: &Layout,
    name: &str,
) -> anyhow::Result<String> {
    if !herd_backup::valid_point_name(name) {
        bail!(
            "'{name}' cannot name a restore point: a letter or '_' first, then letters, digits, \
             '_', '-' or '.', at most 63 characters"
        );
    }
    let dcs = root.dcs();
    let key = format!("{POINTS}{name}");
    let existing = {
        let (dcs, key) = (dcs.clone(), key.clone());
        blocking(move || dcs.get(&key)).await?
    };
    let (revision, old) = match &existing {
        Some(v) => (v.revision, serde_json::from_slice::<Record>(&v.value).ok()),
        None => (0, None),
    };
    if existing.is_some() && !name_free(old.as_ref()) {
        bail!(
            "a restore point named {name} exists already ({}): choose another name",
            old.map_or("unreadable record".to_string(), |r| r.state)
        );
    }
    let mut record = Record {
        state: "taking".into(),
        groups: Vec::new(),
        acknowledged: Vec::new(),
        error: None,
        in_repository: false,
    };
    let revision = write(&dcs, &key, revision, &record)
        .await
        .with_context(|| format!("reserving the name {name} in the store (taken meanwhile?)"))?;
    let hold = match registry.hold_for_point().await {
        Ok(h) => h,
        Err(e) => {
            record.state = "refused".into();
            record.error = Some(e.clone());
            write(&dcs, &key, revision, &record).await?;
            bail!("no restore point was taken: {e}");
        }
    };
    record.acknowledged = hold.acknowledged.clone();
    let outcome = proxy.restore_point(name, COMMITS_WAIT).await;
    drop(hold);
    record.groups = outcome
        .written
        .iter()
        .map(|p| (p.group, p.lsn.clone(), p.time))
        .collect();
    record.error = outcome.error.clone();
    record.state = match (&outcome.error, outcome.written.is_empty()) {
        (None, _) => "taken",
        (Some(_), true) => "refused",
        (Some(_), false) => "partial",
    }
    .into();
    write(&dcs, &key, revision, &record)
        .await
        .context("recording the restore point in the store")?;
    let mut lines = Vec::new();
    let file = Paths::new(layout.root()).restore_points();
    if let Some(dir) = file.parent() {
        // A proxy's data directory holds only its secrets until its first point.
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    for point in crate::restore_point::points(&outcome, name)? {
        herd_backup::record_point(&file, &point)?;
        lines.push(format!("  shard group {}: {}", point.group, point.lsn));
    }
    let when = crate::restore_point::settled(&outcome, name, proxy.groups())?;
    Ok(format!(
        "Restore point {name} at {when} on {} shard groups (two-phase commits held for {:.1} ms \
         here; {} other herd proxy process(es) held theirs: {}):\n{}",
        outcome.written.len(),
        outcome.held.as_secs_f64() * 1000.0,
        record.acknowledged.len(),
        record.acknowledged.join(", "),
        lines.join("\n")
    ))
}

/// `herd backup restore-point NAME --dcs … --cluster … [--proxy-api HOST:PORT]`: the name
/// checked here (a clear error without a round trip), the point taken by a proxy: the one at
/// `proxy_api`, else a registered one (each registration names its API).
pub async fn run(
    store: &crate::hosts::StoreArgs,
    layout: &Layout,
    name: &str,
    proxy_api: Option<&str>,
) -> anyhow::Result<()> {
    if !herd_backup::valid_point_name(name) {
        bail!(
            "'{name}' cannot name a restore point: a letter or '_' first, then letters, digits, \
             '_', '-' or '.', at most 63 characters"
        );
    }
    let root = store.open().await?;
    let text = request(&root, layout, name, proxy_api).await?;
    crate::output::emitln!("{}", text.trim_end());
    Ok(())
}

/// Asks a proxy for the point `name` (refused here when the store has the name already): the
/// proxy at `proxy_api`, else the registered proxies' APIs in turn until one answers. Only an
/// unreachable proxy is passed over: one that answered (taken or refused) is the outcome.
pub async fn request(
    root: &StoreClient,
    layout: &Layout,
    name: &str,
    proxy_api: Option<&str>,
) -> anyhow::Result<String> {
    let key = format!("{POINTS}{name}");
    let dcs = root.dcs();
    if let Some(v) = blocking(move || dcs.get(&key)).await? {
        let old = serde_json::from_slice::<Record>(&v.value).ok();
        if !name_free(old.as_ref()) {
            bail!(
                "a restore point named {name} exists already ({}): choose another name",
                old.map_or("unreadable record".to_string(), |r| r.state)
            );
        }
    }
    let apis = match proxy_api {
        Some(api) => vec![api.to_string()],
        None => crate::proxy_registry::apis(&root.dcs())
            .await
            .map_err(|e| anyhow::anyhow!("reading the registered proxies: {e}"))?,
    };
    if apis.is_empty() {
        bail!(
            "a restore point of a multi-host cluster is taken by a running `herd proxy` (it \
             holds the other proxies' two-phase commits meanwhile), and no registered proxy \
             serves an HTTP API: start one with --api-listen, or name one with --proxy-api \
             HOST:PORT"
        );
    }
    let token = herd_cluster::Secrets::read_api_token(layout);
    let mut unreachable = Vec::new();
    for api in apis {
        match post_point(&api, token.clone(), name).await? {
            Ok(text) => {
                let note = in_repository(root, name).await;
                return Ok(format!("{}\n{note}", text.trim_end()));
            }
            Err(e) => {
                eprintln!("restore point: {e}; trying the next registered proxy");
                unreachable.push(e);
            }
        }
    }
    bail!(
        "no herd proxy could be reached to take the point (nothing was taken):\n  {}",
        unreachable.join("\n  ")
    )
}

/// Waits (at most [`REPOSITORY_WAIT`]) until group 0's leading agent has copied the point
/// `name` into the repository's record (`agent_points.rs`); a line saying where it is.
async fn in_repository(root: &StoreClient, name: &str) -> String {
    // Only an agent with [backup] publishes its archiving (and copies points).
    let group0 = StoreClient::new(herd_agent::groups::scoped(root.dcs(), 0));
    let archives = group0.read().await.is_ok_and(|r| {
        r.store
            .members
            .iter()
            .any(|m| r.store.leader.as_deref() == Some(m.name.as_str()) && m.archiving.is_some())
    });
    if !archives {
        return "Recorded in the store only: the agents do not archive ([backup] in their \
                herd.toml), so no repository keeps it"
            .into();
    }
    let deadline = std::time::Instant::now() + REPOSITORY_WAIT;
    loop {
        let (dcs, key) = (root.dcs(), format!("{POINTS}{name}"));
        let copied = blocking(move || dcs.get(&key))
            .await
            .ok()
            .flatten()
            .and_then(|v| serde_json::from_slice::<Record>(&v.value).ok())
            .is_some_and(|r| r.in_repository);
        if copied {
            return format!(
                "Recorded in the repository's herd-restore-points.tsv too. Restore to it with: \
                 herd restore --to {name} --repository REPOSITORY --data-dir NEW-DIR"
            );
        }
        if std::time::Instant::now() >= deadline {
            return format!(
                "warning: shard group 0's leading agent has not copied the point into the \
                 repository's record within {} s (it does at its next look; its log says why \
                 not): until then a restore from the repository alone cannot find {name}",
                REPOSITORY_WAIT.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// `POST /restore-point?name=` to the proxy's API at `api`: its answer (`Ok(Ok)`), its refusal
/// (`Err`), or why it could not be reached (`Ok(Err)`: another proxy may be tried).
async fn post_point(
    api: &str,
    token: Option<String>,
    name: &str,
) -> anyhow::Result<Result<String, String>> {
    let url = format!("http://{api}/restore-point?name={name}");
    tokio::task::spawn_blocking(move || {
        let mut request = ureq::post(&url).timeout(Duration::from_secs(300));
        if let Some(t) = token {
            request = request.set("Authorization", &format!("Bearer {t}"));
        }
        match request.call() {
            Ok(r) => Ok(Ok(r.into_string().unwrap_or_default())),
            Err(ureq::Error::Status(401, _)) => Err(anyhow::anyhow!(
                "the herd proxy at {url} asks for its API token: copy its secrets/api_token \
                 (0600) into --data-dir's secrets/"
            )),
            Err(ureq::Error::Status(_, r)) => Err(anyhow::anyhow!(
                "{}",
                r.into_string().unwrap_or_default().trim()
            )),
            Err(e) => Ok(Err(format!(
                "cannot reach the herd proxy's HTTP API at {url}: {e}"
            ))),
        }
    })
    .await
    .context("the request thread failed")?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_free_only_when_nothing_was_written_under_it() {
        let with = |state: &str| Record {
            state: state.into(),
            groups: Vec::new(),
            acknowledged: Vec::new(),
            error: None,
            in_repository: false,
        };
        assert!(name_free(None));
        assert!(name_free(Some(&with("refused"))));
        for state in ["taking", "taken", "partial"] {
            assert!(!name_free(Some(&with(state))), "{state}");
        }
    }
}
