//! Server connection pools: one per (node, user, database), bounded by their slots (a
//! released connection goes straight to the oldest waiting lease: `slots.rs`), reusing idle
//! connections. Each pool counts its outstanding leases for least-outstanding balancing.

mod slots;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herd_scram::{ClientKey, Verifier};

use self::slots::Slots;

use crate::server::ServerConn;
use crate::topology::Endpoint;
use crate::ProxyError;
use herd_pg::ClientTls;

/// Identifies one pool.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolKey {
    /// The node.
    pub endpoint: Endpoint,
    /// Role the connections log in as.
    pub user: String,
    /// Database they are connected to.
    pub database: String,
}

/// The parts of a [`PoolKey`]: pools are looked up by borrowed parts, so a new session (one
/// per transaction with `pgbench -C`) copies no string to find its pool.
trait PoolKeyParts {
    fn parts(&self) -> (&Endpoint, &str, &str);
}

impl PoolKeyParts for PoolKey {
    fn parts(&self) -> (&Endpoint, &str, &str) {
        (&self.endpoint, &self.user, &self.database)
    }
}

impl PoolKeyParts for (&Endpoint, &str, &str) {
    fn parts(&self) -> (&Endpoint, &str, &str) {
        *self
    }
}

impl<'a> std::borrow::Borrow<dyn PoolKeyParts + 'a> for PoolKey {
    fn borrow(&self) -> &(dyn PoolKeyParts + 'a) {
        self
    }
}

/// Hashes like [`PoolKey`]'s derived `Hash` (its fields in order), as `Borrow` requires.
impl std::hash::Hash for dyn PoolKeyParts + '_ {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let (endpoint, user, database) = self.parts();
        endpoint.hash(state);
        user.hash(state);
        database.hash(state);
    }
}

impl PartialEq for dyn PoolKeyParts + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn PoolKeyParts + '_ {}

/// Connections to one node for one user and database.
pub struct Pool {
    key: PoolKey,
    /// TLS to the node (`[proxy] server_tls`).
    tls: Option<ClientTls>,
    /// Slots and idle connections. Boxed: a connection moves in and out of the idle list and
    /// through leases on every transaction, and a pointer moves cheaper than the whole thing.
    slots: Arc<Slots<Box<ServerConn>>>,
    outstanding: AtomicUsize,
    waits: WaitCounters,
}

/// How often clients found a pool full: the sign that `pool_size` is too small for the load.
#[derive(Default)]
struct WaitCounters {
    /// Acquisitions that found no free slot and waited.
    waits: AtomicU64,
    /// Microseconds spent waiting, summed.
    wait_us: AtomicU64,
    /// Waits that ended without a slot (the client got 53300).
    timeouts: AtomicU64,
    /// Server connections opened (not reused).
    connects: AtomicU64,
}

/// One pool's figures for `/metrics`.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolStats {
    /// Node name.
    pub node: String,
    /// Role.
    pub user: String,
    /// Database.
    pub database: String,
    /// Leases held now.
    pub in_use: usize,
    /// Idle connections now.
    pub idle: usize,
    /// Acquisitions that had to wait for a free slot, since start.
    pub waits: u64,
    /// Seconds spent waiting, since start.
    pub wait_seconds: f64,
    /// Waits that timed out, since start.
    pub timeouts: u64,
    /// Server connections opened, since start.
    pub connects: u64,
}

/// Credentials a pool logs in with: the key recovered from the user's last successful login.
#[derive(Clone)]
pub struct Credentials {
    /// The user's SCRAM ClientKey.
    pub key: ClientKey,
    /// The user's stored verifier (to check the server's signature).
    pub verifier: Verifier,
}

/// A connection taken from a pool. Return it with [`Lease::release`]; dropping it instead closes
/// the connection (used whenever its state is uncertain).
pub struct Lease {
    /// The connection.
    pub conn: Box<ServerConn>,
    guard: LeaseGuard,
}

/// Gives the slot back (and the balancing count) however the lease ends: with its
/// connection when released, empty when the lease was dropped (the connection is closed).
struct LeaseGuard {
    pool: Arc<Pool>,
    returning: Option<Box<ServerConn>>,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.pool.outstanding.fetch_sub(1, Ordering::Relaxed);
        self.pool.slots.give_back(self.returning.take());
    }
}

