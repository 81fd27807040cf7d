//! Bounded LRU cache of classifications keyed by statement text.

use crate::{classify, Classification};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Hit/miss counters and size of a [`ClassifierCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that had to classify.
    pub misses: u64,
    /// Entries currently held.
    pub len: usize,
    /// Maximum number of entries.
    pub capacity: usize,
}

#[derive(Debug, Default)]
struct Inner {
    /// Shape key (or text) → (classification, last-use stamp). A hit only rewrites the
    /// stamp; the least recently used entries are found when room is needed (a miss of a
    /// full cache). Hashed with foldhash, seeded per process: SipHash cost as much as the
    /// rest of a hit; the map is bounded, so colliding keys could only slow its own lookups.
    map: HashMap<Arc<[u8]>, (Arc<Classification>, u64), foldhash::fast::RandomState>,
    next_stamp: u64,
    hits: u64,
    misses: u64,
}

impl Inner {
    fn stamp(&mut self) -> u64 {
        self.next_stamp = self.next_stamp.wrapping_add(1);
        self.next_stamp
    }

    /// Drops the least recently used eighth of the entries (at least one), so a full cache
    /// scans its stamps once per that many misses rather than keeping an order on every hit.
    fn evict(&mut self) {
        let count = (self.map.len() / 8).max(1);
        let mut stamps: Vec<u64> = self.map.values().map(|(_, s)| *s).collect();
        if stamps.is_empty() {
            return;
        }
        let (_, newest_dropped, _) = stamps.select_nth_unstable(count - 1);
        let newest_dropped = *newest_dropped;
        self.map.retain(|_, (_, s)| *s > newest_dropped);
    }
}

/// A thread-safe LRU cache from SQL text to its [`Classification`].
///
/// Parsing runs outside the lock, so concurrent misses for the same text may
/// classify it twice (the result is the same). Texts longer than
/// [`ClassifierCache::max_sql_len`] are classified but not stored, which
/// bounds memory to about `capacity * max_sql_len` plus the classifications.
#[derive(Debug)]
pub struct ClassifierCache {
    inner: Mutex<Inner>,
    capacity: usize,
    max_sql_len: usize,
}

impl ClassifierCache {
    /// Default longest text that is cached, in bytes.
    pub const DEFAULT_MAX_SQL_LEN: usize = 16 * 1024;

    /// A cache holding at most `capacity` entries (0 disables caching).
    pub fn new(capacity: usize) -> Self {
        Self::with_max_sql_len(capacity, Self::DEFAULT_MAX_SQL_LEN)
    }

    /// A cache holding at most `capacity` entries of at most `max_sql_len` bytes each.
    pub fn with_max_sql_len(capacity: usize, max_sql_len: usize) -> Self {
        ClassifierCache {
            inner: Mutex::new(Inner::default()),
            capacity,
            max_sql_len,
        }
    }

    /// Maximum number of entries.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Longest text, in bytes, that is stored.
    pub fn max_sql_len(&self) -> usize {
        self.max_sql_len
    }

    /// Locks the state; a poisoned lock is still usable (the maps stay consistent
    /// because no user code runs while it is held).
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The classification of `sql`, from the cache or freshly computed. Texts that differ only
    /// in literal values share one entry (see [`crate::shape_key`]); the statements' `span`s of
    /// such an entry refer to the first text of that shape.
    pub fn get_or_classify(&self, sql: &str) -> Arc<Classification> {
        let mut shape = crate::shape::ShapeBuf::new();
        let key = if crate::shape::shape_into(sql, &mut shape) {
            &shape[..]
        } else {
            sql.as_bytes()
        };
        self.get_or_classify_keyed(key, sql)
    }

    fn get_or_classify_keyed(&self, key: &[u8], sql: &str) -> Arc<Classification> {
        {
            let mut inner = self.lock();
            let stamp = inner.stamp();
            if let Some((found, used)) = inner.map.get_mut(key) {
                *used = stamp;
                let found = Arc::clone(found);
                inner.hits += 1;
                return found;
            }
            inner.misses += 1;
        }
        let classified = Arc::new(classify(sql));
        if self.capacity == 0 || key.len() > self.max_sql_len {
            return classified;
        }
        let mut inner = self.lock();
        if inner.map.contains_key(key) {
            return classified;
        }
        if inner.map.len() >= self.capacity {
            inner.evict();
        }
        let key: Arc<[u8]> = Arc::from(key);
        let stamp = inner.stamp();
        inner.map.insert(key, (Arc::clone(&classified), stamp));
        classified
    }

    /// Counters and current size.
    pub fn stats(&self) -> CacheStats {
        let inner = self.lock();
        CacheStats {
            hits: inner.hits,
            misses: inner.misses,
            len: inner.map.len(),
            capacity: self.capacity,
        }
    }

    /// Number of entries held.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// True when no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every entry (counters are kept).
    pub fn clear(&self) {
        self.lock().map.clear();
    }
}
