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
//! * a shard group admitted through one proxy (`herd group add --dcs`) is a change of the same
//!   kind: the others hold as for a map; once the group holds what every group shares, the
//!   admitting proxy records it in the store and waits until every other proxy serves it too
//!   (each looks at the record with the lease, follows and counts the group, and writes how many
//!   groups it serves into its registration) before the hold ends. A proxy that serves fewer
//!   groups than the store records routes nothing by a map until it caught up: it would write
//!   reference tables and run DDL on the groups before the new one only.
//!
//! * a restore point across the groups (`herd backup restore-point --dcs`) holds the others the
//!   same way, and each also closes its gate of two-phase commits' second phases before it
//!   acknowledges (`point.rs`).
//!
//! Why this is enough: a newcomer registers before it serves anyone and reads maps after; a
//! change takes the lease before it lists the registrations. Either the change sees the newcomer
//! (and waits for its acknowledgement) or the newcomer sees the lease (and waits for the new
//! map). Statements already past their map when a hold begins finish by it, and statements of
//! transactions under way keep the map they had (`shard_map_in_transaction`), as the changing
//! proxy's own do: they may hold locks the change waits for.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use herd_agent::store::StoreClient;
use herd_dcs::Dcs;
use herd_proxy::shards::{ChangeScope, ChangeToken, GateFuture, MapGate};
use tokio::sync::watch;

mod point;
mod rotation;
pub use rotation::rotation_acks;

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
/// Attempts at recording a group's admission in the store.
const RECORD_TRIES: u32 = 5;