impl Lease {
    /// Puts the connection back for reuse: to the oldest waiting lease, or the idle list.
    pub fn release(self) {
        let Lease { conn, mut guard } = self;
        guard.returning = Some(conn);
        drop(guard);
    }

    /// The pool it came from.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.guard.pool
    }
}

impl Pool {
    /// The node this pool's connections go to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.key.endpoint
    }

    /// Leases currently held: the balancing signal.
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// Takes an idle connection or opens a new one, waiting at most `wait` for a free slot.
    pub async fn acquire(
        self: &Arc<Self>,
        creds: &Credentials,
        wait: Duration,
        connect_timeout: Duration,
    ) -> Result<Lease, ProxyError> {
        let first = self.slot(wait).await?;
        // The slot is held from here: should the connect below fail or its future be dropped,
        // the guard gives it back.
        let guard = self.guard();
        let conn = match self.sound(first) {
            Some(c) => c,
            None => {
                self.waits.connects.fetch_add(1, Ordering::Relaxed);
                let k = &self.key;
                let conn = ServerConn::connect(
                    &k.endpoint,
                    &k.user,
                    &k.database,
                    &creds.key,
                    &creds.verifier,
                    connect_timeout,
                    self.tls.as_ref(),
                )
                .await?;
                Box::new(conn)
            }
        };
        Ok(Lease { conn, guard })
    }

    /// The guard of a slot just taken (counted as outstanding until it drops).
    fn guard(self: &Arc<Self>) -> LeaseGuard {
        self.outstanding.fetch_add(1, Ordering::Relaxed);
        LeaseGuard {
            pool: self.clone(),
            returning: None,
        }
    }

    /// Waits at most `wait` for a free slot, then takes an idle connection: `None` when there
    /// is none (one must be opened, which [`Pool::acquire`] does). For a unit that found the
    /// pool full: released connections go back to the idle list as their slots come free, so
    /// the slot it gets almost always comes with one.
    pub async fn acquire_idle(
        self: &Arc<Self>,
        wait: Duration,
    ) -> Result<Option<Lease>, ProxyError> {
        let first = self.slot(wait).await?;
        let Some(conn) = self.sound(first) else {
            self.slots.give_back(None);
            return Ok(None);
        };
        Ok(Some(Lease {
            conn,
            guard: self.guard(),
        }))
    }

    /// Whether every slot is leased now (a new lease would wait).
    pub fn is_full(&self) -> bool {
        self.slots.is_full()
    }

    /// A slot, with an idle connection when one came with it: at once when a slot is free,
    /// else waiting at most `wait` (counted in the wait figures; 53300 when it runs out).
    async fn slot(self: &Arc<Self>, wait: Duration) -> Result<Option<Box<ServerConn>>, ProxyError> {
        // `take` also serves a free slot at once; this only tells whether it had to wait.
        let full = self.slots.is_full();
        let started = Instant::now();
        let got = self.slots.take(wait).await;
        if full {
            let w = &self.waits;
            w.waits.fetch_add(1, Ordering::Relaxed);
            let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            w.wait_us.fetch_add(us, Ordering::Relaxed);
        }
        got.map_err(|_| {
            self.waits.timeouts.fetch_add(1, Ordering::Relaxed);
            ProxyError::PoolTimeout(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX))
        })
    }

    /// The connection a slot came with when it is sound, else another idle one for the same
    /// slot (stale ones are dropped, which closes them); `None`: one must be opened.
    fn sound(&self, first: Option<Box<ServerConn>>) -> Option<Box<ServerConn>> {
        let mut next = first.or_else(|| self.slots.pop_idle());
        while let Some(mut c) = next {
            if !c.is_stale() {
                return Some(c);
            }
            next = self.slots.pop_idle();
        }
        None
    }

    /// An idle connection with its slot, when both are free now: the lease of a unit that
    /// need not wait. `None` when it would have to wait for a slot or open a connection.
    pub fn try_acquire(self: &Arc<Self>) -> Option<Lease> {
        let first = self.slots.try_take_idle()?;
        let Some(conn) = self.sound(Some(first)) else {
            self.slots.give_back(None);
            return None;
        };
        Some(Lease {
            conn,
            guard: self.guard(),
        })
    }

    /// Closes every idle connection (e.g. after the node changed role).
    pub fn clear_idle(&self) {
        self.slots.clear_idle();
    }
}

