//! What a stateless `herd proxy` routes by: the leader lease's holder as the primary (never
//! a node whose agent does not hold it), the other members in recovery as replicas. It
//! re-reads the store on every change the store's watch reports (at most once per 100 ms: each
//! member's heartbeat is one), and at least every second.
//!
//! It also holds new work at the proxy while a planned switchover runs ([`switchover_pending`]),
//! so clients see a pause rather than the old primary's "shutting down" errors.

use std::time::Duration;

use herd_core::{Assignment, Endpoint, NodeName};
use tokio::sync::watch;

use crate::decide::Store;
use crate::member::Member;
use crate::store::StoreClient;

fn endpoint(m: &Member) -> Endpoint {
    Endpoint {
        name: NodeName::from_text(&m.name),
        host: m.pg_host.clone(),
        port: m.pg_port,
        socket: m.socket.as_ref().map(std::path::PathBuf::from),
    }
}

/// The assignment the store describes, given the previous one: `None` before any leader was
/// ever seen. Without a leader (or without its heartbeat) the previous primary is kept but
/// marked down, so nothing is routed to it until a member holds the lease again.
pub fn assignment(store: &Store, previous: Option<&Assignment>) -> Option<Assignment> {
    let leader = store
        .leader
        .as_deref()
        .and_then(|l| store.members.iter().find(|m| m.name == l));
    // Only standbys that stream serve reads: one in recovery that does not (a former primary
    // started as a standby before it was rewound, whose WAL may hold commits nobody
    // acknowledged; a standby cut from its upstream) cannot show that it holds the primary's
    // history, and the proxy's lag check compares positions, not histories.
    let replicas: Vec<Endpoint> = store
        .members
        .iter()
        .filter(|m| {
            m.role == "replica"
                && m.streaming_from.is_some()
                && Some(m.name.as_str()) != store.leader.as_deref()
        })
        .map(endpoint)
        .collect();
    match leader {
        Some(l) => Some(Assignment {
            primary: endpoint(l),
            replicas,
            primary_down: l.role != "primary",
            // The group's commit settings: ANY k's k in the synchronous modes, 0 in async.
            durable_replicas: match store.settings.commit_mode {
                herd_core::CommitMode::Async => 0,
                _ => store.settings.sync_standbys.count,
            },
        }),
        None => previous.map(|p| Assignment {
            primary: p.primary.clone(),
            replicas,
            primary_down: true,
            durable_replicas: p.durable_replicas,
        }),
    }
}

/// The shortest time between two reads of the store by [`follow`].
pub const COALESCE: Duration = Duration::from_millis(100);

/// Longest hold of new work for one switchover: a handover that has not finished by then is
/// let through (its clients then see what the servers say), so a stuck request never stalls
/// the endpoint. A switchover normally takes one to three seconds; clients commonly time out
/// statements after 10 s or more.
pub const HOLD_LIMIT: Duration = Duration::from_secs(8);

/// Whether new work should wait at the proxy: a planned switchover (not a failover, whose
/// old leader is fenced at once) was asked for, and no member other than the one stepping
/// down leads and serves as primary yet.
pub fn switchover_pending(store: &Store) -> bool {
    let Some(h) = store.handover.as_ref().filter(|h| !h.immediate) else {
        return false;
    };
    let new_leader_serves = store
        .leader
        .as_deref()
        .filter(|l| *l != h.from)
        .and_then(|l| store.members.iter().find(|m| m.name == l))
        .is_some_and(|m| m.role == "primary");
    !new_leader_serves
}

/// The proxy's hold of new work during switchovers: on while one is pending, off when it
/// finished or after [`HOLD_LIMIT`] (and then not on again for the same request).
#[derive(Debug, Default)]
struct Hold {
    since: Option<tokio::time::Instant>,
    gave_up: bool,
}

impl Hold {
    /// The hold for this read: `Some(on)` when it changes.
    fn next(&mut self, pending: bool, now: tokio::time::Instant) -> Option<bool> {
        match (pending, self.since) {
            (false, since) => {
                self.gave_up = false;
                self.since = None;
                since.map(|_| false)
            }
            (true, None) if !self.gave_up => {
                self.since = Some(now);
                Some(true)
            }
            (true, Some(t)) if now.duration_since(t) >= HOLD_LIMIT => {
                tracing::warn!(
                    "a switchover has not finished after {} s; letting new work through",
                    HOLD_LIMIT.as_secs()
                );
                self.since = None;
                self.gave_up = true;
                Some(false)
            }
            _ => None,
        }
    }
}

/// Called with `true` to hold new work at the proxy, `false` to let it through.
pub type HoldGate = Box<dyn Fn(bool) + Send + Sync>;

