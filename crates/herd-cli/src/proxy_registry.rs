//! Every multi-host `herd proxy` registers in the store (`proxies/<id>`, an expiring key renewed
//! every second), and the shard map rules built on it ([`herd_proxy::shards::MapGate`]):
//!
//! * a map change (a table distributed, a shard moved) through one proxy takes the lease
//!   `map_change` (its holder named `<proxy id>#<change>`), then waits until every other
//!   registered proxy has acknowledged the hold: each one watches the lease (every 200 ms), and
//!   on seeing another's hold forgets the maps it holds, makes its statements that need a map
//!   wait for the change to end, and writes the holder's name into its registration. A proxy
//!   that does not acknowledge within a registration's life plus a margin refuses the change,
//!   named; one that died or is cut off from the store drops out of the list when its key
//!   expires (and a proxy cut off stops routing by its maps before that, below);
//! * a proxy reads a map only while no other proxy holds `map_change`, keeps a map read across
//!   the start of a hold for that one statement only, and routes by the maps it holds only while
//!   its own registration is fresh (renewed within half its TTL): a proxy cut off from the store
//!   stops routing before its key can expire and let a change go ahead unseen.
//!
//! Why this is enough: a newcomer registers before it serves anyone and reads maps after; a
//! change takes the lease before it lists the registrations. Either the change sees the newcomer
//! (and waits for its acknowledgement) or the newcomer sees the lease (and waits for the new
//! map). Statements already past their map when a hold begins finish by it, and statements of
//! transactions under way keep the map they had (`shard_map_in_transaction`), as the changing
//! proxy's own do: they may hold locks the change waits for.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use herd_agent::store::StoreClient;
use herd_dcs::Dcs;
use herd_proxy::shards::{ChangeScope, ChangeToken, GateFuture, MapGate};
use tokio::sync::watch;

/// Prefix of the proxies' registrations.
pub const PROXIES: &str = herd_dcs::PROXIES;
/// The lease a map change holds (key `leases/map_change`).
const MAP_CHANGE: &str = "map_change";
/// How long a registration lives unless renewed.
const TTL: Duration = Duration::from_secs(5);
/// How often it is renewed.
const RENEW: Duration = Duration::from_secs(1);
/// How long a map change may hold its lease (a shard switch waits at most this long).
const CHANGE_TTL: Duration = Duration::from_secs(120);
/// How long a proxy waits for another's map change before refusing the statement.
const LOAD_WAIT: Duration = Duration::from_secs(30);
/// How often a proxy looks whether another's map change holds it.
const HOLD_POLL: Duration = Duration::from_millis(200);
/// How long a change waits for every other proxy's acknowledgement: long enough for the key
/// of a proxy that died or was cut off to expire (it is then no longer listed).
const ACK_WAIT: Duration = Duration::from_secs(8);

/// This proxy's registration and the map rules.
pub struct Registry {
    dcs: Arc<dyn Dcs>,
    id: String,
    started: Instant,
    /// When the last successful renewal was sent (ms since `started`; 0: never).
    renewed_ms: AtomicU64,
    /// Held from a map change's start until its lease is given back: the next change of this
    /// proxy waits for the release instead of racing it (the release is asynchronous; a
    /// renewal that met the revocation half way was refused as "another proxy").
    changing: Arc<tokio::sync::Mutex<()>>,
    /// The address clients reach this proxy at (in its registration).
    listen: String,
    /// The hold (another proxy's `map_change` holder) this proxy acknowledged, if one is on.
    held_for: std::sync::Mutex<Option<String>>,
    /// Bumped whenever a hold begins or ends: a map read across one is not kept.
    generation: AtomicU64,
    /// Distinguishes this proxy's successive changes in the lease holder's name.
    changes: AtomicU64,
}

