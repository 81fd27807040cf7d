//! Shard groups over hosts. An agent serves one node of one group (`herd agent --group G`);
//! each group keeps its keys under `groups/<G>/` of the cluster's store (group 0 at the root,
//! as an unsharded cluster always had them), with its own leader lease, sync set, failover,
//! fencing and failsafe. The number of groups is fixed when group 0 is created
//! ([`SHARD_GROUPS`]); the groups share one set of passwords, and every group's superuser gets
//! group 0's SCRAM verifier, because the endpoint checks a client's password once and logs in
//! to every group with the keys of that one verifier.

use std::sync::Arc;
use std::time::Duration;

use herd_dcs::{Dcs, Scoped};
use tokio::sync::watch;

use crate::member::{ShardGroups, INITIALIZE, SHARD_GROUPS};
use crate::store::StoreClient;
use crate::AgentError;

/// Group `group`'s view of the cluster's store (`root`).
pub fn scoped(root: Arc<dyn Dcs>, group: u32) -> Arc<dyn Dcs> {
    Arc::new(Scoped::group(root, group))
}

/// The cluster's number of shard groups, once group 0 exists (a cluster created before groups
/// were recorded has one).
pub async fn count(root: &StoreClient) -> Result<Option<u32>, String> {
    if let Some(g) = root.get::<ShardGroups>(SHARD_GROUPS).await? {
        return Ok(Some(g.count));
    }
    let created = root.get::<serde_json::Value>(INITIALIZE).await?.is_some();
    Ok(created.then_some(1))
}

/// Records the number of groups of a cluster being created (kept if already written).
pub async fn record_count(root: &StoreClient, count: u32) -> Result<(), String> {
    match root
        .write(
            SHARD_GROUPS,
            0,
            crate::member::encode(&ShardGroups { count }),
        )
        .await
    {
        Ok(_) => Ok(()),
        // Written before, by this member's earlier attempt or an operator: the first stays.
        Err(_) if root.get::<ShardGroups>(SHARD_GROUPS).await?.is_some() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Raises the recorded number of groups to `count` (`herd group add` on one host, whose
/// single process is the only writer); a larger recorded count stays.
pub fn raise_count(root: &Arc<dyn Dcs>, count: u32) -> Result<(), String> {
    let current = root.get(SHARD_GROUPS).map_err(|e| e.to_string())?;
    let (revision, recorded) = match &current {
        Some(v) => (
            v.revision,
            crate::member::decode::<ShardGroups>(SHARD_GROUPS, &v.value)
                .map(|g| g.count)
                .unwrap_or(0),
        ),
        None => (0, 0),
    };
    if recorded >= count {
        return Ok(());
    }
    root.compare_and_set(
        SHARD_GROUPS,
        revision,
        crate::member::encode(&ShardGroups { count }),
    )
    .map(|_| ())
    .map_err(|e| e.to_string())
}

/// How often a group ≥ 1 agent looks for group 0 while it waits for it.
const WAIT_STEP: Duration = Duration::from_millis(500);

/// Before the agent of a group ≥ 1 starts: waits until group 0 exists (its passwords and its
/// superuser's verifier come from there), then checks that the cluster has group `group`.
/// `Ok(false)` when `shutdown` came first.
pub async fn wait_for_group_zero(
    root: &StoreClient,
    group: u32,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<bool, AgentError> {
    let mut said = false;
    loop {
        match count(root).await {
            Ok(Some(n)) if group < n => return Ok(true),
            Ok(Some(n)) => {
                return Err(AgentError::Setup(format!(
                    "this cluster was created with {n} shard group(s) (0 to {}); --group {group} is not one of them \
                     (groups are fixed by --shard-groups when group 0 is created)",
                    n - 1
                )))
            }
            Ok(None) if !said => {
                tracing::warn!(
                    "waiting for shard group 0 to be created (start its agents; group {group} copies its passwords)"
                );
                said = true;
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("cannot read the store: {e}"),
        }
        tokio::select! {
            _ = tokio::time::sleep(WAIT_STEP) => {}
            _ = shutdown.changed() => return Ok(false),
        }
    }
}

/// Gives the superuser of a group ≥ 1 node that was just created group 0's SCRAM verifier,
/// read from group 0's leader (waited for, within `bound`).
pub async fn copy_superuser_verifier(
    root: &StoreClient,
    password: &str,
    to: &herd_pg::ConnSpec,
    bound: Duration,
) -> Result<(), AgentError> {
    let deadline = tokio::time::Instant::now() + bound;
    let source = loop {
        let read = root.read().await.map_err(AgentError::Store)?;
        let leader = read
            .store
            .leader
            .as_deref()
            .and_then(|l| read.store.members.iter().find(|m| m.name == l))
            .filter(|m| m.role == "primary");
        if let Some(m) = leader {
            break herd_pg::ConnSpec {
                host: m.pg_host.clone(),
                port: m.pg_port,
                password: password.to_string(),
                ..to.clone()
            };
        }
        if tokio::time::Instant::now() > deadline {
            return Err(AgentError::Setup(format!(
                "shard group 0 has no primary to copy the superuser's password verifier from (waited {} s)",
                bound.as_secs()
            )));
        }
        tokio::time::sleep(WAIT_STEP).await;
    };
    let from = herd_pg::connect(&source).await?;
    let into = herd_pg::connect(to).await?;
    herd_pg::copy_verifier(&from, &into, &to.user).await?;
    Ok(())
}
