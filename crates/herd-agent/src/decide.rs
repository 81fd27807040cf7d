//! One agent's decision for one round: observations of its own PostgreSQL and of the store
//! in, one step out. Pure, so every case is a table row.

use std::time::Duration;

use herd_core::{Lsn, NodeName};
use herd_ha::{Candidate, FailoverRules};

use crate::jobs::JobKind;
use crate::member::{ClusterSettings, Handover, Member};
pub use crate::policy::Policy;

/// The agent's own PostgreSQL as probed this round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Local {
    /// No data directory yet.
    Empty,
    /// A data directory and no running server.
    Stopped,
    /// Running, accepting writes.
    Primary,
    /// Running in recovery.
    Replica {
        /// The member it is configured to stream from.
        upstream: Option<String>,
        /// Its WAL receiver is streaming.
        streaming: bool,
        /// The furthest of received and replayed WAL.
        lsn: Option<Lsn>,
    },
    /// A postmaster runs but does not answer.
    NotAnswering,
    /// A long action runs on the node (see [`crate::jobs`]): not probed, no new step.
    Busy(JobKind),
}

/// What the store said this round.
#[derive(Clone, Debug, PartialEq)]
pub struct Store {
    /// The cluster exists (its `initialize` key is written).
    pub initialized: bool,
    /// The holder of the leader lease.
    pub leader: Option<String>,
    /// The members whose heartbeat is present (this one included).
    pub members: Vec<Member>,
    /// The recorded synchronous standby set.
    pub sync_set: Vec<String>,
    /// `FIRST k`: the standbys the primary last reported as synchronous (recorded with the set).
    pub last_sync: Vec<String>,
    /// The member that led when the sync set was last recorded (else the one that created the
    /// cluster): with no standby ever recorded, only it holds every acknowledged commit.
    pub last_leader: Option<String>,
    /// The cluster's settings.
    pub settings: ClusterSettings,
    /// A pending switchover or failover (requests marked done are not given here).
    pub handover: Option<Handover>,
    /// Members asked to restart their server (requests not yet taken up).
    pub restarts: Vec<String>,
}

/// Everything one round's decision depends on.
#[derive(Clone, Debug)]
pub struct View {
    /// This agent's member name.
    pub me: String,
    /// Its PostgreSQL.
    pub local: Local,
    /// The store, or why it could not be read.
    pub store: Result<Store, String>,
    /// The node ran as primary since it last followed another (its WAL may have diverged).
    pub was_primary: bool,
    /// Time left before this agent must have fenced its primary (`None`: no lease held).
    pub lease_left: Option<Duration>,
    /// The replica has not streamed from its upstream for this long.
    pub not_streaming_for: Duration,
    /// This agent promised a failsafe primary not to take the lead before then.
    pub promised: bool,
    /// The last WAL position the leader published (async failover's lag bound).
    pub last_leader_lsn: Lsn,
    /// PostgreSQL's log said lately that the upstream no longer has the WAL this standby
    /// needs: it cannot catch up by streaming.
    pub upstream_lacks_wal: bool,
    /// While this member holds the lease: how long its server has not served (no postmaster,
    /// or one that does not answer). `None` when it serves or another member leads. Whether
    /// the postmaster is alive is the difference between [`Local::Stopped`] and
    /// [`Local::NotAnswering`].
    pub down_for: Option<Duration>,
    /// Start attempts (start, rejoin) since the server last served: the back-off's exponent.
    pub failed_starts: u32,
    /// Time since the last start attempt (`None`: none since the agent started).
    pub since_last_start: Option<Duration>,
    /// Timeouts and back-off.
    pub policy: Policy,
}

