//! One shard group's view of a store: the same keys and leases as a one-group cluster, kept
//! under `groups/<g>/` for group g ≥ 1 and at the root for group 0, so that group 0 of a
//! running etcd cluster keeps its keys (and its leader's lease) byte for byte.

use std::sync::Arc;
use std::time::Duration;

use crate::{Dcs, DcsError, Versioned};

/// Where shard groups other than group 0 keep their keys.
const GROUPS: &str = "groups/";
/// The root prefix of the multi-host proxies' registrations (not any group's keys).
pub const PROXIES: &str = "proxies/";
/// The root prefix of the shard moves asked of the cluster's coordinator (not any group's
/// keys).
pub const SHARD_MOVES: &str = "shard_moves/";
/// The root prefix of the shard groups' admission records (`group_admissions/<g>`: who asks a
/// proxy to admit a group recorded by `herd group add --dcs`, and how it went).
pub const GROUP_ADMISSIONS: &str = "group_admissions/";

/// A [`Dcs`] whose keys and leases are those of `inner` under a prefix: a group's agents use
/// the names they would in a one-group cluster (`leader`, `members/<name>`, `sync`).
pub struct Scoped {
    inner: Arc<dyn Dcs>,
    /// Put before every key and lease name (`groups/<g>/`; empty for group 0).
    prefix: String,
    /// Keys under the prefix that belong to other views: for group 0, whose prefix is the
    /// root, every other group's `groups/…`. Not listed, and their writes not announced.
    hidden: Vec<String>,
}

impl Scoped {
    /// Shard group `group`'s view of `inner`.
    pub fn group(inner: Arc<dyn Dcs>, group: u32) -> Scoped {
        if group == 0 {
            Scoped {
                inner,
                prefix: String::new(),
                // Other groups' keys, the proxies' registrations (cluster-wide, renewed
                // every second: group 0's agents must not run a round for each) and the
                // shard moves' records (cluster-wide, written at each phase).
                hidden: vec![
                    GROUPS.to_string(),
                    PROXIES.to_string(),
                    SHARD_MOVES.to_string(),
                    GROUP_ADMISSIONS.to_string(),
                ],
            }
        } else {
            Scoped {
                inner,
                prefix: format!("{GROUPS}{group}/"),
                hidden: Vec::new(),
            }
        }
    }

    /// What every key of this view starts with in the store underneath.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn is_hidden(&self, key: &str) -> bool {
        self.hidden.iter().any(|h| key.starts_with(h.as_str()))
    }
}

impl Dcs for Scoped {
    fn get(&self, key: &str) -> Result<Option<Versioned>, DcsError> {
        self.inner.get(&self.key(key))
    }

    fn compare_and_set(&self, key: &str, expected: u64, value: Vec<u8>) -> Result<u64, DcsError> {
        self.inner
            .compare_and_set(&self.key(key), expected, value)
            .map_err(|e| match e {
                // The caller's name for the key, not the store's.
                DcsError::Conflict {
                    expected, found, ..
                } => DcsError::Conflict {
                    key: key.to_string(),
                    expected,
                    found,
                },
                other => other,
            })
    }

    fn acquire_lease(&self, key: &str, owner: &str, ttl: Duration) -> Result<bool, DcsError> {
        self.inner.acquire_lease(&self.key(key), owner, ttl)
    }

    fn release_lease(&self, key: &str, owner: &str) -> Result<(), DcsError> {
        self.inner.release_lease(&self.key(key), owner)
    }

    fn lease_holder(&self, key: &str) -> Result<Option<String>, DcsError> {
        self.inner.lease_holder(&self.key(key))
    }

    fn put_expiring(&self, key: &str, value: Vec<u8>, ttl: Duration) -> Result<(), DcsError> {
        self.inner.put_expiring(&self.key(key), value, ttl)
    }

    fn list(&self, prefix: &str) -> Result<Vec<(String, Versioned)>, DcsError> {
        Ok(self
            .inner
            .list(&self.key(prefix))?
            .into_iter()
            .filter(|(k, _)| !self.is_hidden(k))
            .filter_map(|(k, v)| Some((k.strip_prefix(self.prefix.as_str())?.to_string(), v)))
            .collect())
    }

    fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes_under("", &[])
    }

    fn changes_ignoring(&self, prefix: &str) -> tokio::sync::watch::Receiver<u64> {
        self.changes_under("", &[prefix])
    }

    fn changes_under(&self, within: &str, ignoring: &[&str]) -> tokio::sync::watch::Receiver<u64> {
        let mut ignored: Vec<String> = self.hidden.clone();
        ignored.extend(ignoring.iter().map(|i| self.key(i)));
        let ignored: Vec<&str> = ignored.iter().map(String::as_str).collect();
        self.inner.changes_under(&self.key(within), &ignored)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::MemoryDcs;

    /// A memory store with a clock the test moves, and the function that moves it.
    fn memory() -> (Arc<MemoryDcs>, impl Fn(Duration)) {
        let start = std::time::Instant::now();
        let offset = Arc::new(AtomicU64::new(0));
        let o = offset.clone();
        let dcs = Arc::new(MemoryDcs::with_clock(Box::new(move || {
            start + Duration::from_millis(o.load(Ordering::SeqCst))
        })));
        (dcs, move |d: Duration| {
            offset.fetch_add(d.as_millis() as u64, Ordering::SeqCst);
        })
    }

    #[test]
    fn each_group_view_keeps_the_contract_in_its_own_keys() {
        let (memory, advance) = memory();
        let root: Arc<dyn Dcs> = memory.clone();
        crate::contract::check(&Scoped::group(root.clone(), 0), &advance);
        crate::contract::check(&Scoped::group(root.clone(), 3), &advance);
        // Group 0's keys are today's, at the root; group 3's under its prefix.
        let keys: Vec<String> = root
            .list("")
            .expect("list")
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert!(keys.contains(&"k".to_string()), "{keys:?}");
        assert!(keys.contains(&"groups/3/k".to_string()), "{keys:?}");
        assert!(keys.contains(&"groups/3/membersx".to_string()), "{keys:?}");
        // Neither lists the other's keys.
        let group0 = Scoped::group(root.clone(), 0);
        assert!(group0
            .list("")
            .expect("list")
            .iter()
            .all(|(k, _)| !k.starts_with("groups/")));
        let group3 = Scoped::group(root.clone(), 3);
        assert_eq!(
            group3.get("k").expect("get").map(|v| v.value),
            Some(b"c".to_vec())
        );
        assert!(group3
            .list("")
            .expect("list")
            .iter()
            .all(|(k, _)| !k.starts_with("groups/")));
    }

    #[test]
    fn leases_are_per_group() {
        let (memory, _) = memory();
        let root: Arc<dyn Dcs> = memory;
        let (g0, g2) = (
            Scoped::group(root.clone(), 0),
            Scoped::group(root.clone(), 2),
        );
        let ttl = Duration::from_secs(10);
        assert!(g0.acquire_lease("leader", "a", ttl).expect("g0"));
        assert!(
            g2.acquire_lease("leader", "b", ttl).expect("g2"),
            "another group's lease"
        );
        assert_eq!(
            root.lease_holder("leader").expect("root").as_deref(),
            Some("a")
        );
        assert_eq!(
            root.lease_holder("groups/2/leader")
                .expect("root")
                .as_deref(),
            Some("b")
        );
        let e = g2.compare_and_set("sync", 5, b"x".to_vec());
        assert!(
            matches!(&e, Err(DcsError::Conflict { key, .. }) if key == "sync"),
            "the caller's key name: {e:?}"
        );
    }

    #[test]
    fn a_group_view_is_not_woken_by_another_group() {
        let (memory, _) = memory();
        let root: Arc<dyn Dcs> = memory;
        let (g0, g1) = (
            Scoped::group(root.clone(), 0),
            Scoped::group(root.clone(), 1),
        );
        let mut all0 = g0.changes();
        let mut quiet0 = g0.changes_ignoring("members/");
        let mut all1 = g1.changes();
        let mut quiet1 = g1.changes_ignoring("members/");
        let ttl = Duration::from_secs(10);

        g1.compare_and_set("config", 0, b"x".to_vec()).expect("g1");
        g1.put_expiring("members/a", b"1".to_vec(), ttl)
            .expect("g1");
        g1.acquire_lease("leader", "a", ttl).expect("g1");
        assert!(
            !all0.has_changed().expect("open"),
            "group 1's writes woke group 0"
        );
        assert!(!quiet0.has_changed().expect("open"));
        assert!(all1.has_changed().expect("open"));
        assert!(quiet1.has_changed().expect("open"));

        all1.borrow_and_update();
        quiet1.borrow_and_update();
        g0.put_expiring("members/a", b"1".to_vec(), ttl)
            .expect("g0");
        assert!(all0.has_changed().expect("open"));
        assert!(
            !quiet0.has_changed().expect("open"),
            "own heartbeats are ignored"
        );
        g0.acquire_lease("leader", "a", ttl).expect("g0");
        assert!(
            quiet0.has_changed().expect("open"),
            "group 0's lease (leases/leader)"
        );
        all0.borrow_and_update();
        quiet0.borrow_and_update();
        all1.borrow_and_update();
        g1.put_expiring("members/b", b"1".to_vec(), ttl)
            .expect("g1");
        assert!(!quiet1.has_changed().expect("open"));
        assert!(all1.has_changed().expect("open"));
        assert!(
            !all0.has_changed().expect("open"),
            "group 1's heartbeat woke group 0"
        );
    }
}
