//! Choosing a node for one unit of work: a pure function of the statement's route, the session's
//! consistency and read-your-writes token, and the topology snapshot.

use std::time::Duration;

use herd_core::{Consistency, Lsn};

use crate::topology::TopologyView;

/// Where a unit goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// To the primary.
    Primary(PrimaryReason),
    /// To one of these replicas (indices into `TopologyView::replicas`), least busy first.
    /// With `confirm`, the replica must first be confirmed to have replayed that LSN (waiting
    /// at most the configured bound), else the unit goes to the primary.
    Replica {
        /// Eligible replicas.
        candidates: Vec<usize>,
        /// Token the chosen replica must have replayed.
        confirm: Option<Lsn>,
    },
}

/// Why a unit goes to the primary (a counter each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PrimaryReason {
    /// The statement writes or may write.
    Write,
    /// The session asked for `primary` consistency.
    ConsistencyPrimary,
    /// No replica is healthy and in the read pool.
    NoReplica,
    /// No replica is fresh enough for `bounded`.
    TooStale,
    /// No replica has replayed the session's writes, and waiting is disabled.
    NotCaughtUp,
    /// A read the primary takes because it is the least busy node (`read_from_primary`).
    ReadBalanced,
}

impl PrimaryReason {
    /// Label for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            PrimaryReason::Write => "write",
            PrimaryReason::ConsistencyPrimary => "consistency_primary",
            PrimaryReason::NoReplica => "no_replica",
            PrimaryReason::TooStale => "too_stale",
            PrimaryReason::NotCaughtUp => "not_caught_up",
            PrimaryReason::ReadBalanced => "read_balanced",
        }
    }
}

/// Inputs besides the topology.
#[derive(Clone, Copy, Debug)]
pub struct Request {
    /// The statement may run on a hot standby.
    pub read_only: bool,
    /// The session's consistency level for this unit.
    pub consistency: Consistency,
    /// The session's read-your-writes token (WAL position after its last write).
    pub token: Lsn,
    /// `bounded`: how stale a replica may be.
    pub max_staleness: Duration,
    /// `session`: whether waiting for a replica to catch up is allowed.
    pub may_wait: bool,
}

/// Chooses the node for one unit.
pub fn choose(req: &Request, view: &TopologyView) -> Target {
    if !req.read_only {
        return Target::Primary(PrimaryReason::Write);
    }
    if req.consistency == Consistency::Primary {
        return Target::Primary(PrimaryReason::ConsistencyPrimary);
    }
    let pool: Vec<usize> = view
        .replicas
        .iter()
        .enumerate()
        .filter(|(_, r)| r.healthy && r.in_read_pool)
        .map(|(i, _)| i)
        .collect();
    if pool.is_empty() {
        return Target::Primary(PrimaryReason::NoReplica);
    }
    match req.consistency {
        Consistency::Eventual => Target::Replica {
            candidates: pool,
            confirm: None,
        },
        Consistency::Bounded => {
            let fresh: Vec<usize> = pool
                .into_iter()
                .filter(|&i| {
                    view.replicas[i]
                        .staleness
                        .is_some_and(|s| s <= req.max_staleness)
                })
                .collect();
            if fresh.is_empty() {
                Target::Primary(PrimaryReason::TooStale)
            } else {
                Target::Replica {
                    candidates: fresh,
                    confirm: None,
                }
            }
        }
        Consistency::Session => {
            let caught_up: Vec<usize> = pool
                .iter()
                .copied()
                .filter(|&i| view.replicas[i].replay_lsn >= req.token)
                .collect();
            if !caught_up.is_empty() {
                Target::Replica {
                    candidates: caught_up,
                    confirm: None,
                }
            } else if req.may_wait {
                // The poll is up to 100 ms old: a replica has most likely replayed the token by now.
                Target::Replica {
                    candidates: pool,
                    confirm: Some(req.token),
                }
            } else {
                Target::Primary(PrimaryReason::NotCaughtUp)
            }
        }
        Consistency::Primary => Target::Primary(PrimaryReason::ConsistencyPrimary),
    }
}

#[cfg(test)]
mod tests {
    use herd_core::{Endpoint, NodeName};

    use super::*;
    use crate::topology::ReplicaView;

    fn replica(i: usize, healthy: bool, in_pool: bool, replay: u64, stale_ms: u64) -> ReplicaView {
        ReplicaView {
            endpoint: Endpoint {
                name: NodeName::numbered(i),
                host: "127.0.0.1".into(),
                port: 1,
                socket: None,
            },
            healthy,
            replay_lsn: Lsn(replay),
            lag_bytes: 0,
            staleness: Some(Duration::from_millis(stale_ms)),
            in_read_pool: in_pool,
        }
    }

    fn req(read_only: bool, consistency: Consistency, token: u64, may_wait: bool) -> Request {
        Request {
            read_only,
            consistency,
            token: Lsn(token),
            max_staleness: Duration::from_millis(500),
            may_wait,
        }
    }

    #[test]
    fn choice_table() {
        let view = TopologyView {
            primary: None,
            primary_lsn: Lsn(100),
            replicas: vec![
                replica(1, true, true, 100, 0),
                replica(2, true, true, 50, 800),
                replica(3, false, true, 100, 0),
                replica(4, true, false, 100, 0),
            ],
            durable_replicas: 1,
            electing: false,
            tls_error: None,
        };
        use Consistency::*;
        let rep = |c: Vec<usize>, confirm: Option<u64>| Target::Replica {
            candidates: c,
            confirm: confirm.map(Lsn),
        };
        let table = [
            (
                req(false, Eventual, 0, true),
                Target::Primary(PrimaryReason::Write),
            ),
            (
                req(true, Primary, 0, true),
                Target::Primary(PrimaryReason::ConsistencyPrimary),
            ),
            (req(true, Eventual, 0, true), rep(vec![0, 1], None)),
            (req(true, Bounded, 0, true), rep(vec![0], None)),
            (req(true, Session, 60, true), rep(vec![0], None)),
            (req(true, Session, 40, true), rep(vec![0, 1], None)),
            (req(true, Session, 150, true), rep(vec![0, 1], Some(150))),
            (
                req(true, Session, 150, false),
                Target::Primary(PrimaryReason::NotCaughtUp),
            ),
        ];
        for (r, want) in table {
            assert_eq!(choose(&r, &view), want, "{r:?}");
        }
        let stale_only = TopologyView {
            replicas: vec![replica(2, true, true, 50, 800)],
            ..view.clone()
        };
        assert_eq!(
            choose(&req(true, Bounded, 0, true), &stale_only),
            Target::Primary(PrimaryReason::TooStale)
        );
        let none = TopologyView {
            replicas: vec![replica(3, false, true, 100, 0)],
            ..view
        };
        assert_eq!(
            choose(&req(true, Session, 0, true), &none),
            Target::Primary(PrimaryReason::NoReplica)
        );
    }
}