impl Registry {
    /// Registers this proxy (`listen` is recorded with it), trying once before it returns, and
    /// keeps the registration until `shutdown`.
    pub async fn start(
        root: &StoreClient,
        listen: &str,
        shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<Arc<Registry>> {
        let id = format!(
            "{}-{}",
            listen.replace([':', '.', '[', ']'], "_"),
            std::process::id()
        );
        let registry = Arc::new(Registry {
            dcs: root.dcs(),
            id,
            started: Instant::now(),
            renewed_ms: AtomicU64::new(0),
            changing: Arc::default(),
            listen: listen.to_string(),
            held_for: std::sync::Mutex::default(),
            generation: AtomicU64::new(0),
            changes: AtomicU64::new(0),
        });
        // Until it is registered it routes nothing by a shard map ([`Gate::may_use_maps`]); the
        // store being down now does not stop the endpoint from serving everything else.
        if let Err(e) = registry.renew().await {
            tracing::warn!(
                "cannot register this proxy in the store yet ({e}); retrying every second"
            );
        }
        let r = registry.clone();
        let mut renewals = shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(RENEW) => {}
                    _ = renewals.changed() => return,
                }
                if let Err(e) = r.renew().await {
                    tracing::warn!("cannot renew this proxy's registration in the store: {e}");
                }
            }
        });
        let r = registry.clone();
        let mut holds = shutdown;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(HOLD_POLL) => {}
                    _ = holds.changed() => return,
                }
                r.follow_hold().await;
            }
        });
        Ok(registry)
    }

    /// Looks at the `map_change` lease: another proxy's hold is acknowledged (at once, in this
    /// proxy's registration), and its end noted.
    async fn follow_hold(&self) {
        let dcs = self.dcs.clone();
        let Ok(Ok(holder)) =
            tokio::task::spawn_blocking(move || dcs.lease_holder(MAP_CHANGE)).await
        else {
            // The store unreachable: the registration goes stale and the maps with it.
            return;
        };
        let other = holder.filter(|h| proxy_of(h) != self.id);
        let changed = {
            let mut held = self.held_for.lock().unwrap_or_else(|e| e.into_inner());
            if *held != other {
                *held = other.clone();
                true
            } else {
                false
            }
        };
        if !changed {
            return;
        }
        self.generation.fetch_add(1, Ordering::SeqCst);
        match &other {
            Some(h) => tracing::info!(
                "herd proxy {h} changes a shard map: holding statements that need it"
            ),
            None => tracing::info!("the shard map change is over: reading the map again"),
        }
        if let Err(e) = self.renew().await {
            tracing::warn!("cannot acknowledge the shard map hold in the store yet: {e}");
        }
    }

    /// The registration's value: where clients reach this proxy, and the hold it acknowledged.
    fn value(&self) -> Vec<u8> {
        let held = self
            .held_for
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        serde_json::to_vec(&serde_json::json!({ "listen": self.listen, "held_for": held }))
            .unwrap_or_default()
    }

    async fn renew(&self) -> Result<(), String> {
        let sent = self.started.elapsed().as_millis() as u64;
        let (dcs, key, value) = (
            self.dcs.clone(),
            format!("{PROXIES}{}", self.id),
            self.value(),
        );
        tokio::task::spawn_blocking(move || dcs.put_expiring(&key, value, TTL))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        // The send time, not the answer's: the key may expire TTL after the call began.
        self.renewed_ms.store(sent.max(1), Ordering::Relaxed);
        Ok(())
    }

    /// The other proxies registered now, each with the hold it acknowledged.
    async fn others(&self) -> Result<Vec<(String, Option<String>)>, String> {
        let dcs = self.dcs.clone();
        let keys = tokio::task::spawn_blocking(move || dcs.list(PROXIES))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        Ok(keys
            .into_iter()
            .map(|(k, v)| {
                let held = serde_json::from_slice::<serde_json::Value>(&v.value)
                    .ok()
                    .and_then(|j| j["held_for"].as_str().map(str::to_string));
                (k.trim_start_matches(PROXIES).to_string(), held)
            })
            .filter(|(id, _)| *id != self.id)
            .collect())
    }

    /// Waits (at most [`ACK_WAIT`]) until every other registered proxy acknowledged the hold
    /// `owner`; the ones that did not, when time is up.
    async fn wait_acknowledged(&self, owner: &str) -> Result<Vec<String>, String> {
        let deadline = Instant::now() + ACK_WAIT;
        loop {
            let missing: Vec<String> = self
                .others()
                .await?
                .into_iter()
                .filter(|(_, held)| held.as_deref() != Some(owner))
                .map(|(id, _)| id)
                .collect();
            if missing.is_empty() || Instant::now() >= deadline {
                return Ok(missing);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn lease(&self, owner: &str, acquire: bool) -> Result<bool, String> {
        let (dcs, owner) = (self.dcs.clone(), owner.to_string());
        tokio::task::spawn_blocking(move || {
            if acquire {
                dcs.acquire_lease(MAP_CHANGE, &owner, CHANGE_TTL)
            } else {
                dcs.release_lease(MAP_CHANGE, &owner).map(|()| false)
            }
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
    }
}

/// Gives the `map_change` lease up when the change is over, then lets this proxy's next
/// change begin.
struct Held {
    registry: Arc<Registry>,
    /// The lease holder's name for this change.
    owner: String,
    one_at_a_time: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let registry = self.registry.clone();
        let owner = std::mem::take(&mut self.owner);
        let guard = self.one_at_a_time.take();
        tokio::spawn(async move {
            if let Err(e) = registry.lease(&owner, false).await {
                tracing::warn!("giving the map_change lease up: {e} (it expires by itself)");
            }
            drop(guard);
        });
    }
}

/// The rules, over a shared registry.
pub struct Gate(pub Arc<Registry>);

impl MapGate for Gate {
    fn begin_change<'a>(
        &'a self,
        _database: &'a str,
        scope: ChangeScope,
    ) -> GateFuture<'a, ChangeToken> {
        Box::pin(async move {
            let r = &self.0;
            let guard = r.changing.clone().lock_owned().await;
            let owner = format!("{}#{}", r.id, r.changes.fetch_add(1, Ordering::SeqCst));
            if !r.lease(&owner, true).await? {
                return Err(
                    "another herd proxy is changing a shard map right now; try again in a moment"
                        .into(),
                );
            }
            let held = Held {
                registry: r.clone(),
                owner: owner.clone(),
                one_at_a_time: Some(guard),
            };
            if scope == ChangeScope::Groups {
                // The others would have to serve the new group before routing by a map that
                // places shards there: they are stopped for the moment instead.
                let others: Vec<String> = r.others().await?.into_iter().map(|(id, _)| id).collect();
                if !others.is_empty() {
                    drop(held);
                    return Err(format!(
                        "{} other herd proxy process(es) serve this cluster ({}); a shard group is                          admitted through one proxy while the others are stopped (they would not                          serve the new group yet). Stop them for the admission (they register                          again when started), then run it again",
                        others.len(),
                        others.join(", ")
                    ));
                }
                return Ok(Box::new(held) as ChangeToken);
            }
            let missing = r.wait_acknowledged(&owner).await?;
            if !missing.is_empty() {
                drop(held);
                return Err(format!(
                    "{} other herd proxy process(es) ({}) did not acknowledge the shard map change                      within {} s: they would route by the map they read before, so nothing was                      changed. Check that they reach the store (a proxy cut off from it drops out                      once its registration expires), then run it again",
                    missing.len(),
                    missing.join(", "),
                    ACK_WAIT.as_secs()
                ));
            }
            Ok(Box::new(held) as ChangeToken)
        })
    }

    fn held(&self) -> bool {
        self.0
            .held_for
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    fn hold_generation(&self) -> u64 {
        self.0.generation.load(Ordering::SeqCst)
    }

    fn may_use_maps(&self) -> Result<(), String> {
        let r = &self.0;
        let renewed = r.renewed_ms.load(Ordering::Relaxed);
        let now = r.started.elapsed().as_millis() as u64;
        if renewed == 0 || now.saturating_sub(renewed) > (TTL / 2).as_millis() as u64 {
            return Err(format!(
                "this herd proxy has not reached the store for {:.1} s: it does not route by the \
                 shard map until it does (another proxy may have changed it)",
                now.saturating_sub(renewed) as f64 / 1000.0
            ));
        }
        Ok(())
    }

    fn before_load<'a>(&'a self, _database: &'a str) -> GateFuture<'a, ()> {
        Box::pin(async move {
            let r = &self.0;
            let deadline = Instant::now() + LOAD_WAIT;
            loop {
                let (dcs, id) = (r.dcs.clone(), r.id.clone());
                let holder = tokio::task::spawn_blocking(move || dcs.lease_holder(MAP_CHANGE))
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?;
                match holder {
                    Some(h) if proxy_of(&h) != id => {
                        if Instant::now() > deadline {
                            return Err(format!(
                                "herd proxy {h} has been changing a shard map for over {} s",
                                LOAD_WAIT.as_secs()
                            ));
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    _ => return Ok(()),
                }
            }
        })
    }
}

/// The proxy a `map_change` holder's name belongs to (`<proxy id>#<change>`).
fn proxy_of(holder: &str) -> &str {
    holder.split('#').next().unwrap_or(holder)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holders_name_names_its_proxy() {
        assert_eq!(proxy_of("127_0_0_1_6432-77#3"), "127_0_0_1_6432-77");
        // Holders written before changes were numbered.
        assert_eq!(proxy_of("127_0_0_1_6432-77"), "127_0_0_1_6432-77");
    }
}
