//! The store the control plane keeps its facts in: who leads, which standbys are in the sync
//! set. `herd up` uses [`MemoryDcs`] (one supervisor, one process); several hosts use
//! [`EtcdDcs`], an etcd cluster behind the same [`Dcs`] trait, so the HA logic is one code path.
//! Every backend passes [`contract::check`] (the etcd one against a real etcd cluster).

mod etcd;
mod etcd_probe;
mod memory;

pub mod contract;

use std::time::Duration;

pub use etcd::{EtcdConfig, EtcdDcs};
pub use etcd_probe::{probe_endpoints, EndpointProbe, EndpointState};
pub use memory::MemoryDcs;

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
}

/// The receivers of a backend's change announcements: one for every change, and one per key
/// prefix some reader ignores.
pub(crate) struct Watchers {
    all: tokio::sync::watch::Sender<u64>,
    ignoring: std::sync::Mutex<Vec<(String, tokio::sync::watch::Sender<u64>)>>,
}

impl Default for Watchers {
    fn default() -> Self {
        Watchers {
            all: tokio::sync::watch::channel(0).0,
            ignoring: std::sync::Mutex::new(Vec::new()),
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
        let mut list = self.ignoring.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|(_, s)| s.receiver_count() > 0);
        if let Some((_, s)) = list.iter().find(|(p, _)| p == prefix) {
            return s.subscribe();
        }
        let (tx, rx) = tokio::sync::watch::channel(0);
        list.push((prefix.to_string(), tx));
        rx
    }

    /// Announces writes of `keys`; an empty list means "something, not known what" (a
    /// reconnected watch may have missed changes) and reaches every receiver.
    pub(crate) fn notify(&self, keys: &[&str]) {
        bump(&self.all);
        let list = self.ignoring.lock().unwrap_or_else(|p| p.into_inner());
        for (ignored, sender) in list.iter() {
            if keys.is_empty() || keys.iter().any(|k| !k.starts_with(ignored.as_str())) {
                bump(sender);
            }
        }
    }
}