/// The step an agent takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Race for the `initialize` key; the winner runs initdb and starts as primary.
    Initialize,
    /// Clone the leader with pg_basebackup.
    Clone(String),
    /// Start the stopped server as primary (this agent holds the leader lease).
    StartPrimary,
    /// Start the stopped server in recovery, following the leader if there is one.
    StartReplica,
    /// Renew the leader lease and keep the sync set.
    Renew,
    /// Take the leader lease (compare-and-set on its absence); promote on success.
    Take,
    /// This agent holds the lease but its server is in recovery: promote it.
    Promote,
    /// Point the replica at the leader.
    Follow(String),
    /// pg_rewind onto the leader (re-clone when that fails), then follow it.
    Rejoin(String),
    /// Clone the leader afresh (the data directory kept aside): the leader no longer has the
    /// WAL this standby needs.
    Reclone(String),
    /// Stop the server immediately: it must not accept another write.
    Fence(String),
    /// The leader's server is dead or hung and another member can take over: fence it, keep
    /// the was-primary marker (it rejoins through pg_rewind) and release the lease, so the
    /// quorum race runs at once.
    Abdicate(String),
    /// Switchover or failover: stop (cleanly, or fence when `immediate`) and give the lease up.
    StepDown {
        /// Fence rather than stop cleanly.
        immediate: bool,
    },
    /// As the new leader after a handover: mark the request done.
    FinishHandover,
    /// An operator asked this replica to restart: leave the read pool, then stop and start its
    /// server (as a job), following `leader`.
    Restart(String),
    /// Nothing to do (why, for the log).
    Wait(String),
}

/// How long a replica may fail to stream from a healthy leader before it is rewound (its WAL
/// may have passed the leader's fork point).
pub const STUCK_REPLICA: Duration = Duration::from_secs(15);

/// How long a standby may stay unable to answer (not yet consistent) before it rejoins the
/// leader: longer than `STUCK_REPLICA`, as a standby replaying a long backlog is legitimately
/// silent for a while.
pub const STUCK_STARTING: Duration = Duration::from_secs(30);

/// Decides this round's step.
pub fn decide(view: &View) -> Step {
    let store = match &view.store {
        Ok(s) => s,
        Err(why) => return store_unreachable(view, why),
    };
    let leader = store.leader.as_deref();
    let me = view.me.as_str();
    let other_leader = leader.filter(|l| *l != me);
    match &view.local {
        // Its result is an input of the round after it ends.
        Local::Busy(kind) => Step::Wait(format!("a {} job runs", kind.role())),
        Local::Empty if !store.initialized => Step::Initialize,
        Local::Empty => match other_leader {
            Some(l) if store.members.iter().any(|m| m.name == l) => Step::Clone(l.into()),
            _ => Step::Wait("no leader to clone from yet".into()),
        },
        Local::Stopped | Local::NotAnswering if leader == Some(me) => leader_down(view, store),
        Local::Stopped => match other_leader {
            Some(l) if view.was_primary && !serves_as_primary(store, l) => promoting(l),
            Some(l) if view.was_primary => backed_off(view, Step::Rejoin(l.into())),
            _ => backed_off(view, Step::StartReplica),
        },
        // A standby still starting (not yet consistent) whose upstream lost the WAL it needs
        // never gets there.
        Local::NotAnswering => match other_leader {
            Some(l) if view.upstream_lacks_wal && store.members.iter().any(|m| m.name == l) => {
                Step::Reclone(l.into())
            }
            // Never consistent for this long: typically rewound onto a member that lost the
            // lead right after (its timeline is gone), so the WAL it waits for never comes.
            // Rejoin the leader (pg_rewind, else a fresh clone).
            Some(l)
                if view.not_streaming_for >= STUCK_STARTING
                    && store.members.iter().any(|m| m.name == l) =>
            {
                backed_off(view, Step::Rejoin(l.into()))
            }
            _ => Step::Wait("PostgreSQL runs but does not answer".into()),
        },
        Local::Primary => match leader {
            Some(l) if l == me => match &store.handover {
                Some(h) if h.from == me => Step::StepDown {
                    immediate: h.immediate,
                },
                Some(_) => Step::FinishHandover,
                None => Step::Renew,
            },
            Some(l) => Step::Fence(format!("{l} holds the leader lease")),
            None => Step::Take,
        },
        Local::Replica {
            upstream,
            streaming,
            lsn,
        } => match leader {
            Some(l) if l == me => Step::Promote,
            // Not held back like a stopped one: it runs as a standby and shows as a replica,
            // so it would look ready while it is not (operators and tests wait for that role).
            Some(l) if view.was_primary => backed_off(view, Step::Rejoin(l.into())),
            Some(l) if upstream.as_deref() != Some(l) => Step::Follow(l.into()),
            Some(l) if store.restarts.iter().any(|r| r == me) => Step::Restart(l.into()),
            Some(l) if !streaming && view.upstream_lacks_wal => Step::Reclone(l.into()),
            Some(l) if !streaming && view.not_streaming_for >= STUCK_REPLICA => {
                backed_off(view, Step::Rejoin(l.into()))
            }
            Some(l) => Step::Wait(format!("following {l}")),
            None if view.promised => {
                Step::Wait("a failsafe primary was promised the lead for now".into())
            }
            None => match &store.handover {
                Some(h) => handover_race(view, store, h, *lsn),
                None => match candidate(view, store, *lsn) {
                    Ok(best) if best == me => Step::Take,
                    Ok(best) => Step::Wait(format!("{best} is the candidate")),
                    Err(why) => Step::Wait(format!("no safe candidate: {why}")),
                },
            },
        },
    }
}

