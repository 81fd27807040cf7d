//! Observing every node at once and assembling the status document.

use herd_core::{
    ArchiveStatus, ClusterStatus, LagInfo, Lsn, NodeName, NodeState, NodeStatus, Role,
    STATUS_VERSION,
};
use herd_pg::{PrimaryProbe, Probe, ReplicationRow, SharedProber};
use std::collections::HashMap;
use tokio::task::JoinSet;

use crate::{read_supervisor, Cluster};

/// One probe round: the status document plus, per node (same order), whether it answered SQL
/// and if so whether it was in recovery. The supervisor's decisions use the latter.
#[derive(Clone, Debug)]
pub struct Observation {
    /// The status document.
    pub status: ClusterStatus,
    /// `Some(in_recovery)` for nodes that answered, aligned with `status.nodes`.
    pub in_recovery: Vec<Option<bool>>,
}

/// Probers of a cluster's nodes, kept between rounds so that each node is probed over one
/// connection rather than a new login per round (see [`herd_pg::Prober`]).
#[derive(Default)]
pub struct Probers(HashMap<NodeName, SharedProber>);

impl Probers {
    /// Probers that share the given nodes' connections with other tasks of this process (the
    /// agents of `herd up`), so a node is not probed over a second session.
    pub fn sharing(shared: HashMap<NodeName, SharedProber>) -> Probers {
        Probers(shared)
    }
}

/// Probes every node concurrently (each bounded by the connection timeout), each over a new
/// connection: for one-off looks such as `herd status`.
pub async fn observe(cluster: &Cluster) -> Observation {
    observe_with(cluster, &mut Probers::default()).await
}

/// Like [`observe`], over the connections `probers` kept from earlier rounds (a supervisor's).
pub async fn observe_with(cluster: &Cluster, probers: &mut Probers) -> Observation {
    let mut order = vec![cluster.state.primary.clone()];
    order.extend(cluster.state.replicas());
    // Nodes that left the cluster take their connections with them.
    probers.0.retain(|node, _| order.contains(node));
    let mut probes = JoinSet::new();
    for (i, node) in order.iter().enumerate() {
        let dir = cluster.layout.node(node);
        let spec = cluster.probe_spec(node);
        let shared = probers.0.entry(node.clone()).or_default().clone();
        probes.spawn(async move {
            let pid = herd_pg::postmaster_pid(&dir).ok().flatten();
            let probe = match pid {
                Some(_) => herd_pg::probe_shared(&shared, spec).await.ok(),
                None => {
                    if let Some(p) = shared.lock().await.as_mut() {
                        p.disconnect();
                    }
                    None
                }
            };
            (i, pid, probe)
        });
    }
    let mut results = vec![(None, None); order.len()];
    while let Some(joined) = probes.join_next().await {
        if let Ok((i, pid, probe)) = joined {
            results[i] = (pid, probe);
        }
    }
    let primary_probe = match &results[0].1 {
        Some(Probe::Primary(p)) => Some(p.clone()),
        _ => None,
    };
    let archiving = match (&primary_probe, probers.0.get(&order[0])) {
        (Some(_), Some(shared)) if cluster.config.backup.is_enabled() => {
            let mut kept = shared.lock().await;
            match kept.as_mut() {
                Some(prober) => Some(archive_status(cluster, prober.archiver().await)),
                None => None,
            }
        }
        _ => None,
    };
    let mut nodes = Vec::with_capacity(order.len());
    let mut in_recovery = Vec::with_capacity(order.len());
    for (node, (pid, probe)) in order.iter().zip(results) {
        in_recovery.push(probe.as_ref().map(|p| matches!(p, Probe::Replica(_))));
        nodes.push(node_status(
            cluster,
            node,
            pid,
            probe,
            primary_probe.as_ref(),
        ));
    }
    let status = ClusterStatus {
        version: STATUS_VERSION,
        commit_mode: cluster.config.cluster.commit_mode,
        sync_standbys: cluster.config.cluster.sync_standbys,
        synchronous_standby_names: primary_probe
            .as_ref()
            .map(|p| p.synchronous_standby_names.clone()),
        endpoint: cluster.endpoint_url(false),
        supervisor: read_supervisor(&cluster.layout),
        nodes,
        ha_note: std::fs::read_to_string(cluster.layout.ha_note())
            .ok()
            .map(|s| s.trim().to_string()),
        group: cluster.group(),
        groups: Vec::new(),
        copies: Vec::new(),
        archiving,
    };
    Observation {
        status,
        in_recovery,
    }
}

/// The primary's archiving health from one reading of its archiver, judged against
/// `[backup] archive_lag_warning_s`; a failed reading is a warning of its own.
fn archive_status(
    cluster: &Cluster,
    row: Result<herd_pg::ArchiverRow, herd_pg::PgError>,
) -> ArchiveStatus {
    archive_status_of(row, cluster.config.backup.archive_lag_warning_s)
}