/// Every pool of the proxy.
pub struct Pools {
    size: usize,
    tls: Option<ClientTls>,
    pools: Mutex<HashMap<PoolKey, Arc<Pool>>>,
}

impl Pools {
    /// Pools of at most `size` connections each, over TLS when `tls` is given.
    pub fn new(size: usize, tls: Option<ClientTls>) -> Self {
        Pools {
            size,
            tls,
            pools: Mutex::new(HashMap::new()),
        }
    }

    /// The pool of `user`'s connections to `database` on `endpoint`, created on first use.
    pub fn get_by(&self, endpoint: &Endpoint, user: &str, database: &str) -> Arc<Pool> {
        let mut pools = match self.pools.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        // Every new session asks: no key is built when its pool exists.
        let parts = (endpoint, user, database);
        if let Some(pool) = pools.get(&parts as &dyn PoolKeyParts) {
            return pool.clone();
        }
        let key = PoolKey {
            endpoint: endpoint.clone(),
            user: user.to_string(),
            database: database.to_string(),
        };
        let pool = Arc::new(Pool {
            key: key.clone(),
            tls: self.tls.clone(),
            slots: Arc::new(Slots::new(self.size)),
            outstanding: AtomicUsize::new(0),
            waits: WaitCounters::default(),
        });
        pools.insert(key, pool.clone());
        pool
    }

    /// TLS to the servers, when configured.
    pub fn tls(&self) -> Option<&ClientTls> {
        self.tls.as_ref()
    }

    /// Closes the idle connections of every pool to `database` (on any node): a database
    /// cannot be dropped while the proxy keeps sessions open on it.
    pub fn clear_idle_of_database(&self, database: &str) {
        let pools = match self.pools.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        for p in pools.values().filter(|p| p.key.database == database) {
            p.clear_idle();
        }
    }

    /// Every pool's figures, for metrics.
    pub fn snapshot(&self) -> Vec<PoolStats> {
        let pools = match self.pools.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        pools
            .values()
            .map(|p| {
                let w = &p.waits;
                PoolStats {
                    node: p.key.endpoint.name.to_string(),
                    user: p.key.user.clone(),
                    database: p.key.database.clone(),
                    in_use: p.outstanding(),
                    idle: p.slots.idle_len(),
                    waits: w.waits.load(Ordering::Relaxed),
                    wait_seconds: w.wait_us.load(Ordering::Relaxed) as f64 / 1e6,
                    timeouts: w.timeouts.load(Ordering::Relaxed),
                    connects: w.connects.load(Ordering::Relaxed),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herd_core::NodeName;

    fn ep(index: usize) -> Endpoint {
        Endpoint {
            name: NodeName::numbered(index),
            host: "127.0.0.1".into(),
            port: 7000 + index as u16,
            socket: None,
        }
    }

    #[test]
    fn pools_are_found_by_their_parts() {
        let pools = Pools::new(2, None);
        let a = pools.get_by(&ep(0), "u", "db");
        assert!(Arc::ptr_eq(&a, &pools.get_by(&ep(0), "u", "db")));
        assert_eq!(a.endpoint(), &ep(0));
        for other in [
            pools.get_by(&ep(0), "v", "db"),
            pools.get_by(&ep(0), "u", "db2"),
            pools.get_by(&ep(1), "u", "db"),
            // The parts do not run together: "ud" + "b" is another pool than "u" + "db".
            pools.get_by(&ep(0), "ud", "b"),
        ] {
            assert!(!Arc::ptr_eq(&a, &other));
        }
        assert_eq!(pools.snapshot().len(), 5);
        // Found again by parts after every insertion (hashing by parts agrees with the key's).
        assert!(Arc::ptr_eq(&a, &pools.get_by(&ep(0), "u", "db")));
        assert_eq!(pools.snapshot().len(), 5);
    }
}