/// Whether `leader`'s record says its server serves as primary. A member publishes that only
/// in the round after its promotion finished, checkpoint included: until then pg_rewind would
/// find the new timeline missing from the source's pg_control, report "no rewind required",
/// and leave a former primary whose WAL passed the fork point unable to stream (found with
/// `herd up`'s agents in one process, where a former primary acts on the new lease within
/// milliseconds, while the promotion still runs).
fn serves_as_primary(store: &Store, leader: &str) -> bool {
    store
        .members
        .iter()
        .any(|m| m.name == leader && m.role == "primary")
}

fn promoting(leader: &str) -> Step {
    Step::Wait(format!(
        "{leader} leads but does not serve as primary yet; rewinding after it does"
    ))
}

/// This member holds the lease and its server does not serve (rules 1–3 of herd-ha's
/// supervisor, for one node). With another member able to take over, a dead server (no
/// postmaster) is given `failover_timeout`, a hung one (running, silent) `hung_timeout`; the
/// leader renews meanwhile, then abdicates so the quorum race runs. A crashed primary is no
/// longer restarted in place then: restarting it would keep a server whose crash nobody
/// understood, while a standby holding every acknowledged commit is ready. Alone (no other
/// member could prove it holds every acknowledged commit), the leader keeps the lease and
/// restarts its server in place, with back-off; it never abdicates, which would leave the
/// group without a leader.
fn leader_down(view: &View, store: &Store) -> Step {
    let down_for = view.down_for.unwrap_or(Duration::ZERO);
    let dead = view.local == Local::Stopped;
    let successor = {
        let mut others = store.clone();
        others.members.retain(|m| m.name != view.me);
        candidate(view, &others, None)
    };
    match successor {
        Ok(next) => {
            let (timeout, what) = if dead {
                (view.policy.failover_timeout, "has no postmaster")
            } else {
                (view.policy.hung_timeout, "runs but does not answer")
            };
            if down_for < timeout {
                // Renewing keeps the quorum race from starting while the server may still come
                // back (a probe that failed once) and keeps the watchdog from firing early.
                Step::Renew
            } else {
                Step::Abdicate(format!(
                    "PostgreSQL {what} for {:.1} s (limit {:.1} s); {next} can take over",
                    down_for.as_secs_f64(),
                    timeout.as_secs_f64()
                ))
            }
        }
        // Alone: a silent server is waited for, a dead one restarted in place.
        Err(_) if !dead => Step::Renew,
        Err(_) => match backed_off(view, Step::StartPrimary) {
            Step::Wait(_) => Step::Renew,
            start if view.was_primary => start,
            // Holds the lease without having been primary (it won the race, then its server
            // stopped before the promotion): start in recovery, then promote.
            _ => Step::StartReplica,
        },
    }
}

/// A start or rejoin once the back-off since the last attempt has passed (herd-ha's
/// `Policy::backoff`, per node): a server that fails to start is not hammered every round.
fn backed_off(view: &View, step: Step) -> Step {
    let wait = view.policy.backoff(view.failed_starts);
    match view.since_last_start {
        Some(since) if since < wait => Step::Wait(format!(
            "restart back-off: {} attempt(s) since the server last served; next in {:.1} s",
            view.failed_starts,
            (wait - since).as_secs_f64()
        )),
        _ => step,
    }
}

