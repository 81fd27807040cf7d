//! The agent's rounds: observe the node and the store, publish the heartbeat, decide, act.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use herd_core::{ClusterEvent, EventKind, Lsn};
use tokio::sync::watch;

use crate::api::{self, SharedState};
use crate::book::Book;
use crate::decide::{decide, Local, Policy, Step, View};
use crate::jobs::{Done, JobKind, Jobs};
use crate::member::{
    encode, ClusterSettings, Handover, Initialized, Member, SyncRecord, CONFIG, HANDOVER,
    INITIALIZE, MEMBERS, SYNC,
};
use crate::node::{Node, Observed};
use crate::steplog::{emit, kind, log_level};
use crate::store::{Read, StoreClient};
use crate::watchdog::Deadline;
use crate::AgentError;

/// How long a restarting standby waits, out of the read pool, before it stops: the proxies read
/// its record within `follow::COALESCE` of its change, or at the latest on their one-second
/// re-read; sessions that had just been sent a read finish it.
fn restart_drain(loop_wait: Duration) -> Duration {
    (Duration::from_secs(1) + crate::follow::COALESCE * 2).max(loop_wait)
}

/// A planned switchover's first wait: the proxies hold new work once they read the request
/// (within `follow::COALESCE` of its write).
const SWITCHOVER_SETTLE: Duration = Duration::from_millis(300);
/// Longest wait for the statements and transactions already under way before a planned stop.
const SWITCHOVER_DRAIN: Duration = Duration::from_secs(1);
/// How long a new group ≥ 1 waits for group 0's primary to copy its superuser's verifier.
const VERIFIER_WAIT: Duration = Duration::from_secs(60);
/// Time kept for the clean stop itself before the lease's fencing deadline.
const STOP_ALLOWANCE: Duration = Duration::from_secs(2);

