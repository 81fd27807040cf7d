//! Bounded LRU cache of classifications keyed by statement text.

use crate::shape::{shape_recording, Literal, Literals, ShapeBuf};
use crate::template::{Template, PREFIX};
use crate::{classify, Classification};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Templates kept per leading bytes (texts that share them: `SELECT * FROM …`).
const TEMPLATES_PER_PREFIX: usize = 4;

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
    /// Templates of recent texts by their first bytes, most recently matched first: a text
    /// one of them recognises needs no lexing to find its key.
    templates: HashMap<[u8; PREFIX], Vec<Template>, foldhash::fast::RandomState>,
    /// Templates held, over all prefixes (at most the cache's capacity).
    templates_held: usize,
    next_stamp: u64,
    hits: u64,
    misses: u64,
}

impl Inner {
    fn stamp(&mut self) -> u64 {
        self.next_stamp = self.next_stamp.wrapping_add(1);
        self.next_stamp
    }

    /// The classification of `text` through a template of its first bytes, when one
    /// recognises it and its entry is still held.
    fn by_template(&mut self, prefix: &[u8; PREFIX], text: &[u8]) -> Option<Arc<Classification>> {
        let bucket = self.templates.get_mut(prefix)?;
        let i = bucket.iter().position(|t| t.matches(text))?;
        bucket[..=i].rotate_right(1);
        self.next_stamp = self.next_stamp.wrapping_add(1);
        let (found, used) = self.map.get_mut(&*bucket[0].key)?;
        *used = self.next_stamp;
        self.hits += 1;
        Some(Arc::clone(found))
    }

