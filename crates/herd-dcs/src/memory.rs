//! The in-memory backend of the embedded mode (one supervisor process).

use std::collections::HashMap;
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

#[derive(Default)]
struct State {
    keys: HashMap<String, Versioned>,
    /// When keys written by `put_expiring` disappear.
    expiry: HashMap<String, Instant>,
    leases: HashMap<String, (String, Instant)>,
    revision: u64,
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

    /// Tells watchers that `key` was written (a lease: its name under `leases/`, as etcd
    /// keeps it).
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
        let now = (self.clock)();
        let mut s = self.lock();
        let free = match s.leases.get(key) {
            None => true,
            Some((holder, until)) => holder == owner || *until <= now,
        };
        let taken = free && s.leases.get(key).is_none_or(|(h, _)| h != owner);
        if free {
            s.leases
                .insert(key.to_string(), (owner.to_string(), now + ttl));
        }
        drop(s);
        if taken {
            self.notify(&format!("leases/{key}"));
        }
        Ok(free)
    }

    fn release_lease(&self, key: &str, owner: &str) -> Result<(), DcsError> {
        let mut s = self.lock();
        if s.leases.get(key).is_some_and(|(holder, _)| holder == owner) {
            s.leases.remove(key);
            drop(s);
            self.notify(&format!("leases/{key}"));
        }
        Ok(())
    }

    fn lease_holder(&self, key: &str) -> Result<Option<String>, DcsError> {
        let now = (self.clock)();
        Ok(self
            .lock()
            .leases
            .get(key)
            .filter(|(_, until)| *until > now)
            .map(|(h, _)| h.clone()))
    }

    fn put_expiring(&self, key: &str, value: Vec<u8>, ttl: Duration) -> Result<(), DcsError> {
        let now = (self.clock)();
        let mut s = self.lock();
        s.revision += 1;
        let revision = s.revision;
        s.keys
            .insert(key.to_string(), Versioned { value, revision });
        s.expiry.insert(key.to_string(), now + ttl);
        drop(s);
        self.notify(key);
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
