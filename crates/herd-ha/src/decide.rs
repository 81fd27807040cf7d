//! Observations in, decisions out.

use std::time::Duration;

use herd_core::{NodeName, Role};

/// What the supervisor saw of one node in the last probe round.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeObservation {
    /// The node.
    pub name: NodeName,
    /// The role Herd assigned to it.
    pub role: Role,
    /// A postmaster process is alive for its data directory.
    pub postmaster_alive: bool,
    /// `Some(in_recovery)` when it answered a SQL probe, `None` otherwise.
    pub answered_in_recovery: Option<bool>,
    /// Consecutive failed start attempts since it last ran.
    pub failed_starts: u32,
    /// Time since Herd last tried to start it; `None` if never.
    pub since_last_start: Option<Duration>,
}

/// Tunables of the decisions.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    /// Delay before the first restart; doubled after each failed attempt.
    pub restart_backoff: Duration,
    /// Upper bound of the restart delay.
    pub max_restart_backoff: Duration,
}

/// Something the supervisor should do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Start the node's postmaster in its assigned role.
    Start(NodeName),
    /// The primary is not serving: tell the operator (failover is not decided here yet).
    ReportPrimaryDown(NodeName),
    /// A node runs in a role other than the one assigned: tell the operator, change nothing.
    ReportWrongRole(NodeName),
}

/// An action with the one-sentence reason that is logged and shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// What to do.
    pub action: Action,
    /// Why, in one sentence.
    pub reason: String,
}

impl Policy {
    /// Delay before the next start attempt after `failed` failures.
    pub fn backoff(&self, failed: u32) -> Duration {
        let factor = 1u32.checked_shl(failed.min(16)).unwrap_or(u32::MAX);
        self.restart_backoff
            .saturating_mul(factor)
            .min(self.max_restart_backoff)
    }
}

/// Decides what to do about each node. Dead postmasters are restarted after a backoff (a
/// restarted replica catches up from its slot; a restarted primary runs crash recovery and keeps
/// every flushed commit). A dead primary is also reported, since writes fail until it is back.
pub fn decide(nodes: &[NodeObservation], policy: &Policy) -> Vec<Decision> {
    let mut out = Vec::new();
    for n in nodes {
        if !n.postmaster_alive {
            if n.role == Role::Primary {
                out.push(Decision {
                    action: Action::ReportPrimaryDown(n.name.clone()),
                    reason: format!(
                        "primary {} has no running postmaster; writes fail until it is back",
                        n.name
                    ),
                });
            }
            let wait = policy.backoff(n.failed_starts);
            let due = n.since_last_start.is_none_or(|t| t >= wait);
            if due {
                out.push(Decision {
                    action: Action::Start(n.name.clone()),
                    reason: format!(
                        "{} {} has no running postmaster (failed starts so far: {})",
                        n.role, n.name, n.failed_starts
                    ),
                });
            }
            continue;
        }
        let wrong = match (n.role, n.answered_in_recovery) {
            (Role::Primary, Some(true)) => Some("is in recovery although it is the primary"),
            (Role::Replica, Some(false)) => Some("accepts writes although it is a replica"),
            _ => None,
        };
        if let Some(what) = wrong {
            out.push(Decision {
                action: Action::ReportWrongRole(n.name.clone()),
                reason: format!("{} {what}", n.name),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(i: usize, role: Role, alive: bool, recovery: Option<bool>) -> NodeObservation {
        NodeObservation {
            name: NodeName::numbered(i),
            role,
            postmaster_alive: alive,
            answered_in_recovery: recovery,
            failed_starts: 0,
            since_last_start: None,
        }
    }

    fn policy() -> Policy {
        Policy {
            restart_backoff: Duration::from_millis(500),
            max_restart_backoff: Duration::from_secs(30),
        }
    }

    fn actions(nodes: &[NodeObservation]) -> Vec<Action> {
        decide(nodes, &policy())
            .into_iter()
            .map(|d| d.action)
            .collect()
    }

    #[test]
    fn decision_table() {
        let n = NodeName::numbered;
        let healthy = [
            node(0, Role::Primary, true, Some(false)),
            node(1, Role::Replica, true, Some(true)),
        ];
        assert_eq!(actions(&healthy), vec![]);

        let replica_dead = [
            node(0, Role::Primary, true, Some(false)),
            node(1, Role::Replica, false, None),
        ];
        assert_eq!(actions(&replica_dead), vec![Action::Start(n(1))]);

        let primary_dead = [
            node(0, Role::Primary, false, None),
            node(1, Role::Replica, true, Some(true)),
        ];
        assert_eq!(
            actions(&primary_dead),
            vec![Action::ReportPrimaryDown(n(0)), Action::Start(n(0))]
        );

        // Alive but not answering (starting up, overloaded): leave it alone.
        let busy = [
            node(0, Role::Primary, true, None),
            node(1, Role::Replica, true, None),
        ];
        assert_eq!(actions(&busy), vec![]);

        let promoted_replica = [
            node(0, Role::Primary, true, Some(false)),
            node(1, Role::Replica, true, Some(false)),
        ];
        assert_eq!(
            actions(&promoted_replica),
            vec![Action::ReportWrongRole(n(1))]
        );

        let demoted_primary = [node(0, Role::Primary, true, Some(true))];
        assert_eq!(
            actions(&demoted_primary),
            vec![Action::ReportWrongRole(n(0))]
        );
    }

    #[test]
    fn restarts_back_off() {
        let mut dead = node(1, Role::Replica, false, None);
        dead.failed_starts = 2;
        dead.since_last_start = Some(Duration::from_millis(1500));
        assert_eq!(
            actions(std::slice::from_ref(&dead)),
            vec![],
            "needs 2 s after two failures"
        );
        dead.since_last_start = Some(Duration::from_millis(2000));
        assert_eq!(actions(&[dead]), vec![Action::Start(NodeName::numbered(1))]);
    }

    #[test]
    fn backoff_is_capped() {
        let p = policy();
        assert_eq!(p.backoff(0), Duration::from_millis(500));
        assert_eq!(p.backoff(3), Duration::from_secs(4));
        assert_eq!(p.backoff(40), Duration::from_secs(30));
    }
}
