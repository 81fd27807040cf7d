//! The supervisor loop: observe every node, let `herd-ha` decide, carry the decisions out.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use herd_config::Config;
use herd_core::{
    Assignment, ClusterEvent, ClusterStatus, EventKind, EventSink, Lsn, NodeName, NodeState, Role,
    SyncState,
};
use herd_ha::{decide, Action, Candidate, FailoverRules, NodeObservation, Policy, PrimaryLoss};
use herd_pg::Pg;
use tokio::sync::{mpsc, oneshot, watch};

use crate::status::{observe_with, Probers};
use crate::{Cluster, ClusterState};

/// An operator's request to the supervisor; the reply says what happened.
#[derive(Debug)]
pub enum Command {
    /// Planned change of primary (`herd switchover`).
    Switchover {
        /// The replica to promote; default: the most advanced.
        to: Option<NodeName>,
        /// Where the outcome goes.
        reply: oneshot::Sender<Result<String, String>>,
    },
    /// Immediate promotion (`herd failover`): the current primary is fenced.
    Failover {
        /// The replica to promote; default: the safe candidate.
        to: Option<NodeName>,
        /// Promote even when acknowledged commits may be missing from the replica.
        allow_data_loss: bool,
        /// Where the outcome goes.
        reply: oneshot::Sender<Result<String, String>>,
    },
    /// Restart one replica, or (`None`) every server of the group, the primary through a
    /// switchover: settings that need a restart take effect, copied slot files are loaded.
    Restart {
        /// The replica to restart; `None`: the whole group.
        node: Option<NodeName>,
        /// Where the outcome goes.
        reply: oneshot::Sender<Result<String, String>>,
    },
}

/// How the supervisor talks to the rest of the process.
pub struct Links<'a> {
    /// Where each observation is published (the API serves it).
    pub status: &'a watch::Sender<ClusterStatus>,
    /// Where role changes are published (the proxy follows them).
    pub assignment: &'a watch::Sender<Assignment>,
    /// The store of leases and topology.
    pub dcs: &'a dyn herd_dcs::Dcs,
    /// Operator requests.
    pub commands: mpsc::Receiver<Command>,
    /// Pauses new transactions at the proxy.
    pub gate: Gate,
    /// Turns true when the supervisor must stop.
    pub shutdown: watch::Receiver<bool>,
    /// Counts each decision by kind (for `/metrics`).
    pub count: std::sync::Arc<dyn Fn(&str) + Send + Sync>,
    /// Receives each failover, switchover, restart and rejoin with its reason (the dashboard's
    /// timeline).
    pub events: EventSink,
}

/// Pauses (`true`) or resumes (`false`) new transactions at the proxy.
pub type Gate = std::sync::Arc<dyn Fn(bool) + Send + Sync>;

/// The lease the serving primary holds in the DCS.
const LEADER: &str = "leader";

/// Start attempts per node, for the restart backoff.
#[derive(Default)]
struct StartBook {
    failed: BTreeMap<NodeName, u32>,
    last_attempt: BTreeMap<NodeName, Instant>,
}

/// What the supervisor remembers about the primary between rounds.
#[derive(Default)]
struct PrimaryWatch {
    /// Since when the primary has not been serving.
    down_since: Option<Instant>,
    /// Its last observed WAL position.
    last_lsn: Lsn,
    /// The standbys it last reported as synchronous (FIRST k).
    last_sync: Vec<NodeName>,
}

impl PrimaryWatch {
    /// Updates from one observation; returns the loss to decide on, if the primary is down.
    fn observe(&mut self, status: &ClusterStatus, cluster: &Cluster) -> Option<PrimaryLoss> {
        let primary = status.nodes.iter().find(|n| n.role == Role::Primary);
        if let Some(p) = primary.filter(|p| p.state == NodeState::Running) {
            self.down_since = None;
            self.last_lsn = p.current_lsn.unwrap_or(self.last_lsn);
            let sync: Vec<NodeName> = status
                .nodes
                .iter()
                .filter(|n| n.sync_state == Some(SyncState::Sync))
                .map(|n| n.name.clone())
                .collect();
            if !sync.is_empty() {
                self.last_sync = sync;
            }
            return None;
        }
        let since = *self.down_since.get_or_insert_with(Instant::now);
        Some(PrimaryLoss {
            down_for: since.elapsed(),
            candidates: candidates(status, cluster),
            rules: self.rules(cluster),
        })
    }

    /// The safety rules as of now.
    fn rules(&self, cluster: &Cluster) -> FailoverRules {
        FailoverRules {
            mode: cluster.config.cluster.commit_mode,
            sync: cluster.config.cluster.sync_standbys,
            sync_set: cluster.state.sync_set.clone(),
            last_sync: self.last_sync.clone(),
            primary_lsn: self.last_lsn,
            max_lag_bytes: cluster.config.supervisor.max_lag_on_failover,
            allow_data_loss: false,
        }
    }
}

