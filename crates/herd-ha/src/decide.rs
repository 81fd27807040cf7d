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
    /// A former primary that must be rewound (or re-cloned) before it can follow the new one.
    pub needs_rewind: bool,
}

/// The primary is not serving: for how long, and what a failover could do.
#[derive(Clone, Debug, PartialEq)]
pub struct PrimaryLoss {
    /// Since when (continuously) the primary has not answered.
    pub down_for: Duration,
    /// The replicas as candidates.
    pub candidates: Vec<crate::Candidate>,
    /// The safety rules.
    pub rules: crate::FailoverRules,
}

/// Tunables of the decisions.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    /// Delay before the first restart; doubled after each failed attempt.
    pub restart_backoff: Duration,
    /// Upper bound of the restart delay.
    pub max_restart_backoff: Duration,
    /// How long a primary whose postmaster is gone may stay so before a replica is promoted.
    pub failover_timeout: Duration,
    /// How long a primary whose postmaster still runs but does not answer (hung, frozen, or
    /// only overloaded) may stay so: longer, so a busy machine does not cause a failover.
    pub hung_timeout: Duration,
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
    /// Fence the old primary and promote this replica.
    Failover(NodeName),
    /// The primary is lost but no replica is provably safe: do nothing, say why.
    RefuseFailover,
    /// Bring a former primary back as a replica (pg_rewind, else a fresh clone).
    Rejoin(NodeName),
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

/// Decides what to do about each node. Dead replicas are restarted after a backoff (they catch
/// up from their slots); former primaries rejoin through pg_rewind. A primary that has not
/// answered for `failover_timeout` is replaced by a replica that provably holds every
/// acknowledged commit, or, when none does, the refusal is reported. A cluster without
/// replicas restarts its primary instead.
pub fn decide(
    nodes: &[NodeObservation],
    policy: &Policy,
    loss: Option<&PrimaryLoss>,
) -> Vec<Decision> {
    let mut out = Vec::new();
    let has_replicas = nodes.iter().any(|n| n.role == Role::Replica);
    for n in nodes {
        if n.role == Role::Primary && n.answered_in_recovery != Some(false) {
            out.extend(primary_down(n, policy, loss, has_replicas));
            continue;
        }
        if !n.postmaster_alive {
            let wait = policy.backoff(n.failed_starts);
            if n.since_last_start.is_none_or(|t| t >= wait) {
                let (action, what) = if n.needs_rewind {
                    (
                        Action::Rejoin(n.name.clone()),
                        "former primary; it rejoins through pg_rewind",
                    )
                } else {
                    (Action::Start(n.name.clone()), "it catches up from its slot")
                };
                out.push(Decision {
                    action,
                    reason: format!(
                        "{} {} has no running postmaster ({what}; failed attempts: {})",
                        n.role, n.name, n.failed_starts
                    ),
                });
            }
            continue;
        }
        if n.role == Role::Replica && n.answered_in_recovery == Some(false) {
            out.push(Decision {
                action: Action::ReportWrongRole(n.name.clone()),
                reason: format!("{} accepts writes although it is a replica", n.name),
            });
        }
    }
    out
}