/// The archiving health from one reading of the archiver, judged against `bound`
/// (`[backup] archive_lag_warning_s`); a failed reading is a warning of its own. (The agents
/// across hosts judge their primary's reading with it too.)
pub fn archive_status_of(
    row: Result<herd_pg::ArchiverRow, herd_pg::PgError>,
    bound: u64,
) -> ArchiveStatus {
    match row {
        Ok(r) => ArchiveStatus {
            last_archived_wal: r.last_archived_wal,
            last_archived_age_seconds: r.last_archived_age,
            failed_count: r.failed_count.max(0) as u64,
            last_failed_wal: r.last_failed_wal,
            last_failed_age_seconds: r.last_failed_age,
            pending: r.pending.max(0) as u64,
            behind_seconds: r.oldest_pending_age.unwrap_or(0.0).max(0.0),
            warning_after_seconds: bound,
            warning: None,
        }
        .judge(),
        Err(e) => ArchiveStatus {
            last_archived_wal: None,
            last_archived_age_seconds: None,
            failed_count: 0,
            last_failed_wal: None,
            last_failed_age_seconds: None,
            pending: 0,
            behind_seconds: 0.0,
            warning_after_seconds: bound,
            warning: Some(format!(
                "cannot read the primary's archiver statistics: {e}"
            )),
        },
    }
}

fn node_status(
    cluster: &Cluster,
    node: &NodeName,
    pid: Option<u32>,
    probe: Option<Probe>,
    primary: Option<&PrimaryProbe>,
) -> NodeStatus {
    let role = cluster.role(node);
    let mut s = NodeStatus {
        name: node.clone(),
        role,
        pid,
        port: cluster.port(node),
        state: if pid.is_some() {
            NodeState::Starting
        } else {
            NodeState::Stopped
        },
        current_lsn: None,
        received_lsn: None,
        replayed_lsn: None,
        lag: None,
        sync_state: None,
    };
    match (role, probe) {
        (Role::Primary, Some(Probe::Primary(p))) => {
            s.state = NodeState::Running;
            s.current_lsn = Some(p.current_lsn);
        }
        (Role::Replica, Some(Probe::Replica(r))) => {
            let streaming = r.receiver_status.as_deref() == Some("streaming");
            s.state = if streaming {
                NodeState::Streaming
            } else {
                NodeState::Disconnected
            };
            s.received_lsn = r.received_lsn;
            s.replayed_lsn = r.replayed_lsn;
            if let Some(p) = primary {
                let row = p
                    .replication
                    .iter()
                    .find(|row| row.application_name == node.as_str());
                s.sync_state = row.and_then(|row| row.sync_state);
                s.lag = Some(lag(p.current_lsn, row, r.received_lsn, r.replayed_lsn));
            }
        }
        (_, Some(_)) => s.state = NodeState::WrongRole,
        (_, None) => {}
    }
    s
}

/// Lag of one replica behind the primary's current position. Time lags come from the walsender's
/// measurements; when PostgreSQL has cleared them because nothing is outstanding, the lag is 0.
pub fn lag(
    current: Lsn,
    row: Option<&ReplicationRow>,
    received: Option<Lsn>,
    replayed: Option<Lsn>,
) -> LagInfo {
    let behind = |pos: Option<Lsn>| pos.map_or(current.0, |p| current.bytes_after(p));
    let seconds = |measured: Option<f64>, bytes: u64| measured.or((bytes == 0).then_some(0.0));
    match row {
        Some(r) => {
            let (w, f, a) = (
                behind(r.write_lsn),
                behind(r.flush_lsn),
                behind(r.replay_lsn),
            );
            LagInfo {
                write_bytes: w,
                flush_bytes: f,
                replay_bytes: a,
                write_seconds: seconds(r.write_lag, w),
                flush_seconds: seconds(r.flush_lag, f),
                replay_seconds: seconds(r.replay_lag, a),
            }
        }
        // Not connected to the primary: only the replica's own positions are known.
        None => LagInfo {
            write_bytes: behind(received),
            flush_bytes: behind(received),
            replay_bytes: behind(replayed),
            write_seconds: None,
            flush_seconds: None,
            replay_seconds: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pos: u64, lag: Option<f64>) -> ReplicationRow {
        ReplicationRow {
            application_name: "node1".into(),
            state: "streaming".into(),
            write_lsn: Some(Lsn(pos)),
            flush_lsn: Some(Lsn(pos)),
            replay_lsn: Some(Lsn(pos)),
            write_lag: lag,
            flush_lag: lag,
            replay_lag: lag,
            sync_state: None,
        }
    }

    #[test]
    fn idle_caught_up_replica_has_zero_time_lag() {
        let l = lag(Lsn(100), Some(&row(100, None)), None, None);
        assert_eq!((l.replay_bytes, l.replay_seconds), (0, Some(0.0)));
    }

    #[test]
    fn outstanding_bytes_without_measurement_are_unknown_not_zero() {
        let l = lag(Lsn(200), Some(&row(100, None)), None, None);
        assert_eq!((l.replay_bytes, l.replay_seconds), (100, None));
        let l = lag(Lsn(200), Some(&row(100, Some(0.25))), None, None);
        assert_eq!(l.replay_seconds, Some(0.25));
    }

    #[test]
    fn disconnected_replica_uses_its_own_positions() {
        let l = lag(Lsn(300), None, Some(Lsn(250)), Some(Lsn(200)));
        assert_eq!(
            (l.flush_bytes, l.replay_bytes, l.replay_seconds),
            (50, 100, None)
        );
    }
}
