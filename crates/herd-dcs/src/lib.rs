//! The store the control plane keeps its facts in: who leads, which standbys are in the sync
//! set. `herd up` uses [`MemoryDcs`] (one supervisor, one process), or [`EmbeddedDcs`] (the
//! same, kept in a file across restarts); several hosts use [`EtcdDcs`], an etcd cluster behind
//! the same [`Dcs`] trait, so the HA logic is one code path. [`Scoped`] is one shard group's
//! view of any of them. Every backend passes [`contract::check`] (the etcd one against a real
//! etcd cluster).

mod embedded;
mod etcd;
mod etcd_probe;
mod memory;
mod scoped;

pub mod contract;

use std::time::Duration;

pub use embedded::{EmbeddedDcs, EmbeddedError};
pub use etcd::{EtcdConfig, EtcdDcs};
pub use etcd_probe::{probe_endpoints, EndpointProbe, EndpointState};
pub use memory::MemoryDcs;
pub use scoped::{Scoped, GROUP_ADMISSIONS, PROXIES, SHARD_MOVES};

/// A value and the revision it was written at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    /// The bytes stored.
    pub value: Vec<u8>,
    /// Increases with every write of the key; never 0 for an existing key.
    pub revision: u64,
}

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DcsError {
    /// A compare-and-set found another revision: someone else wrote first.
    #[error("{key} changed concurrently (expected revision {expected}, found {found})")]
    Conflict {
        /// The key.
        key: String,
        /// The revision the caller expected.
        expected: u64,
        /// The revision found (0: absent).
        found: u64,
    },
    /// The store cannot be reached; the caller must not assume anything about its state.
    #[error("the configuration store is unavailable: {0}")]
    Unavailable(String),
}

/// The contract every backend keeps. All operations are linearizable.
pub trait Dcs: Send + Sync {
    /// The key's value and revision, `None` when absent.
    fn get(&self, key: &str) -> Result<Option<Versioned>, DcsError>;

    /// Writes `value` only when the key is at revision `expected` (0: the key must not exist);
    /// returns the new revision, or [`DcsError::Conflict`] without writing.
    fn compare_and_set(&self, key: &str, expected: u64, value: Vec<u8>) -> Result<u64, DcsError>;

    /// Takes or renews lease `key` for `owner` for `ttl`: succeeds when the lease is free,
    /// expired, or already held by `owner` (renewal). Returns whether `owner` holds it now.
    /// A lease is never held by two owners at once.
    fn acquire_lease(&self, key: &str, owner: &str, ttl: Duration) -> Result<bool, DcsError>;

    /// Gives the lease up, if `owner` holds it.
    fn release_lease(&self, key: &str, owner: &str) -> Result<(), DcsError>;

    /// The current holder of an unexpired lease.
    fn lease_holder(&self, key: &str) -> Result<Option<String>, DcsError>;

    /// Writes `value` under `key` for `ttl`: the key disappears unless written again before
    /// the TTL runs out (a member's heartbeat). Never earlier than `ttl` after the call began.
    fn put_expiring(&self, key: &str, value: Vec<u8>, ttl: Duration) -> Result<(), DcsError>;

    /// Every present key that starts with `prefix`, with its value (sorted by key; leases are
    /// not listed).
    fn list(&self, prefix: &str) -> Result<Vec<(String, Versioned)>, DcsError>;

    /// A receiver whose value changes after any write of this cluster's keys (expiries
    /// included, as far as the backend sees them): readers re-read on each change instead of
    /// polling. The value itself means nothing.
    fn changes(&self) -> tokio::sync::watch::Receiver<u64>;

    /// Like [`Dcs::changes`], except that writes of keys starting with `prefix` alone (and
    /// their expiry) do not change it. An agent writes its heartbeat every round: woken by
    /// heartbeats (its own, or the other members', each written in a round some heartbeat
    /// started), the agents of a cluster would run rounds back to back instead of once per
    /// loop wait.
    fn changes_ignoring(&self, prefix: &str) -> tokio::sync::watch::Receiver<u64>;

    /// Like [`Dcs::changes`], limited to writes of keys starting with `within` and not with
    /// any of `ignoring`: one shard group's view ([`Scoped`]) is not woken by another group's
    /// writes. A backend that cannot tell keys apart may announce more, never less; this
    /// default does (it only narrows what [`Dcs::changes_ignoring`] can).
    fn changes_under(&self, within: &str, ignoring: &[&str]) -> tokio::sync::watch::Receiver<u64> {
        match ignoring {
            [one] if within.is_empty() => self.changes_ignoring(one),
            _ => self.changes(),
        }
    }
}