/// Runs until `shutdown` turns true: every `probe_interval_ms`, observes the nodes, publishes
/// the status on `status_tx` and the roles on `assignment_tx` (for the proxy), and restarts dead servers with backoff. The configuration and
/// topology are re-read from the data directory each round, so `herd config set` is honoured
/// when a server is restarted.
pub async fn supervise(mut cluster: Cluster, pg: &Pg, links: Links<'_>) {
    let Links {
        status: status_tx,
        assignment: assignment_tx,
        dcs,
        mut commands,
        gate,
        mut shutdown,
        count,
        events,
    } = links;
    let cluster_group = cluster.group();
    let event = |kind, node: Option<&NodeName>, text: String, ok| {
        let node = node.map(|n| n.as_str().to_string());
        events(ClusterEvent::now(cluster_group, kind, node, text, ok));
    };
    let mut book = StartBook::default();
    let mut watch = PrimaryWatch::default();
    let mut reported: BTreeSet<String> = BTreeSet::new();
    // One probe connection per node for as long as this supervisor runs.
    let mut probers = Probers::default();
    loop {
        let interval = Duration::from_millis(cluster.config.supervisor.probe_interval_ms);
        let command = tokio::select! {
            _ = tokio::time::sleep(interval) => None,
            _ = shutdown.changed() => None,
            c = commands.recv() => c,
        };
        if *shutdown.borrow() {
            return;
        }
        refresh(&mut cluster);
        if let Some(command) = command {
            let outlets = Outlets {
                gate: &gate,
                assignment: assignment_tx,
                event: &event,
            };
            run_command(&mut cluster, pg, dcs, &watch, &outlets, command).await;
            let _ = assignment_tx.send(cluster.assignment());
            watch = PrimaryWatch::default();
            continue;
        }
        let observation = observe_with(&cluster, &mut probers).await;
        let mut assignment = cluster.assignment();
        // Backends orphaned by a dead postmaster may still answer: route nothing to them.
        assignment.primary_down = observation
            .status
            .nodes
            .iter()
            .any(|n| n.role == Role::Primary && n.pid.is_none());
        assignment_tx.send_if_modified(|current| {
            let changed = *current != assignment;
            if changed {
                *current = assignment;
            }
            changed
        });
        let observations: Vec<NodeObservation> = observation
            .status
            .nodes
            .iter()
            .zip(&observation.in_recovery)
            .map(|(n, in_recovery)| NodeObservation {
                name: n.name.clone(),
                role: n.role,
                postmaster_alive: n.pid.is_some(),
                answered_in_recovery: *in_recovery,
                failed_starts: book.failed.get(&n.name).copied().unwrap_or(0),
                since_last_start: book.last_attempt.get(&n.name).map(Instant::elapsed),
                needs_rewind: cluster.state.needs_rewind.contains(&n.name),
            })
            .collect();
        let loss = watch.observe(&observation.status, &cluster);
        let failover_timeout = Duration::from_millis(cluster.config.supervisor.failover_timeout_ms);
        if loss.is_none() {
            // The serving primary holds the leader lease; failover waits for it to expire.
            if let Err(e) =
                dcs.acquire_lease(LEADER, cluster.state.primary.as_str(), failover_timeout)
            {
                tracing::warn!("cannot renew the leader lease: {e}");
            }
        }
        let _ = status_tx.send(observation.status);
        let policy = Policy {
            restart_backoff: Duration::from_millis(cluster.config.supervisor.restart_backoff_ms),
            max_restart_backoff: Duration::from_secs(30),
            failover_timeout,
            hung_timeout: Duration::from_millis(cluster.config.supervisor.hung_timeout_ms),
        };
        let decisions = decide(&observations, &policy, loss.as_ref());
        let mut still_reported = BTreeSet::new();
        for d in decisions {
            count(action_label(&d.action));
            if matches!(
                d.action,
                Action::Failover(_) | Action::RefuseFailover | Action::Rejoin(_)
            ) {
                note(&cluster, &d.reason);
            }
            match d.action {
                Action::Start(node) => {
                    tracing::warn!(node = %node, "restarting: {}", d.reason);
                    book.last_attempt.insert(node.clone(), Instant::now());
                    match cluster.start_node(pg, &node).await {
                        Ok(()) => {
                            book.failed.remove(&node);
                            tracing::info!(node = %node, "restarted; it catches up from its replication slot");
                            event(
                                EventKind::Restart,
                                Some(&node),
                                format!("restarted: {}", d.reason),
                                true,
                            );
                        }
                        Err(e) => {
                            *book.failed.entry(node.clone()).or_default() += 1;
                            tracing::error!(node = %node, "restart failed: {e}");
                            event(
                                EventKind::Restart,
                                Some(&node),
                                format!("restart failed ({e}): {}", d.reason),
                                false,
                            );
                        }
                    }
                }
                Action::Failover(candidate) => {
                    if let Ok(Some(holder)) = dcs.lease_holder(LEADER) {
                        tracing::debug!(
                            "leader lease still held by {holder}; failover waits for it to expire"
                        );
                        continue;
                    }
                    tracing::warn!("failover: {}", d.reason);
                    let started = Instant::now();
                    match cluster.fail_over(pg, dcs, &candidate).await {
                        Ok(()) => {
                            watch = PrimaryWatch::default();
                            let _ = assignment_tx.send(cluster.assignment());
                            let secs = started.elapsed().as_secs_f64();
                            tracing::warn!(primary = %candidate, "failover done in {secs:.1} s");
                            event(
                                EventKind::Failover,
                                Some(&candidate),
                                format!("{} (done in {secs:.1} s)", d.reason),
                                true,
                            );
                        }
                        Err(e) => {
                            tracing::error!(candidate = %candidate, "failover failed: {e}");
                            event(
                                EventKind::Failover,
                                Some(&candidate),
                                format!("failover failed ({e}): {}", d.reason),
                                false,
                            );
                        }
                    }
                }
                Action::Rejoin(node) => {
                    tracing::warn!(node = %node, "rejoining: {}", d.reason);
                    book.last_attempt.insert(node.clone(), Instant::now());
                    match cluster.rejoin(pg, dcs, &node).await {
                        Ok(()) => {
                            book.failed.remove(&node);
                            tracing::info!(node = %node, "rejoined as a replica");
                            event(
                                EventKind::Rejoin,
                                Some(&node),
                                format!("rejoined as a replica: {}", d.reason),
                                true,
                            );
                        }
                        Err(e) => {
                            *book.failed.entry(node.clone()).or_default() += 1;
                            tracing::error!(node = %node, "rejoin failed: {e}");
                            event(
                                EventKind::Rejoin,
                                Some(&node),
                                format!("rejoin failed ({e}): {}", d.reason),
                                false,
                            );
                        }
                    }
                }
                Action::ReportPrimaryDown(_)
                | Action::ReportWrongRole(_)
                | Action::RefuseFailover => {
                    // Log a condition once when it appears, not on every round.
                    let key = format!("{:?}", d.action);
                    if !reported.contains(&key) {
                        tracing::error!("{}", d.reason);
                        if matches!(d.action, Action::RefuseFailover) {
                            event(EventKind::RefusedFailover, None, d.reason.clone(), false);
                        }
                    }
                    still_reported.insert(key);
                }
            }
        }
        reported = still_reported;
    }
}

