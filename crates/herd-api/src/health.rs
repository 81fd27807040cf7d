//! Health-check answers as a pure function of the status document.

use herd_core::{ClusterStatus, NodeState, NodeStatus, Role};

/// What a load balancer asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// Is there a primary (or: is this node the primary)?
    Primary {
        /// A specific node, or any.
        node: Option<String>,
    },
    /// Is there a usable replica (or: is this node one)?
    Replica {
        /// A specific node, or any.
        node: Option<String>,
        /// Replay lag above which a replica is not usable.
        max_lag_bytes: Option<u64>,
    },
}

/// The answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Health {
    /// 200, with the node that satisfies the check.
    Healthy(NodeStatus),
    /// 503, with the reason.
    Unhealthy(String),
    /// 404.
    NoSuchNode(String),
}

/// Answers `what` from `status`.
pub fn check(status: &ClusterStatus, what: &Check) -> Health {
    let (node, kind) = match what {
        Check::Primary { node } => (node, "primary"),
        Check::Replica { node, .. } => (node, "streaming replica within the lag bound"),
    };
    match node {
        Some(name) => match status.node(name) {
            None => Health::NoSuchNode(name.clone()),
            Some(n) if satisfies(n, what) => Health::Healthy(n.clone()),
            Some(n) => Health::Unhealthy(format!(
                "{} is a {} in state {:?}, not a {kind}",
                n.name, n.role, n.state
            )),
        },
        None => match status.nodes.iter().find(|n| satisfies(n, what)) {
            Some(n) => Health::Healthy(n.clone()),
            None => Health::Unhealthy(format!("no node is a {kind}")),
        },
    }
}

fn satisfies(n: &NodeStatus, what: &Check) -> bool {
    match what {
        Check::Primary { .. } => n.role == Role::Primary && n.state == NodeState::Running,
        Check::Replica { max_lag_bytes, .. } => {
            let lag_ok = match (max_lag_bytes, &n.lag) {
                (None, _) => true,
                (Some(max), Some(lag)) => lag.replay_bytes <= *max,
                (Some(_), None) => false,
            };
            n.role == Role::Replica && n.state == NodeState::Streaming && lag_ok
        }
    }
}

#[cfg(test)]
mod tests {
    use herd_core::{CommitMode, LagInfo, NodeName, SyncStandbys, STATUS_VERSION};

    use super::*;

    fn node(i: usize, role: Role, state: NodeState, replay_bytes: u64) -> NodeStatus {
        NodeStatus {
            name: NodeName::numbered(i),
            role,
            pid: Some(1),
            port: 1000,
            state,
            current_lsn: None,
            received_lsn: None,
            replayed_lsn: None,
            lag: (role == Role::Replica).then_some(LagInfo {
                write_bytes: 0,
                flush_bytes: 0,
                replay_bytes,
                write_seconds: None,
                flush_seconds: None,
                replay_seconds: None,
            }),
            sync_state: None,
        }
    }

    fn status(nodes: Vec<NodeStatus>) -> ClusterStatus {
        ClusterStatus {
            version: STATUS_VERSION,
            commit_mode: CommitMode::On,
            sync_standbys: SyncStandbys::default(),
            synchronous_standby_names: None,
            endpoint: String::new(),
            supervisor: None,
            nodes,
            ha_note: None,
            group: 0,
            groups: Vec::new(),
            copies: Vec::new(),
            archiving: None,
        }
    }

    fn code(h: Health) -> u16 {
        match h {
            Health::Healthy(_) => 200,
            Health::Unhealthy(_) => 503,
            Health::NoSuchNode(_) => 404,
        }
    }

    #[test]
    fn health_table() {
        let s = status(vec![
            node(0, Role::Primary, NodeState::Running, 0),
            node(1, Role::Replica, NodeState::Streaming, 100),
            node(2, Role::Replica, NodeState::Stopped, 0),
        ]);
        let some = |n: &str| Some(n.to_string());
        let table: Vec<(Check, u16)> = vec![
            (Check::Primary { node: None }, 200),
            (
                Check::Primary {
                    node: some("node0"),
                },
                200,
            ),
            (
                Check::Primary {
                    node: some("node1"),
                },
                503,
            ),
            (
                Check::Primary {
                    node: some("node9"),
                },
                404,
            ),
            (
                Check::Replica {
                    node: None,
                    max_lag_bytes: None,
                },
                200,
            ),
            (
                Check::Replica {
                    node: some("node1"),
                    max_lag_bytes: None,
                },
                200,
            ),
            (
                Check::Replica {
                    node: some("node1"),
                    max_lag_bytes: Some(100),
                },
                200,
            ),
            (
                Check::Replica {
                    node: some("node1"),
                    max_lag_bytes: Some(99),
                },
                503,
            ),
            (
                Check::Replica {
                    node: None,
                    max_lag_bytes: Some(10),
                },
                503,
            ),
            (
                Check::Replica {
                    node: some("node2"),
                    max_lag_bytes: None,
                },
                503,
            ),
            (
                Check::Replica {
                    node: some("node0"),
                    max_lag_bytes: None,
                },
                503,
            ),
        ];
        for (c, want) in table {
            assert_eq!(code(check(&s, &c)), want, "{c:?}");
        }
        let down = status(vec![node(0, Role::Primary, NodeState::Stopped, 0)]);
        assert_eq!(code(check(&down, &Check::Primary { node: None })), 503);
    }
}
