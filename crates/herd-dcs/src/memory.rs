//! The in-memory backend of the embedded mode (one supervisor process).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::{Dcs, DcsError, Versioned, Watchers};

/// A [`Dcs`] in this process's memory. Its clock is injectable so tests can expire leases
/// without sleeping.
pub struct MemoryDcs {
    state: Mutex<State>,
    clock: Box<dyn Fn() -> Instant + Send + Sync>,
    changed: Watchers,
}

/// A lease as held: by whom, until when, and for how long each take or renewal lasts.
struct Lease {
    holder: String,
    until: Instant,
    ttl: Duration,
}

#[derive(Default)]
struct State {
    keys: HashMap<String, Versioned>,
    /// When keys written by `put_expiring` disappear.
    expiry: HashMap<String, Instant>,
    leases: HashMap<String, Lease>,
    revision: u64,
}

/// What outlives a restart of the embedded store ([`crate::EmbeddedDcs`]): the keys written by
/// compare-and-set, the revision counter, and each unexpired lease's holder and TTL.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Durable {
    pub(crate) revision: u64,
    pub(crate) keys: BTreeMap<String, Versioned>,
    /// Lease name → (holder, TTL).
    pub(crate) leases: BTreeMap<String, (String, Duration)>,
}

impl State {
    /// Forgets expired keys.
    fn expire(&mut self, now: Instant) {
        let gone: Vec<String> = self
            .expiry
            .iter()
            .filter(|(_, until)| **until <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.expiry.remove(&k);
            self.keys.remove(&k);
        }
    }
}

impl Default for MemoryDcs {
    fn default() -> Self {
        MemoryDcs::with_clock(Box::new(Instant::now))
    }
}

impl MemoryDcs {
    /// A store reading time from `clock`.
    pub fn with_clock(clock: Box<dyn Fn() -> Instant + Send + Sync>) -> Self {
        MemoryDcs {
            state: Mutex::new(State::default()),
            clock,
            changed: Watchers::default(),
        }
    }

    /// A store holding `durable`'s keys and revisions, each lease held by its holder for one
    /// TTL from now (its holder, if still alive, renews it in its next round).
    pub(crate) fn restored(
        durable: Durable,
        clock: Box<dyn Fn() -> Instant + Send + Sync>,
    ) -> Self {
        let now = clock();
        let store = MemoryDcs::with_clock(clock);
        {
            let mut s = store.lock();
            s.revision = durable.revision;
            s.keys = durable.keys.into_iter().collect();
            s.leases = durable
                .leases
                .into_iter()
                .map(|(name, (holder, ttl))| {
                    let until = now + ttl;
                    (name, Lease { holder, until, ttl })
                })
                .collect();
        }
        store
    }