/// Where the lease named `name` is kept as a key: a lease `a/b/name` lives at
/// `a/b/leases/name`, so a shard group's leases stay under its prefix and group 0's
/// `leader` stays at `leases/leader`, where running clusters have it.
pub(crate) fn lease_path(name: &str) -> String {
    match name.rsplit_once('/') {
        Some((dir, last)) => format!("{dir}/leases/{last}"),
        None => format!("leases/{name}"),
    }
}

/// Whether `key` is where [`lease_path`] keeps a lease (its next-to-last segment is
/// `leases`), at any depth: such keys are not listed as values.
pub(crate) fn is_lease_path(key: &str) -> bool {
    let mut segments = key.rsplit('/');
    segments.next();
    segments.next() == Some("leases")
}

/// Which keys' writes a receiver is told of: those starting with `within` and with none of
/// `ignoring`.
#[derive(PartialEq, Eq)]
struct Interest {
    within: String,
    ignoring: Vec<String>,
}

impl Interest {
    fn covers(&self, key: &str) -> bool {
        key.starts_with(self.within.as_str())
            && !self.ignoring.iter().any(|i| key.starts_with(i.as_str()))
    }
}

/// The receivers of a backend's change announcements: one for every change, and one per
/// [`Interest`] some reader has.
pub(crate) struct Watchers {
    all: tokio::sync::watch::Sender<u64>,
    narrower: std::sync::Mutex<Vec<(Interest, tokio::sync::watch::Sender<u64>)>>,
}

impl Default for Watchers {
    fn default() -> Self {
        Watchers {
            all: tokio::sync::watch::channel(0).0,
            narrower: std::sync::Mutex::new(Vec::new()),
        }
    }
}

fn bump(sender: &tokio::sync::watch::Sender<u64>) {
    sender.send_modify(|n| *n = n.wrapping_add(1));
}

impl Watchers {
    /// A receiver changed by every announcement.
    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.all.subscribe()
    }

    /// A receiver not changed by announcements that name only keys under `prefix`.
    pub(crate) fn subscribe_ignoring(&self, prefix: &str) -> tokio::sync::watch::Receiver<u64> {
        self.subscribe_under("", &[prefix])
    }

    /// A receiver changed only by announcements naming some key under `within` and under
    /// none of `ignoring`.
    pub(crate) fn subscribe_under(
        &self,
        within: &str,
        ignoring: &[&str],
    ) -> tokio::sync::watch::Receiver<u64> {
        let interest = Interest {
            within: within.to_string(),
            ignoring: ignoring.iter().map(|i| i.to_string()).collect(),
        };
        if interest.within.is_empty() && interest.ignoring.is_empty() {
            return self.subscribe();
        }
        let mut list = self.narrower.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|(_, s)| s.receiver_count() > 0);
        if let Some((_, s)) = list.iter().find(|(i, _)| *i == interest) {
            return s.subscribe();
        }
        let (tx, rx) = tokio::sync::watch::channel(0);
        list.push((interest, tx));
        rx
    }

    /// Announces writes of `keys`; an empty list means "something, not known what" (a
    /// reconnected watch may have missed changes) and reaches every receiver.
    pub(crate) fn notify(&self, keys: &[&str]) {
        bump(&self.all);
        let list = self.narrower.lock().unwrap_or_else(|p| p.into_inner());
        for (interest, sender) in list.iter() {
            if keys.is_empty() || keys.iter().any(|k| interest.covers(k)) {
                bump(sender);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_live_next_to_their_group() {
        assert_eq!(lease_path("leader"), "leases/leader");
        assert_eq!(lease_path("groups/2/leader"), "groups/2/leases/leader");
        assert_eq!(lease_path("a/b/name"), "a/b/leases/name");
        for lease in ["leases/leader", "groups/2/leases/leader", "a/b/leases/x"] {
            assert!(is_lease_path(lease), "{lease}");
        }
        // A member or request named "leases" is a value, not a lease.
        for value in [
            "leases",
            "members/leases",
            "groups/2/members/leases",
            "leasesx/a",
        ] {
            assert!(!is_lease_path(value), "{value}");
        }
    }

    #[test]
    fn narrowed_receivers_hear_only_their_keys() {
        let w = Watchers::default();
        let group0 = w.subscribe_under("", &["groups/"]);
        let mut group1 = w.subscribe_under("groups/1/", &["groups/1/members/"]);
        w.notify(&["groups/1/config"]);
        assert!(!group0.has_changed().expect("open"));
        assert!(group1.has_changed().expect("open"));
        group1.borrow_and_update();
        w.notify(&["groups/1/members/a"]);
        assert!(!group1.has_changed().expect("open"));
        w.notify(&["leases/leader"]);
        assert!(group0.has_changed().expect("open"));
        assert!(!group1.has_changed().expect("open"));
        // Not known what: everyone re-reads.
        w.notify(&[]);
        assert!(group1.has_changed().expect("open"));
    }
}
