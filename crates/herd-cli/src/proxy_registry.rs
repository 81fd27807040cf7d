//! Every multi-host `herd proxy` registers in the store (`proxies/<id>`, an expiring key renewed
//! every second), and the shard map rules built on it ([`herd_proxy::shards::MapGate`]):
//!
//! * a map change (a table distributed, a shard moved) through one proxy takes the lease
//!   `map_change` and then requires that no other proxy is registered: another one would keep
//!   routing by the map it read before (a cluster-wide hold acknowledged by every proxy is the
//!   planned lifting of this rule; until then the change is refused with the proxies' names);
//! * a proxy reads a map only while no other proxy holds `map_change`, and routes by the maps it
//!   holds only while its own registration is fresh (renewed within half its TTL): a proxy cut off
//!   from the store stops routing before its key can expire and let a change go ahead unseen.
//!
//! Why this is enough: a newcomer registers before it serves anyone and reads maps after; a
//! change takes the lease before it lists the registrations. Either the change sees the newcomer
//! (and is refused) or the newcomer sees the lease (and waits for the new map).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use herd_agent::store::StoreClient;
use herd_dcs::Dcs;
use herd_proxy::shards::{ChangeToken, GateFuture, MapGate};
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
        });
        let value = serde_json::to_vec(&serde_json::json!({ "listen": listen }))?;
        // Until it is registered it routes nothing by a shard map ([`Gate::may_use_maps`]); the
        // store being down now does not stop the endpoint from serving everything else.
        if let Err(e) = registry.renew(&value).await {
            tracing::warn!(
                "cannot register this proxy in the store yet ({e}); retrying every second"
            );
        }
        let r = registry.clone();
        let mut shutdown = shutdown;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(RENEW) => {}
                    _ = shutdown.changed() => return,
                }
                if let Err(e) = r.renew(&value).await {
                    tracing::warn!("cannot renew this proxy's registration in the store: {e}");
                }
            }
        });
        Ok(registry)
    }

    async fn renew(&self, value: &[u8]) -> Result<(), String> {
        let sent = self.started.elapsed().as_millis() as u64;
        let (dcs, key, value) = (
            self.dcs.clone(),
            format!("{PROXIES}{}", self.id),
            value.to_vec(),
        );
        tokio::task::spawn_blocking(move || dcs.put_expiring(&key, value, TTL))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        // The send time, not the answer's: the key may expire TTL after the call began.
        self.renewed_ms.store(sent.max(1), Ordering::Relaxed);
        Ok(())
    }

    /// The other proxies registered now.
    async fn others(&self) -> Result<Vec<String>, String> {
        let dcs = self.dcs.clone();
        let keys = tokio::task::spawn_blocking(move || dcs.list(PROXIES))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        Ok(keys
            .into_iter()
            .map(|(k, _)| k.trim_start_matches(PROXIES).to_string())
            .filter(|id| *id != self.id)
            .collect())
    }

    async fn lease(&self, acquire: bool) -> Result<bool, String> {
        let (dcs, id) = (self.dcs.clone(), self.id.clone());
        tokio::task::spawn_blocking(move || {
            if acquire {
                dcs.acquire_lease(MAP_CHANGE, &id, CHANGE_TTL)
            } else {
                dcs.release_lease(MAP_CHANGE, &id).map(|()| false)
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
    one_at_a_time: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let registry = self.registry.clone();
        let guard = self.one_at_a_time.take();
        tokio::spawn(async move {
            if let Err(e) = registry.lease(false).await {
                tracing::warn!("giving the map_change lease up: {e} (it expires by itself)");
            }
            drop(guard);
        });
    }
}

/// The rules, over a shared registry.
pub struct Gate(pub Arc<Registry>);

impl MapGate for Gate {
    fn begin_change<'a>(&'a self, _database: &'a str) -> GateFuture<'a, ChangeToken> {
        Box::pin(async move {
            let r = &self.0;
            let guard = r.changing.clone().lock_owned().await;
            if !r.lease(true).await? {
                return Err(
                    "another herd proxy is changing a shard map right now; try again in a moment"
                        .into(),
                );
            }
            let held = Held {
                registry: r.clone(),
                one_at_a_time: Some(guard),
            };
            let others = r.others().await?;
            if !others.is_empty() {
                drop(held);
                return Err(format!(
                    "{} other herd proxy process(es) serve this cluster ({}); they route by the shard \
                     map they read before, so a change made through this one could send rows to the \
                     wrong group. Stop them for the change (they register again when started), then \
                     run it again",
                    others.len(),
                    others.join(", ")
                ));
            }
            Ok(Box::new(held) as ChangeToken)
        })
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
                    Some(h) if h != id => {
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