/// Records one event: its kind, the node, Herd's sentence, and whether it went well.
type Note<'a> = dyn Fn(EventKind, Option<&NodeName>, String, bool) + Sync + 'a;

/// Where an operator command's effects go besides the servers: the proxy's pause and roles,
/// and the event timeline.
struct Outlets<'a> {
    gate: &'a Gate,
    assignment: &'a watch::Sender<Assignment>,
    event: &'a Note<'a>,
}

/// How long a replica about to restart keeps serving the reads under way after the proxy
/// stopped sending it new ones (it polls the assignment several times a second).
const RESTART_DRAIN: Duration = Duration::from_secs(1);

async fn run_command(
    cluster: &mut Cluster,
    pg: &Pg,
    dcs: &dyn herd_dcs::Dcs,
    watch: &PrimaryWatch,
    outlets: &Outlets<'_>,
    command: Command,
) {
    let Outlets {
        gate,
        assignment: assignment_tx,
        event,
    } = *outlets;
    match command {
        Command::Switchover { to, reply } => {
            let started = Instant::now();
            let result = cluster
                .switch_over(pg, dcs, to.as_ref(), gate.as_ref())
                .await;
            let outcome = result
                .map(|n| {
                    format!(
                        "switched over to {n} in {:.1} s",
                        started.elapsed().as_secs_f64()
                    )
                })
                .map_err(|e| e.to_string());
            tracing::warn!("switchover: {}", outcome.as_ref().unwrap_or_else(|e| e));
            let target = result_node(&outcome, cluster, to.as_ref());
            event(
                EventKind::Switchover,
                target.as_ref(),
                outcome.as_ref().unwrap_or_else(|e| e).clone(),
                outcome.is_ok(),
            );
            let _ = reply.send(outcome);
        }
        Command::Failover {
            to,
            allow_data_loss,
            reply,
        } => {
            let status = crate::status::observe(cluster).await.status;
            let mut rules = watch.rules(cluster);
            rules.allow_data_loss = allow_data_loss;
            let candidates = candidates(&status, cluster);
            let chosen = match (&to, herd_ha::choose_candidate(&candidates, &rules)) {
                (Some(t), Ok(safe)) if *t != safe && !allow_data_loss => Err(format!(
                    "{t} may lack acknowledged commits; {safe} holds them all (or pass --allow-data-loss)"
                )),
                (Some(t), _) if allow_data_loss => Ok(t.clone()),
                (Some(t), Ok(_)) => Ok(t.clone()),
                (None, Ok(safe)) => Ok(safe),
                (_, Err(why)) => Err(why),
            };
            let outcome = match chosen {
                Ok(c) => cluster
                    .fail_over(pg, dcs, &c)
                    .await
                    .map(|()| format!("failed over to {c}"))
                    .map_err(|e| e.to_string()),
                Err(why) => Err(format!("not failing over: {why}")),
            };
            tracing::warn!(
                "manual failover: {}",
                outcome.as_ref().unwrap_or_else(|e| e)
            );
            let target = result_node(&outcome, cluster, to.as_ref());
            event(
                EventKind::Failover,
                target.as_ref(),
                format!("by request: {}", outcome.as_ref().unwrap_or_else(|e| e)),
                outcome.is_ok(),
            );
            let _ = reply.send(outcome);
        }
        Command::Restart { node, reply } => {
            // The proxy stops sending reads to the replicas about to restart, and the reads
            // under way there finish, before they stop (the caller publishes them again).
            let mut draining = cluster.assignment();
            draining
                .replicas
                .retain(|r| node.as_ref().is_some_and(|n| *n != r.name));
            let _ = assignment_tx.send(draining);
            tokio::time::sleep(RESTART_DRAIN).await;
            let outcome = match &node {
                Some(n) => cluster
                    .restart_replica(pg, n)
                    .await
                    .map(|()| format!("restarted {n}")),
                None => cluster.restart_all(pg, dcs, gate.as_ref()).await,
            }
            .map_err(|e| e.to_string());
            tracing::warn!("restart: {}", outcome.as_ref().unwrap_or_else(|e| e));
            event(
                EventKind::Restart,
                node.as_ref(),
                outcome.as_ref().unwrap_or_else(|e| e).clone(),
                outcome.is_ok(),
            );
            let _ = reply.send(outcome);
        }
    }
}