/// The race after a handover: the old leader stays out; the named member takes the lease when
/// it is at least as advanced as the proven candidate (or the operator accepted data loss).
fn handover_race(view: &View, store: &Store, h: &Handover, own: Option<Lsn>) -> Step {
    let me = view.me.as_str();
    if h.from == me {
        return Step::Wait("stepped down for a handover".into());
    }
    let mut without_old = store.clone();
    without_old.members.retain(|m| m.name != h.from);
    let proven = candidate(view, &without_old, own);
    match (&h.to, proven) {
        (Some(to), _) if to != me => Step::Wait(format!("handing over to {to}")),
        (Some(_), _) if h.allow_data_loss => Step::Take,
        (Some(_), Ok(best)) => {
            let lsn_of = |name: &str| {
                if name == me {
                    own
                } else {
                    without_old
                        .members
                        .iter()
                        .find(|m| m.name == name)
                        .and_then(|m| m.lsn)
                }
            };
            if best == me || (own.is_some() && own >= lsn_of(&best)) {
                Step::Take
            } else {
                Step::Wait(format!(
                    "{best} is ahead of this member; waiting for it to catch up"
                ))
            }
        }
        (None, Ok(best)) if best == me => Step::Take,
        (None, Ok(best)) => Step::Wait(format!("{best} is the candidate")),
        (_, Err(why)) => Step::Wait(format!("no safe candidate: {why}")),
    }
}

/// With the store unreachable, a primary serves only while its lease (or a failsafe
/// confirmation, which extends it) lasts; everything else waits.
fn store_unreachable(view: &View, why: &str) -> Step {
    if view.local == Local::Primary {
        return match view.lease_left {
            Some(left) if !left.is_zero() => Step::Wait(format!(
                "the store is unreachable ({why}); the lease covers {} ms more",
                left.as_millis()
            )),
            _ => Step::Fence(format!(
                "the store is unreachable ({why}) and the lease has run out"
            )),
        };
    }
    Step::Wait(format!("the store is unreachable ({why})"))
}

/// The member that may take the lead: the quorum proof over the recorded sync set (or the lag
/// bound in async mode), applied to the members' published positions with this agent's own
/// fresh one.
fn candidate(view: &View, store: &Store, own: Option<Lsn>) -> Result<String, String> {
    proven_candidate(store, Some((&view.me, own)), view.last_leader_lsn)
}

/// [`candidate`] for any caller: the replicas with a heartbeat, plus `me` at its own position
/// when given, against the leader's last known position `primary_lsn`.
pub(crate) fn proven_candidate(
    store: &Store,
    me: Option<(&str, Option<Lsn>)>,
    primary_lsn: Lsn,
) -> Result<String, String> {
    let is_me = |name: &str| me.is_some_and(|(m, _)| m == name);
    if store.sync_set.is_empty() && store.settings.commit_mode != herd_core::CommitMode::Async {
        // No standby was ever recorded: commits were acknowledged by the leader alone, so only
        // that member (a restarted single node, say) may lead again.
        return match &store.last_leader {
            Some(l) if store.members.iter().any(|m| m.name == *l) => Ok(l.clone()),
            Some(l) => Err(format!(
                "no standby was ever synchronous; only {l}, the last leader, holds every acknowledged commit"
            )),
            None => Err("no standby was ever synchronous and the last leader is unknown".into()),
        };
    }
    let candidates: Vec<Candidate> = store
        .members
        .iter()
        .filter(|m| m.role == "replica" || is_me(&m.name))
        .map(|m| Candidate {
            name: NodeName::from_text(&m.name),
            reachable: true,
            flushed: match me {
                Some((name, own)) if name == m.name => own,
                _ => m.lsn,
            },
        })
        .collect();
    let rules = FailoverRules {
        mode: store.settings.commit_mode,
        sync: store.settings.sync_standbys,
        sync_set: store
            .sync_set
            .iter()
            .map(|n| NodeName::from_text(n))
            .collect(),
        last_sync: store
            .last_sync
            .iter()
            .map(|n| NodeName::from_text(n))
            .collect(),
        primary_lsn,
        max_lag_bytes: store.settings.max_lag_on_failover,
        allow_data_loss: false,
    };
    herd_ha::choose_candidate(&candidates, &rules).map(|n| n.to_string())
}

#[cfg(test)]
pub(crate) mod tests;
