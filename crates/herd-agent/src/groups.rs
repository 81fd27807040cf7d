//! Shard groups over hosts. An agent serves one node of one group (`herd agent --group G`);
//! each group keeps its keys under `groups/<G>/` of the cluster's store (group 0 at the root,
//! as an unsharded cluster always had them), with its own leader lease, sync set, failover,
//! fencing and failsafe. The number of groups is recorded when group 0 is created
//! ([`SHARD_GROUPS`]) and raised by `herd group add` ([`begin_addition`] across hosts: the new
//! group's agents may start from then on, and the proxies serve it once one of them admitted
//! it, [`record_admitted`]); the groups share one set of passwords, and every group's superuser gets
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
            crate::member::encode(&ShardGroups {
                count,
                admitted: None,
            }),
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
    // One host: the process adding the group admits it too (no proxy elsewhere waits).
    root.compare_and_set(
        SHARD_GROUPS,
        revision,
        crate::member::encode(&ShardGroups {
            count,
            admitted: None,
        }),
    )
    .map(|_| ())
    .map_err(|e| e.to_string())
}

/// How many groups the endpoint serves (the groups of [`count`] minus one `herd group add
/// --dcs` has recorded but no proxy admitted yet).
pub async fn served(root: &StoreClient) -> Result<Option<u32>, String> {
    if let Some(g) = root.get::<ShardGroups>(SHARD_GROUPS).await? {
        return Ok(Some(g.served()));
    }
    count(root).await
}

/// What `herd group add --dcs` does with the recorded groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Addition {
    /// No cluster: nothing recorded.
    NoCluster,
    /// Group `group` was recorded before and waits for its admission: finish that one.
    Pending {
        /// The group.
        group: u32,
    },
    /// Record `count + 1` groups (`admitted` staying at `count`): the new group is `count`.
    Raise {
        /// The groups recorded now.
        count: u32,
    },
}

/// The pure decision of [`begin_addition`] from the recorded groups (`None`: no record; a
/// cluster created before groups were recorded passes `ShardGroups { count: 1, .. }`).
pub fn addition(recorded: Option<&ShardGroups>) -> Addition {
    match recorded {
        None => Addition::NoCluster,
        Some(g) if g.served() < g.count => Addition::Pending { group: g.served() },
        Some(g) => Addition::Raise { count: g.count },
    }
}

/// `herd group add --dcs`: records one more group (its agents may start from now on; the
/// proxies do not serve it until [`record_admitted`]), or finds the group an earlier addition
/// left unadmitted. The new (or pending) group's number.
pub fn begin_addition(root: &Arc<dyn Dcs>) -> Result<u32, String> {
    let current = root.get(SHARD_GROUPS).map_err(|e| e.to_string())?;
    let (revision, recorded) = match &current {
        Some(v) => (
            v.revision,
            Some(crate::member::decode::<ShardGroups>(
                SHARD_GROUPS,
                &v.value,
            )?),
        ),
        None if root.get(INITIALIZE).map_err(|e| e.to_string())?.is_some() => (
            0,
            Some(ShardGroups {
                count: 1,
                admitted: None,
            }),
        ),
        None => (0, None),
    };
    match addition(recorded.as_ref()) {
        Addition::NoCluster => Err(
            "this cluster does not exist yet (no shard groups recorded in the store): start              its agents first"
                .into(),
        ),
        Addition::Pending { group } => Ok(group),
        Addition::Raise { count } => {
            let next = ShardGroups {
                count: count + 1,
                admitted: Some(count),
            };
            root.compare_and_set(SHARD_GROUPS, revision, crate::member::encode(&next))
                .map_err(|e| {
                    format!("recording the new group (another `herd group add` at once?): {e}")
                })?;
            Ok(count)
        }
    }
}

/// Records that the endpoint serves groups `0..=group` (after a proxy admitted `group`), so
/// proxies started from now on serve it at once; an equal or larger record stays.
pub fn record_admitted(root: &Arc<dyn Dcs>, group: u32) -> Result<(), String> {
    let Some(v) = root.get(SHARD_GROUPS).map_err(|e| e.to_string())? else {
        return Err("the store holds no shard groups".into());
    };
    let mut g = crate::member::decode::<ShardGroups>(SHARD_GROUPS, &v.value)?;
    if g.served() > group {
        return Ok(());
    }
    g.admitted = (group + 1 < g.count).then_some(group + 1);
    root.compare_and_set(SHARD_GROUPS, v.revision, crate::member::encode(&g))
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
                    "this cluster has {n} shard group(s) (0 to {}); --group {group} is not one of them \
                     (run `herd group add --dcs ...` first: it records the next group, whose agents then start)",
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
                // Another server: its certificate names the address dialled.
                tls: to.tls.as_ref().map(|t| t.dialled()),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(count: u32, admitted: Option<u32>) -> ShardGroups {
        ShardGroups { count, admitted }
    }

    #[test]
    fn an_addition_raises_the_count_or_finishes_the_pending_group() {
        let cases = [
            (None, Addition::NoCluster),
            (Some(groups(1, None)), Addition::Raise { count: 1 }),
            (Some(groups(2, None)), Addition::Raise { count: 2 }),
            (Some(groups(3, Some(3))), Addition::Raise { count: 3 }),
            (Some(groups(3, Some(2))), Addition::Pending { group: 2 }),
            // A record damaged by hand cannot admit more than exist.
            (Some(groups(2, Some(5))), Addition::Raise { count: 2 }),
        ];
        for (recorded, want) in cases {
            assert_eq!(addition(recorded.as_ref()), want, "{recorded:?}");
        }
    }

    #[test]
    fn the_admitted_field_is_optional_in_the_store() {
        let old: ShardGroups = serde_json::from_str(r#"{"count":2}"#).expect("decode");
        assert_eq!(old.served(), 2);
        let json = String::from_utf8(crate::member::encode(&groups(2, None))).expect("utf8");
        assert_eq!(json, r#"{"count":2}"#);
        assert_eq!(groups(3, Some(2)).served(), 2);
    }
}