/// The node an operator's promotion concerns: the new primary when it succeeded, else the
/// requested target.
fn result_node(
    outcome: &Result<String, String>,
    cluster: &Cluster,
    requested: Option<&NodeName>,
) -> Option<NodeName> {
    match outcome {
        Ok(_) => Some(cluster.state.primary.clone()),
        Err(_) => requested.cloned(),
    }
}

/// The replicas (not waiting for a rewind) as failover candidates.
fn candidates(status: &ClusterStatus, cluster: &Cluster) -> Vec<Candidate> {
    status
        .nodes
        .iter()
        .filter(|n| n.role == Role::Replica && !cluster.state.needs_rewind.contains(&n.name))
        .map(|n| Candidate {
            name: n.name.clone(),
            reachable: matches!(n.state, NodeState::Streaming | NodeState::Disconnected),
            flushed: n.received_lsn,
        })
        .collect()
}

/// The kind of a decision, for counting.
fn action_label(a: &Action) -> &'static str {
    match a {
        Action::Start(_) => "start",
        Action::ReportPrimaryDown(_) => "report_primary_down",
        Action::ReportWrongRole(_) => "report_wrong_role",
        Action::Failover(_) => "failover",
        Action::RefuseFailover => "refuse_failover",
        Action::Rejoin(_) => "rejoin",
    }
}

/// Leaves the latest high-availability event where `herd status` shows it.
fn note(cluster: &Cluster, text: &str) {
    let line = format!("{} {text}\n", unix_timestamp());
    let _ = std::fs::write(cluster.layout.ha_note(), line);
}

/// Seconds since the epoch (a calendar date is not worth a dependency here).
fn unix_timestamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("[unix {secs}]")
}

fn refresh(cluster: &mut Cluster) {
    match Config::load(&cluster.layout.config()) {
        Ok(config) => cluster.config = config.for_group(cluster.layout.group()),
        Err(e) => tracing::warn!("keeping the previous configuration: {e}"),
    }
    match ClusterState::load(&cluster.layout.state()) {
        Ok(Some(state)) => cluster.state = state,
        Ok(None) => tracing::warn!("state.json vanished; keeping the topology in memory"),
        Err(e) => tracing::warn!("keeping the previous topology: {e}"),
    }
}