/// How a proxy serves shard groups another proxy admitted.
pub trait GroupServer: Send + Sync {
    /// How many groups this proxy serves now.
    fn served(&self) -> u32;
    /// Follows and serves the groups up to `groups` (the admitting proxy made them hold what
    /// every group shares).
    fn serve(&self, groups: u32) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// A registered proxy, as its registration says.
struct Other {
    id: String,
    /// Where it serves clients.
    listen: Option<String>,
    /// Where its HTTP API listens (absent: it serves none).
    api: Option<String>,
    /// The hold it acknowledged.
    held_for: Option<String>,
    /// How many groups it serves (absent: it does not follow admissions yet).
    groups: Option<u32>,
    /// Its acknowledgement of the password rotation under way.
    secrets_rotation: Option<String>,
}

/// This proxy's registration and the map rules.
pub struct Registry {
    dcs: Arc<dyn Dcs>,
    root: StoreClient,
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
    /// Where this proxy's HTTP API listens (in its registration: the coordinator asks it to
    /// admit shard groups, `group_admission.rs`).
    api: Option<String>,
    /// The hold (another proxy's `map_change` holder) this proxy acknowledged, if one is on.
    held_for: std::sync::Mutex<Option<String>>,
    /// Bumped whenever a hold begins or ends: a map read across one is not kept.
    generation: AtomicU64,
    /// Distinguishes this proxy's successive changes in the lease holder's name.
    changes: AtomicU64,
    /// How this proxy serves groups admitted elsewhere (set once it serves its first groups).
    server: OnceLock<Arc<dyn GroupServer>>,
    /// How many groups the store says the endpoint serves (last read).
    store_served: AtomicU32,
    /// When the store was last read for holds and groups (ms since `started`; 0: never).
    polled_ms: AtomicU64,
    /// This proxy's gate of two-phase commits' second phases, closed while another proxy
    /// takes a restore point (`point.rs`); a point hold is not acknowledged before it is set.
    commit_gate: OnceLock<herd_proxy::commit_gate::CommitGate>,
    /// The gate closed for another proxy's restore point, and since when.
    point_closed: std::sync::Mutex<Option<(herd_proxy::commit_gate::Closed, Instant)>>,
    /// This proxy's acknowledgement of a password rotation across hosts (`rotation.rs`).
    secrets_rotation: std::sync::Mutex<Option<String>>,
}

impl Registry {
    /// Registers this proxy (`listen` and `api` are recorded with it), trying once before it
    /// returns, and keeps the registration until `shutdown`.
    pub async fn start(
        root: &StoreClient,
        listen: &str,
        api: Option<String>,
        shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<Arc<Registry>> {
        let id = format!(
            "{}-{}",
            listen.replace([':', '.', '[', ']'], "_"),
            std::process::id()
        );
        let registry = Arc::new(Registry {
            dcs: root.dcs(),
            root: root.clone(),
            id,
            started: Instant::now(),
            renewed_ms: AtomicU64::new(0),
            changing: Arc::default(),
            listen: listen.to_string(),
            api,
            held_for: std::sync::Mutex::default(),
            generation: AtomicU64::new(0),
            changes: AtomicU64::new(0),
            server: OnceLock::new(),
            store_served: AtomicU32::new(0),
            polled_ms: AtomicU64::new(0),
            commit_gate: OnceLock::new(),
            point_closed: std::sync::Mutex::default(),
            secrets_rotation: std::sync::Mutex::default(),
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
                // Each renewal on its own: one call stuck on an etcd member that just died
                // (it answers only at the store's timeout) must not hold back the next, which
                // may reach a live member, or the registration goes stale and the proxy stops
                // routing by its maps (seen in `herd bench failover --hosts 3 --shards 2`).
                let r = r.clone();
                tokio::spawn(async move {
                    if let Err(e) = r.renew().await {
                        tracing::warn!("cannot renew this proxy's registration in the store: {e}");
                    }
                });
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

    /// From now on serves the groups other proxies admit (see the module's documentation).
    /// Called right after the caller read the store's groups (at start, or once learnt): that
    /// read counts as the first poll, so the first statements are not refused for want of one.
    pub fn serve_groups(&self, server: Arc<dyn GroupServer>) {
        let now = self.started.elapsed().as_millis() as u64;
        self.polled_ms.fetch_max(now.max(1), Ordering::Relaxed);
        let _ = self.server.set(server);
    }

    /// Looks at the `map_change` lease: another proxy's hold is acknowledged (at once, in this
    /// proxy's registration), and its end noted. Groups admitted through another proxy are
    /// served.
    async fn follow_hold(&self) {
        let sent = self.started.elapsed().as_millis() as u64;
        let dcs = self.dcs.clone();
        let Ok(Ok(holder)) =
            tokio::task::spawn_blocking(move || dcs.lease_holder(MAP_CHANGE)).await
        else {
            // The store unreachable: the registration goes stale and the maps with it.
            self.reopen_stale_point_gate();
            return;
        };
        let mut caught_up = false;
        if let Some(server) = self.server.get() {
            let Ok(served) = herd_agent::groups::served(&self.root).await else {
                return;
            };
            let served = served.unwrap_or(1);
            self.store_served.fetch_max(served, Ordering::SeqCst);
            let here = server.served();
            if served > here {
                tracing::info!(
                    "shard group(s) {here}..{} admitted through another herd proxy: serving them",
                    served - 1
                );
                server.serve(served).await;
                caught_up = server.served() > here;
            }
        }
        self.polled_ms.store(sent.max(1), Ordering::Relaxed);
        let other = holder.filter(|h| proxy_of(h) != self.id);
        if !self.follow_point(other.as_deref()).await {
            // Not acknowledged (the point is refused, naming this proxy, unless the gate
            // closes by the next look).
            return;
        }
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
            if caught_up {
                if let Err(e) = self.renew().await {
                    tracing::warn!("cannot say in the store which groups this proxy serves: {e}");
                }
            }
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
        let groups = self.server.get().map(|s| s.served());
        serde_json::to_vec(&serde_json::json!({
            "listen": self.listen,
            "api": self.api,
            "held_for": held,
            "groups": groups,
            "secrets_rotation": *self.secrets_rotation.lock().unwrap_or_else(|e| e.into_inner()),
        }))
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
        // Renewals overlap: a late answer to an older one must not move the time back.
        self.renewed_ms.fetch_max(sent.max(1), Ordering::Relaxed);
        Ok(())
    }

    /// The other proxies registered now, each with the hold it acknowledged and the groups it
    /// serves.
    async fn others(&self) -> Result<Vec<Other>, String> {
        let mut all = registrations(&self.dcs).await?;
        all.retain(|o| o.id != self.id);
        Ok(all)
    }

    /// Waits (at most [`ACK_WAIT`]) until every other registered proxy acknowledged the hold
    /// `owner`; the ones that did not, when time is up.
    async fn wait_acknowledged(&self, owner: &str) -> Result<Vec<String>, String> {
        self.wait_for_others(|o| o.held_for.as_deref() == Some(owner))
            .await
    }

    /// Waits (at most [`ACK_WAIT`]) until every other registered proxy is `done`; the ones
    /// that are not, when time is up.
    async fn wait_for_others(&self, done: impl Fn(&Other) -> bool) -> Result<Vec<String>, String> {
        let deadline = Instant::now() + ACK_WAIT;
        loop {
            let missing: Vec<String> = self
                .others()
                .await?
                .into_iter()
                .filter(|o| !done(o))
                .map(|o| o.id)
                .collect();
            if missing.is_empty() || Instant::now() >= deadline {
                return Ok(missing);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn lease(&self, owner: &str, acquire: bool) -> Result<bool, String> {
        let (dcs, owner) = (self.dcs.clone(), owner.to_string());
        // Every hold (a map change's or a restore point's) lives at most CHANGE_TTL.
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
            if scope == ChangeScope::Groups {
                tracing::info!("every other herd proxy holds for the shard group admission");
            }
            Ok(Box::new(held) as ChangeToken)
        })
    }

    fn groups_admitted(&self, groups: u32) -> GateFuture<'_, ()> {
        Box::pin(async move {
            let r = &self.0;
            let mut last = String::new();
            let mut recorded = false;
            for _ in 0..RECORD_TRIES {
                let dcs = r.dcs.clone();
                match tokio::task::spawn_blocking(move || {
                    herd_agent::groups::record_admitted(&dcs, groups - 1)
                })
                .await
                {
                    Ok(Ok(())) => {
                        recorded = true;
                        break;
                    }
                    Ok(Err(e)) => last = e,
                    Err(e) => last = e.to_string(),
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            if !recorded {
                return Err(format!("recording it in the store failed: {last}"));
            }
            r.store_served.fetch_max(groups, Ordering::SeqCst);
            let missing = r
                .wait_for_others(|o| o.groups.is_some_and(|n| n >= groups))
                .await?;
            if !missing.is_empty() {
                // Recorded: they route nothing by a map until they serve it (`may_use_maps`).
                tracing::warn!(
                    "herd proxy process(es) {} do not serve shard group {} yet after {} s; they \
                     refuse statements that need a shard map until they do",
                    missing.join(", "),
                    groups - 1,
                    ACK_WAIT.as_secs()
                );
            }
            Ok(())
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
        if let Some(server) = r.server.get() {
            let polled = r.polled_ms.load(Ordering::Relaxed);
            // Within a registration's life: an admission waits ACK_WAIT (longer) for every
            // proxy to serve its group, so one that read nothing for that long refuses first.
            if polled == 0 || now.saturating_sub(polled) > TTL.as_millis() as u64 {
                return Err(format!(
                    "this herd proxy has not read the store's shard groups for {:.1} s: it does \
                     not route by the shard map until it does",
                    now.saturating_sub(polled) as f64 / 1000.0
                ));
            }
            let (recorded, here) = (r.store_served.load(Ordering::SeqCst), server.served());
            if recorded > here {
                return Err(format!(
                    "the cluster serves {recorded} shard groups and this herd proxy {here} so \
                     far: it routes by the shard map again once it serves the new group(s), in \
                     a moment"
                ));
            }
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

/// Every registered proxy, as its registration says (this one included).
async fn registrations(dcs: &Arc<dyn Dcs>) -> Result<Vec<Other>, String> {
    let dcs = dcs.clone();
    let keys = tokio::task::spawn_blocking(move || dcs.list(PROXIES))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    Ok(keys
        .into_iter()
        .map(|(k, v)| {
            let j = serde_json::from_slice::<serde_json::Value>(&v.value).unwrap_or_default();
            Other {
                id: k.trim_start_matches(PROXIES).to_string(),
                listen: j["listen"].as_str().map(str::to_string),
                api: j["api"].as_str().map(str::to_string),
                held_for: j["held_for"].as_str().map(str::to_string),
                groups: j["groups"].as_u64().map(|n| n as u32),
                secrets_rotation: j["secrets_rotation"].as_str().map(str::to_string),
            }
        })
        .collect())
}

/// Where the registered proxies serve clients (`listen` of each registration).
pub async fn listens(dcs: &Arc<dyn Dcs>) -> Result<Vec<String>, String> {
    Ok(registrations(dcs)
        .await?
        .into_iter()
        .filter_map(|o| o.listen)
        .collect())
}

/// Where the registered proxies' HTTP APIs listen (`api` of each registration that has one).
pub async fn apis(dcs: &Arc<dyn Dcs>) -> Result<Vec<String>, String> {
    let mut apis: Vec<String> = registrations(dcs)
        .await?
        .into_iter()
        .filter_map(|o| o.api)
        .collect();
    apis.sort();
    Ok(apis)
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