/// Follows the store into `tx` until `shutdown` turns true. `tx` holds `None` until a member
/// first leads: the proxy serves from its start and tells clients that an election is under
/// way, rather than waiting for one before it listens. `gate` (if any) holds new work during
/// switchovers.
pub async fn follow(
    store: StoreClient,
    tx: watch::Sender<Option<Assignment>>,
    gate: Option<HoldGate>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut changes = store.dcs().changes();
    let mut hold = Hold::default();
    loop {
        let read_at = tokio::time::Instant::now();
        let previous = tx.borrow().clone();
        let next = match store.read().await {
            Ok(r) => {
                if let (Some(gate), Some(on)) = (
                    &gate,
                    hold.next(switchover_pending(&r.store), tokio::time::Instant::now()),
                ) {
                    tracing::info!(
                        "{} new work for a switchover",
                        if on { "holding" } else { "releasing" }
                    );
                    gate(on);
                }
                assignment(&r.store, previous.as_ref())
            }
            // The last known leader stays: it fences itself before its lease could pass to
            // another member, so routing to it can at worst fail, never reach a second
            // primary (and in failsafe mode it goes on serving).
            Err(e) => {
                tracing::warn!("cannot read the store ({e}); keeping the last known topology");
                None
            }
        };
        if let Some(next) = next {
            tx.send_if_modified(|current| {
                let changed = current.as_ref() != Some(&next);
                if changed {
                    let moved = current.as_ref().is_none_or(|c| {
                        c.primary != next.primary || c.primary_down != next.primary_down
                    });
                    if moved {
                        tracing::warn!(
                            "primary: {}{}",
                            next.primary.name,
                            if next.primary_down { " (down)" } else { "" }
                        );
                    }
                    *current = Some(next);
                }
                changed
            });
        }
        tokio::select! {
            _ = changes.changed() => {
                // Every member's heartbeat is a change: at most one read per COALESCE, however
                // many arrive (a lease change still shows within COALESCE).
                tokio::select! {
                    _ = tokio::time::sleep_until(read_at + COALESCE) => {}
                    _ = shutdown.changed() => {}
                }
            }
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            if let Some(gate) = &gate {
                gate(false);
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member::{ClusterSettings, Handover};

    fn m(name: &str, role: &str) -> Member {
        Member {
            name: name.into(),
            instance: "i".into(),
            role: role.into(),
            pg_host: format!("10.0.0.{}", name.len()),
            pg_port: 5432,
            api: String::new(),
            lsn: None,
            replayed: None,
            streaming_from: (role == "replica").then(|| "a".to_string()),
            socket: None,
            tls_not_after: None,
            tls_issuer: None,
            tls_trusts: Vec::new(),
            archiving: None,
            secrets_rotation: None,
            walsenders: Vec::new(),
        }
    }

    fn store(leader: Option<&str>, members: Vec<Member>) -> Store {
        Store {
            initialized: true,
            leader: leader.map(str::to_string),
            members,
            sync_set: vec![],
            last_sync: vec![],
            last_leader: None,
            settings: ClusterSettings::default(),
            handover: None,
            restarts: Vec::new(),
        }
    }

    #[test]
    fn the_lease_holder_is_the_only_primary() {
        let s = store(
            Some("a"),
            vec![m("a", "primary"), m("bb", "replica"), m("ccc", "stopped")],
        );
        let a = assignment(&s, None).expect("assignment");
        assert_eq!(a.primary.name.as_str(), "a");
        assert!(!a.primary_down);
        assert_eq!(a.replicas.len(), 1, "only members in recovery serve reads");
        // The holder has not promoted yet: known, but not routed to.
        let s = store(Some("bb"), vec![m("a", "stopped"), m("bb", "replica")]);
        let b = assignment(&s, Some(&a)).expect("assignment");
        assert_eq!(b.primary.name.as_str(), "bb");
        assert!(b.primary_down);
        assert!(b.replicas.is_empty(), "the holder is not a read replica");
        // A standby that does not stream (a former primary before its rewind) serves no reads.
        let mut unproven = m("dddd", "replica");
        unproven.streaming_from = None;
        let s = store(
            Some("a"),
            vec![m("a", "primary"), m("bb", "replica"), unproven],
        );
        let d = assignment(&s, None).expect("assignment");
        let names: Vec<&str> = d.replicas.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["bb"]);
        // A node that writes but holds no lease is never the primary.
        let s = store(None, vec![m("a", "primary"), m("bb", "replica")]);
        assert!(assignment(&s, None).is_none());
        let c = assignment(&s, Some(&a)).expect("previous kept");
        assert!(c.primary_down);
    }

    fn handover(from: &str, immediate: bool) -> Option<Handover> {
        Some(Handover {
            from: from.into(),
            immediate,
            ..Handover::default()
        })
    }

    #[test]
    fn a_switchover_holds_new_work_until_the_new_leader_serves() {
        let mut s = store(Some("a"), vec![m("a", "primary"), m("bb", "replica")]);
        assert!(!switchover_pending(&s), "no request");
        s.handover = handover("a", false);
        assert!(switchover_pending(&s), "asked, the old leader still leads");
        s.leader = None;
        s.members[0].role = "stopped".into();
        assert!(switchover_pending(&s), "lease released, nobody took it");
        s.leader = Some("bb".into());
        assert!(switchover_pending(&s), "taken, not promoted yet");
        s.members[1].role = "primary".into();
        assert!(!switchover_pending(&s), "the new leader serves");
        // A failover fences the old leader at once: nothing to wait for.
        let mut f = store(Some("a"), vec![m("a", "primary"), m("bb", "replica")]);
        f.handover = handover("a", true);
        assert!(!switchover_pending(&f));
    }

    #[test]
    fn a_hold_ends_when_done_or_after_its_limit_and_not_again_for_the_same_request() {
        let t0 = tokio::time::Instant::now();
        let mut h = Hold::default();
        assert_eq!(h.next(false, t0), None, "nothing to release");
        assert_eq!(h.next(true, t0), Some(true));
        assert_eq!(h.next(true, t0 + Duration::from_secs(1)), None, "held");
        assert_eq!(h.next(false, t0 + Duration::from_secs(2)), Some(false));
        // A request that never finishes is let through after HOLD_LIMIT, once.
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(h.next(true, t1), Some(true));
        assert_eq!(h.next(true, t1 + HOLD_LIMIT), Some(false));
        assert_eq!(h.next(true, t1 + HOLD_LIMIT * 2), None, "not again");
        assert_eq!(h.next(false, t1 + HOLD_LIMIT * 3), None);
        assert_eq!(
            h.next(true, t1 + HOLD_LIMIT * 4),
            Some(true),
            "a new request"
        );
    }

    /// A store that counts reads of the leader lease (one per [`StoreClient::read`]).
    struct Counting {
        inner: herd_dcs::MemoryDcs,
        reads: std::sync::atomic::AtomicU64,
    }

    impl herd_dcs::Dcs for Counting {
        fn get(&self, key: &str) -> Result<Option<herd_dcs::Versioned>, herd_dcs::DcsError> {
            self.inner.get(key)
        }
        fn compare_and_set(
            &self,
            key: &str,
            expected: u64,
            value: Vec<u8>,
        ) -> Result<u64, herd_dcs::DcsError> {
            self.inner.compare_and_set(key, expected, value)
        }
        fn acquire_lease(
            &self,
            key: &str,
            owner: &str,
            ttl: Duration,
        ) -> Result<bool, herd_dcs::DcsError> {
            self.inner.acquire_lease(key, owner, ttl)
        }
        fn release_lease(&self, key: &str, owner: &str) -> Result<(), herd_dcs::DcsError> {
            self.inner.release_lease(key, owner)
        }
        fn lease_holder(&self, key: &str) -> Result<Option<String>, herd_dcs::DcsError> {
            self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.lease_holder(key)
        }
        fn put_expiring(
            &self,
            key: &str,
            value: Vec<u8>,
            ttl: Duration,
        ) -> Result<(), herd_dcs::DcsError> {
            self.inner.put_expiring(key, value, ttl)
        }
        fn list(
            &self,
            prefix: &str,
        ) -> Result<Vec<(String, herd_dcs::Versioned)>, herd_dcs::DcsError> {
            self.inner.list(prefix)
        }
        fn changes(&self) -> watch::Receiver<u64> {
            self.inner.changes()
        }
        fn changes_ignoring(&self, prefix: &str) -> watch::Receiver<u64> {
            self.inner.changes_ignoring(prefix)
        }
    }

    /// Heartbeats every 5 ms (200 changes a second) cost the proxy about ten reads a second.
    #[tokio::test]
    async fn wake_ups_are_coalesced() {
        let dcs = std::sync::Arc::new(Counting {
            inner: herd_dcs::MemoryDcs::default(),
            reads: std::sync::atomic::AtomicU64::new(0),
        });
        let first = assignment(&store(Some("a"), vec![m("a", "primary")]), None).expect("a");
        let client = StoreClient::new(dcs.clone());
        let (tx, _rx) = watch::channel(Some(first));
        let (stop, shutdown) = watch::channel(false);
        let follower = tokio::spawn(follow(client, tx, None, shutdown));
        let span = Duration::from_secs(1);
        let started = std::time::Instant::now();
        let mut writes = 0;
        while started.elapsed() < span {
            herd_dcs::Dcs::put_expiring(
                dcs.as_ref(),
                "members/a",
                format!("{writes}").into_bytes(),
                Duration::from_secs(10),
            )
            .expect("write");
            writes += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let _ = stop.send(true);
        follower.await.expect("follower");
        let reads = dcs.reads.load(std::sync::atomic::Ordering::SeqCst);
        assert!(writes > 50, "{writes} writes");
        assert!(
            (5..=13).contains(&reads),
            "{reads} reads for {writes} changes in {span:?}"
        );
    }
}