fn primary_down(
    n: &NodeObservation,
    policy: &Policy,
    loss: Option<&PrimaryLoss>,
    has_replicas: bool,
) -> Vec<Decision> {
    if n.postmaster_alive && n.answered_in_recovery == Some(true) {
        return vec![Decision {
            action: Action::ReportWrongRole(n.name.clone()),
            reason: format!("{} is in recovery although it is the primary", n.name),
        }];
    }
    if n.postmaster_alive && n.answered_in_recovery.is_none() && loss.is_none() {
        return Vec::new(); // busy or starting: not lost yet
    }
    if !has_replicas {
        let due = !n.postmaster_alive
            && n.since_last_start
                .is_none_or(|t| t >= policy.backoff(n.failed_starts));
        return due
            .then(|| Decision {
                action: Action::Start(n.name.clone()),
                reason: format!(
                    "primary {} has no running postmaster and there is no replica to promote",
                    n.name
                ),
            })
            .into_iter()
            .collect();
    }
    let Some(loss) = loss else {
        return vec![Decision {
            action: Action::ReportPrimaryDown(n.name.clone()),
            reason: format!("primary {} does not answer", n.name),
        }];
    };
    let timeout = if n.postmaster_alive {
        policy.hung_timeout
    } else {
        policy.failover_timeout
    };
    if loss.down_for < timeout {
        return vec![Decision {
            action: Action::ReportPrimaryDown(n.name.clone()),
            reason: format!(
                "primary {} has not answered for {:.1} s; failover after {:.1} s",
                n.name,
                loss.down_for.as_secs_f64(),
                timeout.as_secs_f64()
            ),
        }];
    }
    match crate::choose_candidate(&loss.candidates, &loss.rules) {
        Ok(c) => vec![Decision {
            action: Action::Failover(c.clone()),
            reason: format!(
                "primary {} lost for {:.1} s; {c} holds every acknowledged commit",
                n.name,
                loss.down_for.as_secs_f64()
            ),
        }],
        Err(why) => vec![Decision {
            action: Action::RefuseFailover,
            reason: format!("primary {} lost, not failing over: {why}", n.name),
        }],
    }
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
            needs_rewind: false,
        }
    }

    fn policy() -> Policy {
        Policy {
            restart_backoff: Duration::from_millis(500),
            max_restart_backoff: Duration::from_secs(30),
            failover_timeout: Duration::from_secs(2),
            hung_timeout: Duration::from_secs(8),
        }
    }

    fn actions(nodes: &[NodeObservation]) -> Vec<Action> {
        decide(nodes, &policy(), None)
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
            vec![Action::ReportPrimaryDown(n(0))]
        );
        let alone = [node(0, Role::Primary, false, None)];
        assert_eq!(
            actions(&alone),
            vec![Action::Start(n(0))],
            "no replica: restart the primary"
        );
        let mut rewind = node(1, Role::Replica, false, None);
        rewind.needs_rewind = true;
        assert_eq!(
            actions(&[node(0, Role::Primary, true, Some(false)), rewind]),
            vec![Action::Rejoin(n(1))]
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

#[cfg(test)]
mod failover_tests {
    use super::*;
    use crate::{Candidate, FailoverRules};
    use herd_core::{CommitMode, Lsn};

    #[test]
    fn failover_waits_for_the_timeout_then_promotes_a_safe_candidate() {
        let p = Policy {
            restart_backoff: Duration::from_millis(500),
            max_restart_backoff: Duration::from_secs(30),
            failover_timeout: Duration::from_secs(2),
            hung_timeout: Duration::from_secs(8),
        };
        let obs = |i: usize, role, alive, rec| NodeObservation {
            name: NodeName::numbered(i),
            role,
            postmaster_alive: alive,
            answered_in_recovery: rec,
            failed_starts: 0,
            since_last_start: None,
            needs_rewind: false,
        };
        let nodes = [
            obs(0, Role::Primary, true, None),
            obs(1, Role::Replica, true, Some(true)),
        ];
        let mut loss = PrimaryLoss {
            down_for: Duration::from_millis(1500),
            candidates: vec![Candidate {
                name: NodeName::numbered(1),
                reachable: true,
                flushed: Some(Lsn(10)),
            }],
            rules: FailoverRules {
                mode: CommitMode::On,
                sync: "ANY 1".parse().expect("sync"),
                sync_set: vec![NodeName::numbered(1)],
                last_sync: vec![],
                primary_lsn: Lsn(10),
                max_lag_bytes: 0,
                allow_data_loss: false,
            },
        };
        let act = |loss: &PrimaryLoss| {
            decide(&nodes, &p, Some(loss))
                .into_iter()
                .map(|d| d.action)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            act(&loss),
            vec![Action::ReportPrimaryDown(NodeName::numbered(0))]
        );
        // Alive but not answering: maybe only overloaded; the longer hung timeout applies.
        loss.down_for = Duration::from_secs(3);
        assert_eq!(
            act(&loss),
            vec![Action::ReportPrimaryDown(NodeName::numbered(0))]
        );
        loss.down_for = Duration::from_secs(9);
        assert_eq!(act(&loss), vec![Action::Failover(NodeName::numbered(1))]);
        // A dead postmaster: the failover timeout applies.
        let dead = [
            obs(0, Role::Primary, false, None),
            obs(1, Role::Replica, true, Some(true)),
        ];
        loss.down_for = Duration::from_secs(3);
        let acts: Vec<Action> = decide(&dead, &p, Some(&loss))
            .into_iter()
            .map(|d| d.action)
            .collect();
        assert_eq!(acts, vec![Action::Failover(NodeName::numbered(1))]);
        loss.candidates[0].reachable = false;
        assert_eq!(
            act(&loss),
            vec![Action::ReportPrimaryDown(NodeName::numbered(0))],
            "hung for 3 s: still waiting"
        );
        loss.down_for = Duration::from_secs(9);
        assert_eq!(act(&loss), vec![Action::RefuseFailover]);
    }
}