/// Waits between rounds: `wait`, or less when the store announces a change (a lease gone, a
/// new leader), which is acted on at once after a short pause that lets a burst of writes
/// settle, or until shutdown.
pub async fn pause(
    changes: &mut watch::Receiver<u64>,
    wait: Duration,
    shutdown: &mut watch::Receiver<bool>,
) {
    tokio::select! {
        _ = tokio::time::sleep(wait) => {}
        _ = changes.changed() => {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        _ = shutdown.changed() => {}
    }
}

/// The members' answer to a failsafe question.
struct FailsafeAnswer {
    /// Sent at (the extension counts from here).
    asked_at: Instant,
    /// How many were asked.
    members: usize,
    /// Every one confirmed that it cannot reach the store either.
    confirmed: bool,
}

/// What the loop remembers between rounds.
pub struct Agent {
    /// The local node.
    pub node: Node,
    /// The store.
    pub store: StoreClient,
    /// The watchdog's deadline.
    pub deadline: Deadline,
    /// Shared with the API.
    pub shared: SharedState,
    /// This process's random id.
    pub instance: String,
    /// When the lease (or a failsafe confirmation) stops covering writes.
    fence_at: Option<Instant>,
    /// Downtime, streaming and start attempts, remembered between rounds.
    book: Book,
    /// Timeouts and back-off, from the lease timings.
    policy: Policy,
    /// The long action under way (clone, rejoin, re-clone), if any.
    jobs: Jobs,
    /// The leader's last published position.
    last_leader_lsn: Lsn,
    /// Every member seen in a good read since this agent started, name → API address: failsafe
    /// asks them all. Not only the last read's: a member whose record had just expired may be
    /// back and reach the store, and it must be asked before the primary serves on.
    known: std::collections::BTreeMap<String, String>,
    /// The recorded synchronous standbys at the last good read (each must be asked too).
    last_sync: Vec<String>,
    /// Members a slot was created for.
    slotted: BTreeSet<String>,
    /// The standby list applied on the primary and the position it took effect at.
    applied: Option<(Vec<String>, Lsn)>,
    /// The system identifier was compared with the cluster's.
    identity_checked: bool,
    /// The last step logged (each is logged when it changes).
    last_logged: String,
    /// The kind of the last round's step: a change of kind is logged at info.
    last_kind: Option<&'static str>,
    /// Rounds run since start (`herd_agent_rounds_total` on the API's `/metrics`).
    rounds: u64,
    /// The store's root, for cluster-wide keys (the group's own keys go through `store`).
    root: StoreClient,
    /// `herd up` only: fences the other local members' servers before this one promotes.
    peer_fence: Option<PeerFence>,
    /// Since when this agent sees the group without a leading primary, and which member led
    /// last (for the failover event's words); cleared once another member leads.
    vacant: Option<(Instant, Option<String>)>,
    /// The server served (as primary or replica) since this agent started: a later start of
    /// it is a restart after it stopped, shown on the timeline.
    served: bool,
    /// This member's acknowledgement of the password rotation under way (in its record).
    rotation_ack: Option<String>,
    /// The superuser password this member used before the rotation under way renamed it: its
    /// API still accepts that key until the rotation's record is gone.
    rotation_previous: Option<String>,
}

/// Given to the agents of `herd up` (several nodes on one host, one process): called with the
/// promoting member's name before it promotes, it kills every other member's server of the
/// group that could still accept writes. It stands in for the watchdog there: a leader whose
/// agent task stalls (so its lease expired) cannot serve beside its successor.
pub type PeerFence = std::sync::Arc<dyn Fn(&str) + Send + Sync>;

impl Agent {
    /// An agent over `node` and `store`.
    pub fn new(
        node: Node,
        store: StoreClient,
        deadline: Deadline,
        shared: SharedState,
        instance: String,
        root: StoreClient,
    ) -> Self {
        let policy = node.cfg.policy;
        Agent {
            node,
            store,
            deadline,
            shared,
            instance,
            fence_at: None,
            book: Book::default(),
            policy,
            jobs: Jobs::default(),
            last_leader_lsn: Lsn(0),
            known: std::collections::BTreeMap::new(),
            last_sync: Vec::new(),
            slotted: BTreeSet::new(),
            applied: None,
            identity_checked: false,
            last_logged: String::new(),
            vacant: None,
            served: false,
            last_kind: None,
            rounds: 0,
            root,
            peer_fence: None,
            rotation_ack: None,
            rotation_previous: None,
        }
    }

    /// With a fence of the other local members' servers run before this one promotes.
    pub fn with_peer_fence(mut self, fence: PeerFence) -> Self {
        self.peer_fence = Some(fence);
        self
    }

    /// Runs rounds until `shutdown` turns true; fails only on conditions an operator must fix
    /// (another cluster's data directory).
    pub async fn run(&mut self, mut shutdown: watch::Receiver<bool>) -> Result<(), AgentError> {
        // Not woken by heartbeats: each agent writes its own every round, so waking on them
        // chains the members' rounds back to back (~20 ms apart instead of the loop wait). What
        // must be acted on at once — the lease, the sync record, a handover, the settings — are
        // other keys; a member record's change waits at most one loop wait.
        let mut changes = self.store.dcs().changes_ignoring(MEMBERS);
        loop {
            self.round().await?;
            self.node.renew_certificate().await;
            if !self.node.fresh_secrets {
                self.node.refresh_secrets();
            }
            self.follow_rotation().await;
            let mut wait = self.node.cfg.loop_wait;
            if let Some(at) = self.fence_at {
                // Never sleep past the fencing instant.
                wait = wait.min(at.saturating_duration_since(Instant::now()));
            }
            // A job's end wakes the next round at once: its result is that round's input.
            tokio::select! {
                _ = pause(&mut changes, wait, &mut shutdown) => {}
                _ = self.jobs.finished() => {}
            }
            if *shutdown.borrow() {
                if let Some(kind) = self.jobs.busy() {
                    // As before jobs: a clone or rewind is not cut off half-way.
                    tracing::info!("waiting for the running {kind:?} to end before stopping");
                    self.jobs.finished().await;
                }
                return Ok(());
            }
        }
    }

    async fn round(&mut self) -> Result<(), AgentError> {
        self.rounds += 1;
        api::lock(&self.shared).rounds = self.rounds;
        // The probe and the read run side by side; while this member leads with the store
        // unreachable since the last round, so does the failsafe question: a round during an
        // outage then lasts the longest of them, not their sum, and fits in the lease's slack.
        let question = if self.fence_at.is_some() && !api::lock(&self.shared).store_reachable {
            self.failsafe_question()
        } else {
            None
        };
        if let Some(done) = self.jobs.take_done().await {
            self.job_ended(done);
        }
        let busy = self.jobs.busy();
        let observe = async {
            match busy {
                // The job owns the server meanwhile.
                Some(kind) => Observed {
                    local: Local::Busy(kind),
                    primary: None,
                    replayed: None,
                    archiving: None,
                },
                None => self.node.observe().await,
            }
        };
        let (observed, mut read, answer) = tokio::join!(observe, self.store.read(), async move {
            match question {
                Some(q) => Some(q.await),
                None => None,
            }
        });
        if let Ok(r) = &mut read {
            // This member claimed the creation but never finished it (it died during initdb):
            // it tries again.
            let unfinished = r
                .initialized
                .as_ref()
                .is_some_and(|(i, _)| i.by == self.node.cfg.name && i.system_identifier.is_empty());
            if unfinished && observed.local == Local::Empty {
                r.store.initialized = false;
            }
        }
        api::lock(&self.shared).store_reachable = read.is_ok();
        let member = self.member(&observed);
        api::lock(&self.shared).member = Some(member.clone());
        if let Ok(r) = &read {
            if !self.check_identity(r, &observed).await? {
                // Not known yet (the server did not answer in time): nothing is decided on a
                // data directory that may be another cluster's; the next round asks again.
                return Ok(());
            }
            if let Err(e) = self.store.publish(&member, self.node.cfg.ttl).await {
                tracing::warn!("cannot publish the heartbeat: {e}");
            }
            for m in &r.store.members {
                self.known.insert(m.name.clone(), m.api.clone());
            }
            self.last_sync = r.store.sync_set.clone();
            let me = self.node.cfg.name.as_str();
            let leading = r
                .store
                .leader
                .as_deref()
                .and_then(|l| r.store.members.iter().find(|m| m.name == l))
                .filter(|m| m.role == "primary");
            match leading {
                Some(m) if m.name != me => self.vacant = None,
                Some(_) => {}
                None => {
                    let last = r.store.last_leader.clone().filter(|l| l != me);
                    let since = self.vacant.take().map_or(Instant::now(), |(t, _)| t);
                    self.vacant = Some((since, last));
                }
            }
            if let Some(l) = r
                .store
                .leader
                .as_deref()
                .and_then(|l| r.store.members.iter().find(|m| m.name == l))
            {
                self.last_leader_lsn = l.lsn.unwrap_or(self.last_leader_lsn);
            }
        }
        if let Ok(r) = &read {
            self.follow_settings(r, &observed.local).await;
        }
        if observed.local != Local::Primary {
            // Slots live in the primary's data directory; a rewind or clone drops them, so a
            // member that leads again creates them again.
            self.slotted.clear();
        }
        let leads = read
            .as_ref()
            .ok()
            .map(|r| r.store.leader.as_deref() == Some(self.node.cfg.name.as_str()));
        if matches!(observed.local, Local::Primary | Local::Replica { .. }) {
            self.served = true;
        }
        if self.book.observe(&observed.local, leads, Instant::now()) {
            tracing::warn!(
                "PostgreSQL stopped serving while this member leads ({:?}); another member takes \
                 over after {:.1} s (no postmaster) or {:.1} s (not answering) unless it is back, \
                 and it is restarted in place if no other member can",
                observed.local,
                self.policy.failover_timeout.as_secs_f64(),
                self.policy.hung_timeout.as_secs_f64()
            );
        }
        match &observed.local {
            Local::NotAnswering
            | Local::Replica {
                streaming: false, ..
            } => self.node.log_watch.poll(),
            _ => self.node.log_watch.reset(),
        }
        if self.fence_at.is_some_and(|at| at <= Instant::now()) {
            // Past the deadline the watchdog has fenced the server: no extension can follow.
            self.fence_at = None;
        }
        // Asked whenever a fencing deadline is armed (this member led), not only when the
        // last probe of its server answered: a probe that failed once under load must not
        // cost the failsafe extension.
        if self.fence_at.is_some() && read.is_err() {
            match answer {
                Some(answer) => self.apply_failsafe(answer),
                None => {
                    if let Some(q) = self.failsafe_question() {
                        let answer = q.await;
                        self.apply_failsafe(answer);
                    }
                }
            }
        }
        let now = Instant::now();
        let view = View {
            me: self.node.cfg.name.clone(),
            local: observed.local.clone(),
            store: read.as_ref().map(|r| r.store.clone()).map_err(Clone::clone),
            was_primary: self.node.was_primary(),
            lease_left: self.fence_at.map(|at| at.saturating_duration_since(now)),
            not_streaming_for: self.book.not_streaming_for(now),
            promised: api::lock(&self.shared)
                .promised_until
                .is_some_and(|t| t > now),
            last_leader_lsn: self.last_leader_lsn,
            upstream_lacks_wal: self.node.log_watch.upstream_lacks_wal(),
            down_for: self.book.down_for(now),
            failed_starts: self.book.failed_starts(),
            since_last_start: self.book.since_last_start(now),
            policy: self.policy,
        };
        let step = decide(&view);
        self.log(&step);
        self.count(&step);
        if matches!(
            step,
            Step::StartPrimary | Step::StartReplica | Step::Rejoin(_)
        ) {
            self.book.start_attempted(Instant::now());
        }
        if matches!(step, Step::Clone(_)) && self.node.fresh_secrets {
            return Err(AgentError::Setup(format!(
                "another member created the cluster, but this host made its own passwords in {}; \
                 replace that directory with a copy of the creating host's secrets and start again",
                self.node.layout.secrets().display()
            )));
        }
        let (what, failed) = (format!("{step:?}"), log_level(&step, None, true));
        if let Err(e) = self.act(step, &observed, read.ok()).await {
            emit(failed, &format!("{what} failed: {e}"));
            // The same step is logged again when it is retried.
            self.last_logged.clear();
        }
        Ok(())
    }

    /// Logs the round's step at the level [`log_level`] picks for it; repeats of the same
    /// text are not logged again (a steady member's log stays quiet at every level).
    fn log(&mut self, step: &Step) {
        let level = log_level(step, self.last_kind, false);
        self.last_kind = Some(kind(step));
        let text = match step {
            Step::Wait(why) => format!("waiting: {why}"),
            other => format!("{other:?}"),
        };
        if text == self.last_logged {
            return;
        }
        emit(level, &text);
        self.last_logged = text;
    }

    /// Disarms the fencing deadline and releases the leader lease (the server no longer
    /// writes: it was fenced or stopped before).
    async fn give_up_lease(&mut self) -> Result<(), AgentError> {
        self.disarm();
        self.store
            .release(&self.node.cfg.name)
            .await
            .map_err(AgentError::Store)
    }

    /// Starts a long action on a copy of the node (see [`crate::jobs`]).
    fn start_job(&mut self, kind: JobKind, leader: Member) -> Result<(), AgentError> {
        let mut node = self.node.detached();
        let name = leader.name.clone();
        let drain = restart_drain(self.node.cfg.loop_wait);
        self.jobs.start(kind, name, async move {
            let result = match kind {
                JobKind::Clone => node.clone_from(&leader).await,
                JobKind::Rejoin => node.rejoin(&leader).await,
                JobKind::Reclone => node.reclone(&leader).await,
                JobKind::Restart => node.restart(&leader, drain).await,
            };
            (node.upstream, result)
        })
    }

    /// Takes a finished job's result over: the upstream it configured; a failure is logged
    /// (the next rounds decide again from what the server is now).
    fn job_ended(&mut self, done: Done) {
        self.node.upstream = done.upstream;
        // What the log said before the job is about the old data directory or upstream.
        self.node.log_watch.reset();
        let (kind, what) = match done.kind {
            JobKind::Clone => (None, "joined by a clone"),
            JobKind::Rejoin => (Some(EventKind::Rejoin), "rejoined as a replica"),
            JobKind::Reclone => (Some(EventKind::Rejoin), "rejoined by a fresh clone"),
            JobKind::Restart => (Some(EventKind::Restart), "restarted its server"),
        };
        let (text, ok) = match &done.result {
            Ok(()) => {
                tracing::info!("{:?} from {} done", done.kind, done.leader);
                (format!("{what} of {}", done.leader), true)
            }
            Err(e) => {
                tracing::warn!("{:?} from {} failed: {e}", done.kind, done.leader);
                // The step that follows is logged even if it repeats the one before the job.
                self.last_logged.clear();
                (format!("{what} of {}: failed: {e}", done.leader), false)
            }
        };
        if let Some(kind) = kind {
            self.note(kind, text, ok);
        }
    }

    /// Applies the store's reloadable settings that concern every member (today
    /// `wal_compression`) to a running server; a failure is logged and tried again next round.
    async fn follow_settings(&mut self, read: &Read, local: &Local) {
        if let Some(tls) = self.node.tls.as_mut() {
            tls.issue_from_next = read.store.settings.issue_from_next_ca;
        }
        let wanted = read.store.settings.wal_compression.clone();
        let upstream = match local {
            Local::Primary => None,
            Local::Replica { .. } => {
                let following = self.node.upstream.clone();
                match read
                    .store
                    .members
                    .iter()
                    .find(|m| Some(&m.name) == following.as_ref())
                {
                    Some(m) => Some(m.clone()),
                    // Its upstream has no heartbeat now: the rewrite waits for a round that
                    // knows where it streams from.
                    None => return,
                }
            }
            _ => return,
        };
        match self
            .node
            .apply_wal_compression(wanted, upstream.as_ref())
            .await
        {
            Ok(true) => tracing::info!(
                "wal_compression = {} from the store",
                read.store
                    .settings
                    .wal_compression
                    .as_deref()
                    .unwrap_or_default()
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!("cannot apply wal_compression from the store: {e}"),
        }
    }

    /// Adds an event about this member to its group's timeline in the store.
    fn note(&self, kind: EventKind, text: String, ok: bool) {
        let cfg = &self.node.cfg;
        let text = format!("{}: {text}", cfg.name);
        let event = ClusterEvent::now(cfg.group, kind, Some(cfg.name.clone()), text, ok);
        crate::events::record(&self.store, &cfg.name, event);
    }

    /// Counts the step in `herd_ha_decisions_total` (the one-host supervisor's metric): every
    /// step but the steady ones (renewing, waiting), which would only count rounds.
    fn count(&self, step: &Step) {
        if matches!(step, Step::Renew | Step::Wait(_)) {
            return;
        }
        *api::lock(&self.shared)
            .decisions
            .entry(crate::steplog::label(step))
            .or_default() += 1;
    }

    /// This agent's heartbeat record.
    fn member(&self, observed: &Observed) -> Member {
        let cfg = &self.node.cfg;
        let (role, lsn, streaming_from) = match &observed.local {
            Local::Primary => (
                "primary",
                observed.primary.as_ref().map(|p| p.current_lsn),
                None,
            ),
            Local::Replica {
                upstream,
                streaming,
                lsn,
            } => ("replica", *lsn, upstream.clone().filter(|_| *streaming)),
            Local::Empty => ("starting", None, None),
            Local::Stopped => ("stopped", None, None),
            Local::NotAnswering => ("unreachable", None, None),
            Local::Busy(kind) => (kind.role(), None, None),
        };
        Member {
            name: cfg.name.clone(),
            instance: self.instance.clone(),
            role: role.into(),
            pg_host: cfg.pg_advertise.clone(),
            pg_port: cfg.pg_port,
            api: cfg.api_advertise.clone(),
            lsn,
            replayed: observed.replayed,
            streaming_from,
            socket: cfg
                .paths
                .as_ref()
                .and_then(|p| p.socket_dir.as_deref())
                .map(|dir| herd_pg::socket_path(dir, cfg.pg_port).display().to_string()),
            tls_not_after: self.node.tls.as_ref().map(|t| t.not_after),
            tls_issuer: self.node.tls.as_ref().and_then(|t| t.issuer.clone()),
            tls_trusts: self
                .node
                .tls
                .as_ref()
                .map(|t| t.trusts.clone())
                .unwrap_or_default(),
            archiving: observed.archiving.clone(),
            secrets_rotation: self.rotation_ack.clone(),
            walsenders: match (&observed.local, &observed.primary) {
                (Local::Primary, Some(p)) => p.replication.clone(),
                _ => Vec::new(),
            },
        }
    }

    /// Refuses a data directory that belongs to another cluster: `Ok(true)` once it is known
    /// to be this cluster's (or there is nothing to compare yet), `Ok(false)` while the server
    /// could not tell (a slow start or a loaded machine: a timeout is no reason to stop the
    /// agent for good, which is what an error here does).
    async fn check_identity(
        &mut self,
        read: &Read,
        observed: &Observed,
    ) -> Result<bool, AgentError> {
        if self.identity_checked
            || !matches!(observed.local, Local::Primary | Local::Replica { .. })
        {
            return Ok(true);
        }
        let Some((init, _)) = &read.initialized else {
            return Ok(true);
        };
        if init.system_identifier.is_empty() {
            return Ok(true);
        }
        let mine = match self.node.system_identifier().await {
            Ok(mine) => mine,
            Err(e) => {
                tracing::warn!(
                    "{}: cannot read the server's system identifier yet ({e}); asking again next round",
                    self.node.cfg.name
                );
                return Ok(false);
            }
        };
        if mine != init.system_identifier {
            return Err(AgentError::OtherCluster {
                dir: self.node.cfg.pgdata(),
                found: mine,
                expected: init.system_identifier.clone(),
            });
        }
        self.identity_checked = true;
        Ok(true)
    }
}

mod act;
mod keep_sync;
mod lease;
mod secrets;

#[cfg(test)]
mod rounds;