    /// What a restart must keep (see [`Durable`]).
    pub(crate) fn durable(&self) -> Durable {
        let now = (self.clock)();
        let s = self.lock();
        Durable {
            revision: s.revision,
            keys: s
                .keys
                .iter()
                .filter(|(k, _)| !s.expiry.contains_key(*k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            leases: s
                .leases
                .iter()
                .filter(|(_, l)| l.until > now)
                .map(|(name, l)| (name.clone(), (l.holder.clone(), l.ttl)))
                .collect(),
        }
    }

    /// [`Dcs::acquire_lease`], also telling whether the holder changed (taken from nobody or
    /// from an expired holder), which a renewal does not.
    pub(crate) fn take_lease(&self, key: &str, owner: &str, ttl: Duration) -> (bool, bool) {
        let now = (self.clock)();
        let mut s = self.lock();
        let (free, changed) = match s.leases.get(key) {
            None => (true, true),
            Some(l) if l.until <= now => (true, true),
            Some(l) => (l.holder == owner, false),
        };
        if free {
            let lease = Lease {
                holder: owner.to_string(),
                until: now + ttl,
                ttl,
            };
            s.leases.insert(key.to_string(), lease);
        }
        drop(s);
        if changed {
            self.notify(&crate::lease_path(key));
        }
        (free, changed)
    }

    /// [`Dcs::release_lease`], telling whether `owner` held it (the holder changed).
    pub(crate) fn give_up_lease(&self, key: &str, owner: &str) -> bool {
        let mut s = self.lock();
        if s.leases.get(key).is_none_or(|l| l.holder != owner) {
            return false;
        }
        s.leases.remove(key);
        drop(s);
        self.notify(&crate::lease_path(key));
        true
    }

    /// [`Dcs::lease_holder`], also telling whether an expired lease was found (and dropped:
    /// its holder changed to nobody).
    pub(crate) fn holder(&self, key: &str) -> (Option<String>, bool) {
        let now = (self.clock)();
        let mut s = self.lock();
        match s.leases.get(key) {
            None => (None, false),
            Some(l) if l.until > now => (Some(l.holder.clone()), false),
            Some(_) => {
                s.leases.remove(key);
                drop(s);
                self.notify(&crate::lease_path(key));
                (None, true)
            }
        }
    }

    /// [`Dcs::put_expiring`], telling whether it replaced a key written by compare-and-set
    /// (which then stops being durable).
    pub(crate) fn put_expiring_over(&self, key: &str, value: Vec<u8>, ttl: Duration) -> bool {
        let now = (self.clock)();
        let mut s = self.lock();
        s.expire(now);
        let was_durable = s.keys.contains_key(key) && !s.expiry.contains_key(key);
        s.revision += 1;
        let revision = s.revision;
        s.keys
            .insert(key.to_string(), Versioned { value, revision });
        s.expiry.insert(key.to_string(), now + ttl);
        drop(s);
        self.notify(key);
        was_durable
    }

    /// Tells watchers that `key` was written (a lease: where etcd keeps it, see
    /// [`crate::lease_path`]).
    fn notify(&self, key: &str) {
        self.changed.notify(&[key]);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        }
    }
}

impl Dcs for MemoryDcs {
    fn get(&self, key: &str) -> Result<Option<Versioned>, DcsError> {
        let now = (self.clock)();
        let mut s = self.lock();
        s.expire(now);
        Ok(s.keys.get(key).cloned())
    }

    fn compare_and_set(&self, key: &str, expected: u64, value: Vec<u8>) -> Result<u64, DcsError> {
        let now = (self.clock)();
        let mut s = self.lock();
        s.expire(now);
        let found = s.keys.get(key).map_or(0, |v| v.revision);
        if found != expected {
            return Err(DcsError::Conflict {
                key: key.to_string(),
                expected,
                found,
            });
        }
        s.revision += 1;
        let revision = s.revision;
        s.keys
            .insert(key.to_string(), Versioned { value, revision });
        s.expiry.remove(key);
        drop(s);
        self.notify(key);
        Ok(revision)
    }

    fn acquire_lease(&self, key: &str, owner: &str, ttl: Duration) -> Result<bool, DcsError> {
        Ok(self.take_lease(key, owner, ttl).0)
    }

    fn release_lease(&self, key: &str, owner: &str) -> Result<(), DcsError> {
        self.give_up_lease(key, owner);
        Ok(())
    }

    fn lease_holder(&self, key: &str) -> Result<Option<String>, DcsError> {
        Ok(self.holder(key).0)
    }

    fn put_expiring(&self, key: &str, value: Vec<u8>, ttl: Duration) -> Result<(), DcsError> {
        self.put_expiring_over(key, value, ttl);
        Ok(())
    }

    fn list(&self, prefix: &str) -> Result<Vec<(String, Versioned)>, DcsError> {
        let now = (self.clock)();
        let mut s = self.lock();
        s.expire(now);
        let mut out: Vec<(String, Versioned)> = s
            .keys
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn changes_ignoring(&self, prefix: &str) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe_ignoring(prefix)
    }

    fn changes_under(&self, within: &str, ignoring: &[&str]) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe_under(within, ignoring)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use super::*;

    #[test]
    fn memory_backend_keeps_the_contract() {
        let start = Instant::now();
        let offset = Arc::new(AtomicU64::new(0));
        let o = offset.clone();
        let dcs = MemoryDcs::with_clock(Box::new(move || {
            start + Duration::from_millis(o.load(Ordering::SeqCst))
        }));
        crate::contract::check(&dcs, &|d: Duration| {
            offset.fetch_add(d.as_millis() as u64, Ordering::SeqCst);
        });
    }
}