    /// Keeps a template of `text` (literals at `literals`, shape key `key`) unless one of its
    /// bucket recognises it already. At most [`TEMPLATES_PER_PREFIX`] per prefix (the least
    /// recently matched dropped first) and `capacity` in all (all dropped when that is reached:
    /// they are relearnt from the next texts), so they hold no more text than the keys do.
    fn learn(
        &mut self,
        prefix: [u8; PREFIX],
        text: &[u8],
        literals: &[Literal],
        key: &[u8],
        capacity: usize,
    ) {
        let Some((key, _)) = self.map.get_key_value(key) else {
            return; // not held (too long, or caching is off)
        };
        let Some(template) = Template::new(text, literals, Arc::clone(key)) else {
            return;
        };
        if self.templates_held >= capacity {
            self.templates.clear();
            self.templates_held = 0;
        }
        let bucket = self.templates.entry(prefix).or_default();
        if bucket.iter().any(|t| t.matches(text)) {
            return;
        }
        let before = bucket.len();
        bucket.truncate(TEMPLATES_PER_PREFIX - 1);
        bucket.insert(0, template);
        self.templates_held = self.templates_held + bucket.len() - before;
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
/// bounds memory to about twice `capacity * max_sql_len` (the keys, and the texts templates
/// keep) plus the classifications.
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
        let text = sql.as_bytes();
        // Texts too short to be templated skip the templates (and the lock they take).
        let prefix: Option<[u8; PREFIX]> = text.get(..PREFIX).and_then(|p| p.try_into().ok());
        if let Some(prefix) = &prefix {
            if let Some(found) = self.lock().by_template(prefix, text) {
                return found;
            }
        }
        let mut shape = ShapeBuf::new();
        let mut literals = Literals::new();
        let recording = prefix.is_some().then_some(&mut literals);
        if !shape_recording(sql, &mut shape, recording) {
            // The text is its own key: a template without literals recognises it (and only it)
            // from then on, without lexing. Parameterised statements ($1) are such texts.
            let found = self.get_or_classify_keyed(text, sql);
            if let Some(prefix) = prefix.filter(|_| text.len() <= self.max_sql_len) {
                self.lock().learn(prefix, text, &[], text, self.capacity);
            }
            return found;
        }
        let found = self.get_or_classify_keyed(&shape, sql);
        if let Some(prefix) = prefix {
            // Templated only when the text before its first literal is long enough (checked
            // here, so texts that never can be take no second lock) and the text is no longer
            // than a key may be (a template keeps it).
            if literals.first().is_some_and(|l| l.start >= PREFIX) && text.len() <= self.max_sql_len
            {
                self.lock()
                    .learn(prefix, text, &literals, &shape, self.capacity);
            }
        }
        found
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
        let mut inner = self.lock();
        inner.map.clear();
        inner.templates.clear();
        inner.templates_held = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn templates(cache: &ClassifierCache) -> usize {
        cache.lock().templates.values().map(Vec::len).sum()
    }

    #[test]
    fn templates_find_entries_without_lexing_and_never_outlive_them() {
        let cache = ClassifierCache::new(2);
        let a = cache.get_or_classify("select v from accounts where id = 1");
        assert_eq!(templates(&cache), 1, "a shaped text leaves a template");
        // Same shape: found through the template (counted as a hit, the same entry).
        let b = cache.get_or_classify("select v from accounts where id = 22");
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!((cache.stats().hits, cache.stats().misses), (1, 1));
        assert_eq!(templates(&cache), 1, "recognised: no second template");
        // Same first bytes, another shape: its own entry and template, never the first's.
        let c = cache.get_or_classify("select v from accounts where id = 1 for update");
        assert!(!Arc::ptr_eq(&a, &c));
        assert_ne!(
            a.statements[0].route_without_functions, c.statements[0].route_without_functions,
            "a locking read goes to the primary"
        );
        assert_eq!(templates(&cache), 2);
        // Texts shorter than the prefix or with an early literal have no template.
        cache.get_or_classify("select 1");
        cache.get_or_classify("select 1 from accounts where id = 2");
        assert_eq!(templates(&cache), 2);
        // The entries of `a` and `c` are gone (capacity 2): the template finds nothing and
        // the text is classified again, as a miss.
        let misses = cache.stats().misses;
        let d = cache.get_or_classify("select v from accounts where id = 3");
        assert!(!Arc::ptr_eq(&a, &d));
        assert_eq!(cache.stats().misses, misses + 1);
        assert_eq!(d.statements.len(), a.statements.len());
        cache.clear();
        assert_eq!(templates(&cache), 0, "cleared with the entries");
    }

    #[test]
    fn a_text_that_is_its_own_key_is_found_by_its_template() {
        let cache = ClassifierCache::new(4);
        let sql = "select v from accounts where id = $1";
        let a = cache.get_or_classify(sql);
        assert_eq!(
            templates(&cache),
            1,
            "a parameterised text leaves a template"
        );
        let b = cache.get_or_classify(sql);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!((cache.stats().hits, cache.stats().misses), (1, 1));
        // Another text of the same first bytes is not taken for it.
        let c = cache.get_or_classify("select v from accounts where id = $1 for update");
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(cache.stats().misses, 2);
        assert_eq!(templates(&cache), 2);
    }

    #[test]
    fn templates_are_bounded_by_the_capacity() {
        let cache = ClassifierCache::new(3);
        for i in 0..20 {
            cache.get_or_classify(&format!("select v from accounts_{i:02} where id = 1"));
            assert!(templates(&cache) <= 3, "{} templates", templates(&cache));
            assert_eq!(templates(&cache), cache.lock().templates_held);
        }
        for i in 0..6 {
            cache.get_or_classify(&format!("select v from accounts where c{i} = 1"));
            assert!(templates(&cache) <= 3, "{} templates", templates(&cache));
            assert_eq!(templates(&cache), cache.lock().templates_held);
        }
    }

    #[test]
    fn long_texts_leave_no_template() {
        let cache = ClassifierCache::with_max_sql_len(10, 64);
        let long = format!("select v from accounts where note = '{}'", "x".repeat(100));
        cache.get_or_classify(&long);
        assert_eq!(cache.len(), 1, "its key is short enough to be held");
        assert_eq!(
            templates(&cache),
            0,
            "but the text is not kept in a template"
        );
    }
}
